"""Lab 2's TF2 aside from the notebook: a ``ParameterServerStrategy`` run, one call.

::

    run = ps_runs.run_ps_strategy(workers=2, steps=200, batch_size=64, learning_rate=0.5)
    run                      # accuracy, steps scheduled and applied, steps per worker, wall time
    run.steps                # one row per step: which worker ran it, its loss

:func:`run_ps_strategy` starts ``1 chief + 1 PS + workers`` tasks of a
:class:`~lab_utils.cluster.TFCluster` (``chief=1``) running the shipped
:mod:`lab_utils.training.ps.strategy`; the chief coordinates, and when it exits the
launcher stops the servers. Bounded by ``timeout``; a failing task raises
:class:`~lab_utils.cluster.ClusterError` with its log tail; every process has exited when
it returns or raises. This module does not import TensorFlow.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass

import pandas as pd

from lab_utils import checks
from lab_utils.cluster import (
    GUARD_MEMORY_BYTES,
    TF_TASK_MEMORY_BYTES,
    TFCluster,
    fit_count,
    nothing_fits,
)
from lab_utils.resources import available_memory_bytes
from lab_utils.training.ps.strategy.flags import parse_args
from lab_utils.training.runs import LaunchOptions, Run, every_task_reported, takes_launch_options

__all__ = ["StrategyRun", "run_ps_strategy", "strategy_memory", "fit_strategy_workers", "TASK_MODULE"]

#: What every task of the cluster runs.
TASK_MODULE = "-m lab_utils.training.ps.strategy"
MB = 1024**2
#: Private resident memory of the chief and of a worker of a TF2 strategy run, more than a
#: Lab 2 task's (:data:`~lab_utils.cluster.TF_TASK_MEMORY_BYTES`: eager runtime, function
#: library, the data set in the dataset function). Measured on the course host, 300 steps of
#: 60 with the full-size stand-ins: chief 503 MB, workers 428 and 440 MB, PS 279 MB (the offline
#: sample: 362, 396-406, 266); 14 % over the largest, as for a Lab 2 task.
CHIEF_MEMORY_BYTES = 576 * MB
WORKER_MEMORY_BYTES = 504 * MB


def strategy_memory(workers: int) -> int:
    """Memory a ``1 chief + 1 PS + workers`` strategy cluster needs, guards included."""
    own = TF_TASK_MEMORY_BYTES + CHIEF_MEMORY_BYTES + workers * WORKER_MEMORY_BYTES
    return own + (workers + 2) * GUARD_MEMORY_BYTES


def fit_strategy_workers(requested: int, available: int | None = None) -> int:
    """The largest worker count <= ``requested`` whose :func:`strategy_memory` fits the memory
    available under this session's limit; prints one line when it scales down, raises
    :class:`~lab_utils.cluster.ResourceError` when not even one worker fits."""
    checks.count("workers", requested)
    avail = available_memory_bytes() if available is None else available
    fit = fit_count(requested, strategy_memory, available=avail)
    if fit == 0:
        raise nothing_fits("not even 1 chief + 1 PS + 1 worker fits: they need", strategy_memory(1), avail)
    if fit < requested:
        print(
            f"[lab_utils] {requested} workers do not fit here beside a chief and a PS ({avail / MB:,.0f} MB "
            f"available, about {WORKER_MEMORY_BYTES / MB:.0f} MB per worker): using {fit}",
            flush=True,
        )
    return fit


@dataclass(kw_only=True, repr=False)
class StrategyRun(Run):
    """What the chief of a ``ParameterServerStrategy`` run reported (``wall_time``: launch
    until every task exited)."""

    result: dict  # the chief's result dict (lab_utils.training.ps.strategy.train)
    steps: pd.DataFrame  # step, worker, loss: one row per scheduled step, in scheduling order
    label: str = "ParameterServerStrategy"
    method = "ParameterServerStrategy"

    @property
    def size(self) -> int:
        """Workers (the chief and the PS left out)."""
        return int(self.result["num_workers"])

    @property
    def accuracy(self) -> float:
        return float(self.result["accuracy"])

    @property
    def examples_per_sec(self) -> float:
        return float(self.result["examples_per_sec"])

    @property
    def step_time(self) -> float:
        """The chief's training time over the steps it scheduled."""
        return float(self.result["train_time"]) / int(self.result["steps_scheduled"])

    def bytes_per_step(self) -> float:
        raise ValueError(f"{self.label}: run_ps_strategy does not count network bytes")

    @property
    def worker_steps(self) -> dict[str, int]:
        """How many of the scheduled steps each worker ran."""
        return dict(self.result["worker_steps"])

    def summary(self) -> pd.DataFrame:
        """One row per quantity: what the notebook shows."""
        r = self.result
        rows = [
            ("test accuracy", f"{r['accuracy']:.4f}"),
            ("loss: first step -> last step", f"{r['loss_first']:.3f} -> {r['loss_last']:.3f}"),
            ("steps scheduled by the chief", r["steps_scheduled"]),
            ("updates applied on the PS (optimizer.iterations)", r["updates_applied"]),
            ("steps run per worker", ", ".join(f"{w}: {n}" for w, n in r["worker_steps"].items())),
            ("variables on", ", ".join(r["variables_on"])),
            ("data", r.get("data_source", "?")),
            ("chief: start-up (s) / training (s)", f"{r['startup_time']:.1f} / {r['train_time']:.2f}"),
            ("examples/s", f"{r['examples_per_sec']:,.0f}"),
            ("wall time, launch to every task ended (s)", f"{self.wall_time:.1f}"),
        ]
        return pd.DataFrame(rows, columns=["quantity", "value"]).set_index("quantity")

    def describe(self) -> str:
        r = self.result
        split = ", ".join(f"{w} {n}" for w, n in r["worker_steps"].items())
        return (
            f"{r['steps_scheduled']} steps scheduled, {r['updates_applied']} applied ({split}), "
            f"accuracy {r['accuracy']:.4f}, {self.wall_time:.1f} s"
        )

    def __repr__(self) -> str:
        return f"<StrategyRun: {self.describe()}>"

    def _repr_html_(self) -> str:
        return (
            f"<b>ParameterServerStrategy</b>: 1 chief + 1 PS + {html.escape(str(self.result['num_workers']))} "
            "workers" + self.summary().to_html()
        )


@takes_launch_options(timeout=180.0, progress=False)
def run_ps_strategy(
    workers: int = 2,
    *,
    steps: int = 200,
    batch_size: int = 64,
    learning_rate: float = 0.5,
    seed: int = 0,
    hosts=None,
    options: LaunchOptions,
) -> StrategyRun:
    """Train logistic regression on the lab's MNIST with TF2's ``ParameterServerStrategy``:
    ``chief:0`` schedules ``steps`` steps of ``batch_size`` examples asynchronously on
    ``workers`` workers (fewer, with a printed line, where they do not fit:
    :func:`fit_strategy_workers`), the variables on ``ps:0`` (:mod:`lab_utils.training.ps.strategy`).
    Returns the chief's numbers (:class:`StrategyRun`). ``timeout`` bounds the whole run;
    ``hosts`` is :class:`~lab_utils.cluster.TFCluster`'s (default: this machine, in the
    job's private network). Raises ``ValueError`` on bad arguments before anything starts."""
    from lab_utils.training import loop

    args = ["--steps", str(steps), "--batch-size", str(batch_size), "--learning-rate", str(learning_rate)]
    args += ["--seed", str(seed)]
    loop.parse_or_raise(lambda: parse_args(args), f"for run_ps_strategy: {' '.join(args)}")
    workers = fit_strategy_workers(workers)  # also: an integer >= 1, or ValueError
    t0 = time.monotonic()
    cluster = TFCluster(
        ps=1,
        workers=workers,
        chief=1,
        script=TASK_MODULE,
        args=args,
        timeout=options.timeout,
        progress=options.progress,
        hosts=hosts,
        name="ps_strategy",
        # the cluster checks one figure per task: the mean of the chief's, the PS's and the workers'
        memory_per_task=(strategy_memory(workers) - (workers + 2) * GUARD_MEMORY_BYTES) // (workers + 2),
    )
    with cluster:
        cluster.wait()
    wall = time.monotonic() - t0
    (result,) = every_task_reported(cluster.results(), ["chief:0"], cluster.run_dir)
    events = cluster.events("step")
    table = pd.DataFrame(
        [{"step": e["step"], "worker": e["worker"], "loss": e["loss"]} for e in events if e.get("task") == "chief:0"],
        columns=["step", "worker", "loss"],
    )
    return StrategyRun(
        result=result,
        steps=table.sort_values("step").reset_index(drop=True),
        wall_time=wall,
        run_dir=str(cluster.run_dir),
    )
