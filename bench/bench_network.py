"""The network matters: PS against ring all-reduce on emulated links, one run; JSON out.

    python bench/bench_network.py [--workers 1,2,4] [--bandwidth 100mbit,1gbit] [--mb 3] [--out f.json]

For each bandwidth, :func:`lab_utils.training.netexp.experiment` runs both modes at every
worker count on emulated hosts (one network namespace per rank, each link shaped with
``tc``; needs root, else every run is local and the JSON says ``emulated: false``).
Reports per run: throughput, the slowest worker's step time, the speedup over the
mode's own one-worker run, and the PS host's and a worker's bytes per step (link
counters); then, per bandwidth, the figures the thesis compares: speedup at the most
workers for each mode, and how the PS's traffic grows with the workers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from lab_utils.cluster import netem
from lab_utils.training import netexp


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--bandwidth", default="100mbit,1gbit")
    p.add_argument("--mb", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--compute-s", type=float, default=1.0)
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    workers = [int(w) for w in a.workers.split(",")]
    out = {
        "emulated": netem.unavailable_reason() is None,
        "why_not": netem.unavailable_reason(),
        "mb": a.mb,
        "compute_s": a.compute_s,
        "steps": a.steps,
        "bandwidths": {},
    }
    for bw in a.bandwidth.split(","):
        t0 = time.monotonic()
        print(f"bench_network: {bw} ...", file=sys.stderr, flush=True)
        table = netexp.experiment(
            workers, hosts=f"emulated:bandwidth={bw}", mb=a.mb, steps=a.steps, compute_s=a.compute_s
        )
        most = max(workers)
        at = table[table["workers"] == most].set_index("mode")
        ps = table[table["mode"] == "ps"].set_index("workers")
        summary = {f"speedup_{mode}_{most}_workers": round(float(at.loc[mode, "speedup"]), 2) for mode in at.index}
        if {"ps", "allreduce"} <= set(at.index):  # the speed contrast the tests leave to this bench
            summary["ring_over_ps"] = round(float(at.loc["allreduce", "speedup"] / at.loc["ps", "speedup"]), 3)
        if out["emulated"]:
            summary["ps_mb_per_step"] = {int(w): round(float(v), 2) for w, v in ps["ps_mb_per_step"].items()}
        out["bandwidths"][bw] = {
            "runs": json.loads(table.round(4).to_json(orient="records")),
            "summary": summary,
            "wall_s": round(time.monotonic() - t0, 1),
        }
        print(f"bench_network: {bw}: {summary}", file=sys.stderr, flush=True)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
