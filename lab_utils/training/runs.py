"""The kernel side every technique shares: the checks and the result of a finished run.

- :func:`every_task_reported`: a task that exited 0 without a result is an error that
  names it and says where its log is (every ``run_*`` calls it);
- :func:`step_events`: the ``step`` events of a finished job as a frame;
- :func:`horovod_job`: the ``horovodrun`` job of a data-parallel run;
- :class:`Run`: the fields, ``repr()`` and display every run's result shares, and the six
  questions every run kind answers (:data:`ANSWERS`), the only ones tables and notebooks ask;
- :class:`TrainRun` and :func:`finish_run`: what a data-parallel run reported (one
  result per rank); Lab 6's ``CompressionRun`` extends it;
- :func:`sweep_modes`: an experiment's runs, one line each, as a table;
- :func:`run_ranks`: one run of mpi4py ranks, one per emulated host (Lab 4's PS against
  ring, Lab 6's hybrid);
- :func:`one_result`: the result of a one-task job (Lab 5's device runs and checks);
- :class:`LaunchOptions` (``timeout``, ``progress``) and :class:`RunOptions` (and ``monitor``,
  ``interval``, ``live``, ``label``): the options every ``run_*`` takes, declared once
  (:func:`takes_launch_options`, :func:`takes_run_options`);
  :meth:`RunOptions.watch` runs a job to its end while they say how it is watched.

Run directories come from :func:`lab_utils.cluster.new_run_dir`; the speedup tables
from :mod:`lab_utils.training.tables`. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import html
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from lab_utils import checks
from lab_utils.cluster import MPIJob, netem
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.options import keyword_options
from lab_utils.training import loop
from lab_utils.training.weights import load_weights_file

STEP_COLUMNS = ["time", "task", "step", "examples"]
#: Open MPI's ring algorithm for MPI_Allreduce (what "ring all-reduce" means in a run's table).
RING = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca", "coll_tuned_allreduce_algorithm", "4"]


@dataclass(frozen=True)
class LaunchOptions:
    """How long a run may take and whether it shows its progress: what every ``run_*`` takes."""

    timeout: float | None = 600  # seconds before every process is stopped (None: the function's own)
    progress: bool = True  # a progress line of the tasks' steps


@dataclass(frozen=True)
class RunOptions(LaunchOptions):
    """:class:`LaunchOptions`, and how a training run is watched and named."""

    monitor: bool = False  # sample CPU, memory and network per task while it runs
    interval: float = 0.25  # seconds between samples
    live: bool = False  # draw the samples as they come (a static figure when headless)
    label: str | None = None  # the run's name in tables and plots

    def watch(self, job: Any):
        """Run ``job`` (a ``TFCluster`` or ``MPIJob``) to its end; its monitor (or None)."""
        from lab_utils.metrics import watch

        with job:
            return watch(job, interval=self.interval, sample=self.monitor, live=self.live)


def takes_launch_options(**defaults: Any) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(..., options: LaunchOptions)`` is called as ``fn(..., timeout=..., progress=...)``."""
    return keyword_options(LaunchOptions, **defaults)


def takes_run_options(**defaults: Any) -> Callable[[Callable], Callable]:
    """Decorator: ``fn(..., options: RunOptions)`` is called as ``fn(..., monitor=..., timeout=...)``
    with these ``defaults`` for the options not given (:func:`lab_utils.options.keyword_options`)."""
    return keyword_options(RunOptions, **defaults)


def every_task_reported(results: Mapping[str, Any], tasks: Iterable[str], run_dir: Any, hint: str = "") -> list[dict]:
    """The results of ``tasks``, in order; ``RuntimeError`` naming those that exited 0
    without one in ``results``, and where their logs are (``hint``: what the script should
    have called). The one check of every run kind."""
    tasks = list(tasks)
    missing = [t for t in tasks if t not in results]
    if missing:
        why = f" ({hint})" if hint else ""
        raise RuntimeError(f"{', '.join(missing)} exited 0 without reporting a result{why}; logs in {run_dir}")
    return [results[t] for t in tasks]


def one_result(job: Any) -> dict:
    """The result of a finished one-task ``job`` (:func:`every_task_reported`, naming its task)."""
    (task,) = (t.name for t in job.tasks)
    return every_task_reported(job.results(), [task], job.run_dir)[0]


def step_events(job: Any) -> pd.DataFrame:
    """Every task's ``step`` events of a finished ``job`` (empty: the usual columns, no rows)."""
    events = pd.DataFrame.from_records(job.events("step"))
    return pd.DataFrame(columns=STEP_COLUMNS) if events.empty else events


#: What every run kind answers, whatever its technique; tables and notebooks read only these:
#:
#: - ``size``: the workers, ranks, devices or stages that trained;
#: - ``method``: its name in tables ("PS (sync)", "horovod (gloo)", "towers", "ZeRO stage 1"...);
#: - ``accuracy``: the final test accuracy (NaN where the run measures none);
#: - ``examples_per_sec``: the whole run's training examples per second (NaN where none);
#: - ``step_time``: seconds per training step (NaN where none);
#: - ``bytes_per_step()``: the network bytes the whole run's tasks sent per step, each byte once
#:   (a ``ValueError`` that says why where the run counted none, ``monitor=True`` say).
ANSWERS = ("size", "method", "accuracy", "examples_per_sec", "step_time", "bytes_per_step")


def _answered_below_run(cls: type, name: str) -> bool:
    """Whether a class between ``cls`` and :class:`Run` defines ``name`` (or declares it a field)."""
    return any(
        name in vars(k) or name in vars(k).get("__annotations__", {}) for k in cls.__mro__[: cls.__mro__.index(Run)]
    )


def median_step_time(events: pd.DataFrame) -> float:
    """The slowest task's median time between its consecutive ``step`` events (its first step,
    a warm-up, left out): a run's step time from its events alone; NaN under two steps."""
    medians = []
    for _, part in events.groupby("task"):
        gaps = part.sort_values("step")["time"].diff().dropna()
        if len(gaps):
            medians.append(float(gaps.median()))
    return max(medians) if medians else float("nan")


@dataclass(kw_only=True, repr=False)
class Run:
    """What every launched run reported, whatever its technique: its ``label``, the tasks'
    ``step`` events, the wall time from launch to the last exit, the ``args`` it ran with,
    its run directory and its monitor (None unless ``monitor=True``).

    Every subclass answers :data:`ANSWERS` (``size``, ``method``, ``accuracy``,
    ``examples_per_sec``, ``step_time``, ``bytes_per_step()``): one that leaves one out is a
    ``TypeError`` where it is defined. It adds what its technique measured and says it in
    one line, :meth:`describe`; ``repr()`` and the notebook's display are built from that
    line (plus :meth:`details_html`, a table say)."""

    label: str
    events: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    wall_time: float = float("nan")
    args: dict = field(default_factory=dict)
    run_dir: str | None = None
    monitor: Any = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        missing = [name for name in ANSWERS if not _answered_below_run(cls, name)]
        if missing:
            raise TypeError(f"{cls.__name__} must answer {', '.join(missing)} (lab_utils.training.runs.ANSWERS)")

    def monitored_bytes(self) -> float:
        """Every byte the run's tasks wrote to the network, from its monitor: host-level on
        loopback (each byte once), the sum of the tasks' links on emulated hosts."""
        if self.monitor is None:
            raise ValueError(f"{self.label}: run with monitor=True to count bytes")
        return float(self.monitor.summary().loc["total", "Network W"])

    def describe(self) -> str:
        """What ran and what it measured, in one line."""
        raise NotImplementedError

    def details_html(self) -> str:
        """More for the notebook's display, after the line (HTML)."""
        return ""

    def timeline(self):
        """Where this run's time went, task by task (:class:`lab_utils.timeline.Timeline`):
        shown interactively in JupyterLab, as an image under papermill and nbgrader, with
        each task's compute / communication / wait shares; ``.summary()`` is the table."""
        from lab_utils import timeline

        if not self.run_dir:
            raise ValueError(f"{self.label}: no run folder, so no timeline")
        return timeline.load(self.run_dir, label=self.label)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.label!r}: {self.describe()}>"

    def _repr_html_(self) -> str:
        return f"<b>{html.escape(self.label)}</b>: {html.escape(self.describe())}" + self.details_html()


def saved_weights(run: Any) -> list[np.ndarray]:
    """The weights a run saved (``weights_path``); ``ValueError`` if it was run without ``save_weights=True``."""
    if not run.weights_path:
        raise ValueError(f"{run.label}: run without save_weights=True")
    return load_weights_file(run.weights_path)


@dataclass(repr=False)
class TrainRun(Run):
    """What one data-parallel run reported (:func:`run_hvd`, :func:`run_single`, :func:`run_mwms`)."""

    method: str  # "horovod (gloo)", "horovod (mpi)", "one process", "mwms (ring)"
    ranks: int
    results: dict[str, dict]  # "rank:<r>" -> that rank's result
    weights_path: str | None = None
    timeline_path: str | None = None

    def _rank0(self) -> dict:
        return self.results.get("rank:0") or next(iter(self.results.values()))

    @property
    def size(self) -> int:
        return self.ranks

    @property
    def accuracy(self) -> float:
        return float(self._rank0()["accuracy"])

    @property
    def step_time(self) -> float:
        """Seconds per timed training step on rank 0 (warm-up and evaluations excluded)."""
        r = self._rank0()
        return float(r["train_time"]) / int(r["local_steps"])

    @property
    def batch_size(self) -> int:
        """Examples per step of the whole run (all ranks together)."""
        r = self._rank0()
        return int(r["batch_size"]) * self.ranks * int(r.get("emulate_ranks", 1))

    @property
    def examples_per_sec(self) -> float:
        """All ranks' training examples over the longest training time."""
        return loop.cluster_examples_per_sec(self.results)

    def weights(self) -> list[np.ndarray]:
        return saved_weights(self)

    def bytes_per_step(self) -> float:
        """Host-level network bytes written (loopback included) per training step, the whole
        run's (start-up included) over its steps (the warm-up step included), from the monitor."""
        return self.monitored_bytes() / int(self._rank0()["steps"])

    def describe(self) -> str:
        return (
            f"{self.method}, {self.ranks} rank(s), batch {self.batch_size}, accuracy {self.accuracy:.4f}, "
            f"{self.examples_per_sec:,.0f} examples/s, {self.wall_time:.1f} s"
        )


def horovod_job(
    np: int,
    script: str,
    args: Any,
    *,
    controller: str,
    hosts: Any,
    run_dir: Any,
    name: str,
    options: LaunchOptions,
    **more: Any,
) -> MPIJob:
    """The ``horovodrun`` job of a data-parallel run (Lab 4's ``run_hvd``, Lab 6's
    compression runs): ``np`` ranks of ``script`` with ``args`` in ``run_dir``, bounded and
    shown as ``options`` say (not started). ``more``: the launcher's other keywords."""
    return MPIJob(
        np=np,
        script=script,
        args=args,
        launcher="horovodrun",
        controller=controller,
        hosts=hosts,
        timeout=options.timeout,
        progress=options.progress,
        run_dir=run_dir,
        name=name,
        **more,
    )


def finish_run(
    job,
    *,
    results: dict,
    label: str,
    method: str,
    ranks: int,
    args,
    t0: float,
    weights: str | None = None,
    timeline: str | None = None,
    monitor=None,
    cls=TrainRun,
    **extra,
) -> TrainRun:
    """A :class:`TrainRun` (or its subclass ``cls``, with ``extra`` fields) from a finished
    job whose ``results`` are keyed ``rank:<r>``; a rank without a result is an error.
    ``t0``: when the run started (``time.monotonic()``), for its wall time."""
    every_task_reported(results, (f"rank:{r}" for r in range(ranks)), job.run_dir)
    return cls(
        method,
        ranks,
        results,
        label=label,
        events=pd.DataFrame.from_records(job.events("step")),
        wall_time=time.monotonic() - t0,
        args=args,
        run_dir=str(job.run_dir),
        weights_path=weights,
        timeline_path=timeline,
        monitor=monitor,
        **extra,
    )


@dataclass(kw_only=True, repr=False)
class RanksRun(Run):
    """One run of :func:`run_ranks` (Lab 4's and Lab 6's experiments, :mod:`~lab_utils.training.netexp`
    and :mod:`~lab_utils.training.hybrid`): its ``row`` of the experiment's table (``mode``, ``workers``,
    ``network``, ``step_s``, ``examples_per_s``, the links' MB per step and the technique's own
    columns), its ``trace`` (the timeline's file) and, on emulated hosts, every host's link bytes
    sent per step."""

    row: dict
    trace: str | None = None
    sent_per_step: float | None = None  # emulated hosts: every link's bytes sent, per step
    accuracy = float("nan")  # the experiments time steps; they test no model

    @property
    def size(self) -> int:
        return int(self.row["workers"])

    @property
    def method(self) -> str:
        return str(self.row["mode"])

    @property
    def examples_per_sec(self) -> float:
        return float(self.row["examples_per_s"])

    @property
    def step_time(self) -> float:
        """The slowest worker's (a synchronous step ends with it)."""
        return float(self.row["step_s"])

    def bytes_per_step(self) -> float:
        if self.sent_per_step is None:
            raise ValueError(f"{self.label}: on loopback, no link counts its bytes (run on emulated hosts)")
        return self.sent_per_step

    def describe(self) -> str:
        return (
            f"{self.method}, {self.size} worker(s), {self.row['network']}, {self.step_time:.3f} s per step, "
            f"{self.examples_per_sec:,.1f} examples/s"
        )


def sweep_modes(
    run: Callable[..., RanksRun], runs: Iterable[tuple[str, int]], say: Callable[[dict], str], **kwargs: Any
):
    """``run(mode, workers, **kwargs)`` for each ``(mode, workers)`` of ``runs``, one line
    (``say(row)``) as each ends: the table of their rows (Lab 4's and Lab 6's experiments)."""
    rows, traces = [], {}
    for mode, workers in runs:
        done = run(mode, workers, **kwargs)
        row = dict(done.row)
        print(f"{mode:>9} with {workers} worker(s): {say(row)} ({row['network']})", flush=True)
        traces[(mode, workers)] = done.trace
        rows.append(row)
    table = pd.DataFrame(rows)
    table.attrs["traces"] = traces  # (mode, workers) -> its trace.json: experiment_timelines()
    return table


def experiment_timelines(table: pd.DataFrame, workers: int | None = None) -> dict:
    """``{mode: Timeline}`` of an experiment's runs (:func:`sweep_modes`'s table) with ``workers``
    workers (default: the most it ran), each labelled with its mode, workers and network."""
    from lab_utils import timeline

    traces = table.attrs.get("traces") or {}
    workers = int(table["workers"].max()) if workers is None else workers
    out = {}
    for _, row in table[table["workers"] == workers].iterrows():
        path = traces.get((row["mode"], workers))
        if path is None:
            raise ValueError(f"{row['mode']} with {workers} workers: no trace (the table lost its attrs?)")
        out[row["mode"]] = timeline.load(path, label=f"{row['mode']}, {workers} workers, {row['network']}")
    if not out:
        raise ValueError(f"no run with {workers} workers; the table has {sorted(table['workers'].unique())}")
    return out


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
    options: LaunchOptions,
    name: str,
) -> tuple[RanksRun, list[dict], list[dict]]:
    """One experiment run, one mpi4py rank per emulated host (a PS rank first when
    ``has_ps``): checked, launched with mpirun (Open MPI's ring for MPI_Allreduce when
    ``ring``), waited for. Returns ``(run, worker results, PS results)``; the run's row holds
    what every experiment reports: ``mode``, ``workers``, ``emulated``, ``network``,
    ``step_s`` (the slowest worker's), ``examples_per_s`` (all workers) and, from the
    links' counters over ``steps`` steps, ``ps_mb_per_step`` and ``worker_mb_per_step``
    (where emulated only). :mod:`lab_utils.training.netexp` and :mod:`lab_utils.training.hybrid` run their modes with it."""
    checks.count("workers", workers)
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
        timeout=options.timeout,
        progress=options.progress,
        name=name,
    )
    t0 = time.monotonic()
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
    sent = None
    if job.emulated:
        counts = job.network.counters()  # read once: both figures count the same bytes
        traffic = job.network.mb_per_step(steps, counts)
        row["ps_mb_per_step"] = traffic[0] if has_ps else None
        row["worker_mb_per_step"] = statistics.mean(traffic[i] for i in range(has_ps, workers + has_ps))
        sent = sum(c["sent"] for c in counts.values()) / steps
    run = RanksRun(
        label=f"{mode}, {workers} worker(s)",
        wall_time=time.monotonic() - t0,
        args=dict(args),
        run_dir=str(job.run_dir),
        row=row,
        trace=str(job.timeline.path) if job.timeline is not None else None,
        sent_per_step=sent,
    )
    return run, done, ps
