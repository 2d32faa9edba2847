"""The throughput self-check: before submitting, a student's job against a yardstick.

A hidden throughput test (:func:`lab_utils.grading.throughput.compare`) times the student's
job against the reference solution's, the same job, and gives credit by bands of the ratio.
The reference is not shipped. A **yardstick** is: a job of the same shape that is not a
solution, run with the same launcher, processes and data:

- Lab 1: the same graph and session, 520 plain ``sess.run(train_op)`` steps (no timing code);
- Labs 2-3: :mod:`lab_utils.training.ps.yardstick`, Lab 2's parameter-server traffic and
  arithmetic with no model;
- Lab 4: TensorFlow's ``MultiWorkerMirroredStrategy`` on the same ranks and model;
- Lab 5: one device, with the batch of all the towers.

How long the reference takes against its yardstick is measured on the course's machines by
``bench/bench_yardsticks.py`` (alternating runs, best of each) and shipped in
``lab_utils/reference_runs/yardsticks.json``, one ratio per machine. Here the student's job is
timed against the yardstick, alternating, and::

    estimate = (yardstick's time / student's time) x (reference's time / yardstick's time)

is placed in the grader's bands. Its margin is the timing noise plus how far the published
ratio moved between machines. Near a band edge the check says it cannot call it. It is an
estimate: the grade is the grader's own measurement. While grading it does nothing.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from lab_utils.grading.cells import is_grading, ratio_credit
from lab_utils.grading.throughput import alternate, band_of

__all__ = ["YARDSTICKS", "SelfCheck", "published", "scale_of", "jobs", "self_check", "describe", "plain_steps"]

#: the reference run (lab_utils.reference_runs) holding every lab's yardstick ratios
YARDSTICKS = "yardsticks"
#: the smallest margin an estimate is given: machines differ in more ways than two measured
MIN_SPREAD = 0.10


def published(lab: str) -> dict:
    """What ``yardsticks.json`` says for ``lab``: ``points``, ``bands``, ``yardstick`` (what it
    is), ``job`` (what both run), ``ratios`` ({machine: reference's time / yardstick's})."""
    from lab_utils import reference_runs

    labs = reference_runs.load(YARDSTICKS)["labs"]
    if lab not in labs:
        raise ValueError(f"no yardstick is published for {lab!r}; known: {', '.join(sorted(labs))}")
    return labs[lab]


@dataclass
class SelfCheck:
    """One self-check: the times, the estimate of the graded ratio, and what it means."""

    lab: str
    student_s: list
    yardstick_s: list
    scale: float  # the reference's time over the yardstick's, published
    estimate: float  # the reference's time over the student's, estimated (the graded ratio)
    margin: float  # relative: timing noise and the published ratio's spread
    band: int | None  # 0 = the best band; None: too close to an edge to call
    credit: float | None  # points expected; None: too close to call
    points: float
    complete: bool = True  # every student run did the whole job


def scale_of(ratios: dict) -> tuple[float, float]:
    """The published ratio (the median over machines) and its relative spread between
    machines (at least :data:`MIN_SPREAD`)."""
    values = sorted(float(v) for v in ratios.values())
    scale = statistics.median(values)
    return scale, max([abs(v / scale - 1) for v in values] + [MIN_SPREAD])


def jobs(lab: str, student, size: dict, args: dict | None = None, job: dict | None = None):
    """``(student_job, yardstick_job)``: the two callables a self-check (and the bench that
    publishes the ratios, with the reference as ``student``) times for ``lab``. ``student``:
    the student's file (``train_async.py``, ``train_sync.py``, ``train_hvd.py``, ``towers.py``);
    ``size``: ``workers`` (Labs 2-3), ``ranks`` (Lab 4) or ``devices`` (Lab 5); ``args``: the
    lab's common arguments, to which the published job's (its length; ``job`` instead) are added."""
    job = published(lab)["job"] if job is None else job
    args = {k: v for k, v in dict(args or {}).items() if not ("steps" in job and k == "epochs")}
    args.update(job)
    if lab in ("02_ps_async", "03_ps_sync"):
        from lab_utils.training.ps import runs as ps_runs

        def ps_job(script):
            return lambda: ps_runs.run_ps(script, workers=size["workers"], args=args, monitor=False, progress=False)

        return ps_job(student), ps_job("-m lab_utils.training.ps.yardstick")
    if lab == "04_allreduce":
        from lab_utils.training.allreduce import runs as allreduce_runs

        return (
            lambda: allreduce_runs.run_hvd(student, size["ranks"], args=args, progress=False),
            lambda: allreduce_runs.run_mwms(size["ranks"], args=args, progress=False),
        )
    if lab == "05_alexnet":
        from lab_utils.training.towers import runs as towers_runs

        d = size["devices"]
        one = {**args, "batch_size": args["batch_size"] * d}
        return (
            lambda: towers_runs.run_devices("towers", d, student=student, args=args, monitor=False),
            lambda: towers_runs.run_devices("single", 1, args=one, monitor=False),
        )
    raise ValueError(f"no yardstick jobs for {lab!r} (Lab 1 times its own functions in the notebook)")


def self_check(
    student, yardstick, *, lab: str, valid=None, rounds: int = 2, max_rounds: int | None = None, tier: str | None = None
) -> SelfCheck | None:
    """Time ``student()`` against ``yardstick()`` (alternating, ``rounds`` pairs, up to
    ``max_rounds`` while the estimate straddles a band edge; default one more pair, none
    more when ``rounds`` is 1: a smoke run), print the estimate of the
    graded ratio and the credit it falls in, and return it (None while grading, when the
    grader's own measurement is what counts). ``valid(result)``: whether a student run did
    the whole job (one that did not earns nothing, as in the grader). ``tier``: the kind of
    devices the job runs on (Lab 5: ``gpu``, ``logical-gpu``, ``logical-cpu``); where the
    lab's ratios were measured on another (``tier`` in the published file), nothing is run
    and None is returned: a ratio from CPUs says nothing about GPUs."""
    if is_grading():
        print("throughput self-check: not run while grading (the grader times your job against the reference)")
        return None
    if max_rounds is None:
        max_rounds = rounds + 1 if rounds > 1 else rounds
    info = published(lab)
    if tier is not None and info.get("tier", tier) != tier:
        print(
            f"throughput self-check: its ratio was measured on {info['tier']} devices, not on {tier}: "
            "no estimate here (the grader measures your job against the reference on the grading machine)"
        )
        return None
    bands, points = [tuple(b) for b in info["bands"]], float(info["points"])
    scale, spread = scale_of(info["ratios"])
    m = alternate(
        student,
        yardstick,
        bands=bands,
        scale=scale,
        slack=spread,
        warmup=0,
        rounds=rounds,
        max_rounds=max_rounds,
        noise=0.1,
    )
    estimate = scale * m.ratio
    margin = (1 + m.noise) * (1 + spread) - 1
    complete = valid is None or all(valid(r) for r in m.student_results)
    called = m.low == m.high
    if not complete:
        credit = 0.0  # as the grader: a run that did not do the whole job earns nothing
    else:
        credit = ratio_credit(estimate, points, bands) if called else None
    out = SelfCheck(
        lab,
        m.student,
        m.other,
        scale,
        estimate,
        margin,
        band_of(estimate, bands) if called else None,
        credit,
        points,
        complete,
    )
    print(describe(out, info))
    return out


def describe(check: SelfCheck, info: dict) -> str:
    """What a self-check found, in words."""
    bands = sorted(((float(lo), float(fr)) for lo, fr in info["bands"]), reverse=True)
    edges = ", ".join(f"{fr:.0%} of the points from {lo:g}x" for lo, fr in bands)
    machines = "; ".join(f"{k} {float(v):.2f}" for k, v in info["ratios"].items())
    lines = [
        "Throughput self-check (an estimate: the grader times your job against the reference itself)",
        f"  your job {min(check.student_s):.2f} s, the yardstick ({info['yardstick']}) "
        f"{min(check.yardstick_s):.2f} s: "
        + (f"best of {len(check.student_s)} alternating runs each" if len(check.student_s) > 1 else "one run each"),
        f"  the reference takes {check.scale:.2f}x the yardstick's time (measured: {machines})",
        f"  so your throughput is about {check.estimate:.2f}x the reference's (+/- {check.margin:.0%}); "
        f"the grader gives {edges}",
    ]
    if not check.complete:
        lines.append("  -> a run of yours did not do the whole job: the grader gives it no throughput credit")
    elif check.credit is None:
        lines.append(
            "  -> too close to a band edge to call here: the grader's measurement decides "
            "(a faster job is the safe side)"
        )
    else:
        lines.append(f"  -> expect {check.credit:g} of {check.points:g} points for throughput")
    return "\n".join(lines)


def plain_steps(sess, g, x, y, batch_size: int, steps: int, seed: int = 1) -> int:
    """Lab 1's yardstick: ``steps`` SGD steps on random batches, no timing, nothing else.
    Returns the number of steps run."""
    import numpy as np

    for rows in np.random.default_rng(seed).integers(0, len(x), (steps, batch_size)):
        sess.run(g.train_op, feed_dict={g.x: x[rows], g.y: y[rows]})
    return steps
