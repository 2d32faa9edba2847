"""Lab 2: asynchronous parameter-server training (between-graph replication).

Launched by the notebook with lab_utils.cluster.TFCluster: one process per task,
TF_CONFIG says which task this is. Every task runs this same file:

    ps:0        holds the variables; serves them until the cluster stops it
    worker:i    builds its own copy of the graph and trains on its shard

    python train_async.py --batch-size 60 --epochs 1 [--straggler worker:1=0.05]

The plumbing (reading TF_CONFIG, loading and sharding MNIST, the training loop,
reporting steps and results) is lab_utils.ps_training; the part that makes this
*parameter-server* training is build_graph() below.
"""
import sys

from lab_utils import ps_training
from lab_utils.ps_training import PSGraph


def build_graph(task, settings):
    import tensorflow as tf

    from lab_utils import models

    v1 = tf.compat.v1
    # Variables go to /job:ps, computation stays on this worker.
    with v1.device(v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{task.index}", cluster=task.cluster)):
        global_step = v1.train.get_or_create_global_step()        # shared by all workers
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        logits = models.logistic_regression(x)                     # W, b on the PS
        loss = models.cross_entropy(logits, y)
        accuracy = models.accuracy(logits, y)
        opt = v1.train.GradientDescentOptimizer(settings.learning_rate)
        train_op = opt.minimize(loss, global_step=global_step)     # applied at once: asynchronous
    return PSGraph(x, y, loss, accuracy, train_op, global_step)


def main(argv=None):
    settings, task = ps_training.parse_args("async", argv, description=__doc__)  # bad input: exit 2, before TF
    if task.job == "ps":
        ps_training.serve(task)
        return 0
    ps_training.train_worker(task, settings, build=build_graph)
    return 0


if __name__ == "__main__":
    sys.exit(main())
