"""Unit tests for lab_utils.cluster: no real cluster, subprocess and psutil mocked where needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from lab_utils import cluster as cl
from lab_utils import resources
from lab_utils.cluster import ClusterError, MPIJob, ResourceError, TFCluster, reap, task_config
from lab_utils.cluster.job import format_args

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SCRIPT = str(FIX / "cluster_task.py")
GB = 1024**3
REAL_POPEN = subprocess.Popen


@pytest.fixture(autouse=True)
def no_processes(refuse_processes):
    """Nothing in this file may start a process through the launcher."""


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(ps=1, workers=0), "workers must be at least 1"),
        (dict(ps=-1, workers=2), "ps must be an integer >= 0"),
        (dict(ps=1, workers=2.5), "workers must be an integer"),
        (dict(ps=1, workers=2, script="no_such_train.py"), "not found"),
        (dict(ps=1, workers=2, hosts=["a", "b"]), "one entry per task"),
        (dict(ps=1, workers=2, hosts="a,b,c"), "hosts must be .local., .emulated"),
        (dict(ps=1, workers=2, ready_timeout=0), "ready_timeout must be a number of seconds > 0"),
        (dict(ps=1, workers=2, start_retries=0), "start_retries"),
    ],
)
def test_tfcluster_bad_input(kwargs, match):
    kwargs.setdefault("script", SCRIPT)
    with pytest.raises(ValueError, match=match):
        TFCluster(**kwargs)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(launcher="srun"), "unknown launcher 'srun'; allowed: mpirun, horovodrun"),
        (dict(launcher="horovodrun", controller="nccl"), "unknown controller 'nccl'; allowed: mpi, gloo"),
        (dict(launcher="mpirun", controller="gloo"), "always uses the MPI controller"),
        (dict(np=0), "np must be an integer >= 1"),
        (dict(script="missing.py"), "not found"),
        (dict(hosts="/no/such/hostfile"), "hostfile"),
    ],
)
def test_mpijob_bad_input(kwargs, match):
    kwargs.setdefault("script", SCRIPT)
    with pytest.raises(ValueError, match=match):
        MPIJob(**kwargs)


def test_args_as_dict_or_list():
    assert format_args({"steps": 10, "sync": True, "quiet": False, "lr": 0.1, "layers": [2, 3]}) == [
        "--steps",
        "10",
        "--sync",
        "--lr",
        "0.1",
        "--layers",
        "2",
        "3",
    ]
    assert format_args(["--x", 1]) == ["--x", "1"]
    with pytest.raises(TypeError, match="shlex"):
        format_args("--steps 3")


def test_task_config_parses_tf_config():
    env = {
        "TF_CONFIG": json.dumps(
            {
                "cluster": {"ps": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]},
                "task": {"type": "worker", "index": 1},
            }
        )
    }
    cfg = task_config(env)
    cluster, job, index = cfg
    assert (job, index, cfg.task, cfg.address, cfg.is_chief) == ("worker", 1, "worker:1", "localhost:3", False)
    assert cluster["ps"] == ["localhost:1"]
    with pytest.raises(RuntimeError, match="TF_CONFIG is not set"):
        task_config({})
    with pytest.raises(RuntimeError, match="not in its cluster"):
        task_config({"TF_CONFIG": json.dumps({"cluster": {"worker": ["h:1"]}, "task": {"type": "worker", "index": 3}})})


def test_resource_guard_refuses_with_a_suggestion(monkeypatch):
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: int(1.0 * GB))
    c = TFCluster(ps=1, workers=4, script=SCRIPT, progress=False)
    with pytest.raises(ResourceError) as info:
        c.start()
    msg = str(info.value)  # 5 tasks of 288 + 15 MB (TensorFlow's own memory, a guard): 3 fit
    assert "1 PS + 4 workers needs about 1.5 GB" in msg and "1.0 GB available" in msg and "try workers=2" in msg
    assert isinstance(info.value, ValueError)
    assert c.run_dir is None and c.tasks == []  # refused before anything started


def test_resource_guard_notes_oversubscription_on_stdout(monkeypatch, capsys):
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 20 * GB)
    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    c = TFCluster(ps=1, workers=2, script=SCRIPT)
    with pytest.raises(AssertionError, match="a process was started"):
        c.start()  # the note comes before the first launch (refused by this file's fixture)
    out, err = capsys.readouterr()
    assert "3 tasks share 2 usable core(s)" in out and err == ""
    assert c.notes and not c.running


def test_mpirun_command_as_root_and_oversubscribed(monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: 0)
    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    job = MPIJob(np=4, script=SCRIPT, launcher="mpirun", progress=False)
    cmd, extra = job.command()
    assert cmd[0].endswith("mpirun") and cmd[1:3] == ["-np", "4"]
    assert "--allow-run-as-root" in cmd and "--oversubscribe" in cmd
    assert cmd[-1] == SCRIPT and cmd[-3] == sys.executable
    assert any("oversubscribed" in n for n in job.notes)


def test_mpirun_command_non_root_with_hosts(monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: 1000)
    monkeypatch.setattr(resources, "usable_cores", lambda: 8)
    job = MPIJob(np=4, script=SCRIPT, launcher="mpirun", hosts=["n1:2", "n2:2"], progress=False)
    cmd, extra = job.command()
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    assert cmd[cmd.index("-H") + 1] == "n1:2,n2:2" and extra == {}


def test_horovodrun_command(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "getuid", lambda: 0)
    monkeypatch.setattr(resources, "usable_cores", lambda: 2)
    cmd, extra = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller="gloo").command()
    assert "--gloo" in cmd and cmd[cmd.index("-H") + 1] == "localhost:2"
    assert extra["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and extra["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    hostfile = tmp_path / "hosts"
    hostfile.write_text("n1 slots=2\n")
    cmd, _ = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller="mpi", hosts=hostfile).command()
    assert "--mpi" in cmd and cmd[cmd.index("--hostfile") + 1] == str(hostfile)


@pytest.mark.parametrize(
    "log,want",
    [
        # mpirun tags each read from a rank's pipe: `print` under `python -u` is two writes,
        # so pieces of two ranks share a line (both orders seen in CI and here).
        (
            "# mpirun: cmd\n[1,1]<stdout>:rank 1/2: total=3[1,0]<stdout>:rank 0/2: total=3\n[1,1]<stdout>:\n",
            {0: "rank 0/2: total=3\n", 1: "rank 1/2: total=3\n"},
        ),
        (
            "[1,0]<stdout>:rank 0/2[1,1]<stdout>:rank 1/2\n[1,0]<stdout>:\n[1,1]<stderr>:warn\n",
            {0: "rank 0/2\n", 1: "rank 1/2\nwarn\n"},
        ),
        # several lines in one read are tagged line by line; untagged launcher lines belong to no rank
        (
            "[1,0]<stdout>:a\n[1,0]<stdout>:b\nmpirun noticed something\n[1,1]<stderr>:Traceback\n",
            {0: "a\nb\n", 1: "Traceback\n"},
        ),
        # horovodrun (Gloo) tags whole lines without a job id
        ("[0]<stdout>:hello\n[1]<stdout>:hello\n[10]<stderr>:x\n", {0: "hello\n", 1: "hello\n", 10: "x\n"}),
        ("no tags at all\n", {}),
    ],
)
def test_split_rank_output_undoes_interleaving(log, want):
    assert cl.split_rank_output(log) == want


def test_mpijob_logs_per_rank(tmp_path):
    job = MPIJob(np=2, script=FIX / "cluster_mpi_task.py", launcher="mpirun", progress=False)
    log = tmp_path / "mpirun.log"
    log.write_text("[1,1]<stdout>:rank 1/2: total=3[1,0]<stdout>:rank 0/2: total=3\n[1,1]<stdout>:\n")
    job.tasks = [cl.Task("mpirun", log)]
    assert job.logs(1) == "rank 1/2: total=3\n" and job.logs(0) == "rank 0/2: total=3\n"
    assert job.logs(2) == "" and job.logs(tail=1) == "[1,1]<stdout>:"


def test_mpijob_stream_prints_whole_rank_lines():
    job = MPIJob(np=2, script=FIX / "cluster_mpi_task.py", launcher="mpirun", progress=False)
    t = cl.Task("mpirun", Path("mpirun.log"))
    lines = [
        "[1,1]<stdout>:rank 1/2: total=3[1,0]<stdout>:rank 0/2: total=3",
        "[1,1]<stdout>:",
        "mpirun: a note of its own",
        "[0]<stderr>:gloo line",
    ]
    printed = [out for line in lines for out in job.stream_lines(t, line)]
    assert printed == [
        "[rank:0] rank 0/2: total=3",
        "[rank:1] rank 1/2: total=3",
        "[mpirun] mpirun: a note of its own",
        "[rank:0] gloo line",
    ]
    assert TFCluster(ps=1, workers=1, script=SCRIPT, progress=False).stream_lines(t, "x") == ["[mpirun] x"]


def test_remote_task_goes_through_ssh():
    c = TFCluster(ps=1, workers=1, script=SCRIPT, hosts=["node1", "localhost"], progress=False)
    c.run_dir = Path("/tmp/x")
    c.plan()
    ps, worker = c.tasks
    assert 20000 <= ps.port < 50000 and ps.host == "node1"
    env = {"TF_CONFIG": '{"a": 1}', "LABS_TASK": "ps:0", "PYTHONPATH": "/repo"}
    cmd = c.task_command(ps, env)
    assert cmd[:3] == ["ssh", "-o", "BatchMode=yes"] and "node1" in cmd
    assert "TF_CONFIG=" in cmd[-1] and SCRIPT in cmd[-1]
    assert c.task_command(worker, env)[0] == sys.executable
    assert c.cluster_spec() == {"ps": [f"node1:{ps.port}"], "worker": [f"localhost:{worker.port}"]}
    # thread pools sized to this machine's quota for its own tasks only: another node has its own cores
    base = {k: v for k, v in os.environ.items() if k not in resources.THREAD_VARS}
    spec = c.cluster_spec()
    assert "TF_NUM_INTRAOP_THREADS" not in c._task_env(ps, base, spec)
    assert c._task_env(worker, base, spec)["TF_NUM_INTRAOP_THREADS"] == str(resources.usable_cores())


def test_a_cluster_of_workers_only_names_no_ps_job():
    """ps=0: a collective cluster (MultiWorkerMirroredStrategy); TF_CONFIG must not list an empty ps job."""
    c = TFCluster(ps=0, workers=2, script=SCRIPT, progress=False)
    c.run_dir = Path("/tmp/x")
    w0, w1 = c.plan()
    assert [t.name for t in c.tasks] == ["worker:0", "worker:1"]
    assert c.cluster_spec() == {"worker": [f"localhost:{w0.port}", f"localhost:{w1.port}"]}


def test_repr_shows_tasks_pids_ports_states():
    c = TFCluster(ps=1, workers=1, script=SCRIPT, progress=False)
    c.run_dir = Path("/tmp/x")
    c.plan()
    c.tasks[0].pid, c.tasks[0].state = 4242, "ready"
    c.tasks[1].pid, c.tasks[1].state, c.tasks[1].exit_code = 4343, "failed", 3
    text, page = repr(c), c._repr_html_()
    for needle in ("ps:0", "4242", str(c.tasks[0].port), "ready", "worker:0", "failed", "exit=3"):
        assert needle in text
    for needle in ("<table>", "4343", "failed", "<td>3</td>"):
        assert needle in page


def test_cluster_error_names_task_code_and_tail():
    err = ClusterError("worker:1 exited with code 3", task="worker:1", exit_code=3, log_tail="Traceback\nBoom")
    assert err.task == "worker:1" and err.exit_code == 3
    assert "worker:1" in str(err) and "Boom" in str(err)


def test_wait_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="start the job first"):
        TFCluster(ps=1, workers=1, script=SCRIPT).wait()


def _state(root: Path, name: str, parent: dict, tasks: list[dict], status="running") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"status": status, "parent": parent, "tasks": tasks}))
    return d


class FakeProc:
    def __init__(self, pid, ctime, status="sleeping"):
        self.pid, self._ctime, self._status = pid, ctime, status

    def create_time(self):
        return self._ctime

    def status(self):
        return self._status

    def children(self, recursive=False):
        return []


def test_reap_checks_pid_and_create_time_not_the_status(monkeypatch, tmp_path):
    procs = {
        10: FakeProc(10, 100.0),
        20: FakeProc(20, 555.0),
        21: FakeProc(21, 200.0),
        31: FakeProc(31, 300.0),
        41: FakeProc(41, 400.0),
    }

    def process(pid):
        if pid not in procs:
            raise psutil.NoSuchProcess(pid)
        return procs[pid]

    def killpg(pgid, sig):  # the signalled process ends at once
        killed.append((pgid, sig))
        procs.pop(pgid, None)

    killed = []
    monkeypatch.setattr(psutil, "Process", process)
    monkeypatch.setattr(os, "killpg", killpg)
    root = tmp_path / "runs"
    live = _state(root, "a-live", {"pid": 10, "create_time": 100.0}, [{"pid": 31, "pgid": 31, "create_time": 300.0}])
    # parent pid 20 exists but was reused (other create_time): the kernel is dead
    dead = _state(
        root,
        "b-dead",
        {"pid": 20, "create_time": 111.0},
        [{"pid": 21, "pgid": 21, "create_time": 200.0}, {"pid": 22, "pgid": 22, "create_time": 1.0}],
    )
    # says "running", but its kernel and every task are gone: nothing to do
    _state(root, "c-gone", {"pid": 99, "create_time": 1.0}, [{"pid": 32, "pgid": 32, "create_time": 300.0}])
    # says "stopped", but a task survived that stop: reap finds it by its pid
    survived = _state(
        root, "d-survived", {"pid": 98, "create_time": 1.0}, [{"pid": 41, "pgid": 41, "create_time": 400.0}], "stopped"
    )
    assert reap(root=root) == [str(dead), str(survived)]
    assert killed == [(21, 15), (41, 15)]
    assert json.loads((dead / "state.json").read_text())["status"] == "stopped"
    killed.clear()
    assert reap(include_live=True, root=root) == [str(live)]
    assert killed == [(31, 15)]


def test_reap_records_a_task_that_survives_sigkill(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(psutil, "Process", lambda pid: FakeProc(pid, 7.0))
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(sig))
    root = tmp_path / "runs"
    run = _state(
        root, "x", {"pid": 5, "create_time": 1.0}, [{"name": "worker:0", "pid": 6, "pgid": 6, "create_time": 7.0}]
    )
    assert reap(root=root, grace=0.1) == [str(run)]
    assert sent == [15, 9]
    state = json.loads((run / "state.json").read_text())
    assert state["status"] == "survived" and state["survivors"] == ["worker:0"]
    assert "still running after SIGKILL: worker:0 (pid 6)" in capsys.readouterr().out


def test_reap_ignores_a_task_pid_reused_by_another_process(monkeypatch, tmp_path):
    monkeypatch.setattr(psutil, "Process", lambda pid: FakeProc(pid, 999.0))
    sent = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(pgid))
    root = tmp_path / "runs"
    _state(root, "x", {"pid": 5, "create_time": 1.0}, [{"pid": 6, "pgid": 6, "create_time": 2.0}])
    reap(root=root)
    assert sent == []


def test_run_root_is_per_user(monkeypatch, tmp_path):
    assert cl.run_root({"LABS_RUN_ROOT": str(tmp_path / "r")}) == tmp_path / "r"
    assert cl.run_root({"HOME": str(tmp_path / "home")}) == tmp_path / "home" / ".lab_runs"
    assert oct((tmp_path / "home" / ".lab_runs").stat().st_mode & 0o777) == "0o700"


def test_guard_descendants_and_usage():
    from lab_utils import _guard

    assert _guard.main(["--parent", "1"]) == 2  # no "--"
    assert _guard.main(["--bogus", "1", "--", "true"]) == 2
    assert os.getpid() not in _guard.descendants()


def test_prune_runs_removes_only_old_runs_with_nothing_alive(tmp_path):
    me = psutil.Process()
    mine = {"pid": me.pid, "create_time": me.create_time()}
    states = {
        "newest": {"status": "stopped", "tasks": []},
        "old-stopped": {"status": "stopped", "tasks": [{"pid": 999999999, "create_time": 1.0}]},
        "old-running-kernel-gone": {"status": "running", "parent": {"pid": 999999998, "create_time": 1.0}, "tasks": []},
        "old-running-kernel-alive": {"status": "running", "parent": mine, "tasks": []},  # still in use
        "old-stopped-but-alive": {"status": "stopped", "tasks": [mine]},  # reap() decides, not prune
        "old-unreadable": None,
    }
    for age, (name, state) in enumerate(states.items()):
        d = tmp_path / name
        d.mkdir()
        (d / "state.json").write_text("{not json" if state is None else json.dumps(state))
        (d / "worker-0.log").write_text("log\n")
        os.utime(d, (1e9 - age, 1e9 - age))
    (tmp_path / "not-a-run").mkdir()
    removed = cl.prune_runs(1, tmp_path)
    assert [os.path.basename(p) for p in removed] == ["old-stopped", "old-running-kernel-gone"]
    kept = set(states) - {"old-stopped", "old-running-kernel-gone"} | {"not-a-run"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)
    assert cl.prune_runs(10, tmp_path) == []
    with pytest.raises(ValueError, match="keep"):
        cl.prune_runs(-1, tmp_path)
