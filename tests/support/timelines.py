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
