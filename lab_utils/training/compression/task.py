"""Lab 6's task side: one Horovod rank training with compressed gradients.

``horovodrun`` starts this module on every rank (:func:`lab_utils.training.compression.runs.run`
does it for the notebook)::

    horovodrun -np 2 python -m lab_utils.training.compression.task --method topk --ratio 0.01 --student compressors.py
    horovodrun -np 2 python -m lab_utils.training.compression.task --method onebit --student compressors.py

The model is an MLP on MNIST, 784 -> ``--hidden`` (ReLU) -> 10: with 1024 hidden units,
814,090 parameters, 3.3 MB of float32 gradients per step, enough for a 100 Mbit/s link
to take longer than the arithmetic. Every rank builds it from the same seed, so the
ranks start equal without a broadcast (which would add 3.3 MB to the bytes counted).
Each rank trains on its shard of MNIST in Lab 4's order (:func:`allreduce.rank_batches`),
learning rate ``--learning-rate x ranks``, plain SGD; the gradients go through
:func:`make_exchange` with ``--method``:
``none``, ``fp16``, ``topk`` (the function ``topk`` of the ``--student`` file,
``compressors.py``, keeping ``--ratio`` of each tensor) or ``onebit`` (its functions
``onebit`` and ``onebit_decompress``).

Each step reports (``lab_utils.report``) ``loss``, ``train_s`` (seconds of training
so far, warm-up and evaluations excluded), ``bytes_sent`` (what this rank has sent
so far, by :func:`compression.wire_bytes`), ``error_norm`` (the residuals' norm, for
``onebit``/``topk``) and, on rank 0 every ``--eval-every`` steps, ``accuracy``;
with ``onebit``/``topk``, the step's parts for the run's timeline too (forward/backward,
encode, allgather, decode, apply: :meth:`TimedFeedback.add_spans`). The result adds
``bytes_per_step``, ``message_bytes``, ``n_params``, ``k`` (topk) and ``link_sent``
(what this rank's namespace sent on its links from the warm-up's end to the last step's
end: :func:`link_sent`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lab_utils import report
from lab_utils.training import loop
from lab_utils.training.allreduce import task as allreduce
from lab_utils.training.compression import codecs as compression
from lab_utils.training.compression.codecs import (
    STUDENT_FUNCTIONS,
    ErrorFeedback,
    checked_method,
    make_codec,
    student_needs,
)
from lab_utils.training.compression.settings import Settings, check_args, load_compressors, make_parser, parse_args

__all__ = [
    "Settings",
    "make_parser",
    "parse_args",
    "check_args",
    "build_model",
    "load_compressors",
    "make_exchange",
    "TimedFeedback",
    "train",
    "main",
]


def build_model(settings: Settings):
    """The MLP 784 -> ``hidden`` (ReLU) -> 10, Glorot weights from ``settings.seed``, zero biases."""
    import tensorflow as tf

    init = tf.keras.initializers.GlorotUniform(seed=settings.seed)
    layers = tf.keras.layers
    model = tf.keras.Sequential(
        [
            layers.Dense(settings.hidden, activation="relu", kernel_initializer=init, name="hidden"),
            layers.Dense(10, kernel_initializer=init, name="softmax"),
        ],
        name="mlp",
    )
    model.build((None, 784))
    return model


class TimedFeedback(ErrorFeedback):
    """An :class:`ErrorFeedback` that keeps when its last :meth:`encode` and :meth:`decode`
    ran (``time.time()``), for :meth:`add_spans`: the step runs in TensorFlow, but these two
    are Python (``tf.numpy_function``), and the all-gather is what lies between them."""

    encoded: tuple[float, float] | None = None
    decoded: tuple[float, float] | None = None

    def encode(self, *grads: np.ndarray) -> np.ndarray:
        start = time.time()
        try:
            return super().encode(*grads)
        finally:
            self.encoded = (start, time.time())

    def decode(self, gathered: np.ndarray) -> list[np.ndarray]:
        start = time.time()
        try:
            return super().decode(gathered)
        finally:
            self.decoded = (start, time.time())

    def add_spans(self, start: float, end: float) -> None:
        """The parts of the step that ran from ``start`` to ``end`` (``time.time()``), for the
        run's timeline (:func:`lab_utils.report.add_span`): ``forward/backward`` (up to the
        encoding), ``encode``, ``allgather`` (from this rank's message being ready to every
        rank's having arrived: it includes waiting for a slower rank), ``decode`` and ``apply``
        (to the step's end). Records nothing unless this step's encode and decode ran between."""
        enc, dec = self.encoded, self.decoded
        if enc is None or dec is None or not start <= enc[0] <= enc[1] <= dec[0] <= dec[1] <= end:
            return
        report.add_span("forward/backward", "compute", start, enc[0])
        report.add_span("encode", "compute", *enc)
        report.add_span("allgather", "comm", enc[1], dec[0], on=report.peers() or None)  # a collective
        report.add_span("decode", "compute", *dec)
        report.add_span("apply", "compute", dec[1], end)


def make_exchange(
    method: str,
    variables: Sequence[Any],
    *,
    ratio: float = 0.01,
    student: Any = None,
) -> tuple[Callable[[Sequence[Any]], list[Any]], ErrorFeedback | None]:
    """``(exchange, feedback)``: ``exchange(grads)`` returns the gradients of
    ``variables`` averaged over Horovod's ranks, compressed with ``method``; call it
    inside the training step's ``tf.function``. ``feedback`` is the rank's
    :class:`TimedFeedback` (None for ``none``/``fp16``).

    ``none``/``fp16``: one grouped ``hvd.allreduce`` (``op=Average``, with
    ``hvd.Compression.none`` / ``.fp16``). ``onebit`` and ``topk`` (``ratio`` of each
    tensor) call the functions of ``student``, the loaded ``compressors.py``
    (:func:`make_codec`): the NumPy encoding (``tf.numpy_function``), ONE
    ``hvd.allgather`` of the uint8 message, the NumPy decoding and average. Needs
    ``hvd.init()`` first."""
    codec = None
    if checked_method(method) in STUDENT_FUNCTIONS:
        if student is None:
            raise ValueError(
                f"method {method!r} needs student=: the loaded compressors.py with {student_needs(method)}"
            )
        codec = make_codec(method, student, ratio=ratio)
    import horovod.tensorflow as hvd
    import tensorflow as tf

    variables = list(variables)
    if codec is None:
        compression = hvd.Compression.fp16 if method == "fp16" else hvd.Compression.none

        def allreduce(grads: Sequence[Any]) -> list[Any]:
            return hvd.grouped_allreduce(list(grads), op=hvd.Average, compression=compression)

        return allreduce, None
    feedback = TimedFeedback(codec, [v.shape for v in variables])

    def allgather(grads: Sequence[Any]) -> list[Any]:
        message = tf.numpy_function(feedback.encode, list(grads), tf.uint8, name=f"{method}_encode")
        message = tf.ensure_shape(message, [feedback.message_bytes])
        gathered = hvd.allgather(message, name=f"{method}_message")
        out = tf.numpy_function(feedback.decode, [gathered], [tf.float32] * len(variables), name=f"{method}_decode")
        return [tf.ensure_shape(o, v.shape) for o, v in zip(out, variables, strict=True)]

    return allgather, feedback


def train(
    settings: Settings,
    step: Callable[[np.ndarray, np.ndarray], object],
    *,
    rank: int,
    size: int,
    model,
    bytes_per_step: int,
    feedback: compression.ErrorFeedback | None = None,
    data=None,
    extra: dict | None = None,
    barrier: Callable[[], Any] = lambda: None,
) -> dict:
    """Run one untimed warm-up step and ``settings.steps`` steps of ``step`` on this
    rank's batches, reporting each (see the module's docstring); rank 0 evaluates on
    the test set every ``eval_every`` steps (timed apart). Reports and returns the result.
    A :class:`TimedFeedback` adds each timed step's parts (:meth:`TimedFeedback.add_spans`);
    with ``none`` and ``fp16`` the step is one piece of TensorFlow, all-reduce included.
    ``barrier``: returns once every rank called it (a tiny all-reduce), before each read of
    :func:`link_sent`, so that no step's bytes are still queued on their way out when read."""
    from lab_utils.data import load_mnist

    clock = loop.Clock()
    data = load_mnist(verbose=False, raw=True) if data is None else data  # bytes: float per batch
    batches = allreduce.rank_batches(data, rank, size, settings.batch_size, settings.seed)
    clock.mark("graph")
    clock.mark("session")
    state = {"steps": 0, "loss": float("nan")}

    def one(xb, yb, _stats):
        start = time.time()
        state["loss"] = float(step(xb, yb))
        if isinstance(feedback, TimedFeedback):
            feedback.add_spans(start, time.time())
        state["steps"] += 1
        return state["steps"], state["loss"]

    def fields(_previous: int, stats: loop.LoopStats) -> dict:
        out = {
            "train_s": time.time() - clock["ready"] - stats.eval_time,
            "bytes_sent": bytes_per_step * stats.local_steps,
        }
        if feedback is not None:
            out["error_norm"] = feedback.error_norm()
        return out

    evaluate = (lambda: loop.accuracy(model, data.x_test, data.y_test)) if rank == 0 else None
    float(step(*next(batches)))  # warm-up: tracing and the first collectives, not timed or counted
    barrier()  # every rank got the warm-up's bytes: none of them still queued to be sent
    sent = link_sent()  # from here to the last step's end: the timed steps' bytes only
    stats = loop.run_steps(
        one,
        batches,
        settings.steps,
        clock=clock,
        global_step=lambda: state["steps"],
        evaluate=evaluate,
        eval_every=settings.eval_every,
        extra=fields,
    )
    barrier()
    sent = link_sent() - sent
    head = {"method": settings.method, "rank": rank, "size": size, "loss": state["loss"]}
    if rank == 0:
        head["accuracy"] = loop.accuracy(model, data.x_test, data.y_test)
    if settings.save_weights:
        allreduce.save_weights(model, f"{settings.save_weights}.rank{rank}.npz")
    clock.mark("end")
    tail = {
        "batch_size": settings.batch_size,
        "steps": settings.steps,
        "warmup_steps": 1,
        "bytes_per_step": bytes_per_step,
        "link_sent": sent,
        **(extra or {}),
    }
    if feedback is not None:
        tail["error_norm"] = feedback.error_norm()
    return loop.report_result(head, stats, clock, tail)


def link_sent() -> int:
    """Bytes this process's network namespace has sent on its interfaces but loopback, so far
    (``/proc/net/dev``, read by psutil). On an emulated host that is its one link; on the
    machine's own namespace it counts everything else that runs there too."""
    import psutil

    return sum(c.bytes_sent for name, c in psutil.net_io_counters(pernic=True).items() if name != "lo")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse, ``hvd.init()``, build the model and the exchange, train, report."""
    settings = parse_args(argv)
    compressed = settings.method in compression.STUDENT_FUNCTIONS
    student = load_compressors(settings.student, settings.method) if compressed else None
    from lab_utils.models import import_tensorflow

    tf = import_tensorflow()
    import horovod.tensorflow as hvd

    hvd.init()
    tf.random.set_seed(settings.seed)
    model = build_model(settings)  # the same seed on every rank: the same start
    variables = model.trainable_variables
    exchange, feedback = make_exchange(settings.method, variables, ratio=settings.ratio, student=student)
    sizes = [int(np.prod(v.shape)) for v in variables]
    k = sum(compression.topk_count(n, settings.ratio) for n in sizes) if settings.method == "topk" else None
    per_step = compression.wire_bytes(settings.method, sizes, k, ranks=hvd.size())
    rate = settings.learning_rate * hvd.size()  # for one rank's batch, times the ranks averaged
    opt = tf.keras.optimizers.SGD(rate)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = allreduce.loss_fn(model(x, training=True), y)
        grads = exchange(tape.gradient(loss, variables))
        opt.apply_gradients(zip(grads, variables, strict=True))
        return loss

    info = {
        "n_params": sum(sizes),
        "message_bytes": compression.message_bytes(settings.method, sizes, k),
        "k": k,
        "hidden": settings.hidden,
        "ratio": settings.ratio if settings.method == "topk" else None,
    }
    result = train(
        settings,
        step,
        rank=hvd.rank(),
        size=hvd.size(),
        model=model,
        bytes_per_step=per_step,
        feedback=feedback,
        extra=info,
        barrier=lambda: hvd.allreduce(tf.zeros([1])),
    )
    print(
        f"rank {hvd.rank()}: {settings.method}, {result['train_time'] / settings.steps * 1e3:.1f} ms/step, "
        f"{per_step:,} bytes sent per step",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
