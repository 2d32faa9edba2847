"""How many ranks of any kind this session holds: Horovod and MPI ranks, MWMS workers, and
a parameter-server cluster's workers beside its PS tasks (the notebook side).

:func:`task_memory` and :func:`cluster_memory` are the course's memory model of a TensorFlow
task (a rank or worker holds MNIST of its own, a PS only the variables); :func:`fit_ranks` and
:func:`fit_sweep` scale a run or a sweep to the memory and cores this session may use, by
:func:`~lab_utils.cluster.process.fit_count`'s rule. A rank of another size (Lab 5's AlexNet)
passes ``memory_per_task``. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Sequence

from lab_utils import checks, resources
from lab_utils.cluster.process import GUARD_MEMORY_BYTES, TF_TASK_MEMORY_BYTES, fit_count, nothing_fits

__all__ = ["RANKS_PER_CORE", "task_memory", "cluster_memory", "fit_ranks", "fit_sweep"]

#: Most ranks per usable core before a run is scaled down: beyond two, the processes only
#: take turns on the CPU and the run measures the scheduler, not the training.
RANKS_PER_CORE = 2
MB = 1024**2


def task_memory(role: str = "worker") -> int:
    """Memory one TensorFlow task needs: TensorFlow and its server
    (:data:`~lab_utils.cluster.TF_TASK_MEMORY_BYTES`); a worker (or rank) also holds the MNIST it
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
    """Memory ``ps`` PS tasks and ``workers`` workers (or ranks, ``ps=0``) need, their guards
    included (``memory_per_task``: a worker's, instead of :func:`task_memory`), and once for them
    all the MNIST bytes the workers map from the data cache (:func:`_mapped_data`)."""
    worker = task_memory("worker") if memory_per_task is None else memory_per_task
    own = ps * (task_memory("ps") + GUARD_MEMORY_BYTES) + workers * (worker + GUARD_MEMORY_BYTES)
    return own + _mapped_data(workers, memory_per_task)


def fit_ranks(
    requested: int,
    ps: int = 0,
    *,
    memory_per_task: int | None = None,
    available: int | None = None,
    cores: int | None = None,
    kind: str = "rank",
) -> int:
    """The largest count <= ``requested`` of ranks (``kind``: what the printed line calls them;
    with ``ps`` PS tasks beside them, workers) that this machine allows.

    Memory: :func:`cluster_memory` (each PS: TensorFlow; each rank: TensorFlow and the MNIST it
    loads, or ``memory_per_task``) must fit in the memory available under this session's limit
    (cgroup / JupyterHub ``MEM_LIMIT``, :func:`lab_utils.resources.available_memory_bytes`).
    Cores: at most :data:`RANKS_PER_CORE` per usable core. Prints one line when it scales
    down; raises :class:`~lab_utils.cluster.ResourceError` when not even one fits."""
    checks.count(f"requested {kind}s", requested)
    shared = _mapped_data(1, memory_per_task)  # counted once, with the PS
    per_rank = cluster_memory(1, 0, memory_per_task=memory_per_task) - shared
    fixed = cluster_memory(0, ps) + shared
    avail = resources.available_memory_bytes() if available is None else available
    cores = resources.usable_cores() if cores is None else cores
    by_memory = fit_count(requested, lambda n: fixed + n * per_rank, available=avail)
    what = f"{ps} PS + 1 {kind}" if ps else f"1 {kind}"
    per_ps = f"about {cluster_memory(0, ps) / ps / MB:.0f} MB per PS and " if ps else "about "
    if by_memory < 1:
        raise nothing_fits(f"not even {what} fits: {'they need' if ps else 'it needs'}", fixed + per_rank, avail)
    by_cores = max(1, RANKS_PER_CORE * cores)
    fit = min(requested, by_memory, by_cores)
    if fit < requested:
        why = []
        if by_memory < requested:
            why.append(f"memory: {avail / MB:,.0f} MB available, {per_ps}{per_rank / MB:.0f} MB per {kind}")
        if by_cores < requested:
            why.append(f"cores: {cores} usable, at most {RANKS_PER_CORE} {kind}s per core")
        print(f"[lab_utils] {requested} {kind}s do not fit here ({'; '.join(why)}): using {fit}", flush=True)
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
    :class:`~lab_utils.cluster.ResourceError` when none fits. Cores are not counted: a sweep
    shows what happens past them (its oversubscribed points are marked)."""
    sizes = checks.counts("sizes", sizes)
    avail = resources.available_memory_bytes() if available is None else available
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
