"""A run's timeline, as spans: a task's steps and the parts of each (what
:mod:`lab_utils.timeline` draws, writes and reads back), made from the tasks' step events.

A collective's span (``on`` the other tasks of an all-reduce, an all-gather, a PS pull) is
split where the last of them began its own: the time until then is waiting."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Span", "parts_of", "steps_of", "collectives", "SSP_ASK", "SSP_WAIT", "SSP_PAUSES", "TOKEN_SPANS"]

#: The spans a replay (:func:`lab_utils.critical_path.what_if`) knows by name. An SSP step that
#: asked for permission (Lab 6, :mod:`lab_utils.training.ps.clocks`): the first read of the
#: clocks (``comm``) and, if the answer was no, the wait until it was yes (``wait``), polling
#: with pauses from the first to the longest of ``SSP_PAUSES`` (seconds, doubling).
SSP_ASK, SSP_WAIT = "read clocks", "ssp wait"
SSP_PAUSES = (0.001, 0.02)
#: A sync step's reads of the token queue until every worker has its token (R = N only,
#: :mod:`lab_utils.training.ps.task`): the first read (``comm``), the wait for a slower worker
#: to take its own (``wait``).
TOKEN_SPANS = ("token queue", "peers' tokens")


@dataclass(frozen=True)
class Span:
    """One bar of a track: a step (``cat="step"``) or a part of one."""

    task: str
    name: str
    cat: str
    start: float  # time.time() seconds
    end: float
    step: int | None = None
    on: tuple[str, ...] = ()  # a wait: the tasks it waited on, where the span named them

    @property
    def seconds(self) -> float:
        return self.end - self.start


def parts_of(step: Span, raw: Iterable[Sequence]) -> list[Span]:
    """A step's parts, sorted, clipped to the step and to the part before (never overlapping)."""
    out: list[Span] = []
    cursor = step.start
    for name, cat, start, end, *on in sorted(raw, key=lambda r: (r[2], r[3])):
        lo, hi = max(float(start), cursor), min(float(end), step.end)
        if hi > lo:
            out.append(Span(step.task, str(name), str(cat), lo, hi, step.step, tuple(on[0]) if on else ()))
            cursor = hi
    return out


def steps_of(events: Iterable[Mapping]) -> tuple[list[Span], list[Span]]:
    """``(steps, parts)`` of every ``step`` event that says when it started."""
    steps, parts = [], []
    for e in events:
        if e.get("kind") != "step" or e.get("started") is None:
            continue
        s = Span(
            str(e.get("task")), f"step {e.get('step')}", "step", float(e["started"]), float(e["time"]), e.get("step")
        )
        if s.end < s.start:
            continue
        steps.append(s)
        parts += parts_of(s, e.get("spans") or [])
    return steps, parts


def collectives(parts: list[Span]) -> list[Span]:
    """A collective's span (a ``comm`` or ``compute`` span ``on`` the other tasks of an
    all-reduce, an all-gather...) could not finish before each of them began its span of the
    same name in the same step: the time until the last one did is waiting (``<name>: waiting``,
    ``on`` them), the rest is the collective's own. Every other part is as it was."""
    index: dict[tuple, list[Span]] = {}
    for p in parts:
        if p.on and p.cat != "wait":
            index.setdefault((p.task, p.name, p.step), []).append(p)
    out: list[Span] = []
    for p in parts:
        if not p.on or p.cat == "wait":
            out.append(p)
            continue
        starts = []
        for task in p.on:  # theirs in the same step (the nearest, where a number repeats)
            theirs = index.get((task, p.name, p.step))
            if theirs:
                starts.append(min(theirs, key=lambda q: abs(q.start - p.start)).start)
        last = min(max([p.start, *starts]), p.end)  # it came last: no wait
        if last > p.start:
            out.append(Span(p.task, f"{p.name}: waiting", "wait", p.start, last, p.step, p.on))
        if p.end > last:
            out.append(Span(p.task, p.name, p.cat, last, p.end, p.step))
    return out
