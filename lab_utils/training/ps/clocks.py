"""Stale-synchronous parallel (SSP) on the parameter server of Labs 2-3: the task side (Lab 6).

Three consistency models on one PS, one knob, the *staleness bound* ``s``:

* BSP (bulk synchronous, Lab 3): every worker waits for every other one at each step;
* ASP (asynchronous, Lab 2): nobody ever waits, so a fast worker can run arbitrarily
  far ahead of a slow one (its gradients and the slow one's are stale);
* SSP: a worker may run ahead, but at most ``s`` steps ahead of the slowest worker.
  ``s = 0`` is lockstep (no worker starts step t+1 before every worker finished
  step t, as in BSP, though the updates are still applied one by one, not averaged);
  ``s = math.inf`` is ASP.

How it is built (``mode="ssp"`` of :func:`lab_utils.training.ps.train_worker`)
--------------------------------------------------------------------------------
Each worker's *clock* is the number of steps it has finished. The clocks live on
the PS in one int64 vector ``ssp/clocks`` of length N (:class:`SSPClocks`). A
worker's train step adds 1 to its own entry *after* its update has been applied
(one ``sess.run``: update, then tick). Before each step a worker reads the whole
vector and asks the rule ``may_start(clock, clocks, s)`` whether it may start; while
the answer is no, it reads again after a short pause (1 ms, doubling up to
:data:`MAX_PAUSE_SECS`), under a deadline (the run's ``step_timeout``): a peer that
died or hangs makes the run fail with the clocks it saw, never hang.

The rule is the student's (Lab 6, Exercise 1): it is passed in, never defined
here. ``clocks`` shows a worker that has finished its run as ``math.inf``: it holds
nobody back (at the end of its run a worker sets its entry to :data:`DONE`).

What the step events carry, so that the bound can be checked afterwards
-----------------------------------------------------------------------
Every step event of an SSP run has ``clock`` (this worker's clock when the step
started: ``local_step - 1``), ``min_clock`` (the smallest clock in the vector that
allowed it to start, read from the PS), ``staleness`` (``clock - min_clock``) and
``wait`` (seconds spent waiting for permission, from the first read's answer: the read
itself, a round trip to the PS every step, is not waiting). Clocks only go up, so when the
step started every worker had finished at least ``min_clock`` steps: the bound
held if ``staleness <= s`` in every event
(:func:`lab_utils.training.ssp.runs.check_bound`). Importing this module does not
import TensorFlow.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lab_utils.spans import SSP_ASK as ASK_SPAN
from lab_utils.spans import SSP_PAUSES
from lab_utils.spans import SSP_WAIT as WAIT_SPAN

__all__ = [
    "ASK_SPAN",
    "WAIT_SPAN",
    "DONE",
    "FIRST_PAUSE_SECS",
    "MAX_PAUSE_SECS",
    "MayStart",
    "SSPClocks",
    "Permission",
    "as_clocks",
    "wait_for_turn",
]

#: The clock a worker sets when it has finished its run (shown to the rule as ``math.inf``).
DONE = 2**62
#: First and longest pause between two reads of the clocks while a worker waits.
FIRST_PAUSE_SECS, MAX_PAUSE_SECS = SSP_PAUSES

#: ``may_start(clock, clocks, s) -> bool``: may a worker whose clock is ``clock`` start its
#: next step, given every worker's clock (``math.inf``: finished) and the bound ``s``?
MayStart = Callable[[int, list, "int | float"], bool]


@dataclass(frozen=True)
class Permission:
    """What a worker saw when it was allowed to start a step (the step event's fields)."""

    clock: int  # this worker's clock: steps it had finished
    min_clock: int  # the smallest clock in the vector that allowed it (finished workers excluded)
    wait: float  # seconds from the first read's answer to the permission: 0 when that answer was yes
    polls: int  # reads of the clocks it took
    asked: float = 0.0  # seconds the first read took (asking costs a round trip to the PS, waiting or not)

    @property
    def staleness(self) -> int:
        """How many steps this worker was ahead of the slowest one: ``clock - min_clock``."""
        return self.clock - self.min_clock

    def fields(self) -> dict:
        """The step event's SSP fields."""
        return {
            "clock": self.clock,
            "min_clock": self.min_clock,
            "staleness": self.staleness,
            "wait": round(self.wait, 6),
        }


def as_clocks(raw: Sequence[int] | np.ndarray) -> list:
    """The clocks vector read from the PS as the rule sees it: ints, with a finished
    worker's :data:`DONE` shown as ``math.inf``."""
    return [math.inf if int(c) >= DONE else int(c) for c in raw]


def _rule_says(may_start: MayStart, clock: int, clocks: list, bound: int | float) -> bool:
    answer = may_start(clock, list(clocks), bound)  # a copy: the rule cannot change what is recorded
    if not isinstance(answer, (bool, np.bool_)):
        raise TypeError(
            f"may_start({clock}, {clocks}, {bound}) must return True or False, got {type(answer).__name__} {answer!r}"
        )
    return bool(answer)


def wait_for_turn(
    read: Callable[[], Sequence[int]],
    may_start: MayStart,
    index: int,
    expected_clock: int,
    bound: int | float,
    deadline: float,
    *,
    task: str = "worker",
    sleep: Callable[[float], None] = time.sleep,
    now: Callable[[], float] = time.monotonic,
) -> Permission:
    """Read the clocks (``read()``) until ``may_start`` lets worker ``index`` start its
    next step; return what it saw. Pauses between reads start at 1 ms and double up to
    :data:`MAX_PAUSE_SECS`. Raises RuntimeError after ``deadline`` seconds (naming the
    clocks it last saw), or when the PS holds another clock for this worker than the
    ``expected_clock`` steps it has finished (two tasks with the same index)."""
    start = now()
    t0 = None  # the first answer: the wait is counted from there (asking is not waiting)
    pause, polls = FIRST_PAUSE_SECS, 0
    while True:
        clocks = as_clocks(read())
        polls += 1
        if t0 is None:
            t0 = now()
        own = clocks[index]
        if own != expected_clock:
            raise RuntimeError(
                f"{task}: the PS holds clock {own} for this worker, which has finished {expected_clock} steps "
                f"(clocks {clocks}): does another task have the same index?"
            )
        if _rule_says(may_start, own, clocks, bound):
            return Permission(own, int(min(clocks)), now() - t0 if polls > 1 else 0.0, polls, t0 - start)
        waited = now() - start
        if waited > deadline:
            low = min(c for i, c in enumerate(clocks) if i != index) if len(clocks) > 1 else math.inf
            slowest = ", ".join(f"worker:{i}" for i, c in enumerate(clocks) if i != index and c == low)
            why = (
                "every other worker has finished, so nobody can hold this one back: may_start never said yes"
                if low == math.inf
                else f"the slowest ({slowest}, clock {low}) has not finished its step: did it fail or hang? see its log"
            )
            raise RuntimeError(
                f"{task}: waited {waited:.1f} s (more than the step timeout {deadline:g} s) to start step "
                f"{own + 1} with staleness bound s={bound}: clocks on the PS {clocks}; {why}"
            )
        sleep(pause)
        pause = min(2 * pause, MAX_PAUSE_SECS)


class SSPClocks:
    """The clocks vector on the PS and one worker's operations on it.

    Build it inside the worker's graph (after the model, before the session): the
    variable goes to ``/job:ps/task:0``, the chief initialises it with the model.
    :meth:`tick` wraps the train fetch, :meth:`wait` is called before each step,
    :meth:`finish` once the worker's loop has ended."""

    def __init__(self, task_index: int, num_workers: int, bound: int | float, may_start: MayStart):
        import tensorflow as tf

        v1 = tf.compat.v1
        self.index, self.num_workers, self.bound, self.may_start = int(task_index), int(num_workers), bound, may_start
        self.finished_steps = 0
        self.permissions: list[Permission] = []
        self._pending: Permission | None = None
        with tf.device("/job:ps/task:0"), v1.variable_scope("ssp"):
            self.clocks = v1.get_variable(
                "clocks", [num_workers], tf.int64, v1.zeros_initializer(), trainable=False, use_resource=True
            )
            self._read = self.clocks.read_value()
            self._done = v1.scatter_update(self.clocks, [self.index], tf.constant([DONE], tf.int64))

    def tick(self, step_fetch):
        """``step_fetch`` (the global step after this worker's update) that also adds one
        to this worker's clock once the update is applied: one round trip per step."""
        import tensorflow as tf

        with tf.control_dependencies([step_fetch]):
            tick = tf.compat.v1.scatter_add(self.clocks, [self.index], tf.constant([1], tf.int64))
        with tf.control_dependencies([tick]):
            return tf.identity(step_fetch)

    def wait(self, sess, deadline: float, task: str = "worker") -> Permission:
        """Block until the rule lets this worker start its next step (see :func:`wait_for_turn`)."""
        import tensorflow as tf

        options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(deadline * 1000)))
        got = wait_for_turn(
            lambda: sess.run(self._read, options=options),
            self.may_start,
            self.index,
            self.finished_steps,
            self.bound,
            deadline,
            task=task,
        )
        self._pending = got
        return got

    def event_fields(self, previous: int, stats: Any) -> dict:
        """The step loop's ``extra``: the fields of the permission this step started with."""
        got, self._pending = self._pending, None
        if got is None:
            raise RuntimeError("SSPClocks.event_fields: this step never waited for permission (call wait first)")
        self.finished_steps += 1
        self.permissions.append(got)
        return got.fields()

    def finish(self, sess) -> None:
        """Set this worker's clock to :data:`DONE`: it holds nobody back any more."""
        sess.run(self._done)

    def summary(self) -> dict:
        """Result-dict fields: the bound, the staleness (clock gap) mean and max, time waiting."""
        gaps = [p.staleness for p in self.permissions]
        return {
            "staleness_bound": self.bound,
            "staleness_mean": float(np.mean(gaps)) if gaps else None,
            "staleness_max": max(gaps) if gaps else None,
            "wait_time": float(sum(p.wait for p in self.permissions)),
            "clock_polls": sum(p.polls for p in self.permissions),
        }
