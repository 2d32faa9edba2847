"""Pipeline parallelism, GPipe's schedule (Lab 7, Part D): the task side, run under ``mpirun``.

An MLP's dense layers are cut into p contiguous stages, one per rank. Each training step
cuts the global batch into m micro-batches, and the student's schedule, in
``pipeline.py`` (a ``%%writefile`` cell), moves them through the stages::

    def gpipe_step(stage, micro_x, micro_y):
        '''All forwards, then all backwards (GPipe), on this stage.'''

``stage`` (:class:`Stage`) is this rank's part of the model and its links:
``stage.first`` / ``stage.last``, ``forward(i, x)`` (keeps what its backward needs),
``backward(i, grad)`` (adds to the stage's weight gradients, returns the input's
gradient), ``loss_grad(i, y)`` (last stage: micro-batch i's loss and its output's
gradient), ``send_forward(i, a)`` / ``recv_forward(i)`` to and from the next and the
previous stage, ``send_backward(i, g)`` / ``recv_backward(i)`` the other way. The task
then applies SGD to each stage's weights with the gradient of the whole batch's loss.

The stages compute in NumPy (float32; the one-process reference the same way), so a rank
is small and p of them fit where a student works.

``--compute-s``: a stage's forward of the whole batch also takes this many seconds more,
and so does its backward; a micro-batch, its share of that (a sleep: a model this small
computes in microseconds, so a stage's time is emulated, and p stages fit on a laptop's
cores). Each forward and backward is a ``compute`` span of the step event, each receive a
``wait`` span: the bubble is the share of waiting, read from the run's timeline.

``--reference``: one process, the whole model, the whole batch at once: the weights a
pipeline must end with. Every rank saves its stage's weights (``--save-weights DIR``)::

    mpirun -np 2 python -m lab_utils.training.modelpar.pipeline --file pipeline.py --micro-batches 4
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from lab_utils import report
from lab_utils.data import pixels
from lab_utils.training.student import check_untouched, student_function

__all__ = ["Stage", "layer_sizes", "stage_layers", "make_parser", "main"]


def layer_sizes(hidden: int, layers: int) -> list[tuple[int, int]]:
    """(inputs, outputs) of each dense layer: ``layers`` hidden ones of ``hidden`` units, then 10."""
    widths = [784] + [hidden] * layers + [10]
    return list(zip(widths[:-1], widths[1:], strict=True))


def stage_layers(n_layers: int, stages: int) -> list[range]:
    """The layers of each stage: contiguous, the first ``n_layers % stages`` stages one more."""
    if not 1 <= stages <= n_layers:
        raise ValueError(f"{n_layers} layers cannot be cut into {stages} stages (1 to {n_layers})")
    base, extra = divmod(n_layers, stages)
    out, at = [], 0
    for s in range(stages):
        n = base + (s < extra)
        out.append(range(at, at + n))
        at += n
    return out


def _weights(hidden: int, layers: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    draw = np.random.default_rng(seed)
    return [
        ((draw.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32), np.zeros(o, np.float32))
        for i, o in layer_sizes(hidden, layers)
    ]


def _polled(request, test=None):
    """What ``request`` received, its completion polled with short sleeps: a stage that waits
    leaves the CPU to the others. (MPI's blocking receive spins: with more stages than cores, the
    waiting ones took the working one's turns, and a 4-stage pipeline of 8 micro-batches on one
    core measured a bubble a third larger than its schedule has.)"""
    test = test or request.test
    pause = 1e-4
    while True:
        done, value = test()
        if done:
            return value
        time.sleep(pause)  # polling a receive under MPI, not waiting for readiness
        pause = min(2 * pause, 1e-3)


class Stage:
    """One rank's layers and its links to the stages before and after it."""

    def __init__(self, comm, weights, *, last: bool, micro_batches: int, compute_s: float):
        """``compute_s``: this stage's emulated seconds per micro-batch and direction."""
        self.comm, self.rank, self.stages = comm, comm.Get_rank(), comm.Get_size()
        self.first, self.last = self.rank == 0, last
        self.params = [np.array(a, np.float32) for pair in weights for a in pair]  # kernel, bias, kernel, ...
        self.grads = [np.zeros_like(a) for a in self.params]
        self.micro_batches, self.compute_s = micro_batches, compute_s
        self._kept: dict[int, list[np.ndarray]] = {}  # micro-batch -> each layer's input, and the output
        self.loss = 0.0

    def _emulate(self) -> None:
        if self.compute_s > 0:
            time.sleep(self.compute_s)  # the emulated rest of the stage's compute (see the module's doc)

    def forward(self, i: int, x) -> np.ndarray:
        """This stage's layers on micro-batch ``i``'s input ``x``; what the backward needs is kept."""
        if i in self._kept:
            raise RuntimeError(f"stage {self.rank}: forward({i}) twice before its backward")
        with report.span(f"forward {i}", "compute"):
            a = np.asarray(x, np.float32)
            kept = [a]
            for k in range(0, len(self.params), 2):
                a = a @ self.params[k] + self.params[k + 1]
                if not (self.last and k == len(self.params) - 2):
                    a = np.maximum(a, 0)  # relu, but on the model's output (the logits)
                kept.append(a)
            self._kept[i] = kept
            self._emulate()
        return a

    def loss_grad(self, i: int, y) -> tuple[float, np.ndarray]:
        """Last stage: micro-batch ``i``'s mean softmax cross-entropy, and the gradient of its share
        of the step's loss (the mean over the micro-batches) with respect to the logits."""
        if not self.last:
            raise RuntimeError(f"stage {self.rank} is not the last: only the last stage has a loss")
        if i not in self._kept:
            raise RuntimeError(f"stage {self.rank}: loss_grad({i}) before forward({i})")
        logits = self._kept[i][-1].astype(np.float64)
        y = np.asarray(y)
        z = logits - logits.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        loss = float(-logp[np.arange(len(y)), y].mean())
        grad = np.exp(logp)
        grad[np.arange(len(y)), y] -= 1
        self.loss += loss / self.micro_batches
        return loss, (grad / (len(y) * self.micro_batches)).astype(np.float32)

    def backward(self, i: int, grad) -> np.ndarray:
        """Micro-batch ``i``'s backward through this stage: adds to the weight gradients, returns the
        gradient with respect to the stage's input."""
        if i not in self._kept:
            raise RuntimeError(f"stage {self.rank}: backward({i}) before forward({i}), or twice")
        kept = self._kept.pop(i)
        with report.span(f"backward {i}", "compute"):
            g = np.asarray(grad, np.float32)
            for k in reversed(range(0, len(self.params), 2)):
                out = kept[k // 2 + 1]
                if not (self.last and k == len(self.params) - 2):
                    g = g * (out > 0)  # through the relu
                self.grads[k] += kept[k // 2].T @ g
                self.grads[k + 1] += g.sum(axis=0)
                g = g @ self.params[k].T
            self._emulate()
        return g

    def _send(self, what: str, i: int, a, to: int) -> None:
        with report.span(f"send {what} {i}", "comm"):
            a = np.ascontiguousarray(a, np.float32)
            self.comm.send(a.shape, dest=to, tag=2 * i + (what == "grad"))
            self.comm.Send(a, dest=to, tag=2 * i + (what == "grad"))

    def _recv(self, what: str, i: int, frm: int) -> np.ndarray:
        tag = 2 * i + (what == "grad")
        with report.span(f"wait for {what} {i}", "wait", on=f"rank:{frm}"):
            shape = _polled(self.comm.irecv(source=frm, tag=tag))
            a = np.empty(shape, np.float32)
            request = self.comm.Irecv(a, source=frm, tag=tag)
            _polled(request, lambda: (request.Test(), None))
        return a

    def send_forward(self, i: int, a) -> None:
        self._send("activations", i, a, self.rank + 1)

    def recv_forward(self, i: int) -> np.ndarray:
        return self._recv("activations", i, self.rank - 1)

    def send_backward(self, i: int, g) -> None:
        self._send("grad", i, g, self.rank - 1)

    def recv_backward(self, i: int) -> np.ndarray:
        return self._recv("grad", i, self.rank + 1)

    def apply_sgd(self, lr: float) -> None:
        if self._kept:
            raise RuntimeError(f"stage {self.rank}: micro-batches {sorted(self._kept)} went forward, never backward")
        for w, g in zip(self.params, self.grads, strict=True):
            w -= np.float32(lr) * g
            g[:] = 0

    def weights(self) -> list[np.ndarray]:
        return [w.copy() for w in self.params]


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", default=None, help="the student's pipeline.py (not with --reference)")
    p.add_argument("--reference", action="store_true", help="one process, the whole model and batch")
    p.add_argument("--micro-batches", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=64, help="examples per step, cut into the micro-batches")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=3, help="hidden layers (the model has one more)")
    p.add_argument("--compute-s", type=float, default=0.0, help="emulated seconds of a stage's pass of the batch")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-weights", default=None, help="a folder: stage<r>.npz")
    return p


def _batches(args, data):
    draw = np.random.default_rng(args.seed)
    size = args.batch_size
    for _ in range(args.steps):
        idx = draw.choice(len(data.y_train), size=size, replace=False)
        yield pixels(data.x_train[idx]), data.y_train[idx].astype(np.int32)


def _run(args, comm, schedule) -> dict:
    from lab_utils import data as lab_data

    data = lab_data.load_mnist(verbose=False, raw=True)
    weights = _weights(args.hidden, args.layers, args.seed)
    stages = 1 if args.reference else comm.Get_size()
    mine = stage_layers(len(weights), stages)[0 if args.reference else comm.Get_rank()]
    m = 1 if args.reference else args.micro_batches
    stage = Stage(comm, [weights[k] for k in mine], last=args.reference or comm.Get_rank() == stages - 1,
                  micro_batches=m, compute_s=args.compute_s / m)  # fmt: skip
    report.ready()
    for t, (x, y) in enumerate(_batches(args, data), start=1):
        started, stage.loss = time.time(), 0.0
        report.straggle()  # LABS_STRAGGLER: this stage made slow, every step
        schedule(stage, np.split(x, m), np.split(y, m))
        stage.apply_sgd(args.lr)
        report.step(t, t * len(y), started=started, loss=stage.loss)
    return {"stage": stage, "layers": list(mine)}


def _reference_schedule(stage, micro_x, micro_y) -> None:
    stage.forward(0, micro_x[0])
    stage.backward(0, stage.loss_grad(0, micro_y[0])[1])


def main(argv=None) -> int:
    p = make_parser()
    args = p.parse_args(argv)
    if min(args.micro_batches, args.batch_size, args.steps, args.hidden, args.layers) < 1 or args.compute_s < 0:
        p.error("--micro-batches, --batch-size, --steps, --hidden and --layers must be >= 1, --compute-s >= 0")
    if args.batch_size % args.micro_batches:
        p.error(f"--micro-batches {args.micro_batches} must divide --batch-size {args.batch_size}")
    if args.reference == bool(args.file):
        p.error("give either --file pipeline.py or --reference")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if args.reference and comm.Get_size() != 1:
        p.error("--reference runs as one process")
    schedule = (
        _reference_schedule
        if args.reference
        else student_function(args.file, "gpipe_step", "gpipe_step(stage, micro_x, micro_y)")
    )
    out = _run(args, comm, schedule)
    check_untouched("each stage's spans (the bubble) and the weights")
    if args.save_weights:
        np.savez(Path(args.save_weights) / f"stage{comm.Get_rank()}.npz", *out["stage"].weights())
    report.result(stage=comm.Get_rank(), stages=comm.Get_size(), layers=out["layers"], loss=out["stage"].loss,
                  micro_batches=1 if args.reference else args.micro_batches)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
