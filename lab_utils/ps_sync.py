"""Lab 3 helpers on top of :mod:`lab_utils.ps_report` (introduced in Lab 3, Part 3).

:func:`sweep_table` is the CS 744 Table 3/4 form (``Batch Size``, ``Execution
Time (seconds)``, from :func:`lab_utils.ps_report.exec_time_table`) plus the
slowest worker's *training loop* time. On a laptop-sized run the execution time
(graph built -> session closed, the report's definition) carries a fixed
start/stop cost of a few tenths of a second (the chief's model initialisation,
the workers' readiness poll and, in sync mode, the chief session's stop grace
period for its blocked queue-runner thread). The loop column shows the part that
scales with the number of steps, which is what the report's 1/B and flat trends
are about.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from lab_utils import ps_report

__all__ = ["sweep_table"]

LOOP_COLUMN = "Training Loop (seconds)"


def sweep_table(runs: Sequence[ps_report.PSRun]) -> pd.DataFrame:
    """One row per batch size: CS 744's execution time and the training-loop time
    (both the slowest worker's, in seconds, rounded to 0.01)."""
    if not runs:
        raise ValueError("sweep_table needs at least one run, got none")
    sizes = [r.batch_size for r in runs]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"one run per batch size expected, got batch sizes {sizes}")
    table = ps_report.exec_time_table(runs)
    loop = {r.batch_size: round(max(w["train_time"] for w in r.results.values()), 2) for r in runs}
    table[LOOP_COLUMN] = table["Batch Size"].map(loop)
    return table
