"""Does every synchronous PS run end by itself? N consecutive runs of Lab 3's script.

    python bench/bench_sync_hang_loop.py [--runs 20] [--steps 50] [--workers 2]
        [--replicas-to-aggregate R] [--straggler worker:1=20ms] [--bound 90]

Each run is 1 PS + W workers launched with lab_utils.cluster.TFCluster (offline
MNIST sample unless LABS_OFFLINE=0). A run that is still going after ``--bound``
seconds counts as a *hang* (the launcher then stops it); a task exiting non-zero
is a *failure*; a run whose workers do not all end at the target global step,
whose update count differs from it, or whose updates did not each average
exactly R gradients (R = N; with R < N: at least R) is *wrong*. Runs where an
update averaged more than R gradients (possible with backup workers) are counted
in ``runs_with_update_over_R``. Prints one
JSON object on stdout; one progress line per run on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from lab_utils.cluster import ClusterError, TFCluster
from lab_utils.grading import reference_script


def one_run(args) -> dict:
    cluster_args = {"steps": args.steps, "batch_size": args.batch_size, "eval_every": 0}
    if args.replicas_to_aggregate:
        cluster_args["replicas_to_aggregate"] = args.replicas_to_aggregate
    if args.straggler:
        cluster_args["straggler"] = args.straggler
    replicas = args.replicas_to_aggregate or args.workers
    t0 = time.monotonic()
    row = {"hung": False, "failed": False, "wrong": False}
    script = reference_script("03_ps_sync", "train_sync.py")
    c = TFCluster(ps=1, workers=args.workers, script=script, args=cluster_args, timeout=args.bound, progress=False)
    try:
        with c:
            results = c.wait()
    except ClusterError as exc:
        row["wall"] = time.monotonic() - t0
        row["hung"] = exc.exit_code is None  # still running at the bound
        row["failed"] = not row["hung"]
        row["error"] = f"{exc.task}: exit {exc.exit_code}: {str(exc).splitlines()[0][:300]}"
        row["run_dir"] = str(c.run_dir)
        return row
    row["wall"] = time.monotonic() - t0
    chief = results.get("worker:0", {})
    steps = sorted({r.get("final_global_step") for r in results.values()})
    row.update(
        {
            "final_global_steps": steps,
            "local_steps": [results[f"worker:{i}"]["local_steps"] for i in range(args.workers)],
            "exec_time": [round(results[f"worker:{i}"]["exec_time"], 3) for i in range(args.workers)],
            "grads_per_update": [chief.get("gradients_per_update_min"), chief.get("gradients_per_update_max")],
            "accuracy": chief.get("accuracy"),
        }
    )
    row["wrong"] = (
        len(results) != args.workers
        or steps != [args.steps]
        or chief.get("updates_counted") != args.steps
        or row["grads_per_update"][0] != replicas
        or (replicas == args.workers and row["grads_per_update"][1] != replicas)
    )
    # with backup workers (R < N) TF may average up to N gradients in one update: counted, not "wrong"
    row["update_over_R"] = bool(row["grads_per_update"][1] and row["grads_per_update"][1] > replicas)
    if row["wrong"] or row["update_over_R"]:
        row["run_dir"] = str(c.run_dir)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--steps", type=int, default=50, help="target global step of each run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=50)
    p.add_argument("--replicas-to-aggregate", type=int, default=None)
    p.add_argument("--straggler", default=None)
    p.add_argument("--bound", type=float, default=90.0, help="seconds after which a run counts as hung")
    args = p.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.bound <= 0:
        p.error(f"need --runs >= 1, --steps >= 1, --bound > 0; got {args.runs}, {args.steps}, {args.bound}")
    os.environ.setdefault("LABS_OFFLINE", "1")
    rows = []
    t0 = time.monotonic()
    for i in range(args.runs):
        row = one_run(args)
        rows.append(row)
        status = "HUNG" if row["hung"] else "FAILED" if row["failed"] else "WRONG" if row["wrong"] else "ok"
        print(f"run {i + 1}/{args.runs}: {status} in {row['wall']:.1f} s", file=sys.stderr, flush=True)
    walls = [r["wall"] for r in rows]
    out = {
        "bench": "sync_hang_loop",
        "config": {k: v for k, v in vars(args).items()},
        "runs": len(rows),
        "hangs": sum(r["hung"] for r in rows),
        "failures": sum(r["failed"] for r in rows),
        "wrong": sum(r["wrong"] for r in rows),
        "runs_with_update_over_R": sum(r.get("update_over_R", False) for r in rows),
        "wall_mean": round(statistics.mean(walls), 2),
        "wall_max": round(max(walls), 2),
        "wall_min": round(min(walls), 2),
        "wall_total": round(time.monotonic() - t0, 1),
        "walls": [round(w, 2) for w in walls],
        "per_run": rows,
    }
    print(json.dumps(out, indent=1))
    return 0 if out["hangs"] == out["failures"] == out["wrong"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
