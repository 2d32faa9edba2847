"""lab_utils.metrics against real processes: a 1 PS + 2 worker TensorFlow cluster
(lab_utils.cluster.TFCluster) and a plain-subprocess stand-in. Nothing may leak."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support.poll import poll_for
from support.procs import alive as procs_alive

from lab_utils import report
from lab_utils.metrics import Monitor

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SEEDS_COLUMNS = ("Peak Mem", "Peak CPU", "Network R", "Network W", "Examples/s", "s/batch")


@pytest.fixture(autouse=True)
def no_leaks(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_RUN_ROOT", str(tmp_path / "runs"))
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    yield
    deadline = time.monotonic() + 10
    while True:
        left = [p for p in me.children(recursive=True) if p.pid not in before and procs_alive(p)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"processes left running: {[(p.pid, p.cmdline()) for p in left]}"


def check_roles_and_summary(mon: Monitor, tasks=("ps:0", "worker:0", "worker:1")):
    df = mon.frame()
    assert list(df.columns) == ["time", "role", "task", "metric", "value"]
    for task in tasks:
        rows = df[(df["task"] == task) & (df["metric"] == "cpu_percent")]
        assert len(rows) >= 3, f"no CPU rows for {task}"
        assert (df[(df["task"] == task) & (df["metric"] == "rss")]["value"] > 0).all()
    assert set(df["role"]) >= {"ps", "worker", "host"}
    assert {"net_recv", "net_sent"} <= set(df[df["task"] == "lo"]["metric"])
    s = mon.summary()
    for col in SEEDS_COLUMNS:
        assert col in s.columns
    assert list(s.index) == [*tasks, "total"]
    ps_cpu = s.loc["ps:0", "Avg CPU"]
    worker_cpu = min(s.loc["worker:0", "Avg CPU"], s.loc["worker:1", "Avg CPU"])
    assert ps_cpu < worker_cpu, s.to_string()
    assert s.loc["total", "network_scope"].startswith("host")
    return s


def test_real_tf_cluster_one_ps_two_workers():
    from lab_utils.cluster import TFCluster  # the colleague's module; this test depends on it

    with TFCluster(
        ps=1, workers=2, script=str(FIX / "metrics_tf_task.py"), args={"seconds": 6}, progress=False, timeout=180
    ) as cluster:
        with Monitor(cluster=cluster, interval=0.25) as mon:
            cluster.wait()
    s = check_roles_and_summary(mon)
    for w in ("worker:0", "worker:1"):
        assert s.loc[w, "Examples/s"] > 0 and 0 < s.loc[w, "s/batch"] < 10
    assert s.loc["total", "Examples/s"] == pytest.approx(s.loc[["worker:0", "worker:1"], "Examples/s"].sum())
    assert s.loc["ps:0", "Peak Mem"] > 100 * 2**20  # a TF process


BURN = """
import sys, time
from lab_utils import report
end = time.monotonic() + float(sys.argv[1]); n = 0
while time.monotonic() < end:
    sum(i * i for i in range(20000)); n += 1
    report.step(n, n * 32)
"""


def test_plain_subprocess_stand_in_idle_ps_busy_workers(tmp_path):
    ps = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    workers = []
    try:
        for i in range(2):
            env = {
                **__import__("os").environ,
                "LABS_TASK": f"worker:{i}",
                "LABS_REPORT_FILE": str(tmp_path / f"worker-{i}.jsonl"),
            }
            workers.append(subprocess.Popen([sys.executable, "-c", BURN, "30"], env=env))
        tasks = {"ps:0": ps.pid, **{f"worker:{i}": w.pid for i, w in enumerate(workers)}}
        with Monitor(tasks, interval=0.2, events=tmp_path) as mon:
            poll_for(
                lambda: (
                    mon.sampler.samples >= 12
                    and all(report.read_events(tmp_path / f"worker-{i}.jsonl", "step") for i in range(2))
                ),
                30,
                "12 samples and step events",
            )
            workers[0].kill()  # a task that exits while being sampled
            workers[0].wait()
            poll_for(lambda: "worker:0" in mon.sampler.exited, 10, "worker:0 seen as exited")
    finally:
        for p in [ps, *workers]:
            if p.poll() is None:
                p.kill()
            p.wait()
    s = check_roles_and_summary(mon)
    assert s.loc["worker:1", "Examples/s"] > 0


def test_mpi_job_is_sampled_per_rank():
    """Once every rank has reported, the sampler sees rank:0 and rank:1 (each its own
    process tree), not one launcher blob."""
    from lab_utils.cluster import MPIJob

    with MPIJob(
        np=2, script=FIX / "cluster_mpi_task.py", args={"hang": True}, launcher="mpirun", progress=False, timeout=120
    ) as job:
        with Monitor(cluster=job, interval=0.2) as mon:
            deadline = time.monotonic() + 60
            while set(job.task_pids()) != {"rank:0", "rank:1"} and time.monotonic() < deadline:
                time.sleep(0.1)  # polling the ranks' reports under a deadline
            assert set(job.task_pids()) == {"rank:0", "rank:1"}, job.task_pids()
            assert job.tasks[0].pid not in job.task_pids().values()
            seen: set = set()
            while not {"rank:0", "rank:1"} <= seen and time.monotonic() < deadline:
                time.sleep(0.1)  # until the sampler has taken a sample of each rank
                seen = set(mon.frame()["task"])
    df = mon.frame()
    for rank in ("rank:0", "rank:1"):
        rss = df[(df["task"] == rank) & (df["metric"] == "rss")]["value"]
        assert len(rss) >= 1 and (rss > 5 * 2**20).all(), (rank, rss)
    assert set(df[df["task"].str.startswith("rank:")]["role"]) == {"rank"}
