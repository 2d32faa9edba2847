"""The speedup table every scaling experiment ends with (kernel side), written once.

:func:`scaling_table` takes any runs: it reads what every run answers (its ``method``,
``size`` and ``examples_per_sec``: :data:`lab_utils.training.runs.ANSWERS`), Lab 4's
all-reduce and PS runs and Lab 5's device runs alike.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from lab_utils import plots
from lab_utils.resources import usable_cores

COLUMNS = ["method", "workers", "examples/s", "speedup", "efficiency", "oversubscribed"]


def _row(run: Any, labels: Mapping[str, str]) -> dict:
    processes = run.size + (1 if run.method.startswith("PS") else 0)  # the PS task is a process too
    return {
        "method": labels.get(run.method, run.method),
        "workers": run.size,
        "examples/s": run.examples_per_sec,
        "processes": processes,
    }


def scaling_table(runs: Sequence[Any], baseline: Any = None, labels: Mapping[str, str] | None = None) -> pd.DataFrame:
    """One row per run: method, workers (ranks, devices), examples/s, speedup, efficiency
    (speedup / workers) and ``oversubscribed`` (more processes or devices than usable cores).

    - No ``baseline`` (Lab 4): each method's speedup is over its own smallest run, scaled by
      that run's workers (a method measured from 2 workers starts at speedup 2).
    - A ``baseline`` run (Lab 5: the single-device run): every speedup is over it, and each
      method's line starts from it at 1 worker.

    Runs whose ``examples_per_sec`` is NaN (out of memory) are left out. ``labels`` renames
    methods. ``attrs["usable_cores"]`` holds the core count."""
    labels = labels or {}
    rows = [_row(r, labels) for r in runs if not math.isnan(r.examples_per_sec)]
    if baseline is not None:
        base = baseline.examples_per_sec
        for method in {row["method"] for row in rows}:
            if not any(row["method"] == method and row["workers"] == 1 for row in rows):
                rows.append({"method": method, "workers": 1, "examples/s": base, "processes": 1})
    table = pd.DataFrame(rows)
    if baseline is not None:
        table = table.sort_values(["method", "workers"], ignore_index=True)
        table["speedup"] = table["examples/s"] / base
    else:
        first = {m: g.loc[g["workers"].idxmin()] for m, g in table.groupby("method")}
        table["speedup"] = [
            row["examples/s"] / first[row["method"]]["examples/s"] * first[row["method"]]["workers"]
            for _, row in table.iterrows()
        ]
    cores = usable_cores()
    table["efficiency"] = table["speedup"] / table["workers"]
    table["oversubscribed"] = table["processes"] > cores
    table.attrs["usable_cores"] = cores
    return table[COLUMNS]


def plot_scaling(table: pd.DataFrame, title: str | None = None):
    """Speedup against workers, with the ideal line (:func:`lab_utils.plots.speedup_curves`)."""
    return plots.speedup_curves(table, title=title or "scaling: parameter server vs all-reduce")
