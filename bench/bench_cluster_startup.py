"""Time from TFCluster start to "all tasks ready" for 1 PS + 2 workers, against its bound.

Every task must import TensorFlow, so N tasks on C usable cores cannot be ready
sooner than about N x (CPU seconds of ``python -c "import tensorflow"``) / C.
Both numbers are measured in this run (a ratio, so a slow or busy machine does
not move the target). Target: ratio <= 1.25.

    python bench/bench_cluster_startup.py [--repeat 3]      # prints one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab_utils.cluster import TFCluster
from lab_utils.resources import usable_cores

TASK = """\
from lab_utils.cluster import start_server
start_server().join()   # every task (PS and workers) just serves: we time readiness only
"""


def import_cpu_seconds(env: dict) -> float:
    """CPU (user + system) of one ``python -c "import tensorflow"`` child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(
        [sys.executable, "-c", "import tensorflow"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="cluster starts to time (median reported)")
    parser.add_argument("--imports", type=int, default=2, help="'import tensorflow' runs to time (median)")
    parser.add_argument("--workers", type=int, default=2)
    opts = parser.parse_args()

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    tasks = 1 + opts.workers
    cores = usable_cores()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        script = Path(tmp) / "bench_task.py"
        script.write_text(TASK)
        os.environ.setdefault("LABS_RUN_ROOT", str(Path(tmp) / "runs"))
        imports, ready = [], []
        for i in range(max(opts.repeat, opts.imports)):  # interleave, so drift hits both alike
            if i < opts.imports:
                imports.append(import_cpu_seconds(env))
            if i < opts.repeat:
                cluster = TFCluster(ps=1, workers=opts.workers, script=str(script), progress=False)
                t0 = time.perf_counter()
                cluster.start()
                ready.append(time.perf_counter() - t0)
                cluster.stop()
    import_cpu = statistics.median(imports)
    bound = tasks * import_cpu / cores
    median = statistics.median(ready)
    print(
        json.dumps(
            {
                "bench": "cluster_startup",
                "cluster": f"1 PS + {opts.workers} workers",
                "tasks": tasks,
                "usable_cores": cores,
                "import_tensorflow_cpu_s": [round(x, 3) for x in imports],
                "bound_s": round(bound, 3),
                "bound_formula": "tasks * median(import_tensorflow_cpu_s) / usable_cores",
                "start_to_all_ready_s": [round(x, 3) for x in ready],
                "start_to_all_ready_median_s": round(median, 3),
                "ratio_to_bound": round(median / bound, 3),
                "target_ratio": 1.25,
                "within_target": median / bound <= 1.25,
                "python": platform.python_version(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
