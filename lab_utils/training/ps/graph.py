"""The graph a parameter-server worker builds, and what it reports (Labs 2, 3 and 6; task side).

- :class:`PSGraph`: what the student's ``build_graph(task, settings)`` returns to
  :func:`lab_utils.training.ps.task.train_worker`;
- :class:`GradientCounter`: Lab 3's count of the gradients each update applied;
- :func:`start_barrier` and :func:`session_config`: the PS-side queues every worker
  meets at, and the device filters that keep a worker talking only to the PS;
- :func:`phase`: one ``phase`` event and log line saying where a worker is now;
- :class:`StepStamps`: in-graph timestamps that split a worker's one-``sess.run`` train
  step into pull, compute and push or token wait (the spans of the run's timeline).

Importing this module does not import TensorFlow; only the functions that build graphs do.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

COUNTER_SLOTS = 4096


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

    Build it inside ``replica_device_setter`` (its statistics live on the PS), wrap
    the optimizer that the ``SyncReplicasOptimizer`` averages for with :meth:`wrap`,
    and add :meth:`gradient` to the gradients it applies (Lab 3, Exercise 1 shows
    where). See the module docstring for how it works; :meth:`read` returns the counts."""

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
                self._pushes = v1.Variable(
                    0, dtype=tf.int64, trainable=False, name="pushes", collections=[v1.GraphKeys.LOCAL_VARIABLES]
                )

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
                    return self._inner.apply_gradients(
                        [(g, v) for g, v in pairs if v is not counter.slots], global_step=global_step, name=name
                    )

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


def session_config(task, filters=None):
    """``ConfigProto`` for a worker: talk only to the PS and to itself (``device_filters``).
    ``filters(task)``: the device filters to use instead (Lab 3, Part 5: a student's), a list
    of device name prefixes; an empty list is TensorFlow's default, every task."""
    import tensorflow as tf

    chosen = ["/job:ps", f"/job:worker/task:{task.index}"] if filters is None else filters(task)
    if not isinstance(chosen, (list, tuple)) or not all(isinstance(f, str) for f in chosen):
        raise TypeError(f"{task.task}: device filters must be a list of strings like '/job:ps', got {chosen!r}")
    return tf.compat.v1.ConfigProto(device_filters=list(chosen))


def start_barrier(task_index: int, num_workers: int):
    """``(arrive, wait)`` ops of a start barrier on the PS, or None for one worker.

    One FIFO queue per worker: arriving puts one element in every *other*
    worker's queue; waiting takes ``num_workers - 1`` elements from one's own
    queue, so it returns once everybody has arrived (blocking, no polling)."""
    if num_workers < 2:
        return None
    import tensorflow as tf

    with tf.device("/job:ps/task:0"):
        queues = [
            tf.queue.FIFOQueue(
                num_workers, [tf.int32], shapes=[[]], shared_name=f"start_barrier_{j}", name=f"start_barrier_{j}"
            )
            for j in range(num_workers)
        ]
        arrive = tf.group(*[q.enqueue(1) for j, q in enumerate(queues) if j != task_index])
        wait = queues[task_index].dequeue_many(num_workers - 1)
    return arrive, wait


def phase(name: str, what: str, why: str | None = None, **fields: Any) -> None:
    """Say where this worker is now: one ``phase`` event (``phase=name``, ``what``, ``why``,
    ``fields``) and the same words as one log line. The phases: ``session`` (opening its
    session), ``training``, ``closing`` (left its loop, closing its session), ``closed``;
    with TensorFlow's defaults also ``ended_early``. Lab 3's Part 5 demos
    (:mod:`lab_utils.training.ps.demo_runs`) show the last one of a task that never exited."""
    from lab_utils import report

    report.event("phase", phase=name, what=what, why=why, **fields)
    print(f"{report.task_name()}: {what}" + (f" ({why})" if why else ""), flush=True)


# ----------------------------------------------------------------------------- step stamps


class StepStamps:
    """Two ``tf.timestamp()`` ops on the worker that split its one-``sess.run`` train step
    into the spans of the run's timeline (:mod:`lab_utils.report`), fetched packed with the
    loss (``[loss, pulled, computed]``, float64): no extra fetch, no extra message.

    The step's subgraph (everything the fetches need) is cut where tensors cross between
    the worker and the PS, as TensorFlow's placer will place its ops (:func:`placement`):

    * ``pulled``: after a worker-side ``tf.identity`` of every PS tensor the gradients need
      (the parameters). An identity shares the one Recv TensorFlow makes per tensor and
      device: no extra transfer;
    * ``computed``: after the worker ops whose outputs go to the PS (the gradients).

    With the Python ``time.time()`` before and after the ``sess.run``, :meth:`spans` makes
    ``pull`` (comm: the session starts the step on the worker and the PS, the parameters
    arrive), ``compute``, then ``push`` (comm: the PS takes the gradients, applies them and
    answers) or, in sync mode (``token=True``), ``push + token wait`` (wait): from the
    gradients being ready to the token, what a straggler costs the others. The push itself
    (a few hundred microseconds) is inside it: a stamp between the two needs the PS to tell
    the worker when it has the gradients, one more message per step (about 2.5 % of a
    3.5 ms step on a 2-core machine), and stamps at the step's very start and end would
    cost a fetch of their own (1.5 to 2 %); see bench/bench_timeline.py."""

    def __init__(self, tensor: Any, token: bool):
        self.tensor = tensor  # [loss, pulled, computed] on the worker: fetch it instead of the loss
        self.last = ("push + token wait", "wait") if token else ("push", "comm")

    @classmethod
    def build(cls, fetch: Any, loss: Any, worker: tuple[str, int], *, token: bool) -> StepStamps | None:
        """The stamps of a step that fetches ``fetch`` (a tensor or op) and the scalar ``loss``
        on task ``worker`` (``("worker", i)``); ``token``: the step ends waiting for a token
        (sync mode). None when the step's gradients do not go to a PS or need nothing from
        one (a graph with everything on one side): no sub-spans to record."""
        import tensorflow as tf

        roots = [getattr(f, "op", f) for f in (fetch, loss)]
        where: dict = {}
        pushed, back = _crossings(_closure(roots), worker, where)
        needed = _closure(t.op for t in pushed)
        pulls = [t for t in back if t.op in needed]
        if not pushed or not pulls:
            return None
        with tf.name_scope("step_stamps"), tf.device(f"/job:{worker[0]}/task:{worker[1]}"):
            pulled = _stamp_after([tf.identity(t) for t in pulls])
            computed = _stamp_after(dict.fromkeys(t.op for t in pushed))
            return cls(tf.stack([tf.cast(tf.reshape(loss, []), tf.float64), pulled, computed]), token)

    def spans(self, before: float, values: Sequence[float], after: float) -> list[tuple[str, str, float, float]]:
        """``(name, category, start, end)`` of one step from the fetched ``values`` (``tensor``'s:
        the loss first) and the Python ``time.time()`` just ``before`` and ``after`` its
        ``sess.run``. Each boundary is clamped to ``[previous boundary, after]`` (the executor
        runs what it can in parallel), so the spans never overlap or go backwards."""
        pulled = min(max(float(values[1]), before), after)
        computed = min(max(float(values[2]), pulled), after)
        return [
            ("pull", "comm", before, pulled),
            ("compute", "compute", pulled, computed),
            (*self.last, computed, after),
        ]


def _stamp_after(deps: Iterable[Any]):
    import tensorflow as tf

    with tf.control_dependencies(list(deps)):
        return tf.timestamp()


def _closure(ops: Iterable[Any]) -> set:
    """``ops`` and every op they need: data inputs and control inputs, transitively."""
    seen: set = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op not in seen:
            seen.add(op)
            stack.extend(t.op for t in op.inputs)
            stack.extend(op.control_inputs)
    return seen


def _crossings(ops: set, worker: tuple[str, int], where: dict) -> tuple[list, list]:
    """The tensors among ``ops``' inputs that go from ``worker`` to a PS, and from a PS to ``worker``."""
    out: dict = {}
    back: dict = {}
    for op in sorted(ops, key=lambda op: op.name):  # the same graph every run
        dst = placement(op, worker, where)
        for t in op.inputs:
            src = placement(t.op, worker, where)
            if src == worker and dst[0] == "ps":
                out[t.name] = t
            elif src[0] == "ps" and dst == worker:
                back[t.name] = t
    return list(out.values()), list(back.values())


def placement(op, local: tuple[str, int], where: dict | None = None) -> tuple[str, int]:
    """``(job, task)`` where TensorFlow's placer puts ``op``: with the resource it takes (a
    variable read or update runs where the variable lives, whatever device it asked for),
    else its requested device's job and task, else with the op it is colocated with, else
    ``local`` (an op with no device runs on the session's own task). ``where``: a cache."""
    where = {} if where is None else where
    if op in where:
        return where[op]
    where[op] = local  # a guard: colocation chains do not loop, but stay safe
    import tensorflow as tf

    resources = [t.op for t in op.inputs if t.dtype == tf.resource]
    spec = tf.DeviceSpec.from_string(op.device) if op.device else None
    others = [g.decode()[len("loc:@") :] for g in op.colocation_groups()]
    others = [name for name in others if name != op.name]
    if resources:
        found = placement(resources[0], local, where)
    elif spec is not None and spec.job is not None:
        found = (spec.job, spec.task or 0)
    elif others:
        found = placement(op.graph.get_operation_by_name(others[0]), local, where)
    else:
        found = local
    where[op] = found
    return found
