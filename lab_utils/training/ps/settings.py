"""Settings and command line of a parameter-server task (Labs 2, 3 and 6).

Modes: ``async`` (Lab 2), ``sync`` (Lab 3, ``SyncReplicasOptimizer``) and ``ssp``
(Lab 6: stale-synchronous parallel with a staleness bound, :mod:`lab_utils.training.ssp`).

Everything here runs before TensorFlow is imported, so bad input (a batch size of
0, more replicas to aggregate than workers, a malformed straggler) ends the task
at once with a clear message and exit code 2. Re-exported by
:mod:`lab_utils.training.ps`, which the training scripts import.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from lab_utils import checks
from lab_utils.report import parse_straggler

MODES = ("async", "sync", "ssp")
#: Default deadline for one train step (a lost token becomes an error, not a hang).
STEP_TIMEOUT_SECS = 60.0
#: What ``--staleness`` accepts for "no bound" (ASP): these strings, -1 or ``math.inf``.
UNBOUNDED = ("inf", "infinity", "∞", "-1")


@dataclass(frozen=True)
class Settings:
    """Validated settings of one run (the same on every task)."""

    mode: str
    batch_size: int
    num_workers: int
    epochs: float | None = 1.0
    steps: int | None = None
    learning_rate: float = 0.5
    replicas_to_aggregate: int | None = None  # sync only; None -> num_workers
    straggler: Mapping[str, float] = field(default_factory=dict)  # {"worker:1": seconds per step}
    eval_every: int = 50  # global steps between test evaluations on the chief (0: only at the end)
    seed: int = 0
    step_timeout: float = STEP_TIMEOUT_SECS
    save_weights: str | None = None  # the chief writes the final model weights here (.npz; Lab 4, Part C)
    staleness: float | None = None  # ssp only: the bound s, an int >= 0 or math.inf (ASP)
    tf_defaults: bool = False  # sync only: TensorFlow's defaults, which hang at shutdown (Lab 3, Part 5)

    @property
    def replicas(self) -> int:
        """Gradients per synchronous update (R)."""
        return self.replicas_to_aggregate or self.num_workers


def parse_staleness(value: int | float | str) -> int | float:
    """The staleness bound ``s`` of stale-synchronous parallel (Lab 6): an integer
    >= 0 (0: lockstep, like BSP), or ``math.inf`` for no bound (ASP), given as
    ``math.inf``, -1, ``"inf"`` or ``"-1"``. Returns an ``int`` or ``math.inf``."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in UNBOUNDED:
            return math.inf
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"staleness must be an integer >= 0, or 'inf' / -1 for no bound, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"staleness must be an integer >= 0 or math.inf, got {type(value).__name__} {value!r}")
    if value == math.inf or value == -1:
        return math.inf
    if not math.isfinite(value) or value != int(value) or value < 0:
        raise ValueError(f"staleness must be an integer >= 0, or math.inf / -1 for no bound, got {value!r}")
    return int(value)


def _int(name: str, value, low: int) -> int:
    """``value`` as an int >= ``low``: ``TypeError`` for a non-integer, ``ValueError`` below ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return int(value)


def _check_length(epochs: float | None, steps: int | None) -> tuple[float | None, int | None]:
    """``(epochs, steps)`` checked: exactly one given, steps an int >= 1, epochs a number > 0."""
    if (epochs is None) == (steps is None):
        raise ValueError(f"give exactly one of epochs or steps, got epochs={epochs!r}, steps={steps!r}")
    if steps is not None:
        return epochs, _int("steps", steps, 1)
    if isinstance(epochs, bool) or not isinstance(epochs, (int, float)) or not math.isfinite(epochs) or epochs <= 0:
        raise ValueError(f"epochs must be a number > 0, got {epochs!r}")
    return float(epochs), steps


def _check_replicas(mode: str, replicas_to_aggregate: int | None, num_workers: int) -> int | None:
    """``replicas_to_aggregate`` checked: only for ``sync``, 1..``num_workers`` (None: all)."""
    if replicas_to_aggregate is None:
        return None
    if mode != "sync":
        raise ValueError(
            "replicas_to_aggregate only applies to mode='sync' (asynchronous updates are never aggregated)"
        )
    replicas_to_aggregate = _int("replicas_to_aggregate", replicas_to_aggregate, 1)
    if replicas_to_aggregate > num_workers:
        raise ValueError(
            f"replicas_to_aggregate={replicas_to_aggregate} is more than the {num_workers} worker(s): "
            f"allowed 1..{num_workers} (fewer than the workers = backup workers)"
        )
    return replicas_to_aggregate


def check_settings(
    mode: str,
    batch_size: int,
    num_workers: int,
    epochs: float | None = 1.0,
    steps: int | None = None,
    learning_rate: float = 0.5,
    replicas_to_aggregate: int | None = None,
    straggler: str | Mapping[str, float] | None = None,
    eval_every: int = 50,
    seed: int = 0,
    step_timeout: float = STEP_TIMEOUT_SECS,
    save_weights: str | None = None,
    staleness: int | float | str | None = None,
    tf_defaults: bool = False,
) -> Settings:
    """Validate everything that can be checked before TensorFlow starts; raise
    ``ValueError``/``TypeError`` saying what was given and what is allowed."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    batch_size = _int("batch_size", batch_size, 1)
    num_workers = _int("number of workers", num_workers, 1)
    epochs, steps = _check_length(epochs, steps)
    if (
        isinstance(learning_rate, bool)
        or not isinstance(learning_rate, (int, float))
        or not math.isfinite(learning_rate)
        or learning_rate <= 0
    ):
        raise ValueError(f"learning_rate must be a number > 0, got {learning_rate!r}")
    replicas_to_aggregate = _check_replicas(mode, replicas_to_aggregate, num_workers)
    if mode == "ssp":
        if staleness is None:
            raise ValueError("mode='ssp' needs a staleness bound: an integer >= 0, or 'inf' / -1 for no bound (ASP)")
        staleness = parse_staleness(staleness)
    elif staleness is not None:
        raise ValueError(f"staleness only applies to mode='ssp', got staleness={staleness!r} with mode={mode!r}")
    if not isinstance(tf_defaults, bool):
        raise TypeError(f"tf_defaults must be True or False, got {tf_defaults!r}")
    if tf_defaults and mode != "sync":
        raise ValueError(f"tf_defaults only applies to mode='sync' (Lab 3, Part 5), got mode={mode!r}")
    delays = parse_straggler(straggler)
    for name in delays:
        job, _, index = name.partition(":")
        if job != "worker" or not index.isdigit() or int(index) >= num_workers:
            raise ValueError(f"straggler task must be one of worker:0..worker:{num_workers - 1}, got {name!r}")
    eval_every = _int("eval_every", eval_every, 0)
    seed = _int("seed", seed, 0)
    checks.seconds("step_timeout", step_timeout)
    return Settings(
        mode,
        batch_size,
        num_workers,
        epochs,
        steps,
        float(learning_rate),
        replicas_to_aggregate,
        delays,
        eval_every,
        seed,
        float(step_timeout),
        save_weights or None,
        staleness,
        tf_defaults=tf_defaults,
    )


def steps_per_epoch(n_train: int, batch_size: int) -> int:
    """Global steps in one pass over the training set: ``ceil(n_train / batch_size)``.

    Asynchronous: the workers share these steps (each does about 1/N of them).
    Synchronous (the CS 744 convention): one async epoch is compared with this
    many *global* steps, each of which averages R batches."""
    if n_train < 1 or batch_size < 1:
        raise ValueError(f"need n_train >= 1 and batch_size >= 1, got {n_train}, {batch_size}")
    return math.ceil(n_train / batch_size)


def target_global_steps(settings: Settings, n_train: int) -> int:
    """The global step at which every worker stops."""
    if settings.steps is not None:
        return settings.steps
    return max(1, math.ceil(settings.epochs * steps_per_epoch(n_train, settings.batch_size)))


def make_parser(mode: str, description: str | None = None) -> argparse.ArgumentParser:
    """The command line shared by ``train_async.py``, ``train_sync.py`` and ``train_ssp.py``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--batch-size", type=int, default=60, help="examples per worker step (default 60)")
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--epochs",
        type=float,
        default=None,
        help="passes over the training set; 1 epoch = ceil(n_train/batch) global steps (default 1)",
    )
    length.add_argument("--steps", type=int, default=None, help="target global step (instead of --epochs)")
    p.add_argument("--learning-rate", type=float, default=0.5, help="gradient-descent learning rate (default 0.5)")
    if mode == "sync":
        p.add_argument(
            "--replicas-to-aggregate",
            type=int,
            default=None,
            help="gradients averaged per global step (default: number of workers)",
        )
    if mode == "ssp":
        p.add_argument(
            "--staleness",
            required=True,
            help="SSP bound s: a worker at clock c waits until every clock is >= c - s "
            "(0: lockstep like BSP; 'inf' or -1: no bound, ASP)",
        )
    p.add_argument(
        "--straggler",
        default=None,
        help="slow one worker down, e.g. 'worker:1=0.05' (seconds per step) or 'worker:1=50ms'",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=50,
        help="global steps between test evaluations on the chief (0: only at the end)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-timeout",
        type=float,
        default=STEP_TIMEOUT_SECS,
        help="seconds one train step may block before the run fails (default 60)",
    )
    p.add_argument("--save-weights", default=None, help="the chief saves the final model weights here (.npz)")
    if mode == "sync":
        p.add_argument(
            "--tf-defaults",
            action="store_true",
            help="run with TensorFlow's defaults (MonitoredTrainingSession, StopAtStepHook, default tokens, "
            "no device filters, no step deadline): the run hangs at shutdown (Lab 3, Part 5)",
        )
    return p


def parse_args(mode: str, argv=None, description: str | None = None, env: Mapping[str, str] | None = None):
    """Parse and validate; on bad input print a clear message and exit 2 (argparse's
    convention) before TensorFlow is imported. Returns ``(Settings, TaskConfig)``;
    the task comes from ``TF_CONFIG`` in ``env`` (default ``os.environ``)."""
    from lab_utils.cluster import task_config

    parser = make_parser(mode, description)
    args = parser.parse_args(argv)
    try:
        task = task_config(env)
    except RuntimeError as exc:
        parser.error(str(exc))
    if args.epochs is None and args.steps is None:
        args.epochs = 1.0
    try:
        settings = check_settings(
            mode,
            args.batch_size,
            len(task.cluster.get("worker", [])),
            epochs=args.epochs,
            steps=args.steps,
            learning_rate=args.learning_rate,
            replicas_to_aggregate=getattr(args, "replicas_to_aggregate", None),
            straggler=args.straggler,
            eval_every=args.eval_every,
            seed=args.seed,
            step_timeout=args.step_timeout,
            save_weights=args.save_weights,
            staleness=getattr(args, "staleness", None),
            tf_defaults=getattr(args, "tf_defaults", False),
        )
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return settings, task
