"""Lab 3: synchronous parameter-server training with SyncReplicasOptimizer.

Launched by the notebook with lab_utils.cluster.TFCluster (1 PS + N workers);
every task runs this same file, TF_CONFIG says which task it is.

    python train_sync.py --batch-size 60 --steps 300 [--replicas-to-aggregate 1]
                         [--straggler worker:1=0.05]

Each global step averages --replicas-to-aggregate gradients (default: one per
worker). Fewer than the number of workers = backup workers. The shutdown
protocol that makes every run end (and why runs hang without it) is explained
in lab_utils.ps_training's docstring.
"""
import sys

from lab_utils import ps_training
from lab_utils.ps_training import GradientCounter, PSGraph


def build_graph(task, settings):
    import tensorflow as tf

    from lab_utils import models

    v1 = tf.compat.v1
    with v1.device(v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{task.index}", cluster=task.cluster)):
        global_step = v1.train.get_or_create_global_step()
        x = v1.placeholder(tf.float32, [None, 784], name="x")
        y = v1.placeholder(tf.int64, [None], name="y")
        logits = models.logistic_regression(x)
        loss = models.cross_entropy(logits, y)
        accuracy = models.accuracy(logits, y)
        # Verification only: counts the gradients each update averages (see GradientCounter).
        counter = GradientCounter(task.index, settings.num_workers)
        opt = v1.train.SyncReplicasOptimizer(
            counter.wrap(v1.train.GradientDescentOptimizer(settings.learning_rate)),
            replicas_to_aggregate=settings.replicas,            # gradients averaged per global step
            total_num_replicas=settings.num_workers)             # workers taking part
        grads = opt.compute_gradients(loss) + [counter.gradient()]
        train_op = opt.apply_gradients(grads, global_step=global_step)  # push gradient, wait for a token
        # The chief runs the queue runner that aggregates and hands out tokens.
        # num_tokens=0: nobody starts a second step before the first update.
        sync_hook = opt.make_session_run_hook(is_chief=task.is_chief, num_tokens=0)
    return PSGraph(x, y, loss, accuracy, train_op, global_step, hooks=[sync_hook], counter=counter)


def main(argv=None):
    settings, task = ps_training.parse_args("sync", argv, description=__doc__)  # bad input: exit 2, before TF
    if task.job == "ps":
        ps_training.serve(task)
        return 0
    ps_training.train_worker(task, settings, build=build_graph)
    return 0


if __name__ == "__main__":
    sys.exit(main())
