"""The scaling model against this machine: measure PS and ring all-reduce at 1-4 workers,
calibrate :mod:`lab_utils.simulate`, report each point's error and the model to 1,024; JSON out.

    python bench/bench_scaling_model.py [--workers 1,2,4] [--bandwidth 100mbit] [--mb 3] [--out f.json]

Two networks, each measured with :func:`lab_utils.training.netexp.run` (both modes at every
worker count): loopback (``hosts="local"``) and emulated hosts with ``--bandwidth`` links
(needs root; without it the JSON says why and only loopback is measured).

One calibration per network: alpha and beta describe a network, so fitting one pair to
both would average a loopback copy and a 100 Mbit/s link into neither. Each fit has
``compute_s, alpha, beta, beta_duplex`` (>= 0) from that network's six rows; loopback runs
also get ``cores`` = this machine's cores (every rank shares them). Reported per point:
measured and predicted throughput and their relative error (in sample), and the error when
that point is left out of the calibration (out of sample; null where the other rows cannot
determine the terms). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from lab_utils import simulate
from lab_utils.cluster import netem
from lab_utils.training import netexp

TOLERANCE = 0.25
COLUMNS = ["mode", "workers", "step_s", "predicted_step_s", "measured_throughput", "predicted_throughput", "rel_error"]


def measure(hosts: str, workers: list[int], **kwargs) -> list[dict]:
    """Both modes at every worker count; a run that fails is tried once more (Open MPI's
    launcher fails now and then on a busy machine, before any step)."""
    rows = []
    for mode in netexp.MODES:
        for w in workers:
            try:
                row = netexp.run(mode, w, hosts=hosts, **kwargs)
            except RuntimeError as exc:
                print(f"bench_scaling_model: {mode} x{w} on {hosts} failed ({exc}); once more", file=sys.stderr)
                row = netexp.run(mode, w, hosts=hosts, **kwargs)
            print(f"bench_scaling_model: {hosts} {mode} x{w}: {row['step_s']:.3f} s/step", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def left_out_errors(rows: list[dict], **fields) -> list[float | None]:
    """Each row's relative throughput error when the model is calibrated on the others."""
    errors = []
    for i, row in enumerate(rows):
        try:
            params = simulate.calibrate(rows[:i] + rows[i + 1 :], **fields)
        except ValueError:  # the other rows cannot determine every term
            errors.append(None)
            continue
        errors.append(round(float(simulate.compare([row], params).loc[0, "rel_error"]), 4))
    return errors


def by_workers(curve) -> dict:
    """One model's predicted throughput and efficiency, keyed by worker count."""
    return {
        int(r.workers): {"throughput": round(r.throughput, 1), "efficiency": round(r.efficiency, 4)}
        for r in curve.itertuples()
    }


def network_report(name: str, rows: list[dict], bandwidth: str | None, **fields):
    """The JSON for one network (calibrated terms, every point, predictions to 1,024), and
    the comparison and predicted tables for the plot."""
    params = simulate.calibrate(rows, **fields)
    check = simulate.compare(rows, params, tolerance=TOLERANCE)
    points = json.loads(check[COLUMNS].round(4).to_json(orient="records"))
    loo = left_out_errors(rows, **fields)
    for point, error in zip(points, loo, strict=True):
        point["left_out_rel_error"] = error
    curves = simulate.predict(("ps", "ring", "tree"), simulate.WORKERS, params)
    report = {
        "network": rows[0]["network"],
        "params": dataclasses.asdict(params),
        "points": points,
        "max_rel_error": round(float(check["rel_error"].abs().max()), 4),
        "max_left_out_rel_error": max((abs(e) for e in loo if e is not None), default=None),
        "predictions": {model: by_workers(part) for model, part in curves.groupby("model")},
    }
    if bandwidth is not None:
        report["beta_over_nominal"] = round(params.beta / simulate.beta_of(bandwidth), 3)
    print(f"bench_scaling_model: {name}: {params}", file=sys.stderr, flush=True)
    return report, check.assign(network=name), curves.assign(network=name)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--bandwidth", default="100mbit")
    p.add_argument("--mb", type=float, default=3.0)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compute-s", type=float, default=1.0)
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--plot", default=None, help="also draw the model and the points to this image")
    a = p.parse_args(argv)
    workers = [int(w) for w in a.workers.split(",")]
    why_not = netem.unavailable_reason()
    networks = {"local": ("local", None, {"cores": os.cpu_count()})}
    if why_not is None:
        networks["emulated"] = (f"emulated:bandwidth={a.bandwidth}", a.bandwidth, {})
    out = {
        "cores": os.cpu_count(),
        "emulated": why_not is None,
        "why_not": why_not,
        "mb": a.mb,
        "compute_s": a.compute_s,
        "steps": a.steps,
        "tolerance": TOLERANCE,
        "networks": {},
    }
    t0 = time.monotonic()
    checks, curves = [], []
    for name, (hosts, bandwidth, fields) in networks.items():
        rows = measure(hosts, workers, mb=a.mb, steps=a.steps, compute_s=a.compute_s)
        report, check, curve = network_report(name, rows, bandwidth, **fields)
        out["networks"][name] = report
        checks.append(check)
        curves.append(curve)
    out["max_rel_error"] = max(n["max_rel_error"] for n in out["networks"].values())
    out["within_25pct"] = out["max_rel_error"] <= TOLERANCE
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import pandas as pd

        simulate.plot(pd.concat(curves), pd.concat(checks)).savefig(a.plot, dpi=110)
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
