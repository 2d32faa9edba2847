"""Why a step took as long as it did: the critical path across tasks, each wait attributed to
its cause, and a what-if replay of the run with changed durations.

A :class:`~lab_utils.timeline.Timeline` holds, per task, its steps and their parts. This
module reads it as a graph:

- every task's time, from its first step's start to its last step's end, is a chain of
  *pieces*: the steps' parts, the gaps inside a step that no part covers (``other``), and the
  gaps between steps (``between``);
- a ``wait`` piece was *released* by another task: the piece of another task (not a wait,
  not a serving PS) that ended last before the wait ended, among the tasks the wait was on
  when the span says so (``on``). That is the dependency: a sync worker's token wait on the
  last gradient's push (the chief's apply follows it), a ring's barrier on the last rank to
  arrive, an SSP wait on the slowest worker's step. A wait released by nothing traced keeps
  its own duration and is "unattributed" (a queue, the network, an untraced process);
- the **critical path** walks back from the end: along a task's own pieces, and from a wait
  to the piece that released it, on the other task, and on from there;
- the **causes** of a wait are what the critical path did, from the wait's end back to when
  the waiter was last released, less what the waiter did itself in that time (the compute
  both did cancels, the straggler's delay does not): "worker:0 waited 1.21 s: 0.98 s for
  worker:1: injected delay, ...";
- the **what-if** replays the graph in the order it ran, with each piece's duration scaled
  by its category (and task), and each wait ending as late as its own task's previous piece
  or its releaser's (replayed) end plus the same latency, whichever is later.

What the replay assumes, and says: compute and everything not scaled take the time they took;
the same event releases each wait (the order of the releases does not change); a wait with no
traced release keeps its duration.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from lab_utils.spans import SSP_ASK, SSP_PAUSES, SSP_WAIT, TOKEN_SPANS

__all__ = [
    "Piece",
    "pieces",
    "releasers",
    "critical_path",
    "waits_by_cause",
    "describe_waits",
    "what_if",
    "ASSUMPTIONS",
]

#: what :func:`what_if` assumes (its table says so too)
ASSUMPTIONS = (
    "what is not scaled takes the time it took; "
    "each wait is released by the same event as in the run (the order of releases is kept); "
    "a wait whose release was not traced keeps its duration"
)
#: the cause of a wait that nothing traced released
UNATTRIBUTED = "nothing traced (a queue, the network, an untraced process)"
_EPS = 2e-3  # s: a release and the end of the wait it releases, on one clock (two processes' stamps)
_CAUSE = {
    "compute": "computing",
    "comm": "communicating",
    "delay": "injected delay",
    "eval": "evaluation",
    "other": "other (input, Python)",
    "between": "between steps",
    "starting": "starting (before its first step)",
    "wait": "waiting",
}


@dataclass(frozen=True)
class Piece:
    """A stretch of one task's time: a part of a step, a gap in one, or between two."""

    task: str
    name: str
    cat: str
    start: float
    end: float
    step: int | None
    on: tuple[str, ...] = ()  # the tasks a wait was on, when its span said so
    index: int | None = None  # the step's place in its task's chain, from 0 (two steps may share a number)

    @property
    def seconds(self) -> float:
        return self.end - self.start


def pieces(timeline) -> dict[str, list[Piece]]:
    """Per task with steps, its chain of pieces from its first step's start to its last step's end."""
    out: dict[str, list[Piece]] = {}
    parts: dict[tuple, list] = {}
    for p in timeline.parts:
        parts.setdefault((p.task, p.step), []).append(p)
    for task in timeline.tasks:
        chain: list[Piece] = []
        for i, s in enumerate(sorted((s for s in timeline.steps if s.task == task), key=lambda s: s.start)):
            if chain and s.start > chain[-1].end:
                chain.append(Piece(task, "between steps", "between", chain[-1].end, s.start, None))
            cursor = s.start
            # a PS step is numbered by the global step, which a stale push leaves as it was: two
            # steps of one task may share a number, and each keeps the parts inside it
            mine = (p for p in parts.get((task, s.step), []) if s.start <= p.start and p.end <= s.end)
            for p in sorted(mine, key=lambda p: p.start):
                if p.start > cursor:
                    chain.append(Piece(task, "other", "other", cursor, p.start, s.step, index=i))
                chain.append(Piece(task, p.name, p.cat, p.start, p.end, s.step, p.on, i))
                cursor = p.end
            if s.end > cursor:
                chain.append(Piece(task, "other", "other", cursor, s.end, s.step, index=i))
        if chain:
            out[task] = chain
    return out


def releasers(chains: Mapping[str, list[Piece]]) -> dict[Piece, Piece | None]:
    """Each wait piece's releaser: the piece of another task (``on``'s, if the span named them)
    that is not a wait and ended last before the wait ended (and after it began); None where
    none did."""
    ends = sorted(
        (p for chain in chains.values() for p in chain if p.cat not in ("wait", "between")), key=lambda p: p.end
    )
    times = [p.end for p in ends]
    out: dict[Piece, Piece | None] = {}
    for chain in chains.values():
        for w in chain:
            if w.cat != "wait":
                continue
            # what ended by the wait's end first; only if nothing did, what ended within the
            # clocks' slack after it (a push whose reply came back after the token it released)
            out[w] = _last_before(ends, times, w, w.end) or _last_before(ends, times, w, w.end + _EPS, w.end)
    return out


def _last_before(ends: list[Piece], times: list[float], w: Piece, until: float, after: float | None = None):
    for i in range(bisect.bisect_right(times, until) - 1, -1, -1):
        p = ends[i]
        if p.end < w.start - _EPS or (after is not None and p.end <= after):
            return None
        if p.task != w.task and (not w.on or p.task in w.on):
            return p
    return None


def _starts(chains: Mapping[str, list[Piece]]) -> dict[str, list[float]]:
    return {k: [p.start for p in chain] for k, chain in chains.items()}


def _walk(chains, released, task: str, t: float, stop: float, starts: dict | None = None) -> list[dict]:
    """The critical path back from ``task`` at ``t`` to ``stop``: one row per stretch
    (``starts``: :func:`_starts` of ``chains``, made once by a caller that walks many times)."""
    starts = _starts(chains) if starts is None else starts
    rows: list[dict] = []
    for _ in range(4 * sum(len(c) for c in chains.values()) + 4):  # each turn moves back, or jumps once
        if t <= stop + 1e-9:
            return rows[::-1]
        i = bisect.bisect_left(starts.get(task, []), t - 1e-9) - 1  # the piece that began before t
        if i < 0:  # this task had not begun its first step yet
            rows.append(_row(Piece(task, "before its first step", "starting", stop, t, None), stop, t, None))
            return rows[::-1]
        here = chains[task][i]
        lo = max(here.start, stop)
        r = released.get(here) if here.cat == "wait" else None
        if r is not None and r.start >= t:  # released by something that began after: no path through it
            r = None
        if r is None:
            rows.append(_row(here, lo, min(t, here.end), "unattributed" if here.cat == "wait" else None))
            t = lo
            continue
        if t > r.end:  # from the release to the wait's end: the message, the token queue
            rows.append(_row(here, max(r.end, lo), t, "release (message, queue)"))
        if r.end <= lo:
            t = lo
            continue
        task, t = r.task, min(t, r.end)  # never forward: a release within the slack after the wait's end
    raise RuntimeError(f"the critical path from {task} at {t} did not end: a cycle among the pieces")


def _row(p: Piece, start: float, end: float, cause: str | None) -> dict:
    what = cause or _CAUSE.get(p.cat, p.cat)
    return {"task": p.task, "name": p.name, "cat": p.cat, "step": p.step, "start": start, "end": end,
            "seconds": max(0.0, end - start), "what": what}  # fmt: skip


def critical_path(timeline, step: int | None = None):
    """The critical path of the run (``step=None``: from its last step's end back to its first
    step's start) or of one step (from the end of the task that ended that step last, back to
    that step's start on it). A table: ``task``, ``name``, ``cat``, ``step``, ``start``,
    ``end``, ``seconds``, ``what``, in time order; its seconds add up to the span it covers."""
    import pandas as pd

    chains = pieces(timeline)
    columns = ["task", "name", "cat", "step", "start", "end", "seconds", "what"]
    if not chains:
        return pd.DataFrame(columns=columns)
    released = releasers(chains)
    if step is None:
        last = max((c[-1] for c in chains.values()), key=lambda p: p.end)
        stop = min(c[0].start for c in chains.values())
        rows = _walk(chains, released, last.task, last.end, stop)
    else:
        mine = [s for s in timeline.steps if s.step == step and s.task in chains]
        if not mine:
            raise ValueError(f"no task has a step {step}")
        end = max(mine, key=lambda s: s.end)
        rows = _walk(chains, released, end.task, end.end, end.start)
    return pd.DataFrame(rows, columns=columns)


def _cause(row: dict) -> str:
    if row["what"] == "unattributed":
        return UNATTRIBUTED
    if row["what"] == "release (message, queue)":
        return "the release (message, queue)"
    return f"{row['task']}: {row['what']}"


def _one_wait(chains, released, starts, w: Piece, since: float, released_at: float) -> dict[str, float]:
    """The causes of wait ``w``: the critical path from the wait's end back to when the waiter's
    previous wait was released (``released_at``; it noticed at ``since``), less what the waiter
    itself did from ``since`` until it began to wait, category by category. What both did (the
    same compute, the same pull) cancels. The previous release's latency (``since -
    released_at``, counted in the previous wait) is taken off this one's: what is left is what
    the waiter waited for, and adds up to the wait."""
    path = _walk(chains, released, w.task, w.end, released_at, starts)
    found: dict[str, float] = {}
    by_cat: dict[str, float] = {}
    for row in path:
        found[_cause(row)] = found.get(_cause(row), 0.0) + row["seconds"]
        if row["what"] not in ("unattributed", "release (message, queue)"):
            by_cat[row["cat"]] = by_cat.get(row["cat"], 0.0) + row["seconds"]
    own: dict[str, float] = {}
    for p in chains[w.task]:
        lo, hi = max(p.start, since), min(p.end, w.start)
        if hi > lo:
            own[p.cat] = own.get(p.cat, 0.0) + hi - lo
    for cat, seconds in own.items():
        if by_cat.get(cat, 0.0) > 0:  # shared out over the path's stretches of that category
            for row in path:
                if row["cat"] == cat and row["what"] not in ("unattributed", "release (message, queue)"):
                    found[_cause(row)] -= seconds * row["seconds"] / by_cat[cat]
        else:  # the waiter did it and the path did not: its own, which the others did not wait for
            key = f"{w.task}: {_CAUSE.get(cat, cat)}"
            found[key] = found.get(key, 0.0) - seconds
    if since > released_at:
        key = _cause({"what": "release (message, queue)"})
        found[key] = found.get(key, 0.0) - (since - released_at)
    return found


def waits_by_cause(timeline):
    """Every task's waits, by what they waited for: one row per (task, cause) with the task's
    total wait and the seconds of that cause (``cause`` names the task and what it did, e.g.
    ``"worker:1: injected delay"``, largest first). A wait's causes are what its releaser (and
    what released that...) did since the waiter was last released, less what the waiter did
    itself in that time: the straggler's delay, not the compute both did. They add up to the
    wait; a cause the waiter had more of than the path (its own longer compute) is negative."""
    import pandas as pd

    chains = pieces(timeline)
    released = releasers(chains)
    starts = _starts(chains)
    found: dict[tuple[str, str], float] = {}
    total: dict[str, float] = {}
    for chain in chains.values():
        since = released_at = chain[0].start
        for w in chain:
            if w.cat != "wait":
                continue
            total[w.task] = total.get(w.task, 0.0) + w.seconds
            for cause, seconds in _one_wait(chains, released, starts, w, since, released_at).items():
                found[(w.task, cause)] = found.get((w.task, cause), 0.0) + seconds
            r = released.get(w)
            since = w.end  # the waiter went on from here; what released it, possibly a little before
            released_at = min(w.end, r.end) if r is not None and r.end > w.start else w.end
    rows = [{"task": task, "waited (s)": total[task], "cause": cause, "seconds": sec}
            for (task, cause), sec in found.items() if abs(sec) > 1e-9]  # fmt: skip
    order = {t: i for i, t in enumerate(timeline.tasks)}
    rows.sort(key=lambda r: (order.get(r["task"], len(order)), -r["seconds"]))
    return pd.DataFrame(rows, columns=["task", "waited (s)", "cause", "seconds"])


def describe_waits(timeline, top: int = 3) -> list[str]:
    """One sentence per task that waited: its wait and its largest causes."""
    table = waits_by_cause(timeline)
    out = []
    for task, rows in table.groupby("task", sort=False):
        shown = rows[rows["seconds"] > 0].head(top)
        causes = ", ".join(f"{r.seconds:.2f} s for {r.cause}" for r in shown.itertuples())
        more = f", and {len(rows) - len(shown)} more (see the table)" if len(rows) > len(shown) else ""
        out.append(f"{task} waited {rows['waited (s)'].iloc[0]:.2f} s: {causes}{more}")
    return out


def _factor(p: Piece, scale: Mapping[str, float], tasks: Mapping[str, Mapping[str, float]]) -> float:
    own = tasks.get(p.task, {})
    return float(own.get(p.cat, scale.get(p.cat, 1.0)))


def _arrivals(chains, prev, w: Piece, r: Piece | None) -> list[Piece]:
    """Where each task at the barrier that wait ``w`` waited at arrived: for every other task
    (``w.on``'s, if the span named them), the piece before its own wait that was under way
    when ``w`` ended (it had arrived and was waiting too), or else ``w``'s releaser (it
    arrived last). ``w``'s own arrival (``prev[w]``) comes first; a task that did not wait
    there is not at the barrier."""
    out = [prev[w]] if prev[w] is not None else []
    for task, chain in chains.items():
        if task == w.task or (w.on and task not in w.on):
            continue
        mine = [q for q in chain if q.cat == "wait" and q.start <= w.end and q.end >= w.start - _EPS]
        if mine and prev[mine[-1]] is not None:
            out.append(prev[mine[-1]])
        elif r is not None and r.task == task:
            out.append(r)
    return out


def _noticed(asked: float, allowed: float, read: float) -> float:
    """When a worker that asked for permission at ``asked`` (the first read's answer) and
    polls the clocks (:data:`lab_utils.spans.SSP_PAUSES`: pauses from 1 ms doubling to 20 ms,
    each read taking ``read`` s) sees that it may go, once it may from ``allowed``."""
    first, longest = SSP_PAUSES
    t, pause = asked, first
    while t - read / 2 < allowed:
        t += pause + read
        pause = min(2 * pause, longest)
    return t


def _check_changes(scale: dict, tasks: dict, replicas, staleness) -> None:
    for cat, f in [*scale.items(), *(i for v in tasks.values() for i in v.items())]:
        if cat == "wait":
            raise ValueError("waits are not scaled: they follow from what they wait for")
        if not (isinstance(f, (int, float)) and f >= 0):
            raise ValueError(f"a scale must be a number >= 0, got {cat}: {f!r}")
    if replicas is not None and not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas must be an int >= 1 (gradients per update), got {replicas!r}")
    if staleness is not None and not (isinstance(staleness, (int, float)) and staleness >= 0):
        raise ValueError(f"staleness must be a number >= 0 (math.inf: no bound), got {staleness!r}")


def _quorum(chains, prev, recorded) -> tuple[dict[Piece, list[Piece]], dict[str, float]]:
    """For ``replicas=``: each wait's arrivals at its barrier (its own first), and per task how
    long its waits were when it arrived last (its push, the apply, its token)."""
    arrivals: dict[Piece, list[Piece]] = {}
    last: dict[str, list[float]] = {}
    for w, r in recorded.items():
        if w.name != SSP_WAIT:
            arrivals[w] = came = [a for a in _arrivals(chains, prev, w, r) if a.end <= w.end]
            if len(came) > 1 and came[0] is prev[w] and w.start >= max(a.end for a in came):
                last.setdefault(w.task, []).append(w.seconds)
    anyone = [x for v in last.values() for x in v]
    alone = {task: statistics.median(last.get(task) or anyone) for task in chains} if anyone else {}
    return arrivals, alone


def _gates(chains, staleness: float) -> dict[Piece, tuple[Piece, list[Piece]]]:
    """For ``staleness=``: the piece after each read of the clocks, with that read and the
    other tasks' last pieces of the step each must have finished (``clock - s`` steps)."""
    import math

    ends = {task: {q.index: q for q in chain if q.index is not None} for task, chain in chains.items()}
    gates = {}
    for task, chain in chains.items():
        for i, q in enumerate(chain[:-1]):
            if q.name == SSP_ASK and q.index is not None:
                need = q.index - staleness - 1
                done = [] if need < 0 or math.isinf(need) else [e[int(need)] for k, e in ends.items() if k != task and int(need) in e]  # fmt: skip
                gates[chain[i + 1]] = (q, done)
    return gates


@dataclass
class _Replay:
    """The recorded graph replayed in the order it ran, depth first: a piece after its task's
    previous one and after what releases it (see :func:`what_if`)."""

    chains: Mapping[str, list[Piece]]
    released: dict
    scale: Mapping[str, float]
    tasks: Mapping[str, Mapping[str, float]]
    replicas: int | None = None
    arrivals: dict = field(default_factory=dict)
    alone: dict = field(default_factory=dict)
    gates: dict = field(default_factory=dict)
    dropped: set = field(default_factory=set)
    prev: dict = field(default_factory=dict)
    start: dict = field(default_factory=dict)
    end: dict = field(default_factory=dict)

    def run(self) -> None:
        entered: set[Piece] = set()  # expanded and not yet replayed: the pieces on the path being resolved
        for first in sorted((p for c in self.chains.values() for p in c), key=lambda p: (p.end, p.start)):
            stack = [first]
            while stack:
                p = stack[-1]
                if p in self.end:
                    stack.pop()
                    continue
                entered.add(p)
                needs = self._needs(p, entered)
                if any(q in entered for q in needs):
                    raise RuntimeError(f"what_if: {p.task}'s {p.name} at {p.start:.6f} depends on itself")
                if needs:
                    stack += needs
                    continue
                stack.pop()
                self._place(p)

    def _needs(self, p: Piece, entered: set) -> list[Piece]:
        r = self.released.get(p) if p.cat == "wait" else None
        if r is not None and r not in self.end and r in entered:  # a cycle within the clocks' slack: cut it
            self.released[p] = r = None
        if p in self.arrivals:
            self.arrivals[p] = [a for a in self.arrivals[p] if a in self.end or a not in entered or a is self.prev[p]]
        others = [*self.arrivals.get(p, ()), *self.gates.get(p, (None, ()))[1]]
        return [q for q in (self.prev[p], r, *others) if q is not None and q not in self.end]

    def _place(self, p: Piece) -> None:
        start = self.end[self.prev[p]] if self.prev[p] is not None else p.start
        if p in self.gates:
            ask, done = self.gates[p]
            allowed = max((self.end[q] for q in done), default=float("-inf"))
            go = _noticed(start, allowed, ask.seconds) if allowed > start else start
            if p.name == SSP_WAIT:  # the recorded wait, as long as the new bound makes it
                self.start[p], self.end[p] = start, go
                return
            start = go
        self.start[p], self.end[p] = start, self._ends(p, start)

    def _ends(self, p: Piece, start: float) -> float:
        r = self.released.get(p) if p.cat == "wait" else None
        if p in self.dropped:
            return start
        if p.cat != "wait":
            return start + p.seconds * _factor(p, self.scale, self.tasks)
        if self.arrivals.get(p):
            came = sorted(self.end[a] if a is not self.prev[p] else start for a in self.arrivals[p])
            kth = came[min(self.replicas, len(came)) - 1]
            if kth > start:  # released by another's arrival, after the latency the run had from the last
                return kth + max(0.0, p.end - max(a.end for a in self.arrivals[p]))
            return start + self.alone.get(p.task, p.seconds)  # it completes the R itself, or comes after
        if r is None:
            return start + p.seconds
        return max(start, self.end[r] + max(0.0, p.end - r.end))

    def table(self):
        """One row per task: its measured and predicted median step (steps after the first)."""
        import pandas as pd

        rows = []
        for task, chain in self.chains.items():
            by_step: dict[int, list[Piece]] = {}
            for p in chain:
                if p.index is not None:
                    by_step.setdefault(p.index, []).append(p)
            keep = sorted(by_step)[1:] or sorted(by_step)
            m = statistics.median(by_step[k][-1].end - by_step[k][0].start for k in keep)
            q = statistics.median(self.end[by_step[k][-1]] - self.start[by_step[k][0]] for k in keep)
            rows.append({"task": task, "measured step (s)": m, "predicted step (s)": q,
                         "predicted / measured": q / m if m else float("nan")})  # fmt: skip
        return pd.DataFrame(rows).set_index("task")


def what_if(
    timeline,
    scale: Mapping[str, float] | None = None,
    tasks: Mapping[str, Mapping[str, float]] | None = None,
    *,
    replicas: int | None = None,
    staleness: float | None = None,
):
    """Replay the run with each piece's duration times ``scale[cat]`` (``{"comm": 0.1}``:
    communication ten times faster; ``{"delay": 0}``: no injected delay), or ``tasks[task][cat]``
    for one task (``{"worker:1": {"delay": 0}}``). Waits are not scaled: they end when their
    own task and their releaser (replayed) allow. One row per task: its measured and predicted
    median step time (steps after the first) and their ratio; ``attrs["assumptions"]`` says what
    the replay assumes.

    Two release rules can change too:

    - ``replicas=R`` (a synchronous PS with backup workers, Lab 3): each wait at a barrier of
      N tasks (every task that waited there, or arrived last) is released by the R-th arrival,
      not the N-th, after the same latency the run had from its last arrival; a task that is
      the R-th itself, or comes after it, waits as long as its waits were when it arrived last
      (its push, the apply, its token); a sync worker's check that every token was taken
      (``token queue``, ``peers' tokens``: this course's workers make it only with R = N) is
      left out;
    - ``staleness=s`` (SSP, Lab 6; ``math.inf``: no bound): each step that read the clocks
      (``read clocks``) may start once every other task has finished ``clock - s`` steps, as
      replayed, seen by the same polling as the run's (pauses from 1 ms doubling to 20 ms);
      its recorded ``ssp wait`` is replaced. A step of a task that the run ended before it
      made cannot be replayed: the replay has only the run's steps."""
    scale, tasks = dict(scale or {}), {k: dict(v) for k, v in (tasks or {}).items()}
    _check_changes(scale, tasks, replicas, staleness)
    chains = pieces(timeline)
    recorded = releasers(chains)
    # only releases that ended by the wait's end: one within the slack after it could close a cycle
    # (that wait's task's next piece released the releaser's task's wait before it); such a wait
    # keeps its duration
    released = {w: (r if r is not None and r.end <= w.end else None) for w, r in recorded.items()}
    replay = _Replay(chains, released, scale, tasks, replicas)
    replay.prev = {p: (c[i - 1] if i else None) for c in chains.values() for i, p in enumerate(c)}
    if replicas is not None:
        replay.arrivals, replay.alone = _quorum(chains, replay.prev, recorded)
        if replicas < len(chains):  # with R < N a sync worker does not read the token queue (R = N only)
            replay.dropped = {p for c in chains.values() for p in c if p.name in TOKEN_SPANS}
    if staleness is not None:
        replay.gates = _gates(chains, staleness)
    replay.run()
    table = replay.table()
    table.attrs["assumptions"] = ASSUMPTIONS
    table.attrs["scale"] = {"all": scale, **tasks}
    table.attrs["rules"] = {k: v for k, v in (("replicas", replicas), ("staleness", staleness)) if v is not None}
    return table


# ----------------------------------------------------------------------------- seeing it

PATH_COLOR = "#111111"


def figure(timeline, steps: tuple[int, int] | None = None):
    """The timeline's Plotly figure with its critical path drawn over it: a thin black bar on
    each stretch of a task that the run's length waited on (hover: what it was)."""
    import plotly.graph_objects as go

    fig = timeline.figure(steps)
    path = _kept(critical_path(timeline), steps)
    if not path.empty:
        origin = timeline.origin()
        fig.add_trace(
            go.Bar(
                y=list(path["task"]),
                x=list(path["seconds"] * 1e3),
                base=list((path["start"] - origin) * 1e3),
                orientation="h",
                name="critical path",
                marker_color=PATH_COLOR,
                width=0.15,
                hovertext=[
                    f"critical path · {r.task}: {r.what} ({r.name}), {r.seconds * 1e3:.2f} ms"
                    for r in path.itertuples()
                ],  # fmt: skip
                hoverinfo="text",
            )
        )
    return fig


def static_figure(timeline, steps: tuple[int, int] | None = None):
    """The same, as a matplotlib figure (papermill, nbgrader, a report)."""
    from matplotlib.patches import Patch

    fig = timeline.static_figure(steps)
    ax = fig.axes[0]
    path = _kept(critical_path(timeline), steps)
    origin = timeline.origin()
    rows = {t: len(timeline.tasks) - 1 - i for i, t in enumerate(timeline.tasks)}
    for task, mine in path.groupby("task"):
        ax.broken_barh([((r.start - origin) * 1e3, r.seconds * 1e3) for r in mine.itertuples()],
                       (rows[task] - 0.07, 0.14), facecolors=PATH_COLOR)  # fmt: skip
    legend = ax.get_legend()
    handles = [*(legend.legend_handles if legend else []), Patch(color=PATH_COLOR, label="critical path")]
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


def _kept(path, steps: tuple[int, int] | None):
    if steps is None or path.empty:
        return path
    return path[path["step"].between(steps[0], steps[1])]


def show(timeline, steps: tuple[int, int] | None = None, interactive: bool | None = None) -> None:
    """The timeline with its critical path, the shares, a sentence per task that waited (its
    largest causes) and the table of waits by cause (:meth:`lab_utils.timeline.Timeline.why`)."""
    timeline.show(steps, interactive, why=True)


def show_causes(timeline) -> None:
    """A sentence per task that waited (its largest causes), and the table of waits by cause."""
    from IPython.display import display

    for line in describe_waits(timeline) or ["No task waited."]:
        print(line)
    table = waits_by_cause(timeline)
    if not table.empty:
        display(table.style.format("{:.3f}", subset=["waited (s)", "seconds"]))
