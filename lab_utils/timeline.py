"""Where a run's time went: one track per task, its steps and their parts.

Every training task reports its steps with :func:`lab_utils.report.step` (``started``
and the step's spans: ``compute``, ``comm``, ``wait``, ``delay``, ``eval``; what no span
covers is ``other``). When a job ends, :func:`write_trace` turns its events into a trace in
the Chrome trace-event format, ``trace.json`` in the run folder, which opens as it is in
Perfetto (https://ui.perfetto.dev, "Open trace file") or ``chrome://tracing`` ("Load"):

- one track (a trace "process") per task, ``ps:0``, ``worker:1``, ``rank:2``..., in the
  order the job names them; a task without steps (a PS serving its variables) shows one
  span while the others train, from the run's first step to the last step's end;
- each step a span ``step N`` with its parts nested inside it, clipped to the step and
  to each other: within a track nothing overlaps;
- Horovod's own timeline (``timeline.json``, written by rank 0's background thread, with
  its start time in microseconds since the epoch) merged in, shifted onto the same clock,
  and read for rank 0's parts of a step: ``NEGOTIATE_ALLREDUCE`` (waiting until every rank
  has that gradient ready) is ``wait``, ``ALLREDUCE`` is ``comm``, what comes before in the
  step is ``compute``. Other ranks get the all-reduce (it runs on every rank at once).

Clocks: every timestamp is a process's ``time.time()`` (``tf.timestamp()`` in a graph is the
same clock). The processes of a run on one machine, emulated hosts included, read one
clock; on several machines their clocks are as close as NTP keeps them.

In the kernel, :class:`Timeline` (``run.timeline()``) shows it: interactive (Plotly, whose
JavaScript JupyterLab's ``jupyterlab-plotly`` extension serves offline) where a person
watches, a static matplotlib image under papermill and nbgrader; :meth:`Timeline.summary` gives
each task's compute / communication / wait shares of its steps and how much of its
communication overlapped its own compute.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from lab_utils import horovod_trace
from lab_utils.horovod_trace import read_horovod_timeline
from lab_utils.spans import Span, collectives, steps_of

__all__ = [
    "Span",
    "Timeline",
    "write_trace",
    "load",
    "read_horovod_timeline",
    "CATEGORIES",
    "TRACE_FILE",
    "HOROVOD_FILE",
]

#: The parts of a step, in the order the summary and the legend show them.
CATEGORIES = ("compute", "comm", "wait", "delay", "other", "eval")
LABELS = {
    "compute": "compute",
    "comm": "communication",
    "wait": "waiting",
    "delay": "injected delay",
    "other": "other (input, Python)",
    "eval": "evaluation",
    "step": "step (what no part covers: input, Python)",
    "idle": "serving (no steps)",
}
COLORS = {
    "compute": "#4C78A8",
    "comm": "#F58518",
    "wait": "#E45756",
    "delay": "#B279A2",
    "other": "#BAB0AC",
    "eval": "#54A24B",
    "step": "#E8E8E8",
    "idle": "#D4D4D4",
}
#: What the figures draw, bottom up: the steps, their parts, the tasks without steps.
DRAWN = ("step", *CATEGORIES, "idle")
TRACE_FILE = "trace.json"
HOROVOD_FILE = "timeline.json"
_HOROVOD_PID = 1000  # Horovod's tensors' tracks come after the tasks'


def _idle(names: list[str], events: Sequence[Mapping], steps: list[Span]) -> list[Span]:
    """One span for each task without steps (a PS serving its variables): while the others
    train, from the run's first step to the last step's end (not its start-up or shutdown);
    in a run without steps, over its own events."""
    times: dict[str, list[float]] = {}
    ready: dict[str, list[float]] = {}
    for e in events:
        if "time" in e and e.get("task"):
            times.setdefault(str(e["task"]), []).append(float(e["time"]))
            if e.get("kind") == "ready":
                ready.setdefault(str(e["task"]), []).append(float(e["time"]))
    stepping = {s.task for s in steps}
    first = min((s.start for s in steps), default=None)
    last = max((s.end for s in steps), default=None)
    out = []
    for name in names:
        mine = times.get(name)
        if name in stepping or not mine:
            continue
        start, end = (first, last) if steps else (min(ready.get(name) or mine), max(max(t) for t in times.values()))
        out.append(Span(name, "serving" if name in ready else "running", "idle", start, max(end, start)))
    return out


@dataclass
class Timeline:
    """A run's timeline: its tasks (in track order), their steps and the steps' parts,
    Horovod's own trace where there was one (shifted onto the tasks' clock), and where the
    trace file is. Build it with :func:`write_trace` or :func:`load`."""

    tasks: list[str]
    steps: list[Span]
    parts: list[Span]
    idle: list[Span]  # tasks without steps: one span each (a PS serving)
    horovod: list[dict]
    path: Path | None = None
    label: str = ""
    overlap: dict[str, float] | None = None  # seconds of communication during compute, where it can be told

    @classmethod
    def from_events(
        cls, events: Sequence[Mapping], tasks: Sequence[str] = (), horovod: str | os.PathLike | None = None
    ) -> Timeline:
        """From a job's events (every kind); ``tasks``: the job's task names in order (a
        task that wrote no event still gets a track); ``horovod``: a Horovod timeline file."""
        names = list(dict.fromkeys([*tasks, *(str(e.get("task")) for e in events if e.get("task"))]))
        steps, parts = steps_of(events)
        parts = collectives(parts)
        overlap, hvd_trace = None, []
        if horovod is not None:
            parts, overlap, hvd_trace = horovod_trace.merge(horovod, steps, parts)
        return cls(names, steps, parts, _idle(names, events, steps), hvd_trace, overlap=overlap)

    # ---- the trace file

    def origin(self) -> float:
        starts = [s.start for s in (*self.steps, *self.idle)]
        return min(starts) if starts else 0.0

    def chrome_trace(self) -> dict:
        """The Chrome trace-event JSON object (``traceEvents``, timestamps in microseconds)."""
        origin = self.origin()
        us = lambda t: round((t - origin) * 1e6, 1)  # noqa: E731
        events: list[dict] = []
        pid = {name: i for i, name in enumerate(self.tasks)}
        for name, i in pid.items():
            events.append({"ph": "M", "name": "process_name", "pid": i, "args": {"name": name}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": i, "args": {"sort_index": i}})
            events.append({"ph": "M", "name": "thread_name", "pid": i, "tid": 0, "args": {"name": "steps"}})
        for s in sorted((*self.steps, *self.parts, *self.idle), key=lambda s: (s.start, -s.end)):
            events.append(
                {
                    "ph": "X",
                    "name": s.name,
                    "cat": s.cat,
                    "pid": pid[s.task],
                    "tid": 0,
                    "ts": us(s.start),
                    "dur": round((s.end - s.start) * 1e6, 1),
                    "args": {
                        **({"step": s.step} if s.step is not None else {}),
                        **({"on": list(s.on)} if s.on else {}),
                    },
                }
            )
        for e in self.horovod:  # Horovod's tracks: one per tensor, after the tasks'
            e = dict(e, pid=_HOROVOD_PID + int(e.get("pid", 0)))
            if "ts" in e:
                e["ts"] = round(e["ts"] - origin * 1e6, 1)
            name = (e.get("args") or {}).get("name")
            if e.get("name") == "process_name" and name and not name.startswith("horovod"):
                e["args"] = {"name": "horovod: " + name}
            elif e.get("name") == "process_name" and not name:
                e["args"] = {"name": "horovod (rank 0's view)"}
            if e.get("name") == "process_sort_index":
                e["args"] = {"sort_index": e["pid"]}
            events.append(e)
        return {
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "origin_unix_seconds": origin,
                "label": self.label,
                "overlap_seconds": self.overlap,
                "made_by": "lab_utils.timeline",
            },
        }

    def write(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.chrome_trace(), separators=(",", ":")))
        self.path = path
        return path

    # ---- checks and numbers

    def problems(self) -> list[str]:
        """What is wrong with this timeline (empty: valid): a task without a track, a part
        outside its step, two spans of one track that overlap without nesting."""
        out = []
        tracked = {s.task for s in (*self.steps, *self.idle)}
        out += [f"{t}: no track" for t in self.tasks if t not in tracked]
        by_step: dict[tuple, list[Span]] = {}
        for s in self.steps:
            by_step.setdefault((s.task, s.step), []).append(s)
        for task in self.tasks:
            mine = sorted((s for s in self.steps if s.task == task), key=lambda s: s.start)
            out += [f"{task}: {a.name} and {b.name} overlap" for a, b in pairwise(mine) if b.start < a.end - 1e-6]
            parts = sorted((p for p in self.parts if p.task == task), key=lambda p: p.start)
            out += [
                f"{task}: {a.name} and {b.name} of step {a.step} overlap"
                for a, b in pairwise(parts)
                if b.start < a.end - 1e-6
            ]
        for p in self.parts:
            owners = by_step.get((p.task, p.step), [])
            if not any(s.start - 1e-6 <= p.start and p.end <= s.end + 1e-6 for s in owners):
                out.append(f"{p.task}: {p.name} ({p.cat}) lies outside step {p.step}")
        return out

    def seconds(self) -> dict[str, dict[str, float]]:
        """Per task with steps: seconds of each category; ``step`` is the steps' total
        less their evaluations (the training time), ``other`` what no part covers."""
        out: dict[str, dict[str, float]] = {}
        for s in self.steps:
            row = out.setdefault(s.task, dict.fromkeys(("step", *CATEGORIES, "steps"), 0.0))
            row["step"] += s.seconds
            row["steps"] += 1
        for p in self.parts:
            out[p.task][p.cat if p.cat in CATEGORIES else "other"] += p.seconds
        for row in out.values():
            row["step"] -= row["eval"]
            row["other"] += max(0.0, row["step"] - sum(row[c] for c in CATEGORIES if c not in ("other", "eval")))
        return out

    def summary(self):
        """A table, one row per task with steps: steps, milliseconds per step, the share of
        the training time in each category (they add up to 1), and ``overlap``: the share
        of communication that ran while the same task computed (0 where each part is a
        blocking call; NaN where it cannot be told)."""
        import pandas as pd

        rows = []
        for task, sec in self.seconds().items():
            row = {"task": task, "steps": int(sec["steps"]), "ms/step": 1e3 * sec["step"] / max(sec["steps"], 1)}
            for cat in CATEGORIES[:-1]:
                row[LABELS[cat].split(" (")[0]] = sec[cat] / sec["step"] if sec["step"] > 0 else float("nan")
            if self.overlap is not None:  # Horovod's timeline: rank 0's view only
                seconds = self.overlap.get(task)
                row["overlap"] = seconds / sec["comm"] if seconds is not None and sec["comm"] > 0 else float("nan")
            else:  # each part a blocking call: nothing runs beside it
                row["overlap"] = 0.0 if sec["comm"] > 0 else float("nan")
            rows.append(row)
        order = {t: i for i, t in enumerate(self.tasks)}
        rows.sort(key=lambda r: order.get(r["task"], len(order)))
        return pd.DataFrame(rows).set_index("task") if rows else pd.DataFrame()

    def wait_seconds(self, task: str | None = None) -> float:
        """Seconds of ``wait`` parts (of one task, or of all)."""
        return sum(p.seconds for p in self.parts if p.cat == "wait" and (task is None or p.task == task))

    # ---- why (lab_utils.critical_path)

    def critical_path(self, step: int | None = None):
        """The chain of pieces, across tasks, that set the run's (or ``step``'s) length."""
        from lab_utils import critical_path

        return critical_path.critical_path(self, step)

    def waits_by_cause(self):
        """Every task's waits, by the task and the work they waited for."""
        from lab_utils import critical_path

        return critical_path.waits_by_cause(self)

    def why(self, steps: tuple[int, int] | None = None, interactive: bool | None = None) -> None:
        """What :meth:`show` shows, with the critical path drawn over the figure (a black line)
        and, under the shares, a sentence per task that waited and every wait by its cause."""
        self.show(steps, interactive, why=True)

    def what_if(self, scale=None, tasks=None, *, replicas=None, staleness=None):
        """The run replayed with scaled durations (or another R of N, another SSP bound):
        each task's predicted step time (:func:`lab_utils.critical_path.what_if`)."""
        from lab_utils import critical_path

        return critical_path.what_if(self, scale, tasks, replicas=replicas, staleness=staleness)

    # ---- figures

    def _bars(self, steps: tuple[int, int] | None) -> list[Span]:
        keep = (lambda s: True) if steps is None else (lambda s: s.step is not None and steps[0] <= s.step <= steps[1])
        parts = [p for p in self.parts if keep(p)]
        return [*(s for s in self.steps if keep(s)), *parts, *self.idle]

    def figure(self, steps: tuple[int, int] | None = None):
        """The interactive Plotly figure: a row per task, each step a grey bar with its
        parts drawn over it, a hover per span; ``steps=(first, last)`` keeps those steps."""
        import plotly.graph_objects as go

        origin = self.origin()
        fig = go.Figure()
        bars = self._bars(steps)
        for cat in DRAWN:
            mine = [s for s in bars if s.cat == cat]
            if not mine:
                continue
            fig.add_trace(
                go.Bar(
                    y=[s.task for s in mine],
                    x=[s.seconds * 1e3 for s in mine],
                    base=[(s.start - origin) * 1e3 for s in mine],
                    orientation="h",
                    name=LABELS[cat],
                    marker_color=COLORS[cat],
                    width=0.6 if cat in CATEGORIES else 0.8,
                    hovertext=[
                        f"{s.task} · {s.name}"
                        + (f" ({LABELS[cat]})" if cat in CATEGORIES else "")
                        + f": {s.seconds * 1e3:.2f} ms"
                        for s in mine
                    ],
                    hoverinfo="text",
                )
            )
        fig.update_layout(
            barmode="overlay",
            title=self.label or None,
            xaxis_title="milliseconds since the run's first step",
            yaxis={"categoryorder": "array", "categoryarray": list(reversed(self.tasks)), "title": None},
            height=160 + 45 * len(self.tasks),
            margin={"l": 10, "r": 10, "t": 40 if self.label else 10, "b": 40},
            legend={"orientation": "h", "y": -0.25},
        )
        return fig

    def static_figure(self, steps: tuple[int, int] | None = None):
        """The same timeline as a matplotlib figure (papermill, nbgrader, a report)."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch

        origin = self.origin()
        fig, ax = plt.subplots(figsize=(10, 1.2 + 0.5 * len(self.tasks)))
        rows = {t: len(self.tasks) - 1 - i for i, t in enumerate(self.tasks)}
        used = []
        for cat in DRAWN:
            mine = [s for s in self._bars(steps) if s.cat == cat]
            if not mine:
                continue
            used.append(cat)
            for task in {s.task for s in mine}:
                height = 0.6 if cat in CATEGORIES else 0.8
                ax.broken_barh(
                    [((s.start - origin) * 1e3, s.seconds * 1e3) for s in mine if s.task == task],
                    (rows[task] - height / 2, height),
                    facecolors=COLORS[cat],
                )
        ax.set_yticks(list(rows.values()), list(rows))
        ax.set_xlabel("milliseconds since the run's first step")
        ax.legend(
            handles=[Patch(color=COLORS[c], label=LABELS[c]) for c in used],
            loc="center left",
            bbox_to_anchor=(1.01, 0.5),
            frameon=False,
        )
        if self.label:
            ax.set_title(self.label)
        fig.tight_layout()
        return fig

    def how_to_open(self) -> str:
        where = f"{self.path}" if self.path else "the run folder's trace.json"
        return (
            f"The trace: {where}. It opens as it is in Perfetto (https://ui.perfetto.dev, 'Open trace file') "
            "or in Chrome's chrome://tracing ('Load'): W/S zoom, A/D pan."
        )

    def show(self, steps: tuple[int, int] | None = None, interactive: bool | None = None, why: bool = False) -> None:
        """Display the figure (interactive where a person watches, else a static image),
        the summary table and where the trace file is; ``why``: see :meth:`why`."""
        from IPython.display import display

        from lab_utils import critical_path
        from lab_utils.display import is_headless

        if interactive is None:
            interactive = not is_headless()
        if interactive:
            (critical_path.figure(self, steps) if why else self.figure(steps)).show(renderer="plotly_mimetype")
        else:
            import matplotlib.pyplot as plt

            fig = critical_path.static_figure(self, steps) if why else self.static_figure(steps)
            display(fig)
            plt.close(fig)
        table = self.summary()
        shares = [c for c in table.columns if c not in ("steps", "ms/step")]
        display(table.style.format("{:.1%}", subset=shares).format("{:.2f}", subset=["ms/step"]))
        if why:
            critical_path.show_causes(self)
        print(self.how_to_open())

    def _ipython_display_(self) -> None:
        self.show()

    def __repr__(self) -> str:
        return f"<Timeline {self.label!r}: {len(self.tasks)} tasks, {len(self.steps)} steps, {len(self.parts)} parts>"


# ----------------------------------------------------------------------------- files


def write_trace(
    run_dir: str | os.PathLike, events: Sequence[Mapping], tasks: Sequence[str] = (), label: str = ""
) -> Timeline:
    """The timeline of a finished job from its events (and ``timeline.json``, Horovod's, if
    the run folder holds one), written to ``<run_dir>/trace.json``."""
    run_dir = Path(run_dir)
    timeline = Timeline.from_events(events, tasks, horovod=run_dir / HOROVOD_FILE)
    timeline.label = label
    timeline.write(run_dir / TRACE_FILE)
    return timeline


def load(path: str | os.PathLike, label: str = "") -> Timeline:
    """A timeline back from its ``trace.json`` (or the run folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / TRACE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no timeline at {path}: runs write one when they finish")
    trace = json.loads(path.read_text())
    origin = float(trace.get("otherData", {}).get("origin_unix_seconds", 0.0))
    names: dict[int, str] = {}
    steps, parts, idle, horovod = [], [], [], []
    for e in trace["traceEvents"]:
        if e.get("pid", 0) >= _HOROVOD_PID:  # back onto Horovod's own numbering and the epoch
            horovod.append(
                dict(e, pid=e["pid"] - _HOROVOD_PID, **({"ts": e["ts"] + origin * 1e6} if "ts" in e else {}))
            )
            continue
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
        elif e.get("ph") == "X":
            start = origin + e["ts"] / 1e6
            args = e.get("args", {})
            s = Span(names[e["pid"]], e["name"], e["cat"], start, start + e["dur"] / 1e6, args.get("step"),
                     tuple(args.get("on", ())))  # fmt: skip
            (steps if s.cat == "step" else idle if s.cat == "idle" else parts).append(s)
    other = trace.get("otherData", {})
    tasks = [names[i] for i in sorted(names)]
    return Timeline(
        tasks, steps, parts, idle, horovod, path, label or other.get("label", ""), other.get("overlap_seconds")
    )
