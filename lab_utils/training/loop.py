"""The pieces of a worker's training run that every technique reuses.

A technique module (``ps`` today; the all-reduce, multi-device and compression
labs next) builds its graph and session its own way, then composes these:

1. :func:`load_shard`: this worker's part of the training set, checked against
   the batch size; :func:`batches` draws shuffled batches from it.
2. :func:`run_steps`: the step loop. It calls the technique's step function
   until the global step reaches the target, reports one ``report.step`` event
   per step and, where an ``evaluate`` function is given (the chief), measures
   test accuracy every ``eval_every`` global steps, timed *apart* from training.
3. :func:`report_result`: the result dict (the technique's fields, the loop's
   counts and the :func:`timings`), reported with ``report.result`` and returned.

:class:`Clock` holds the wall-clock marks the timings are computed from. Nothing
here knows about parameter servers, tokens or TensorFlow sessions.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lab_utils import report

__all__ = [
    "Shard",
    "load_shard",
    "batches",
    "Clock",
    "LoopStats",
    "run_steps",
    "timings",
    "report_result",
    "accuracy",
    "cluster_examples_per_sec",
    "parse_or_raise",
    "autograph_files",
    "quick_exit",
]

#: ``step(x_batch, y_batch, stats) -> (global_step_after, loss)``; ``stats`` is the
#: loop's state *before* this step (for error messages).
StepFn = Callable[[np.ndarray, np.ndarray, "LoopStats"], tuple[Any, Any]]


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Shard:
    """This worker's training examples, and the whole data set they came from."""

    data: Any  # a lab_utils.data.Dataset (or anything with x_train, y_train, x_test, y_test)
    x: np.ndarray
    y: np.ndarray

    @property
    def n_train(self) -> int:
        """Examples in the whole training set (every worker's shards together)."""
        return len(self.data.y_train)

    def batches(self, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Endless shuffled batches over this shard (see :func:`batches`)."""
        return batches(self.x, self.y, batch_size, seed)


def load_shard(num_workers: int, index: int, batch_size: int, data=None) -> Shard:
    """Worker ``index`` of ``num_workers``'s shard of ``data`` (default: MNIST via
    :func:`lab_utils.data.load_mnist`). Raises ``ValueError`` when one batch is
    larger than the shard."""
    from lab_utils.data import load_mnist, shard

    if data is None:
        data = load_mnist(raw=True)  # its training images stay uint8: batches() converts each batch
    x, y = shard((data.x_train, data.y_train), num_workers, index)
    if batch_size > len(y):
        raise ValueError(
            f"batch_size={batch_size} is larger than this worker's shard "
            f"({len(y)} examples of {len(data.y_train)} over {num_workers} workers)"
        )
    return Shard(data, x, y)


def batches(x: np.ndarray, y: np.ndarray, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled full batches over ``(x, y)``, reshuffled every pass (a
    remainder smaller than a batch is skipped in that pass). uint8 images (a task's
    :func:`lab_utils.data.load_mnist` ``raw=True``) come out as float32 in [0, 1], one batch at
    a time (:func:`lab_utils.data.pixels`)."""
    from lab_utils.data import pixels

    rng = np.random.RandomState(seed)
    per_pass = len(y) // batch_size
    while True:
        # one row of indices per batch: a fresh permutation, its remainder dropped
        for rows in rng.permutation(len(y))[: per_pass * batch_size].reshape(per_pass, batch_size):
            yield pixels(x[rows]), y[rows]


# ----------------------------------------------------------------------------- timing


class Clock:
    """Named wall-clock marks (``time.time()``) of one worker's run.

    Created at process start-up (mark ``start``); the run then marks ``graph``
    (graph built), ``session`` (session open), ``ready`` (training starts, set by
    :func:`run_steps`), ``trained`` (loop done, set by :func:`run_steps`) and
    ``end`` (session closed). :func:`timings` turns them into durations."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {"start": time.time()}

    def mark(self, name: str) -> float:
        self.marks[name] = time.time()
        return self.marks[name]

    def __getitem__(self, name: str) -> float:
        try:
            return self.marks[name]
        except KeyError:
            raise KeyError(f"no {name!r} mark yet; marked so far: {', '.join(self.marks)}") from None

    def __repr__(self) -> str:
        start = self.marks["start"]
        return "<Clock " + ", ".join(f"{k} +{v - start:.3f} s" for k, v in self.marks.items()) + ">"


# ----------------------------------------------------------------------------- the loop


@dataclass
class LoopStats:
    """What the step loop counted: the last global step seen, this worker's local
    steps and examples, and the seconds spent in evaluations (not training)."""

    step: int = 0
    local_steps: int = 0
    examples: int = 0
    eval_time: float = 0.0


def _next_eval(step: int, eval_every: int) -> int | None:
    return (step // eval_every + 1) * eval_every if eval_every else None


def run_steps(
    step: StepFn,
    batch_iter: Iterator[tuple[np.ndarray, np.ndarray]],
    target: int,
    *,
    clock: Clock,
    global_step: Callable[[], int],
    evaluate: Callable[[], float] | None = None,
    eval_every: int = 0,
    before_step: Callable[[], None] | None = None,
    extra: Callable[[int, LoopStats], Mapping[str, Any]] | None = None,
    done: Callable[[int], bool] | None = None,
) -> LoopStats:
    """Train until the global step reaches ``target`` (or, with ``done``, until
    ``done(step)`` is true for the value the last step returned); return the counts.

    Marks ``ready`` on ``clock``, reads the starting ``global_step()``, then per
    step: ``before_step()``, the next batch, ``step(x, y, stats)``, and one
    ``report.step(global_step, examples, local_step=, loss=, ...)`` event with
    ``extra(previous_global_step, stats)``'s fields and, every ``eval_every``
    global steps when ``evaluate`` is given, ``accuracy=evaluate()`` (its time
    goes to ``stats.eval_time``, not to training). Marks ``trained`` at the end.

    Each step event carries the step's start (``started``) and the spans the technique
    recorded during it with :func:`lab_utils.report.span` (the evaluation is an ``eval``
    span): the run's timeline (:mod:`lab_utils.timeline`)."""
    started = clock.mark("ready")  # the first step's bar starts with the training time
    stats = LoopStats(step=int(global_step()))
    next_eval = _next_eval(stats.step, eval_every)
    if done is None:
        done = target.__le__  # the global step reached the target
    while not done(stats.step):
        if before_step is not None:
            before_step()
        report.straggle()  # LABS_STRAGGLER: this task made slow, every step
        xb, yb = next(batch_iter)
        previous = stats.step
        new_step, loss = step(xb, yb, stats)
        stats.step = int(new_step)
        stats.local_steps += 1
        stats.examples += len(yb)
        fields = dict(extra(previous, stats)) if extra is not None else {}
        if evaluate is not None and next_eval is not None and stats.step >= next_eval:
            t_eval = time.time()
            fields["accuracy"] = float(evaluate())
            t_done = time.time()
            stats.eval_time += t_done - t_eval
            report.add_span("evaluate", "eval", t_eval, t_done)
            next_eval = _next_eval(stats.step, eval_every)
        record = report.step(
            stats.step, stats.examples, started=started, local_step=stats.local_steps, loss=float(loss), **fields
        )
        started = record["time"]  # steps tile the loop: writing this event is part of the next step
    clock.mark("trained")
    return stats


def leave_when(leave_loop: Callable[[int, int], bool], target: int, who: str) -> Callable[[int], bool]:
    """:func:`run_steps`'s ``done`` from a rule ``leave_loop(value, target) -> bool`` (Lab 3, Part 5:
    a student's), called with the value each step returned (a sync worker's token): a bool each
    step, and an error naming ``who``, not an endless run, when it still says "stay" at twice the
    target."""

    def done(value: int) -> bool:
        leave = leave_loop(value, target)
        if not isinstance(leave, (bool, np.bool_)):
            raise TypeError(f"{who}: leave_loop({value}, {target}) must return True or False, got {leave!r}")
        if not leave and value >= 2 * target + 2:
            raise RuntimeError(
                f"{who}: leave_loop({value}, {target}) is still False at global step {value}, twice the "
                f"target {target}: a worker must leave its loop once the token it received is worth the target"
            )
        return bool(leave)

    return done


# ----------------------------------------------------------------------------- the result


def timings(stats: LoopStats, clock: Clock) -> dict:
    """Throughput and durations (s) of a finished run, from ``clock``'s marks."""
    train_time = clock["trained"] - clock["ready"] - stats.eval_time
    return {
        "examples_per_sec": stats.examples / train_time if train_time > 0 else None,
        "exec_time": clock["end"] - clock["graph"],  # graph built -> session closed (the CS 744 "execution time")
        "train_time": train_time,  # the loop without the chief's evaluations
        "eval_time": stats.eval_time,
        "startup_time": clock["ready"]
        - clock["start"],  # process start -> training starts (import, data, session, barrier)
        "barrier_wait": clock["ready"] - clock["session"],  # session open -> every worker ready
    }


def cluster_examples_per_sec(results: Mapping[str, Mapping[str, Any]]) -> float:
    """Training examples per second of a whole run from its tasks' result dicts: every
    task's ``examples`` over the longest ``train_time`` (start-up and warm-up excluded)."""
    rows = list(results.values())
    longest = max(r["train_time"] for r in rows)
    return sum(r["examples"] for r in rows) / longest if longest > 0 else float("nan")


def report_result(
    head: Mapping[str, Any], stats: LoopStats, clock: Clock, tail: Mapping[str, Any] | None = None
) -> dict:
    """``head``, the loop's ``local_steps`` and ``examples``, the :func:`timings`,
    then ``tail``: reported with ``report.result`` and returned."""
    result = {
        **head,
        "local_steps": stats.local_steps,
        "examples": stats.examples,
        **timings(stats, clock),
        **(tail or {}),
    }
    report.result(**result)
    return result


def accuracy(model, x: np.ndarray, y: np.ndarray, chunk: int | None = None) -> float | None:
    """The share of ``y`` that ``model`` (Keras) classifies right on images ``x`` (bytes or
    floats: :func:`lab_utils.data.pixels`), ``chunk`` examples at a time (None: all at once);
    None when there are no examples. Give a large model its training batch: activations the
    process already holds (500 at a time made Lab 4's AlexNet rank 0 0.3 GB larger than the
    others; 250 made Lab 5's process 0.2 GB larger at width 1)."""
    from lab_utils.data import pixels

    if not len(y):
        return None
    chunk = chunk or len(y)
    logits = np.concatenate([model(pixels(x[i : i + chunk]), training=False).numpy() for i in range(0, len(y), chunk)])
    return float(np.mean(np.argmax(logits, axis=1) == y))


# ----------------------------------------------------------------------------- arguments


def parse_or_raise(parse: Callable[[], Any], what: Any) -> Any:
    """``parse()`` (a task's argparse-based parser) for the notebook side: where it would
    end the process on bad input, raise ``ValueError("bad arguments <what>: <argparse's
    message>")`` instead, before anything launches."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parse()
    except SystemExit as exc:
        message = err.getvalue().strip().splitlines()
        raise ValueError(f"bad arguments {what}: {message[-1] if message else exc}") from None


# ----------------------------------------------------------------------------- ending


def autograph_files() -> list[str]:
    """The ``__autograph_generated_file*.py`` TensorFlow wrote for this process's
    ``tf.function``s (in the temporary directory; its atexit hook removes them)."""
    return [
        module.__file__
        for name, module in list(sys.modules.items())
        if name.startswith("__autograph_generated_file") and getattr(module, "__file__", None)
    ]


def quick_exit(code: int = 0) -> None:
    """End this task's process now (``os._exit``), from any thread, without TensorFlow's
    teardown, but without leaving behind the ``__autograph_generated_file*.py`` that each
    ``tf.function`` writes to the temporary directory and only an atexit hook removes."""
    for path in autograph_files():
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
