"""Data-parallel training with all-reduce (Lab 4): the task side.

Lab 4's ``train_hvd.py`` (students complete it in the notebook) is run by
``horovodrun`` on every rank::

    settings = allreduce.parse_args(argv)          # bad input: exit 2, before TensorFlow
    hvd.init()
    model = allreduce.build_model(settings)        # the same start on every rank
    ... the student's step: gradients averaged over the ranks ...
    allreduce.train(settings, step, rank=hvd.rank(), size=hvd.size(), model=model)

The same loop also runs the two references of Part C, without Horovod:

* ``python -m lab_utils.training.allreduce --strategy single --emulate-ranks N``:
  ONE process whose batch at step t is the concatenation of what N ranks would
  draw at step t (N x b examples), with plain gradients;
* ``--strategy mwms``: ``tf.distribute.MultiWorkerMirroredStrategy`` with the
  RING collective, one process per worker (``TFCluster(ps=0, ...)``).

Why all of them end with the same weights: every rank ``r`` of ``N`` trains on
shard ``r`` (:func:`lab_utils.training.loop.load_shard`, the same contiguous
shards as Labs 2-3) and draws its batches in the order fixed by seed
``1000 * seed + r`` (the order Lab 3's synchronous workers use). The model starts
from the same weights everywhere; the loss of a batch is its *mean*; so the mean
of N ranks' gradients, each over b examples, is the gradient of the mean over
all N x b examples: one big-batch step. Only the order of float additions
differs (see :func:`max_difference`).

Each run reports ``step`` events (``loss``; ``accuracy`` every ``eval_every``
steps, timed apart from training) and one ``result`` with examples/s; rank 0
saves the final weights (``--save-weights``) for the comparisons.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import numpy as np

from lab_utils import report
from lab_utils.training import loop
from lab_utils.training.allreduce.settings import (
    MODELS,
    STRATEGIES,
    Settings,
    check_args,
    make_parser,
    parse_args,
)
from lab_utils.training.weights import load_weights_file, max_difference, save_weights

__all__ = [
    "MODELS",
    "STRATEGIES",
    "Settings",
    "make_parser",
    "parse_args",
    "check_args",
    "rank_batches",
    "global_batches",
    "build_model",
    "loss_fn",
    "load_data",
    "load_weights_file",
    "save_weights",
    "max_difference",
    "weights_sum",
    "plain_step",
    "train",
    "main",
]

#: Test examples evaluated for AlexNet (Lab 5; a CPU-friendly part of the test set).
ALEXNET_EVAL_EXAMPLES = 2000


# ----------------------------------------------------------------------------- data order


def rank_batches(data, rank: int, size: int, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Rank ``rank`` of ``size``'s batches: its shard of ``data``, in the order fixed by
    ``1000 * seed + rank`` (Lab 3's synchronous workers draw theirs the same way)."""
    shard = loop.load_shard(size, rank, batch_size, data)
    return shard.batches(batch_size, seed * 1000 + rank)


def global_batches(data, size: int, batch_size: int, seed: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """What ``size`` ranks draw together at each step, as ONE batch of ``size x batch_size``
    (rank 0's examples first): the big-batch process of Lab 4, Part C."""
    streams = [rank_batches(data, r, size, batch_size, seed) for r in range(size)]
    while True:
        parts = [next(s) for s in streams]
        yield np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])


# ----------------------------------------------------------------------------- model


def build_model(settings: Settings, seed: int | None = None):
    """A Keras model, built (its variables exist). ``logreg``: one dense layer 784 -> 10
    with zero initial weights (Labs 1-3's model); ``cnn``: conv 5x5x8, max-pool, dense
    10, with Glorot initial weights drawn from ``seed`` (default ``settings.seed``):
    give each rank another seed and only a broadcast makes them start equal. ``alexnet``:
    Lab 5's :func:`lab_utils.models.alexnet` for CIFAR-size images, ``width`` and ``dropout``
    from the settings, initial weights from ``seed`` likewise."""
    import tensorflow as tf

    layers = tf.keras.layers
    if settings.model == "alexnet":
        from lab_utils.models import alexnet

        seed = settings.seed if seed is None else seed
        return alexnet("cifar", width=settings.width, dropout=settings.dropout, seed=seed)
    if settings.model == "logreg":
        model = tf.keras.Sequential(
            [layers.Dense(10, kernel_initializer="zeros", bias_initializer="zeros", name="softmax")], name="logreg"
        )
    else:
        init = tf.keras.initializers.GlorotUniform(seed=settings.seed if seed is None else seed)
        model = tf.keras.Sequential(
            [
                layers.Reshape((28, 28, 1)),
                layers.Conv2D(8, 5, activation="relu", kernel_initializer=init, name="conv"),
                layers.MaxPooling2D(4),
                layers.Flatten(),
                layers.Dense(10, kernel_initializer=init, name="softmax"),
            ],
            name="cnn",
        )
    model.build((None, 784))
    return model


def loss_fn(logits, labels):
    """Mean softmax cross-entropy of a batch (the same fused op as Labs 1-3)."""
    import tensorflow as tf

    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def load_data(settings: Settings):
    """The data set of ``settings.model``: MNIST (Labs 1-4), or CIFAR-10 / its synthetic
    stand-in for AlexNet (Lab 5), with the test set cut to what a CPU evaluates quickly."""
    from lab_utils import data as lab_data

    if settings.model != "alexnet":
        return lab_data.load_mnist(verbose=False, raw=True)  # training images as bytes: float per batch
    d = lab_data.load_cifar10(verbose=False, raw=True)  # images as bytes: float per batch
    n = ALEXNET_EVAL_EXAMPLES
    return lab_data.Dataset(d.x_train, d.y_train, d.x_test[:n], d.y_test[:n], d.source, d.name, d.num_classes)


# ----------------------------------------------------------------------------- weights (the files: training.weights)


def weights_sum(model) -> float:
    """The sum of ``|w|`` over every weight of ``model``, in float64: a digest each rank
    reports, equal on ranks that hold the same weights (to float32 rounding). Read a million
    entries at a time: a copy of AlexNet's weights would add 0.2 GB to every rank."""
    import tensorflow as tf

    total = 0.0
    for v in model.weights:
        if v.shape.rank == 0:
            total += abs(float(v.numpy()))
            continue
        rows = int(v.shape[0])
        step = max(1, 2**20 // max(1, int(np.prod(v.shape[1:]))))
        for i in range(0, rows, step):
            total += float(tf.reduce_sum(tf.abs(tf.cast(v[i : i + step], tf.float64))))
    return total


# ----------------------------------------------------------------------------- the loop

#: ``step(x_batch, y_batch) -> loss``: one training step (the student's, for Horovod).
StepFn = Callable[[np.ndarray, np.ndarray], object]


def train(
    settings: Settings,
    step: StepFn,
    *,
    rank: int,
    size: int,
    model,
    data=None,
    checkpoint: Callable[[], None] | None = None,
    extra: dict | None = None,
) -> dict:
    """Run ``settings.steps`` steps of ``step`` on this rank's batches and report.

    The first step is a warm-up (``tf.function`` tracing, the first collectives): it
    trains like the others but is not timed or counted in ``examples``. Rank 0
    evaluates on the test set every ``eval_every`` steps (timed apart), saves the
    weights to ``settings.save_weights`` and creates ``checkpoint_dir``; then every
    rank calls ``checkpoint()`` (the script writes on rank 0 only). Every rank reports one ``result``: ``examples_per_sec`` of this rank, the
    loop's timings, ``accuracy`` (rank 0), ``loss``. Returns it."""
    from lab_utils.models import trace_horovod_as_written

    trace_horovod_as_written()  # a student's train_hvd.py imports TensorFlow itself
    clock = loop.Clock()
    initial = weights_sum(model)  # after the script's broadcast, if it made one
    data = load_data(settings) if data is None else data
    if settings.strategy == "single" and settings.emulate_ranks > 1:
        batches = global_batches(data, settings.emulate_ranks, settings.batch_size, settings.seed)
    else:
        batches = rank_batches(data, rank, size, settings.batch_size, settings.seed)
    clock.mark("graph")
    clock.mark("session")
    done = {"steps": 0}
    last = {"loss": float("nan")}

    # One process computes the whole step: one part. Horovod's and MultiWorkerMirrored's steps
    # all-reduce inside the same graph call; Horovod's own timeline splits them (the kernel side).
    part = report.span("forward/backward/update", "compute") if settings.strategy == "single" else None
    if settings.strategy == "mwms":  # one graph call, all-reduce inside: it waits for every worker's
        others = [f"worker:{r}" for r in range(size) if r != rank]
        part = report.span("forward/backward, all-reduce, update", "compute", on=others or None)

    def one(xb, yb, _stats):
        with part or contextlib.nullcontext():
            last["loss"] = float(step(xb, yb))
        done["steps"] += 1
        return done["steps"], last["loss"]

    chunk = settings.batch_size if settings.model == "alexnet" else 500
    evaluate = (lambda: loop.accuracy(model, data.x_test, data.y_test, chunk)) if rank == 0 else None
    one(*next(batches), None)  # warm-up: tracing the step function and the first collectives, not timed
    stats = loop.run_steps(
        one,
        batches,
        settings.steps,
        clock=clock,
        global_step=lambda: done["steps"],
        evaluate=evaluate,
        eval_every=settings.eval_every,
    )
    head = {"strategy": settings.strategy, "model": settings.model, "rank": rank, "size": size, "loss": last["loss"]}
    # every rank's digest of its weights, as the loop got them and at the end: equal on every rank
    # when the script broadcast the initial weights, and averaged every gradient
    head.update(initial_weights_sum=initial, weights_sum=weights_sum(model))
    if rank == 0:
        head["accuracy"] = loop.accuracy(model, data.x_test, data.y_test, chunk)
        if settings.save_weights:
            save_weights(model, settings.save_weights)
        if settings.checkpoint_dir:
            os.makedirs(settings.checkpoint_dir, exist_ok=True)
    if checkpoint is not None:
        checkpoint()  # on every rank: the script decides who writes (rank 0)
    clock.mark("end")
    tail = {"batch_size": settings.batch_size, "steps": settings.steps, "warmup_steps": 1, "fp16": settings.fp16}
    tail.update(extra or {})
    return loop.report_result(head, stats, clock, tail)


# ----------------------------------------------------------------------------- references without Horovod


def plain_step(model, opt, loss: Callable):
    """``step(x, y) -> loss``: one device's plain gradient step (the references of Labs 4-5)."""
    import tensorflow as tf

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(model(x, training=True), y)
        opt.apply_gradients(
            zip(tape.gradient(value, model.trainable_variables), model.trainable_variables, strict=True)
        )
        return value

    return step


def _single(settings: Settings) -> dict:
    """One process, plain gradients (the big-batch reference of Part C)."""
    import tensorflow as tf

    tf.random.set_seed(settings.seed)
    model = build_model(settings)
    opt = tf.keras.optimizers.SGD(settings.learning_rate)

    step = plain_step(model, opt, loss_fn)
    return train(settings, step, rank=0, size=1, model=model, extra={"emulate_ranks": settings.emulate_ranks})


def _mwms(settings: Settings) -> dict:
    """``MultiWorkerMirroredStrategy`` with the RING collective (TF_CONFIG from TFCluster)."""
    import tensorflow as tf

    from lab_utils.cluster import task_config

    cfg = task_config()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    report.ready(address=cfg.address)
    size = strategy.num_replicas_in_sync
    global_batch = settings.batch_size * size
    with strategy.scope():
        model = build_model(settings)
        opt = tf.keras.optimizers.SGD(settings.learning_rate)

    @tf.function
    def replica_step(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x, training=True))
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(list(zip(grads, model.trainable_variables, strict=True)))  # summed over the workers
        return loss

    def step(x, y):
        per_replica = strategy.run(replica_step, args=(tf.constant(x), tf.constant(y)))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return train(settings, step, rank=cfg.index, size=size, model=model)


def main(argv=None) -> int:
    """``python -m lab_utils.training.allreduce --strategy single|mwms ...``."""
    settings = parse_args(argv, description="Lab 4's references: one big-batch process, or MultiWorkerMirrored")
    if settings.strategy == "hvd":
        raise SystemExit("--strategy hvd is what train_hvd.py runs (Lab 4, Exercise 3); here: single or mwms")
    from lab_utils.models import import_tensorflow

    import_tensorflow()
    if settings.strategy == "single":
        report.ready()
        _single(settings)
    else:
        _mwms(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
