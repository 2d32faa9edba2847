"""One rank of "the network matters" (:mod:`lab_utils.training.netexp`): a training step's
communication, parameter server against ring all-reduce, with the same gradients.

    mpirun -np 5 python -m lab_utils.training.netexp.task --mode ps --mb 4 --steps 5

Every worker computes for ``--compute-s`` seconds, then exchanges ``--mb`` MB of
gradients. The computation stands in for an accelerator's forward and backward pass:
a fixed time that does not use this machine's cores, so that four workers on two
cores are not slowed by each other's arithmetic, only by the network (as in the
thesis, where each worker had its own GPU).

- ``ps``: rank 0 is the parameter server, ranks 1..N are workers (synchronous, like
  Lab 3): each worker sends its gradients to the PS, the PS sums them and sends the
  new parameters back to every worker. The PS's link carries N times the gradients
  each way;
- ``allreduce``: every rank is a worker; one ``MPI_Allreduce`` (Open MPI's ring, set
  by the launcher) leaves the sum on every rank: 2(N-1)/N times the gradients per
  rank each way, whatever N.

Each worker reports its steps (``lab_utils.report``) with their parts for the run's
timeline: ``barrier`` (``allreduce``: waiting for the slowest rank), ``forward/backward``
(the modelled computation), then ``push`` and ``pull`` (``ps``; the pull includes waiting
for the other workers' gradients) or ``allreduce``. Its result is the median step time
(``seconds``: from the end of the barrier) after ``--warmup`` untimed steps.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Sequence

import numpy as np

from lab_utils import report
from lab_utils.training import loop


def _parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("ps", "allreduce"), required=True)
    p.add_argument("--mb", type=float, default=4.0, help="gradient size in MB (float32)")
    p.add_argument("--steps", type=int, default=5, help="timed steps")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--compute-s", type=float, default=1.0, help="seconds of (accelerator) computation per step")
    p.add_argument("--batch-size", type=int, default=64, help="examples per worker and step (for throughput)")
    return p


def parse_args(argv: Sequence[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    """The task's settings; argparse ends the process on bad ones (see :func:`check_args`)."""
    p = _parser(prog)
    a = p.parse_args(argv)
    if not a.mb > 0 or a.steps < 1 or a.warmup < 0 or not a.compute_s >= 0:
        p.error("need --mb > 0, --steps >= 1, --warmup >= 0, --compute-s >= 0")
    return a


def check_args(argv: Sequence[str]) -> argparse.Namespace:
    """:func:`parse_args` for the notebook side: bad arguments raise ``ValueError`` with
    argparse's message instead of ending the process (checked before any launch)."""
    return loop.parse_or_raise(lambda: parse_args(list(argv), prog="the netexp task"), list(argv))


def _untimed(name: str, cat: str, **_on) -> contextlib.nullcontext:
    """:func:`lab_utils.report.span`'s stand-in in an unreported (warm-up) step."""
    return contextlib.nullcontext()


def main(argv: Sequence[str] | None = None) -> None:
    from mpi4py import MPI  # the rank's side only: the notebook imports this module to check arguments

    a = parse_args(argv)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if a.mode == "ps" and size < 2:
        _parser().error("ps mode needs a PS and at least one worker: np >= 2")
    n = max(1, int(a.mb * 1e6) // 4)
    params = np.zeros(n, np.float32)
    grads = np.full(n, 1e-3, np.float32)
    workers = size - 1 if a.mode == "ps" else size

    if a.mode == "ps" and rank == 0:  # the parameter server
        bufs = [np.empty(n, np.float32) for _ in range(workers)]
        for _ in range(a.warmup + a.steps):
            MPI.Request.Waitall([comm.Irecv(bufs[w], source=w + 1, tag=1) for w in range(workers)])
            for b in bufs:
                params.__isub__(b)
            MPI.Request.Waitall([comm.Isend(params, dest=w + 1, tag=2) for w in range(workers)])
        report.result(role="ps", rank=rank, workers=workers, mode=a.mode)
        return

    times = []
    for step in range(a.warmup + a.steps):
        timed = step >= a.warmup
        span = report.span if timed else _untimed  # a warm-up step is not reported: nor are its parts
        t0 = time.time()  # the step's bar on the timeline starts with the barrier
        if timed:
            report.straggle()  # LABS_STRAGGLER: this rank made slow, every timed step
        if a.mode == "allreduce":
            with span("barrier", "wait"):
                comm.Barrier()  # start together (the PS lines its workers up by itself)
        started = time.perf_counter()
        # The step's forward and backward pass on this worker's accelerator: the same fixed
        # time in both modes (a modelled duration, not a wait for anything).
        with span("forward/backward", "compute"):
            time.sleep(a.compute_s)
        if a.mode == "ps":
            with span("push", "comm"):
                comm.Send(grads, dest=0, tag=1)
            # waits for the PS to have every worker's gradients: the other workers' (their pull begins
            # once their push is out), on the timeline the pull's wait
            with span("pull", "comm", on=report.peers(range(1, size)) or None):
                comm.Recv(params, source=0, tag=2)
        elif size > 1:
            with span("allreduce", "comm"):
                comm.Allreduce(MPI.IN_PLACE, grads, op=MPI.SUM)
            grads.fill(1e-3)
        if timed:
            times.append(time.perf_counter() - started)
            report.step(step - a.warmup, (step - a.warmup + 1) * a.batch_size, started=t0, seconds=times[-1])
    report.result(
        role="worker",
        rank=rank,
        workers=workers,
        mode=a.mode,
        step_s=statistics.median(times),
        examples_per_s=a.batch_size / statistics.median(times),
        gradient_bytes=n * 4,
    )


if __name__ == "__main__":
    main()
