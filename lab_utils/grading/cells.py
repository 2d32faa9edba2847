"""Helpers for nbgrader test cells (introduced in Lab 1, Exercise 1's test cell).

::

    from lab_utils.grading import credit, ratio_credit, is_grading
    credit(0.5, points=2)                 # -> 1.0, a clamped Python float
    ratio_credit(student_eps / ref_eps, points=3)
    check_prediction("bytes per sync step", predicted, measured, tolerance=0.25)   # Lab 3's predictions
    check_replay("worker:0's step", predicted, before, after, share=0.25)       # a what-if against a second run

nbgrader gives partial credit when a test cell's last expression is a Python
``float`` in [0, points]; a NumPy scalar or another type gives full credit and
a value above ``points`` makes autograde fail. ``credit`` is the one place that
produces that value.
"""

from __future__ import annotations

import math
import os
from numbers import Real

__all__ = ["is_grading", "credit", "ratio_credit", "check_prediction", "check_replay", "DEFAULT_BANDS"]

#: (minimum ratio, fraction of the points) pairs of :func:`ratio_credit`.
DEFAULT_BANDS = ((0.8, 1.0), (0.5, 0.5), (0.25, 0.25))


def is_grading() -> str | None:
    """``"autograde"`` or ``"validate"`` while nbgrader executes the notebook
    (it sets ``NBGRADER_EXECUTION``), else ``None``. Notebooks use it to size
    their runs so grading stays fast."""
    value = os.environ.get("NBGRADER_EXECUTION", "").strip()
    return value or None


def credit(fraction, points) -> float:
    """Partial credit for a test cell: ``fraction`` of ``points``, clamped to
    [0, points] and returned as a Python float (what nbgrader requires).
    ``True``/``False`` count as 1/0; NaN counts as 0."""
    if isinstance(points, bool) or not isinstance(points, Real) or not points >= 0:
        raise ValueError(f"points must be a non-negative number, got {points!r}")
    if isinstance(fraction, bool):
        fraction = float(fraction)
    try:
        f = float(fraction)
    except (TypeError, ValueError):
        raise TypeError(f"fraction must be a number, got {type(fraction).__name__} {fraction!r}") from None
    if math.isnan(f):
        f = 0.0
    return float(min(max(f, 0.0), 1.0) * float(points))


def ratio_credit(ratio, points, bands=DEFAULT_BANDS) -> float:
    """Credit for a measured/reference ratio (e.g. throughput against a
    reference measured in the same grading run on the same machine).

    ``bands`` are ``(minimum_ratio, fraction)`` pairs; the best band whose
    minimum the ratio reaches gives the fraction (default: >= 0.8 full credit,
    >= 0.5 half, >= 0.25 a quarter, else 0)."""
    ordered = sorted(((float(lo), float(fr)) for lo, fr in bands), reverse=True)
    if not ordered:
        raise ValueError("bands must hold at least one (minimum_ratio, fraction) pair")
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        return credit(0.0, points)
    if math.isnan(r):
        return credit(0.0, points)
    for lo, fraction in ordered:
        if r >= lo:
            return credit(fraction, points)
    return credit(0.0, points)


def check_prediction(what: str, predicted, measured, tolerance: float, hint: str = "") -> float:
    """``measured / predicted`` when the measurement is within ``tolerance`` (relative) of the
    prediction; ``AssertionError`` saying both numbers, the ratio and ``hint`` (what to look at)
    when it is not, or when the prediction is not a positive number."""
    if isinstance(predicted, bool) or not isinstance(predicted, Real) or not predicted > 0:
        raise AssertionError(f"{what}: predict a positive number, got {predicted!r}")
    ratio = float(measured) / float(predicted)
    if not abs(ratio - 1) <= tolerance:
        raise AssertionError(
            f"{what}: you predicted {float(predicted):,.4g}, your run measured {float(measured):,.4g} "
            f"({ratio:.2f}x the prediction; within {tolerance:.0%} passes)" + (f". {hint}" if hint else "")
        )
    return ratio


def check_replay(what: str, predicted, before, after, share: float = 0.25, rel: float = 0.1, hint: str = "") -> float:
    """A prediction of a second run (``after``) from the first (``before``), made by replaying
    the first run's timeline with the change: passes when it is nearer to ``after`` than
    ``share`` of the change between the runs (it explains the change, whatever its size: a
    relative tolerance alone, on a step of a few milliseconds, would grade the machine's noise),
    or within ``rel`` of ``after`` (where the change is small next to what the replay cannot
    know: per-message costs on fast links). Returns the share of the change it missed by;
    ``AssertionError`` saying the three numbers and ``hint`` when it is neither, or when the
    prediction is not a positive number or the runs did not differ."""
    if isinstance(predicted, bool) or not isinstance(predicted, Real) or not predicted > 0:
        raise AssertionError(f"{what}: predict a positive number, got {predicted!r}")
    change = float(after) - float(before)
    if change == 0:
        raise AssertionError(f"{what}: both runs measured {float(after):,.4g}: there is no change to predict")
    missed = abs(float(predicted) - float(after)) / abs(change)
    if not (missed <= share or abs(float(predicted) / float(after) - 1) <= rel):
        raise AssertionError(
            f"{what}: the first run measured {float(before):,.4g}, the second {float(after):,.4g}; you predicted "
            f"{float(predicted):,.4g}, off by {missed:.0%} of the change and {float(predicted) / float(after):.2f}x "
            f"the second run (within {share:.0%} of the change, or {rel:.0%} of the run, passes)"
            + (f". {hint}" if hint else "")
        )
    return missed
