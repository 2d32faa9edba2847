"""Between-graph parameter-server training on TensorFlow's own runtime (Labs 2, 3 and 6): the task side.

Every task of a Lab 2 or 3 cluster runs the same script (``train_async.py`` or
``train_sync.py``, which students complete in the lab notebook)::

    settings, task = ps.parse_args("sync", argv)     # bad input: exit 2, before TensorFlow
    if task.job == "ps":
        ps.serve(task)                               # hold the variables until stopped
    else:
        ps.train_worker(task, settings, build=build_graph)

``build_graph(task, settings) -> PSGraph`` is the student's part: the graph that
makes this parameter-server training. Everything else (settings, the start
barrier, the session, the shutdown protocol) is here; the shard, step loop,
timing and result dict are :mod:`lab_utils.training.loop`'s, shared with the
other techniques. Importing this module does not import TensorFlow; only the
functions that build or run graphs do.

How a run is laid out, Lab 2's asynchronous and Lab 3's synchronous updates, why synchronous
runs hang at shutdown and how this module ends every run, Lab 6's SSP, and how a global step's
gradients are counted: ``README.md`` beside this file.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lab_utils import report
from lab_utils.spans import SSP_ASK as ASK_SPAN
from lab_utils.spans import SSP_WAIT as WAIT_SPAN
from lab_utils.spans import TOKEN_SPANS
from lab_utils.training import loop
from lab_utils.training.ps.graph import GradientCounter, PSGraph, StepStamps, phase, session_config, start_barrier
from lab_utils.training.ps.settings import (
    MODES,
    STEP_TIMEOUT_SECS,
    Settings,
    check_settings,
    make_parser,
    parse_args,
    parse_staleness,
    parse_straggler,
    steps_per_epoch,
    target_global_steps,
)

__all__ = [
    "MODES",
    "STOP_GRACE_PERIOD_SECS",
    "READY_POLL_SECS",
    "SESSION_WAIT_SECS",
    "STEP_TIMEOUT_SECS",
    "Settings",
    "PSGraph",
    "GradientCounter",
    "make_parser",
    "parse_args",
    "parse_straggler",
    "parse_staleness",
    "check_settings",
    "steps_per_epoch",
    "target_global_steps",
    "session_config",
    "session_creator",
    "straggle",
    "start_barrier",
    "serve",
    "phase",
    "train_worker",
]

#: How long a closing session waits for its threads (TF default 120 s; the
#: chief's queue-runner thread is blocked waiting for gradients and never joins).
STOP_GRACE_PERIOD_SECS = 0.5
#: How often a non-chief worker checks whether the chief initialised the model (TF default 30 s).
READY_POLL_SECS = 0.25
#: How long a non-chief worker waits for the chief to initialise the model.
SESSION_WAIT_SECS = 120.0


# ----------------------------------------------------------------------------- running


def straggle(seconds: float) -> None:
    """Simulated slowness: the straggler knob. The one deliberate sleep in the labs."""
    if seconds > 0:
        time.sleep(seconds)


def _one_line_for_cancelled_queue_runners() -> None:
    """In this process, a queue-runner thread cancelled by its session's close says so in
    one line instead of a traceback.

    After an error in the training loop (a step past its deadline), ``MonitoredSession``
    closes the session while the chief's queue runner is still blocked waiting for
    gradients. Its step is cancelled, and because the coordinator has already joined, the
    thread re-raises ``CancelledError``: a second traceback, written line by line into
    the same log while the main thread writes the error that matters. The two interleave,
    and the log's last exception line could be the consequence instead of the cause.
    Here the consequence is one line, written at once, that names the thread; every other
    thread exception goes to the previous hook."""
    import threading

    previous = threading.excepthook
    if getattr(previous, "_labs_queue_runners", False):
        return  # installed already

    def hook(args) -> None:
        thread = getattr(args.thread, "name", "") or ""
        error = type(args.exc_value)
        cancelled = error.__name__ == "CancelledError" and error.__module__.startswith("tensorflow")
        if cancelled and thread.startswith("QueueRunnerThread"):
            sys.stderr.write(
                f"{thread} stopped: its step was cancelled when the session closed ({str(args.exc_value).strip()})\n"
            )
            sys.stderr.flush()
            return
        previous(args)

    hook._labs_queue_runners = True
    threading.excepthook = hook


def serve(task) -> None:
    """The PS task: start the server, report ready, serve until the launcher stops it."""
    from lab_utils.cluster import start_server

    server = start_server(task)
    server.join()


def session_creator(task, target: str, config):
    """The chief's session creator (it initialises the model), or a worker's that
    polls for the initialised model every :data:`READY_POLL_SECS` (TF: 30 s), up
    to :data:`SESSION_WAIT_SECS`."""
    import tensorflow as tf

    v1 = tf.compat.v1
    if task.is_chief:
        return v1.train.ChiefSessionCreator(master=target, config=config)

    class WorkerSessionCreator(v1.train.WorkerSessionCreator):
        """TF's worker session creator, polling for the model every READY_POLL_SECS (not 30 s)."""

        def _get_session_manager(self):
            if self._session_manager is None:
                from tensorflow.python.training import session_manager  # the class TF itself uses

                self._session_manager = session_manager.SessionManager(
                    local_init_op=self._scaffold.local_init_op,
                    local_init_feed_dict=self._scaffold.local_init_feed_dict,
                    ready_op=self._scaffold.ready_op,
                    ready_for_local_init_op=self._scaffold.ready_for_local_init_op,
                    graph=v1.get_default_graph(),
                    recovery_wait_secs=READY_POLL_SECS,
                )
            return self._session_manager

    return WorkerSessionCreator(master=target, config=config, max_wait_secs=SESSION_WAIT_SECS)


def _step_after(g: PSGraph, mode: str):
    """What a train step fetches: the global step the worker stops on."""
    if mode == "sync":
        # SyncReplicasOptimizer's train op evaluates to the token this worker got: the
        # global step of the update that released it. Stopping on the token (not on a
        # fresh read of global_step) means a worker only stops once the final update
        # has handed out its tokens, so no other worker is left waiting for one.
        return g.train_op
    import tensorflow as tf

    with tf.control_dependencies([g.train_op]):
        return tf.identity(g.global_step.read_value())  # the global step after my update


def _meet_at_barrier(sess, barrier, task) -> None:
    """Everybody starts training together (start-up skew is not a straggler)."""
    if barrier is None:
        return
    import tensorflow as tf

    arrive, wait = barrier
    sess.run(arrive)
    try:
        sess.run(wait, options=tf.compat.v1.RunOptions(timeout_in_ms=int(SESSION_WAIT_SECS * 1000)))
    except tf.errors.DeadlineExceededError as exc:
        raise RuntimeError(
            f"{task.task}: the other workers did not reach the start barrier within "
            f"{SESSION_WAIT_SECS:g} s (did one of them fail? see its log)"
        ) from exc


def _step_stamps(g: PSGraph, fetch, task, settings: Settings) -> StepStamps | None:
    """The in-graph timestamps that split each train step into pull, compute and push (sync
    mode: token wait), or None: ``LABS_TRACE=0`` adds nothing to the graph, and a graph whose
    gradients do not go to a PS has nothing to split (:class:`StepStamps`)."""
    if not report.tracing():
        return None
    return StepStamps.build(fetch, g.loss, (task.job, task.index), token=settings.mode == "sync")


def _train_step(sess, g: PSGraph, fetch, task, settings: Settings, target: int, stamps=None) -> loop.StepFn:
    """One train step under the ``step_timeout`` deadline; a blocked step or a closed
    queue becomes a clear error instead of a hang or a silently shortened run. With
    ``stamps`` (:class:`StepStamps`, fetched with the step) it records the step's spans."""
    import tensorflow as tf

    options = tf.compat.v1.RunOptions(timeout_in_ms=int(settings.step_timeout * 1000))
    fetches = [fetch, g.loss if stamps is None else stamps.tensor]  # the stamps come with the loss

    def step(xb, yb, at: loop.LoopStats):
        before = time.time()
        try:
            new_step, out = sess.run(fetches, feed_dict={g.x: xb, g.y: yb}, options=options)
        except tf.errors.DeadlineExceededError as exc:
            raise RuntimeError(
                f"{task.task}: a train step blocked for more than {settings.step_timeout:g} s at local step "
                f"{at.local_steps} (global step {at.step} of {target}); in sync mode this means no token came: "
                "the chief's queue runner stopped or too few workers are pushing gradients"
            ) from exc
        except tf.errors.OutOfRangeError as exc:
            # MonitoredSession.__exit__ would swallow this and end the run early as if it had finished.
            raise RuntimeError(
                f"{task.task}: a queue on the PS was closed at local step {at.local_steps} (global step {at.step} of "
                f"{target}); in sync mode the chief stopped and closed the token queue before this worker "
                "got its last token"
            ) from exc
        if stamps is None:
            return new_step, out
        for span in stamps.spans(before, out, time.time()):
            report.add_span(*span)
        return new_step, out[0]

    return step


class _Staleness:
    """Asynchronous mode: updates by other workers since my previous one, i.e. how
    stale the parameters my gradient was computed on were (one step event field)."""

    def __init__(self) -> None:
        self.values: list[int] = []

    def __call__(self, previous: int, stats: loop.LoopStats) -> dict:
        if stats.local_steps < 2:
            return {}
        self.values.append(max(0, stats.step - previous - 1))
        return {"staleness": self.values[-1]}

    def summary(self) -> dict:
        v = self.values
        return {"staleness_mean": float(np.mean(v)) if v else None, "staleness_max": max(v) if v else None}


def _result_fields(sess, g: PSGraph, task, settings: Settings, target: int, test_feed) -> tuple[dict, dict]:
    """The PS fields of the result dict: before the loop's counts and after its timings."""
    head = {
        "mode": settings.mode,
        "accuracy": float(sess.run(g.accuracy, feed_dict=test_feed)),
        "final_global_step": int(sess.run(g.global_step)),
        "target_global_steps": target,
    }
    tail = {
        "batch_size": settings.batch_size,
        "num_workers": settings.num_workers,
        "straggler_delay": settings.straggler.get(task.task, 0.0),
        "is_chief": task.is_chief,
    }
    if settings.mode == "sync":
        tail["replicas_to_aggregate"] = settings.replicas
        if g.counter is not None and task.is_chief:
            tail.update(g.counter.read(sess))
    if settings.save_weights and task.is_chief:
        _save_weights(sess, settings.save_weights)
    return head, tail


def _save_weights(sess, path: str) -> None:
    """The model's trainable variables as ``w0, w1, ...`` in an ``.npz`` (the layout of
    :func:`lab_utils.training.allreduce.save_weights`: Lab 4 compares the two)."""
    import os

    import tensorflow as tf

    values = sess.run(tf.compat.v1.trainable_variables())
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **{f"w{i}": v for i, v in enumerate(values)})
    os.replace(tmp, path)


def _check_rule(settings: Settings, may_start) -> None:
    """``may_start`` is given exactly in mode ``ssp``, and is a function."""
    if settings.mode != "ssp":
        if may_start is not None:
            raise ValueError(f"may_start only applies to mode='ssp', got it with mode={settings.mode!r}")
    elif may_start is None:
        raise ValueError("mode='ssp' needs the rule: train_worker(..., may_start=may_start)")
    elif not callable(may_start):
        raise TypeError(f"may_start must be a function (clock, clocks, s) -> bool, got {may_start!r}")


def _ssp_clocks(task, settings: Settings, may_start):
    """Mode ``ssp``: the clocks on the PS and this worker's wait (:mod:`lab_utils.training.ssp`)."""
    if settings.mode != "ssp":
        return None
    from lab_utils.training.ps.clocks import SSPClocks

    return SSPClocks(task.index, settings.num_workers, settings.staleness, may_start)


def _token_queue_size(g: PSGraph, settings: Settings):
    """Mode ``sync`` with R = N and no initial tokens: an op reading how many tokens wait in
    the SyncReplicasOptimizer's token queue on the PS; None otherwise.

    Why: the queue is shared, not one per worker. A worker that finishes its step before
    a slower one has taken its token can take that token too, push a second gradient for
    the next update and fill it alone: the update then averages one worker's batches twice
    and the other's not at all (a weight difference of 5 % against one big-batch process,
    seen about once in 20 runs under load). Starting a step only when every token of the
    last update has been taken makes each update average one gradient per worker."""
    if settings.mode != "sync" or settings.replicas != settings.num_workers or settings.num_workers < 2:
        return None
    hooks = [h for h in g.hooks if type(h).__name__ == "_SyncReplicasOptimizerHook"]
    if len(hooks) != 1 or getattr(hooks[0], "_num_tokens", None) != 0:
        return None  # initial tokens let every worker run one step ahead: nothing to pace here
    import tensorflow as tf

    graph = tf.compat.v1.get_default_graph()
    queues = [op for op in graph.get_operations() if op.type == "FIFOQueueV2" and op.name.endswith("sync_token_q")]
    if len(queues) != 1:
        return None
    with tf.compat.v1.colocate_with(queues[0]):
        return tf.raw_ops.QueueSizeV2(handle=queues[0].outputs[0])


def _wait_for_tokens_taken(sess, size, task, timeout: float) -> None:
    """Poll the token queue until it is empty (every worker has its token), under ``timeout``.
    Spans of the step: the first read, a round trip to the PS, is ``token queue`` (comm); more
    reads wait for a slower worker to take its token: ``peers' tokens`` (wait)."""
    deadline, pause = time.monotonic() + timeout, 0.001
    start = time.time()
    left = sess.run(size)
    read = time.time()
    report.add_span(TOKEN_SPANS[0], "comm", start, read)
    if left == 0:
        return
    while left > 0:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{task.task}: another worker did not take its token for {timeout:g} s (did it fail? see its log)"
            )
        time.sleep(pause)  # polling the PS under a deadline, backing off to 20 ms
        pause = min(2 * pause, 0.02)
        left = sess.run(size)
    report.add_span(TOKEN_SPANS[1], "wait", read, time.time())


def _before_step(clocks, sess, task, settings: Settings, delay: float, tokens=None) -> Callable[[], None]:
    """Before each step: in SSP mode wait for permission (under ``step_timeout``); in sync
    mode with R = N, for every worker to have its token (:func:`_token_queue_size`); then
    the straggler's modelled compute time. Each is a span of the step: ``read clocks`` (comm) and,
    if told no, ``ssp wait`` (wait), the token queue's (:func:`_wait_for_tokens_taken`), ``straggler delay``."""

    def before() -> None:
        if clocks is not None:  # asking (a read of the clocks, every step) and then, if told no, waiting
            start = time.time()
            got = clocks.wait(sess, settings.step_timeout, task.task)
            report.add_span(ASK_SPAN, "comm", start, start + got.asked)
            if got.polls > 1:
                report.add_span(WAIT_SPAN, "wait", start + got.asked, time.time())
        if tokens is not None:
            _wait_for_tokens_taken(sess, tokens, task, settings.step_timeout)
        if delay > 0:
            with report.span("straggler delay", "delay"):
                straggle(delay)

    return before


def _closing_phase(stats: loop.LoopStats, target: int) -> None:
    """The ``closing`` phase event: where the worker left its loop, and the grace period the
    session closes with (what Lab 3, Part 5's demos read)."""
    phase(
        "closing",
        "closing its session",
        f"left its loop at global step {stats.step} of {target}; stop_grace_period_secs={STOP_GRACE_PERIOD_SECS:g}",
        global_step=stats.step,
        local_steps=stats.local_steps,
    )


def train_worker(
    task,
    settings: Settings,
    *,
    build: Callable[[Any, Settings], PSGraph],
    data=None,
    may_start: Callable[[int, list, Any], bool] | None = None,
    leave_loop: Callable[[int, int], bool] | None = None,
    device_filters: Callable[[Any], list] | None = None,
) -> dict:
    """One worker's whole run: its shard, its server, the graph from ``build(task,
    settings)``, the session, the start barrier, the step loop to the target global
    step, the result. Returns the result dict (also reported with ``report.result``).
    ``data``: the data set to shard (default :func:`lab_utils.data.load_mnist`).
    ``may_start(clock, clocks, s) -> bool``: mode ``ssp`` only (and required there),
    the rule a worker waits on before each step (:mod:`lab_utils.training.ssp`).
    Lab 3, Part 5: ``leave_loop`` (:func:`loop.leave_when`) and ``device_filters(task) -> list``.
    ``settings.tf_defaults`` (``--tf-defaults``): TensorFlow's defaults instead, which hang
    at shutdown (:func:`lab_utils.training.ps.defaults.train_worker_tf_defaults`)."""
    from lab_utils.cluster import start_server
    from lab_utils.models import import_tensorflow

    _check_rule(settings, may_start)
    _one_line_for_cancelled_queue_runners()
    if settings.tf_defaults:
        from lab_utils.training.ps.defaults import train_worker_tf_defaults

        return train_worker_tf_defaults(task, settings, build=build, data=data)
    clock = loop.Clock()
    shard = loop.load_shard(settings.num_workers, task.index, settings.batch_size, data)
    target = target_global_steps(settings, shard.n_train)
    delay = settings.straggler.get(task.task, 0.0)
    tf = import_tensorflow()
    v1 = tf.compat.v1
    config = session_config(task, device_filters)
    server = start_server(task, session_config=config)
    with tf.Graph().as_default():
        v1.set_random_seed(settings.seed)
        g = build(task, settings)
        fetch = _step_after(g, settings.mode)
        clocks = _ssp_clocks(task, settings, may_start)
        tokens = _token_queue_size(g, settings)
        if clocks is not None:
            fetch = clocks.tick(fetch)
        stamps = _step_stamps(g, fetch, task, settings)
        barrier = start_barrier(task.index, settings.num_workers)
        clock.mark("graph")
        test_feed = {g.x: shard.data.x_test, g.y: shard.data.y_test}
        staleness = _Staleness() if settings.mode == "async" else None
        phase("session", "opening its session", None if task.is_chief else "waiting for the chief's model")
        with v1.train.MonitoredSession(
            session_creator=session_creator(task, server.target, config),
            hooks=g.hooks,
            stop_grace_period_secs=STOP_GRACE_PERIOD_SECS,
        ) as sess:
            clock.mark("session")
            _meet_at_barrier(sess, barrier, task)
            phase("training", "training", mode=settings.mode)
            stats = loop.run_steps(
                _train_step(sess, g, fetch, task, settings, target, stamps),
                shard.batches(settings.batch_size, settings.seed * 1000 + task.index),
                target,
                clock=clock,
                global_step=lambda: sess.run(g.global_step),
                evaluate=(lambda: sess.run(g.accuracy, feed_dict=test_feed)) if task.is_chief else None,
                eval_every=settings.eval_every,
                before_step=_before_step(clocks, sess, task, settings, delay, tokens),
                extra=staleness if clocks is None else clocks.event_fields,
                done=None if leave_loop is None else loop.leave_when(leave_loop, target, task.task),
            )
            if clocks is not None:
                clocks.finish(sess)  # a finished worker holds nobody back
            head, tail = _result_fields(sess, g, task, settings, target, test_feed)
            _closing_phase(stats, target)
    clock.mark("end")
    phase("closed", f"session closed at global step {stats.step}", global_step=stats.step)
    for counts in (staleness, clocks):
        if counts is not None:
            tail.update(counts.summary())
    return loop.report_result(head, stats, clock, tail)
