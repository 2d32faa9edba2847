"""The links' alpha and beta as a ring step meets them (Lab 7, Part E): the task side, run under ``mpirun``.

A ring collective is a sequence of steps in which every rank sends a message to its right
neighbour while it receives one from its left (``Sendrecv``): both directions of every link
busy at once. This probe times exactly that step for a few message sizes, on the ranks' own
links (an emulated host each, or loopback), so that Lab 6's alpha-beta model
(``alpha + m * beta`` seconds for m bytes) is fitted to what the collectives of Parts B to D
meet, not to a link's nominal rate::

    mpirun -np 2 python -m lab_utils.training.modelpar.probe --sizes 1024 1048576 --repeats 5

Each size is sent once to warm the connection, then ``repeats`` times between barriers; a
step's time is the slowest rank's. ``--one-way`` times rank 0 sending to rank 1 alone instead
(the other ranks idle): each link then carries data in one direction and only TCP's
acknowledgements in the other, which tells a link's own rate from what a ring step meets.
Rank 0 reports one ``result`` event: ``rows`` (``bytes``, ``seconds``: the median over the
repeats). The kernel side is :func:`lab_utils.training.modelpar.runs.probe_link`.
"""

from __future__ import annotations

import argparse

import numpy as np

from lab_utils import checks, report
from lab_utils.training.allreduce.ring_check import slowest_rank_seconds


def ring_step_seconds(comm, size: int, repeats: int, one_way: bool = False) -> float:
    """The median over ``repeats`` of the slowest rank's time for one ring step of ``size``
    bytes (``one_way``: for rank 0's message to rank 1 alone)."""
    rank, n = comm.Get_rank(), comm.Get_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    send = np.full(size, rank % 251, dtype=np.uint8)
    recv = np.empty(size, dtype=np.uint8)

    def step():
        if not one_way:
            comm.Sendrecv(send, dest=right, recvbuf=recv, source=left)
        elif rank == 0:
            comm.Send(send, dest=1)
        elif rank == 1:
            comm.Recv(recv, source=0)

    seconds = slowest_rank_seconds(step, comm, repeats)  # the connection's first use untimed
    if (rank == 1 if one_way else n > 1) and recv[0] != left % 251:
        raise RuntimeError(f"rank {rank}: the step delivered {recv[0]}, not rank {left}'s bytes")
    return seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=checks.at_least(1), nargs="+", required=True, help="message sizes in bytes")
    p.add_argument("--repeats", type=checks.at_least(1), default=5)
    p.add_argument("--one-way", action="store_true", help="rank 0 sends to rank 1 alone")
    args = p.parse_args(argv)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if args.one_way and comm.Get_size() < 2:
        p.error(f"--one-way needs 2 ranks or more, got {comm.Get_size()}")
    report.ready()
    rows = []
    for size in args.sizes:
        rows.append({"bytes": size, "seconds": ring_step_seconds(comm, size, args.repeats, args.one_way)})
    if comm.Get_rank() == 0:
        report.result(rows=rows, np=comm.Get_size(), one_way=args.one_way)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
