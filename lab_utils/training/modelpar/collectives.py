"""The ring's two halves by hand (Lab 7, Part A): the task side, run under ``mpirun``.

Students write, in ``collectives.py`` (a ``%%writefile`` cell of the notebook),

- ``reduce_scatter(comm, x)``: every rank gives a vector ``x`` of the same length; rank
  r returns the sum over ranks of its shard, ``x[start:stop]`` with
  ``shard_bounds(len(x), size)[r]`` (MPI's ``Reduce_scatter`` with those counts);
- ``all_gather(comm, shard)``: every rank gives its shard (those lengths); each returns
  the shards concatenated in rank order (MPI's ``Allgatherv``).

This module loads that file on every rank and runs each function on deterministic
inputs of the given sizes and dtypes, comparing every rank's result with MPI's own
collective (exact for integers; floats within a relative tolerance, the ring adds in
another order), and ``all_gather(comm, reduce_scatter(comm, x))`` with ``Allreduce``.
It counts the bytes each rank sent (:class:`~lab_utils.training.allreduce.ring_check.CountingComm`)::

    mpirun -np 3 python -m lab_utils.training.modelpar.collectives --file collectives.py --sizes 0 1 10 1000

Rank 0 reports one ``result`` event (``cases``); a case that fails is reported, not
raised, so one run checks every case. The kernel side is
:func:`lab_utils.training.modelpar.runs.check_collectives`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np

from lab_utils import checks, report
from lab_utils.training.allreduce.ring_check import DTYPES, case_input, run_case
from lab_utils.training.modelpar.shards import shard_bounds, shard_counts
from lab_utils.training.student import check_untouched, student_function

__all__ = ["OPERATIONS", "load_collectives", "main"]

#: What one run checks, in this order (the composition last: it needs both halves).
OPERATIONS = ("reduce_scatter", "all_gather", "all_reduce")
#: The MPI collective each is checked against.
MPI_NAMES = {
    "reduce_scatter": "MPI's Reduce_scatter",
    "all_gather": "MPI's Allgatherv",
    "all_reduce": "MPI's Allreduce",
}


def load_collectives(path: str | Path) -> dict[str, Callable]:
    """The student's two functions, and their composition as ``all_reduce``."""
    rs = student_function(path, "reduce_scatter", "reduce_scatter(comm, x)")
    ag = student_function(path, "all_gather", "all_gather(comm, shard)")
    return {"reduce_scatter": rs, "all_gather": ag, "all_reduce": lambda comm, x: ag(comm, rs(comm, x))}


def _mpi_type(dtype: str):
    from mpi4py import MPI

    return {"int32": MPI.INT32_T, "int64": MPI.INT64_T, "float32": MPI.FLOAT, "float64": MPI.DOUBLE}[dtype]


def _reference(op: str, comm, x: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """(the input the student's function gets, MPI's answer) of ``op`` on this rank."""
    from mpi4py import MPI

    rank, size = comm.Get_rank(), comm.Get_size()
    counts = shard_counts(len(x), size)
    displs = [lo for lo, _ in shard_bounds(len(x), size)]
    if op == "reduce_scatter":
        out = np.empty(counts[rank], dtype=x.dtype)
        comm.Reduce_scatter([x, _mpi_type(dtype)], [out, _mpi_type(dtype)], recvcounts=counts, op=MPI.SUM)
        return x, out
    if op == "all_gather":
        lo, hi = shard_bounds(len(x), size)[rank]
        mine = x[lo:hi].copy()
        out = np.empty_like(x)
        comm.Allgatherv([mine, _mpi_type(dtype)], [out, counts, displs, _mpi_type(dtype)])
        return mine, out
    out = np.empty_like(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    return x, out


def _check_case(fn: Callable, op: str, comm, n: int, dtype: str, seed: int) -> dict:
    """One case of ``op`` against MPI's own collective (:func:`~lab_utils.training.allreduce.ring_check.run_case`)."""
    given, expected = _reference(op, comm, case_input(n, dtype, comm.Get_rank(), seed), dtype)
    return run_case(fn, comm, given, expected, mpi=MPI_NAMES[op], operation=op, n=n, dtype=dtype)


def _check(args, comm) -> list[dict]:
    from mpi4py import MPI

    fns = load_collectives(args.file)
    cases = []
    for op in args.operations:
        for dtype in args.dtypes:
            for n in args.sizes:
                case = _check_case(fns[op], op, comm, n, dtype, args.seed)
                cases.append(case)
                # after an exception the ranks' messages may be out of step: stop checking
                if comm.allreduce(case["raised"], op=MPI.LOR):
                    return cases
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--file", required=True, help="the student's collectives.py")
    p.add_argument("--sizes", type=checks.at_least(0), nargs="+", required=True)
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["int64", "float32"])
    p.add_argument("--operations", nargs="+", choices=OPERATIONS, default=list(OPERATIONS))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    report.ready()
    cases = _check(args, comm)
    check_untouched("your collectives against MPI's, and the bytes each rank sends")
    if comm.Get_rank() == 0:
        report.result(cases=cases, np=comm.Get_size())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
