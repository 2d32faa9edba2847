"""The network matters: parameter server against ring all-reduce on emulated links.

The thesis in the course's reports (parameter server vs ring all-reduce) finds that a
PS's speedup levels off as workers are added while ring all-reduce stays near linear,
and that the PS's traffic grows with the number of workers. On one machine over
loopback that cannot show: the network is free. On emulated hosts
(:func:`lab_utils.cluster.emulated`) each rank has its own shaped link, so it does::

    from lab_utils.training import netexp
    table = netexp.experiment(workers=(1, 2, 4), hosts="emulated:100mbit", mb=3)
    netexp.plot(table)

Both modes run the same step (:mod:`.netexp_task`): ``compute_s`` seconds of modelled
accelerator time, then ``mb`` MB of gradients through a PS on its own host, or
through Open MPI's ring all-reduce. With 3 MB over 100 Mbit/s links, a PS step moves
0.48 s of gradients per worker through the PS's one link; the ring moves 0.36 s per
rank whatever the number of workers. Next to 1 s of computation, the PS levels off
(2.2x with 4 workers, measured) and the ring stays closer to linear (2.6-2.7x). The bytes
are each host's link counters, not estimates. No root is needed (a user
namespace of the job's own); where the machine refuses those too, the runs fall back to
local hosts (one line says why) and the table says ``emulated: False``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from lab_utils import reference_runs
from lab_utils.cluster import MPIJob, netem
from lab_utils.cluster.job import format_args
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.training import netexp_task

MODES = ("ps", "allreduce")
#: shown beside loopback figures where no emulated hosts can be made (lab_utils.reference_runs)
REFERENCE = "netexp_100mbit"
#: Open MPI: choose the ring algorithm for MPI_Allreduce (coll/tuned's algorithm 4).
RING = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"]
#: One mpi4py rank of the experiment: NumPy, its gradients and buffers.
RANK_MEMORY_BYTES = 200 * 1024**2


def run_ranks(
    script: str,
    args: dict,
    *,
    mode: str,
    workers: int,
    has_ps: bool,
    ring: bool,
    hosts: str | EmulatedHosts | None,
    steps: int,
    memory_per_rank: int,
    timeout: float,
    progress: bool,
    name: str,
) -> tuple[dict, list[dict], list[dict]]:
    """One experiment run, one mpi4py rank per emulated host (a PS rank first when
    ``has_ps``): checked, launched with mpirun (Open MPI's ring for MPI_Allreduce when
    ``ring``), waited for. Returns ``(row, worker results, PS results)``; the row holds
    what every experiment reports: ``mode``, ``workers``, ``emulated``, ``network``,
    ``step_s`` (the slowest worker's), ``examples_per_s`` (all workers) and, from the
    links' counters over ``steps`` steps, ``ps_mb_per_step`` and ``worker_mb_per_step``
    (where emulated only). :mod:`.hybrid` runs its modes with it too."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    spec = netem.host_per_rank(hosts)
    job = MPIJob(
        np=workers + has_ps,
        script=script,
        args=args,
        launcher="mpirun",
        hosts=spec,
        launcher_args=RING if ring else [],
        env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"},
        memory_per_rank=memory_per_rank,
        timeout=timeout,
        progress=progress,
        name=name,
    )
    with job:
        results = job.wait()
    done = [r for r in results.values() if r.get("role") == "worker"]
    ps = [r for r in results.values() if r.get("role") == "ps"]
    if len(done) != workers or len(ps) != has_ps:
        raise RuntimeError(f"{mode} with {workers} workers: not every rank reported a result ({results})")
    row = {
        "mode": mode,
        "workers": workers,
        "emulated": job.emulated,
        "network": spec.describe() if job.emulated else "loopback (not emulated)",
        "step_s": max(r["step_s"] for r in done),  # a synchronous step ends with its slowest worker
        "examples_per_s": sum(r["examples_per_s"] for r in done),
    }
    if job.emulated:
        traffic = job.network.mb_per_step(steps)
        row["ps_mb_per_step"] = traffic[0] if has_ps else None
        row["worker_mb_per_step"] = statistics.mean(traffic[i] for i in range(has_ps, workers + has_ps))
    return row, done, ps


def run(
    mode: str,
    workers: int,
    *,
    hosts: str | EmulatedHosts | None = "emulated:100mbit",
    mb: float = 3.0,
    steps: int = 5,
    warmup: int = 1,
    compute_s: float = 1.0,
    timeout: float = 300.0,
    progress: bool = False,
) -> dict:
    """One run: ``workers`` workers (plus a PS host in ``ps`` mode), one rank per
    emulated host (``hosts``: an :func:`~lab_utils.cluster.emulated` spec or its string,
    ``"local"`` for loopback). Returns throughput, step time and each role's bytes per step."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    args = {"mode": mode, "mb": mb, "steps": steps, "warmup": warmup, "compute-s": compute_s}
    netexp_task.check_args(format_args(args))  # bad sizes raise ValueError here, not in the ranks' logs
    row, done, _ = run_ranks(
        "-m lab_utils.training.netexp_task",
        args,
        mode=mode,
        workers=workers,
        has_ps=mode == "ps",
        ring=mode == "allreduce",
        hosts=hosts,
        steps=warmup + steps,
        memory_per_rank=RANK_MEMORY_BYTES,
        timeout=timeout,
        progress=progress,
        name=f"netexp-{mode}-{workers}",
    )
    row["gradient_mb"] = done[0]["gradient_bytes"] / 1e6
    return row


def experiment(
    workers: Sequence[int] = (1, 2, 4),
    modes: Sequence[str] = MODES,
    **kwargs,
):
    """Every mode at every worker count (same step, same links); a pandas table with
    the speedup over the mode's own smallest run and the ideal (linear) one."""
    import pandas as pd

    hosts = kwargs.pop("hosts", "emulated:100mbit")
    spec = netem.spec_or_local(hosts)  # the fallback line once, not per run
    rows = []
    for mode in modes:
        for w in workers:
            row = run(mode, w, hosts=spec, **kwargs)
            print(
                f"{mode:>9} with {w} worker(s): {row['examples_per_s']:8.1f} examples/s, "
                f"{row['step_s']:.2f} s per step ({row['network']})",
                flush=True,
            )
            rows.append(row)
    table = pd.DataFrame(rows)
    base = table.loc[table.groupby("mode")["workers"].idxmin()].set_index("mode")
    table["speedup"] = table.apply(lambda r: r["examples_per_s"] / base.loc[r["mode"], "examples_per_s"], axis=1)
    table["ideal"] = table["workers"] / table["mode"].map(base["workers"])
    if netem.as_spec(hosts) is not None and spec is None:  # links asked for, loopback measured
        table.attrs["reference"] = ref = reference_runs.table(REFERENCE)
        most = int(ref["workers"].max())
        at = ref[ref["workers"] == most].set_index("mode")
        ps = ref[ref["mode"] == "ps"].set_index("workers")["ps_mb_per_step"]
        print(
            f"Your runs above are on loopback. {ref.attrs['label']}: at {most} "
            f"workers the PS reaches {at.loc['ps', 'speedup']:.2f}x and the ring {at.loc['allreduce', 'speedup']:.2f}x; "
            f"the PS host moves {', '.join(f'{v:.0f}' for v in ps)} MB per step for "
            f"{', '.join(str(w) for w in ps.index)} workers (plot() draws it beside yours).",
            flush=True,
        )
    return table


def plot(table):
    """Speedup against workers (with the ideal line) and the PS's and a worker's
    traffic per step, in the style of the thesis's Figures 4.3-4.4."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ref = table.attrs.get("reference")
    mine = " (yours: loopback)" if ref is not None else ""
    for mode, part in table.groupby("mode"):
        ax1.plot(part["workers"], part["speedup"], "o-", label=mode + mine)
    if ref is not None:  # the shipped run on emulated links, drawn apart and named
        for mode, part in ref.groupby("mode"):
            ax1.plot(part["workers"], part["speedup"], "^:", label=f"{mode} (reference: emulated links)")
    ws = sorted(table["workers"].unique())
    ax1.plot(ws, [w / ws[0] for w in ws], "k--", lw=1, label="ideal")
    ax1.set(xlabel="workers", ylabel="speedup", title="throughput over one worker")
    ax1.legend(fontsize="small")
    traffic = ref if ref is not None else table
    if "worker_mb_per_step" in traffic and traffic["worker_mb_per_step"].notna().any():
        ps = traffic[traffic["mode"] == "ps"]
        ax2.plot(ps["workers"], ps["ps_mb_per_step"], "o-", label="PS host")
        for mode, part in traffic.groupby("mode"):
            ax2.plot(part["workers"], part["worker_mb_per_step"], "s--", label=f"{mode} worker")
        title = "traffic per host" + (" (reference: emulated links)" if ref is not None else "")
        ax2.set(xlabel="workers", ylabel="MB per step (sent + received)", title=title)
        ax2.legend(fontsize="small")
    if ref is not None:
        fig.suptitle(ref.attrs["label"], fontsize="small")
    fig.tight_layout()
    return fig
