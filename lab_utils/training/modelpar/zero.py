"""Sharded optimizer state, the ZeRO idea (Lab 7, Part B): the task side, run under ``mpirun``.

Every rank of N builds the same MLP (the same initial weights), trains it on its own
part of each global batch (Lab 4's data order: :func:`~lab_utils.training.allreduce.task.rank_batches`)
and asks TensorFlow for its gradient, flattened to ONE float32 vector of the P
parameters. What happens next is the stage's:

- ``--stage 0``, plain data parallelism (the reference, this module's own): all-reduce
  the gradient, divide by N, and apply :func:`~lab_utils.training.modelpar.shards.adam_update`
  to the whole vector. Each rank keeps the averaged gradient (4P bytes) and Adam's two
  moments (8P);
- ``--stage 1`` and ``--stage 2``: the student's ``zero_step`` from ``--zero`` (a
  ``%%writefile`` cell)::

      def zero_step(comm, ops, params, grad, state, stage, t):
          '''Update ``params`` (the whole float32 vector, in place) from this rank's
          ``grad``, keeping in ``state`` (a dict, the same one every step) what the
          optimizer keeps: "grad" (the averaged gradient this rank applies), "m", "v".'''

  ``ops`` holds ``reduce_scatter`` and ``all_gather`` (the student's own from Part A
  with ``--collectives``, MPI's otherwise) and ``shard_bounds``. Stage 1 keeps the
  whole averaged gradient and 1/N of Adam's state; stage 2 reduce-scatters the gradient
  and keeps only its shard; both update their shard and all-gather the parameters.

After every step the task reads the bytes of ``state``
(:func:`~lab_utils.training.modelpar.shards.array_bytes`: a view counts as what it views)
and the peak of what a step after the first allocated (``tracemalloc``, which NumPy reports
to: the temporary buffers), and the most anonymous resident memory it held at the end of a
step (what the rank keeps between steps; large arrays are mapped on their own, so that a
freed buffer leaves it), and
the step event carries the loss and two spans (``gradient``: TensorFlow; ``optimizer``:
the stage's step). Rank 0 saves the final parameters (``--save-weights``, one ``params``
array) and reports the result: the parameter count, and of every rank the state bytes, the
bytes sent, the resident memory between steps and at its peak; the loss, the test accuracy::

    mpirun -np 2 python -m lab_utils.training.modelpar.zero --stage 2 --zero zero.py --steps 20
"""

from __future__ import annotations

import argparse
import resource
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from lab_utils import report
from lab_utils.data import pixels
from lab_utils.training.modelpar.shards import adam_update, array_bytes, shard_bounds
from lab_utils.training.student import check_untouched, student_function

__all__ = ["STAGES", "STATE_KEYS", "FlatModel", "plain_step", "make_parser", "main"]

STAGES = (0, 1, 2)
#: What a stage's ``state`` must hold after every step.
STATE_KEYS = ("grad", "m", "v")


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stage", type=int, choices=STAGES, required=True)
    p.add_argument("--zero", default=None, help="the student's zero.py (stages 1 and 2)")
    p.add_argument("--collectives", default=None, help="the student's collectives.py (default: MPI's)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=32, help="examples per rank per step")
    p.add_argument("--hidden", type=int, default=256, help="units of each hidden layer")
    p.add_argument("--layers", type=int, default=2, help="hidden layers")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-weights", default=None)
    return p


def check(args) -> None:
    for name in ("steps", "batch_size", "hidden", "layers"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.stage and not args.zero:
        raise ValueError(f"stage {args.stage} runs the student's zero_step: give --zero zero.py")


class FlatModel:
    """A Keras MLP whose weights are read and written as ONE float32 vector."""

    def __init__(self, hidden: int, layers: int, seed: int):
        import tensorflow as tf

        init = tf.keras.initializers.GlorotUniform(seed=seed)
        stack = [tf.keras.layers.Dense(hidden, activation="relu", kernel_initializer=init) for _ in range(layers)]
        self.model = tf.keras.Sequential([*stack, tf.keras.layers.Dense(10, kernel_initializer=init)])
        self.model.build((None, 784))
        self.shapes = [tuple(v.shape) for v in self.model.trainable_variables]
        self.size = int(sum(int(np.prod(s)) for s in self.shapes))

    def get(self) -> np.ndarray:
        return np.concatenate([v.numpy().ravel() for v in self.model.trainable_variables]).astype(np.float32)

    def set(self, flat: np.ndarray) -> None:
        at = 0
        for v, shape in zip(self.model.trainable_variables, self.shapes, strict=True):
            n = int(np.prod(shape))
            v.assign(flat[at : at + n].reshape(shape))
            at += n

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        logits = self.model.predict(pixels(x), batch_size=500, verbose=0)
        return float(np.mean(np.argmax(logits, axis=1) == y))

    def gradient(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        import tensorflow as tf

        from lab_utils.training.allreduce.task import loss_fn

        with tf.GradientTape() as tape:
            loss = loss_fn(self.model(x, training=True), y)
        grads = tape.gradient(loss, self.model.trainable_variables)
        return np.concatenate([g.numpy().ravel() for g in grads]).astype(np.float32), float(loss)


def plain_step(comm, ops, params, grad, state, stage, t) -> None:
    """Stage 0, plain data parallelism: the whole averaged gradient, the whole Adam state."""
    from mpi4py import MPI

    if not state:
        state.update(grad=np.empty_like(params), m=np.zeros_like(params), v=np.zeros_like(params))
    comm.Allreduce(grad, state["grad"], op=MPI.SUM)
    state["grad"] /= np.float32(comm.Get_size())
    adam_update(params, state["grad"], state["m"], state["v"], t)


def _ops(args) -> SimpleNamespace:
    if args.collectives:
        from lab_utils.training.modelpar.collectives import load_collectives

        fns = load_collectives(args.collectives)
        return SimpleNamespace(
            reduce_scatter=fns["reduce_scatter"], all_gather=fns["all_gather"], shard_bounds=shard_bounds
        )
    return SimpleNamespace(reduce_scatter=_mpi_reduce_scatter, all_gather=_mpi_all_gather, shard_bounds=shard_bounds)


def _mpi_reduce_scatter(comm, x: np.ndarray) -> np.ndarray:
    from mpi4py import MPI

    counts = [hi - lo for lo, hi in shard_bounds(len(x), comm.Get_size())]
    out = np.empty(counts[comm.Get_rank()], dtype=x.dtype)
    comm.Reduce_scatter(x, out, recvcounts=counts, op=MPI.SUM)
    return out


def _mpi_all_gather(comm, shard: np.ndarray) -> np.ndarray:
    from mpi4py.util.dtlib import from_numpy_dtype

    counts = comm.allgather(len(shard))
    gathered = np.empty(sum(counts), shard.dtype)
    comm.Allgatherv(shard, [gathered, counts, np.cumsum([0, *counts[:-1]]).tolist(), from_numpy_dtype(shard.dtype)])
    return gathered


#: glibc's mallopt parameter M_MMAP_THRESHOLD
_M_MMAP_THRESHOLD = -3


def _large_arrays_mapped(threshold: int = 2**20) -> None:
    """Every allocation of ``threshold`` bytes or more in a mapping of its own, returned to the
    system when freed (glibc otherwise raises its threshold after the first large free, and keeps
    freed buffers resident): so that the resident memory counts the arrays the rank holds, not the
    step's temporaries it once held (measured: between steps, 7.0 and 3.4 MB less from plain to
    stage 1 to stage 2 on the 1.9 M-parameter MLP, the 7.1 and 3.6 MB of state sharded; without
    this, runs of one stage differed by 10 MB)."""
    import ctypes
    import ctypes.util

    ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt(_M_MMAP_THRESHOLD, threshold)


def _resident_bytes() -> int:
    """This process's anonymous resident memory now (Linux: RssAnon of /proc/self/status): what
    it allocated, without the files it maps (the data cache, the libraries), whose pages come and
    go with what a step reads."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024  # kB
    return 0


def _checked_state(state: dict, step: int) -> int:
    missing = [k for k in STATE_KEYS if type(state.get(k)) is not np.ndarray]  # a subclass could say any nbytes
    if missing:
        raise ValueError(
            f"after step {step}, state has no array {', '.join(map(repr, missing))}: keep the averaged gradient "
            "you apply in state['grad'] and Adam's moments in state['m'] and state['v'], as plain NumPy arrays"
        )
    return array_bytes(state)


def _train(args, comm, step_fn, ops) -> dict:
    from lab_utils.training.allreduce.ring_check import CountingComm
    from lab_utils.training.allreduce.task import load_data, rank_batches

    rank, size = comm.Get_rank(), comm.Get_size()
    data = load_data(SimpleNamespace(model="mlp"))
    model = FlatModel(args.hidden, args.layers, args.seed)
    params, state = model.get(), {}
    counting = CountingComm(comm)
    batches = rank_batches(data, rank, size, args.batch_size, args.seed)
    state_bytes = transient = resident = 0
    loss = float("nan")
    report.ready()
    for t in range(1, args.steps + 1):
        started = time.time()
        report.straggle()  # LABS_STRAGGLER: this rank made slow, every step
        x, y = next(batches)
        with report.span("gradient", "compute"):
            grad, loss = model.gradient(pixels(x), y)
        tracemalloc.start()
        with report.span("optimizer", "comm", on=report.peers() or None):  # its collectives: every rank's
            step_fn(counting, ops, params, grad, state, args.stage, t)
        if t > 1:  # the first step also makes the state: what stays is counted apart
            transient = max(transient, tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        state_bytes = max(state_bytes, _checked_state(state, t))
        model.set(params)
        if t > 1:  # what the rank holds between steps (the state made), not the start-up's peak
            resident = max(resident, _resident_bytes())
        report.step(t, t * args.batch_size, started=started, loss=loss)
    return {"params": model.size, "state_bytes": state_bytes, "transient_bytes": transient,
            "rss_steps_bytes": resident, "bytes_sent": counting.bytes_sent, "loss": loss, "model": model,
            "data": data}  # fmt: skip


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    try:
        check(args)
    except ValueError as exc:
        make_parser().error(str(exc))
    _large_arrays_mapped()
    signature = "zero_step(comm, ops, params, grad, state, stage, t)"
    step_fn = plain_step if args.stage == 0 else student_function(args.zero, "zero_step", signature)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    out = _train(args, comm, step_fn, _ops(args))
    check_untouched("the state each rank keeps, its memory, the bytes it sends and the weights")
    out["rss_peak_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    keys = ("state_bytes", "transient_bytes", "bytes_sent", "rss_peak_bytes", "rss_steps_bytes")
    every = comm.gather({k: out[k] for k in keys}, root=0)
    if comm.Get_rank() == 0:
        if args.save_weights:
            np.savez(Path(args.save_weights), params=out["model"].get())
        report.result(
            stage=args.stage,
            np=comm.Get_size(),
            params=out["params"],
            state_bytes=[e["state_bytes"] for e in every],
            transient_bytes=[e["transient_bytes"] for e in every],
            bytes_sent=[e["bytes_sent"] for e in every],
            rss_peak_bytes=[e["rss_peak_bytes"] for e in every],
            rss_steps_bytes=[e["rss_steps_bytes"] for e in every],
            loss=out["loss"],
            accuracy=out["model"].accuracy(out["data"].x_test, out["data"].y_test),
            data_source=out["data"].source,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
