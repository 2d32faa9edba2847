"""Settings and command line of a Lab 4 run (``train_hvd.py`` and the references).

Everything here runs before TensorFlow is imported, so bad input ends the task with
exit 2 and argparse's message; :func:`check_args` is the same check for the notebook
side (a ``ValueError`` before anything launches). Re-exported by
:mod:`lab_utils.training.allreduce.task`, whose names the training scripts use.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from lab_utils.training import loop

__all__ = ["MODELS", "STRATEGIES", "Settings", "make_parser", "parse_args", "check_args"]

MODELS = ("logreg", "cnn", "alexnet")
STRATEGIES = ("hvd", "single", "mwms")


@dataclass(frozen=True)
class Settings:
    """Validated settings of one run (the same on every rank)."""

    model: str = "logreg"
    batch_size: int = 60  # per rank
    steps: int = 200
    learning_rate: float = 0.5  # before any scaling by the number of ranks
    seed: int = 0
    eval_every: int = 0  # steps between test evaluations on rank 0 (0: only at the end)
    fp16: bool = False  # Horovod's fp16 compression of the gradients on the wire
    checkpoint_dir: str | None = None  # rank 0 writes a TF checkpoint here at the end
    save_weights: str | None = None  # rank 0 writes the final weights here (.npz)
    emulate_ranks: int = 1  # --strategy single: draw the batches of this many ranks per step
    strategy: str = "hvd"
    width: float = 1.0  # alexnet: scales every layer (Lab 5)
    dropout: float = 0.5  # alexnet: before the hidden fully-connected layers


def make_parser(description: str | None = None, prog: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description or "Lab 4: data-parallel training with all-reduce")
    p.add_argument("--model", choices=MODELS, default="logreg", help="logreg (784x10), cnn, alexnet (Lab 5)")
    p.add_argument("--batch-size", type=int, default=60, help="examples per rank and step (default 60)")
    p.add_argument("--steps", type=int, default=200, help="training steps (every rank makes each one)")
    p.add_argument("--learning-rate", type=float, default=0.5, help="for one rank's batch; see Lab 4, Part B")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=0, help="steps between test evaluations (0: at the end)")
    p.add_argument("--fp16", action="store_true", help="compress gradients to float16 on the wire")
    p.add_argument("--checkpoint-dir", default=None, help="rank 0 saves a TensorFlow checkpoint here")
    p.add_argument("--save-weights", default=None, help="rank 0 saves the final weights here (.npz)")
    p.add_argument("--emulate-ranks", type=int, default=1, help="--strategy single: batches of N ranks per step")
    p.add_argument("--width", type=float, default=1.0, help="alexnet: scale of every layer (0.25 for CI)")
    p.add_argument("--dropout", type=float, default=0.5, help="alexnet: dropout rate (0 to compare weights)")
    p.add_argument("--strategy", choices=STRATEGIES, default="hvd", help=argparse.SUPPRESS)
    return p


def parse_args(argv=None, description: str | None = None, prog: str | None = None) -> Settings:
    """Settings from the command line; bad values end the process with exit 2 and a
    message (``argparse``), before TensorFlow is imported."""
    p = make_parser(description, prog)
    a = p.parse_args(argv)
    for name, low in (("batch_size", 1), ("steps", 1), ("eval_every", 0), ("seed", 0), ("emulate_ranks", 1)):
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(a, name)}")
    if not a.learning_rate > 0:
        p.error(f"--learning-rate must be > 0, got {a.learning_rate}")
    if not 0 < a.width <= 4 or not 0 <= a.dropout < 1:
        p.error(f"need 0 < --width <= 4 and 0 <= --dropout < 1, got {a.width} and {a.dropout}")
    if a.emulate_ranks > 1 and a.strategy != "single":
        p.error("--emulate-ranks is for --strategy single (one process standing in for N ranks)")
    return Settings(**{k: v for k, v in vars(a).items()})


def check_args(argv) -> Settings:
    """:func:`parse_args` for the notebook side: bad arguments raise ``ValueError`` with
    argparse's message instead of ending the process (checked before any launch)."""
    return loop.parse_or_raise(lambda: parse_args(list(argv), prog="the training script"), list(argv))
