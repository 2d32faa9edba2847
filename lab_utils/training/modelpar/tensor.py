"""Tensor parallelism, the Megatron way (Lab 7, Part C): the task side, run under ``mpirun``.

The block is an MLP's two layers, ``y = relu(x @ a) @ b``, with ``a`` of shape
``(d, f)`` and ``b`` of shape ``(f, d)``. Split over N ranks, rank r holds the columns
``a[:, lo:hi]`` and the rows ``b[lo:hi, :]`` (``(lo, hi) = shard_bounds(f, N)[r]``): the
first layer is *column-parallel* (each rank computes its part of the hidden units, no
communication), the second *row-parallel* (each rank's product is a partial sum of ``y``:
one all-reduce in the forward pass, and, for ``dx``, one in the backward pass).

Students write, in ``tensor.py`` (a ``%%writefile`` cell)::

    def split_block(a, b, rank, size):            # -> (a_r, b_r)
    def tp_forward(comm, ops, x, a_r, b_r):       # -> (y, saved): y on every rank
    def tp_backward(comm, ops, dy, saved, a_r, b_r):   # -> (dx, da_r, db_r)

``ops.all_reduce(comm, array)`` is the student's own from Part A (``all_gather`` of
``reduce_scatter``, any shape), so the bytes each rank sends are counted. This module
compares ``y``, ``dx`` and every rank's ``da_r`` and ``db_r`` with TensorFlow's
gradients of the whole block (``dy`` given), for each batch size, and counts the bytes
(and those of data parallelism on the same block: the same all-reduce of the gradients
of ``a`` and ``b``)::

    mpirun -np 2 python -m lab_utils.training.modelpar.tensor --file tensor.py --collectives collectives.py

Rank 0 reports one ``result`` event (``cases``).
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import numpy as np

from lab_utils import report
from lab_utils.training.allreduce.ring_check import CountingComm
from lab_utils.training.modelpar.collectives import load_collectives
from lab_utils.training.modelpar.shards import shard_bounds
from lab_utils.training.student import check_untouched, load_student

__all__ = ["RTOL", "block_inputs", "reference", "main"]

#: Largest error of a split block's results, relative to the largest value of each: float32
#: sums taken in another order.
RTOL = 1e-5


def block_inputs(d: int, f: int, batch: int, seed: int) -> dict[str, np.ndarray]:
    """The block's weights, an input batch and the gradient of the output (float32)."""
    draw = np.random.default_rng(seed)
    return {
        "a": (draw.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32),
        "b": (draw.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32),
        "x": draw.standard_normal((batch, d)).astype(np.float32),
        "dy": draw.standard_normal((batch, d)).astype(np.float32),
    }


def reference(inp: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """TensorFlow's ``y``, ``dx``, ``da`` and ``db`` of the whole block."""
    import tensorflow as tf

    x, a, b = (tf.Variable(inp[k]) for k in ("x", "a", "b"))
    with tf.GradientTape() as tape:
        y = tf.matmul(tf.nn.relu(tf.matmul(x, a)), b)
    dx, da, db = tape.gradient(y, [x, a, b], output_gradients=tf.constant(inp["dy"]))
    return {"y": y.numpy(), "dx": dx.numpy(), "da": da.numpy(), "db": db.numpy()}


def _ops(path: str) -> SimpleNamespace:
    fns = load_collectives(path)

    def all_reduce(comm, array):
        flat = np.ascontiguousarray(array, dtype=np.float32).ravel()
        return np.asarray(fns["all_reduce"](comm, flat)).reshape(np.shape(array))

    return SimpleNamespace(all_reduce=all_reduce, shard_bounds=shard_bounds)


def _error(got, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape}, expected {want.shape}")
    scale = float(np.max(np.abs(want))) or 1.0
    return float(np.max(np.abs(got - want))) / scale


def _one_case(student, comm, ops, d: int, f: int, batch: int, seed: int) -> dict:
    rank, size = comm.Get_rank(), comm.Get_size()
    inp = block_inputs(d, f, batch, seed)
    want = reference(inp)
    lo, hi = shard_bounds(f, size)[rank]
    counting = CountingComm(comm)
    errors: dict[str, float] = {}
    try:
        a_r, b_r = student.split_block(inp["a"], inp["b"], rank, size)
        errors["a_r"] = _error(a_r, inp["a"][:, lo:hi])
        errors["b_r"] = _error(b_r, inp["b"][lo:hi, :])
        y, saved = student.tp_forward(counting, ops, inp["x"], a_r, b_r)
        forward = counting.bytes_sent
        dx, da_r, db_r = student.tp_backward(counting, ops, inp["dy"], saved, a_r, b_r)
        errors |= {"y": _error(y, want["y"]), "dx": _error(dx, want["dx"])}
        errors |= {"da": _error(da_r, want["da"][:, lo:hi]), "db": _error(db_r, want["db"][lo:hi, :])}
        problem = "; ".join(f"{k} off by {e:.2e} (relative)" for k, e in errors.items() if not e <= RTOL) or None
    except Exception as exc:  # noqa: BLE001 - the student's code: report it per case, then go on
        problem, forward = f"raised {type(exc).__name__}: {exc}", 0
    tp_bytes = counting.bytes_sent
    if problem is None:  # data parallelism on the same block: all-reduce the gradients of a and b
        ops.all_reduce(counting, np.zeros(inp["a"].size + inp["b"].size, np.float32))
    gathered = comm.gather((problem, max(errors.values(), default=None), forward, tp_bytes,
                            counting.bytes_sent - tp_bytes), root=0)  # fmt: skip
    if rank != 0:
        return {"raised": bool(problem and problem.startswith("raised"))}
    problems = {r: p for r, (p, *_) in enumerate(gathered) if p}
    return {
        "d": d, "f": f, "batch": batch, "np": size, "ok": not problems,
        "problem": "; ".join(f"rank {r}: {p}" for r, p in problems.items()) or None,
        "max_rel_err": max((g[1] for g in gathered if g[1] is not None), default=None),
        "forward_bytes": [g[2] for g in gathered],
        "bytes_sent": [g[3] for g in gathered],
        "dp_bytes_sent": [g[4] for g in gathered],
        "raised": any(p.startswith("raised") for p in problems.values()),
    }  # fmt: skip


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True, help="the student's tensor.py")
    p.add_argument("--collectives", required=True, help="the student's collectives.py (Part A)")
    p.add_argument("--d", type=int, default=64, help="the block's width")
    p.add_argument("--f", type=int, default=256, help="its hidden width")
    p.add_argument("--batches", type=int, nargs="+", default=[8, 64, 512])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.d, args.f, *args.batches) < 1:
        p.error("--d, --f and every batch must be >= 1")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    student, ops = load_student(args.file), _ops(args.collectives)
    for name in ("split_block", "tp_forward", "tp_backward"):
        if not callable(getattr(student, name, None)):
            raise ImportError(f"{args.file} defines no function {name}")
    report.ready()
    cases = []
    for batch in args.batches:
        cases.append(_one_case(student, comm, ops, args.d, args.f, batch, args.seed))
        if comm.allreduce(cases[-1]["raised"], op=MPI.LOR):
            break
    check_untouched("the split block against the whole one, and the bytes each rank sends")
    if comm.Get_rank() == 0:
        report.result(cases=cases, np=comm.Get_size())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
