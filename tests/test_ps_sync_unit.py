"""lab_utils.ps_sync without processes: the batch-sweep table from synthetic runs."""
from __future__ import annotations

import pandas as pd
import pytest

from lab_utils import ps_report, ps_sync


def _run(batch, exec_times, train_times):
    results = {f"worker:{i}": {"mode": "sync", "batch_size": batch, "exec_time": e, "train_time": t,
                               "accuracy": 0.9, "final_global_step": 10, "examples": 600}
               for i, (e, t) in enumerate(zip(exec_times, train_times))}
    return ps_report.PSRun(label=f"b{batch}", results=results, events=pd.DataFrame(), wall_time=1.0, started=0.0)


def test_sweep_table_adds_the_slowest_loop_time_per_batch_size():
    runs = [_run(120, [1.5, 0.9], [0.83, 0.841]), _run(10, [1.63, 1.1], [0.94, 0.952])]  # unsorted on purpose
    t = ps_sync.sweep_table(runs)
    assert list(t.columns) == ["Batch Size", "Execution Time (seconds)", ps_sync.LOOP_COLUMN]
    assert list(t["Batch Size"]) == [10, 120]
    assert list(t["Execution Time (seconds)"]) == [1.63, 1.5]
    assert list(t[ps_sync.LOOP_COLUMN]) == [0.95, 0.84]


def test_sweep_table_bad_input():
    with pytest.raises(ValueError, match="at least one run"):
        ps_sync.sweep_table([])
    with pytest.raises(ValueError, match="one run per batch size"):
        ps_sync.sweep_table([_run(10, [1.0], [0.5]), _run(10, [1.0], [0.5])])
