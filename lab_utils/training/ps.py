"""Between-graph parameter-server training on TensorFlow's own runtime (Labs 2 and 3): the task side.

Every task of a Lab 2 or 3 cluster runs the same script (``train_async.py`` or
``train_sync.py``, which students complete in the lab notebook)::

    settings, task = ps.parse_args("sync", argv)     # bad input: exit 2, before TensorFlow
    if task.job == "ps":
        ps.serve(task)                               # hold the variables until stopped
    else:
        ps.train_worker(task, settings, build=build_graph)

``build_graph(task, settings) -> PSGraph`` is the student's part: the graph that
makes this parameter-server training. Everything else (settings, the start
barrier, the session, the shutdown protocol below) is here; the shard, step loop,
timing and result dict are :mod:`lab_utils.training.loop`'s, shared with the
other techniques. Importing this module does not import TensorFlow; only the
functions that build or run graphs do.

How a run is laid out
---------------------
``lab_utils.cluster.TFCluster`` starts one process per *task*: ``ps:0`` and
``worker:0 .. worker:N-1``, each with ``TF_CONFIG`` naming every task's address.
Every task starts a ``tf.distribute.Server``. The PS task does nothing else: it
holds the variables and serves them (``server.join()``) until the launcher stops
it after every worker has exited 0.

Each worker builds its *own copy* of the graph (between-graph replication).
Inside ``tf.compat.v1.train.replica_device_setter`` every variable (the model's
``W`` and ``b`` and the shared ``global_step``) is placed on ``/job:ps`` while the
computation (forward pass, gradients) stays on ``/job:worker/task:<i>``. Each
worker opens a session to its own server and feeds batches from its own shard of
the training set. ``worker:0`` is the *chief*: it initialises the variables; the
others wait until the model is ready.

Lab 2: asynchronous updates
---------------------------
Each worker computes a gradient on the parameters it last read and applies it to
the PS at once; ``global_step`` goes up by one per worker step. Nobody waits for
anybody, so a slow worker (a *straggler*) does not slow the others down, but its
gradients are *stale*: computed on parameters that other workers have changed in
the meantime. A run stops when the global step reaches its target: one epoch is
``ceil(n_train / batch_size)`` global steps, shared among the workers.

Lab 3: synchronous updates with ``SyncReplicasOptimizer``
---------------------------------------------------------
``SyncReplicasOptimizer(opt, replicas_to_aggregate=R, total_num_replicas=N)``
changes what a worker's train step does:

1. push its gradient into an *accumulator* on the PS, stamped with the global
   step the worker computed it at (gradients with an older stamp are *stale* and
   silently dropped);
2. take a *token* from the token queue on the PS (blocking until there is one);
   the token's value becomes the worker's stamp for its next gradient.

The chief runs one extra thread, the *chief queue runner*: it waits until the
accumulators hold R gradients, applies their average with the real optimizer,
adds one to ``global_step`` and puts N new tokens (valued with the new global
step) in the token queue. The optimizer counts *gradients*, not workers: one
fast worker can supply several of them. With R < N the slowest gradients of each
step arrive stale and are dropped: these are *backup workers*, the cure for
stragglers.

How many gradients does one global step apply? With R = N (the default here),
exactly R: each worker starts with one gradient and then needs a token per
gradient, and an update hands out N tokens, so at most N = R fresh gradients can
exist for a step. With R < N, *at least* R and up to N: the accumulator averages
everything it holds when the chief's next "take R gradients" request arrives,
and between handing out tokens and asking again, more than R fresh gradients can
come in. Measured (1 PS + 2 workers, R = 1, 50 steps, 10 runs): 3 runs had an
update that averaged 2 gradients. :class:`GradientCounter` shows this.

Why synchronous runs hang at shutdown, and how this module ends every run
-------------------------------------------------------------------------
Every blocking operation above waits for another process, and at the end of a
run somebody is gone:

* The chief's queue-runner thread is always blocked waiting for the next R
  gradients. When the chief's loop ends, its session waits
  ``stop_grace_period_secs`` (default 120 s) for that thread, which never wakes.
* A worker that pushed a gradient waits for a token that only the chief's queue
  runner produces. If the chief (or the other workers whose gradients were
  needed) stopped first, nothing ever puts a token in the queue: it waits forever.
* A worker's session, by default, talks to *every* task in the cluster; a worker
  that has exited can stall the session of a worker still running.
* When the chief's session closes, its queue runner closes the token queue; a
  worker still waiting for a token then gets ``OutOfRangeError``, which
  ``MonitoredSession`` swallows: that worker's loop just ends early, silently.
* A non-chief worker checks whether the chief has initialised the model every
  30 s (TF's default), wasting up to 30 s per run while the chief works alone.

Measured on the course machine with TF's defaults (``MonitoredTrainingSession``,
``StopAtStepHook``, default tokens, 1 PS + 2 workers, 100 global steps), five
runs: training took about 0.5 s, then the chief spent 120.0 s closing its
session in every run that got that far. In one run worker:1 waited 30.3 s for
the model while the chief did 200 of its 201 local steps alone (local steps per
worker ranged from 82/120 to 201/1); in another, worker:1's loop ended early
with an exception that ``MonitoredSession`` swallowed.

The fix, in this module:

1. Every worker stops on the *same* condition: the token it just received is
   worth ``target`` or more (a token carries the global step of the update that
   made it). The final update (target - 1 -> target) puts N such tokens in the
   queue, one for each worker, and a worker stops at its first one, so every
   worker gets one, even one still holding an older token. No worker ever
   pushes a gradient stamped at or past the target, so nobody waits for an
   update that cannot come. (Stopping on a fresh read of ``global_step``
   instead is racy: a worker can see the final step before the final tokens
   are in the queue, stop, and its session's shutdown closes the token queue
   under the others.)
2. No tokens are handed out at the start (``num_tokens=0``): each worker pushes
   one gradient and then waits for the first update, so the chief cannot run
   ahead alone while the others are still starting.
3. ``stop_grace_period_secs`` is small (:data:`STOP_GRACE_PERIOD_SECS`), so the
   chief does not wait 120 s for its blocked queue-runner thread (a daemon
   thread: it ends with the process).
4. ``ConfigProto(device_filters=["/job:ps", "/job:worker/task:<i>"])``: each
   worker's session only talks to the PS and to itself.
5. Non-chief workers poll for the model every :data:`READY_POLL_SECS` instead of
   30 s, up to :data:`SESSION_WAIT_SECS`.
6. A safety net: every train step runs with a deadline (``step_timeout``); a
   token that never comes becomes a clear error, never a silent hang.

How we *verify* that a global step applied exactly R gradients
--------------------------------------------------------------
:class:`GradientCounter` adds one small variable (``slots``, 4096 floats on the
PS) to the model. On each push a worker's "gradient" for it is a one-hot vector
at a slot unique to that push. The accumulator averages the gradients it
collected for one update exactly like the model's, so the averaged vector has
one non-zero entry per gradient in that update. The chief's update counts the
non-zero entries and keeps, on the PS, the number of updates and the minimum,
maximum and total count. ``min == max == R`` and ``updates == global_step`` is
the check for R = N; it fails if any update averaged more or fewer gradients.
With backup workers (R < N) expect ``min == R <= max <= N``.
"""
from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lab_utils.training import loop

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
    "check_settings",
    "steps_per_epoch",
    "target_global_steps",
    "session_config",
    "session_creator",
    "straggle",
    "start_barrier",
    "serve",
    "train_worker",
]

MODES = ("async", "sync")
#: How long a closing session waits for its threads (TF default 120 s; the
#: chief's queue-runner thread is blocked waiting for gradients and never joins).
STOP_GRACE_PERIOD_SECS = 0.5
#: How often a non-chief worker checks whether the chief initialised the model (TF default 30 s).
READY_POLL_SECS = 0.25
#: How long a non-chief worker waits for the chief to initialise the model.
SESSION_WAIT_SECS = 120.0
#: Default deadline for one train step (a lost token becomes an error, not a hang).
STEP_TIMEOUT_SECS = 60.0
COUNTER_SLOTS = 4096


# ----------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    """Validated settings of one run (the same on every task)."""

    mode: str
    batch_size: int
    num_workers: int
    epochs: float | None = 1.0
    steps: int | None = None
    learning_rate: float = 0.5
    replicas_to_aggregate: int | None = None  # sync only; None -> num_workers
    straggler: Mapping[str, float] = field(default_factory=dict)  # {"worker:1": seconds per step}
    eval_every: int = 50  # global steps between test evaluations on the chief (0: only at the end)
    seed: int = 0
    step_timeout: float = STEP_TIMEOUT_SECS

    @property
    def replicas(self) -> int:
        """Gradients per synchronous update (R)."""
        return self.replicas_to_aggregate or self.num_workers


def parse_straggler(spec: str | Mapping[str, float] | None) -> dict[str, float]:
    """``"worker:1=0.05"`` (seconds), ``"worker:1=50ms"``, several joined by commas,
    or a dict ``{"worker:1": 0.05}`` -> ``{"worker:1": 0.05}``. ``None``/"" -> {}."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, Mapping):
        items = list(spec.items())
    elif isinstance(spec, str):
        items = []
        for part in spec.split(","):
            name, sep, value = part.strip().partition("=")
            if not sep or not name.strip() or not value.strip():
                raise ValueError(f"straggler must look like 'worker:1=0.05' (seconds) or 'worker:1=50ms', got {spec!r}")
            items.append((name.strip(), value.strip()))
    else:
        raise TypeError(f"straggler must be a string like 'worker:1=0.05' or a dict, got {type(spec).__name__}")
    out = {}
    for name, value in items:
        if isinstance(value, str):
            scale = 1.0
            if value.endswith("ms"):
                value, scale = value[:-2], 1e-3
            elif value.endswith("s"):
                value = value[:-1]
            try:
                seconds = float(value) * scale
            except ValueError:
                raise ValueError(f"straggler delay for {name!r} must be a number of seconds (or '50ms'), got {value!r}") from None
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        else:
            raise TypeError(f"straggler delay for {name!r} must be a number, got {value!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"straggler delay for {name!r} must be >= 0 seconds, got {seconds}")
        out[str(name)] = seconds
    return out


def check_settings(
    mode: str,
    batch_size: int,
    num_workers: int,
    epochs: float | None = 1.0,
    steps: int | None = None,
    learning_rate: float = 0.5,
    replicas_to_aggregate: int | None = None,
    straggler: str | Mapping[str, float] | None = None,
    eval_every: int = 50,
    seed: int = 0,
    step_timeout: float = STEP_TIMEOUT_SECS,
) -> Settings:
    """Validate everything that can be checked before TensorFlow starts; raise
    ``ValueError``/``TypeError`` saying what was given and what is allowed."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")

    def _int(name, value, low):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
        if value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}")
        return int(value)

    batch_size = _int("batch_size", batch_size, 1)
    num_workers = _int("number of workers", num_workers, 1)
    if (epochs is None) == (steps is None):
        raise ValueError(f"give exactly one of epochs or steps, got epochs={epochs!r}, steps={steps!r}")
    if steps is not None:
        steps = _int("steps", steps, 1)
    else:
        if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not math.isfinite(epochs) or epochs <= 0:
            raise ValueError(f"epochs must be a number > 0, got {epochs!r}")
        epochs = float(epochs)
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)) \
            or not math.isfinite(learning_rate) or learning_rate <= 0:
        raise ValueError(f"learning_rate must be a number > 0, got {learning_rate!r}")
    if replicas_to_aggregate is not None:
        if mode != "sync":
            raise ValueError("replicas_to_aggregate only applies to mode='sync' (asynchronous updates are never aggregated)")
        replicas_to_aggregate = _int("replicas_to_aggregate", replicas_to_aggregate, 1)
        if replicas_to_aggregate > num_workers:
            raise ValueError(
                f"replicas_to_aggregate={replicas_to_aggregate} is more than the {num_workers} worker(s): "
                f"allowed 1..{num_workers} (fewer than the workers = backup workers)"
            )
    delays = parse_straggler(straggler)
    for name in delays:
        job, _, index = name.partition(":")
        if job != "worker" or not index.isdigit() or int(index) >= num_workers:
            raise ValueError(f"straggler task must be one of worker:0..worker:{num_workers - 1}, got {name!r}")
    eval_every = _int("eval_every", eval_every, 0)
    seed = _int("seed", seed, 0)
    if isinstance(step_timeout, bool) or not isinstance(step_timeout, (int, float)) or not step_timeout > 0:
        raise ValueError(f"step_timeout must be a number of seconds > 0, got {step_timeout!r}")
    return Settings(mode, batch_size, num_workers, epochs, steps, float(learning_rate), replicas_to_aggregate,
                    delays, eval_every, seed, float(step_timeout))


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """Global steps in one pass over the training set: ``ceil(n_train / batch_size)``.

    Asynchronous: the workers share these steps (each does about 1/N of them).
    Synchronous (the CS 744 convention): one async epoch is compared with this
    many *global* steps, each of which averages R batches."""
    if n_train < 1 or batch_size < 1:
        raise ValueError(f"need n_train >= 1 and batch_size >= 1, got {n_train}, {batch_size}")
    return math.ceil(n_train / batch_size)


def target_global_steps(settings: Settings, n_train: int) -> int:
    """The global step at which every worker stops."""
    if settings.steps is not None:
        return settings.steps
    return max(1, math.ceil(settings.epochs * steps_per_epoch(n_train, settings.batch_size)))


def make_parser(mode: str, description: str | None = None) -> argparse.ArgumentParser:
    """The command line shared by ``train_async.py`` and ``train_sync.py``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--batch-size", type=int, default=60, help="examples per worker step (default 60)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=float, default=None,
                        help="passes over the training set; 1 epoch = ceil(n_train/batch) global steps (default 1)")
    length.add_argument("--steps", type=int, default=None, help="target global step (instead of --epochs)")
    p.add_argument("--learning-rate", type=float, default=0.5, help="gradient-descent learning rate (default 0.5)")
    if mode == "sync":
        p.add_argument("--replicas-to-aggregate", type=int, default=None,
                       help="gradients averaged per global step (default: number of workers)")
    p.add_argument("--straggler", default=None,
                   help="slow one worker down, e.g. 'worker:1=0.05' (seconds per step) or 'worker:1=50ms'")
    p.add_argument("--eval-every", type=int, default=50,
                   help="global steps between test evaluations on the chief (0: only at the end)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-timeout", type=float, default=STEP_TIMEOUT_SECS,
                   help="seconds one train step may block before the run fails (default 60)")
    return p


def parse_args(mode: str, argv=None, description: str | None = None, env: Mapping[str, str] | None = None):
    """Parse and validate; on bad input print a clear message and exit 2 (argparse's
    convention) before TensorFlow is imported. Returns ``(Settings, TaskConfig)``;
    the task comes from ``TF_CONFIG`` in ``env`` (default ``os.environ``)."""
    from lab_utils.cluster import task_config

    parser = make_parser(mode, description)
    args = parser.parse_args(argv)
    try:
        task = task_config(env)
    except RuntimeError as exc:
        parser.error(str(exc))
    if args.epochs is None and args.steps is None:
        args.epochs = 1.0
    try:
        settings = check_settings(
            mode, args.batch_size, len(task.cluster.get("worker", [])), epochs=args.epochs, steps=args.steps,
            learning_rate=args.learning_rate, replicas_to_aggregate=getattr(args, "replicas_to_aggregate", None),
            straggler=args.straggler, eval_every=args.eval_every, seed=args.seed, step_timeout=args.step_timeout,
        )
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return settings, task


# ----------------------------------------------------------------------------- graph


@dataclass
class PSGraph:
    """What a graph builder returns to the training loop."""

    x: Any  # placeholder (None, 784) float32
    y: Any  # placeholder (None,) int64
    loss: Any
    accuracy: Any
    train_op: Any
    global_step: Any
    hooks: list = field(default_factory=list)  # e.g. the SyncReplicasOptimizer hook
    counter: GradientCounter | None = None


class GradientCounter:
    """Counts, on the PS, how many gradients each synchronous update averaged.

    Build it inside ``replica_device_setter`` (its statistics live on the PS)::

        counter = GradientCounter(task, num_workers)
        opt = SyncReplicasOptimizer(counter.wrap(GradientDescentOptimizer(lr)), R, N)
        grads = opt.compute_gradients(loss) + [counter.gradient()]
        train_op = opt.apply_gradients(grads, global_step=global_step)

    See the module docstring for how it works; :meth:`read` returns the counts."""

    def __init__(self, task_index: int, num_workers: int, slots: int = COUNTER_SLOTS):
        import tensorflow as tf

        v1 = tf.compat.v1
        self.num_slots, self.task_index, self.num_workers = int(slots), int(task_index), int(num_workers)
        zeros = v1.zeros_initializer()
        with v1.variable_scope("gradient_counter"):
            self.slots = v1.get_variable("slots", [slots], tf.float32, zeros, trainable=False)
            self.updates = v1.get_variable("updates", [], tf.int64, zeros, trainable=False)
            self.total = v1.get_variable("total", [], tf.int64, zeros, trainable=False)
            self.min = v1.get_variable("min", [], tf.int64, v1.constant_initializer(2**62), trainable=False)
            self.max = v1.get_variable("max", [], tf.int64, zeros, trainable=False)
            anchor = tf.no_op()  # on this worker: keep the push counter local, like SyncReplicasOptimizer's local_step
            with v1.colocate_with(anchor):
                self._pushes = v1.Variable(0, dtype=tf.int64, trainable=False, name="pushes",
                                           collections=[v1.GraphKeys.LOCAL_VARIABLES])

    def gradient(self):
        """``(one_hot_at_a_slot_unique_to_this_push, slots_variable)`` to add to the gradients."""
        import tensorflow as tf

        push = self._pushes.assign_add(1)
        slot = (self.task_index + self.num_workers * push) % self.num_slots
        return tf.one_hot(slot, self.num_slots, dtype=tf.float32), self.slots

    def _record(self, averaged):
        import tensorflow as tf

        n = tf.math.count_nonzero(averaged, dtype=tf.int64)
        # Every statistic waits for the averaged gradient (i.e. for the accumulator's
        # take): without this, `updates` would count a take that is still blocked.
        with tf.control_dependencies([n]):
            return tf.group(
                self.updates.assign_add(1),
                self.total.assign_add(n),
                self.min.assign(tf.minimum(self.min, n)),
                self.max.assign(tf.maximum(self.max, n)),
            )

    def wrap(self, optimizer):
        """An optimizer that applies ``optimizer``'s update to the model and records
        the count of the averaged counter gradient (the chief runs it on the PS)."""
        import tensorflow as tf

        counter = self

        class CountingOptimizer(tf.compat.v1.train.Optimizer):
            def __init__(self, inner):
                super().__init__(use_locking=False, name="Counting" + inner.get_name())
                self._inner = inner

            def compute_gradients(self, *args, **kwargs):
                return self._inner.compute_gradients(*args, **kwargs)

            def apply_gradients(self, grads_and_vars, global_step=None, name=None):
                pairs = list(grads_and_vars)
                counted = [g for g, v in pairs if v is counter.slots]
                if len(counted) != 1:
                    raise ValueError("add counter.gradient() to the gradients passed to apply_gradients (once)")
                with tf.control_dependencies([counter._record(counted[0])]):
                    return self._inner.apply_gradients([(g, v) for g, v in pairs if v is not counter.slots],
                                                       global_step=global_step, name=name)

            def get_slot(self, *args, **kwargs):
                return self._inner.get_slot(*args, **kwargs)

            def get_slot_names(self, *args, **kwargs):
                return self._inner.get_slot_names(*args, **kwargs)

            def variables(self):
                return self._inner.variables()

        return CountingOptimizer(optimizer)

    def read(self, sess) -> dict:
        """Counts so far: ``updates``, ``gradients_applied``, ``gradients_per_update_min/max``."""
        updates, total, low, high = sess.run([self.updates, self.total, self.min, self.max])
        return {
            "updates_counted": int(updates),
            "gradients_applied": int(total),
            "gradients_per_update_min": int(low) if updates else None,
            "gradients_per_update_max": int(high) if updates else None,
        }


def session_config(task):
    """``ConfigProto`` for a worker: talk only to the PS and to itself (``device_filters``)."""
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task.index}"])


# ----------------------------------------------------------------------------- running


def straggle(seconds: float) -> None:
    """Simulated slowness: the straggler knob. The one deliberate sleep in the labs."""
    if seconds > 0:
        time.sleep(seconds)


def start_barrier(task_index: int, num_workers: int):
    """``(arrive, wait)`` ops of a start barrier on the PS, or None for one worker.

    One FIFO queue per worker: arriving puts one element in every *other*
    worker's queue; waiting takes ``num_workers - 1`` elements from one's own
    queue, so it returns once everybody has arrived (blocking, no polling)."""
    if num_workers < 2:
        return None
    import tensorflow as tf

    with tf.device("/job:ps/task:0"):
        queues = [tf.queue.FIFOQueue(num_workers, [tf.int32], shapes=[[]], shared_name=f"start_barrier_{j}",
                                     name=f"start_barrier_{j}") for j in range(num_workers)]
        arrive = tf.group(*[q.enqueue(1) for j, q in enumerate(queues) if j != task_index])
        wait = queues[task_index].dequeue_many(num_workers - 1)
    return arrive, wait


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
        raise RuntimeError(f"{task.task}: the other workers did not reach the start barrier within "
                           f"{SESSION_WAIT_SECS:g} s (did one of them fail? see its log)") from exc


def _train_step(sess, g: PSGraph, fetch, task, settings: Settings, target: int) -> loop.StepFn:
    """One train step under the ``step_timeout`` deadline; a blocked step or a closed
    queue becomes a clear error instead of a hang or a silently shortened run."""
    import tensorflow as tf

    options = tf.compat.v1.RunOptions(timeout_in_ms=int(settings.step_timeout * 1000))

    def step(xb, yb, at: loop.LoopStats):
        try:
            return sess.run([fetch, g.loss], feed_dict={g.x: xb, g.y: yb}, options=options)
        except tf.errors.DeadlineExceededError as exc:
            raise RuntimeError(
                f"{task.task}: a train step blocked for more than {settings.step_timeout:g} s at local step "
                f"{at.local_steps} (global step {at.step} of {target}); in sync mode this means no token came: "
                "the chief's queue runner stopped or too few workers are pushing gradients") from exc
        except tf.errors.OutOfRangeError as exc:
            # MonitoredSession.__exit__ would swallow this and end the run early as if it had finished.
            raise RuntimeError(
                f"{task.task}: a queue on the PS was closed at local step {at.local_steps} (global step {at.step} of "
                f"{target}); in sync mode the chief stopped and closed the token queue before this worker "
                "got its last token") from exc

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
    return head, tail


def train_worker(task, settings: Settings, *, build: Callable[[Any, Settings], PSGraph], data=None) -> dict:
    """One worker's whole run: its shard, its server, the graph from ``build(task,
    settings)``, the session, the start barrier, the step loop to the target global
    step, the result. Returns the result dict (also reported with ``report.result``).
    ``data``: the data set to shard (default :func:`lab_utils.data.load_mnist`)."""
    from lab_utils.cluster import start_server
    from lab_utils.models import import_tensorflow

    clock = loop.Clock()
    shard = loop.load_shard(settings.num_workers, task.index, settings.batch_size, data)
    target = target_global_steps(settings, shard.n_train)
    delay = settings.straggler.get(task.task, 0.0)
    tf = import_tensorflow()
    v1 = tf.compat.v1
    config = session_config(task)
    server = start_server(task, session_config=config)
    with tf.Graph().as_default():
        v1.set_random_seed(settings.seed)
        g = build(task, settings)
        fetch = _step_after(g, settings.mode)
        barrier = start_barrier(task.index, settings.num_workers)
        clock.mark("graph")
        test_feed = {g.x: shard.data.x_test, g.y: shard.data.y_test}
        staleness = _Staleness() if settings.mode == "async" else None
        with v1.train.MonitoredSession(session_creator=session_creator(task, server.target, config),
                                       hooks=g.hooks, stop_grace_period_secs=STOP_GRACE_PERIOD_SECS) as sess:
            clock.mark("session")
            _meet_at_barrier(sess, barrier, task)
            stats = loop.run_steps(
                _train_step(sess, g, fetch, task, settings, target),
                shard.batches(settings.batch_size, settings.seed * 1000 + task.index), target,
                clock=clock, global_step=lambda: sess.run(g.global_step),
                evaluate=(lambda: sess.run(g.accuracy, feed_dict=test_feed)) if task.is_chief else None,
                eval_every=settings.eval_every, before_step=lambda: straggle(delay), extra=staleness)
            head, tail = _result_fields(sess, g, task, settings, target, test_feed)
    clock.mark("end")
    if staleness is not None:
        tail.update(staleness.summary())
    return loop.report_result(head, stats, clock, tail)
