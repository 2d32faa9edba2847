"""How long each lab's reference takes against its throughput yardstick, on this machine.

    python bench/bench_yardsticks.py --machine "pod (2 CPUs)" [--labs 01,02,03,04,05] [--rounds 3] --out F.json
    python bench/bench_yardsticks.py --publish F1.json F2.json ...   # -> lab_utils/reference_runs/yardsticks.json

The self-check students run before submitting (:mod:`lab_utils.grading.selfcheck`) times their
job against a yardstick and scales by the ratio measured here: the reference's job (the
solution, extracted from the instructor notebook) and the yardstick's, each running the self-check's job (the
hidden test's, at a fixed length), alternating, ``--rounds`` pairs, best of each. Run it once
per machine kind (``taskset -c 0`` stands in for Binder's one CPU), then
``--publish`` the files together: each lab gets one ratio per machine, and the self-check
takes their median and their spread as its margin. Progress goes to stderr; each
measurement file is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from lab_utils import data as lab_data
from lab_utils.grading import reference_script
from lab_utils.grading.selfcheck import jobs, plain_steps
from lab_utils.grading.throughput import alternate

OUT = Path(__file__).resolve().parents[1] / "lab_utils" / "reference_runs" / "yardsticks.json"

#: What each lab's hidden throughput test grades (points, bands: the test cell's) and the
#: self-check's job: its size, its common arguments, its length. A unit test checks the
#: points and bands against the hidden test cells.
LABS = {
    "01_single_node": {
        "points": 3,
        "bands": [[0.5, 1.0], [0.3, 0.5]],
        "yardstick": "520 plain SGD steps on the same graph and session",
        "job": {"batch_size": 100, "steps": 520},
    },
    "02_ps_async": {
        "points": 2,
        "bands": [[0.5, 1.0], [0.3, 0.5]],
        "yardstick": "lab_utils.training.ps.yardstick on the same cluster: Lab 2's traffic, no model",
        "job": {"epochs": 2, "eval_every": 50},
        "size": {"workers": 2},
        "args": {"batch_size": 60, "learning_rate": 0.5, "seed": 0},
        "script": "train_async.py",
    },
    "03_ps_sync": {
        "points": 2,
        "bands": [[0.5, 1.0], [0.3, 0.5]],
        "yardstick": "lab_utils.training.ps.yardstick on the same cluster: Lab 2's traffic, no model, asynchronous",
        "job": {"steps": 200, "eval_every": 0},
        "size": {"workers": 2},
        "args": {"batch_size": 60, "learning_rate": 0.5, "seed": 0},
        "script": "train_sync.py",
    },
    "04_allreduce": {
        "points": 2,
        "bands": [[0.6, 1.0], [0.35, 0.5]],
        "yardstick": "TensorFlow's MultiWorkerMirroredStrategy on the same ranks and model",
        "job": {"steps": 100},
        "size": {"ranks": 2},
        "args": {"batch_size": 60, "learning_rate": 0.25, "seed": 0},
        "script": "train_hvd.py",
    },
    "05_alexnet": {
        "points": 2,
        "bands": [[0.8, 1.0], [0.5, 0.5]],
        "yardstick": "one device with the batch of all the towers, same model",
        "tier": "logical-cpu",
        "job": {"steps": 10, "width": 0.25},
        "size": {"devices": 2},
        "args": {"learning_rate": 0.01, "seed": 0, "precision": "auto", "batch_size": 64},
        "script": "towers.py",
    },
}


def _lab1_pair(batch_size: int, steps: int):
    """Lab 1: the hidden test's reference loop (20 warm-up + 500 timed steps) against the
    yardstick, on one logistic-regression graph and session."""
    import numpy as np

    from lab_utils import models

    tf = models.import_tensorflow()
    v1 = tf.compat.v1
    data = lab_data.load_mnist()
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 784])
        y = v1.placeholder(tf.int64, [None])
        loss = models.cross_entropy(models.logistic_regression(x), y)
        train_op = v1.train.GradientDescentOptimizer(0.5).minimize(loss)
        init = v1.global_variables_initializer()
    sess = v1.Session(graph=graph)
    sess.run(init)
    g = type("G", (), {"x": x, "y": y, "train_op": train_op})

    def reference():  # the hidden test's _reference_throughput, 20 + 500 steps
        rng = np.random.default_rng(1)
        for i in range(steps):
            if i == 20:
                t0 = time.perf_counter()
            idx = rng.integers(0, len(data.x_train), batch_size)
            sess.run(train_op, {x: data.x_train[idx], y: data.y_train[idx]})
        return (steps - 20) * batch_size / (time.perf_counter() - t0)

    return reference, lambda: plain_steps(sess, g, data.x_train, data.y_train, batch_size, steps)


def measure(lab: str, rounds: int) -> dict:
    spec = LABS[lab]
    if lab == "01_single_node":
        reference, yardstick = _lab1_pair(spec["job"]["batch_size"], spec["job"]["steps"])
    else:
        script = reference_script(lab, spec["script"])
        reference, yardstick = jobs(lab, str(script), spec["size"], spec["args"], spec["job"])
    reference(), yardstick()  # warm-up pair: page cache, compiled kernels
    m = alternate(reference, yardstick, bands=spec["bands"], warmup=0, rounds=rounds, max_rounds=rounds, noise=0.1)
    # m.ratio is the yardstick's best time over the reference's; published: the reference's over the yardstick's
    return {
        "reference_s": [round(t, 6) for t in m.student],  # Lab 1's jobs take about 0.1 s: ms moved the ratio 1 %
        "yardstick_s": [round(t, 6) for t in m.other],
        "ratio": round(1 / m.ratio, 4),
        "noise": round(m.noise, 4),
    }


def publish(files: list[str]) -> dict:
    """The shipped file: every lab's points, bands, yardstick and job, and one ratio per machine."""
    out = {
        "label": "reference time over yardstick time, per lab and machine",
        "made_with": "bench/bench_yardsticks.py",
        "machine": [],
        "labs": {
            lab: {k: spec[k] for k in ("points", "bands", "yardstick", "tier", "job") if k in spec} | {"ratios": {}}
            for lab, spec in LABS.items()
        },
    }
    for f in files:
        run = json.loads(Path(f).read_text())
        out["machine"].append(run["machine"])
        for lab, m in run["labs"].items():
            out["labs"][lab]["ratios"][run["machine"]] = m["ratio"]
            out["labs"][lab].setdefault("measured", {})[run["machine"]] = {
                k: m[k] for k in ("reference_s", "yardstick_s", "noise")
            }
    missing = [lab for lab, spec in out["labs"].items() if not spec["ratios"]]
    if missing:
        raise SystemExit(f"no measurement of {', '.join(missing)} in {', '.join(files)}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--machine", help="what this machine is, e.g. 'pod (2 CPUs)'")
    p.add_argument("--labs", default=",".join(LABS), help="comma-separated lab names (default: all)")
    p.add_argument("--rounds", type=int, default=3, help="alternating pairs per lab (default 3)")
    p.add_argument("--out", help="the measurement file to write")
    p.add_argument("--publish", nargs="+", metavar="F.json", help=f"merge measurement files into {OUT.name}")
    p.add_argument("--to", default=str(OUT), help="where --publish writes (default: the shipped file)")
    a = p.parse_args(argv)
    if a.publish:
        Path(a.to).write_text(json.dumps(publish(a.publish), indent=1) + "\n")
        print(f"wrote {a.to}", file=sys.stderr)
        return 0
    if not a.machine or not a.out:
        p.error("--machine and --out are required to measure")
    labs = []
    for name in (s.strip() for s in a.labs.split(",") if s.strip()):
        found = [lab for lab in LABS if lab.startswith(name)]
        if len(found) != 1:
            p.error(f"--labs {name!r}: expected one of {', '.join(LABS)} (or its number)")
        labs += found
    result = {"machine": a.machine, "cpus": len(os.sched_getaffinity(0)), "rounds": a.rounds, "labs": {}}
    for lab in labs:
        t0 = time.monotonic()
        result["labs"][lab] = measure(lab, a.rounds)
        print(
            f"{lab}: ratio {result['labs'][lab]['ratio']} ({time.monotonic() - t0:.0f} s)", file=sys.stderr, flush=True
        )
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")  # what is done so far is kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
