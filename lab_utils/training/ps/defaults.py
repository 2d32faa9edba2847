"""Lab 3, Part 5: a synchronous run with TensorFlow's defaults, as CS 744's code ran it (the task side).

``train_sync.py --tf-defaults`` makes :func:`lab_utils.training.ps.train_worker` call
:func:`train_worker_tf_defaults` instead of its own session and loop. The student's
``build_graph`` is the same; what changes is everything :mod:`lab_utils.training.ps`
does to make a synchronous run end (its docstring lists the fixes):

* ``MonitoredTrainingSession(master, is_chief, hooks)`` with every default: its session
  waits ``stop_grace_period_secs=120`` s for its threads when it closes, a non-chief worker
  checks every 30 s whether the chief has initialised the model, and no ``ConfigProto``
  (no ``device_filters``: each session talks to every task);
* the ``SyncReplicasOptimizer`` hook with the default ``num_tokens=-1`` (R tokens handed
  out at the start), whatever ``build_graph`` asked for;
* a ``StopAtStepHook(last_step=target)`` and the loop ``while not sess.should_stop():
  sess.run(train_op)``: each worker stops when *it* sees the global step reach the target;
* no start barrier, no pacing on the token queue, no step deadline (``--step-timeout`` is
  ignored): a token that never comes is waited for forever.

Expect the run to hang: the chief trains in a second, then sits 120 s in its session's
close, waiting for its queue-runner thread, which is blocked waiting for gradients that
no worker will send. Only the launcher's deadline ends it
(:func:`lab_utils.training.ps.demo_runs.shutdown_hang_demo`).

What this adds to the seed's code, only to *see* where each task is: a ``phase`` event
(and a log line) when it opens its session, starts training, leaves its loop and has closed
its session (:func:`lab_utils.training.ps.phase`); a ``step`` event per step; the result
(without a test accuracy: a stopped ``MonitoredSession`` runs nothing more) if it gets there.
"""

from __future__ import annotations

from typing import Any

from lab_utils import report
from lab_utils.training import loop
from lab_utils.training.ps.graph import PSGraph, phase
from lab_utils.training.ps.settings import Settings, target_global_steps

__all__ = ["STOP_GRACE_PERIOD_DEFAULT", "READY_POLL_DEFAULT", "default_token_hooks", "train_worker_tf_defaults"]

#: ``MonitoredTrainingSession``'s default ``stop_grace_period_secs``.
STOP_GRACE_PERIOD_DEFAULT = 120.0
#: How often TensorFlow's worker session creator checks whether the chief initialised the model.
READY_POLL_DEFAULT = 30.0


def default_token_hooks(hooks: list) -> list:
    """``hooks`` with each ``SyncReplicasOptimizer`` hook made again with the default
    ``num_tokens=-1`` (``make_session_run_hook(is_chief)``), as the seed's code made it;
    other hooks unchanged. A hook is only a recipe until the session starts: no op was made yet."""
    out = []
    for hook in hooks:
        if type(hook).__name__ == "_SyncReplicasOptimizerHook":
            hook = hook._sync_optimizer.make_session_run_hook(hook._is_chief)  # TF's own default tokens
        out.append(hook)
    return out


def _session_why(task) -> str:
    if task.is_chief:
        return "the chief initialises the model"
    return f"waiting for the chief to initialise the model: TensorFlow checks every {READY_POLL_DEFAULT:g} s"


def _closing_why(task) -> str | None:
    if task.is_chief:
        return (
            f"TensorFlow waits up to stop_grace_period_secs={STOP_GRACE_PERIOD_DEFAULT:g} s for the chief's "
            "queue-runner thread, blocked waiting for gradients that no worker will send"
        )
    return None


def _run_loop(sess, g: PSGraph, shard, settings: Settings, task, stats: loop.LoopStats) -> None:
    """The seed's loop: train until the ``StopAtStepHook`` (or a closed queue) stops it."""
    import tensorflow as tf

    batches = shard.batches(settings.batch_size, settings.seed * 1000 + task.index)
    try:
        while not sess.should_stop():
            xb, yb = next(batches)
            # the train op's value is the token this worker got: the global step of the update that released it
            step, loss = sess.run([g.train_op, g.loss], feed_dict={g.x: xb, g.y: yb})
            stats.step, stats.local_steps, stats.examples = int(step), stats.local_steps + 1, stats.examples + len(yb)
            report.step(stats.step, stats.examples, local_step=stats.local_steps, loss=float(loss))
    except tf.errors.OutOfRangeError:
        # Said here, then re-raised: MonitoredSession swallows it and the loop just ends, as in the seed.
        phase(
            "ended_early",
            f"its loop ended early at global step {stats.step}",
            "a queue on the PS was closed: MonitoredSession swallows the OutOfRangeError, silently",
            global_step=stats.step,
            local_steps=stats.local_steps,
        )
        raise


def train_worker_tf_defaults(task, settings: Settings, *, build, data=None) -> dict[str, Any]:
    """One worker's run with TensorFlow's defaults (see the module docstring); returns the
    result dict if the session ever closes. Only for mode ``sync``."""
    from lab_utils.cluster import start_server
    from lab_utils.models import import_tensorflow

    if settings.mode != "sync":
        raise ValueError(f"TensorFlow's defaults are only shown for mode 'sync', got {settings.mode!r}")
    clock = loop.Clock()
    shard = loop.load_shard(settings.num_workers, task.index, settings.batch_size, data)
    target = target_global_steps(settings, shard.n_train)
    tf = import_tensorflow()
    v1 = tf.compat.v1
    server = start_server(task)  # no session_config: no device_filters
    stats = loop.LoopStats()
    with tf.Graph().as_default():
        v1.set_random_seed(settings.seed)
        g = build(task, settings)
        hooks = [*default_token_hooks(g.hooks), v1.train.StopAtStepHook(last_step=target)]
        clock.mark("graph")
        phase("session", "opening its session", _session_why(task))
        with v1.train.MonitoredTrainingSession(master=server.target, is_chief=task.is_chief, hooks=hooks) as sess:
            clock.mark("session")
            clock.mark("ready")
            phase("training", "training", "TensorFlow's defaults", mode=settings.mode)
            try:
                _run_loop(sess, g, shard, settings, task, stats)
            finally:  # an OutOfRangeError ends the loop too (and the session swallows it)
                clock.mark("trained")
            why = _closing_why(task)
            phase("closing", "closing its session", why, global_step=stats.step, local_steps=stats.local_steps)
        clock.mark("end")
    phase("closed", f"session closed at global step {stats.step}", global_step=stats.step)
    head = {"mode": settings.mode, "accuracy": None, "final_global_step": stats.step, "target_global_steps": target}
    tail = {"batch_size": settings.batch_size, "num_workers": settings.num_workers, "is_chief": task.is_chief}
    return loop.report_result(head, stats, clock, {**tail, "tf_defaults": True})
