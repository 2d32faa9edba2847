"""Horovod's own timeline (``timeline.json``, written by rank 0's background thread) read and
merged into a run's timeline (:mod:`lab_utils.timeline`): ``NEGOTIATE_ALLREDUCE`` (waiting until
every rank has that gradient ready) is ``wait``, ``ALLREDUCE`` is ``comm``, what comes before in
the step is ``compute``. Other ranks get the all-reduce (it runs on every rank at once)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from lab_utils.spans import Span, parts_of

__all__ = ["read_horovod_timeline", "horovod_activities", "merge"]


def read_horovod_timeline(path: str | os.PathLike) -> list[dict]:
    """Horovod's timeline: a JSON array that a killed or still running job leaves open."""
    text = Path(path).read_text().strip()
    if not text:
        return []
    if not text.endswith("]"):
        text = text.rstrip(",\n ") + "]"
    return json.loads(text)


def _horovod_start(trace: list[dict]) -> float | None:
    for e in trace:
        start = (e.get("args") or {}).get("start_time_since_epoch_in_micros")
        if start is not None:
            return float(start) / 1e6
    return None


def horovod_activities(trace: list[dict], t0: float = 0.0) -> dict[str, list[tuple[Any, float, float]]]:
    """``{activity: [(tensor, start, end), ...]}`` of the top-level B/E pairs of every tensor
    in Horovod's timeline (``NEGOTIATE_ALLREDUCE``, ``ALLREDUCE``, ``ALLGATHER``, ``BROADCAST``...),
    in seconds from ``t0`` (its start: ``time.time()`` seconds; 0: from the timeline's start)."""
    names = {e.get("pid"): e.get("args", {}).get("name") for e in trace if e.get("name") == "process_name"}
    open_at: dict[Any, list] = {}
    out: dict[str, list] = {}
    for e in trace:
        key = (e.get("pid"), e.get("tid"))
        if e.get("ph") == "B":
            open_at.setdefault(key, []).append((e.get("name", "?"), e["ts"]))
        elif e.get("ph") == "E" and open_at.get(key):
            name, ts = open_at[key].pop()
            if not open_at[key]:  # a top-level activity of that tensor
                tensor = names.get(e.get("pid"), e.get("pid"))
                out.setdefault(name, []).append((tensor, t0 + ts / 1e6, t0 + e["ts"] / 1e6))
    return out


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _negotiate_and_collective(activities: dict[str, list[tuple[float, float]]]) -> tuple[list, list]:
    """Horovod's activities as two unions of intervals: negotiating, and the collectives."""
    negotiate = _union(iv for name, ivs in activities.items() if name.startswith("NEGOTIATE") for iv in ivs)
    collective = _union(iv for name, ivs in activities.items() if not name.startswith("NEGOTIATE") for iv in ivs)
    return negotiate, collective


def _horovod_parts(steps: list[Span], negotiate: list, collective: list, delays: Sequence[Span] = ()) -> list[Span]:
    """Parts of the steps that recorded none of their own (an injected delay aside, kept),
    from Horovod's timeline: rank 0 negotiates (``wait``) then all-reduces (``comm``), having
    computed until it asked (``compute``, after the delay); every other rank all-reduces at
    the same moment."""
    out: list[Span] = []
    for s in steps:
        raw = [
            (d.name, d.cat, d.start, d.end)
            for d in delays
            if d.task == s.task and d.step == s.step and s.start <= d.start < s.end
        ]
        mine = [("all-reduce", "comm", lo, hi) for lo, hi in collective if s.start <= lo < s.end]
        if s.task == "rank:0":
            mine += [("negotiate", "wait", lo, hi) for lo, hi in negotiate if s.start <= lo < s.end]
        if not mine:
            out += parts_of(s, raw)
            continue
        first = min(m[2] for m in mine)
        computing = max([s.start, *(r[3] for r in raw if r[3] <= first)])
        if first > computing:
            raw.append(("gradients", "compute", computing, first))
        out += parts_of(s, raw + mine)
    return out


def _horovod_overlap(steps: list[Span], negotiate: list, collective: list) -> dict[str, float]:
    """Seconds rank 0 spent all-reducing some gradients while it still computed others:
    the collective before the step's last tensor asked to be reduced (its last negotiation)."""
    total = 0.0
    for s in steps:
        asks = [lo for lo, hi in negotiate if s.start <= lo < s.end]
        if asks:
            computing_until = max(asks)
            total += sum(max(0.0, min(hi, computing_until) - max(lo, s.start)) for lo, hi in collective)
    return {"rank:0": total} if steps else {}


def merge(path: str | os.PathLike, steps: list[Span], parts: list[Span]) -> tuple[list[Span], dict | None, list[dict]]:
    """Horovod's timeline at ``path`` merged into a run's ``parts``: the steps that recorded no
    part of their own (an injected delay aside) get negotiate / all-reduce / compute parts;
    also rank 0's overlap of communication with compute, and Horovod's trace shifted onto the
    tasks' clock. ``(parts, None, [])`` without a readable timeline."""
    if not Path(path).is_file():
        return parts, None, []
    trace = read_horovod_timeline(path)
    t0 = _horovod_start(trace)
    if t0 is None:
        return parts, None, []
    own = {p.task for p in parts if p.cat != "delay"}  # an injected delay is not the step's work
    bare = [s for s in steps if s.task not in own]
    found = horovod_activities(trace, t0)
    split = _negotiate_and_collective({name: [(lo, hi) for _, lo, hi in ivs] for name, ivs in found.items()})
    merged = _horovod_parts(bare, *split, [p for p in parts if p.task not in own])
    overlap = _horovod_overlap([s for s in bare if s.task == "rank:0"], *split)
    shifted = [dict(e, ts=e["ts"] + t0 * 1e6) if "ts" in e else e for e in trace]
    return [p for p in parts if p.task in own] + merged, overlap, shifted
