"""dstat-like metrics per role (PS, worker i, rank i), aligned with training steps.

The seeds' analyses (async vs sync, PS vs workers, batch sizes, AlexNet tables)
rest on dstat: CPU, memory and network per node. This package gives students the
same numbers per *task* of a local cluster, with history, from the notebook::

    from lab_utils.metrics import Monitor

    with TFCluster(ps=1, workers=2, script="train_async.py") as cluster, \\
         Monitor(cluster=cluster, interval=1.0) as mon:
        mon.live()                  # in JupyterLab: a figure updated in place
        cluster.wait()
    mon.summary()                   # the seeds' table: Peak Mem, Peak CPU, Network R/W, Examples/s, s/batch
    mon.frame()                     # tidy: time, role, task, metric, value
    mon.to_csv("metrics.csv")
    mon.plot()                      # throughput/accuracy, CPU, memory, network on one time axis

Without a cluster: ``Monitor(tasks={"ps:0": pid, "worker:0": pid2}, events="run_dir/")``.
In a terminal: ``python -m lab_utils.metrics --interval 1 [--count N] [--task worker:0=PID]``.

Modules: ``sampler`` (metric declarations, one sample of the tasks' process
trees, the host and the GPU), ``tables`` (events -> frames, the summary table),
``monitor`` (the sampling thread, bounded history, live/static view),
``__main__`` (the terminal view). Figures are drawn by :mod:`lab_utils.plots`.
"""

from __future__ import annotations

import importlib

from lab_utils.metrics.monitor import Monitor, watch
from lab_utils.metrics.sampler import (
    MAX_INTERVAL,
    METRICS,
    MIN_INTERVAL,
    ROLES,
    Metric,
    Sampler,
    netns_counters,
    role_of,
    validate_interval,
)
from lab_utils.metrics.tables import SUMMARY_COLUMNS, SUMMARY_UNITS, events_frame, summary_table

__all__ = [
    "Metric",
    "METRICS",
    "ROLES",
    "MIN_INTERVAL",
    "MAX_INTERVAL",
    "Sampler",
    "Monitor",
    "watch",
    "events_frame",
    "summary_table",
    "SUMMARY_COLUMNS",
    "SUMMARY_UNITS",
    "validate_interval",
    "role_of",
    "netns_counters",
    "main",
]


def __getattr__(name):
    # ``main`` lives in __main__.py; imported on first use so that
    # ``python -m lab_utils.metrics`` does not import that module twice.
    if name == "main":
        return importlib.import_module("lab_utils.metrics.__main__").main
    raise AttributeError(f"module 'lab_utils.metrics' has no attribute {name!r}")
