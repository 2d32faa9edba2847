"""What the labs' notebooks call besides their lab's own helpers: their setup in one
line, and :func:`record` for ``make run``'s summary.

In a lab's setup cell, after the papermill ``parameters`` cell (introduced in Lab 1)::

    from lab_utils.notebook import record, setup

    data = setup(globals(), precision=3).data   # GRADING_SIZES when graded, OFFLINE, MNIST, TARGET_ACCURACY

and in its "what you measured" section::

    record(accuracy=0.91, examples_per_sec=5300.0)

A lab's "bad input" cell shows what each mistake is told, before anything starts::

    show_error("batch size 0", lambda: ps_runs.run_ps("train_async.py", args={"batch_size": 0}))
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, NamedTuple

from lab_utils import config

__all__ = ["LabSetup", "setup", "device_tier", "record", "show_error"]


class LabSetup(NamedTuple):
    """What :func:`setup` gives the notebook besides the parameters it updated."""

    data: Any  # the Dataset the kernel loaded (None with data=None)
    target_accuracy: float | None  # TARGET_ACCURACY, as the notebook now holds it
    grading: str | None  # what is_grading() said: "autograde" etc. under nbgrader, else None
    gpus: int | None  # GPUs TensorFlow sees (with tier=True)
    tier: str | None  # gpu, logical-gpu or logical-cpu (with tier=True): see device_tier


def device_tier(gpus: int, devices: int) -> str:
    """Where ``devices`` devices per process come from on a machine with ``gpus`` GPUs:
    ``gpu`` (enough GPUs), ``logical-gpu`` (fewer: GPU 0 split) or ``logical-cpu`` (none)."""
    if gpus < 0 or devices < 1:
        raise ValueError(f"device_tier(gpus={gpus}, devices={devices}): gpus >= 0 and devices >= 1")
    if not gpus:
        return "logical-cpu"
    return "gpu" if gpus >= devices else "logical-gpu"


def setup(
    params: MutableMapping[str, Any],
    *,
    data: str | None = "mnist",
    raw: bool = False,
    precision: int | None = None,
    tier: bool = False,
) -> LabSetup:
    """A lab's setup from its parameters ``params`` (the notebook's ``globals()``, after the
    papermill ``parameters`` cell, so the values papermill injected are the ones used).

    In order, on the notebook's behalf:

    - under nbgrader (:func:`lab_utils.grading.is_grading`), ``params["GRADING_SIZES"]`` over
      ``params`` (every name in it must be a parameter already: a typo raises ``ValueError``);
    - ``OFFLINE``: sets ``LABS_OFFLINE=1`` in this kernel, inherited by every process it starts;
    - ``precision``: pandas' ``display.precision`` for the lab's tables;
    - ``data="mnist"``: loads MNIST (``raw``: training images as uint8, see
      :func:`lab_utils.data.load_mnist`); a ``TARGET_ACCURACY`` of None becomes the target for
      that data (:func:`lab_utils.data.target_accuracy`), written back into ``params``;
    - ``tier``: the GPUs TensorFlow sees and the :func:`device_tier` for ``DEVICES`` devices per
      process (read after the grading sizes, like every parameter here).
    """
    from lab_utils.grading.cells import is_grading

    if data not in ("mnist", None):  # Lab 5 loads its CIFAR-10 itself, to describe it and let it go
        raise ValueError(f"setup(data={data!r}): use 'mnist' or None")
    grading = is_grading()
    if grading:
        sizes = params.get("GRADING_SIZES") or {}
        unknown = sorted(set(sizes) - set(params))
        if unknown:
            raise ValueError(f"GRADING_SIZES names {unknown}, which are not parameters of this notebook")
        params.update(sizes)
    if params.get("OFFLINE"):
        os.environ[config.OFFLINE] = "1"
    if precision is not None:
        import pandas as pd

        pd.set_option("display.precision", precision)
    dataset = None
    if data == "mnist":
        from lab_utils import data as lab_data

        dataset = lab_data.load_mnist(offline=True if params.get("OFFLINE") else None, raw=raw)
        if params.get("TARGET_ACCURACY") is None:
            params["TARGET_ACCURACY"] = lab_data.target_accuracy(dataset)
    gpus = kind = None
    if tier:
        from lab_utils.models import import_tensorflow

        gpus = len(import_tensorflow().config.list_physical_devices("GPU"))
        kind = device_tier(gpus, int(params["DEVICES"]))
    return LabSetup(dataset, params.get("TARGET_ACCURACY"), grading, gpus, kind)


def record(**metrics) -> dict:
    """Record a lab's headline figures for ``make run``'s summary. Values must be
    JSON numbers or strings; calling it again adds or replaces keys.

    Writes to ``$LABS_RESULTS_FILE`` (set by :mod:`lab_utils.run_labs` for each lab) and
    does nothing otherwise, so students never see a side effect."""
    path = config.get(config.RESULTS_FILE)
    clean = {}
    for key, value in metrics.items():
        if hasattr(value, "item"):  # numpy scalar
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = None
        if value is not None and not isinstance(value, (int, float, str, bool)):
            raise TypeError(f"record({key}=...) takes numbers or strings, got {type(value).__name__}")
        clean[key] = value
    if path:
        p = Path(path)
        existing = json.loads(p.read_text()) if p.is_file() else {}
        existing.update(clean)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(existing, indent=2))
    return clean


def show_error(what: str, attempt) -> None:
    """Call ``attempt()``, expecting the error a student's mistake meets (a bad argument, a
    cluster that does not fit or fails, a missing file), and print it under ``what``;
    ``AssertionError`` when no error came (the check it shows is gone)."""
    from lab_utils.cluster import ClusterError, ResourceError

    try:
        attempt()
    except (ClusterError, ResourceError, ValueError, FileNotFoundError) as exc:
        print(f"--- {what}: {type(exc).__name__}\n{exc}\n")
    else:
        raise AssertionError(f"{what}: expected an error")
