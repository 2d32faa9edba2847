"""The graph a parameter-server worker builds, and what it reports (Labs 2, 3 and 6; task side).

- :class:`PSGraph`: what the student's ``build_graph(task, settings)`` returns to
  :func:`lab_utils.training.ps.task.train_worker`;
- :class:`GradientCounter`: Lab 3's count of the gradients each update applied;
- :func:`start_barrier` and :func:`session_config`: the PS-side queues every worker
  meets at, and the device filters that keep a worker talking only to the PS;
- :func:`phase`: one ``phase`` event and log line saying where a worker is now.

Importing this module does not import TensorFlow; only the functions that build graphs do.
"""

from __future__ import annotations

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


def session_config(task):
    """``ConfigProto`` for a worker: talk only to the PS and to itself (``device_filters``)."""
    import tensorflow as tf

    return tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{task.index}"])


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
