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
determine the terms).

A third calibration (``--labs``, on by default) uses the labs' own training runs: Lab 3's
synchronous PS and Lab 4's Horovod all-reduce (the instructor's reference scripts, the
runs of Lab 4's Part D) at the same worker counts on loopback: logistic regression on
MNIST, 31,400 bytes of gradients. There is no modelled accelerator: every step is CPU
work on the shared cores, so the fit is ``cpu_s, alpha, beta`` with ``cores`` = this
machine's cores. It is reported under ``labs`` with what it shows (:data:`LABS_NOTE`),
outside ``within_25pct``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from json_out import emit

from lab_utils import simulate
from lab_utils.cluster import netem
from lab_utils.grading import reference_script
from lab_utils.training import netexp
from lab_utils.training.allreduce import runs as allreduce_runs
from lab_utils.training.ps import runs as ps_runs

TOLERANCE = 0.25
COLUMNS = ["mode", "workers", "step_s", "predicted_step_s", "measured_throughput", "predicted_throughput", "rel_error"]


def measure(hosts: str, workers: list[int], **kwargs) -> list[dict]:
    """Both modes at every worker count; a run that fails is tried once more (Open MPI's
    launcher fails now and then on a busy machine, before any step)."""
    rows = []
    for mode in netexp.MODES:
        for w in workers:
            try:
                row = netexp.run_netexp(mode, w, hosts=hosts, **kwargs).row
            except RuntimeError as exc:
                print(f"bench_scaling_model: {mode} x{w} on {hosts} failed ({exc}); once more", file=sys.stderr)
                row = netexp.run_netexp(mode, w, hosts=hosts, **kwargs).row
            print(f"bench_scaling_model: {hosts} {mode} x{w}: {row['step_s']:.3f} s/step", file=sys.stderr, flush=True)
            rows.append(row)
    return rows


#: Lab 4's logistic regression: 784 x 10 weights and 10 biases, float32.
LAB_GRAD_BYTES = (784 * 10 + 10) * 4
#: What the labs' runs are fitted with: all their work is on the shared cores.
LAB_FIT = ("cpu_s", "alpha", "beta")
#: Why the labs' Horovod points are not in ``within_25pct`` (measured on this machine, 2 cores:
#: np=2 runs 1.8 / 2.5 / 5.3 ms per step with HOROVOD_CYCLE_TIME 0.1 / default / 5 ms).
LABS_NOTE = (
    "Horovod's background thread negotiates and runs the step's collectives once per cycle "
    "(HOROVOD_CYCLE_TIME), a fixed wait per step that the alpha-beta ring has no term for; with "
    "31 KB of gradients it is most of a 2-rank step. The PS points fit; the Horovod points at 2 ranks "
    "do not. Reported, not counted in within_25pct."
)


def measure_labs(workers: list[int], *, steps: int, batch_size: int = 60, learning_rate: float = 0.25) -> list[dict]:
    """Lab 3's sync PS and Lab 4's Horovod (reference scripts) at every worker count, on
    loopback, as netexp-shaped rows (``mode``, ``workers``, ``step_s``, ``examples_per_s``,
    ``grad_bytes``). Horovod scales the learning rate by the ranks itself; the PS gets it
    scaled, as in Lab 4's Part D."""
    common = {"batch_size": batch_size, "seed": 0, "steps": steps}
    hvd_script = reference_script("04_allreduce", "train_hvd.py")
    sync_script = reference_script("03_ps_sync", "train_sync.py")
    rows = []
    for mode in netexp.MODES:
        for w in workers:
            if mode == "ps":
                args = {**common, "learning_rate": learning_rate * w, "eval_every": 0}
                run = ps_runs.run_ps(sync_script, workers=w, args=args, monitor=False, progress=False)
            else:
                run = allreduce_runs.run_hvd(
                    hvd_script, w, args={**common, "learning_rate": learning_rate}, progress=False
                )
            eps = float(run.examples_per_sec)
            row = {
                "mode": mode,
                "workers": w,
                "network": "loopback, labs' training",
                "examples_per_s": eps,
                "step_s": w * batch_size / eps,
                "grad_bytes": LAB_GRAD_BYTES,
            }
            print(
                f"bench_scaling_model: labs {mode} x{w}: {row['step_s'] * 1e3:.1f} ms/step", file=sys.stderr, flush=True
            )
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
    p.add_argument(
        "--labs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also calibrate on Lab 3's sync PS and Lab 4's Horovod training runs (loopback)",
    )
    p.add_argument("--lab-steps", type=int, default=200, help="steps of each lab training run")
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
    if a.labs:
        rows = measure_labs(workers, steps=a.lab_steps)
        report, check, curve = network_report("labs", rows, None, fit=LAB_FIT, compute_s=0.0, cores=os.cpu_count())
        report["note"] = LABS_NOTE
        out["labs"] = report
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
    emit(out, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
