"""Asynchronous vs synchronous parameter server, 1 and 2 workers, measured in one run.

    python bench/bench_ps_modes.py [--workers 1,2] [--batch-sizes 60] [--epochs 5] [--repeats 1]

Each configuration is 1 PS + W workers running the reference scripts
(``train_async.py`` / ``train_sync.py`` from the instructor notebooks, extracted by
``lab_utils.grading.reference_script``) on the same data for
the same number of passes (async: ``epochs`` epochs shared by the workers; sync:
the same number of examples, i.e. ``epochs * steps_per_epoch / W`` global steps
of W gradients each). Reported per run: wall time of the cluster, the slowest
worker's training time, total examples/s, time per local step, accuracy. Ratios
are computed between runs of this same invocation only (same machine, same load):
``sync_over_async_throughput`` per (W, batch) and ``scaling_2_over_1`` per
(mode, batch). Prints one JSON object on stdout; one progress line per run on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time

from json_out import emit

from lab_utils.cluster import TFCluster
from lab_utils.grading import reference_script

LABS = {"async": "02_ps_async", "sync": "03_ps_sync"}


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def one_run(mode: str, workers: int, batch: int, epochs: float, n_train: int) -> dict:
    args = {"batch_size": batch, "eval_every": 0}
    if mode == "async":
        args["epochs"] = epochs
    else:  # the same number of examples: each global step averages one batch per worker
        args["steps"] = max(1, math.ceil(epochs * math.ceil(n_train / batch) / workers))
    t0 = time.monotonic()
    with TFCluster(
        ps=1,
        workers=workers,
        script=reference_script(LABS[mode], f"train_{mode}.py"),
        args=args,
        progress=False,
        timeout=600,
    ) as cluster:
        results = cluster.wait()
    wall = time.monotonic() - t0
    rows = [results[f"worker:{i}"] for i in range(workers)]
    train = max(r["train_time"] for r in rows)
    examples = sum(r["examples"] for r in rows)
    local = sum(r["local_steps"] for r in rows)
    return {
        "mode": mode,
        "workers": workers,
        "batch_size": batch,
        "wall": round(wall, 2),
        "train_time_max": round(train, 3),
        "examples": examples,
        "examples_per_sec": round(examples / train, 1),
        "ms_per_local_step": round(1000 * statistics.mean(r["train_time"] / r["local_steps"] for r in rows), 2),
        "local_steps": [r["local_steps"] for r in rows],
        "exec_time": [round(r["exec_time"], 2) for r in rows],
        "final_global_step": rows[0]["final_global_step"],
        "accuracy": round(results["worker:0"]["accuracy"], 4),
        "total_local_steps": local,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=_ints, default=[1, 2])
    p.add_argument("--batch-sizes", type=_ints, default=[60])
    p.add_argument("--epochs", type=float, default=5.0)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args(argv)
    if args.epochs <= 0 or args.repeats < 1:
        p.error(f"need --epochs > 0 and --repeats >= 1, got {args.epochs}, {args.repeats}")
    os.environ.setdefault("LABS_OFFLINE", "1")
    from lab_utils.data import load_mnist

    with contextlib.redirect_stdout(sys.stderr):  # stdout is the JSON only
        data = load_mnist()
    n_train = len(data.y_train)
    runs = []
    t0 = time.monotonic()
    configs = [(m, w, b) for b in args.batch_sizes for w in args.workers for m in ("async", "sync")]
    for rep in range(args.repeats):
        for i, (mode, workers, batch) in enumerate(configs):
            row = one_run(mode, workers, batch, args.epochs, n_train)
            row["repeat"] = rep
            runs.append(row)
            print(
                f"[{rep * len(configs) + i + 1}/{args.repeats * len(configs)}] {mode:5s} W={workers} batch={batch}: "
                f"{row['examples_per_sec']:.0f} examples/s, {row['ms_per_local_step']:.1f} ms/step, "
                f"acc {row['accuracy']:.3f}, wall {row['wall']:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    def mean_eps(mode, workers, batch):
        vals = [
            r["examples_per_sec"] for r in runs if (r["mode"], r["workers"], r["batch_size"]) == (mode, workers, batch)
        ]
        return statistics.mean(vals) if vals else None

    ratios = {"sync_over_async_throughput": {}, "scaling_2_over_1": {}}
    for b in args.batch_sizes:
        for w in args.workers:
            a, s = mean_eps("async", w, b), mean_eps("sync", w, b)
            ratios["sync_over_async_throughput"][f"W={w},batch={b}"] = round(s / a, 3)
        if 1 in args.workers and 2 in args.workers:
            for m in ("async", "sync"):
                ratios["scaling_2_over_1"][f"{m},batch={b}"] = round(mean_eps(m, 2, b) / mean_eps(m, 1, b), 3)
    out = {
        "bench": "ps_modes",
        "config": {**vars(args), "n_train": n_train, "data_source": data.source},
        "ratios": ratios,
        "runs": runs,
        "wall_total": round(time.monotonic() - t0, 1),
    }
    emit(out, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
