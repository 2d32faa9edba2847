"""Run a parameter-server cluster from a notebook and turn what it reported into tables.

Labs 2 and 3 call :func:`run_ps` once per experiment; it launches ``1 PS + N
workers`` with :class:`lab_utils.cluster.TFCluster`, samples every task with
:class:`lab_utils.metrics.Monitor` while it runs, and returns a :class:`PSRun`
holding what each worker reported (:func:`lab_utils.training.ps.train_worker`'s
result dicts and step events). The tables are in the form of the CS 744 report:

* :meth:`PSRun.workers_table`: execution time per node, local steps, examples/s;
* :meth:`PSRun.accuracy_curve`: test accuracy against time and global step
  (:func:`plot_accuracy` draws several runs' curves);
* :meth:`PSRun.dstat_table`: its Tables 1 and 2 (max/avg CPU, memory, total
  read/write, average throughput) per role and in total; :func:`dstat_compare`
  puts several runs side by side;
* :func:`compare` and :func:`exec_time_table`: one row per run (async vs sync,
  batch-size sweeps: its Tables 3 and 4); :func:`sweep_table` (Lab 3, Part 3)
  adds the slowest worker's training-loop time to Tables 3 and 4.

Lab 3's Part 5 shows how a synchronous run hangs with TensorFlow's defaults and what a
killed worker does (:func:`shutdown_hang_demo`, :func:`worker_failure_demo`, from
:mod:`lab_utils.training.ps.demo_runs`).

Lab 2 also starts a cluster *by hand* before ``run_ps`` takes over (:func:`run_two_tasks`,
:mod:`lab_utils.training.ps.hand.runs`) and shows TF2's ``ParameterServerStrategy``
(:func:`run_ps_strategy`, :mod:`lab_utils.training.ps.strategy.runs`).

Before a run, :func:`fit_workers` scales the worker count to what this machine
allows; :func:`inspect_graph` builds a student's ``build_graph`` out of the kernel
and says where everything was placed (the visible tests of Exercise 1). Nothing
here is needed to *understand* the training; it keeps the notebooks free of
plumbing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lab_utils import plots
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.training import loop
from lab_utils.training.ps.cluster_runs import cluster_memory, fit_sweep, fit_workers, ps_cluster, task_memory
from lab_utils.training.ps.demo_runs import FailureDemo, HangDemo, shutdown_hang_demo, worker_failure_demo
from lab_utils.training.ps.hand.runs import TwoTasks, load_two_tasks, run_two_tasks
from lab_utils.training.ps.strategy.runs import StrategyRun, run_ps_strategy
from lab_utils.training.runs import Run, RunOptions, every_task_reported, step_events, takes_run_options

__all__ = [
    "fit_workers",
    "fit_sweep",
    "task_memory",
    "cluster_memory",
    "inspect_graph",
    "ps_cluster",
    "run_ps",
    "PSRun",
    "compare",
    "exec_time_table",
    "dstat_compare",
    "plot_accuracy",
    "sweep_table",
    "LOOP_COLUMN",
    # Lab 2, Part 1 (a cluster started by hand) and its TF2 aside, re-exported from their modules
    "load_two_tasks",
    "run_two_tasks",
    "TwoTasks",
    "run_ps_strategy",
    "StrategyRun",
    # Lab 3, Part 5: the shutdown hang and a worker killed mid-run, re-exported from demo_runs
    "shutdown_hang_demo",
    "worker_failure_demo",
    "HangDemo",
    "FailureDemo",
]

#: The column :func:`sweep_table` adds to the CS 744 Tables 3 and 4.
LOOP_COLUMN = "Training Loop (seconds)"
MB = 1024**2
#: The test evaluations :attr:`PSRun.settled_accuracy` averages
SETTLED_EVALUATIONS = 3


@dataclass(repr=False)
class PSRun(Run):
    """What one parameter-server run reported. Build it with :func:`run_ps`; ``events`` are
    every worker's step events, ``wall_time`` from launch until every task exited."""

    results: dict[str, dict]  # worker task -> its result dict (training.ps.train_worker)
    started: float  # time.time() at launch

    # -- scalars
    def _chief(self) -> dict:
        return self.results.get("worker:0") or next(iter(self.results.values()))

    @property
    def mode(self) -> str:
        return self._chief().get("mode", "?")

    @property
    def workers(self) -> int:
        return len(self.results)

    @property
    def size(self) -> int:
        return self.workers

    @property
    def method(self) -> str:
        return f"PS ({self.mode})"

    @property
    def batch_size(self) -> int | None:
        return self._chief().get("batch_size")

    @property
    def accuracy(self) -> float:
        """The chief's test accuracy at the end of the run."""
        return float(self._chief()["accuracy"])

    @property
    def settled_accuracy(self) -> float:
        """The mean of the chief's last :data:`SETTLED_EVALUATIONS` test evaluations, the final one
        included: what the run converged to. With a constant learning rate the last model lands
        wherever the latest (in async mode possibly stale) update left it, so one evaluation spreads
        over seeds several times as much as this mean (``bench/bench_target_margin.py`` measures
        both); the labs' accuracy targets are checked on it."""
        return float(self.accuracy_curve()["accuracy"].tail(SETTLED_EVALUATIONS).mean())

    @property
    def final_global_step(self) -> int:
        return int(self._chief()["final_global_step"])

    @property
    def examples_per_sec(self) -> float:
        """Training examples per second of the whole cluster: all workers' examples
        over the longest training time (warm-up = start-up excluded)."""
        return loop.cluster_examples_per_sec(self.results)

    def seconds_per_global_step(self) -> float:
        """The longest training loop (evaluations left out) over the global steps: in sync mode
        the time of one step; in async mode the inverse of the cluster's update rate."""
        return max(float(r["train_time"]) for r in self.results.values()) / self.final_global_step

    @property
    def step_time(self) -> float:
        """:meth:`seconds_per_global_step`: a PS run's step is a global step."""
        return self.seconds_per_global_step()

    def bytes_per_global_step(self) -> float:
        """Network bytes written per global step, the whole run's (start-up and evaluations
        included) over its final global step: host-level loopback on one machine (every byte
        once), the sum of the tasks' links on emulated hosts (:meth:`dstat_table`)."""
        return self.monitored_bytes() / self.final_global_step

    def bytes_per_step(self) -> float:
        """:meth:`bytes_per_global_step`: a PS run's step is a global step."""
        return self.bytes_per_global_step()

    # -- tables
    def workers_table(self) -> pd.DataFrame:
        """One row per worker: the CS 744 'execution time per node' and what explains it."""
        rows = []
        for task in sorted(self.results, key=_task_key):
            r = self.results[task]
            row = {
                "task": task + (" (chief)" if r.get("is_chief") else ""),
                "local steps": r["local_steps"],
                "examples": r["examples"],
                "examples/s": r["examples_per_sec"],
                "exec time (s)": r["exec_time"],
                "train time (s)": r["train_time"],
                # the chief's test evaluations, outside train time (in sync R = N, every worker's: they wait them out)
                "eval time (s)": r.get("waited_for_eval", r.get("eval_time", 0.0)),
                "start-up (s)": r["startup_time"],
                "straggler delay (s/step)": r.get("straggler_delay", 0.0),
            }
            if r.get("mode") == "async":
                row["staleness mean"] = r.get("staleness_mean")
                row["staleness max"] = r.get("staleness_max")
            rows.append(row)
        return pd.DataFrame(rows).set_index("task")

    def accuracy_curve(self) -> pd.DataFrame:
        """Test accuracy measured by the chief during the run, plus the final value:
        columns ``time`` (s since launch), ``global_step``, ``accuracy``."""
        ev = self.events
        cols = ["time", "global_step", "accuracy"]
        rows = []
        if "accuracy" in ev.columns:
            part = ev.dropna(subset=["accuracy"])
            rows = [
                {"time": t - self.started, "global_step": s, "accuracy": a}
                for t, s, a in zip(part["time"], part["step"], part["accuracy"], strict=True)
            ]
        chief = self._chief()
        rows.append({"time": self.wall_time, "global_step": chief["final_global_step"], "accuracy": chief["accuracy"]})
        out = pd.DataFrame(rows, columns=cols)
        return out.drop_duplicates(subset=["global_step"], keep="last").reset_index(drop=True)[cols]

    def dstat_table(self) -> pd.DataFrame:
        """The CS 744 Tables 1 and 2 for this run: per role (PS, each worker) and in
        total, max and average CPU (% of one core), peak memory, and the network
        read/write totals with their average throughput over the run.

        Network bytes on one machine are host-level (the loopback interface carries
        every PS <-> worker byte and cannot be split per process), so they appear on
        the ``total`` row only, and count each byte once as sent and once as received.
        On emulated hosts (``hosts="emulated:..."``) each task has its own link, and the
        table has its bytes on its row (``attrs["network_scope"]`` says which)."""
        if self.monitor is None:
            raise ValueError("this run was made with monitor=False: no metrics to tabulate")
        s = self.monitor.summary()
        duration = max(1e-9, (self.monitor.stop_time or time.time()) - self.monitor.start_time)
        out = pd.DataFrame(
            {
                "Max CPU (%)": s["Peak CPU"],
                "Avg CPU (%)": s["Avg CPU"],
                "Memory (MB)": s["Peak Mem"] / MB,
                "Total Read (MB)": s["Network R"] / MB,
                "Total Write (MB)": s["Network W"] / MB,
                "Avg Read (MB/s)": s["Network R"] / MB / duration,
                "Avg Write (MB/s)": s["Network W"] / MB / duration,
            }
        )
        out.index.name = "task"
        out.attrs["network_scope"] = s.attrs.get("network_scope")
        out.attrs["seconds"] = duration
        return out.round(2)

    # -- display
    def describe(self) -> str:
        return (
            f"{self.mode}, {self.workers} workers, batch {self.batch_size}, global step {self.final_global_step}, "
            f"accuracy {self.accuracy:.4f}, {self.examples_per_sec:,.0f} examples/s, {self.wall_time:.1f} s"
        )

    def details_html(self) -> str:
        return self.workers_table().to_html(float_format="%.3f")


def _task_key(task: str) -> tuple:
    role, _, index = task.partition(":")
    return role, int(index) if index.isdigit() else 0


def inspect_graph(
    script: str | os.PathLike,
    *,
    mode: str,
    workers: int = 2,
    ps: int = 1,
    index: int = 0,
    args: Mapping[str, Any] | None = None,
    timeout: float = 120,
) -> dict:
    """Build ``script``'s ``build_graph(task, settings)`` for ``worker:<index>`` of a
    ``ps`` + ``workers`` cluster *in a separate Python process* (no server is
    started, nothing connects) and describe where everything was placed.

    A subprocess keeps TensorFlow's graph state, memory and log messages out of the
    notebook's kernel (see :mod:`lab_utils.training.ps.describe`). Returns
    ``{"variables": [{name, device}], "ops": [{name, type, device, inputs}],
    "loss_device", "global_step_device", "x": [dtype, shape], "y": [dtype, shape],
    "hooks": [{type, is_chief, num_tokens, replicas_to_aggregate, total_num_replicas}]}``.
    Raises RuntimeError with the end of the script's error output if it fails."""
    cmd = [
        sys.executable,
        "-m",
        "lab_utils.training.ps.describe",
        str(script),
        "--mode",
        mode,
        "--workers",
        str(workers),
        "--ps",
        str(ps),
        "--index",
        str(index),
        "--args",
        json.dumps(dict(args or {})),
    ]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"building the graph of {script} took more than {timeout:g} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise RuntimeError(
            f"building the graph of {script} for worker:{index} failed (exit {proc.returncode}):\n{tail}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


@takes_run_options(monitor=True, interval=0.5)
def run_ps(
    script: str | os.PathLike,
    *,
    workers: int = 2,
    args: Mapping[str, Any] | None = None,
    hosts: str | Sequence[str] | EmulatedHosts | None = None,
    options: RunOptions,
) -> PSRun:
    """Train with 1 PS + ``workers`` workers running ``script`` (every task runs the
    same file; ``TF_CONFIG`` tells each which task it is) and collect the results.
    ``monitor`` samples every task's CPU, memory and network; ``live`` shows them as it
    trains (in JupyterLab a figure redrawn in place; headless, one static figure).
    ``hosts``: where the tasks run, as :class:`~lab_utils.cluster.TFCluster` takes
    it: ``None``/``"local"`` (this machine, loopback), ``"emulated:bandwidth=100mbit"``
    (one network namespace per task, shaped links, with or without root; local with a note
    where the machine allows neither),
    ``"hostfile:nodes.txt"`` (ssh) or ``"slurm"``.

    ``args`` become the script's command line (``{"batch_size": 60}`` ->
    ``--batch-size 60``). The run ends by itself: every worker reaches the target
    global step, or a task fails (:class:`~lab_utils.cluster.ClusterError` with
    its log tail), or ``timeout`` seconds pass. Every process has exited when
    this returns or raises."""
    args = dict(args or {})
    started = time.time()
    t0 = time.monotonic()
    cluster = ps_cluster(
        script, workers=workers, args=args, timeout=options.timeout, progress=options.progress, hosts=hosts
    )
    mon = options.watch(cluster)
    wall = time.monotonic() - t0
    results = {task: r for task, r in cluster.results().items() if task.startswith("worker:")}
    hint = "does the script call lab_utils.training.ps.train_worker or report.result?"
    every_task_reported(results, (f"worker:{i}" for i in range(workers)), cluster.run_dir, hint)
    results = chief_evaluations_out(results)
    events = step_events(cluster)
    name = (
        options.label
        or f"{results['worker:0'].get('mode', '?')} W={workers} batch={results['worker:0'].get('batch_size')}"
    )
    return PSRun(
        results,
        started,
        label=name,
        events=events,
        wall_time=wall,
        args=args,
        monitor=mon,
        run_dir=str(cluster.run_dir),
    )


def chief_evaluations_out(results: Mapping[str, dict]) -> dict[str, dict]:
    """``results`` with, in a synchronous run that waits for every worker (R = N), the chief's
    evaluation time taken out of every other worker's ``train_time`` too (and its ``examples_per_sec``
    recomputed): while the chief evaluates it pushes no gradient, so no token is handed out and the
    others wait, which is the evaluation's cost, not training. Each such worker gets ``waited_for_eval``
    (s). Async runs, and sync runs with backup workers (R < N, which go on without the chief), are
    returned as they are: there nobody waits for the chief's evaluations."""
    chief = next((r for r in results.values() if r.get("is_chief")), None)
    if chief is None or chief.get("mode") != "sync":
        return dict(results)
    if (chief.get("replicas_to_aggregate") or len(results)) < len(results):
        return dict(results)
    waited = float(chief.get("eval_time") or 0.0)
    out = {}
    for task, r in results.items():
        if r.get("is_chief") or not waited:
            out[task] = r
            continue
        train = max(float(r["train_time"]) - waited, 1e-9)
        out[task] = {**r, "train_time": train, "examples_per_sec": r["examples"] / train, "waited_for_eval": waited}
    return out


def compare(runs: Sequence[PSRun]) -> pd.DataFrame:
    """One row per run: the numbers to compare async with sync or one batch size with another."""
    rows = []
    for r in runs:
        exec_times = [x["exec_time"] for x in r.results.values()]
        rows.append(
            {
                "run": r.label,
                "mode": r.mode,
                "workers": r.workers,
                "batch size": r.batch_size,
                "global steps": r.final_global_step,
                "test accuracy": r.accuracy,
                "exec time mean (s)": sum(exec_times) / len(exec_times),
                "exec time spread (s)": max(exec_times) - min(exec_times),
                "wall time (s)": r.wall_time,
                "examples/s": r.examples_per_sec,
            }
        )
    return pd.DataFrame(rows).set_index("run")


def exec_time_table(runs: Sequence[PSRun]) -> pd.DataFrame:
    """The CS 744 Tables 3 and 4: execution time (the slowest worker's, graph built
    to session closed) for each batch size."""
    rows = [
        {
            "Batch Size": r.batch_size,
            "Execution Time (seconds)": round(max(x["exec_time"] for x in r.results.values()), 2),
        }
        for r in runs
    ]
    return pd.DataFrame(rows).sort_values("Batch Size").reset_index(drop=True)


def dstat_compare(runs: Sequence[PSRun]) -> pd.DataFrame:
    """The CS 744 Tables 1 and 2 side by side: the ``total`` row of each run's
    :meth:`PSRun.dstat_table` (the whole machine: every task's CPU and memory
    summed; network host-level), one row per run."""
    rows = {}
    for r in runs:
        rows[r.label] = r.dstat_table().loc["total"]
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "run"
    return out


def plot_accuracy(runs: Sequence[PSRun], x: str = "global_step", title: str | None = None):
    """Test accuracy of each run against ``global_step`` or ``time`` (s since launch):
    :func:`lab_utils.plots.accuracy_curves` of their :meth:`PSRun.accuracy_curve`."""
    if x not in ("global_step", "time"):
        raise ValueError(f"x must be 'global_step' or 'time', got {x!r}")
    return plots.accuracy_curves([(r.label, r.accuracy_curve()) for r in runs], x=x, title=title)


def sweep_table(runs: Sequence[PSRun]) -> pd.DataFrame:
    """The CS 744 Tables 3 and 4 (:func:`exec_time_table`: ``Batch Size``,
    ``Execution Time (seconds)``) plus :data:`LOOP_COLUMN`, the slowest worker's
    training-loop time (Lab 3, Part 3). Both in seconds, rounded to 0.01.

    On a laptop-sized run the execution time (graph built -> session closed, the
    report's definition) carries a fixed start/stop cost of a few tenths of a
    second (the chief's model initialisation, the workers' readiness poll and, in
    sync mode, the chief session's stop grace period for its blocked queue-runner
    thread). The loop column shows the part that scales with the number of steps,
    which is what the report's 1/B and flat trends are about."""
    if not runs:
        raise ValueError("sweep_table needs at least one run, got none")
    sizes = [r.batch_size for r in runs]
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"one run per batch size expected, got batch sizes {sizes}")
    table = exec_time_table(runs)
    loop = {r.batch_size: round(max(w["train_time"] for w in r.results.values()), 2) for r in runs}
    table[LOOP_COLUMN] = table["Batch Size"].map(loop)
    return table
