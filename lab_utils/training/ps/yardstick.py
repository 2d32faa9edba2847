"""Labs 2-3's throughput yardstick: a parameter-server job of Lab 2's shape that learns nothing.

The hidden throughput tests time a student's ``train_async.py`` / ``train_sync.py`` against
the reference solution, the same job. The reference is not shipped, so the visible
self-check (:func:`lab_utils.grading.selfcheck.self_check`) times the student's job
against this one instead, and scales by how long the reference takes against it (measured
on the course's machines, ``bench/bench_yardsticks.py``).

Every task of the same ``1 PS + N workers`` cluster runs it, with the same command line
as the student's script (``ps_runs.run_ps("-m lab_utils.training.ps.yardstick", ...)``; as a module, never as a
file: this folder's ``inspect.py`` would shadow the standard library's)
and the same loop (:func:`lab_utils.training.ps.train_worker`: data, barrier, events,
result). Only the graph differs, and deliberately: it is not a model. The PS holds a
784 x 10 matrix, a bias and the global step, as Lab 2's does; each step every worker reads
them, multiplies its batch by them, and adds back a matrix of the gradient's shape, made
from the batch and a constant (no loss, no labels, no optimizer): the same bytes each way
and the same matrix products as a logistic-regression step, in asynchronous mode whatever
the lab. Its "accuracy" is a fraction of the right shape and means nothing.
"""

from __future__ import annotations

import sys

from lab_utils.training.ps import task as ps
from lab_utils.training.ps.graph import PSGraph

#: the size of each step's update: small, so the numbers stay finite over any run
UPDATE_SCALE = 1e-6


def build_graph(task, settings) -> PSGraph:
    """The yardstick's graph: Lab 2's variables on the PS, a step of Lab 2's traffic and arithmetic."""
    import tensorflow as tf

    v1 = tf.compat.v1
    with v1.device("/job:ps/task:0"):
        step = v1.train.get_or_create_global_step()
        w = v1.get_variable("yardstick_w", (784, 10), initializer=v1.zeros_initializer())
        b = v1.get_variable("yardstick_b", (10,), initializer=v1.zeros_initializer())
    with v1.device(f"/job:worker/task:{task.index}"):
        images = v1.placeholder(tf.float32, (None, 784), "images")
        labels = v1.placeholder(tf.int64, (None,), "labels")
        out = tf.matmul(images, w) + b  # the forward product
        delta = tf.matmul(images, tf.ones_like(out), transpose_a=True)  # the backward product's shape and cost
        scale = UPDATE_SCALE / tf.cast(tf.shape(images)[0], tf.float32)
        train_op = tf.group(
            w.assign_add(scale * delta),
            b.assign_add(scale * tf.reduce_sum(out, axis=0)),
            step.assign_add(1),
        )
        mean_output = tf.reduce_mean(out)  # stands in for the loss the loop reports
        agree = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(out, axis=1), labels), tf.float32))  # a fraction, no accuracy
    return PSGraph(images, labels, mean_output, agree, train_op, step)


def main(argv=None) -> int:
    settings, task = ps.parse_args("async", argv, description=__doc__)  # bad input: exit 2
    if task.job == "ps":
        ps.serve(task)
        return 0
    ps.train_worker(task, settings, build=build_graph)
    return 0


if __name__ == "__main__":
    sys.exit(main())
