"""The Parallax idea, runnable: sparse gradients through a PS, dense ones through all-reduce.

Parallax (Kim et al., EuroSys 2019; the course's SNU reports used it) starts from one
observation: a model's variables are not all alike. An embedding table is large, but a
batch touches a few of its rows: its gradient is *sparse*. A dense layer's gradient is
dense: every weight, every step. A parameter server is good at sparse variables (a worker
pulls and pushes only the rows it touched), ring all-reduce at dense ones (every link
busy, none a bottleneck). So Parallax sends each kind its own way. Parallax itself ran on
TensorFlow 1.6-1.11 and is gone; :mod:`lab_utils.training.hybrid.task` does the same with mpi4py and
Horovod, on a recommendation model with a 12.8 MB embedding table and a 4.5 MB MLP::

    from lab_utils.training import hybrid
    table = hybrid.experiment(workers=(2, 4), hosts="emulated:100mbit")
    hybrid.plot(table)

Three modes, the same synchronous SGD on the same examples (they end with the same loss):

- ``ps``: one PS holds everything; its one link carries every worker's 4.5 MB of dense
  weights and as much of dense gradients, each step;
- ``allreduce``: Horovod averages everything, the table's gradient made dense: 17.3 MB
  through the ring, of which 12.8 MB are zeros but for a few hundred rows;
- ``hybrid``: the table's rows through the PS (about 90 kB per worker and step), the
  MLP's gradients through Horovod's ring among the workers.

On 100 Mbit/s links (:func:`lab_utils.cluster.emulated`) the bytes set the pace: the
table reports each host's link counters (true bytes, TCP/IP included) next to the task's
own count from its message sizes. Measured on a 2-core machine, 10 steps: with 2 workers a
step took 0.80 s in ``hybrid``, 1.44 s in ``ps`` and 2.92 s in ``allreduce``; with 4,
0.90 s, 2.86 s (the PS's link: 36 MB a step) and 2.92 s. The hybrid's PS link carried
0.18 MB a step where ``ps``'s carried 18 MB (2 workers). Over loopback, where bytes cost
little, the three are within 2x of each other and 4 workers on 2 cores are
compute-bound. Where no emulated hosts can be made (no root and no user namespaces) the runs fall back to
local hosts (one line says why) and the table says ``emulated: False``: then only the task's own count is there.

Parallax also shards the sparse variables over a PS on every machine and aggregates
sparse gradients locally first; here one PS serves the table, which is enough to show
where the bytes go.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from lab_utils import checks
from lab_utils.cluster import netem
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.training.hybrid import settings as hybrid_settings
from lab_utils.training.runs import LaunchOptions, RanksRun, run_ranks, sweep_modes, takes_launch_options
from lab_utils.training.runs import experiment_timelines as timelines  # noqa: F401 (the package's name)

__all__ = ["MODES", "RANK_MEMORY_BYTES", "fit_sweep", "variables", "worker_bytes", "run_hybrid", "experiment", "plot"]

MODES = hybrid_settings.MODES
MB = 1024**2
#: One rank's private (anonymous) resident memory, by mode: TensorFlow and Horovod, a copy
#: of the model, its gradients and Horovod's buffers. Measured (/proc/PID/status RssAnon,
#: sampled every 0.3 s; 2 and 4 workers over loopback, 2026-11-27): ``allreduce`` ranks
#: peaked at 438 MB (the table's gradient made dense, and Horovod's fusion buffer for it),
#: ``hybrid`` ranks at 289 MB, ``ps`` ranks at 271 MB, the PS ranks below their workers.
#: About 10 % is added. TensorFlow's library pages (240 MB more resident) are shared by
#: every rank and charged once, as for :data:`lab_utils.cluster.TF_TASK_MEMORY_BYTES`.
RANK_MEMORY_BYTES = {"allreduce": 480 * MB, "hybrid": 320 * MB, "ps": 320 * MB}


def variables(unique_rows: float, **settings: Any) -> list[dict]:
    """The model's variables as Lab 6, Part C describes them to a router: ``name``, ``shape``
    and ``rows_touched``, the rows of the table a worker's batch touches per step
    (``unique_rows``, a run's ``unique_rows``), None for a dense variable (every entry gets a
    gradient). ``settings``: the task's ``users``, ``items``, ``dim``, ``hidden``."""
    s = hybrid_settings.Settings(**settings)
    names = ["dense_0/kernel", "dense_0/bias", "dense_1/kernel", "dense_1/bias", "logit/kernel", "logit/bias"]
    dense = [
        {"name": n, "shape": shape, "rows_touched": None}
        for n, shape in zip(names, hybrid_settings.dense_shapes(s.dim, s.hidden), strict=True)
    ]
    return [{"name": "embedding", "shape": (s.table_rows, s.dim), "rows_touched": float(unique_rows)}, *dense]


def worker_bytes(row: Any) -> float:
    """Bytes one worker sent and received per step in a run's row (:func:`run_hybrid`): its host's link
    counters where emulated, else the task's own count from its message sizes."""
    link = row.get("worker_mb_per_step")
    if link is not None and link == link:  # not None, not NaN
        return float(link) * 1e6
    return float(row["sparse_mb"] + row["dense_mb"]) * 1e6


def _ranks(mode: str, workers: int) -> int:
    return workers + (mode != "allreduce")  # ps and hybrid: a PS rank too


def fit_sweep(workers: Sequence[int], modes: Sequence[str] = MODES, *, available: int | None = None) -> list[int]:
    """The worker counts of :func:`experiment` whose every mode fits the memory available
    now (by :data:`RANK_MEMORY_BYTES`, as the launcher checks each run), in the order given.
    A count left out is replaced, last, by the largest smaller one (2 or more) that fits, if it is not there
    already: Binder's 2 GB holds 3 ``allreduce`` ranks beside the kernel, not 4, so
    ``[2, 4]`` becomes ``[2, 3]``, and the table still shows how each mode grows. Prints one
    line saying so; raises :class:`ResourceError` when nothing fits."""
    from lab_utils.cluster import nothing_fits
    from lab_utils.resources import available_memory_bytes

    workers = checks.counts("workers", workers)
    avail = available_memory_bytes() if available is None else available

    def need(w: int) -> tuple[int, str]:
        return max((_ranks(m, w) * RANK_MEMORY_BYTES[m], m) for m in modes)

    fits = [w for w in workers if need(w)[0] <= avail]
    dropped = [w for w in workers if w not in fits]
    # in place of those left out, the largest count that fits, when it adds a size (from 2:
    # with 1 worker there is no all-reduce to compare)
    instead = max((n for n in range(2, min(dropped, default=2)) if need(n)[0] <= avail), default=None)
    keep = fits + ([instead] if instead is not None and instead not in fits else [])
    if dropped:
        first = min(dropped)
        size, mode = need(first)
        what = f"{mode} with {first} worker{'s' if first > 1 else ''} ({_ranks(mode, first)} ranks)"
        if not keep:
            raise nothing_fits(f"no size of this experiment fits: {what} needs", size, avail)
        print(
            f"[lab_utils] {', '.join(map(str, dropped))} workers do not fit here ({what} needs about "
            f"{size / MB:,.0f} MB, {avail / MB:,.0f} MB available): the runs use {', '.join(map(str, keep))}; "
            + (
                "the PS's traffic still grows with the workers in ps mode, and not in hybrid"
                if len(keep) > 1
                else "one size shows the three modes side by side, not how they grow with the workers"
            ),
            flush=True,
        )
    return keep


def _task_args(mode: str, steps: int, warmup: int, batch_size: int, settings: dict[str, Any]) -> dict[str, Any]:
    """The task's command line as a dict, checked by the task's own parser (``ValueError``)."""
    args = {"mode": mode, "steps": steps, "warmup": warmup, "batch-size": batch_size}
    args.update({key.replace("_", "-"): value for key, value in settings.items()})
    argv = [item for key, value in args.items() for item in (f"--{key}", str(value))]
    hybrid_settings.check_args(argv)
    return args


@takes_launch_options(timeout=300.0, progress=False)
def run_hybrid(
    mode: str,
    workers: int,
    *,
    hosts: str | EmulatedHosts | None = "emulated:100mbit",
    steps: int = 10,
    warmup: int = 2,
    batch_size: int = 256,
    options: LaunchOptions,
    **settings: Any,
) -> RanksRun:
    """One run of ``mode`` with ``workers`` workers (and a PS rank for ``ps`` and ``hybrid``),
    one rank per emulated host (``hosts``: an :func:`~lab_utils.cluster.emulated` spec or its
    string, ``"local"`` for loopback). ``settings``: more of the task's settings (``users``,
    ``items``, ``dim``, ``hidden``, ``learning_rate``, ``embedding_learning_rate``, ``seed``).

    Returns a :class:`~lab_utils.training.runs.RanksRun` whose row holds ``step_s`` (the slowest worker's median step), ``examples_per_s`` (all
    workers), ``loss_start`` / ``loss_end``, the task's own count per worker and step
    (``sparse_mb``, ``dense_mb``, sent + received) and the PS's (``ps_task_mb``), and where
    emulated, the link counters: ``ps_mb_per_step`` (the PS's host), ``worker_mb_per_step``
    (a worker's host, mean)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    has_ps = mode != "allreduce"
    out, done, ps = run_ranks(
        "-m lab_utils.training.hybrid.task",
        _task_args(mode, steps, warmup, batch_size, settings),
        mode=mode,
        workers=workers,
        has_ps=has_ps,
        ring=mode != "ps",  # Horovod's MPI_Allreduce: Open MPI's ring
        hosts=hosts,
        steps=warmup + steps,
        memory_per_rank=RANK_MEMORY_BYTES[mode],
        options=options,
        name=f"hybrid-{mode}-{workers}",
    )
    mean = lambda key: statistics.mean(r[key] for r in done)  # noqa: E731
    row = out.row
    row.setdefault("ps_mb_per_step", None)  # the table has its link columns even where not emulated
    row.setdefault("worker_mb_per_step", None)
    row.update(
        loss_start=mean("loss_start"),
        loss_end=mean("loss_end"),
        unique_rows=mean("unique_rows"),
        sparse_mb=(mean("sparse_sent_per_step") + mean("sparse_received_per_step")) / 1e6,
        dense_mb=(mean("dense_sent_per_step") + mean("dense_received_per_step")) / 1e6,
        ps_task_mb=(ps[0]["sent_per_step"] + ps[0]["received_per_step"]) / 1e6 if ps else None,
    )
    return out


def _say(row: dict) -> str:
    mb = row["sparse_mb"] + row["dense_mb"]
    return f"{row['examples_per_s']:8.1f} examples/s, {row['step_s']:.3f} s per step, {mb:.2f} MB per worker and step"


def experiment(workers: Sequence[int] = (2, 4), modes: Sequence[str] = MODES, **kwargs: Any):
    """Every mode at every worker count that fits here (same model, data and links; see
    :func:`fit_sweep`): a pandas table of :func:`run_hybrid`'s rows plus ``vs_allreduce``, each
    run's throughput over all-reduce's with as many workers (when ``allreduce`` is among
    the modes)."""
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"modes must be a non-empty selection of {MODES}, got {tuple(modes)!r}")
    spec = netem.spec_or_local(kwargs.pop("hosts", "emulated:100mbit"))  # the fallback line once, not per run
    workers = fit_sweep(workers, modes)
    runs = [(mode, w) for w in workers for mode in modes]
    table = sweep_modes(run_hybrid, runs, _say, hosts=spec, **kwargs)
    if "allreduce" in modes:
        ring = table[table["mode"] == "allreduce"].set_index("workers")["examples_per_s"]
        table["vs_allreduce"] = table["examples_per_s"] / table["workers"].map(ring)
    return table


def plot(table):
    """Throughput per mode against workers, and the bytes per step of the PS's host and of
    a worker's (the links' counters where emulated, else the task's own count)."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    links = table["worker_mb_per_step"].notna().all()
    for mode, part in table.groupby("mode", sort=False):
        line = ax1.plot(part["workers"], part["examples_per_s"], "o-", label=mode)[0]
        worker = part["worker_mb_per_step"] if links else part["sparse_mb"] + part["dense_mb"]
        ax2.plot(part["workers"], worker, "s-", color=line.get_color(), label=f"{mode}: a worker")
        ps = part["ps_mb_per_step"] if links else part["ps_task_mb"]
        if ps.notna().all():
            ax2.plot(part["workers"], ps, "o--", color=line.get_color(), label=f"{mode}: the PS")
    ws = sorted(table["workers"].unique())
    ax1.set(xlabel="workers", ylabel="examples/s", title="throughput", xticks=ws)
    ax1.legend()
    source = "link counters" if links else "the task's message sizes"
    ax2.set(xlabel="workers", ylabel="MB per step (sent + received)", title=f"traffic per host ({source})", xticks=ws)
    ax2.set_yscale("log")
    ax2.legend(fontsize="small")
    fig.tight_layout()
    return fig
