"""Fair, unforgeable throughput credit for hidden tests: the same job, timed by the grader.

::

    from lab_utils.grading import throughput
    throughput.compare(lambda: run(student_script), lambda: run(reference_script),
                       points=2, bands=((0.5, 1.0), (0.3, 0.5)), work=examples_per_job)

- The figure graded is the **wall clock of the same job** measured here, around the
  call, with a clock taken when this module was first imported (the locked setup
  cell, before any student cell ran): a figure the student's code reports or leaves
  in the kernel is shown, never graded.
- Student and reference **alternate** (ABAB...), after ``warmup`` untimed pairs; the
  best run of each counts (other load only ever slows a run down).
- While it measures it holds the machine-wide **timing lock** of the grading batch
  (``$LAB_GRADING_TIMING_LOCK``): one timing job at a time, whatever else is graded.
- A ratio whose noise straddles a band edge is measured again (up to ``max_rounds``
  pairs); if it still cannot be called, it is **inconclusive**: the higher band is
  given and the instructor gets a ``[grading-flag]``. Timing noise never fails a student.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager

from lab_utils.grading.accounting import flag_line
from lab_utils.grading.cells import ratio_credit

__all__ = ["compare", "timing_settings", "band_of", "TIMING_ENV", "LOCK_ENV"]

_clock = time.perf_counter  # taken at import, in the locked setup cell
TIMING_ENV = "LAB_GRADING_TIMING"  # JSON {"rounds", "max_rounds", "noise"}, set by the grading worker
LOCK_ENV = "LAB_GRADING_TIMING_LOCK"


def timing_settings() -> dict:
    """The lab's ``timing`` settings (passed by the grading worker), else the defaults."""
    from lab_utils.grading.settings import DEFAULTS

    raw = os.environ.get(TIMING_ENV)
    return {**DEFAULTS["timing"], **(json.loads(raw) if raw else {})}


def band_of(ratio: float, bands) -> int:
    """Index of the band ``ratio`` falls in (0 = best), ``len(bands)`` below all of them."""
    edges = sorted((float(lo) for lo, _ in bands), reverse=True)
    return next((i for i, lo in enumerate(edges) if ratio >= lo), len(edges))


@contextmanager
def _timing_lock():
    path = os.environ.get(LOCK_ENV)
    if not path:
        yield
        return
    with open(path) as f:  # readable by every sandbox's kernel; flock needs no write access
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _timed(fn):
    t0 = _clock()
    result = fn()
    return _clock() - t0, result


def _spread(times: list[float]) -> float:
    best = sorted(times)
    return (best[1] - best[0]) / best[0] if len(best) > 1 and best[0] > 0 else 0.0


def compare(
    student,
    reference,
    *,
    points,
    bands,
    work=None,
    unit="examples/s",
    valid=None,
    reported=None,
    warmup=0,
    rounds=None,
    max_rounds=None,
    noise=None,
) -> float:
    """Credit (a float in [0, points], for nbgrader) for the student's job against the
    reference's, from the ratio of their best wall-clock times (see the module doc).

    ``student`` and ``reference`` are callables doing the same job; ``work`` is the
    job's size in ``unit`` x seconds (e.g. examples) for display; ``valid(result)``
    says whether a student run did the whole job (a run that did not earns nothing);
    ``reported(result)`` is the figure a run claims for itself: a student figure that
    claims over twice the work per second of wall clock that the reference's does
    contradicts the clock, and earns nothing."""
    cfg = timing_settings()
    rounds = int(rounds or cfg["rounds"])
    max_rounds = max(rounds, int(max_rounds or cfg["max_rounds"]))
    noise = float(noise if noise is not None else cfg["noise"])
    stu, ref, stu_results, ref_results = [], [], [], []
    with _timing_lock():
        for _ in range(int(warmup)):
            student(), reference()
        while True:
            t, r = _timed(student)
            stu.append(t)
            stu_results.append(r)
            t, r = _timed(reference)
            ref.append(t)
            ref_results.append(r)
            ratio = min(ref) / min(stu) if min(stu) > 0 else float("inf")
            n = max(_spread(stu), _spread(ref), 0.02) if len(stu) > 1 else noise
            low, high = band_of(ratio * (1 + n), bands), band_of(ratio / (1 + n), bands)
            if len(stu) >= rounds and (low == high or len(stu) >= max_rounds):
                break
    done = valid is None or all(valid(r) for r in stu_results)
    show = (lambda t: f"{work / t:,.0f} {unit}") if work else (lambda t: f"{t:.2f} s")
    print(
        f"{unit if work else 'job time'} (wall clock, same job, best of {len(stu)} alternating runs): "
        f"yours {show(min(stu))}, reference {show(min(ref))}, ratio {ratio:.2f}"
    )
    claims = None
    if reported is not None:
        mine = [float(reported(r)) * t for r, t in zip(stu_results, stu, strict=True)]
        theirs = [float(reported(r)) * t for r, t in zip(ref_results, ref, strict=True)]
        claims = sorted(mine)[len(mine) // 2] / sorted(theirs)[len(theirs) // 2]
        print(
            f"as the runs report it: yours {float(reported(stu_results[0])):,.0f}, "
            f"reference {float(reported(ref_results[0])):,.0f} {unit}"
        )
    print(
        "[grading-timing] "
        + json.dumps(
            {
                "student_s": stu,
                "reference_s": ref,
                "ratio": ratio,
                "noise": n,
                "band": low,  # 0 = best; the higher of the two when the noise straddles an edge
                "claimed_work_ratio": claims,
            }
        )
    )
    if not done:
        print(flag_line("incomplete timed run", "a timed run of the student's code did not do the whole job"))
        return ratio_credit(0.0, points, bands)
    if claims is not None and not claims <= 2.0:
        print(
            flag_line(
                "forged throughput",
                f"the figure the student's code reports claims {claims:.1f}x the "
                "work per wall-clock second of the reference's: it contradicts the clock",
            )
        )
        return ratio_credit(0.0, points, bands)
    if low != high:
        print(
            flag_line(
                "inconclusive timing",
                f"ratio {ratio:.2f} +/- {n:.0%} straddles a band edge after "
                f"{len(stu)} rounds (regraded); the higher band was given",
            )
        )
        print("inconclusive — regraded: the measurement was too noisy to call, so the higher band was given")
        return ratio_credit(ratio * (1 + n), points, bands)
    return ratio_credit(ratio, points, bands)
