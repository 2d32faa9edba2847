"""Each lab's CI run (papermill, ``labs/params.yml``'s ``ci`` parameters) against its time budget.

The budgets used to be assertions in ``tests/notebooks/test_labs.py``, where a machine 2.4x
slower failed a correct lab. They live here: a measurement, not a test. Beside each wall
time the bench reports the CPU seconds of one ``import tensorflow`` measured in the same run,
and the wall time in those units, so that a slower or busier machine can be compared with
the budgets (set on a 2-core machine of this project's kind, where that import costs about
4 CPU seconds).

    python bench/bench_labs.py [--labs 02,04]      # prints one JSON object
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_cluster_startup import import_cpu_seconds  # the same unit as the cluster start-up bench

from lab_utils.resources import usable_cores

REPO = Path(__file__).resolve().parents[1]
#: seconds of each lab's CI run on a 2-core machine of this project's kind (the issues'
#: bounds: 4 minutes for the PS labs, 5 for Labs 5 to 7)
BUDGET_S = {
    "01_single_node": 120,
    "02_ps_async": 240,
    "03_ps_sync": 240,
    "04_allreduce": 240,
    "05_alexnet": 300,
    "06_communication": 300,
    "07_model_parallel": 300,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", default="", help="comma-separated, e.g. 02,04 (default: all)")
    opts = parser.parse_args()
    unit = import_cpu_seconds(dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    with tempfile.TemporaryDirectory(prefix="bench-labs-") as out:
        cmd = [sys.executable, "-m", "lab_utils.run_labs", "--out", out, "--no-progress"]
        proc = subprocess.run(
            cmd + (["--labs", opts.labs] if opts.labs else []), cwd=REPO, capture_output=True, text=True
        )
        rows = json.loads((Path(out) / "summary.json").read_text()) if (Path(out) / "summary.json").is_file() else []
    labs = {}
    for row in rows:
        wall, budget = row.get("wall_time_s"), BUDGET_S.get(row["lab"])
        labs[row["lab"]] = {
            "status": row["status"],
            "wall_s": wall,
            "budget_s": budget,
            "within_budget": None if wall is None or budget is None else wall <= budget,
            "wall_in_tf_imports": None if wall is None else round(wall / unit, 1),
        }
    print(
        json.dumps(
            {
                "bench": "labs",
                "machine": {"cores": usable_cores(), "cpu_count": os.cpu_count(), "python": platform.python_version()},
                "import_tensorflow_cpu_s": round(unit, 2),
                "labs": labs,
                "all_within_budget": bool(labs) and all(v["within_budget"] for v in labs.values()),
                "run_labs_exit": proc.returncode,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
