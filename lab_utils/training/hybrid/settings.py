"""Settings and command line of a Lab 6 hybrid rank, and the shapes of its dense weights.

Everything here runs before TensorFlow is imported: bad values end the rank with exit 2
and argparse's message; :func:`check_args` raises ``ValueError`` instead, for the
notebook side, before anything launches. Re-exported by
:mod:`lab_utils.training.hybrid.task`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lab_utils.training import loop

__all__ = ["MODES", "PROG", "Settings", "make_parser", "parse_args", "check_args", "dense_shapes"]

MODES = ("ps", "allreduce", "hybrid")
PROG = "python -m lab_utils.training.hybrid.task"
#: ``--help``'s description (the first line of the task module's docstring).
DESCRIPTION = 'Lab 6\'s task side of "the Parallax idea": sparse variables through a parameter server,'


@dataclass(frozen=True)
class Settings:
    """Validated settings of one run (the same on every rank)."""

    mode: str = "hybrid"
    steps: int = 10  # timed steps
    warmup: int = 2  # untimed steps first (TensorFlow's first calls, TCP's ramp)
    batch_size: int = 256  # examples per worker and step
    users: int = 20_000
    items: int = 80_000
    dim: int = 32  # floats per embedding row
    hidden: int = 1024  # units of the MLP's two hidden layers
    learning_rate: float = 0.1  # SGD, dense weights
    embedding_learning_rate: float = 20.0  # SGD, table rows (see make_parser's help)
    seed: int = 0

    @property
    def table_rows(self) -> int:
        return self.users + self.items

    @property
    def dense_params(self) -> int:
        return sum(int(np.prod(s)) for s in dense_shapes(self.dim, self.hidden))


def make_parser(prog: str | None = PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=DESCRIPTION)
    p.add_argument("--mode", choices=MODES, required=True, help="ps, allreduce or hybrid")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per worker and step")
    p.add_argument("--users", type=int, default=20_000, help="users (rows of the table)")
    p.add_argument("--items", type=int, default=80_000, help="items (rows of the table)")
    p.add_argument("--dim", type=int, default=32, help="floats per embedding row")
    p.add_argument("--hidden", type=int, default=1024, help="units of the MLP's hidden layers")
    p.add_argument("--learning-rate", type=float, default=0.1, help="SGD learning rate of the dense weights")
    p.add_argument(
        "--embedding-learning-rate",
        type=float,
        default=20.0,
        help="SGD learning rate of the table: a row's gradient is its few examples' share of a batch mean, "
        "so rows need a far larger rate than the dense weights (default 20)",
    )
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv: Sequence[str] | None = None, prog: str | None = PROG) -> Settings:
    """Settings from the command line; bad values end the process with exit 2 and a message."""
    p = make_parser(prog)
    a = p.parse_args(argv)
    lows = {"steps": 1, "warmup": 0, "batch_size": 1, "users": 1, "items": 1, "dim": 1, "hidden": 1, "seed": 0}
    for name, low in lows.items():
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(a, name)}")
    for name in ("learning_rate", "embedding_learning_rate"):
        if not getattr(a, name) > 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(a, name)}")
    if a.users + a.items >= 2**31:
        p.error(f"the table's ids are int32: --users + --items must be < 2**31, got {a.users + a.items}")
    return Settings(**vars(a))


def check_args(argv: Sequence[str]) -> Settings:
    """:func:`parse_args` for the notebook side: bad arguments raise ``ValueError`` with
    argparse's message instead of ending the process (checked before any launch)."""
    return loop.parse_or_raise(lambda: parse_args(list(argv), prog="the hybrid task"), list(argv))


def dense_shapes(dim: int, hidden: int) -> list[tuple[int, ...]]:
    """The MLP's weights in order: ``2 dim -> hidden -> hidden -> 1`` (kernels and biases)."""
    return [(2 * dim, hidden), (hidden,), (hidden, hidden), (hidden,), (hidden, 1), (1,)]
