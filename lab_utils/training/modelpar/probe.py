"""The links' alpha and beta as a ring step meets them (Lab 7, Part E): the task side, run under ``mpirun``.

A ring collective is a sequence of steps in which every rank sends a message to its right
neighbour while it receives one from its left (``Sendrecv``): both directions of every link
busy at once. This probe times exactly that step for a few message sizes, on the ranks' own
links (an emulated host each, or loopback), so that Lab 6's alpha-beta model
(``alpha + m * beta`` seconds for m bytes) is fitted to what the collectives of Parts B to D
meet, not to a link's nominal rate::

    mpirun -np 2 python -m lab_utils.training.modelpar.probe --sizes 1024 1048576 --repeats 5

Each size is sent once to warm the connection, then ``repeats`` times between barriers; a
step's time is the slowest rank's. Rank 0 reports one ``result`` event: ``rows`` (``bytes``,
``seconds``: the median over the repeats). The kernel side is
:func:`lab_utils.training.modelpar.choice_runs.probe_link`.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lab_utils import report


def ring_step_seconds(comm, size: int, repeats: int) -> float:
    """The median over ``repeats`` of the slowest rank's time for one ring step of ``size`` bytes."""
    from mpi4py import MPI

    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    send = np.full(size, rank % 251, dtype=np.uint8)
    recv = np.empty(size, dtype=np.uint8)
    comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)  # the connection's first use, untimed
    times = []
    for _ in range(repeats):
        comm.Barrier()
        began = time.perf_counter()
        comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
        times.append(comm.allreduce(time.perf_counter() - began, op=MPI.MAX))
    if n > 1 and recv[0] != left % 251:
        raise RuntimeError(f"rank {rank}: the ring step delivered {recv[0]}, not rank {left}'s bytes")
    return float(np.median(times))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", required=True, help="message sizes in bytes")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if min(args.sizes) < 1 or args.repeats < 1:
        p.error(f"sizes and repeats must be >= 1, got {args.sizes} and {args.repeats}")
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    report.ready()
    rows = []
    for size in args.sizes:
        rows.append({"bytes": size, "seconds": ring_step_seconds(comm, size, args.repeats)})
    if comm.Get_rank() == 0:
        report.result(rows=rows, np=comm.Get_size())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
