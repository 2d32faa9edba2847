"""Process tests for lab_utils.cluster: real clusters, real signals, nothing may leak.

TensorFlow tasks cost about 4 s CPU each to import, so only the acceptance
scenarios that are about TensorFlow use ``cluster_tf_task.py``; the others use
``cluster_task.py``, a stand-in that binds its port and reports like a TF task.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import kernels
from support.procs import alive as procs_alive

from lab_utils.cluster import BIND_FAILED_EXIT, ClusterError, TFCluster, hosts, job, reap, userns

FIX = Path(__file__).resolve().parents[1] / "fixtures"
FAKE = str(FIX / "cluster_task.py")
TF = str(FIX / "cluster_tf_task.py")
KERNEL = str(FIX / "cluster_kernel.py")
SMALL = 50 * 1024**2  # memory_per_task for the stand-in


def tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def wait_gone(procs: list[psutil.Process], within: float) -> list[psutil.Process]:
    """Processes (pid + create time checked by psutil) still running after ``within`` s."""
    deadline = time.monotonic() + within
    alive = procs
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if procs_alive(p)]
        time.sleep(0.05)
    return alive


def kill_all(procs):
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def assert_gone(procs: list[psutil.Process], within: float) -> None:
    """None of ``procs`` still runs after ``within`` s; any that does is killed all the same,
    so that one leak does not poison the rest of the session."""
    try:
        assert wait_gone(procs, within) == []
    finally:
        kill_all(procs)


def stand_in(**kw) -> TFCluster:
    """A cluster of stand-in tasks (``cluster_task.py``): 1 PS and 2 workers of small memory,
    no progress line; ``kw`` adds to or overrides these."""
    return TFCluster(**{"ps": 1, "workers": 2, "script": FAKE, "memory_per_task": SMALL, "progress": False, **kw})


def start_kernel(*args: str, **kw) -> tuple[subprocess.Popen, dict]:
    """A stand-in notebook kernel that starts a cluster and prints its pids."""
    proc = subprocess.Popen([sys.executable, KERNEL, *args], stdout=subprocess.PIPE, text=True, **kw)
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        pytest.fail(f"stand-in kernel failed to start a cluster (exit {proc.returncode})")
    return proc, json.loads(line)


def test_tf_cluster_normal_run(capfd):
    with TFCluster(ps=1, workers=2, script=TF, args={"steps": 5}, progress=False) as c:
        assert [t.state for t in c.tasks] == ["ready"] * 3
        spec = c.cluster_spec()
        assert len(set(t.port for t in c.tasks)) == 3 and len(spec["worker"]) == 2
        assert "pid" in c._repr_html_() or str(c.tasks[0].pid) in c._repr_html_()
        results = c.wait()
    assert set(results) == {"worker:0", "worker:1"}
    assert all(r["steps"] == 5 for r in results.values())
    states = {t.name: (t.state, t.exit_code) for t in c.tasks}
    assert states["worker:0"] == ("done", 0) and states["ps:0"][0] == "stopped"
    assert "worker:1" in c.logs("worker", 1)
    assert json.loads((c.run_dir / "state.json").read_text())["status"] == "stopped"
    out, err = capfd.readouterr()
    assert err == "", f"the kernel's stderr must stay empty, got {err!r}"


@pytest.mark.timeout(180)  # a hang guard: without crash detection the other worker would train 100,000 steps
def test_crash_is_reported_at_once_and_nothing_remains():
    c = TFCluster(ps=1, workers=2, script=TF, args={"steps": 100000, "fail_task": "worker:1"}, progress=False)
    procs = []
    with pytest.raises(ClusterError) as info:
        with c:
            procs = [p for t in c.tasks for p in tree(t.pid)]
            worker1 = c.task("worker", 1)
            c.wait()
    err = info.value
    # the failure happens mid-run: the error came while worker:0 was still training (its
    # 100,000 steps take minutes), not at the run's end
    assert c.task("worker", 0).state == "stopped", c.task("worker", 0)
    assert worker1.exit_code == 3
    assert err.task == "worker:1" and err.exit_code == 3
    assert "worker:1" in str(err) and "failing on purpose" in err.log_tail
    assert wait_gone(procs, 5.0) == []


def test_kernel_sigkill_leaves_no_child():
    """The acceptance 'leak' test: kernel SIGKILLed with 1 PS + 2 TF workers running."""
    kernel, info = start_kernel("--script", "cluster_tf_task.py", "--args", json.dumps({"steps": 10**7}))
    procs = tree(kernel.pid)[1:]
    assert len(procs) >= 6  # 3 guards + 3 TensorFlow tasks
    kernel.kill()
    kernel.wait()
    assert_gone(procs, 10.0)
    state = json.loads(Path(info["run_dir"], "state.json").read_text())
    assert len(state["tasks"]) == 3


def test_four_clusters_at_once_from_four_processes():
    outs = kernels.run_at_once(4, "--script", "cluster_tf_task.py", "--args", json.dumps({"steps": 3}))
    ports = [p for o in outs for p in o["ports"].values()]
    assert len(set(ports)) == len(ports) == 12
    for o in outs:
        assert set(o["results"]) == {"worker:0", "worker:1"}


def test_reap_stops_what_a_killed_parent_left(run_root):
    kernel, info = start_kernel("--no-guard")  # no guard: only reap() can clean up
    kids = tree(kernel.pid)[1:]
    holder = [p for p in kids if info["network"] and p.pid == info["network"]["holder"]]
    procs = [p for p in kids if p not in holder]  # the tasks; the holder keeps their private network
    assert len(procs) == 3
    try:
        assert reap() == []  # parent alive: left alone
        kernel.kill()
        kernel.wait()
        assert all(p.is_running() for p in procs), "without the guard the tasks outlive the kernel"
        assert wait_gone(holder, 5.0) == []  # it ends with the kernel's pipe, guard or not
        stopped = reap()
        assert stopped == [info["run_dir"]]
        assert wait_gone(procs, 5.0) == []
        assert reap() == []  # idempotent
    finally:
        kill_all(procs)


def test_reap_include_live(run_root, capfd):
    kernel, info = start_kernel()
    procs = tree(kernel.pid)[1:]
    try:
        assert reap(include_live=True) == [info["run_dir"]]
        assert wait_gone(procs, 5.0) == []
        # the private network's holder is the live kernel's child: a zombie once killed, not
        # a survivor (it was reported 'still running after SIGKILL', after a 20 s wait)
        assert "still running" not in capfd.readouterr().out
        assert json.loads((Path(info["run_dir"]) / "state.json").read_text())["status"] == "stopped"
    finally:
        kill_all(procs)
        kernel.kill()
        kernel.wait()


def test_guard_kills_grandchildren_in_other_sessions_when_parent_dies(tmp_path):
    """mpirun/horovodrun ranks may live in their own sessions: the guard still stops them."""
    script = (
        "import subprocess, sys, signal\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'], start_new_session=True)\n"
        "signal.pause()\n"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; p = subprocess.Popen([sys.executable, '-m', 'lab_utils._guard', "
            "'--parent', str(__import__('os').getpid()), '--grace', '1', '--', sys.executable, '-c', "
            f"{script!r}], start_new_session=True); print(p.pid, flush=True); p.wait()",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    guard_pid = int(parent.stdout.readline())
    deadline = time.monotonic() + 10
    while len(tree(guard_pid)) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    procs = tree(guard_pid)
    assert len(procs) == 3
    parent.kill()
    parent.wait()
    assert_gone(procs, 5.0)


def test_interrupt_stops_cluster_and_reraises(monkeypatch):
    c = stand_in(args={"hang_task": "worker:0"})
    c.start()
    procs = [p for t in c.tasks for p in tree(t.pid)]

    def interrupted():  # the Interrupt button: SIGINT arrives while wait() polls
        raise KeyboardInterrupt

    monkeypatch.setattr(job, "pause", interrupted)
    with pytest.raises(KeyboardInterrupt):
        c.wait()
    monkeypatch.undo()
    assert not c.running
    assert wait_gone(procs, 1.0) == []


@pytest.mark.timeout(120)  # a hang guard: the run's own 2 s timeout must end it
def test_run_timeout_ends_a_hung_run():
    with pytest.raises(ClusterError, match="run timeout") as info:
        with stand_in(args={"hang_task": "worker:1"}, timeout=2) as c:
            c.wait()
    assert info.value.task == "worker:1"


def test_ready_timeout_names_the_task_and_shows_its_log():
    with pytest.raises(ClusterError, match="did not become ready .* neither listened on port") as info:
        with stand_in(workers=1, args={"no_ready": True}, ready_timeout=1.5):
            pass
    assert "will never report ready" in info.value.log_tail


PLAIN = {"mwms": (0, FIX / "plain_mwms.py"), "ps": (1, FIX / "plain_ps.py")}


@pytest.mark.parametrize("kind", sorted(PLAIN))
def test_an_ordinary_tensorflow_script_runs_and_a_failing_one_names_its_task(kind):
    """Scripts that know nothing of lab_utils (TensorFlow's own tutorials' shape): ready when
    their servers listen, done when the workers exit 0; a worker that fails is named."""
    ps, script = PLAIN[kind]
    with TFCluster(ps=ps, workers=2, script=script, progress=False) as c:
        assert c.wait() == {}  # no lab protocol: no results, and no error
        logs = [c.logs("worker", i) for i in (0, 1)]
    assert all(t.exit_code == 0 for t in c.tasks if t.role == "worker"), c.tasks
    assert all(f"worker {i} trained: loss" in logs[i] for i in (0, 1)), logs
    with pytest.raises(ClusterError, match="worker:1 exited with code 1") as info:
        with TFCluster(ps=ps, workers=2, script=script, args=["--fail"], progress=False) as c:
            c.wait()
    assert info.value.task == "worker:1" and "failing on purpose" in info.value.log_tail


def test_bind_failure_restarts_with_fresh_ports(monkeypatch):
    """Where the tasks share this machine's ports (no private network: a machine without
    namespaces; remote and emulated hosts draw theirs at random), a port taken between
    the pick and the bind restarts the cluster on fresh ones."""
    monkeypatch.setattr(userns, "private_how", lambda: (None, "no namespaces in this test"))
    monkeypatch.setattr(hosts, "network_interfaces", lambda: [])  # loopback only: no refusal
    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real = hosts.free_port
    calls = iter([busy])
    monkeypatch.setattr(hosts, "free_port", lambda host="": next(calls, None) or real(host))
    try:
        with stand_in() as c:
            assert c.attempts == 2
            assert busy not in [t.port for t in c.tasks]
            assert any("could not bind" in n for n in c.notes)
            c.wait()
    finally:
        taken.close()


def test_stream_prefixes_lines_on_stdout(capfd):
    with stand_in(stream=True) as c:
        c.wait()
    out, err = capfd.readouterr()
    assert "[worker:1] worker:1 serving on" in out
    assert err == ""


def test_progress_line_goes_to_stdout(capfd):
    with TFCluster(ps=1, workers=2, script=FAKE, memory_per_task=SMALL) as c:
        c.wait()
    out, err = capfd.readouterr()
    assert "cluster_task:" in out and "done" in out
    assert err == ""


def test_atexit_stops_a_cluster_left_running():
    kernel, info = start_kernel("--exit")
    procs = tree(kernel.pid)[1:]
    kernel.wait(timeout=30)
    assert kernel.returncode == 0
    assert_gone(procs, 1.0)
    assert json.loads(Path(info["run_dir"], "state.json").read_text())["status"] == "stopped"


def test_start_server_reports_bind_failure_with_exit_75(tmp_path):
    """The real TensorFlow path: a busy port makes start_server() exit 75 with a bind_failed event."""
    taken = socket.socket()
    taken.bind(("", 0))
    taken.listen()
    port = taken.getsockname()[1]
    events = tmp_path / "ps-0.jsonl"
    env = dict(
        os.environ,
        LABS_TASK="ps:0",
        LABS_REPORT_FILE=str(events),
        TF_CONFIG=json.dumps(
            {"cluster": {"ps": [f"localhost:{port}"], "worker": ["localhost:1"]}, "task": {"type": "ps", "index": 0}}
        ),
    )
    try:
        out = subprocess.run([sys.executable, TF], env=env, capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert out.returncode == BIND_FAILED_EXIT, out.stdout[-1000:] + out.stderr[-1000:]
    assert [e["kind"] for e in map(json.loads, events.read_text().splitlines())] == ["bind_failed"]


def test_guard_passes_on_exit_code_and_signal():
    guard = [sys.executable, "-m", "lab_utils._guard", "--parent", str(os.getpid()), "--"]
    assert subprocess.run([*guard, sys.executable, "-c", "raise SystemExit(3)"]).returncode == 3
    kill_self = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert subprocess.run([*guard, sys.executable, "-c", kill_self]).returncode == -9
    # started by a process that is not the one named: the parent is taken as dead, nothing runs
    assert subprocess.run([*guard[:4], "1", "--", "true"]).returncode == 125
