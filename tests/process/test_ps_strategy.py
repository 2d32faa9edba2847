"""Process tests for Lab 2's TF2 aside: TFCluster's chief role on stand-in tasks (no
TensorFlow: about a second each), and one real ``ParameterServerStrategy`` run of
``ps_runs.run_ps_strategy`` (1 chief + 1 PS + 2 workers: four TensorFlow imports, about
15 s on 2 cores). Data: the offline MNIST sample (conftest sets LABS_OFFLINE=1)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import psutil
import pytest

from lab_utils.cluster import GUARD_MEMORY_BYTES, TF_TASK_MEMORY_BYTES, ClusterError, TFCluster
from lab_utils.data import load_mnist, target_accuracy
from lab_utils.training.ps import runs as ps_runs
from lab_utils.training.ps.strategy import runs as ps_strategy_runs

FAKE = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_task.py")
SMALL = 50 * 1024**2  # memory_per_task for the stand-in


# ----------------------------------------------------------------------------- the chief role, stand-in tasks


def chief_cluster(**args) -> TFCluster:
    return TFCluster(ps=1, workers=2, chief=1, script=FAKE, args=args, memory_per_task=SMALL, progress=False)


def test_the_run_ends_when_the_chief_ends_and_the_servers_are_stopped():
    with chief_cluster(steps=5) as c:
        assert [t.state for t in c.tasks] == ["ready"] * 4
        results = c.wait()
    assert set(results) == {"chief:0"} and results["chief:0"]["steps"] == 5
    states = {t.name: (t.state, t.exit_code) for t in c.tasks}
    assert states["chief:0"] == ("done", 0)
    assert all(states[name][0] == "stopped" for name in ("ps:0", "worker:0", "worker:1")), states
    assert not any(t.running() for t in c.tasks)


def test_a_worker_that_ends_while_the_chief_runs_fails_the_run():
    """In TF2's layout a worker is a server: one that exits, even with 0, leaves the chief
    scheduling steps on nobody."""
    with pytest.raises(ClusterError, match="worker:1 exited with code 0") as info:
        with chief_cluster(steps=100, step_time=0.05, fail_task="worker:1", fail_code=0) as c:
            c.wait()
    assert info.value.task == "worker:1"
    assert c.task("chief", 0).state == "stopped", "the chief was still running when the worker ended"
    assert not any(t.running() for t in c.tasks)


def test_a_failing_chief_is_named_with_its_log():
    with pytest.raises(ClusterError, match="chief:0 exited with code 3") as info:
        with chief_cluster(steps=4, fail_task="chief:0") as c:
            c.wait()
    assert "chief:0: failing on purpose with code 3" in info.value.log_tail
    assert not any(t.running() for t in c.tasks)


# ----------------------------------------------------------------------------- a real ParameterServerStrategy run


def sample_task_memory(peaks: dict, done: threading.Event) -> None:
    """Until ``done``: each task's highest private resident memory (its guard's included),
    found among this process's children by their ``LABS_TASK``."""
    me = psutil.Process()
    while not done.wait(0.1):
        now: dict[str, int] = {}
        for proc in me.children(recursive=True):
            try:
                task = proc.environ().get("LABS_TASK")
                if task:
                    m = proc.memory_info()
                    now[task] = now.get(task, 0) + m.rss - m.shared
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        for task, value in now.items():
            peaks[task] = max(peaks.get(task, 0), value)


def test_parameter_server_strategy_trains_asynchronously_on_both_workers_and_ends(capfd):
    steps = 200
    peaks: dict[str, int] = {}
    done = threading.Event()
    sampler = threading.Thread(target=sample_task_memory, args=(peaks, done), daemon=True)
    sampler.start()
    try:
        run = ps_runs.run_ps_strategy(workers=2, steps=steps, batch_size=64, learning_rate=0.5)
    finally:
        done.set()
        sampler.join(timeout=30)
    r = run.result
    assert r["steps_scheduled"] == steps
    assert r["updates_applied"] == steps, "optimizer.iterations on the PS: every scheduled step applied once"
    assert sum(run.worker_steps.values()) == steps and set(run.worker_steps) == {"worker:0", "worker:1"}
    assert all(n >= 1 for n in run.worker_steps.values()), f"the coordinator used both workers: {run.worker_steps}"
    assert r["variables_on"] and all(d.startswith("/job:ps/") for d in r["variables_on"]), r["variables_on"]
    assert run.accuracy >= target_accuracy(load_mnist(verbose=False)), run.accuracy
    assert r["loss_last"] < r["loss_first"]
    assert list(run.steps["step"]) == list(range(1, steps + 1))
    assert run.steps["worker"].value_counts().to_dict() == run.worker_steps
    state = json.loads((Path(run.run_dir) / "state.json").read_text())
    tasks = {t["name"]: t["state"] for t in state["tasks"]}
    assert state["status"] == "stopped" and tasks == {
        "chief:0": "done",
        "ps:0": "stopped",
        "worker:0": "stopped",
        "worker:1": "stopped",
    }, tasks
    # what run_ps_strategy fits the cluster by holds what each task really added
    assert sorted(peaks) == ["chief:0", "ps:0", "worker:0", "worker:1"], peaks
    assert 0 < peaks["ps:0"] <= TF_TASK_MEMORY_BYTES + GUARD_MEMORY_BYTES, peaks
    assert 0 < peaks["chief:0"] <= ps_strategy_runs.CHIEF_MEMORY_BYTES + GUARD_MEMORY_BYTES, peaks
    for worker in ("worker:0", "worker:1"):
        assert 0 < peaks[worker] <= ps_strategy_runs.WORKER_MEMORY_BYTES + GUARD_MEMORY_BYTES, peaks
    assert capfd.readouterr().err == "", "nbgrader scores a cell with stderr output 0"
