"""How big a Labs 2-3 parameter-server cluster this machine holds, and that cluster (the kernel side).

:func:`task_memory` and :func:`cluster_memory` say what ``1 PS + N workers`` need;
:func:`fit_workers` and :func:`fit_sweep` scale a run or a sweep to the memory and cores
this session may use; :func:`ps_cluster` is the (not started)
:class:`~lab_utils.cluster.TFCluster` that :func:`lab_utils.training.ps.runs.run_ps` runs and
the Part 5 demos (:mod:`lab_utils.training.ps.demo_runs`) watch. All re-exported by
:mod:`lab_utils.training.ps.runs`. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from lab_utils import checks
from lab_utils.cluster import (
    GUARD_MEMORY_BYTES,
    TF_TASK_MEMORY_BYTES,
    TFCluster,
    fit_count,
    nothing_fits,
)
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.resources import available_memory_bytes, usable_cores

__all__ = ["WORKERS_PER_CORE", "task_memory", "cluster_memory", "fit_workers", "fit_sweep", "ps_cluster"]

#: Most workers per usable core before the cluster is scaled down: beyond two, the
#: tasks only take turns on the CPU and the run measures the scheduler, not the PS.
WORKERS_PER_CORE = 2
MB = 1024**2


def task_memory(role: str = "worker") -> int:
    """Memory one task of a Labs 2-3 cluster needs: TensorFlow and its server
    (:data:`~lab_utils.cluster.TF_TASK_MEMORY_BYTES`); a worker also holds the MNIST it
    loads of its own (:func:`lab_utils.data.mnist_bytes` ``raw=True``: the full set's test images
    as float32, 0.03 GB; its uint8 images are mapped from the data cache and counted once per
    cluster by :func:`cluster_memory`; 0.02 GB offline).
    A PS holds the variables only (measured with the full set: a PS 0.25 GB of its own
    memory; a worker 0.47 GB when it held the set as float32)."""
    from lab_utils.data import mnist_bytes

    if role not in ("ps", "worker"):
        raise ValueError(f"role must be 'ps' or 'worker', got {role!r}")
    return TF_TASK_MEMORY_BYTES + (mnist_bytes(raw=True) if role == "worker" else 0)


def _mapped_data(workers: int, memory_per_task: int | None) -> int:
    """The MNIST bytes a cluster's workers map from the data cache, counted once for them all
    (:func:`lab_utils.data.mnist_shared_bytes`); none when a figure per task is given instead."""
    from lab_utils.data import mnist_shared_bytes

    return mnist_shared_bytes() if workers and memory_per_task is None else 0


def cluster_memory(workers: int, ps: int = 1, *, memory_per_task: int | None = None) -> int:
    """Memory ``ps`` PS tasks and ``workers`` workers need, their guards included
    (``memory_per_task``: a worker's, instead of :func:`task_memory`), and once for them all
    the MNIST bytes the workers map from the data cache (:func:`_mapped_data`)."""
    worker = task_memory("worker") if memory_per_task is None else memory_per_task
    own = ps * (task_memory("ps") + GUARD_MEMORY_BYTES) + workers * (worker + GUARD_MEMORY_BYTES)
    return own + _mapped_data(workers, memory_per_task)


def fit_workers(
    requested: int,
    ps: int = 1,
    *,
    memory_per_task: int | None = None,
    available: int | None = None,
    cores: int | None = None,
) -> int:
    """The largest worker count <= ``requested`` that this machine allows.

    Memory: :func:`cluster_memory` (each PS: TensorFlow; each worker: TensorFlow and the
    MNIST it loads, or ``memory_per_task``) must fit in the memory available under this
    session's limit (cgroup / JupyterHub ``MEM_LIMIT``,
    :func:`lab_utils.resources.available_memory_bytes`). Cores: at most
    :data:`WORKERS_PER_CORE` workers per usable core. Prints one line when it
    scales down; raises :class:`ResourceError` when not even one worker fits."""
    checks.count("requested workers", requested)
    shared = _mapped_data(1, memory_per_task)  # counted once, with the PS
    per_worker = cluster_memory(1, 0, memory_per_task=memory_per_task) - shared
    fixed = cluster_memory(0, ps) + shared
    avail = available_memory_bytes() if available is None else available
    cores = usable_cores() if cores is None else cores
    by_memory = fit_count(requested, lambda n: fixed + n * per_worker, available=avail)
    what = f"{ps} PS + 1 worker" if ps else "1 worker"
    per_ps = f"about {cluster_memory(0, ps) / ps / MB:.0f} MB per PS and " if ps else "about "
    if by_memory < 1:
        raise nothing_fits(f"not even {what} fits: {'they need' if ps else 'it needs'}", fixed + per_worker, avail)
    by_cores = max(1, WORKERS_PER_CORE * cores)
    fit = min(requested, by_memory, by_cores)
    if fit < requested:
        why = []
        if by_memory < requested:
            why.append(f"memory: {avail / MB:,.0f} MB available, {per_ps}{per_worker / MB:.0f} MB per worker")
        if by_cores < requested:
            why.append(f"cores: {cores} usable, at most {WORKERS_PER_CORE} workers per core")
        print(f"[lab_utils] {requested} workers do not fit here ({'; '.join(why)}): using {fit}", flush=True)
    return fit


def fit_sweep(
    sizes: Sequence[int],
    ps: int = 1,
    *,
    memory_per_task: int | None = None,
    available: int | None = None,
) -> list[int]:
    """The worker counts of a sweep (``sizes``: Lab 4's Part D runs 1 PS + n workers for
    each n) whose cluster fits the memory available now, by :func:`cluster_memory`, in the
    order given. Prints one line naming those left out (a slow machine's limit: Binder's
    2 GB holds 1 PS + 3 full-MNIST workers beside the kernel, not 4); raises
    :class:`ResourceError` when none fits. Cores are not counted: a sweep shows what happens
    past them (its oversubscribed points are marked)."""
    sizes = checks.counts("sizes", sizes)
    avail = available_memory_bytes() if available is None else available
    keep = [n for n in sizes if cluster_memory(n, ps, memory_per_task=memory_per_task) <= avail]
    dropped = [n for n in sizes if n not in keep]
    if dropped:
        first = min(dropped)
        need = cluster_memory(first, ps, memory_per_task=memory_per_task)
        workers = f"{first} worker{'s' if first > 1 else ''}"
        what = f"{ps} PS + {workers}" if ps else workers
        if not keep:
            raise nothing_fits(f"no size of this sweep fits: {what} need", need, avail)
        print(
            f"[lab_utils] {', '.join(map(str, dropped))} workers do not fit here ({what} need about "
            f"{need / MB:,.0f} MB, {avail / MB:,.0f} MB available): the sweep runs {', '.join(map(str, keep))}",
            flush=True,
        )
    return keep


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
