"""Command line of Lab 5's one-process AlexNet task (``python -m lab_utils.training.towers``).

Everything here runs before TensorFlow is imported: bad values end the task with exit
2 and argparse's message, and the notebook side checks a run's arguments with the same
parser (:func:`lab_utils.training.towers.runs.check_args`) before it launches.
Re-exported by :mod:`lab_utils.training.towers.task`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lab_utils.training.devices import KINDS

__all__ = ["METHODS", "PRECISIONS", "make_parser", "parse_args"]

METHODS = ("single", "towers", "mirrored")
PRECISIONS = ("auto", "float32", "mixed")
#: ``--help``'s description (the first line of the task module's docstring).
DESCRIPTION = "AlexNet on several devices of one process (Lab 5): the task side."


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab_utils.training.towers", description=DESCRIPTION)
    p.add_argument("--method", choices=METHODS, default="towers")
    p.add_argument("--devices", type=int, default=1, help="devices in this process (towers or replicas)")
    p.add_argument("--batch-size", type=int, default=64, help="examples per device and step")
    p.add_argument("--steps", type=int, default=20, help="timed training steps (after the warm-up)")
    p.add_argument("--warmup-steps", type=int, default=1, help="untimed first steps (tracing, allocation)")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", choices=("cifar", "224"), default="cifar")
    p.add_argument("--width", type=float, default=1.0, help="scales every layer of AlexNet (0.25 for CI)")
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--device-kind", choices=KINDS, default="auto")
    p.add_argument("--memory-limit-mb", type=int, default=None, help="memory per device (see devices.configure)")
    p.add_argument("--precision", choices=PRECISIONS, default="auto", help="mixed: bfloat16 compute on GPUs")
    p.add_argument("--student", default="towers.py", help="the file with the student's step functions")
    p.add_argument("--save-weights", default=None, help="write the final weights here (.npz)")
    p.add_argument(
        "--check",
        action="store_true",
        help="check the student's two step functions on a tiny model in seconds (see check_steps)",
    )
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Settings from the command line; bad values exit 2 with a message before TensorFlow loads."""
    p = make_parser()
    a = p.parse_args(argv)
    for name, low in (("devices", 1), ("batch_size", 1), ("steps", 1), ("warmup_steps", 1), ("seed", 0)):
        if getattr(a, name) < low:
            p.error(f"--{name.replace('_', '-')} must be >= {low}, got {getattr(a, name)}")
    if a.method == "single" and a.devices != 1 and not a.check:
        p.error(f"--method single trains on one device, got --devices {a.devices}")
    if not a.learning_rate > 0 or not 0 <= a.momentum < 1 or not 0 <= a.dropout < 1 or not 0 < a.width <= 4:
        p.error("need --learning-rate > 0, 0 <= --momentum < 1, 0 <= --dropout < 1 and 0 < --width <= 4")
    if a.memory_limit_mb is not None and a.memory_limit_mb < 1:
        p.error(f"--memory-limit-mb must be >= 1, got {a.memory_limit_mb}")
    if (a.method != "single" or a.check) and not Path(a.student).is_file():
        p.error(f"--student {a.student}: no such file (write it with the notebook's %%writefile cell)")
    return a
