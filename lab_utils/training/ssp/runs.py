"""Stale-synchronous parallel from a notebook (Lab 6): runs for several bounds, the bound check, figures.

A Lab 6 run is a Lab 2-3 parameter-server run in ``mode="ssp"``
(:mod:`lab_utils.training.ssp` on the task side), launched by
:func:`lab_utils.training.ps.runs.run_ps` and returned as a
:class:`~lab_utils.training.ps.runs.PSRun`. This module adds what is particular to SSP:

* :func:`run_ssp` / :func:`sweep_bounds`: one run per staleness bound s (default
  :data:`BOUNDS`: 0, 1, 4 and no bound), with the same straggler in each;
* :func:`check_bound`: every step of a run whose events show the bound broken (or
  cannot show it was kept); an empty table means it held at every step;
* :func:`staleness_table` (per worker), :func:`compare` (one row per bound:
  wall time, accuracy, staleness, time spent waiting, the straggler's measured extra
  time per step: :func:`straggler_extra`), :func:`staleness_counts`;
* :func:`plot_staleness` (the staleness distribution per bound) and
  :func:`plot_progress` (each worker's clock against time). Accuracy against time
  is :func:`lab_utils.training.ps.runs.plot_accuracy` with ``x="time"``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lab_utils import checks
from lab_utils.training.ps.runs import PSRun, run_ps
from lab_utils.training.ps.settings import parse_staleness

__all__ = [
    "BOUNDS",
    "EVENT_FIELDS",
    "bound_label",
    "bound_of",
    "run_ssp",
    "sweep_bounds",
    "check_bound",
    "staleness_table",
    "straggler_extra",
    "compare",
    "staleness_counts",
    "plot_staleness",
    "plot_progress",
]

#: The bounds the lab compares: lockstep (like BSP), 1, 4 and no bound (ASP).
BOUNDS = (0, 1, 4, math.inf)
#: The fields every step event of an SSP run carries (besides ``task`` and ``local_step``).
EVENT_FIELDS = ("clock", "min_clock", "staleness", "wait")
VIOLATION_COLUMNS = ["task", "local_step", "clock", "min_clock", "staleness", "problem"]


def bound_label(s: int | float | str) -> str:
    """``"s=1"``, ``"s=∞"``."""
    s = parse_staleness(s)
    return "s=∞" if s == math.inf else f"s={s}"


def bound_of(run: PSRun) -> int | float:
    """The staleness bound a run was made with (from its chief's result)."""
    chief = run.results.get("worker:0") or next(iter(run.results.values()), {})
    if "staleness_bound" not in chief:
        raise ValueError(f"{run.label!r} is a {run.mode!r} run, not an SSP run: it has no staleness bound")
    return parse_staleness(str(chief["staleness_bound"]))


def run_ssp(
    script: str | os.PathLike,
    staleness: int | float | str,
    *,
    workers: int = 2,
    args: Mapping[str, Any] | None = None,
    label: str | None = None,
    **kwargs: Any,
) -> PSRun:
    """One SSP run of ``script`` (a ``train_ssp.py``) with bound ``staleness`` (an int
    >= 0, or ``math.inf`` / -1 / ``"inf"`` for no bound): :func:`~lab_utils.training.ps.runs.run_ps`
    with ``--staleness`` added to ``args``; ``kwargs`` go to ``run_ps`` (``monitor``,
    ``timeout``, ``progress``, ...). The bound is checked before anything starts."""
    s = parse_staleness(staleness)
    run_args = {**dict(args or {}), "staleness": "inf" if s == math.inf else s}
    straggler = run_args.get("straggler")
    name = label or f"SSP {bound_label(s)}" + (f", straggler {straggler}" if straggler else "")
    return run_ps(script, workers=workers, args=run_args, label=name, **kwargs)


def sweep_bounds(
    script: str | os.PathLike,
    bounds: Iterable[int | float | str] = BOUNDS,
    *,
    workers: int = 2,
    args: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[int | float, PSRun]:
    """:func:`run_ssp` once per bound, in order, with the same ``args`` (e.g. the same
    straggler): ``{s: run}``. Every bound is checked before the first run starts."""
    checked = [parse_staleness(s) for s in bounds]
    if not checked:
        raise ValueError("sweep needs at least one staleness bound, got none")
    if len(set(checked)) != len(checked):
        raise ValueError(f"each bound once, got {[bound_label(s) for s in checked]}")
    return {s: run_ssp(script, s, workers=workers, args=args, **kwargs) for s in checked}


# ----------------------------------------------------------------------------- the check


def _frame(events: pd.DataFrame | Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    frame = events if isinstance(events, pd.DataFrame) else pd.DataFrame.from_records(list(events))
    if frame.empty:
        raise ValueError("no step events: nothing shows that the bound was kept")
    needed = ["task", "local_step", "clock", "min_clock"]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise ValueError(
            f"the step events have no {', '.join(missing)} (they have {', '.join(map(str, frame.columns))}): "
            "only the step events of a mode='ssp' run carry the clocks"
        )
    return frame


def _row(e: Mapping[str, Any], problem: str) -> dict:
    clock, low = e.get("clock"), e.get("min_clock")
    known = clock is not None and low is not None and not (pd.isna(clock) or pd.isna(low))
    return {
        "task": e["task"],
        "local_step": int(e["local_step"]),
        "clock": int(clock) if known else None,
        "min_clock": int(low) if known else None,
        "staleness": int(clock) - int(low) if known else None,
        "problem": problem,
    }


def _step_problems(e: Mapping[str, Any], s: int | float) -> list[str]:
    clock, low, local = e["clock"], e["min_clock"], e["local_step"]
    if pd.isna(clock) or pd.isna(low):
        return ["no clock in this step event"]
    clock, low, local = int(clock), int(low), int(local)
    out = []
    if clock - low > s:
        out.append(f"started at clock {clock} while a worker had finished only {low} steps: {clock - low} > s={s}")
    if low > clock:
        out.append(f"min clock {low} above its own clock {clock} (its own clock is one of those read)")
    if clock != local - 1:
        out.append(f"clock {clock} at local step {local}: a worker's clock is the steps it finished ({local - 1})")
    return out


def _sequence_problems(part: pd.DataFrame) -> list[tuple[Mapping[str, Any], str]]:
    out = []
    previous = None
    for _, e in part.iterrows():
        local = int(e["local_step"])
        expected = 1 if previous is None else int(previous["local_step"]) + 1
        if local != expected:
            out.append((e, f"local step {local} after {expected - 1}: step events missing or repeated"))
        if previous is not None and not pd.isna(e["min_clock"]) and not pd.isna(previous["min_clock"]):
            if int(e["min_clock"]) < int(previous["min_clock"]):
                out.append((e, f"min clock went down from {int(previous['min_clock'])} to {int(e['min_clock'])}"))
        previous = e
    return out


def check_bound(events: pd.DataFrame | Iterable[Mapping[str, Any]], s: int | float | str) -> pd.DataFrame:
    """The steps whose events show the staleness bound ``s`` broken, or cannot show it kept.

    ``events``: a run's step events (``PSRun.events``, or a list of event dicts).
    Each step of an SSP run records the worker's clock when it started and the
    smallest clock it had read from the PS; since clocks only go up, every worker
    had then finished at least ``min_clock`` steps. Flagged, one row per problem:

    * ``clock - min_clock > s``: the worker started more than ``s`` steps ahead;
    * ``min_clock > clock`` or ``clock != local_step - 1``: records that cannot be right;
    * per worker, local steps that are not ``1, 2, 3, ...`` (missing or repeated
      events) and a min clock that goes down.

    Returns a DataFrame with columns ``task, local_step, clock, min_clock, staleness,
    problem``: empty when the bound held at every step. Raises ValueError when the
    events are empty or carry no clocks (not an SSP run)."""
    bound = parse_staleness(s)
    frame = _frame(events).sort_values(["task", "local_step"], kind="stable")
    rows = [_row(e, p) for _, e in frame.iterrows() for p in _step_problems(e, bound)]
    for _, part in frame.groupby("task", sort=True):
        rows += [_row(e, p) for e, p in _sequence_problems(part)]
    out = pd.DataFrame(rows, columns=VIOLATION_COLUMNS)
    return out.sort_values(["task", "local_step"], kind="stable").reset_index(drop=True)


# ----------------------------------------------------------------------------- tables


def staleness_table(run: PSRun) -> pd.DataFrame:
    """One row per worker of an SSP run: local steps, staleness (steps ahead of the
    slowest worker when a step started) mean and max, time spent waiting for
    permission, the straggler delay it was given."""
    frame = _frame(run.events)
    rows = []
    for task, part in frame.groupby("task", sort=True):
        r = run.results.get(task, {})
        rows.append(
            {
                "task": task,
                "local steps": len(part),
                "staleness mean": float(part["staleness"].mean()),
                "staleness max": int(part["staleness"].max()),
                "wait (s)": float(part["wait"].sum()) if "wait" in part else float("nan"),
                "train time (s)": r.get("train_time", float("nan")),
                "straggler delay (s/step)": r.get("straggler_delay", 0.0),
            }
        )
    return pd.DataFrame(rows).set_index("task")


def _work_per_step(part: pd.DataFrame) -> float:
    """A worker's own time per step: the intervals between its step events (steps tile its
    loop) less the time each step waited for permission; its first step (no interval) is
    left out. NaN with fewer than two steps."""
    part = part.sort_values("local_step")
    spans = part["time"].diff().iloc[1:] - part["wait"].iloc[1:]
    return float(spans.mean()) if len(spans) else float("nan")


def straggler_extra(run: PSRun) -> float:
    """How much longer the straggler's steps took than the other workers' own work, in
    seconds per step, measured from the step events: its time per step, less the mean of
    the others' (each less its waits for permission). The ``delay`` it was given, plus
    what the machine added (a sleep that wakes late on a busy machine, a slower step):
    the time each of its steps keeps a fast worker waiting. 0.0 for a run without a
    straggler; NaN when a worker has fewer than two steps."""
    frame = _frame(run.events)
    if "time" not in frame.columns:
        raise ValueError("the step events have no time: the run's events were not read from its tasks")
    slow = [t for t, r in run.results.items() if r.get("straggler_delay", 0.0) > 0]
    if not slow:
        return 0.0
    if "wait" not in frame.columns:
        frame = frame.assign(wait=0.0)
    work = {task: _work_per_step(part) for task, part in frame.groupby("task", sort=True)}
    others = [v for task, v in work.items() if task not in slow]
    if not others:
        return float("nan")
    return float(np.mean([work.get(t, float("nan")) for t in slow]) - np.mean(others))


def _time_to(run: PSRun, target: float) -> float:
    curve = run.accuracy_curve()
    reached = curve[curve["accuracy"] >= target]
    return float(reached["time"].iloc[0]) if len(reached) else float("nan")


def compare(runs: Iterable[PSRun], target_accuracy: float | None = None) -> pd.DataFrame:
    """One row per SSP run: its bound, wall time, the slowest worker's training-loop
    time, test accuracy, global steps, local steps per worker, staleness mean and max
    over every step, seconds every worker spent waiting, the straggler's measured extra
    time per step (:func:`straggler_extra`), and the :func:`check_bound` violations.
    With ``target_accuracy``, also the seconds from launch until the chief
    first measured it (NaN: never)."""
    rows = []
    for run in runs:
        s = bound_of(run)
        frame = _frame(run.events)
        per_worker = staleness_table(run)
        row = {
            "run": run.label,
            "s": bound_label(s),
            "wall time (s)": run.wall_time,
            "train time (s)": max(r["train_time"] for r in run.results.values()),
            "test accuracy": run.accuracy,
            "global steps": run.final_global_step,
            "local steps": " / ".join(str(v) for v in per_worker["local steps"]),
            "staleness mean": float(frame["staleness"].mean()),
            "staleness max": int(frame["staleness"].max()),
            "wait (s)": float(per_worker["wait (s)"].sum()),
            "straggler extra (s/step)": straggler_extra(run),
            "violations": len(check_bound(frame, s)),
        }
        if target_accuracy is not None:
            row[f"time to {target_accuracy:g} (s)"] = _time_to(run, target_accuracy)
        rows.append(row)
    if not rows:
        raise ValueError("compare needs at least one run, got none")
    return pd.DataFrame(rows).set_index("run")


def staleness_counts(runs: Iterable[PSRun], top: int = 10) -> pd.DataFrame:
    """The staleness distribution: steps per staleness value (rows ``0 .. top``, then
    ``">top"`` for all larger ones) for each run's bound (columns ``s=0``, ``s=1``, ...),
    every worker's steps together."""
    checks.count("top", top, low=0)
    columns = {}
    for run in runs:
        values = _frame(run.events)["staleness"].astype(int)
        counts = values[values <= top].value_counts().reindex(range(top + 1), fill_value=0)
        columns[bound_label(bound_of(run))] = [*counts, int((values > top).sum())]
    if not columns:
        raise ValueError("staleness_counts needs at least one run, got none")
    out = pd.DataFrame(columns, index=[*range(top + 1), f">{top}"])
    out.index.name = "staleness"
    return out


# ----------------------------------------------------------------------------- figures


def _plt():
    import matplotlib.pyplot as plt

    return plt


def _panels(runs: Sequence[PSRun], what: str, title: str, draw, xlabel: str, ylabel: str):
    """One panel per run, titled with its bound: ``draw(ax, run, s, frame)`` fills it."""
    runs = list(runs)
    if not runs:
        raise ValueError(f"{what} needs at least one run, got none")
    fig, axes = _plt().subplots(1, len(runs), figsize=(3.2 * len(runs) + 0.6, 3.2), squeeze=False)
    fig.suptitle(title)
    for ax, run in zip(axes[0], runs, strict=True):
        s = bound_of(run)
        draw(ax, run, s, _frame(run.events))
        ax.set_title(bound_label(s))
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def _staleness_bars(ax, frame: pd.DataFrame, s: int | float) -> None:
    """One bar per staleness value and worker (side by side); 40 bins when the values spread wide."""
    from matplotlib.ticker import MaxNLocator

    groups = list(frame.groupby("task", sort=True))
    top = max(int(frame["staleness"].max()), 0 if s == math.inf else int(s))
    if top > 40:
        for task, part in groups:
            weights = np.full(len(part), 1.0 / len(part))
            ax.hist(part["staleness"], bins=40, range=(-0.5, top + 0.5), weights=weights, alpha=0.6, label=task)
        return
    width = 0.8 / len(groups)
    for k, (task, part) in enumerate(groups):
        fraction = part["staleness"].astype(int).value_counts(normalize=True).reindex(range(top + 1), fill_value=0)
        ax.bar(np.arange(top + 1) - 0.4 + width * (k + 0.5), fraction.values, width=width, label=task)
    ax.set_xlim(-0.6, top + 0.6)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))


def _draw_staleness(ax, run: PSRun, s: int | float, frame: pd.DataFrame) -> None:
    _staleness_bars(ax, frame, s)
    if s != math.inf:
        ax.axvline(s + 0.5, color="k", linestyle="--", linewidth=1, label=f"bound {bound_label(s)}")


def plot_staleness(runs: Sequence[PSRun]):
    """The staleness distribution of each run (one panel per bound, one colour per
    worker): the fraction of a worker's steps that started that many steps ahead of
    the slowest worker. A dashed line marks a finite bound."""
    return _panels(
        runs,
        "plot_staleness",
        "Staleness when a step started (steps ahead of the slowest worker)",
        _draw_staleness,
        "staleness (steps)",
        "fraction of the worker's steps",
    )


def _draw_progress(ax, run: PSRun, s: int | float, frame: pd.DataFrame) -> None:
    for task, part in frame.groupby("task", sort=True):
        ax.plot(part["time"] - run.started, part["clock"] + 1, drawstyle="steps-post", label=task)


def plot_progress(runs: Sequence[PSRun]):
    """Each worker's clock (steps finished) against seconds since launch, one panel
    per run: lockstep at s=0, a fast worker pulling away without a bound."""
    return _panels(
        runs,
        "plot_progress",
        "Clocks: steps finished by each worker",
        _draw_progress,
        "seconds since launch",
        "clock (steps finished)",
    )
