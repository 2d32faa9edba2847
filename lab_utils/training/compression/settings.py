"""Settings and command line of a Lab 6 rank, and the student's ``compressors.py`` it names.

Everything here runs before TensorFlow is imported: bad values end the task with exit
2 and argparse's message (:func:`check_args` raises ``ValueError`` instead, for the
notebook side, before anything launches), and :func:`load_compressors` names the
functions a ``--student`` file lacks before a step runs. Re-exported by
:mod:`lab_utils.training.compression.task`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from lab_utils.training import loop
from lab_utils.training.compression import codecs as compression
from lab_utils.training.student import load_student

__all__ = ["PROG", "Settings", "make_parser", "parse_args", "check_args", "load_compressors"]

PROG = "python -m lab_utils.training.compression.task"
#: ``--help``'s description (the first line of the task module's docstring).
DESCRIPTION = "Lab 6's task side: one Horovod rank training with compressed gradients."


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
    p = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
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


def load_compressors(path: str | os.PathLike, method: str) -> ModuleType:
    """The student's ``compressors.py`` at ``path``, imported, once it is known to define
    the functions ``method`` calls (:data:`compression.STUDENT_FUNCTIONS`): for
    :func:`~lab_utils.training.compression.task.make_exchange`'s ``student=``.
    ``ValueError`` naming the missing ones."""
    compression.student_needs(method)  # a method that calls none: ValueError before the file runs
    module = load_student(path)
    compression.student_functions(module, method, str(path))
    return module
