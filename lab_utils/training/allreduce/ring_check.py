"""Ring all-reduce by hand (Lab 4, Part A): the task side, run under ``mpirun``.

Students write ``ring_allreduce(comm, x)`` in ``ring.py`` (a ``%%writefile`` cell of
the notebook). This module loads that file on every rank and

* ``check``: runs it on deterministic buffers of the given sizes and dtypes and
  compares each result with MPI's own ``Allreduce`` (exact for integers; for
  floats within a relative tolerance, since the ring adds the ranks' values in
  another order), counting the bytes each rank sent (:class:`CountingComm`);
* ``busbw``: times it, MPI's ``Allreduce`` and a ``memcpy`` of the same buffer for
  each message size (the notebook turns the times into bus bandwidth).

::

    mpirun -np 3 python -m lab_utils.training.allreduce.ring_check check --ring ring.py --sizes 0 1 10 --dtypes int64 float32
    mpirun -np 2 python -m lab_utils.training.allreduce.ring_check busbw --ring ring.py --sizes 1024 67108864

Rank 0 reports one ``result`` event (``cases`` or ``rows``); a case that fails is
reported, not raised, so one run checks every case. The notebook side is
:mod:`lab_utils.training.allreduce.runs`. The theory the counts are compared
with (how many bytes a ring sends) is the students' Exercise 2, not here.
"""

from __future__ import annotations

import argparse
import pickle
import time
from pathlib import Path

import numpy as np

from lab_utils import checks, report
from lab_utils.training.student import student_function

__all__ = [
    "FLOAT_RTOL",
    "DTYPES",
    "case_input",
    "CountingComm",
    "judge",
    "run_case",
    "load_ring",
    "main",
]

#: Relative tolerance of a float ring result against MPI's Allreduce: N values are added in
#: another order, so each sum may differ in its last bits (float32: 2**-23 ~ 1.2e-7 per addition).
FLOAT_RTOL = {"float32": 1e-5, "float64": 1e-12}
DTYPES = ("int32", "int64", "float32", "float64")


def case_input(n: int, dtype: str, rank: int, seed: int = 0) -> np.ndarray:
    """Rank ``rank``'s input of a check case: deterministic, different on every rank;
    integers small enough that no sum overflows, floats of mixed magnitudes (so that
    the order of additions shows in the last bits)."""
    rng = np.random.RandomState(seed * 7919 + rank * 104729 + n)
    if dtype.startswith("int"):
        return rng.randint(-1000, 1000, size=n).astype(dtype)
    return (rng.standard_normal(n) * 10.0 ** rng.randint(-3, 4, size=n)).astype(dtype)


class CountingComm:
    """An mpi4py communicator that counts the bytes this rank sends through it
    (``Sendrecv``, ``Send``, ``Isend``, ``send``); everything else is passed through."""

    def __init__(self, comm):
        self._comm = comm
        self.bytes_sent = 0
        self.messages = 0

    def _count(self, buf) -> None:
        data = buf[0] if isinstance(buf, (list, tuple)) else buf
        self.bytes_sent += int(np.asarray(data).nbytes)
        self.messages += 1

    def Sendrecv(self, sendbuf, *args, **kwargs):  # noqa: N802 (mpi4py's name)
        self._count(sendbuf)
        return self._comm.Sendrecv(sendbuf, *args, **kwargs)

    def Send(self, buf, *args, **kwargs):  # noqa: N802
        self._count(buf)
        return self._comm.Send(buf, *args, **kwargs)

    def Isend(self, buf, *args, **kwargs):  # noqa: N802
        self._count(buf)
        return self._comm.Isend(buf, *args, **kwargs)

    def send(self, obj, *args, **kwargs):
        self._count(np.frombuffer(pickle.dumps(obj), dtype=np.uint8))  # what mpi4py sends for an object
        return self._comm.send(obj, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._comm, name)


def load_ring(path: str | Path):
    """``ring_allreduce`` from the student's file (imported under its own name)."""
    return student_function(path, "ring_allreduce", "ring_allreduce(comm, x)")


# ----------------------------------------------------------------------------- check


def judge(
    got, expected: np.ndarray, dtype: str, x: np.ndarray, before: np.ndarray, mpi: str = "MPI's Allreduce"
) -> tuple[str | None, float | None]:
    """(problem or None, relative error for floats) of one rank's result ``got`` of a collective
    on its input ``x`` (a copy of it as it was: ``before``), against ``expected``, what ``mpi``
    (MPI's own collective) gave: same shape and dtype, the input left as it was, integers exact,
    floats within :data:`FLOAT_RTOL`."""
    got = np.asarray(got)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"returned shape {got.shape} {got.dtype}, expected {expected.shape} {expected.dtype}", None
    if not np.array_equal(x, before):
        return "changed its input buffer (return a new array)", None
    if dtype.startswith("int"):
        wrong = int(np.sum(got != expected))
        return (f"{wrong} of {expected.size} integer sums differ from {mpi}" if wrong else None), None
    scale = float(np.max(np.abs(expected))) if expected.size else 0.0
    err = float(np.max(np.abs(got.astype(np.float64) - expected))) if expected.size else 0.0
    rel = err / scale if scale else err
    return (f"relative error {rel:.2e} > {FLOAT_RTOL[dtype]:g}" if rel > FLOAT_RTOL[dtype] else None), rel


def run_case(fn, comm, given: np.ndarray, expected: np.ndarray, mpi: str = "MPI's Allreduce", **fields) -> dict:
    """The student's collective ``fn(comm, given)`` on every rank, judged against ``expected``
    (:func:`judge`) and its bytes counted; every rank makes the same collective calls whatever
    the student's function did (a rank that raised still gathers). Rank 0 gets the case's row
    (``fields``, then ``np``, ``ok``, ``problem``, ``max_rel_err``, ``bytes_sent``, ``raised``);
    the other ranks ``{"raised": ...}``."""
    before = given.copy()
    counting = CountingComm(comm)
    try:
        problem, rel = judge(fn(counting, given), expected, given.dtype.name, given, before, mpi=mpi)
    except Exception as exc:  # noqa: BLE001 - the student's code: report it per case, then go on
        problem, rel = f"raised {type(exc).__name__}: {exc}", None
    gathered = comm.gather((problem, rel, counting.bytes_sent), root=0)
    if comm.Get_rank() != 0:
        return {"raised": bool(problem and problem.startswith("raised"))}
    problems = {r: p for r, (p, _, _) in enumerate(gathered) if p}
    rels = [e for _, e, _ in gathered if e is not None]
    return {
        **fields,
        "np": comm.Get_size(),
        "ok": not problems,
        "problem": "; ".join(f"rank {r}: {p}" for r, p in problems.items()) or None,
        "max_rel_err": max(rels) if rels else None,
        "bytes_sent": [b for _, _, b in gathered],
        "raised": any(p.startswith("raised") for p in problems.values()),
    }


def _check_case(ring, comm, n: int, dtype: str, seed: int) -> dict:
    """One case of Lab 4's ring against MPI's Allreduce (:func:`run_case`)."""
    from mpi4py import MPI

    x = case_input(n, dtype, comm.Get_rank(), seed)
    expected = np.empty_like(x)
    comm.Allreduce(x, expected, op=MPI.SUM)
    return run_case(ring, comm, x, expected, n=n, dtype=dtype)


def _check(args, comm) -> None:
    from mpi4py import MPI

    ring = load_ring(args.ring)
    cases = []
    for dtype in args.dtypes:
        for n in args.sizes:
            case = _check_case(ring, comm, n, dtype, args.seed)
            cases.append(case)
            # after an exception the ranks' messages may be out of step: stop checking
            if comm.allreduce(case["raised"], op=MPI.LOR):
                break
        else:
            continue
        break
    if comm.Get_rank() == 0:
        report.result(cases=cases, np=comm.Get_size())


# ----------------------------------------------------------------------------- bus bandwidth


def slowest_rank_seconds(fn, comm, repeats: int) -> float:
    """Median over ``repeats`` of the slowest rank's time of ``fn()`` (one warm-up first)."""
    from mpi4py import MPI

    fn()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return float(np.median(times))


def _busbw(args, comm) -> None:
    from mpi4py import MPI

    ring = load_ring(args.ring) if args.ring else None
    size = comm.Get_size()
    rows = []
    for nbytes in args.sizes:
        n = max(1, nbytes // 4)
        x = np.ones(n, dtype=np.float32)
        out = np.empty_like(x)
        repeats = args.repeats if nbytes >= 1 << 20 else max(args.repeats, 20)
        row = {"bytes": int(x.nbytes), "np": size}
        row["mpi_s"] = slowest_rank_seconds(lambda: comm.Allreduce(x, out, op=MPI.SUM), comm, repeats)  # noqa: B023
        if ring is not None:
            row["ring_s"] = slowest_rank_seconds(lambda: ring(comm, x), comm, repeats)  # noqa: B023
        row["memcpy_s"] = slowest_rank_seconds(lambda: np.copyto(out, x), comm, repeats)  # noqa: B023
        rows.append(row)
        if comm.Get_rank() == 0:
            report.step(len(rows), 0, bytes=row["bytes"])
    if comm.Get_rank() == 0:
        report.result(rows=rows, np=size)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="compare ring_allreduce with MPI's Allreduce")
    check.add_argument("--ring", required=True)
    check.add_argument("--sizes", type=checks.at_least(0), nargs="+", required=True)
    check.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["int64", "float32"])
    check.add_argument("--seed", type=int, default=0)
    bw = sub.add_parser("busbw", help="bus bandwidth of ring_allreduce, MPI's Allreduce and memcpy")
    bw.add_argument("--ring", default=None)
    bw.add_argument("--sizes", type=checks.at_least(0), nargs="+", required=True, help="message sizes in bytes")
    bw.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    report.ready()
    (_check if args.command == "check" else _busbw)(args, comm)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
