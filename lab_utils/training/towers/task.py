"""AlexNet on several devices of one process (Lab 5): the task side.

``python -m lab_utils.training.towers --method M --devices N ...`` trains AlexNet
(:func:`lab_utils.models.alexnet`) for ``--steps`` steps on N devices of the tier
:func:`lab_utils.training.devices.configure` picks (real GPUs, logical GPUs, or
logical CPU devices) and reports ``step`` events and one ``result``:

* ``single``: ONE device, plain gradients, the whole batch (the reference);
* ``towers``: in-graph replication the CS 744 way, with the student's
  ``make_towers_step`` and ``average_gradients`` (``--student towers.py``): the
  batch split over N towers, the gradients averaged on the variable device;
* ``mirrored``: ``tf.distribute.MirroredStrategy`` on the same N devices, with the
  student's ``make_mirrored_step``.

``--batch-size`` is per device: a step trains on N x b examples, drawn in the same
order by every method (:func:`lab_utils.training.loop.batches` with ``--seed``), so
with ``--dropout 0`` all three end with the same weights up to float rounding.

A batch that does not fit in device memory (``ResourceExhaustedError``, or
``MemoryError`` on the host) is reported as ``result(oom=True, error=...)`` and the
process exits 0: a sweep records it and goes on. Across processes, Lab 5 runs the
same AlexNet with Horovod and MultiWorkerMirroredStrategy through
:mod:`lab_utils.training.allreduce` (``--model alexnet``).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator

import numpy as np

from lab_utils import data as lab_data
from lab_utils import report
from lab_utils.training import devices as lab_devices
from lab_utils.training import loop
from lab_utils.training.allreduce.task import plain_step
from lab_utils.training.student import load_student
from lab_utils.training.towers.settings import METHODS, PRECISIONS, make_parser, parse_args
from lab_utils.training.weights import save_weights

__all__ = ["METHODS", "PRECISIONS", "make_parser", "parse_args", "loss_fn", "run", "main"]

#: Test images evaluated at the end (the whole synthetic test set; a CPU-friendly part of CIFAR-10's).
EVAL_EXAMPLES = 2000


def loss_fn(logits, labels):
    """Mean softmax cross-entropy of a batch (float32 even under mixed precision)."""
    import tensorflow as tf

    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=tf.cast(logits, tf.float32))
    )


# ----------------------------------------------------------------------------- pieces


def _precision(a, tier, tf) -> str:
    if a.precision == "float32":
        tf.config.experimental.enable_tensor_float_32_execution(False)  # Ampere+ would round matmuls to TF32
        return "float32"
    if a.precision == "auto":
        gpu = tier.kind != "logical-cpu"
        cc = gpu and tf.config.experimental.get_device_details(tf.config.list_physical_devices("GPU")[0])
        if not (cc and cc.get("compute_capability", (0, 0)) >= (8, 0)):
            return "float32"
    tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")  # no loss scaling needed, unlike float16
    return "mixed_bfloat16"


def _data(a, global_batch: int):
    if a.variant == "cifar":
        return lab_data.load_cifar10(verbose=False, raw=True)  # images as bytes: float per batch
    # The 224 network on the seed's "fake dataset": one synthetic batch's worth of images, reused.
    return lab_data.synthetic_imagenet(global_batch, 0, image_size=224, num_classes=1000, seed=a.seed)


def _build(a, tf, num_classes: int):
    from lab_utils.models import alexnet

    model = alexnet(a.variant, num_classes=num_classes, width=a.width, dropout=a.dropout, seed=a.seed)
    opt = tf.keras.optimizers.SGD(a.learning_rate, momentum=a.momentum)
    opt.build(model.trainable_variables)  # slots now, on the variables' device
    return model, opt


def _replica_values(strategy, array: np.ndarray, n: int):
    """Replica i's part (i-th of n equal slices) of a global batch, on its device."""
    import tensorflow as tf

    parts = np.split(array, n)
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(parts[ctx.replica_id_in_sync_group])
    )


def _make_step(a, tier, tf, num_classes: int):
    """``(model, step(x, y) -> loss)`` for ``a.method`` on ``tier``'s devices."""
    if a.method == "mirrored":
        strategy = tf.distribute.MirroredStrategy(devices=list(tier.devices))
        with strategy.scope():
            model, opt = _build(a, tf, num_classes)
        student_step = load_student(a.student).make_mirrored_step(strategy, model, opt, a.batch_size * a.devices)

        def step(x, y):
            return student_step(_replica_values(strategy, x, a.devices), _replica_values(strategy, y, a.devices))

        return model, step
    with tf.device(tier.variable_device if a.method == "towers" else tier.devices[0]):
        model, opt = _build(a, tf, num_classes)
    if a.method == "single":
        return model, plain_step(model, opt, loss_fn)
    return model, load_student(a.student).make_towers_step(model, opt, list(tier.devices), tier.variable_device)


def _test_accuracy(model, data, device: str, tf, chunk: int) -> float | None:
    """:func:`loop.accuracy` on the first test images, on ``device``, ``chunk`` at a time."""
    with tf.device(device):
        return loop.accuracy(model, data.x_test[:EVAL_EXAMPLES], data.y_test[:EVAL_EXAMPLES], chunk)


# ----------------------------------------------------------------------------- the run


def _train(a, tier, tf, before_steps=None) -> dict:
    clock = loop.Clock()
    global_batch = a.batch_size * a.devices
    data = _data(a, global_batch)
    if global_batch > len(data.y_train):
        raise ValueError(f"a step needs {global_batch} examples; {data.name} has {len(data.y_train)}")
    precision = _precision(a, tier, tf)
    model, step = _make_step(a, tier, tf, data.num_classes)
    head = {"method": a.method, "devices": a.devices, "tier": tier.kind, "hardware": tier.hardware}
    head.update(variant=a.variant, params=int(model.count_params()), precision=precision, data=data.source)
    report.event("device", device_names=list(tier.devices), variable_device=tier.variable_device, **head)
    batches: Iterator = loop.batches(data.x_train, data.y_train, global_batch, a.seed)
    stop_watch = before_steps() if before_steps is not None else None  # data and model are in memory now
    clock.mark("graph")
    clock.mark("session")
    losses = [float(step(*next(batches))) for _ in range(a.warmup_steps)]  # tracing, allocation: not timed
    done = itertools.count(a.warmup_steps + 1)

    # One graph runs the towers and their reduction (device-to-device copies inside this
    # process): one part on the timeline, named for what it holds.
    part = "forward/backward/update" if a.devices == 1 else f"{a.devices} towers and their all-reduce (one graph)"

    def one(xb, yb, _stats):
        with report.span(part, "compute"):
            loss = float(step(xb, yb))  # float(): waits for the devices, so the step's time is real
        losses.append(loss)
        return next(done), loss

    stats = loop.run_steps(one, batches, a.warmup_steps + a.steps, clock=clock, global_step=lambda: a.warmup_steps)
    if stop_watch is not None:
        stop_watch()  # the evaluation below is not training: its memory does not count
    head.update(
        accuracy=_test_accuracy(model, data, tier.devices[0], tf, a.batch_size), loss_first=losses[0], loss=losses[-1]
    )
    if a.save_weights:
        save_weights(model, a.save_weights)
    clock.mark("end")
    tail = {"batch_size": a.batch_size, "global_batch": global_batch, "steps": a.steps, "warmup_steps": a.warmup_steps}
    tail.update(memory_limit_mb=tier.memory_limit_mb, oom=False)
    return loop.report_result(head, stats, clock, tail)


def _oom_message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = next((line for line in text if "OOM" in line or "memory" in line.lower()), text[0] if text else "")
    return f"{type(exc).__name__}: {first[:300]}"


def _oom(a, tier, error: str, t0: float) -> dict:
    """Report and return the result of a run that ran out of device memory."""
    result = {"method": a.method, "devices": a.devices, "tier": tier.kind, "hardware": tier.hardware}
    result.update(batch_size=a.batch_size, global_batch=a.batch_size * a.devices, oom=True)
    result.update(error=error, memory_limit_mb=tier.memory_limit_mb, seconds=time.time() - t0)
    report.result(**result)
    print(f"out of memory: {error}", file=sys.stderr, flush=True)
    return result


# ----------------------------------------------------------------------------- the quick check

#: Images of the quick check's tiny model (8 x 8 x 3: a convolution and a dense layer).
CHECK_SHAPE = (8, 8, 3)
#: Relative weight difference from one device that still counts as equal (float32 rounding).
CHECK_TOLERANCE = 1e-4


def _tiny_model(tf, seed: int):
    init = tf.keras.initializers.GlorotUniform
    return tf.keras.Sequential(
        [
            tf.keras.layers.Input(CHECK_SHAPE),
            tf.keras.layers.Conv2D(4, 3, activation="relu", kernel_initializer=init(seed)),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(10, kernel_initializer=init(seed + 1)),
        ]
    )


def _rel_diff(weights, reference) -> float:
    return max(
        float(np.max(np.abs(w - r)) / max(float(np.max(np.abs(r))), 1e-12))
        for w, r in zip(weights, reference, strict=True)
    )


def check_steps(a, tier, tf) -> dict:
    """The student's ``make_towers_step`` and ``make_mirrored_step`` against one device, on a
    tiny model: ``a.steps`` steps of SGD with momentum from the same weights on the same
    examples (``a.batch_size`` per device). Returns, per method, the largest relative weight
    difference from one device and the first step's loss against one device's (the mean over
    the global batch). A sum instead of an average, one tower's gradient, an unscaled
    replica loss or a loss reduced with MEAN shows as a difference of 1e-2 or more."""
    tf.config.experimental.enable_tensor_float_32_execution(False)
    n, b = a.devices, a.batch_size
    rng = np.random.default_rng(a.seed)
    xs = rng.normal(size=(a.steps, n * b, *CHECK_SHAPE)).astype(np.float32)
    ys = rng.integers(0, 10, size=(a.steps, n * b)).astype(np.int64)
    student = load_student(a.student)

    def make(method):
        def build():
            model = _tiny_model(tf, a.seed)
            opt = tf.keras.optimizers.SGD(a.learning_rate, momentum=a.momentum)
            opt.build(model.trainable_variables)
            return model, opt

        if method == "mirrored":
            strategy = tf.distribute.MirroredStrategy(devices=list(tier.devices))
            with strategy.scope():
                model, opt = build()
            step = student.make_mirrored_step(strategy, model, opt, n * b)
            return model, lambda x, y: step(_replica_values(strategy, x, n), _replica_values(strategy, y, n))
        with tf.device(tier.variable_device if method == "towers" else tier.devices[0]):
            model, opt = build()
        if method == "single":
            return model, plain_step(model, opt, loss_fn)
        return model, student.make_towers_step(model, opt, list(tier.devices), tier.variable_device)

    out, reference = {"devices": n, "batch_size": b, "steps": a.steps, "tolerance": CHECK_TOLERANCE}, None
    for method in METHODS:
        model, step = make(method)
        losses = [float(step(xs[i], ys[i])) for i in range(a.steps)]
        weights = [w.copy() for w in model.get_weights()]
        if method == "single":
            reference, first_loss = weights, losses[0]
            out["loss_single"] = first_loss
            continue
        out[f"{method}_weights_rel_diff"] = _rel_diff(weights, reference)
        out[f"{method}_loss"] = losses[0]
    return out


def run(argv=None) -> dict:
    """Parse ``argv``, set up the devices, train, report; returns the result."""
    a = parse_args(argv)
    t0 = time.time()
    if a.check:
        tier = lab_devices.configure(a.devices, "cpu")  # logical CPU devices: seconds on any machine
        report.ready(tier=tier.kind, devices=list(tier.devices))
        import tensorflow as tf

        result = check_steps(a, tier, tf)
        report.result(**result)
        return result
    tier = lab_devices.configure(a.devices, a.device_kind, a.memory_limit_mb)
    report.ready(tier=tier.kind, devices=list(tier.devices))
    import tensorflow as tf

    watch = None
    if tier.kind == "logical-cpu" and a.memory_limit_mb:

        def exceeded(rss: int, cap: int) -> None:
            grown = (rss - cap) // 2**20 + a.memory_limit_mb
            _oom(a, tier, f"training needed more than {a.memory_limit_mb:,} MB of device memory ({grown:,} MB)", t0)
            loop.quick_exit(0)  # from the watching thread: TensorFlow's ops cannot be interrupted

        def watch():
            return lab_devices.watch_memory(a.memory_limit_mb, exceeded)

    try:
        return _train(a, tier, tf, before_steps=watch)
    except (tf.errors.ResourceExhaustedError, MemoryError) as exc:
        # The seed's GPU runs crashed here; a sweep wants a row that says so, and goes on.
        return _oom(a, tier, _oom_message(exc), t0)
    except tf.errors.InternalError as exc:
        if "Dst tensor is not initialized" not in str(exc):  # a host-to-GPU copy that found no memory
            raise
        return _oom(a, tier, _oom_message(exc), t0)


def main(argv=None) -> int:
    run(argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
