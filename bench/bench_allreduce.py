"""Lab 4: the hand ring and Horovod against MPI's Allreduce, and Horovod training throughput, in one run.

    python bench/bench_allreduce.py [--sweeps 3] [--repeats 5] [--hvd-repeats 10] [--steps 300] [--rounds 2]

1. Bus bandwidth (what each rank sends per second, the nccl-tests convention:
   ``2 (N-1)/N x nbytes / seconds``) of the instructor's ``ring_allreduce``
   (``ring.py`` of the Lab 4 notebook) and of MPI's ``Allreduce`` on 2 ranks, for
   1 KB ... 64 MB in powers of 4, and memcpy GB/s (this machine's ceiling). The
   sweep runs ``--sweeps`` times; per size and method the best (least) time is kept.
   Target: the hand ring reaches at least half of MPI's bus bandwidth at 64 MB.
2. ``hvd.allreduce`` of a 64 MB float32 tensor on 2 ranks (``hvd_allreduce_task.py``)
   with the Gloo and the MPI controller, as a ratio to MPI's Allreduce of item 1.
   One tensor per all-reduce, so Horovod's fusion (HOROVOD_FUSION_THRESHOLD, 64 MB by
   default) has nothing to fuse.
3. Examples/s of the reference ``train_hvd.py`` (MNIST logistic regression) on 2
   ranks of batch b and 1 rank of batch 2b, against one plain TensorFlow process
   of batch 2b (the same global batch); the runs alternate ``--rounds`` times and
   each keeps its best. Ratios to the one process.

Every ratio is between numbers of this same invocation. Prints one JSON object on
stdout; progress lines on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("LABS_OFFLINE", "1")  # benchmarks never download

from json_out import emit  # noqa: E402

from lab_utils.cluster import MPIJob  # noqa: E402 (after LABS_OFFLINE)
from lab_utils.grading import reference_script  # noqa: E402
from lab_utils.resources import usable_cores  # noqa: E402
from lab_utils.training.allreduce.runs import busbw_sweep, run_hvd, run_single  # noqa: E402

LAB = "04_allreduce"
RANKS = 2
SIZES = [2**k for k in range(10, 27, 2)]  # 1 KB ... 64 MB, powers of 4
BIG = SIZES[-1]
TARGET_RING_OVER_MPI = 0.5
HVD_TASK = Path(__file__).resolve().parent / "hvd_allreduce_task.py"
METHODS = ("mpi_s", "ring_s", "memcpy_s")


def bus_bytes(nbytes: int, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes``: reduce-scatter then
    all-gather, each N-1 chunks of nbytes/N (nccl-tests' bus bandwidth factor)."""
    return 2 * (ranks - 1) / ranks * nbytes


def gbps(nbytes: float, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 3)


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def sweep_best(ring: Path, sweeps: int, repeats: int) -> tuple[dict[int, dict], list[float]]:
    """``{nbytes: {method: least seconds over the sweeps}}`` and each sweep's wall time."""
    best: dict[int, dict] = {}
    walls = []
    for i in range(sweeps):
        t0 = time.monotonic()
        table = busbw_sweep(ring, np=RANKS, sizes=SIZES, repeats=repeats, timeout=300)
        walls.append(round(time.monotonic() - t0, 2))
        for row in table.to_dict("records"):
            cell = best.setdefault(int(row["bytes"]), {})
            for m in METHODS:
                cell[m] = min(cell.get(m, float("inf")), float(row[m]))
        last = table.iloc[-1]
        progress(
            f"[sweep {i + 1}/{sweeps}] {walls[-1]:.1f} s; 64 MB: MPI {last['mpi_s'] * 1e3:.1f} ms, "
            f"ring {last['ring_s'] * 1e3:.1f} ms, memcpy {last['memcpy_s'] * 1e3:.1f} ms"
        )
    return best, walls


def busbw_rows(best: dict[int, dict]) -> list[dict]:
    rows = []
    for nbytes, t in sorted(best.items()):
        sent = bus_bytes(nbytes, RANKS)
        rows.append(
            {
                "bytes": nbytes,
                "mpi_busbw_GBps": gbps(sent, t["mpi_s"]),
                "ring_busbw_GBps": gbps(sent, t["ring_s"]),
                "ring_over_mpi": round(t["mpi_s"] / t["ring_s"], 3),
                "memcpy_GBps": gbps(nbytes, t["memcpy_s"]),
                **{m: t[m] for m in METHODS},
            }
        )
    return rows


def hvd_allreduce(controller: str, repeats: int) -> dict:
    """Median seconds of a 64 MB ``hvd.allreduce`` on 2 ranks (rank 0's result)."""
    t0 = time.monotonic()
    with MPIJob(
        np=RANKS,
        script=HVD_TASK,
        args={"nbytes": BIG, "repeats": repeats, "warmup": 3},
        launcher="horovodrun",
        controller=controller,
        timeout=300,
        progress=False,
    ) as job:
        result = job.wait()["rank:0"]
    out = {"controller": result["controller"], "seconds": result["seconds"], "times": result["times"]}
    out["wall"] = round(time.monotonic() - t0, 2)
    return out


def train_runs(train_hvd: Path, batch: int, steps: int, rounds: int) -> dict[str, list]:
    """Each configuration ``rounds`` times, alternating (ABCD ABCD): examples/s per round."""
    common = {"steps": steps, "eval_every": 0}
    one, two = {**common, "batch_size": RANKS * batch}, {**common, "batch_size": batch}
    configs = {
        "hvd_gloo_np2": lambda: run_hvd(train_hvd, 2, args=two, controller="gloo", progress=False),
        "single": lambda: run_single(1, args=one, progress=False),
        "hvd_gloo_np1": lambda: run_hvd(train_hvd, 1, args=one, controller="gloo", progress=False),
        "hvd_mpi_np2": lambda: run_hvd(train_hvd, 2, args=two, controller="mpi", progress=False),
    }
    runs: dict[str, list] = {name: [] for name in configs}
    for r in range(rounds):
        for name, start in configs.items():
            run = start()
            runs[name].append(
                {
                    "examples_per_sec": round(run.examples_per_sec, 1),
                    "global_batch": run.batch_size,
                    "accuracy": round(run.accuracy, 4),
                    "wall": round(run.wall_time, 2),
                }
            )
            progress(
                f"[train round {r + 1}/{rounds}] {name:13s} global batch {run.batch_size}: "
                f"{run.examples_per_sec:,.0f} examples/s, acc {run.accuracy:.3f}, wall {run.wall_time:.1f} s"
            )
    return runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweeps", type=int, default=3, help="bus bandwidth sweeps (best time kept)")
    p.add_argument("--repeats", type=int, default=5, help="all-reduces per size and sweep (median)")
    p.add_argument("--hvd-repeats", type=int, default=10, help="timed 64 MB hvd.allreduce calls (median)")
    p.add_argument("--batch-size", type=int, default=60, help="per rank on 2 ranks (global: twice this)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2, help="alternations of the training runs (best kept)")
    args = p.parse_args(argv)
    low = {"sweeps": 1, "repeats": 5, "hvd_repeats": 1, "batch_size": 1, "steps": 1, "rounds": 1}
    bad = {k: getattr(args, k) for k, v in low.items() if getattr(args, k) < v}
    if bad:
        p.error(f"too small: {bad}; minimums {low}")
    t0 = time.monotonic()
    load_start = os.getloadavg()[0]
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the JSON only
        best, sweep_walls = sweep_best(reference_script(LAB, "ring.py"), args.sweeps, args.repeats)
        rows = busbw_rows(best)
        mpi_busbw = bus_bytes(BIG, RANKS) / best[BIG]["mpi_s"]
        hvd = {}
        for controller in ("gloo", "mpi"):
            res = hvd_allreduce(controller, args.hvd_repeats)
            busbw = bus_bytes(BIG, RANKS) / res["seconds"]
            hvd[controller] = {**res, "busbw_GBps": gbps(bus_bytes(BIG, RANKS), res["seconds"])}
            hvd[controller]["over_mpi_allreduce"] = round(busbw / mpi_busbw, 3)
            progress(
                f"[hvd allreduce] {controller}: {res['seconds'] * 1e3:.1f} ms = {busbw / 1e9:.2f} GB/s bus, "
                f"{busbw / mpi_busbw:.2f} x MPI Allreduce, wall {res['wall']:.1f} s"
            )
        runs = train_runs(reference_script(LAB, "train_hvd.py"), args.batch_size, args.steps, args.rounds)
    eps = {name: max(r["examples_per_sec"] for r in rs) for name, rs in runs.items()}
    ring_over_mpi = best[BIG]["mpi_s"] / best[BIG]["ring_s"]
    out = {
        "bench": "allreduce",
        "config": {
            **vars(args),
            "ranks": RANKS,
            "sizes": SIZES,
            "busbw_formula": "2 * (N - 1) / N * nbytes / seconds (bytes each rank sends per second)",
            "hvd_fusion_threshold": os.environ.get("HOROVOD_FUSION_THRESHOLD", "default (64 MB)"),
        },
        "usable_cores": usable_cores(),
        "load_avg_1m": {"start": round(load_start, 2), "end": round(os.getloadavg()[0], 2)},
        "busbw": rows,
        "ring_over_mpi": {str(r["bytes"]): r["ring_over_mpi"] for r in rows},
        "ring_over_mpi_at_64MB": round(ring_over_mpi, 3),
        "target": TARGET_RING_OVER_MPI,
        "within_target": ring_over_mpi >= TARGET_RING_OVER_MPI,
        "sweep_walls": sweep_walls,
        "hvd_allreduce_64MB": hvd,
        "training": {
            "best_examples_per_sec": eps,
            "hvd2_over_single": round(eps["hvd_gloo_np2"] / eps["single"], 3),
            "hvd1_over_single": round(eps["hvd_gloo_np1"] / eps["single"], 3),
            "hvd2_mpi_over_single": round(eps["hvd_mpi_np2"] / eps["single"], 3),
            "hvd2_mpi_over_gloo": round(eps["hvd_mpi_np2"] / eps["hvd_gloo_np2"], 3),
            "runs": runs,
        },
        "wall_total": round(time.monotonic() - t0, 1),
    }
    emit(out, None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
