"""Lab 6's task side: one Horovod rank training with compressed gradients.

``horovodrun`` starts this module on every rank (:func:`lab_utils.training.compression_runs.run`
does it for the notebook)::

    horovodrun -np 2 python -m lab_utils.training.compression_task --method topk --ratio 0.01 --student compressors.py
    horovodrun -np 2 python -m lab_utils.training.compression_task --method onebit --student compressors.py

The model is an MLP on MNIST, 784 -> ``--hidden`` (ReLU) -> 10: with 1024 hidden units,
814,090 parameters, 3.3 MB of float32 gradients per step, enough for a 100 Mbit/s link
to take longer than the arithmetic. Every rank builds it from the same seed, so the
ranks start equal without a broadcast (which would add 3.3 MB to the bytes counted).
Each rank trains on its shard of MNIST in Lab 4's order (:func:`allreduce.rank_batches`),
learning rate ``--learning-rate x ranks``, plain SGD; the gradients go through
:func:`lab_utils.training.compression.make_exchange` with ``--method``:
``none``, ``fp16``, ``topk`` (the function ``topk`` of the ``--student`` file,
``compressors.py``, keeping ``--ratio`` of each tensor) or ``onebit`` (its functions
``onebit`` and ``onebit_decompress``).

Each step reports (``lab_utils.report``) ``loss``, ``train_s`` (seconds of training
so far, warm-up and evaluations excluded), ``bytes_sent`` (what this rank has sent
so far, by :func:`compression.wire_bytes`), ``error_norm`` (the residuals' norm, for
``onebit``/``topk``) and, on rank 0 every ``--eval-every`` steps, ``accuracy``. The
result adds ``bytes_per_step``, ``message_bytes``, ``n_params`` and ``k`` (topk).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from lab_utils.training import allreduce, compression, loop

__all__ = ["Settings", "make_parser", "parse_args", "check_args", "build_model", "load_compressors", "train", "main"]

PROG = "python -m lab_utils.training.compression_task"


@dataclass(frozen=True)
class Settings:
    """Validated settings of one run (the same on every rank)."""

    method: str = "none"
    steps: int = 200
    batch_size: int = 60  # per rank
    learning_rate: float = 0.1  # for one rank's batch; scaled by the number of ranks
    seed: int = 0
    eval_every: int = 20  # steps between test evaluations on rank 0 (0: only at the end)
    hidden: int = 1024
    ratio: float = 0.01  # topk: the fraction of each tensor sent
    student: str | None = None  # onebit, topk: compressors.py, with onebit(), onebit_decompress() and topk()
    save_weights: str | None = None  # every rank writes its final weights to <path>.rank<r>.npz


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("--method", choices=compression.METHODS, default="none", help="how gradients are sent")
    p.add_argument("--steps", type=int, default=200, help="training steps after one untimed warm-up step")
    p.add_argument("--batch-size", type=int, default=60, help="examples per rank and step")
    p.add_argument("--learning-rate", type=float, default=0.1, help="for one rank's batch (x ranks)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=20, help="steps between test evaluations (0: at the end)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden units of the MLP (1024: 3.3 MB of gradients)")
    p.add_argument("--ratio", type=float, default=0.01, help="topk: the fraction of each tensor sent")
    p.add_argument(
        "--student", default=None, help="onebit, topk: compressors.py, defining onebit(), onebit_decompress(), topk()"
    )
    p.add_argument("--save-weights", default=None, help="each rank writes <path>.rank<r>.npz at the end")
    return p


def parse_args(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the command line; bad values exit 2 with a message, before TensorFlow loads."""
    p = make_parser()
    a = p.parse_args(argv)
    for name, low in (("steps", 1), ("batch_size", 1), ("eval_every", 0), ("seed", 0), ("hidden", 1)):
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(a, name)}")
    if not a.learning_rate > 0:
        p.error(f"--learning-rate must be > 0, got {a.learning_rate}")
    if not 0 < a.ratio <= 1:
        p.error(f"--ratio must be in (0, 1], got {a.ratio}")
    if a.method in compression.STUDENT_FUNCTIONS and not a.student:
        p.error(
            f"--method {a.method} needs --student FILE (compressors.py): your {compression.student_needs(a.method)}"
        )
    if a.student and not Path(a.student).is_file():
        p.error(f"--student {a.student}: no such file (write it with the notebook's %%writefile cell)")
    return Settings(**vars(a))


def check_args(argv: Sequence[str]) -> Settings:
    """:func:`parse_args` for the notebook side: ``ValueError`` with argparse's message."""
    return loop.parse_or_raise(lambda: parse_args(list(argv)), list(argv))


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


def load_compressors(path: str | os.PathLike, method: str) -> ModuleType:
    """The student's ``compressors.py`` at ``path``, imported, once it is known to define
    the functions ``method`` calls (:data:`compression.STUDENT_FUNCTIONS`): for
    :func:`compression.make_exchange`'s ``student=``. ``ValueError`` naming the missing ones."""
    from lab_utils.training.towers import load_student

    compression.student_needs(method)  # a method that calls none: ValueError before the file runs
    module = load_student(path)
    compression.student_functions(module, method, str(path))
    return module


def _accuracy(model, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model(x, training=False).numpy(), axis=1) == y))


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
) -> dict:
    """Run one untimed warm-up step and ``settings.steps`` steps of ``step`` on this
    rank's batches, reporting each (see the module's docstring); rank 0 evaluates on
    the test set every ``eval_every`` steps (timed apart). Reports and returns the result."""
    from lab_utils.data import load_mnist

    clock = loop.Clock()
    data = load_mnist(verbose=False, raw=True) if data is None else data  # bytes: float per batch
    batches = allreduce.rank_batches(data, rank, size, settings.batch_size, settings.seed)
    clock.mark("graph")
    clock.mark("session")
    state = {"steps": 0, "loss": float("nan")}

    def one(xb, yb, _stats):
        state["loss"] = float(step(xb, yb))
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

    evaluate = (lambda: _accuracy(model, data.x_test, data.y_test)) if rank == 0 else None
    one(*next(batches), None)  # warm-up: tracing and the first collectives, not timed or counted
    state["steps"] = 0
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
    head = {"method": settings.method, "rank": rank, "size": size, "loss": state["loss"]}
    if rank == 0:
        head["accuracy"] = _accuracy(model, data.x_test, data.y_test)
    if settings.save_weights:
        allreduce.save_weights(model, f"{settings.save_weights}.rank{rank}.npz")
    clock.mark("end")
    tail = {
        "batch_size": settings.batch_size,
        "steps": settings.steps,
        "warmup_steps": 1,
        "bytes_per_step": bytes_per_step,
        **(extra or {}),
    }
    if feedback is not None:
        tail["error_norm"] = feedback.error_norm()
    return loop.report_result(head, stats, clock, tail)


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
    exchange, feedback = compression.make_exchange(settings.method, variables, ratio=settings.ratio, student=student)
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
    )
    print(
        f"rank {hvd.rank()}: {settings.method}, {result['train_time'] / settings.steps * 1e3:.1f} ms/step, "
        f"{per_step:,} bytes sent per step",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
