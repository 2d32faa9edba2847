"""How big a Labs 2-3 parameter-server cluster this machine holds, and that cluster (the kernel side).

:func:`fit_workers` sizes ``1 PS + N workers`` by :mod:`lab_utils.cluster.sizing`'s rule for every
kind of rank (whose :func:`task_memory`, :func:`cluster_memory` and :func:`fit_sweep` this module
hands on); :func:`ps_cluster` is the (not started)
:class:`~lab_utils.cluster.TFCluster` that :func:`lab_utils.training.ps.runs.run_ps` runs and
the Part 5 demos (:mod:`lab_utils.training.ps.demo_runs`) watch. All re-exported by
:mod:`lab_utils.training.ps.runs`. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from lab_utils.cluster import GUARD_MEMORY_BYTES, TFCluster, cluster_memory, fit_ranks, fit_sweep, task_memory
from lab_utils.cluster.netem import EmulatedHosts

__all__ = ["task_memory", "cluster_memory", "fit_workers", "fit_sweep", "ps_cluster"]


def fit_workers(
    requested: int,
    ps: int = 1,
    *,
    memory_per_task: int | None = None,
    available: int | None = None,
    cores: int | None = None,
) -> int:
    """The largest worker count <= ``requested`` that this machine allows beside ``ps`` PS
    tasks: :func:`lab_utils.cluster.fit_ranks`, the one sizing rule for every kind of rank,
    for a parameter-server cluster (its printed line calls them workers)."""
    return fit_ranks(requested, ps, memory_per_task=memory_per_task, available=available, cores=cores, kind="worker")


def ps_cluster(
    script: str | os.PathLike,
    *,
    workers: int = 2,
    args: Mapping[str, Any] | None = None,
    timeout: float | None = 600,
    progress: bool = True,
    hosts: str | Sequence[str] | EmulatedHosts | None = None,
) -> TFCluster:
    """The 1 PS + ``workers`` :class:`~lab_utils.cluster.TFCluster` that :func:`run_ps` runs
    (not started), its memory check sized by :func:`cluster_memory`. The Part 5 demos
    (:mod:`lab_utils.training.ps.demo_runs`) watch one of these instead of waiting on it."""
    return TFCluster(
        ps=1,
        workers=workers,
        script=script,
        args=dict(args or {}),
        timeout=timeout,
        progress=progress,
        # the cluster checks one figure per task: the mean of a PS's and the workers' (same total)
        memory_per_task=(cluster_memory(workers) - (workers + 1) * GUARD_MEMORY_BYTES) // (workers + 1),
        hosts=hosts,
    )
