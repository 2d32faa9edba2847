"""Process tests for Labs 2-3: the reference training scripts on a real 1 PS + 2 worker cluster.

The scripts are the instructor notebooks' solutions, extracted by
``lab_utils.grading.reference_script``; they call ``lab_utils.training.ps``.

Each TensorFlow cluster costs about 15 s on 2 cores (three TF imports), so the
module runs four small clusters (~1 minute) and one bad-input run that stops
before TensorFlow is imported. Data: the offline MNIST sample (conftest sets
LABS_OFFLINE=1; the launcher passes the environment on to the tasks).
"""

from __future__ import annotations

import math
import threading

import psutil
import pytest
from support import timelines

from lab_utils import report
from lab_utils.cluster import GUARD_MEMORY_BYTES, ClusterError, TFCluster
from lab_utils.data import load_mnist
from lab_utils.grading import reference_script
from lab_utils.training.ps import runs as ps_runs

RUN_BOUND = 120.0  # seconds: a run that takes longer than this counts as hung


@pytest.fixture(scope="module")
def scripts():
    return {
        "async": reference_script("02_ps_async", "train_async.py"),
        "sync": reference_script("03_ps_sync", "train_sync.py"),
    }


def _own_memory(pid: int) -> int:
    """The private (anonymous) resident memory of ``pid``'s tree (the guard, then the task):
    what each process adds to a cgroup. Its file pages (TensorFlow's library) are shared by
    every TensorFlow process and charged once."""
    try:
        root = psutil.Process(pid)
        return sum((m := p.memory_info()).rss - m.shared for p in [root, *root.children(recursive=True)])
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return 0


def run(script, args: dict, workers: int = 2, peaks: dict | None = None):
    """Run a cluster to the end; return (results, step events per worker, cluster).
    ``peaks``: filled with each task's highest private memory, sampled as it runs."""
    with TFCluster(ps=1, workers=workers, script=script, args=args, timeout=RUN_BOUND, progress=False) as c:
        done = threading.Event()

        def sample():
            while not done.wait(0.1):
                for name, pid in c.task_pids().items():
                    peaks[name] = max(peaks.get(name, 0), _own_memory(pid))

        sampler = threading.Thread(target=sample, daemon=True)
        if peaks is not None:
            sampler.start()
        try:
            results = c.wait()
        finally:
            done.set()
            if peaks is not None:
                sampler.join(timeout=30)
    steps = {t.name: report.read_events(t.events_path, "step") for t in c.tasks if t.role == "worker"}
    # every process ended: workers by themselves (exit 0), the PS stopped by the launcher
    states = {t.name: (t.state, t.exit_code) for t in c.tasks}
    assert all(states[f"worker:{i}"] == ("done", 0) for i in range(workers)), states
    assert states["ps:0"][0] == "stopped" and not any(t.running() for t in c.tasks), states
    return results, steps, c


def test_async_reaches_accuracy_and_reports_throughput(scripts):
    peaks = {}
    results, steps, _ = run(scripts["async"], {"steps": 200, "batch_size": 50, "eval_every": 50}, peaks=peaks)
    # What lab_utils fits clusters by (a Binder session of 2 GB holds 1 PS + 2 workers by it)
    # holds what each task really added: its private memory, its guard's included.
    guard = GUARD_MEMORY_BYTES
    assert sorted(peaks) == ["ps:0", "worker:0", "worker:1"], peaks
    assert 0 < peaks["ps:0"] <= ps_runs.task_memory("ps") + guard, peaks
    assert all(0 < peaks[w] <= ps_runs.task_memory("worker") + guard for w in ("worker:0", "worker:1")), peaks
    assert set(results) == {"worker:0", "worker:1"}
    for name, r in results.items():
        assert r["mode"] == "async"
        assert r["accuracy"] >= 0.80, (name, r["accuracy"])
        assert r["final_global_step"] >= 200
        assert r["examples_per_sec"] > 0 and r["examples"] == 50 * r["local_steps"]
        assert len(steps[name]) == r["local_steps"]
    # asynchronous: the workers' local steps add up to the global steps taken
    total_local = sum(r["local_steps"] for r in results.values())
    assert 200 <= total_local <= max(r["final_global_step"] for r in results.values())
    # evaluation is not training: the chief's evaluations are timed apart, and the loop
    # time plus them fits inside the execution time; the other worker never evaluates
    chief, other = results["worker:0"], results["worker:1"]
    assert chief["eval_time"] > 0 and other["eval_time"] == 0
    assert chief["train_time"] + chief["eval_time"] < chief["exec_time"]
    assert chief["examples_per_sec"] == pytest.approx(chief["examples"] / chief["train_time"])
    # the chief evaluated on the way: accuracy against global step for the plots
    evals = [e for e in steps["worker:0"] if "accuracy" in e]
    assert len(evals) >= 3 and evals[-1]["step"] >= 150


def test_async_straggler_does_not_stop_the_others_and_is_stale(scripts):
    results, steps, cluster = run(
        scripts["async"], {"steps": 300, "batch_size": 50, "eval_every": 0, "straggler": "worker:1=30ms"}
    )
    fast, slow = results["worker:0"], results["worker:1"]
    assert slow["straggler_delay"] == pytest.approx(0.03) and fast["straggler_delay"] == 0
    # asynchronous: the fast worker keeps going and does most of the steps ...
    assert fast["local_steps"] > slow["local_steps"] >= 1
    assert fast["local_steps"] + slow["local_steps"] >= 300
    # ... and the straggler's gradients are stale: other workers' updates between two of its own
    assert slow["staleness_mean"] > fast["staleness_mean"]
    assert all("staleness" in e for e in steps["worker:1"][1:])
    # On the timeline: the straggler's injected delay, 30 ms in each of its steps; the others
    # never wait for it, they pull, compute and push
    measured = {w: r["train_time"] for w, r in results.items()}
    sec = timelines.check(cluster.timeline, measured, tasks=["ps:0", "worker:0", "worker:1"])
    assert sec["worker:1"]["delay"] == pytest.approx(0.03 * slow["local_steps"], rel=0.15)
    assert sec["worker:0"]["wait"] == 0 and sec["worker:0"]["delay"] == 0
    assert cluster.timeline.waits_by_cause().empty  # nobody waited for anybody: no cause to find
    assert sec["worker:0"]["comm"] > 0 and sec["worker:0"]["compute"] > 0


def check_sync(results, target, replicas, workers=2):
    for name, r in results.items():
        assert r["mode"] == "sync" and r["final_global_step"] == target, (name, r)
        assert r["replicas_to_aggregate"] == replicas
        assert r["examples_per_sec"] > 0
    chief = results["worker:0"]
    # measured on the PS: one counted update per global step, each averaging R gradients
    # (exactly R when R == number of workers; with backup workers TF may average up to N)
    assert chief["updates_counted"] == target
    assert chief["gradients_per_update_min"] == replicas
    if replicas == workers:
        assert chief["gradients_per_update_max"] == replicas
        assert chief["gradients_applied"] == replicas * target
    else:
        assert chief["gradients_per_update_max"] <= workers
        assert replicas * target <= chief["gradients_applied"] <= workers * target
    assert sum(r["local_steps"] for r in results.values()) >= chief["gradients_applied"]


def test_sync_global_step_and_gradients_per_step_exact_and_the_barrier_waits_for_a_straggler(scripts):
    args = {"steps": 100, "batch_size": 50, "eval_every": 25, "straggler": "worker:1=20ms"}
    results, steps, cluster = run(scripts["sync"], args)
    check_sync(results, 100, 2)
    assert all(r["local_steps"] == 100 for r in results.values())  # R = N: one gradient per worker per step
    assert results["worker:0"]["accuracy"] >= 0.80
    # The barrier on the timeline: worker:0 pushes its gradient, then waits for a token until
    # worker:1's arrives, 20 ms later each step: its token waits add up to the injected delay
    measured = {w: r["train_time"] for w, r in results.items()}
    sec = timelines.check(cluster.timeline, measured, tasks=["ps:0", "worker:0", "worker:1"])
    assert sec["worker:1"]["delay"] == pytest.approx(0.02 * 100, rel=0.15)
    assert sec["worker:0"]["wait"] == pytest.approx(sec["worker:1"]["delay"], rel=0.35), sec
    assert "push + token wait" in {p.name for p in cluster.timeline.parts if p.task == "worker:0" and p.cat == "wait"}
    # and why: worker:0's waits are worker:1's injected delay, all of it (issue 55)
    timelines.check_cause(cluster.timeline, "worker:0", "worker:1")


def test_sync_backup_worker_with_straggler(scripts):
    results, _, _ = run(
        scripts["sync"], {"steps": 60, "batch_size": 50, "replicas_to_aggregate": 1, "straggler": "worker:1=30ms"}
    )
    check_sync(results, 60, 1)
    assert results["worker:1"]["straggler_delay"] == pytest.approx(0.03)
    # the straggler contributes fewer steps than the fast worker when only 1 of 2 gradients is needed
    assert results["worker:1"]["local_steps"] < results["worker:0"]["local_steps"]


def test_sync_epochs_mean_steps_per_epoch_global_steps(scripts):
    # 1 epoch = ceil(n_train / batch) global steps (the CS 744 convention); 10 on the offline sample
    n_train = len(load_mnist(verbose=False).y_train)
    target = math.ceil(n_train / 400)
    results, _, _ = run(scripts["sync"], {"epochs": 1, "batch_size": 400})
    check_sync(results, target, 2)
    assert results["worker:0"]["target_global_steps"] == target


def test_bad_input_fails_clearly_before_tensorflow(scripts):
    with pytest.raises(ClusterError) as info:
        run(scripts["sync"], {"steps": 10, "replicas_to_aggregate": 3})
    assert info.value.exit_code == 2
    assert "replicas_to_aggregate=3 is more than the 2 worker(s)" in info.value.log_tail
