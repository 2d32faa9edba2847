"""Lab 2, Part 1 from the notebook: start the student's two-task cluster, by hand.

::

    two = ps_runs.load_two_tasks("two_tasks.py")     # the script's functions, re-read after every edit
    two.cluster_spec("node0:2222", "node1:2222")     # quick checks in the kernel: no server starts
    run = ps_runs.run_two_tasks("two_tasks.py")      # ps:0 + worker:0, each from the student's TF_CONFIG
    run.values, run.read_back, run.tf_config["ps:0"]

:func:`run_two_tasks` launches ``python -m lab_utils.training.ps.hand two_tasks.py`` as
``ps:0`` and ``worker:0`` of a :class:`~lab_utils.cluster.TFCluster` (free ports, the
job's private network, one log per task, a deadline); :mod:`lab_utils.training.ps.hand`
turns the addresses into the CS 744 flags and runs the script, whose functions build
each task's TF_CONFIG. A task that fails raises a :class:`~lab_utils.cluster.ClusterError`
whose first line says which task and why (what the student's function returned, and what
was expected), followed by the end of that task's log. Every process has exited when
it returns or raises. This module does not import TensorFlow.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from lab_utils import checks
from lab_utils.cluster import ClusterError, TFCluster
from lab_utils.training.ps.hand.flags import UPDATES
from lab_utils.training.runs import every_task_reported
from lab_utils.training.student import load_student

__all__ = ["TwoTasks", "load_two_tasks", "run_two_tasks"]

#: The module the tasks run: it calls the student's script with the CS 744 flags.
TASK_MODULE = "-m lab_utils.training.ps.hand"


@dataclass
class TwoTasks:
    """What the worker of a hand-started 1 PS + 1 worker cluster reported."""

    values: list[float]  # the counter on the PS after each of the worker's increments
    read_back: float  # the counter read in a second session, after the first one closed
    device: str  # where the counter was placed
    cluster: dict  # the student's cluster spec, with the real addresses
    tf_config: dict[str, dict] = field(default_factory=dict)  # task -> the TF_CONFIG it started from
    wall_time: float = 0.0  # launch -> every task exited (s)
    run_dir: str | None = None

    def __repr__(self) -> str:
        values = ", ".join(f"{v:g}" for v in self.values)
        where = ", ".join(f"{job}: {', '.join(addresses)}" for job, addresses in self.cluster.items())
        return (
            f"<TwoTasks ({where}): worker:0 added 1 to a counter on {self.device} {len(self.values)} times "
            f"({values}) and read {self.read_back:g} back in a new session; {self.wall_time:.1f} s>"
        )


def load_two_tasks(path: str | os.PathLike = "two_tasks.py"):
    """The student's script as a module, imported afresh from ``path`` on every call (an
    edited and re-run ``%%writefile`` cell is seen; ``import two_tasks`` would keep the
    first version). Importing it starts nothing: its ``main`` runs only in a task."""
    return load_student(path)


def _explain(cluster: TFCluster, exc: ClusterError, script: str) -> ClusterError:
    """The launcher's error with the failing task's own reason first, when it gave one."""
    problems = cluster.task(exc.task, None).events("problem") if exc.task else []
    if not problems:
        return exc
    return ClusterError(
        f"{script} failed in {exc.task}: {problems[-1].get('message')} (exit code {exc.exit_code}; "
        f"logs in {cluster.run_dir})",
        task=exc.task,
        exit_code=exc.exit_code,
        log_tail=exc.log_tail,
    )


def run_two_tasks(
    script: str | os.PathLike = "two_tasks.py",
    *,
    updates: int = UPDATES,
    timeout: float = 90.0,
    progress: bool = False,
    hosts=None,
) -> TwoTasks:
    """Start ``ps:0`` and ``worker:0``, both running ``script`` with the CS 744 flags, and
    return what the worker reported (:class:`TwoTasks`). Each task builds its own
    TF_CONFIG with the script's ``cluster_spec`` and ``tf_config`` and starts its server
    from it; the worker adds 1 to a counter on the PS ``updates`` times.

    Bounded: ``timeout`` seconds for the whole run. A task that fails (a function that
    returns the wrong thing, an exception, a server that does not start) raises
    :class:`~lab_utils.cluster.ClusterError` naming the task and why, with its log tail.
    ``hosts``: as :class:`~lab_utils.cluster.TFCluster` takes it (default: this machine,
    in the job's private network)."""
    path = Path(script)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the `%%writefile {path.name}` cell first")
    checks.count("updates", updates)
    t0 = time.monotonic()
    cluster = TFCluster(
        ps=1,
        workers=1,
        script=TASK_MODULE,
        args=[str(path.resolve()), "--updates", str(updates)],
        timeout=timeout,
        ready_timeout=timeout,
        progress=progress,
        hosts=hosts,
        name=path.stem,
    )
    try:
        with cluster:
            cluster.wait()
    except ClusterError as exc:
        raise _explain(cluster, exc, path.name) from None
    wall = time.monotonic() - t0
    (result,) = every_task_reported(cluster.results(), ["worker:0"], cluster.run_dir)
    configs = {}
    for event in cluster.events("tf_config"):
        configs[event["task"]] = event["config"]
    return TwoTasks(
        values=result["values"],
        read_back=result["read_back"],
        device=result["device"],
        cluster=result["cluster"],
        tf_config=configs,
        wall_time=wall,
        run_dir=str(cluster.run_dir),
    )
