"""Shards, Adam and bytes: what every part of Lab 7 shares (a pure helper: NumPy only).

A vector of ``n`` values is cut into ``size`` contiguous shards, rank ``r`` owning
``shard_bounds(n, size)[r]``; the first ``n % size`` shards hold one value more. That
is the layout of MPI's ``Reduce_scatter`` with those counts, and of ``Allgatherv``.

:func:`adam_update` is the one Adam step of the lab: plain data parallelism applies it
to the whole vector, a sharded optimizer to its own shard. It works element by element,
so on the same gradient the two give the same bits.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lab_utils import checks

__all__ = ["ADAM", "shard_bounds", "shard_counts", "adam_update", "array_bytes"]

#: The lab's Adam: learning rate, betas, epsilon.
ADAM = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-7}


def shard_counts(n: int, size: int) -> list[int]:
    """Values in each rank's shard of a vector of ``n`` values over ``size`` ranks."""
    n, size = checks.count("n", n, low=0), checks.count("size", size)
    base, extra = divmod(n, size)
    return [base + (r < extra) for r in range(size)]


def shard_bounds(n: int, size: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: rank r's shard is ``x[start:stop]``."""
    bounds, start = [], 0
    for count in shard_counts(n, size):
        bounds.append((start, start + count))
        start += count
    return bounds


def adam_update(
    param: np.ndarray, grad: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, adam: Mapping | None = None
) -> None:
    """One Adam step at step ``t`` (1, 2, ...), in place on ``param``, ``m`` and ``v`` (float32
    arrays of one shape: a whole vector, or one shard of it and its state)."""
    if t < 1:
        raise ValueError(f"t counts steps from 1, got {t}")
    a = {**ADAM, **(adam or {})}
    if not (param.shape == grad.shape == m.shape == v.shape):
        raise ValueError(
            f"param, grad, m and v must have one shape, got {param.shape}, {grad.shape}, {m.shape}, {v.shape}"
        )
    b1, b2 = np.float32(a["beta1"]), np.float32(a["beta2"])
    m *= b1
    m += (1 - b1) * grad
    v *= b2
    v += (1 - b2) * grad * grad
    step = np.float32(a["lr"] * np.sqrt(1 - a["beta2"] ** t) / (1 - a["beta1"] ** t))
    param -= step * m / (np.sqrt(v) + np.float32(a["eps"]))


def array_bytes(obj) -> int:
    """Bytes of the NumPy arrays in ``obj``: an array, or a dict, list or tuple of them at any depth.
    A view counts as the array it views (it keeps all of it alive); each array counts once."""
    seen: set[int] = set()

    def walk(x) -> int:
        if isinstance(x, np.ndarray):
            while isinstance(x.base, np.ndarray):
                x = x.base  # a view holds its whole base alive: count the base
            if id(x) in seen:
                return 0
            seen.add(id(x))
            return int(x.nbytes)
        if isinstance(x, Mapping):
            return sum(walk(v) for v in x.values())
        if isinstance(x, (list, tuple)):
            return sum(walk(v) for v in x)
        return 0

    return walk(obj)
