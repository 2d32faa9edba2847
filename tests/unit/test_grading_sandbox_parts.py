"""Unit tests of the grading pieces that need no kernel: settings, throughput credit
(with a fake clock), and the accounting of changed and deleted cells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from support import crafted
from support.fakeclock import FakeClock

from lab_utils import config
from lab_utils.grading import accounting, layout, sandbox, settings, throughput


# ------------------------------------------------------------------ settings
def test_settings_file_covers_every_lab_and_merges_over_defaults(tmp_path):
    table = settings.load_settings()
    assert set(table["labs"]) == set(layout.source_labs())
    assert layout.cell_timeout("02") == table["labs"]["02_ps_async"]["cell_timeout"] > 30
    f = tmp_path / "settings.yml"
    f.write_text("defaults:\n  cell_timeout: 50\nlabs:\n  01_a:\n    cell_timeout: 70\n    timing: {rounds: 3}\n")
    assert settings.grading_settings("01", f)["cell_timeout"] == 70
    assert settings.grading_settings("01", f)["timing"] == {**settings.DEFAULTS["timing"], "rounds": 3}
    assert settings.grading_settings("02", f)["cell_timeout"] == 50  # not named: the defaults
    assert layout.cell_timeout(settings_file=f) == 70  # plain nbgrader gets the largest


@pytest.mark.parametrize(
    "text, match",
    [
        ("defaults:\n  cell_timeot: 5\n", "unknown setting"),
        ("defaults:\n  memory_mb: -1\n", "positive"),
        ("labs:\n  01_a:\n    disk_mb: 0\n", "disk_mb must be a positive"),
        ("defaults:\n  network: internet\n", "network"),
        ("labs:\n  01_a:\n    timing: {rounds: 5, max_rounds: 2}\n", "rounds"),
        ("- a\n", "expected the mappings"),
    ],
)
def test_bad_settings_are_refused_with_the_file_named(tmp_path, text, match):
    f = tmp_path / "settings.yml"
    f.write_text(text)
    with pytest.raises(ValueError, match=match):
        settings.load_settings(f)


# ---------------------------------------------------------------- throughput


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(throughput, "_clock", c)
    monkeypatch.delenv(config.GRADING_DRIVEN, raising=False)
    monkeypatch.setenv(config.GRADING_TIMING, json.dumps({"rounds": 2, "max_rounds": 4, "noise": 0.1}))
    return c


BANDS = ((0.5, 1.0), (0.3, 0.5))


def test_credit_comes_from_the_wall_clock_ratio_best_of_each(clock, capsys):
    # student 1.6 s (once 9 s: load only slows a run down), reference 1 s: ratio 0.62 -> full credit
    credit = throughput.compare(clock.job([9.0, 1.6, 1.6, 1.6]), clock.job(1.0), points=2, bands=BANDS, work=100)
    assert credit == 2.0
    out = capsys.readouterr().out
    assert "yours 63 examples/s, reference 100 examples/s" in out and "ratio 0.6" in out
    clock2 = clock.job(4.0)  # 4x slower than the reference: below every band
    assert throughput.compare(clock2, clock.job(1.0), points=2, bands=BANDS) == 0.0


def test_a_ratio_too_noisy_to_call_is_regraded_then_given_the_higher_band(clock, capsys):
    # the ratio sits on the 0.5 edge and the student's runs spread 20 %: never failed on noise
    stu = [2.0, 2.4, 2.0, 2.4, 2.0, 2.4]
    credit = throughput.compare(clock.job(stu), clock.job(1.0), points=2, bands=BANDS)
    out = capsys.readouterr().out
    assert "best of 4 alternating runs" in out  # measured again, up to max_rounds
    assert "[grading-flag] inconclusive timing" in out and "inconclusive — regraded" in out
    assert credit == 2.0


def test_a_reported_figure_that_contradicts_the_clock_earns_nothing(clock, capsys):
    # same speed on the clock, but the student's code claims 50x the reference's figure
    credit = throughput.compare(
        clock.job(1.0, result=5000.0), clock.job(1.0, result=100.0), points=2, bands=BANDS, reported=float
    )
    assert credit == 0.0
    assert "[grading-flag] forged throughput" in capsys.readouterr().out
    honest = throughput.compare(
        clock.job(1.0, result=110.0), clock.job(1.0, result=100.0), points=2, bands=BANDS, reported=float
    )
    assert honest == 2.0


def test_a_run_that_skipped_the_job_earns_nothing(clock, capsys):
    credit = throughput.compare(
        clock.job(0.1, result=0), clock.job(1.0, result=520), points=3, bands=BANDS, valid=lambda steps: steps == 520
    )
    assert credit == 0.0
    assert "[grading-flag] incomplete timed run" in capsys.readouterr().out


def test_band_of():
    assert [throughput.band_of(r, BANDS) for r in (0.9, 0.5, 0.4, 0.1)] == [0, 0, 1, 2]


# ---------------------------------------------------------------- accounting
LAB = "01_single_node"


def _write(nb, path: Path) -> Path:
    nbformat.write(nb, path)
    return path


def test_changed_and_deleted_cells_are_flagged_and_restored(tmp_path):
    release = crafted.paths(LAB)[1]
    correct = _write(crafted.craft("correct", LAB), tmp_path / "correct.ipynb")
    assert accounting.changed_cells(correct, release) == []  # filling in solutions changes no locked cell
    tampered = _write(crafted.craft("tampered", LAB), tmp_path / "tampered.ipynb")
    flags = accounting.changed_cells(tampered, release)
    assert [f["kind"] for f in flags] == ["tampered cell"] and "test_model_loss" in flags[0]["detail"]
    deleted = _write(crafted.craft("deleted", LAB), tmp_path / "deleted.ipynb")
    flags = accounting.changed_cells(deleted, release)
    assert [f["kind"] for f in flags] == ["deleted cell"] and "test_train_step" in flags[0]["detail"]
    assert accounting.restore_deleted(deleted, release) == ["test_train_step"]
    assert accounting.changed_cells(deleted, release) == []  # back, where it was
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nbformat.read(deleted, as_version=4).cells]
    rel = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nbformat.read(release, as_version=4).cells]
    assert [i for i in ids if i] == [i for i in rel if i]
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{not json")
    assert accounting.changed_cells(broken, release)[0]["kind"] == "unreadable notebook"


def test_combined_kinds_spoil_each_its_own_cells(tmp_path):
    """The crafted class combines kinds (tests/support/crafted.py CLASS): each is
    there as alone, and the accounting sees each of them."""
    release = crafted.paths(LAB)[1]
    both = _write(crafted.craft("tampered+deleted+leaks", LAB), tmp_path / "both.ipynb")
    flags = accounting.changed_cells(both, release)
    assert sorted(f["kind"] for f in flags) == ["deleted cell", "tampered cell"], flags
    assert "test_model_loss" in str(flags) and "test_train_step" in str(flags)
    assert sum("sleep" in c.source and "100000" in c.source for c in nbformat.read(both, as_version=4).cells) == 1
    for bad in ("blank+leaks", "leaks+vandal", "leaks+nonsense"):
        with pytest.raises(ValueError, match="combine"):
            crafted.craft(bad, LAB)


def test_own_cgroup_is_read_per_controller(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("9:name=systemd:/\n4:memory:/process_api/abc\n2:cpu,cpuacct:/labs-slow-7\n1:pids:/\n0::/\n")
    root = tmp_path / "fs"
    assert sandbox.own_cgroup_v1("memory", proc, root) == root / "memory" / "process_api" / "abc"
    assert sandbox.own_cgroup_v1("cpu", proc, root) == root / "cpu" / "labs-slow-7"
    assert sandbox.own_cgroup_v1("pids", proc, root) == root / "pids"
    assert sandbox.own_cgroup_v1("freezer", proc, root) == root / "freezer"  # not listed: the root


def test_memory_events_are_read_from_the_own_memory_cgroup_v1_and_v2(tmp_path):
    """The OOM-kill counter and the peak that let a dead kernel be blamed on the memory limit."""
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/labgrade-0-7\n0::/labgrade-0-7\n")
    v1 = tmp_path / "v1"
    (v1 / "memory" / "labgrade-0-7").mkdir(parents=True)
    assert sandbox.memory_events(proc, v1) is None  # no counter: unknown, never "not killed"
    (v1 / "memory" / "labgrade-0-7" / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert sandbox.memory_events(proc, v1) == (2, None)
    (v1 / "memory" / "labgrade-0-7" / "memory.max_usage_in_bytes").write_text(f"{4096 * 2**20}\n")
    assert sandbox.memory_events(proc, v1) == (2, 4096 * 2**20)
    v2 = tmp_path / "v2"
    (v2 / "labgrade-0-7").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    (v2 / "labgrade-0-7" / "memory.events").write_text("low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n")
    (v2 / "labgrade-0-7" / "memory.peak").write_text("1048576\n")
    assert sandbox.memory_events(proc, v2) == (1, 1048576)


def test_forks_refused_at_the_process_limit_are_read_from_the_own_pids_cgroup_v1_and_v2(tmp_path):
    """The counter that lets a cell's failed forks be blamed on the process limit."""
    proc = tmp_path / "cgroup"
    proc.write_text("3:pids:/labgrade-0-7\n0::/labgrade-0-7\n")
    v1 = tmp_path / "v1"
    (v1 / "pids" / "labgrade-0-7").mkdir(parents=True)
    assert sandbox.pids_refused(proc, v1) is None  # no counter: unknown
    (v1 / "pids" / "labgrade-0-7" / "pids.events").write_text("max 37\n")
    assert sandbox.pids_refused(proc, v1) == 37
    v2 = tmp_path / "v2"
    (v2 / "labgrade-0-7").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory pids\n")
    (v2 / "labgrade-0-7" / "pids.events").write_text("max 4\n")
    assert sandbox.pids_refused(proc, v2) == 4


def test_a_sandbox_nests_under_the_graders_own_cgroup():
    """So a quota above the grader (a Slurm job, make test-slow) bounds what it grades too."""
    if sandbox.cgroup_support() != "v1":
        pytest.skip("needs root and cgroup v1 (this machine's kind); v2 sandboxes sit at the root")
    with sandbox.Sandbox("nest-check", memory_mb=64, cpus=0.5, max_processes=8) as box:
        dirs = sandbox.leftover_cgroups(os.getpid())
        assert {d.parent for d in dirs} == {sandbox.own_cgroup_v1(c) for c in ("memory", "pids", "cpu")}, dirs
        assert all(d.name == box.name for d in dirs) and len(dirs) == 3
    assert sandbox.leftover_cgroups(os.getpid()) == []


def test_a_sandbox_reads_its_working_set_and_private_memory(tmp_path):
    """What bench_lab_memory samples: a process holding 80 MB of its own shows in both figures."""
    if sandbox.cgroup_support() is None:
        pytest.skip("needs root and cgroups")
    hold = "import sys, time; x = bytearray(80 << 20); print('held', flush=True); time.sleep(120)"
    with sandbox.Sandbox("ws-check", memory_mb=512, cpus=1, max_processes=8) as box:
        assert box.working_set_bytes()[1] < 40 << 20  # nothing runs yet
        proc = box.start([sys.executable, "-c", hold], log=tmp_path / "log")
        deadline, now = time.monotonic() + 60, (0, 0)
        while now[1] < 80 << 20 and time.monotonic() < deadline and proc.poll() is None:
            now = box.working_set_bytes()
            time.sleep(0.05)  # polling the cgroup under a deadline
        assert now[1] >= 80 << 20 and now[0] >= now[1], (now, (tmp_path / "log").read_text())
    assert box.working_set_bytes() is None  # closed: no cgroup left to read


def test_a_sandbox_found_again_from_its_state_kills_what_it_holds_and_goes(tmp_path):
    """A Hub restarted while a student's server runs: its spawner finds the cgroup from its
    state, and the server's end removes it; a state this code did not write is not adopted."""
    if sandbox.cgroup_support() is None:
        pytest.skip("needs root and cgroups")
    box = sandbox.Sandbox("adopt-check", memory_mb=64, cpus=0.5, max_processes=8, prefix="labhub")
    try:
        proc = box.start([sys.executable, "-c", "import time; time.sleep(300)"], log=tmp_path / "log")
        state = json.loads(json.dumps(box.state()))  # as the Hub's database keeps it
        found = sandbox.Sandbox.adopt(state, prefix="labhub")
        assert found is not None and found.members() == [proc.pid]
        found.close()
        assert proc.wait(30) is not None and not any(Path(d).exists() for d in state["dirs"])
        assert sandbox.Sandbox.adopt(state, prefix="labhub") is None  # gone: nothing to adopt
        forged = {**state, "dirs": ["/etc"], "name": "labhub-x"}
        assert sandbox.Sandbox.adopt(forged, prefix="labhub") is None
        assert sandbox.Sandbox.adopt({**state, "name": "labgrade-x"}, prefix="labhub") is None
    finally:
        box._proc = None
        box.close()


def test_a_grader_killed_before_its_cleanup_leaves_a_sandbox_the_next_one_removes(tmp_path):
    """A grader SIGKILLed (the OOM killer, a scancel past KillWait) never closes its sandbox:
    its cgroups stay, with what the submission still runs. The sweep a batch does when it
    starts kills that and removes them; a live grader's sandbox is not touched."""
    if sandbox.cgroup_support() is None:
        pytest.skip("needs root and cgroups")
    grader = (
        "import sys, time\n"
        "from lab_utils.grading import sandbox\n"
        "box = sandbox.Sandbox('orphan-check', memory_mb=64, cpus=0.5, max_processes=8, prefix='labsweep')\n"
        "p = box.start([sys.executable, '-c', 'import time; time.sleep(300)'], log=sandbox.Path(sys.argv[1]))\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    live = sandbox.Sandbox("alive-check", memory_mb=64, cpus=0.5, max_processes=8, prefix="labsweep")
    proc = subprocess.Popen([sys.executable, "-c", grader, str(tmp_path / "log")], stdout=subprocess.PIPE, text=True)
    try:
        submission = int(proc.stdout.readline())
        assert set(sandbox.orphaned_cgroups("labsweep")) == set()  # its grader still runs
        proc.kill()
        proc.wait(30)
        orphans = sandbox.orphaned_cgroups("labsweep")
        assert list(orphans) == [f"labsweep-orphan-check-{proc.pid}"] and psutil.pid_exists(submission)
        removed, failed = sandbox.remove_orphaned_cgroups("labsweep")
        assert removed == list(orphans) and failed == []
        assert not any(d.exists() for dirs in orphans.values() for d in dirs)
        assert not psutil.pid_exists(submission) or psutil.Process(submission).status() == psutil.STATUS_ZOMBIE
        assert all(d.exists() for d in live._dirs)  # the live grader's own sandbox stays
    finally:
        proc.kill()
        live.close()
        sandbox.remove_orphaned_cgroups("labsweep")


def test_a_quota_above_the_grader_caps_the_sandbox_quota(tmp_path):
    """A child cgroup's quota may not exceed its parent's (the kernel answers EINVAL): under a
    grader held to 0.8 cores (make test-slow, a Slurm job), a 2-core sandbox gets 0.8."""
    root = tmp_path / "cpu"

    def level(path: Path, quota: int, period: int = 100000) -> Path:
        path.mkdir(parents=True)
        (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (path / "cpu.cfs_period_us").write_text(f"{period}\n")
        return path

    level(root, -1)
    level(root / "slow", 80000)
    level(root / "slow" / "job", 150000, period=50000)  # 3 cores: looser than its parent
    grader = level(root / "slow" / "job" / "grader", -1)
    assert sandbox.quota_ceiling_v1(grader, root) == pytest.approx(0.8)
    assert sandbox.quota_ceiling_v1(level(root / "free", -1), root) is None


def test_outputs_are_cut_per_cell_and_an_error_is_always_kept(tmp_path):
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    from lab_utils.grading.execute import CapOutputBytes

    flood = new_code_cell("print(...)")
    flood.outputs = [
        new_output("stream", name="stdout", text="x" * 5000),
        new_output("display_data", data={"text/plain": "y" * 5000}),
        new_output("error", ename="AssertionError", evalue="the test failed", traceback=["AssertionError"]),
    ]
    small = new_code_cell("print(1)")
    small.outputs = [new_output("stream", name="stdout", text="1\n")]
    nb = new_notebook(cells=[small, flood])
    record = tmp_path / "cut.json"
    nb, _ = CapOutputBytes(max_bytes=1000, record_file=str(record))(nb, {})
    kinds = [o.output_type for o in nb.cells[1].outputs]
    assert kinds == ["stream", "error", "stream"], kinds  # the head of the stream, the error, the note
    assert len(nb.cells[1].outputs[0].text) <= 1000 and "output cut by the grader" in nb.cells[1].outputs[-1].text
    assert nb.cells[0].outputs[0].text == "1\n"
    cut = json.loads(record.read_text())
    assert list(cut) == ["1"] and cut["1"] > 8000
    nbformat.validate(nb)
