"""The command line of Lab 2's TF2 aside (``python -m lab_utils.training.ps.strategy``).

Parsed and checked before TensorFlow is imported (bad input: argparse's exit 2), by the
task (:mod:`lab_utils.training.ps.strategy`, which re-exports it) and, before anything
launches, by the notebook (:func:`lab_utils.training.ps.strategy.runs.run_ps_strategy`).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

__all__ = ["make_parser", "parse_args"]


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lab_utils.training.ps.strategy",
        description="Asynchronous PS training with tf.distribute.ParameterServerStrategy (Lab 2, aside).",
    )
    p.add_argument("--steps", type=int, default=200, help="training steps the chief schedules (default 200)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per step (default 64)")
    p.add_argument("--learning-rate", type=float, default=0.5, help="SGD learning rate (default 0.5)")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and validate before TensorFlow is imported (bad input: argparse's exit 2)."""
    p = make_parser()
    a = p.parse_args(argv)
    for name in ("steps", "batch_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if not (math.isfinite(a.learning_rate) and a.learning_rate > 0):
        p.error(f"--learning-rate must be a number > 0, got {a.learning_rate}")
    if a.seed < 0:
        p.error(f"--seed must be >= 0, got {a.seed}")
    return a
