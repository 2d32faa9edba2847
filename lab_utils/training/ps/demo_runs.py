"""Lab 3, Part 5: how a synchronous PS run ends, shown on real clusters (the kernel side).

Two demos, each one call that returns something a notebook displays::

    from lab_utils.training.ps import runs as ps_runs      # re-exports both demos
    hang = ps_runs.shutdown_hang_demo("train_sync.py", workers=2, steps=100, deadline=10)
    hang                         # both runs' tables; hang.defaults / hang.fixed: one run each
    crash = ps_runs.worker_failure_demo("train_sync.py", async_script="train_async.py", workers=2)
    crash                        # one table per mode: what the PS and the other workers did

* :func:`shutdown_hang_demo` runs Lab 3's script twice: with TensorFlow's defaults
  (``--tf-defaults``, :mod:`lab_utils.training.ps.defaults`), stopped ``deadline`` s after
  every server was up, and with the course's settings (:mod:`lab_utils.training.ps`). Per
  task: the last global step, when it left its training loop, whether and when it exited,
  or where it was still stuck at the deadline.
* :func:`worker_failure_demo` kills one worker with SIGKILL (as a crash would) once the
  global step passes ``at_step``, and shows what the PS and the other workers did: in async
  they carry on to the target; in sync they wait for gradients and tokens that never come,
  and the course's per-step deadline (``step_timeout``) turns that into an error naming the
  worker.

Each run is *watched*, not waited on (:func:`watch`): a worker that exits non-zero does not
stop the others (``TFCluster.wait`` would), since what the others do next is the point.
Every run is bounded: the cluster's start-up (``ready_timeout``), then the deadline, then the
launcher's stop (SIGTERM, grace, SIGKILL); nothing is left running when a demo returns or
raises. Where a task is comes from the ``phase`` and ``step`` events it writes
(:func:`lab_utils.training.ps.phase`). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import html
import os
import re
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lab_utils import checks, report
from lab_utils.cluster import TFCluster
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.cluster.process import signal_group, tail
from lab_utils.training.ps.cluster_runs import ps_cluster
from lab_utils.training.runs import Run

__all__ = [
    "TaskOutcome",
    "WatchedRun",
    "HangDemo",
    "FailureDemo",
    "watch",
    "shutdown_hang_demo",
    "worker_failure_demo",
    "error_line",
]

#: Seconds between two looks at the tasks while a demo watches them (a probe, not a wait).
POLL = 0.03
#: A worker still in its training loop that reported no step for this long is blocked in one.
BLOCKED_AFTER = 1.0
#: How long the course's settings may take to end by themselves (they end in seconds).
FIXED_DEADLINE = 60.0
_ERROR = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)(?::\s.*)?$")


def error_line(log: str) -> str | None:
    """The last exception line of a task's log (``RuntimeError: worker:0: ...``), or None."""
    lines = [line.strip() for line in log.splitlines()]
    return next((line for line in reversed(lines) if _ERROR.match(line)), None)


# ----------------------------------------------------------------------------- one watched run


@dataclass
class TaskOutcome:
    """What one task did during a watched run (times in seconds after the launch)."""

    task: str
    exit_code: int | None  # None: still running at the deadline
    exited_after: float | None = None
    last_step: int | None = None  # the last global step it reported
    local_steps: int | None = None
    last_step_after: float | None = None
    left_loop_after: float | None = None  # its "closing" phase: training over
    phase: dict | None = None  # its last phase event
    error: str | None = None  # the last exception line of its log (non-zero exit)
    killed: bool = False

    @property
    def role(self) -> str:
        return self.task.split(":")[0]

    @property
    def running(self) -> bool:
        return self.exit_code is None


def _outcome(task, launched: float, exit_code: int | None, exited_after: float | None) -> TaskOutcome:
    events = task.events()
    steps = [e for e in events if e.get("kind") == "step"]
    phases = [e for e in events if e.get("kind") == "phase"]
    closing = next((e for e in phases if e.get("phase") == "closing"), None)
    out = TaskOutcome(task.name, exit_code, exited_after, phase=phases[-1] if phases else None)
    if steps:
        out.last_step, out.local_steps = steps[-1]["step"], steps[-1].get("local_step")
        out.last_step_after = steps[-1]["time"] - launched
    if closing is not None:
        out.left_loop_after = closing["time"] - launched
    if exit_code not in (None, 0):
        out.error = error_line(tail(task.log_path, 60))
    return out


@dataclass(kw_only=True, repr=False)
class WatchedRun(Run):
    """One watched cluster run: each task's :class:`TaskOutcome` at the end of the watch.
    A watch shows how the tasks end, not how fast they trained: its accuracy, examples/s and
    step time are NaN, and it counts no bytes."""

    tasks: dict[str, TaskOutcome]
    target: int
    deadline: float  # s after every server was up
    launched: float  # time.time() at the launch
    ready_after: float  # s from the launch until every server was up
    watched_for: float  # s from the launch until the watch ended (the deadline, or every worker gone)
    killed: dict | None = None  # {"task", "global_step", "after"} when a worker was killed
    notes: list[str] = field(default_factory=list)
    accuracy = examples_per_sec = step_time = float("nan")

    def workers(self) -> list[TaskOutcome]:
        return [o for o in self.tasks.values() if o.role == "worker"]

    @property
    def size(self) -> int:
        return len(self.workers())

    @property
    def method(self) -> str:
        """``PS (sync)`` or ``PS (async)``, as the tasks reported their mode (``PS`` before any did)."""
        modes = {o.phase.get("mode") for o in self.tasks.values() if o.phase and o.phase.get("mode")}
        return f"PS ({modes.pop()})" if len(modes) == 1 else "PS"

    def bytes_per_step(self) -> float:
        raise ValueError(f"{self.label}: a watched run counts no bytes (it shows how the tasks end)")

    def describe(self) -> str:
        return self.summary()

    def still_running(self) -> list[str]:
        """The workers still running when the watch ended (at the deadline)."""
        return [o.task for o in self.workers() if o.running]

    @property
    def ended(self) -> bool:
        """Whether every worker exited before the deadline."""
        return not self.still_running()

    def state(self, o: TaskOutcome) -> str:
        """One sentence: how the task ended, or where it was when the watch ended."""
        if o.role == "ps":
            if o.running:
                return "serving until the launcher stopped it (a PS never exits by itself)"
            return f"exited {o.exit_code} by itself"
        if o.killed:
            return f"killed (SIGKILL) at global step {self.killed['global_step']}, exit code {o.exit_code}"
        if o.exit_code == 0:
            return f"finished: exited 0 at global step {o.last_step}"
        if o.exit_code is not None:
            return f"failed: exit code {o.exit_code}"
        return "still running at the deadline: " + self._where(o)

    def _where(self, o: TaskOutcome) -> str:
        if o.phase is None:
            return "starting (no phase reported yet)"
        since = self.watched_for - (o.phase["time"] - self.launched)
        name, what, why = o.phase.get("phase"), o.phase.get("what", ""), o.phase.get("why")
        if name == "training" and o.last_step_after is not None:
            idle = self.watched_for - o.last_step_after
            if idle >= BLOCKED_AFTER:
                waiting = (
                    " (waiting for a token from the chief's queue runner)" if o.phase.get("mode") == "sync" else ""
                )
                return f"blocked in a train step after global step {o.last_step} for {idle:.1f} s{waiting}"
        return f"{what} for {since:.1f} s" + (f"; {why}" if why else "")

    def table(self) -> pd.DataFrame:
        """One row per task: last global step, local steps, when it left its loop and exited
        (s after launch), exit code, state; the first line of its error when it failed."""
        rows = []
        for name in sorted(self.tasks, key=_task_key):
            o = self.tasks[name]
            rows.append(
                {
                    "task": name + (" (chief)" if name == "worker:0" else ""),
                    "last global step": o.last_step,
                    "local steps": o.local_steps,
                    "left its loop (s)": _round(o.left_loop_after),
                    "exited (s)": _round(o.exited_after),
                    "exit code": o.exit_code,
                    "state": self.state(o),
                    "error": o.error,
                }
            )
        out = pd.DataFrame(rows, dtype=object).set_index("task")
        if not out["error"].notna().any():
            out = out.drop(columns="error")
        return out.where(out.notna(), "")

    def summary(self) -> str:
        """One line: how the run ended."""
        head = f"{self.label}: 1 PS + {len(self.workers())} workers, target global step {self.target}"
        if self.killed:
            head += f"; {self.killed['task']} killed at global step {self.killed['global_step']}"
        running = self.still_running()
        if running:
            return (
                f"{head}; {len(running)} of {len(self.workers())} workers still running at the deadline "
                f"({self.deadline:g} s after start-up, {self.watched_for:.1f} s after launch): "
                f"{', '.join(running)}; the launcher then stopped every task"
            )
        codes = ", ".join(f"{o.task} {o.exit_code}" for o in self.workers())
        return f"{head}; every worker exited by {self.watched_for:.1f} s after launch (exit codes: {codes})"

    def __repr__(self) -> str:
        return f"{self.summary()}\n{self.table().to_string()}"

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self.summary())}</p>" + self.table().to_html()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _task_key(name: str) -> tuple:
    role, _, index = name.partition(":")
    return role != "ps", int(index) if index.isdigit() else 0


def watch(
    cluster: TFCluster,
    deadline: float,
    *,
    label: str,
    target: int,
    on_poll: Callable[[TFCluster], None] | None = None,
) -> WatchedRun:
    """Start ``cluster``, then look at its tasks every :data:`POLL` s until every worker has
    exited or ``deadline`` s have passed since every server was up; ``on_poll(cluster)`` runs
    at each look (the failure demo kills a worker from it). A worker that fails does not end
    the watch. Each task's state is noted at the end of the watch, then every process is
    stopped (``with cluster``: also on an error or an Interrupt). Bounded by the cluster's
    ``ready_timeout``, ``deadline`` and its stop."""
    launched = time.time()
    exited: dict[str, float] = {}
    with cluster:
        ready_after = time.time() - launched
        end = time.monotonic() + deadline
        while True:
            now = time.time()
            for t in cluster.tasks:
                if t.name not in exited and t.poll() is not None:
                    exited[t.name] = now - launched
            if on_poll is not None:
                on_poll(cluster)
            workers = [t for t in cluster.tasks if t.role == "worker"]
            if all(t.name in exited for t in workers) or time.monotonic() >= end:
                break
            time.sleep(POLL)  # a look at the tasks under a deadline, not a wait for readiness
        watched_for = time.time() - launched
        outcomes = {t.name: _outcome(t, launched, t.exit_code, exited.get(t.name)) for t in cluster.tasks}
    return WatchedRun(
        label=label,
        tasks=outcomes,
        target=target,
        deadline=deadline,
        launched=launched,
        ready_after=ready_after,
        watched_for=watched_for,
        wall_time=watched_for,
        run_dir=str(cluster.run_dir),
        notes=list(cluster.notes),
    )


# ----------------------------------------------------------------------------- argument checks


def _run_args(args: Mapping[str, Any] | None, steps: int, **extra: Any) -> dict:
    """The script's options: ``args`` (no test evaluations unless asked), ``steps`` and ``extra``."""
    args = dict(args or {})
    for key in ("epochs", "steps", "tf_defaults", "step_timeout"):
        if key in args:
            raise ValueError(f"args sets {key!r}, which the demo sets itself; got args={args!r}")
    return {"eval_every": 0, **args, "steps": steps, **extra}


def _say(progress: bool, text: str) -> None:
    if progress:
        print(f"[demo_runs] {text}", flush=True)


def _cluster(script, workers: int, args: dict, hosts) -> TFCluster:
    """The cluster :func:`~lab_utils.training.ps.runs.run_ps` would run, never timed out by
    itself (:func:`watch` bounds it)."""
    return ps_cluster(script, workers=workers, args=args, timeout=None, progress=False, hosts=hosts)


# ----------------------------------------------------------------------------- the shutdown hang


@dataclass
class HangDemo:
    """:func:`shutdown_hang_demo`'s two runs: ``defaults`` (TensorFlow's) and ``fixed`` (the course's)."""

    defaults: WatchedRun
    fixed: WatchedRun

    def table(self) -> pd.DataFrame:
        """Both runs' :meth:`WatchedRun.table`, one above the other (index: run, task)."""
        return pd.concat({r.label: r.table() for r in (self.defaults, self.fixed)}, names=["run", "task"])

    def __repr__(self) -> str:
        return f"{self.defaults!r}\n\n{self.fixed!r}"

    def _repr_html_(self) -> str:
        return self.defaults._repr_html_() + self.fixed._repr_html_()


def shutdown_hang_demo(
    script: str | os.PathLike,
    *,
    workers: int = 2,
    steps: int = 100,
    deadline: float = 10.0,
    fixed_deadline: float = FIXED_DEADLINE,
    args: Mapping[str, Any] | None = None,
    hosts: str | Sequence[str] | EmulatedHosts | None = None,
    progress: bool = True,
    fixed_script: str | os.PathLike | None = None,
) -> HangDemo:
    """Run Lab 3's synchronous ``script`` to global step ``steps`` twice, 1 PS + ``workers``:

    1. with TensorFlow's defaults (``--tf-defaults``): watched for ``deadline`` s after every
       server is up, then stopped. Expect the workers to train in about a second, and the
       chief still to be closing its session at the deadline (TF waits 120 s there);
    2. with the course's settings: watched until every worker exits (they do, in seconds),
       at most ``fixed_deadline`` s.

    ``fixed_script``: the second run's script instead of ``script`` (Lab 3, Part 5: the
    student's ``sync_ending.py``, the same graph with the ending they wrote).
    ``args``: more of the script's options (``batch_size``, ``seed``...). Returns a
    :class:`HangDemo`. Bounded: two start-ups, ``deadline`` + ``fixed_deadline`` at most, two
    stops; nothing is left running."""
    checks.count("workers", workers)
    checks.count("steps", steps)
    checks.seconds("deadline", deadline)
    checks.seconds("fixed_deadline", fixed_deadline)
    fixed = (
        ("course settings", script)
        if fixed_script is None
        else (f"your ending ({Path(fixed_script).name})", fixed_script)
    )
    plan = [
        ("TensorFlow's defaults", script, _run_args(args, steps, tf_defaults=True), deadline),
        (*fixed, _run_args(args, steps), fixed_deadline),
    ]
    runs = []
    for label, path, run_args, limit in plan:
        _say(progress, f"{label}: 1 PS + {workers} workers to global step {steps}, watched for at most {limit:g} s")
        runs.append(watch(_cluster(path, workers, run_args, hosts), limit, label=label, target=steps))
        _say(progress, runs[-1].summary())
    return HangDemo(*runs)


# ----------------------------------------------------------------------------- a worker killed


class _Killer:
    """``on_poll`` of :func:`watch`: SIGKILL one task once any worker reported a global step
    >= ``at_step``; remembers when, and at which global step."""

    def __init__(self, name: str, at_step: int):
        self.name, self.at_step = name, at_step
        self.tails: dict[str, report.EventTail] = {}
        self.highest = 0
        self.killed: dict | None = None

    def __call__(self, cluster: TFCluster) -> None:
        if self.killed is not None:
            return
        for t in cluster.tasks:
            if t.role == "worker":
                reader = self.tails.setdefault(t.name, report.EventTail(t.events_path))
                for e in reader.read("step"):
                    self.highest = max(self.highest, int(e["step"]))
        victim = cluster.task(self.name, None)
        if self.highest >= self.at_step and victim.running():
            signal_group(victim.pgid, victim.pid, signal.SIGKILL)  # the whole task at once, as a crash
            self.killed = {"task": self.name, "global_step": self.highest, "time": time.time()}


@dataclass
class FailureDemo:
    """:func:`worker_failure_demo`'s runs (async first when there is one, then sync)."""

    runs: list[WatchedRun]

    def run(self, mode: str) -> WatchedRun:
        """The run of ``mode`` (``"async"`` or ``"sync"``)."""
        for r in self.runs:
            if r.label.startswith(mode):
                return r
        raise ValueError(f"no {mode!r} run in this demo; runs: {[r.label for r in self.runs]}")

    def table(self) -> pd.DataFrame:
        return pd.concat({r.label: r.table() for r in self.runs}, names=["run", "task"])

    def __repr__(self) -> str:
        return "\n\n".join(repr(r) for r in self.runs)

    def _repr_html_(self) -> str:
        return "".join(r._repr_html_() for r in self.runs)


def worker_failure_demo(
    sync_script: str | os.PathLike,
    *,
    async_script: str | os.PathLike | None = None,
    workers: int = 2,
    kill: str = "worker:1",
    at_step: int = 100,
    steps: int = 1000,
    step_timeout: float = 4.0,
    deadline: float = 60.0,
    args: Mapping[str, Any] | None = None,
    hosts: str | Sequence[str] | EmulatedHosts | None = None,
    progress: bool = True,
) -> FailureDemo:
    """Kill worker ``kill`` with SIGKILL once the global step reaches ``at_step``, in an
    asynchronous run of ``async_script`` (if given) and a synchronous run of ``sync_script``
    (the course's settings, with ``--step-timeout step_timeout``), 1 PS + ``workers``, target
    global step ``steps``. Each run is watched until every worker has exited, at most
    ``deadline`` s after start-up. Returns a :class:`FailureDemo`: per task its last global
    step, state, exit code and the first line of its error. Nothing is left running."""
    checks.count("workers", workers)
    if workers < 2:
        raise ValueError(f"a worker failure needs workers >= 2 (one to kill, one to watch), got {workers}")
    names = [f"worker:{i}" for i in range(workers)]
    if kill not in names:
        raise ValueError(f"kill must be one of {names}, got {kill!r}")
    checks.count("at_step", at_step)
    checks.count("steps", steps)
    if at_step >= steps:
        raise ValueError(f"at_step must be below steps (the run must still be going), got {at_step} >= {steps}")
    checks.seconds("step_timeout", step_timeout)
    checks.seconds("deadline", deadline)
    if deadline <= step_timeout:
        raise ValueError(f"deadline must be longer than step_timeout, got {deadline} <= {step_timeout}")
    run_args = _run_args(args, steps, step_timeout=step_timeout)
    runs = []
    for mode, script in (("async", async_script), ("sync", sync_script)):
        if script is None:
            continue
        label = f"{mode}, {kill} killed"
        _say(progress, f"{label} at global step {at_step}: 1 PS + {workers} workers to global step {steps}")
        killer = _Killer(kill, at_step)
        run = watch(_cluster(script, workers, run_args, hosts), deadline, label=label, target=steps, on_poll=killer)
        if killer.killed is not None:
            when = killer.killed["time"] - run.launched
            run.killed = {"task": kill, "global_step": killer.killed["global_step"], "after": round(when, 2)}
            run.tasks[kill].killed = True
        else:
            run.notes.append(f"{kill} was not killed: the run ended before global step {at_step}")
        _say(progress, run.summary())
        runs.append(run)
    return FailureDemo(runs)
