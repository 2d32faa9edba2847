"""The network matters: PS against ring all-reduce on emulated links, one run; JSON out.

    python bench/bench_network.py [--workers 1,2,4] [--bandwidth 100mbit,1gbit] [--mb 3] [--out f.json]
    python bench/bench_network.py --models AlexNet,ResNet50,VGG16 --workers 1,4 --bandwidth 100mbit

For each bandwidth, :func:`lab_utils.training.netexp.experiment` runs both modes at every
worker count on emulated hosts (one network namespace per rank, each link shaped with
``tc``; needs root, else every run is local and the JSON says ``emulated: false``).
Reports per run: throughput, the slowest worker's step time, the speedup over the
mode's own one-worker run, and the PS host's and a worker's bytes per step (link
counters); then, per bandwidth, the figures the thesis compares: speedup at the most
workers for each mode, and how the PS's traffic grows with the workers.

With ``--models``, each of the thesis's models' steps instead (:func:`netexp.models`: its
gradient bytes and computation on the reference GPU and links, scaled to the emulated
links by ``--scale``): the runs, and per model the speedups at the most workers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import pandas as pd
from json_out import emit

from lab_utils.cluster import netem
from lab_utils.training import netexp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--bandwidth", default="100mbit,1gbit")
    p.add_argument("--mb", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compute-s", type=float, default=1.0)
    p.add_argument("--models", default=None, help="e.g. AlexNet,ResNet50,VGG16 (netexp.MODELS)")
    p.add_argument("--scale", type=float, default=1.0, help="with --models: both times of each step times this")
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    workers = [int(w) for w in a.workers.split(",")]
    out = {"emulated": netem.unavailable_reason() is None, "why_not": netem.unavailable_reason(), "steps": a.steps}
    if a.models:
        out.update(models=a.models.split(","), tflops=netexp.REFERENCE_TFLOPS, reference_link=netexp.REFERENCE_LINK)
        out.update(scale=a.scale)
    else:
        out.update(mb=a.mb, compute_s=a.compute_s)
    out["bandwidths"] = {}
    for bw in a.bandwidth.split(","):
        t0 = time.monotonic()
        print(f"bench_network: {bw} ...", file=sys.stderr, flush=True)
        result = _models(out["models"], workers, bw, a) if a.models else _synthetic(workers, bw, a, out["emulated"])
        out["bandwidths"][bw] = {**result, "wall_s": round(time.monotonic() - t0, 1)}
        print(f"bench_network: {bw}: {result['summary']}", file=sys.stderr, flush=True)
    emit(out, a.out)
    return 0


def _synthetic(workers: list[int], bw: str, a, emulated: bool) -> dict:
    """The made-up step (``--mb`` after ``--compute-s``): runs, speedups at the most workers,
    the ring's over the PS's, and the PS's traffic by workers."""
    table = netexp.experiment(workers, hosts=f"emulated:bandwidth={bw}", mb=a.mb, steps=a.steps, compute_s=a.compute_s)
    most = max(workers)
    at = table[table["workers"] == most].set_index("mode")
    ps = table[table["mode"] == "ps"].set_index("workers")
    summary = {f"speedup_{mode}_{most}_workers": round(float(at.loc[mode, "speedup"]), 2) for mode in at.index}
    if {"ps", "allreduce"} <= set(at.index):  # the speed contrast the tests leave to this bench
        summary["ring_over_ps"] = round(float(at.loc["allreduce", "speedup"] / at.loc["ps", "speedup"]), 3)
    if emulated:
        summary["ps_mb_per_step"] = {int(w): round(float(v), 2) for w, v in ps["ps_mb_per_step"].items()}
    return {"runs": json.loads(table.round(4).to_json(orient="records")), "summary": summary}


def _models(names: list[str], workers: list[int], bw: str, a) -> dict:
    """The thesis's models' steps (:func:`netexp.models`): runs, and per model its row."""
    table = netexp.models(names, workers, hosts=f"emulated:bandwidth={bw}", scale=a.scale, steps=a.steps)
    return {
        "runs": json.loads(pd.DataFrame(table.attrs["runs"]).round(4).to_json(orient="records")),
        "summary": json.loads(table.round(3).to_json(orient="index")),
    }


if __name__ == "__main__":
    sys.exit(main())
