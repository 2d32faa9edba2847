"""Overhead of lab_utils.metrics.Monitor: CPU % of one core used by the sampler
thread at 1 Hz and 10 Hz while it samples a 3-task cluster (1 PS + 2 workers).

Prefers a real lab_utils.cluster.TFCluster (tests/fixtures/metrics_tf_task.py:
idle PS, busy workers). With ``--stand-in`` (or when TensorFlow/the cluster
module cannot be used) three plain Python processes stand in (one idle, two busy).
The sampler thread's own CPU time is read from /proc (its native thread id),
so the busy tasks and this script's main thread are not counted.
Targets: < 1 % at 1 Hz, < 3 % at 10 Hz. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from lab_utils.metrics import Monitor

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {1.0: 1.0, 0.1: 3.0}


def thread_cpu(native_id: int) -> float:
    for t in psutil.Process().threads():
        if t.id == native_id:
            return t.user_time + t.system_time
    raise LookupError(f"thread {native_id} not found")


def measure(tasks_or_cluster, interval: float, seconds: float) -> dict:
    kw = {"cluster": tasks_or_cluster} if not isinstance(tasks_or_cluster, dict) else {"tasks": tasks_or_cluster}
    with Monitor(interval=interval, **kw) as mon:
        tid = mon._thread.native_id
        c0, w0, n0 = thread_cpu(tid), time.monotonic(), mon.sampler.samples
        time.sleep(seconds)  # the measurement window
        c1, w1, n1 = thread_cpu(tid), time.monotonic(), mon.sampler.samples
    samples = n1 - n0
    tasks_seen = sorted(mon.frame(metric="rss")["task"].unique())
    return {
        "interval_s": interval,
        "window_s": round(w1 - w0, 2),
        "samples": samples,
        "cpu_percent_of_one_core": round(100 * (c1 - c0) / (w1 - w0), 3),
        "cpu_ms_per_sample": round(1000 * (c1 - c0) / max(1, samples), 3),
        "target_percent": TARGETS[interval],
        "tasks": tasks_seen,
        "rows_per_sample": round(len(mon.frame()) / max(1, mon.sampler.samples), 1),
    }


@contextlib.contextmanager
def stand_in(seconds: float):
    busy = f"import time\nend = time.monotonic() + {seconds:f}\nwhile time.monotonic() < end: pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)]
    procs += [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]
    try:
        yield {"ps:0": procs[0].pid, "worker:0": procs[1].pid, "worker:1": procs[2].pid}
    finally:
        for p in procs:
            p.kill()
            p.wait()


@contextlib.contextmanager
def tf_cluster(seconds: float):
    from lab_utils.cluster import TFCluster

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("LABS_RUN_ROOT", tmp)
        with TFCluster(
            ps=1,
            workers=2,
            script=str(ROOT / "tests/fixtures/metrics_tf_task.py"),
            args={"seconds": seconds},
            progress=False,
            timeout=seconds + 120,
        ) as cluster:
            yield cluster


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=20.0, help="measurement window per rate")
    ap.add_argument("--stand-in", action="store_true", help="plain processes instead of a TF cluster")
    args = ap.parse_args()
    total = 2 * args.seconds + 10
    kind, note = "tfcluster", "real TFCluster 1 PS + 2 workers (tests/fixtures/metrics_tf_task.py)"
    if args.stand_in:
        kind, note = "stand-in", "3 plain python processes: 1 idle 'ps', 2 busy 'workers'"
    else:
        try:
            import lab_utils.cluster  # noqa: F401
        except ImportError as exc:
            kind, note = "stand-in", f"lab_utils.cluster not importable ({exc}); 3 plain processes"
    ctx = tf_cluster(total) if kind == "tfcluster" else stand_in(total)
    with ctx as target:
        runs = [measure(target, interval, args.seconds) for interval in (1.0, 0.1)]
    out = {
        "bench": "metrics_overhead",
        "cluster": kind,
        "note": note,
        "cores": psutil.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "runs": runs,
        "within_target": all(r["cpu_percent_of_one_core"] < r["target_percent"] for r in runs),
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
