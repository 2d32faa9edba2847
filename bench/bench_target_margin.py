"""How far an honest run lands above the accuracy target its test checks: the spread over seeds,
and the margin. JSON out.

    python bench/bench_target_margin.py --lab 02 --params ci [--seeds 10] [--busy 2] [--out margin.json]
    python bench/bench_target_margin.py --lab 02 --params full --stand-ins --cpus 1 --busy 2   # Binder, offline

Runs the instructor's training script of Lab 2, 3 or 4 (``grading/reference/<lab>/``: ``make
release`` writes it) the way the notebook's main runs do, once per seed and cluster size, at the CI
parameters (``ci``: the offline MNIST sample, ``labs/params.yml``), the notebook's defaults
(``full``: full-size data; ``--stand-ins`` where MNIST cannot be downloaded) or the grading sizes
(``grading``), optionally beside ``--busy`` busy loops (a loaded machine) and on ``--cpus`` CPUs.
For each cluster size it reports, for the last evaluation and for the settled accuracy the tests
check (Lab 2's :attr:`lab_utils.training.ps.runs.PSRun.settled_accuracy`, the mean of the last
three evaluations; Labs 3 and 4, synchronous, check the last), the accuracies, their mean and
standard deviation, the target (:func:`lab_utils.data.target_accuracy`, less Lab 2's 0.05), the margin in standard
deviations, the chance a run misses the target if accuracies spread normally, and the highest
target an honest run would miss fewer than 1 time in 1,000 (mean − 3.09 sd). ``grading/README.md``
keeps the measured margins; no test asserts them.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from json_out import emit

from lab_utils import data, standins
from lab_utils.training.allreduce import runs as allreduce_runs
from lab_utils.training.ps import runs as ps_runs

ROOT = Path(__file__).resolve().parents[1]
STAND_INS = ROOT / "out" / "stand-ins"
#: One configuration per lab and parameter set: the script, the cluster sizes and its arguments,
#: as the notebook's main runs pass them (labs/params.yml's ci, the notebook's defaults, GRADING_SIZES)
CONFIGS = {
    ("02", "ci"): ("02_ps_async/train_async.py", [1, 2], {"epochs": 2, "eval_every": 20}, "offline"),
    ("02", "full"): ("02_ps_async/train_async.py", [1, 2, 4], {"epochs": 3, "eval_every": 50}, "full"),
    ("02", "grading"): ("02_ps_async/train_async.py", [1, 2], {"epochs": 2, "eval_every": 50}, "full"),
    # Lab 3's sync run: EPOCHS x steps per epoch global steps (the CS 744 rule), computed below
    ("03", "ci"): ("03_ps_sync/train_sync.py", [2], {"epochs": 2, "eval_every": 20}, "offline"),
    ("03", "full"): ("03_ps_sync/train_sync.py", [2], {"epochs": 3, "eval_every": 50}, "full"),
    ("03", "grading"): ("03_ps_sync/train_sync.py", [2], {"epochs": 2, "eval_every": 50}, "full"),
    # Lab 4's Part B: NP ranks with Horovod's Gloo controller (the MPI one trains the same weights)
    ("04", "ci"): ("04_allreduce/train_hvd.py", [2], {"steps": 100}, "offline"),
    ("04", "full"): ("04_allreduce/train_hvd.py", [2], {"steps": 300}, "full"),
    ("04", "grading"): ("04_allreduce/train_hvd.py", [2], {"steps": 300}, "full"),  # STEPS is not cut when graded
}
#: What every configuration of a lab shares with its notebook's runs
COMMON = {
    "02": {"batch_size": 60, "learning_rate": 0.5},
    "03": {"batch_size": 60, "learning_rate": 0.5},
    "04": {"batch_size": 60, "learning_rate": 0.25},  # one rank's: Horovod scales it by the ranks
}
#: What a lab's test takes off the data's target (Lab 2: RUN_TARGET, for asynchronous runs)
TARGET_SLACK = {"02": 0.05}
#: mean − Z_1000 sd is missed by one honest run in 1,000 when accuracies spread normally
Z_1000 = 3.09


def _miss_chance(mean: float, sd: float, target: float) -> float:
    if sd <= 0:
        return 0.0 if mean >= target else 1.0
    return 0.5 * math.erfc((mean - target) / (sd * math.sqrt(2)))


def summary(accuracies: list[float], target: float) -> dict:
    """Mean, sd, margin (in sd), the chance of a miss and the 1-in-1,000 target of ``accuracies``."""
    mean = statistics.fmean(accuracies)
    sd = statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0
    return {
        "accuracies": [round(a, 4) for a in accuracies],
        "mean": round(mean, 4),
        "sd": round(sd, 4),
        "min": round(min(accuracies), 4),
        "target": target,
        "margin_sd": None if sd == 0 else round((mean - target) / sd, 2),
        "miss_chance": _miss_chance(mean, sd, target),
        "target_missed_1_in_1000": round(mean - Z_1000 * sd, 4),
        "missed": sum(a < target for a in accuracies),
    }


class BusyLoops:
    """``n`` processes spinning on the CPU while the runs go (a loaded machine); ended on exit."""

    def __init__(self, n: int):
        self.n, self.procs = n, []

    def __enter__(self) -> BusyLoops:
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(self.n)]
        return self

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait(timeout=30)


def table(results: list[dict]) -> str:
    """A markdown table of measured margins (this bench's JSON outputs), a row per cluster size:
    what ``grading/README.md`` shows."""
    rows = [
        "| lab | parameters | data | CPUs | busy loops | workers | last evaluation: mean ± sd (min) | tested: mean ± sd (min) "
        "| target | margin (sd) | missed | target missed 1 in 1,000 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for n, size in r["sizes"].items():
            last, tested = size["last_evaluation"], size["tested"]
            margin = "∞" if tested["margin_sd"] is None else f"{tested['margin_sd']:.1f}"
            rows.append(
                f"| {r['lab']} | {r['params']} | {r['data']} | {r['cpus']} | {r['busy_loops']} | {n} "
                f"| {last['mean']:.3f} ± {last['sd']:.3f} ({last['min']:.3f}) "
                f"| {tested['mean']:.3f} ± {tested['sd']:.3f} ({tested['min']:.3f}) | {tested['target']:.2f} "
                f"| {margin} "
                f"| {tested['missed']} of {len(tested['accuracies'])} | {tested['target_missed_1_in_1000']:.3f} |"
            )
    return "\n".join(rows)


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--table"]:  # bench_target_margin.py --table a.json b.json ... (or grading/target_margins.json)
        loaded = [json.loads(Path(f).read_text()) for f in argv[1:]]
        print(table([run for d in loaded for run in d.get("runs", [d])]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", required=True, choices=sorted({lab for lab, _ in CONFIGS}))
    parser.add_argument("--params", default="ci", choices=["ci", "full", "grading"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the runs")
    parser.add_argument("--workers", help="comma-separated cluster sizes (default: the notebook's)")
    parser.add_argument("--set", action="append", default=[], metavar="ARG=VALUE", help="a script argument to change")
    parser.add_argument(
        "--stand-ins", action="store_true", help="full-size data offline: the MNIST stand-ins in LABS_DATA_DIR"
    )
    parser.add_argument("--cpus", type=int, help="run on this many CPUs (taskset): 1 is Binder's tier")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    try:
        script, sizes, run_args, source = CONFIGS[(args.lab, args.params)]
    except KeyError:
        parser.error(f"no configuration for lab {args.lab} at {args.params}")
    script_path = ROOT / "grading" / "reference" / script
    if not script_path.is_file():
        print(f"bench_target_margin: {script_path} is missing: run `make release` first", file=sys.stderr)
        return 2
    if source == "offline":
        os.environ["LABS_OFFLINE"] = "1"
    elif args.stand_ins:  # written once, kept in out/ (as bench_lab_memory.py does)
        if not standins.is_stand_in(STAND_INS):
            standins.write(STAND_INS)
        os.environ["LABS_DATA_DIR"] = str(STAND_INS)
    if args.cpus:  # every task, and the busy loops, inherit the affinity
        os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[: args.cpus]))
    sizes = [int(n) for n in args.workers.split(",")] if args.workers else sizes
    dataset = data.load_mnist(offline=source == "offline" or None, verbose=False)
    target = round(data.target_accuracy(dataset) - TARGET_SLACK.get(args.lab, 0.0), 2)
    run_args = {**COMMON[args.lab], **run_args}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set takes ARG=VALUE, got {item!r}")
        run_args[key] = float(value) if "." in value else int(value)
    if script.endswith("train_sync.py"):  # the sync run counts global steps, not epochs
        epochs = run_args.pop("epochs")
        run_args["steps"] = epochs * math.ceil(len(dataset.x_train) / run_args["batch_size"])
    out = {
        "lab": args.lab,
        "params": args.params,
        "data": "stand-ins" if standins.is_stand_in(os.environ.get("LABS_DATA_DIR")) else dataset.source,
        "busy_loops": args.busy,
        "cpus": len(os.sched_getaffinity(0)),
        "args": run_args,
        "sizes": {},
    }
    t0 = time.monotonic()
    with BusyLoops(args.busy):
        for n in sizes:
            accuracies, settled = [], []
            for seed in range(args.seeds):
                if args.lab == "04":
                    run = allreduce_runs.run_hvd(
                        str(script_path), n, args={**run_args, "seed": seed}, monitor=False, progress=False
                    )
                else:
                    run = ps_runs.run_ps(
                        str(script_path), workers=n, args={**run_args, "seed": seed}, monitor=False, progress=False
                    )
                # Lab 2's test checks the mean of the last three evaluations (what an asynchronous run
                # converged to); Labs 3 and 4 (synchronous) check the last
                settled.append(run.settled_accuracy if args.lab == "02" else run.accuracy)
                accuracies.append(run.accuracy)
                print(
                    f"lab {args.lab} {args.params}, {n} worker(s), seed {seed}: accuracy {run.accuracy:.4f}", flush=True
                )
            out["sizes"][str(n)] = {"last_evaluation": summary(accuracies, target), "tested": summary(settled, target)}
    out["wall_s"] = round(time.monotonic() - t0, 1)
    emit(out, args.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
