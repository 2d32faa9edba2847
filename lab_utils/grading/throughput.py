"""Fair, unforgeable throughput credit for hidden tests: the same job, timed by the grader.

::

    from lab_utils.grading import throughput
    throughput.compare(lambda: run(student_script), lambda: run(reference_script),
                       points=2, bands=((0.5, 1.0), (0.3, 0.5)), work=examples_per_job)

- **While nbgrader grades, the grader times the jobs, not the kernel.** ``compare`` then
  only runs the job it is asked for, over the kernel's stdin: the grader (outside the
  kernel, :class:`Driver`) says ``student`` or ``reference``, and the time of a job is the
  grader's own clock from that answer to the kernel's next question. Nothing the
  student's code can rebind (a clock, this module, ``compare`` itself) changes a time; a
  kernel that never asks gets no throughput credit. The grader also holds the batch's
  timing lock meanwhile (one timed job at a time across the batch), and decides the
  credit; the test cell's points and bands are read from its source, not from the kernel.
- Outside grading (an instructor's run of the notebook) the same alternation runs here,
  timed with this process's clock.
- Student and reference **alternate** (ABAB...), after ``warmup`` untimed pairs; the
  best run of each counts (other load only ever slows a run down).
- A ratio whose noise straddles a band edge is measured again (up to ``max_rounds``
  pairs); if it still cannot be called, it is **inconclusive**: the higher band is
  given and the instructor gets a flag. Timing noise never fails a student.
- The figure the student's code reports for itself is shown, never graded: one that
  claims over twice the reference's work per wall-clock second contradicts the clock,
  earns nothing and is flagged ``forged throughput``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from lab_utils import config
from lab_utils.grading.cells import is_grading, ratio_credit

__all__ = ["compare", "timing_settings", "band_of", "alternation", "Outcome", "outcome", "Driver", "PROMPT"]

_clock = time.perf_counter  # the local (ungraded) timing's clock
#: how a driven kernel's questions to the grader start (the rest is JSON)
PROMPT = "[lab-timing] "


def timing_settings() -> dict:
    """The lab's ``timing`` settings (passed by the grading worker), else the defaults."""
    from lab_utils.grading.settings import DEFAULTS

    raw = config.get(config.GRADING_TIMING)
    return {**DEFAULTS["timing"], **(json.loads(raw) if raw else {})}


def band_of(ratio: float, bands) -> int:
    """Index of the band ``ratio`` falls in (0 = best), ``len(bands)`` below all of them."""
    edges = sorted((float(lo) for lo, _ in bands), reverse=True)
    return next((i for i, lo in enumerate(edges) if ratio >= lo), len(edges))


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


def alternation(*, bands, scale=1.0, slack=0.0, warmup, rounds, max_rounds, noise):
    """The alternation as a generator: it yields ``(job, timed)`` (``"student"`` or
    ``"reference"``, and whether the run counts) and is sent ``(seconds, result)`` of each
    run; it returns the :class:`_Timed` once ``rounds`` pairs are done and ``scale`` x the
    ratio cannot straddle a band edge by the noise (plus ``slack``), or ``max_rounds`` are."""
    out = _Timed()
    for _ in range(int(warmup)):
        yield "student", False
        yield "reference", False
    while True:
        for job, times, results in (
            ("student", out.student, out.student_results),
            ("reference", out.other, out.other_results),
        ):
            seconds, result = yield job, True
            times.append(seconds)
            results.append(result)
        out.ratio = min(out.other) / min(out.student) if min(out.student) > 0 else float("inf")
        out.noise = max(_spread(out.student), _spread(out.other), 0.02) if len(out.student) > 1 else noise
        wide = (1 + out.noise) * (1 + slack)
        out.low, out.high = band_of(scale * out.ratio * wide, bands), band_of(scale * out.ratio / wide, bands)
        if len(out.student) >= rounds and (out.low == out.high or len(out.student) >= max_rounds):
            return out


def alternate(student, other, **kw) -> _Timed:
    """:func:`alternation` run here, each job timed with this process's clock."""
    plan = alternation(**kw)
    jobs = {"student": student, "reference": other}
    try:
        job, _ = next(plan)
        while True:
            t0 = _clock()
            result = jobs[job]()
            job, _ = plan.send((_clock() - t0, result))
    except StopIteration as done:
        return done.value


@dataclass
class Outcome:
    """What a timed comparison gives: the credit, the lines shown in the cell, the flags
    (``{"kind", "detail"}``) and the timing figures the batch keeps."""

    credit: float
    lines: list[str]
    flags: list[dict]
    timing: dict


def outcome(m: _Timed, *, points, bands, work=None, unit="examples/s", complete=True, claimed=None) -> Outcome:
    """The credit of the alternation ``m`` (see the module doc): ``complete``: every student
    run did the whole job; ``claimed``: the student's reported work per wall-clock second over
    the reference's (None: not reported)."""
    stu, ref, ratio, n = m.student, m.other, m.ratio, m.noise
    show = (lambda t: f"{work / t:,.0f} {unit}") if work else (lambda t: f"{t:.2f} s")
    lines = [
        f"{unit if work else 'job time'} (wall clock, same job, best of {len(stu)} alternating runs): "
        f"yours {show(min(stu))}, reference {show(min(ref))}, ratio {ratio:.2f}"
    ]
    timing = {"student_s": stu, "reference_s": ref, "ratio": ratio, "noise": n, "band": m.low,
              "claimed_work_ratio": claimed}  # fmt: skip
    flags: list[dict] = []
    if not complete:
        flags.append(
            {"kind": "incomplete timed run", "detail": "a timed run of the student's code did not do the whole job"}
        )
        credit = ratio_credit(0.0, points, bands)
    elif claimed is not None and not claimed <= 2.0:
        flags.append(
            {
                "kind": "forged throughput",
                "detail": f"the figure the student's code reports claims {claimed:.1f}x the work per wall-clock "
                "second of the reference's: it contradicts the clock",
            }
        )
        credit = ratio_credit(0.0, points, bands)
    elif m.low != m.high:
        flags.append(
            {
                "kind": "inconclusive timing",
                "detail": f"ratio {ratio:.2f} +/- {n:.0%} straddles a band edge after {len(stu)} rounds "
                "(regraded); the higher band was given",
            }
        )
        lines.append("inconclusive — regraded: the measurement was too noisy to call, so the higher band was given")
        credit = ratio_credit(ratio * (1 + n), points, bands)
    else:
        credit = ratio_credit(ratio, points, bands)
    return Outcome(credit, lines, flags, timing)


def _claims(reported: list, m: _Timed) -> float:
    """The work per wall-clock second the student's runs claim, over the reference's (medians):
    ``reported`` holds each run's figure, student's then reference's."""
    k = len(m.student)
    mine = sorted(float(r) * t for r, t in zip(reported[:k], m.student, strict=True))
    theirs = sorted(float(r) * t for r, t in zip(reported[k:], m.other, strict=True))
    return mine[len(mine) // 2] / theirs[len(theirs) // 2]


def _no_injected_delay() -> None:
    """A timed job runs without ``LABS_STRAGGLER`` (which makes a task of every run kind sleep
    each step): set in the kernel, the same sleep in both jobs would pull any ratio towards 1."""
    if os.environ.pop(config.STRAGGLER, None):
        print(f"{config.STRAGGLER} unset: a timed comparison runs without an injected straggler")


def _driven(student, reference, valid, reported, work, unit) -> None:
    """Run the jobs the grader asks for, over stdin (see the module doc): the first question
    gives the job's size for display, each next one how the last job went (whether it did the
    whole job, the figure it reported)."""
    jobs = {"student": student, "reference": reference}
    last: dict = {"ready": True, "work": float(work) if work else None, "unit": str(unit)}
    while True:
        answer = input(PROMPT + json.dumps(last)).strip()
        if answer not in jobs:
            return None
        _no_injected_delay()
        result = jobs[answer]()
        last = {
            "job": answer,
            "valid": bool(valid(result)) if valid is not None and answer == "student" else True,
            "reported": float(reported(result)) if reported is not None else None,
        }


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
) -> float | None:
    """Credit (a float in [0, points], for nbgrader) for the student's job against the
    reference's, from the ratio of their best wall-clock times (see the module doc); while
    graded, the grader's credit, and None here.

    ``student`` and ``reference`` are callables doing the same job; ``work`` is the
    job's size in ``unit`` x seconds (e.g. examples) for display; ``valid(result)``
    says whether a student run did the whole job (a run that did not earns nothing);
    ``reported(result)`` is the figure a run claims for itself."""
    if is_grading() and config.flag(config.GRADING_DRIVEN):
        return _driven(student, reference, valid, reported, work, unit)
    _no_injected_delay()
    cfg = timing_settings()
    rounds = int(rounds or cfg["rounds"])
    max_rounds = max(rounds, int(max_rounds or cfg["max_rounds"]))
    noise = float(noise if noise is not None else cfg["noise"])
    m = alternate(student, reference, bands=bands, warmup=warmup, rounds=rounds, max_rounds=max_rounds, noise=noise)
    complete = valid is None or all(valid(r) for r in m.student_results)
    claimed = None
    if reported is not None:
        figures = [reported(r) for r in m.student_results + m.other_results]
        print(
            f"as the runs report it: yours {float(figures[0]):,.0f}, reference {float(figures[len(m.student)]):,.0f} {unit}"
        )
        claimed = _claims(figures, m)
    got = outcome(m, points=points, bands=bands, work=work, unit=unit, complete=complete, claimed=claimed)
    print(got.lines[0])
    print("[grading-timing] " + json.dumps(got.timing))
    for f in got.flags:
        print(f"[grading-flag] {f['kind']}: {f['detail']}")
    for line in got.lines[1:]:
        print(line)
    return got.credit


class Driver:
    """The grader's side of a driven comparison (see the module doc): answer the kernel's
    questions with the next job, time each job on the grader's own clock, and give the
    credit. ``settings``: the lab's timing settings; ``call``: the literal arguments of the
    test cell's ``compare`` call (points, bands, warmup, rounds, max_rounds, noise, work, unit)."""

    def __init__(self, call: dict, settings: dict, clock=time.perf_counter):
        self.call, self.clock = call, clock
        rounds = int(call.get("rounds") or settings["rounds"])
        self.plan = alternation(
            bands=call["bands"],
            warmup=int(call.get("warmup") or 0),
            rounds=rounds,
            max_rounds=max(rounds, int(call.get("max_rounds") or settings["max_rounds"])),
            noise=float(call["noise"] if call.get("noise") is not None else settings["noise"]),
        )
        self.started_at: float | None = None
        self.job: str | None = None
        self.timed: bool = False
        self.reported: dict[str, list] = {"student": [], "reference": []}
        self.complete = True
        self.result: _Timed | None = None
        self.protocol_error: str | None = None

    def answer(self, prompt: str) -> str:
        """The answer to the kernel's question ``prompt``: the next job, or ``done``."""
        now = self.clock()
        if self.result is not None or not prompt.startswith(PROMPT):
            self.protocol_error = self.protocol_error or f"unexpected question {prompt[:80]!r}"
            return "done"
        try:
            last = json.loads(prompt[len(PROMPT) :])
        except ValueError:
            self.protocol_error = "a question that is not JSON"
            return "done"
        try:
            if self.job is None:  # the first question: the job's size, shown with the times
                self.call.setdefault("work", last.get("work") if isinstance(last.get("work"), float) else None)
                self.call.setdefault("unit", str(last.get("unit") or "examples/s")[:40])
                step = next(self.plan)
            else:
                if last.get("job") != self.job:
                    self.protocol_error = f"the kernel ran {last.get('job')!r} when asked for {self.job!r}"
                    return "done"
                if self.timed:
                    if self.job == "student" and not last.get("valid", False):
                        self.complete = False
                    if last.get("reported") is not None:
                        self.reported[self.job].append(last["reported"])
                step = self.plan.send((now - self.started_at, None))
        except StopIteration as done:
            self.result = done.value
            return "done"
        self.job, self.timed = step
        self.started_at = self.clock()
        return self.job

    def outcome(self) -> Outcome | None:
        """The credit, or None when the comparison did not finish (the kernel stopped asking)."""
        m = self.result
        if m is None:
            return None
        c = self.call
        figures = self.reported["student"] + self.reported["reference"]
        claimed = _claims(figures, m) if len(figures) == len(m.student) + len(m.other) and figures else None
        return outcome(m, points=c["points"], bands=c["bands"], work=c.get("work"), unit=c.get("unit", "examples/s"),
                       complete=self.complete, claimed=claimed)  # fmt: skip
