"""The command line of a task of Lab 2's cluster started by hand (Part 1): the CS 744 flags.

``--ps_hosts``, ``--worker_hosts``, ``--job_name``, ``--task_index`` (and ``--updates``,
the worker's increments), parsed before TensorFlow is imported: bad input ends the task
with exit 2 and argparse's message. Used by :mod:`lab_utils.training.ps.hand` (which
re-exports it) in the task, and by :mod:`lab_utils.training.ps.hand.runs` (``UPDATES``)
in the notebook.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["UPDATES", "JOBS", "make_parser", "hosts", "parse_flags"]

#: How many times the worker adds 1 to the counter on the PS.
UPDATES = 5
#: The job names TensorFlow's PS training uses (and the flags give).
JOBS = ("ps", "worker")


def make_parser() -> argparse.ArgumentParser:
    """The CS 744 command line (``--ps_hosts``, ``--worker_hosts``, ``--job_name``,
    ``--task_index``) plus ``--updates``, the worker's number of increments."""
    p = argparse.ArgumentParser(description="One task of a cluster started by hand (Lab 2, Part 1).")
    p.add_argument("--ps_hosts", required=True, help="comma-separated host:port of the PS tasks")
    p.add_argument("--worker_hosts", required=True, help="comma-separated host:port of the worker tasks")
    p.add_argument("--job_name", required=True, choices=JOBS, help="this task's job: ps or worker")
    p.add_argument("--task_index", required=True, type=int, help="this task's index in its job")
    p.add_argument(
        "--updates", type=int, default=UPDATES, help=f"worker: increments of the counter (default {UPDATES})"
    )
    return p


def hosts(flag: str) -> list[str]:
    """The addresses one host flag names: ``"a:1,b:2"`` -> ``["a:1", "b:2"]`` (the launcher's
    reading, to check a student's cluster against)."""
    return [part.strip() for part in flag.split(",") if part.strip()]


def parse_flags(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line; exit 2 with argparse's message on bad input (an index
    outside the job's hosts included), before TensorFlow is imported."""
    p = make_parser()
    flags = p.parse_args(argv)
    named = hosts(getattr(flags, flags.job_name + "_hosts"))
    if not 0 <= flags.task_index < len(named):
        p.error(f"--task_index={flags.task_index} is not a task of job {flags.job_name!r} ({len(named)} host(s))")
    if flags.updates < 1:
        p.error(f"--updates must be >= 1, got {flags.updates}")
    return flags
