"""The checks every run kind's timeline must pass (tests/process and the notebooks' tests)."""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from lab_utils import timeline as tl_mod


def check(timeline, measured: Mapping[str, float], tasks=None, rel: float = 0.05) -> dict:
    """``timeline`` (a :class:`lab_utils.timeline.Timeline` or its trace file) is valid:
    its trace file loads, every task of ``tasks`` (default: those of ``measured``) has a
    track, nothing in a track overlaps unless nested, and each task's categories add up to
    the training time it measured itself (``measured``: task -> seconds) within ``rel``.
    Returns the per-task seconds (:meth:`Timeline.seconds`)."""
    loaded = tl_mod.load(timeline.path if hasattr(timeline, "path") else timeline)
    trace = json.loads(loaded.path.read_text())
    named = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    for task in tasks if tasks is not None else measured:
        assert task in named, f"{task}: no track in the trace ({sorted(named)})"
    assert loaded.problems() == []
    seconds = loaded.seconds()
    for task, want in measured.items():
        row = seconds[task]
        parts = sum(row[c] for c in tl_mod.CATEGORIES if c != "eval")
        assert parts == pytest.approx(row["step"], rel=1e-6), (task, row)  # the shares add up to 1
        assert row["step"] == pytest.approx(want, rel=rel), (task, row, want)
    summary = loaded.summary()
    shares = summary[[c for c in summary.columns if c not in ("steps", "ms/step", "overlap")]]
    assert (shares.sum(axis=1) - 1).abs().max() < 1e-6, summary
    return seconds


def check_cause(timeline, waiter: str, straggler: str, rel: float = 0.10) -> float:
    """The largest cause of ``waiter``'s waits is ``straggler``'s injected delay, and it is the
    straggler's whole delay within ``rel`` (what an injected straggler must show, every run
    kind: :func:`lab_utils.critical_path.waits_by_cause`); the causes add up to the wait.
    The whole delay is what of it fell while the waiter ran its steps: a run with no start
    barrier (ZeRO, a pipeline) may begin the straggler's first delay before the waiter's first
    step, and nobody waited for that part. Returns those seconds."""
    table = timeline.waits_by_cause()
    mine = table[table["task"] == waiter]
    assert not mine.empty, f"{waiter} never waited: {table}"
    shown = mine.to_string()
    assert mine["cause"].iloc[0] == f"{straggler}: injected delay", shown
    assert mine["seconds"].sum() == pytest.approx(mine["waited (s)"].iloc[0], rel=1e-4), (
        shown
    )  # float sums of epoch times
    ran = [s for s in timeline.steps if s.task == waiter]
    begun, ended = min(s.start for s in ran), max(s.end for s in ran)
    delays = [p for p in timeline.parts if p.task == straggler and p.cat == "delay"]
    delay = sum(max(0.0, min(p.end, ended) - max(p.start, begun)) for p in delays)
    early = sum(p.seconds for p in delays) - delay
    assert mine["seconds"].iloc[0] == pytest.approx(delay, rel=rel), (
        f"{shown}\n{straggler}'s delay while {waiter} ran its steps: {delay:.3f} s (and {early:.3f} s outside them)"
    )
    return float(mine["seconds"].iloc[0])
