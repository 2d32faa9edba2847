"""The argument checks every public function shares: one wording for one mistake.

- :func:`count`: an integer of at least ``low`` (workers, ranks, steps, retries...);
- :func:`counts`: a non-empty list of them (the worker counts of a sweep);
- :func:`seconds`: a finite number of seconds above 0 (deadlines, timeouts), or None where allowed;
- :func:`at_least`: an ``argparse`` type, for a task's command line (sizes, repeats).

A bool is not a number here (``True`` is not 1 worker), and NumPy's integers and floats are.
Each raises ``ValueError`` naming the argument and the value it got, before anything starts."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable
from numbers import Integral, Real
from typing import Any


def count(name: str, value: Any, low: int = 1) -> int:
    """``value`` as an int: ``ValueError`` unless it is an integer >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def counts(name: str, values: Iterable[Any], low: int = 1) -> list[int]:
    """``values`` as a list of ints: ``ValueError`` unless it is non-empty and each is an integer >= ``low``."""
    values = list(values)
    if not values or any(isinstance(v, bool) or not isinstance(v, Integral) or v < low for v in values):
        raise ValueError(f"{name} must be a non-empty list of integers >= {low}, got {values!r}")
    return [int(v) for v in values]


def seconds(name: str, value: Any, *, optional: bool = False) -> float | None:
    """``value`` as a float: ``ValueError`` unless it is a finite number of seconds > 0
    (or None, where ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not value > 0:
        raise ValueError(f"{name} must be a number of seconds > 0{' or None' if optional else ''}, got {value!r}")
    return float(value)


def at_least(low: int) -> Callable[[str], int]:
    """An ``argparse`` type: the argument as an int >= ``low``; otherwise the parser's usage
    error, naming the option (``--sizes: must be an integer >= 0, got '-1'``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse
