"""Lab 4 from the notebook: check a ring, measure bandwidth, run Horovod and the references.

Every call launches processes with :mod:`lab_utils.cluster` (``MPIJob`` for
``mpirun``/``horovodrun``, ``TFCluster(ps=0)`` for MultiWorkerMirroredStrategy and
the one-process reference) and returns plain data; nothing here imports
TensorFlow into the kernel.

* Part A: :func:`check_ring` (a student's ``ring_allreduce`` against MPI's, with the
  bytes each rank sent), :func:`busbw_sweep` (seconds per all-reduce for each
  message size: the hand ring, MPI's ``Allreduce``, a ``memcpy``), :func:`busbw_table`
  and :func:`plot_busbw`.
* Part B: :func:`run_hvd` (a ``train_hvd.py`` under ``horovodrun``, Gloo or MPI;
  optionally with a Horovod timeline, summarised by :func:`timeline_summary`), and
  :func:`check_hvd_script` (Exercise 3's quick check: broadcast, scaled rate, checkpoint).
* Part C: :func:`run_single` (one process, N x b examples per step),
  :func:`run_mwms` (MultiWorkerMirroredStrategy, RING), and :func:`weights_table`.
* Part D: :func:`scaling_table` and :func:`plot_scaling`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab_utils import plots
from lab_utils.cluster import MPIJob, TFCluster, new_run_dir
from lab_utils.cluster.job import format_args
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.horovod_trace import horovod_activities, read_horovod_timeline
from lab_utils.training.allreduce.settings import check_args
from lab_utils.training.runs import RunOptions, TrainRun, finish_run, horovod_job, takes_run_options
from lab_utils.training.tables import plot_scaling, scaling_table
from lab_utils.training.weights import max_difference

__all__ = [
    "RANK_MEMORY_BYTES",
    "check_ring",
    "busbw_sweep",
    "busbw_table",
    "plot_busbw",
    "TrainRun",
    "new_run_dir",
    "run_hvd",
    "run_single",
    "check_hvd_script",
    "run_mwms",
    "weights_table",
    "timeline_summary",
    "show_step_times",
    "wire_table",
    "scaling_table",
    "plot_scaling",
]

#: Memory of one mpi4py rank (NumPy, no TensorFlow) for the resource check; a 64 MB
#: message needs its input, output and receive buffers.
RANK_MEMORY_BYTES = 400 * 1024**2
MB = 1024**2
#: Private memory of one AlexNet process of Lab 5's Part D at the lab's defaults (width 1.0,
#: batch 64, full-size CIFAR-10 mapped from the data cache, TensorFlow's BFC allocator, one
#: thread each as on Binder), measured (/proc/PID/status RssAnon peaks, 2026-11-27, 2 ranks):
#: a Horovod rank 494 MB, a MultiWorkerMirroredStrategy worker 714 MB (its gRPC server and
#: collective executor come on top). Smaller widths hold less: an upper bound there.
ALEXNET_RANK_MEMORY_BYTES = {"horovod": 520 * MB, "mwms": 750 * MB}


def _alexnet_memory(args, kind: str) -> int | None:
    """The memory to count per AlexNet process of ``kind``; None (the launcher's own figure
    for a TensorFlow task) for the MNIST models."""
    return ALEXNET_RANK_MEMORY_BYTES[kind] if dict(args or {}).get("model") == "alexnet" else None


def _ring_check(np_: int, args: Sequence, timeout: float) -> dict:
    """Rank 0's result of ``python -m lab_utils.training.allreduce.ring_check ARGS`` on ``np_``
    ranks under ``mpirun``, run to its end."""
    job = MPIJob(
        np=np_,
        script="-m lab_utils.training.allreduce.ring_check",
        args=[str(a) for a in args],
        launcher="mpirun",
        timeout=timeout,
        memory_per_rank=RANK_MEMORY_BYTES,
        progress=False,
    )
    with job:
        return job.wait()["rank:0"]


# ----------------------------------------------------------------------------- Part A


def check_ring(
    ring_file: str | os.PathLike,
    np: int = 2,
    sizes: Sequence[int] = (0, 1, 7, 1000),
    dtypes: Sequence[str] = ("int64", "float32"),
    *,
    seed: int = 0,
    timeout: float = 120,
) -> pd.DataFrame:
    """Run ``ring_allreduce`` from ``ring_file`` on ``np`` ranks (``mpirun``) for every
    size x dtype and compare each result with MPI's ``Allreduce``. One row per case:
    ``ok``, ``problem``, the float error, and ``bytes sent`` (per rank).

    A ring that deadlocks ends at ``timeout`` with a ``ClusterError`` that shows the
    ranks' output."""
    path = Path(ring_file).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"{ring_file} not found: run the `%%writefile {Path(ring_file).name}` cell first")
    args = ["check", "--ring", path, "--sizes", *sizes, "--dtypes", *dtypes, "--seed", seed]
    cases = _ring_check(np, args, timeout)["cases"]
    table = pd.DataFrame(cases).drop(columns=["raised"], errors="ignore")
    return table.rename(columns={"bytes_sent": "bytes sent", "max_rel_err": "max rel error"})


def busbw_sweep(
    ring_file: str | os.PathLike | None,
    np: int = 2,
    sizes: Sequence[int] = tuple(2**k for k in range(10, 27, 2)),
    *,
    repeats: int = 5,
    timeout: float = 600,
) -> pd.DataFrame:
    """Seconds per all-reduce of each message size (bytes) on ``np`` ranks: the ring of
    ``ring_file`` (None: skip it), MPI's ``Allreduce`` and a ``memcpy`` of the buffer;
    each the median of ``repeats`` (the slowest rank's time). One row per size."""
    args = ["busbw", "--sizes", *sizes, "--repeats", repeats]
    if ring_file is not None:
        args += ["--ring", Path(ring_file).resolve()]
    return pd.DataFrame(_ring_check(np, args, timeout)["rows"])


def busbw_table(times: pd.DataFrame, bytes_sent: Callable[[int, int], float]) -> pd.DataFrame:
    """Bandwidths (GB/s) from :func:`busbw_sweep`'s seconds. *Bus bandwidth* is what one
    rank sends per second: ``bytes_sent(nbytes, np) / seconds``, with ``bytes_sent``
    the per-rank traffic of a ring all-reduce (Exercise 2); it can be compared with a
    link's speed and across rank counts. ``memcpy`` is bytes copied per second."""
    rows = []
    for r in times.to_dict("records"):
        sent = bytes_sent(r["bytes"], r["np"])
        row = {"bytes": r["bytes"], "MPI Allreduce (GB/s)": sent / r["mpi_s"] / 1e9}
        if "ring_s" in r and not pd.isna(r.get("ring_s")):
            row["hand ring (GB/s)"] = sent / r["ring_s"] / 1e9
            row["ring / MPI"] = r["mpi_s"] / r["ring_s"]
        row["memcpy (GB/s)"] = r["bytes"] / r["memcpy_s"] / 1e9
        rows.append(row)
    return pd.DataFrame(rows).set_index("bytes")


def plot_busbw(table: pd.DataFrame, title: str | None = None):
    """Bandwidth against message size: :func:`lab_utils.plots.bandwidth_curves` of :func:`busbw_table`."""
    return plots.bandwidth_curves(table, title=title or "bus bandwidth of an all-reduce, and memcpy")


# ----------------------------------------------------------------------------- runs


def _prepare(args: Mapping[str, Any] | None, save_weights: bool, run_dir: Path) -> tuple[dict, str | None]:
    args = dict(args or {})
    path = None
    if save_weights:
        path = str(run_dir / "weights.npz")
        args["save_weights"] = path
    return args, path


@takes_run_options()
def run_hvd(
    script: str | os.PathLike,
    np: int = 2,
    *,
    args: Mapping[str, Any] | None = None,
    controller: str = "gloo",
    timeline: bool = False,
    save_weights: bool = False,
    hosts: str | Sequence[str] | EmulatedHosts | None = None,
    options: RunOptions,
) -> TrainRun:
    """``horovodrun -np np`` (``controller`` "gloo" or "mpi") of ``script`` with ``args``
    (``{"batch_size": 60}`` -> ``--batch-size 60``). ``timeline``: record a Horovod
    timeline (:func:`timeline_summary` reads it); ``save_weights``: rank 0 saves the
    final weights; ``monitor``: sample CPU, memory and network while it trains;
    ``live``: and show them as it trains (a static figure when headless).
    ``hosts``: where the ranks run, as :class:`~lab_utils.cluster.MPIJob` takes it
    (``"emulated:bandwidth=100mbit"`` needs ``controller="mpi"``; ``"hostfile:PATH"``, ``"slurm"``).
    ``args`` are checked against :func:`lab_utils.training.allreduce.parse_args` first:
    bad ones raise ``ValueError`` before anything starts."""
    check_args(format_args(args))
    run_dir = new_run_dir("hvd")
    args, weights = _prepare(args, save_weights, run_dir)
    env, tl = {}, None
    if timeline:
        tl = str(run_dir / "timeline.json")
        env["HOROVOD_TIMELINE"] = tl
    t0 = time.monotonic()
    name = options.label or Path(str(script)).stem
    memory = _alexnet_memory(args, "horovod")
    job = horovod_job(
        np,
        script,
        args,
        controller=controller,
        hosts=hosts,
        run_dir=run_dir,
        name=name,
        options=options,
        env=env,
        memory_per_rank=memory,
    )
    mon = options.watch(job)
    label = options.label or f"horovod {controller} np={np}"
    return finish_run(
        job,
        results=job.results(),
        label=label,
        method=f"horovod ({controller})",
        ranks=np,
        args=args,
        t0=t0,
        weights=weights,
        timeline=tl,
        monitor=mon,
    )


def _tf_run(strategy: str, workers: int, args, save_weights: bool, options: RunOptions) -> TrainRun:
    check_args(format_args({**dict(args or {}), "strategy": strategy}))
    run_dir = new_run_dir(strategy)
    args, weights = _prepare(args, save_weights, run_dir)
    args["strategy"] = strategy
    t0 = time.monotonic()
    cluster = TFCluster(
        ps=0,
        workers=workers,
        script="-m lab_utils.training.allreduce",
        args=args,
        timeout=options.timeout,
        progress=options.progress,
        run_dir=run_dir,
        name=strategy,
        memory_per_task=_alexnet_memory(args, "mwms"),
    )
    mon = options.watch(cluster)
    results = {f"rank:{r['rank']}": r for r in cluster.results().values()}  # worker:i -> rank:i
    method = "one process" if strategy == "single" else "mwms (ring)"
    label = options.label or f"{method} x{workers}"
    return finish_run(
        cluster,
        results=results,
        label=label,
        method=method,
        ranks=workers,
        args=args,
        t0=t0,
        weights=weights,
        monitor=mon,
    )


@takes_run_options()
def run_single(
    emulate_ranks: int = 1, *, args: Mapping[str, Any] | None = None, save_weights: bool = False, options: RunOptions
) -> TrainRun:
    """ONE process, plain gradients, whose batch at each step is what ``emulate_ranks``
    ranks of ``args["batch_size"]`` would draw together (Part C's big-batch reference)."""
    args = {**dict(args or {}), "emulate_ranks": emulate_ranks}
    label = options.label or f"one process, {emulate_ranks} ranks' batches per step"
    return _tf_run("single", 1, args, save_weights, replace(options, label=label))


@takes_run_options()
def run_mwms(
    workers: int = 2, *, args: Mapping[str, Any] | None = None, save_weights: bool = False, options: RunOptions
) -> TrainRun:
    """``tf.distribute.MultiWorkerMirroredStrategy`` (RING collective), one process per worker."""
    return _tf_run("mwms", workers, args, save_weights, options)


#: Exercise 3's quick check: a small CNN (each rank draws its own initial weights) for a few steps
CHECK_ARGS = {"model": "cnn", "batch_size": 16, "steps": 5, "learning_rate": 0.05}
CHECK_TOLERANCE = 1e-4  # of the largest weight: float32 rounding over 5 steps is about 1e-7


def check_hvd_script(script: str | os.PathLike = "train_hvd.py", np: int = 2, *, seed: int = 0) -> list[str]:
    """What a ``train_hvd.py`` gets wrong, found in seconds on a small CNN (empty: nothing).

    Runs it on ``np`` ranks with a checkpoint folder, then one process on the same examples
    (batch ``np`` x b, learning rate ``np`` x the rate). Every rank reports a digest of its
    weights as the loop got them and at the end: they must agree at the start (the initial
    weights broadcast; without it each rank keeps the weights its own seed drew) and at the
    end (the gradients averaged). Rank 0 must have written the checkpoint, and the weights
    must be the one process's (the learning rate scaled: an unscaled one matches the one
    process at the rank's rate)."""
    import tempfile

    args = {**CHECK_ARGS, "seed": seed}
    lr = args["learning_rate"]
    with tempfile.TemporaryDirectory(prefix="hvd-check-") as ckpt:
        run = run_hvd(script, np, args={**args, "checkpoint_dir": ckpt}, save_weights=True, progress=False)
        wrote = os.path.isfile(os.path.join(ckpt, "model.index"))
    problems = []
    if not wrote:
        problems.append(
            "no checkpoint: rank 0 writes tf.train.Checkpoint(model=model) to os.path.join(settings.checkpoint_dir, "
            "'model') when settings.checkpoint_dir is set"
        )
    for key, problem in (
        (
            "initial_weights_sum",
            "the ranks started from different weights: broadcast the initial weights from rank 0 once the model exists",
        ),
        (
            "weights_sum",
            "the ranks started equal but ended apart: each applied its own gradient; average the "
            "gradients over the ranks (hvd.DistributedGradientTape)",
        ),
    ):
        sums = [float(r[key]) for r in run.results.values()]
        if max(sums) - min(sums) > CHECK_TOLERANCE * max(abs(x) for x in sums):
            return problems + [f"{problem} (sums of |w| per rank: {', '.join(f'{x:.6g}' for x in sums)})"]
    mine = run.weights()
    single = run_single(np, args={**args, "learning_rate": lr * np}, save_weights=True, progress=False)
    diff = max_difference(single.weights(), mine)["max_rel"]
    if diff > CHECK_TOLERANCE:
        unscaled = run_single(np, args=args, save_weights=True, progress=False)
        if max_difference(unscaled.weights(), mine)["max_rel"] <= CHECK_TOLERANCE:
            problems.append(f"the learning rate is not scaled: {np} ranks must step with {np} x settings.learning_rate")
        else:
            problems.append(
                f"the weights are {diff:.1e} (of the largest) away from one process on the same {np} x "
                f"{args['batch_size']} examples: is each gradient averaged over the ranks (hvd.DistributedGradientTape)?"
            )
    return problems


def weights_table(named: Mapping[str, list[np.ndarray]], reference: str | None = None) -> pd.DataFrame:
    """How far each set of final weights is from ``reference`` (default: the first):
    ``max |difference|`` and that over the largest weight (``max rel``)."""
    if not named:
        raise ValueError("weights_table needs at least one set of weights")
    reference = reference or next(iter(named))
    ref = named[reference]
    rows = [{"run": name, **max_difference(ref, w)} for name, w in named.items()]
    out = pd.DataFrame(rows).set_index("run").rename(columns={"max_abs": "max |diff|", "max_rel": "max rel diff"})
    out.attrs["reference"] = reference
    return out


# ----------------------------------------------------------------------------- Horovod timeline


def _covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the union of ``intervals`` (tensors negotiate in parallel)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def timeline_summary(run: TrainRun | str | os.PathLike) -> pd.DataFrame:
    """Where a step's time went, from a Horovod timeline (written by rank 0's background
    thread): per activity, the wall time it covered (several tensors at once count
    once) and how many times each tensor went through it. ``NEGOTIATE_ALLREDUCE`` is
    waiting until every rank has that gradient ready; ``ALLREDUCE`` is the reduction
    itself, with the copies into and out of the fusion buffer.

    The first occurrence per tensor (the warm-up step, which also waits for every
    rank's tracing) is left out. Given a :class:`TrainRun`, adds milliseconds per
    step, ``compute and the rest`` (the measured time per step minus both) and
    each row's share of a step."""
    path = run.timeline_path if isinstance(run, TrainRun) else run
    if not path or not Path(path).is_file():
        raise ValueError("no timeline: run with run_hvd(..., timeline=True)")
    rows = []
    for name, spans in horovod_activities(read_horovod_timeline(path)).items():
        seen, kept = set(), []
        for tensor, lo, hi in spans:
            if tensor in seen or "ALLREDUCE" not in name:
                kept.append((lo, hi))
            seen.add(tensor)
        per_tensor = max(sum(1 for t, _, _ in spans if t == x) for x in seen)
        rows.append({"activity": name, "seconds": _covered(kept), "cycles": per_tensor - ("ALLREDUCE" in name)})
    rows.sort(key=lambda row: -row["seconds"])
    if isinstance(run, TrainRun):
        step_ms = run.step_time * 1e3
        steps = int(run.results["rank:0"]["local_steps"])
        rows = [row for row in rows if "ALLREDUCE" in row["activity"]]
        for row in rows:
            row["per step (ms)"] = row["seconds"] / steps * 1e3
        rest = max(0.0, step_ms - sum(row["per step (ms)"] for row in rows))
        rows.append(
            {"activity": "compute and the rest", "seconds": rest * steps / 1e3, "cycles": steps, "per step (ms)": rest}
        )
        for row in rows:
            row["share of a step"] = row["per step (ms)"] / step_ms
    return pd.DataFrame(rows).set_index("activity")


def show_step_times(runs: Iterable[TrainRun]) -> None:
    """Each run's milliseconds per step, then its :func:`timeline_summary` (Part B)."""
    from IPython.display import display

    for run in runs:
        print(f"{run.label}: {1e3 * run.step_time:.2f} ms per step")
        display(timeline_summary(run))


def wire_table(runs: Iterable[Any], traffic_per_step: Callable[[int, int], dict], nbytes: int) -> pd.DataFrame:
    """One row per run (Part C): the network bytes it wrote per step (``bytes_per_step()``:
    run with ``monitor=True``) beside the theory from ``traffic_per_step(nbytes, n)`` (Part A's
    exercise) for a gradient of ``nbytes``: ``n`` ranks' ``ring_per_rank`` for an all-reduce,
    ``ps_server`` plus ``n`` workers' ``ps_worker`` for a PS."""
    rows = []
    for run in runs:
        t = traffic_per_step(nbytes, run.size)
        ps = run.method.startswith("PS")
        theory = t["ps_server"] + run.size * t["ps_worker"] if ps else run.size * t["ring_per_rank"]
        rows.append(
            {
                "run": run.label,
                "workers": run.size,
                "loopback bytes written per step": run.bytes_per_step(),
                "theory": theory,
            }
        )
    return pd.DataFrame(rows).set_index("run")


# ----------------------------------------------------------------------------- Part D
