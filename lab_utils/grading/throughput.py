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
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from lab_utils import config
from lab_utils.grading.accounting import flag_line
from lab_utils.grading.cells import ratio_credit

__all__ = ["compare", "timing_settings", "band_of"]

_clock = time.perf_counter  # taken at import, in the locked setup cell


def timing_settings() -> dict:
    """The lab's ``timing`` settings (passed by the grading worker), else the defaults."""
    from lab_utils.grading.settings import DEFAULTS

    raw = config.get(config.GRADING_TIMING)
    return {**DEFAULTS["timing"], **(json.loads(raw) if raw else {})}


def band_of(ratio: float, bands) -> int:
    """Index of the band ``ratio`` falls in (0 = best), ``len(bands)`` below all of them."""
    edges = sorted((float(lo) for lo, _ in bands), reverse=True)
    return next((i for i, lo in enumerate(edges) if ratio >= lo), len(edges))


@contextmanager
def _timing_lock():
    path = config.get(config.GRADING_TIMING_LOCK)
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


@dataclass
class _Timed:
    """Alternating runs of two jobs: times and results of each, their ratio (``other``'s best
    time over ``student``'s), its noise, and the bands of the ratio at both ends of the noise."""

    student: list = field(default_factory=list)
    other: list = field(default_factory=list)
    student_results: list = field(default_factory=list)
    other_results: list = field(default_factory=list)
    ratio: float = float("nan")
    noise: float = 0.0
    low: int = 0  # the band with the noise in the student's favour (0 = best)
    high: int = 0


def _alternate(student, other, *, bands, scale=1.0, slack=0.0, warmup, rounds, max_rounds, noise) -> _Timed:
    """Run ``student`` and ``other`` alternately (ABAB...) after ``warmup`` untimed pairs, until
    ``rounds`` pairs are done and ``scale`` x the ratio cannot straddle a band edge by the noise
    (plus ``slack``), or ``max_rounds`` pairs are."""
    out = _Timed()
    for _ in range(int(warmup)):
        student(), other()
    while True:
        for times, results, job in ((out.student, out.student_results, student), (out.other, out.other_results, other)):
            t, r = _timed(job)
            times.append(t)
            results.append(r)
        out.ratio = min(out.other) / min(out.student) if min(out.student) > 0 else float("inf")
        out.noise = max(_spread(out.student), _spread(out.other), 0.02) if len(out.student) > 1 else noise
        wide = (1 + out.noise) * (1 + slack)
        out.low, out.high = band_of(scale * out.ratio * wide, bands), band_of(scale * out.ratio / wide, bands)
        if len(out.student) >= rounds and (out.low == out.high or len(out.student) >= max_rounds):
            return out


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
    with _timing_lock():
        m = _alternate(
            student, reference, bands=bands, warmup=warmup, rounds=rounds, max_rounds=max_rounds, noise=noise
        )
    stu, ref, ratio, n = m.student, m.other, m.ratio, m.noise
    done = valid is None or all(valid(r) for r in m.student_results)
    show = (lambda t: f"{work / t:,.0f} {unit}") if work else (lambda t: f"{t:.2f} s")
    print(
        f"{unit if work else 'job time'} (wall clock, same job, best of {len(stu)} alternating runs): "
        f"yours {show(min(stu))}, reference {show(min(ref))}, ratio {ratio:.2f}"
    )
    claims = _claims(reported, m, unit) if reported is not None else None
    print(
        "[grading-timing] "
        + json.dumps(
            {
                "student_s": stu,
                "reference_s": ref,
                "ratio": ratio,
                "noise": n,
                "band": m.low,  # 0 = best; the higher of the two when the noise straddles an edge
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
    if m.low != m.high:
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


def _claims(reported, m: _Timed, unit: str) -> float:
    """The work per wall-clock second the student's runs claim, over the reference's (medians)."""
    mine = [float(reported(r)) * t for r, t in zip(m.student_results, m.student, strict=True)]
    theirs = [float(reported(r)) * t for r, t in zip(m.other_results, m.other, strict=True)]
    print(
        f"as the runs report it: yours {float(reported(m.student_results[0])):,.0f}, "
        f"reference {float(reported(m.other_results[0])):,.0f} {unit}"
    )
    return sorted(mine)[len(mine) // 2] / sorted(theirs)[len(theirs) // 2]
