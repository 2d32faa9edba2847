"""What recording the timeline costs a step (issue 33; target: under 2 % of step time).

Two measures, in one run:

- **direct**: the task-side cost of one step's recording, timed in this process (a step's
  spans, ``report.span`` / ``report.add_span``, and the larger step event they ride on) and,
  for the PS worker, its in-graph stamps timed in a local session of Lab 2's model, against
  the step times of the real runs below. Precise: what the recording adds to every step,
  whatever the noise of a 2-core machine.
- **A/B**: real runs with recording on and off (``LABS_TRACE=0``), alternated ``--rounds``
  times: the PS worker's in-graph timestamps (Labs 2-3) and the step loop (Lab 4's Horovod).
  ``horovod-timeline`` measures Horovod's own timeline the same way (``run_hvd(timeline=True)``,
  merged into the trace where it exists): it is not on by default, because it costs far more
  than 2 % (its background thread records every tensor's every phase). Each run's step time is its tasks' ``train_time / local_steps``; the overhead is
  the ratio of the medians, minus one. On 2 shared cores two runs differ by a few per cent by
  themselves: the spread is printed with it.

    python bench/bench_timeline.py [--rounds 5] [--steps 200] [--kinds ps-sync,ps-async,horovod]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lab_utils import report

KINDS = ("ps-sync", "ps-async", "horovod", "horovod-timeline")
#: what "traced" switches on: lab_utils' recording (LABS_TRACE), or Horovod's own timeline
#: (HOROVOD_TIMELINE, run_hvd(timeline=True)), which is not on unless asked for
RECORDS = {"ps-sync": "lab_utils", "ps-async": "lab_utils", "horovod": "lab_utils", "horovod-timeline": "horovod"}
TARGET = 0.02


def direct_seconds_per_step(spans: int = 4, n: int = 20000) -> dict:
    """Seconds one step's recording costs: ``spans`` spans and the step event with them,
    less the same step event without (the event is written either way). ``dependencies``:
    the same with what issue 55 added to a step, the last span a wait ``on`` the task it
    waited for and the check of ``LABS_STRAGGLER`` (this task not named)."""
    with tempfile.TemporaryDirectory() as folder:
        os.environ["LABS_REPORT_FILE"] = str(Path(folder) / "events.jsonl")
        try:
            report._tracing = True
            per = {}
            for kind in ("plain", "dependencies"):
                t = time.perf_counter()
                for i in range(n):
                    now = time.time()
                    if kind == "dependencies" and hasattr(report, "straggle"):
                        report.straggle()
                    for _ in range(spans - 1):
                        with report.span("compute", "compute"):
                            pass
                    if kind == "dependencies":
                        report.add_span("push + token wait", "wait", now, now, on=["worker:1"])
                    else:
                        report.add_span("push", "comm", now, now)
                    report.step(i, i, started=now, local_step=i, loss=0.5)
                per[kind] = (time.perf_counter() - t) / n
            traced = per["plain"]
            report._tracing = False
            t = time.perf_counter()
            for i in range(n):
                report.step(i, i, local_step=i, loss=0.5)
            bare = (time.perf_counter() - t) / n
        finally:
            report._tracing = None
            del os.environ["LABS_REPORT_FILE"]
    return {"spans_per_step": spans, "seconds_per_step": per["dependencies"] - bare, "event_seconds": bare,
            "without_dependencies_seconds_per_step": traced - bare}  # fmt: skip


def graph_seconds_per_step(n: int = 3000, batch: int = 50) -> dict:
    """Seconds the PS worker's in-graph stamps add to a step (:class:`lab_utils.training.ps.graph.StepStamps`:
    an identity per parameter, two ``tf.timestamp`` ops, the loss packed with them), on Lab 2's
    model in one local session: the same ops the worker's executor runs, without the cluster's
    noise. Plain and stamped steps alternate in blocks of 100."""
    import numpy as np
    import tensorflow as tf

    v1 = tf.compat.v1
    v1.disable_eager_execution()
    graph = tf.Graph()
    with graph.as_default():
        x, y = v1.placeholder(tf.float32, [None, 784]), v1.placeholder(tf.int64, [None])
        w, b = v1.get_variable("W", [784, 10]), v1.get_variable("b", [10])
        loss = v1.losses.sparse_softmax_cross_entropy(y, tf.matmul(x, w) + b)
        opt = v1.train.GradientDescentOptimizer(0.1)
        grads = opt.compute_gradients(loss, [w, b])
        train = opt.apply_gradients(grads)
        with tf.control_dependencies([tf.identity(w.value()), tf.identity(b.value())]):
            pulled = tf.timestamp()
        with tf.control_dependencies([g for g, _ in grads]):
            computed = tf.timestamp()
        packed = tf.stack([tf.cast(loss, tf.float64), pulled, computed])
        sess = v1.Session(
            graph=graph, config=v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        )
        sess.run(v1.global_variables_initializer())
    rng = np.random.default_rng(0)
    feed = {x: rng.random((batch, 784), dtype=np.float32), y: rng.integers(0, 10, batch)}
    plain, stamped = [train, loss], [train, packed]
    for fetches in (plain, stamped):
        sess.run(fetches, feed)  # warm up both
    times = {"plain": 0.0, "stamped": 0.0}
    for i in range(n // 100):
        for name, fetches in (
            (("plain", plain), ("stamped", stamped)) if i % 2 else (("stamped", stamped), ("plain", plain))
        ):
            t = time.perf_counter()
            for _ in range(100):
                sess.run(fetches, feed)
            times[name] += time.perf_counter() - t
    sess.close()
    per = {k: v / (n // 100 * 100) for k, v in times.items()}
    return {"seconds_per_step": per["stamped"] - per["plain"], "local_step_seconds": per["plain"]}


def one_run(kind: str, steps: int, traced: bool) -> float:
    """Mean step seconds of one run of ``kind`` (its workers' or ranks' mean)."""
    from lab_utils.grading import reference_script

    os.environ["LABS_TRACE"] = "1" if traced or kind == "horovod-timeline" else "0"
    try:
        if kind.startswith("ps-"):
            from lab_utils.training.ps import runs as ps_runs

            lab, script = ("03_ps_sync", "train_sync.py") if kind == "ps-sync" else ("02_ps_async", "train_async.py")
            run = ps_runs.run_ps(
                reference_script(lab, script),
                workers=2,
                monitor=False,
                progress=False,
                args={"steps": steps, "batch_size": 50, "eval_every": 0},
            )
        else:
            from lab_utils.training.allreduce import runs as allreduce_runs

            run = allreduce_runs.run_hvd(
                reference_script("04_allreduce", "train_hvd.py"),
                2,
                args={"steps": steps, "batch_size": 50},
                controller="gloo",
                timeline=traced and kind == "horovod-timeline",
                progress=False,
            )
    finally:
        del os.environ["LABS_TRACE"]
    return statistics.mean(r["train_time"] / r["local_steps"] for r in run.results.values() if r.get("local_steps"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--kinds", default=",".join(KINDS))
    a = parser.parse_args(argv)
    kinds = [k for k in a.kinds.split(",") if k]
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        parser.error(f"unknown kinds {bad}; known: {', '.join(KINDS)}")
    direct = direct_seconds_per_step()
    graph = graph_seconds_per_step()
    out = {"target": TARGET, "direct": direct, "ps_graph": graph, "runs": {}}
    for kind in kinds:
        on, off = [], []
        for i in range(a.rounds):  # alternated, the order swapped each round
            for traced in (True, False) if i % 2 == 0 else (False, True):
                (on if traced else off).append(one_run(kind, a.steps, traced))
                print(
                    f"{kind} round {i + 1} traced={traced}: {(on if traced else off)[-1] * 1e3:.3f} ms/step",
                    file=sys.stderr,
                )
        step = statistics.median(off)
        cost = direct["seconds_per_step"] + (graph["seconds_per_step"] if kind.startswith("ps-") else 0.0)
        out["runs"][kind] = {
            "recording": RECORDS[kind],
            "steps": a.steps,
            "ms_per_step_traced": [round(x * 1e3, 4) for x in on],
            "ms_per_step_untraced": [round(x * 1e3, 4) for x in off],
            "ab_overhead": statistics.median(on) / step - 1,
            "untraced_spread": (max(off) - min(off)) / step,
            **(
                {  # the recording's measured cost per step over this step time
                    "direct_overhead": cost / step,
                    "under_target": cost / step < TARGET,
                }
                if RECORDS[kind] == "lab_utils"
                else {}
            ),
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
