"""The same idea in TF2: ``ParameterServerStrategy`` with a ``ClusterCoordinator`` (Lab 2's aside).

Every task of a ``1 chief + 1 PS + N workers`` :class:`~lab_utils.cluster.TFCluster` runs::

    python -m lab_utils.training.ps.strategy --steps 200 --batch-size 64 --learning-rate 0.5

A shipped script, not a student's: the aside shows today's API for what Lab 2 builds with
``tf.compat.v1``. The PS and the workers only start their server and serve
(:func:`lab_utils.training.ps.serve`, as Lab 2's PS does) until the launcher stops them;
they never run Python of ours again. The **chief** is the coordinator:

1. it imports TensorFlow and loads the data while the servers start, then waits until
   every server accepts connections (:func:`wait_for_servers`, a probe under a deadline);
2. ``ParameterServerStrategy(TFConfigClusterResolver())`` and a ``ClusterCoordinator``;
   inside ``strategy.scope()`` a Keras ``Dense(10)`` (logistic regression) and an ``SGD``
   optimizer, whose variables go to ``/job:ps``;
3. ``coordinator.create_per_worker_dataset``: each worker reads its own shard of the
   lab's MNIST (:func:`lab_utils.data.load_mnist`; ``shard(N, worker index)``);
4. ``--steps`` calls of ``coordinator.schedule(train_step)``: each returns at once, and
   the coordinator runs the step (a ``GradientTape`` step) on whichever worker is free;
   the step also returns ``experimental_get_current_worker_index()``, so the chief knows
   which worker ran it;
5. ``coordinator.join()``, then the test accuracy computed by the chief itself from the
   variables on the PS, and one ``result`` (plus one ``step`` event per step: the worker
   that ran it and its loss).

The chief then exits, and with it the run: the launcher stops the servers. Importing this
module does not import TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from collections.abc import Mapping, Sequence

from lab_utils import report
from lab_utils.training.ps.strategy.flags import make_parser, parse_args

__all__ = [
    "SERVER_WAIT_SECS",
    "MIN_INTEROP_THREADS",
    "enough_interop_threads",
    "make_parser",
    "parse_args",
    "wait_for_servers",
    "train",
    "main",
]

#: How long the chief waits for every PS and worker server to accept connections.
SERVER_WAIT_SECS = 60.0
#: Shuffle buffer of each worker's shard.
SHUFFLE_BUFFER = 1024
#: The fewest inter-op threads a task of this cluster may run with. The launcher sizes every
#: pool to the cores the session may use (:func:`lab_utils.resources.thread_env`): 1 under
#: Binder's 1-CPU quota, where a worker's one inter-op thread runs the scheduled step, blocks
#: on its reads from the PS, and nothing is left to complete them: the run deadlocked, every
#: task idle, until the launcher's timeout (measured 2026-11-27, 3 runs of 3). Two suffice.
MIN_INTEROP_THREADS = 2


def enough_interop_threads(env: dict) -> None:
    """Raise ``env``'s ``TF_NUM_INTEROP_THREADS`` to :data:`MIN_INTEROP_THREADS` where the
    launcher set it lower (unset: TensorFlow sizes the pool to the cores, at least 2 here)."""
    value = env.get("TF_NUM_INTEROP_THREADS")
    if value and value.isdigit() and int(value) < MIN_INTEROP_THREADS:
        env["TF_NUM_INTEROP_THREADS"] = str(MIN_INTEROP_THREADS)


def wait_for_servers(cluster: Mapping[str, Sequence[str]], timeout: float = SERVER_WAIT_SECS) -> float:
    """Poll until every ``ps`` and ``worker`` address of ``cluster`` accepts a TCP connection
    (their servers are up), under ``timeout`` s. Returns the seconds waited; raises
    ``TimeoutError`` naming the tasks that never answered."""
    t0 = time.monotonic()
    pending = [(f"{job}:{i}", address) for job in ("ps", "worker") for i, address in enumerate(cluster.get(job, []))]
    pause = 0.01
    while pending:
        still = []
        for name, address in pending:
            host, _, port = address.rpartition(":")
            try:
                with socket.create_connection((host, int(port)), timeout=1.0):
                    pass
            except OSError:
                still.append((name, address))
        pending = still
        if not pending:
            break
        if time.monotonic() - t0 > timeout:
            names = ", ".join(f"{name} ({address})" for name, address in pending)
            raise TimeoutError(f"chief:0: no server answered at {names} within {timeout:g} s")
        time.sleep(pause)  # a probe interval under the deadline, backing off to 0.1 s
        pause = min(2 * pause, 0.1)
    return time.monotonic() - t0


def _shard_fn(tf, x, y, num_workers: int, batch_size: int, seed: int):
    """The per-worker dataset: this worker's shard (by its index), shuffled, repeated, batched."""
    scale = x.dtype.kind == "u"  # raw uint8 pixels (full MNIST): to [0, 1] floats one batch at a time

    def dataset_fn():
        index = tf.distribute.coordinator.experimental_get_current_worker_index()
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(num_workers, index)
        ds = ds.shuffle(SHUFFLE_BUFFER, seed=seed).repeat().batch(batch_size, drop_remainder=True)
        if scale:
            ds = ds.map(lambda xb, yb: (tf.cast(xb, tf.float32) / 255.0, yb))
        return ds.prefetch(2)

    return dataset_fn


def train(task, args: argparse.Namespace, data=None) -> dict:
    """The chief's run (see the module docstring). ``data``: a
    :class:`lab_utils.data.Dataset` (default :func:`lab_utils.data.load_mnist`, raw).
    Returns the result dict; reports one ``step`` event per step."""
    from lab_utils.data import load_mnist
    from lab_utils.models import import_tensorflow

    t0 = time.monotonic()
    tf = import_tensorflow()  # while the servers import theirs
    data = load_mnist(verbose=False, raw=True) if data is None else data
    waited = wait_for_servers(task.cluster)
    tf.random.set_seed(args.seed)
    strategy = tf.distribute.ParameterServerStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver())
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    n = min(len(data.y_train), args.steps * args.batch_size)  # what the steps can use: ship no more
    num_workers = len(task.cluster["worker"])
    per_worker = coordinator.create_per_worker_dataset(
        _shard_fn(tf, data.x_train[:n], data.y_train[:n], num_workers, args.batch_size, args.seed)
    )
    iterator = iter(per_worker)
    with strategy.scope():  # variables created here live on /job:ps
        model = tf.keras.Sequential([tf.keras.layers.Dense(10, kernel_initializer="zeros")])
        model.build((None, 784))
        optimizer = tf.keras.optimizers.SGD(args.learning_rate)

    @tf.function
    def train_step(iterator):
        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                logits = model(xb, training=True)
                loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(yb, logits, from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        xb, yb = next(iterator)
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return strategy.run(step_fn, args=(xb, yb)), worker

    startup = time.monotonic() - t0
    t1 = time.monotonic()
    handles = [coordinator.schedule(train_step, args=(iterator,)) for _ in range(args.steps)]
    scheduled = time.monotonic() - t1
    coordinator.join()  # every scheduled step has run
    train_time = time.monotonic() - t1
    steps = [(float(loss), int(worker)) for loss, worker in (h.fetch() for h in handles)]
    counts = {f"worker:{i}": 0 for i in range(num_workers)}
    for i, (loss, worker) in enumerate(steps):
        counts[f"worker:{worker}"] += 1
        report.step(i + 1, (i + 1) * args.batch_size, loss=loss, worker=f"worker:{worker}")
    logits = model(data.x_test, training=False)  # the chief reads the variables from the PS
    accuracy = float(tf.reduce_mean(tf.cast(tf.argmax(logits, axis=1) == data.y_test, tf.float32)))
    return {
        "accuracy": accuracy,
        "loss_first": steps[0][0],
        "loss_last": steps[-1][0],
        "steps_scheduled": args.steps,
        "updates_applied": int(optimizer.iterations.numpy()),  # on the PS: one per step that ran
        "worker_steps": counts,
        "num_workers": num_workers,
        "batch_size": args.batch_size,
        "learning_rate": args.learning_rate,
        "variables_on": sorted({v.device for v in model.trainable_variables}),
        "data_source": data.source,
        "examples": args.steps * args.batch_size,
        "server_wait_time": waited,
        "startup_time": startup,
        "schedule_time": scheduled,
        "train_time": train_time,
        "examples_per_sec": args.steps * args.batch_size / train_time,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """One task: PS and workers serve until stopped; the chief trains, reports and exits."""
    from lab_utils.cluster import task_config
    from lab_utils.training import loop
    from lab_utils.training.ps import task as ps

    args = parse_args(argv)
    task = task_config()
    os.environ["GRPC_FAIL_FAST"] = "use_caller"  # TensorFlow's advice for every task of a PS strategy cluster
    enough_interop_threads(os.environ)  # read when TensorFlow starts, which it has not yet
    if task.job in ("ps", "worker"):
        ps.serve(task)  # start the server, report ready, serve until the launcher stops this task
        return 0
    if task.job != "chief":
        raise SystemExit(f"{task.task}: a ParameterServerStrategy cluster has chief, ps and worker tasks only")
    report.ready()  # the chief serves nothing: it is up once it runs
    report.result(**train(task, args))
    loop.quick_exit(0)  # skip the coordinator's teardown: the servers it talks to are stopped next
    return 0
