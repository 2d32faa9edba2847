"""Weights files of Labs 4-6 (``w0, w1, ...`` in an ``.npz``) and how far two sets are apart.

NumPy only: the task side writes them (:func:`save_weights`, rank 0 at the end of a
run), the notebook side reads and compares them (:func:`load_weights_file`,
:func:`max_difference`). Re-exported by :mod:`lab_utils.training.allreduce.task`.
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["save_weights", "load_weights_file", "max_difference"]


def save_weights(model, path: str | os.PathLike) -> None:
    """The model's weights as ``w0, w1, ...`` (build order) in an ``.npz`` file."""
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **{f"w{i}": v.numpy() for i, v in enumerate(model.weights)})
    os.replace(tmp, path)


def load_weights_file(path: str | os.PathLike) -> list[np.ndarray]:
    """The arrays :func:`save_weights` wrote, in order (Lab 3's PS runs write the same layout)."""
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k[1:]))]


def max_difference(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
    """How far two sets of weights are apart: ``max_abs`` and ``max_rel`` (relative to
    the largest weight magnitude). Raises ValueError when the shapes differ."""
    shapes_a, shapes_b = [np.shape(w) for w in a], [np.shape(w) for w in b]
    if shapes_a != shapes_b:
        raise ValueError(f"the weights have different shapes: {shapes_a} vs {shapes_b}")
    diff = max((float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True) if np.size(x)), default=0.0)
    scale = max((float(np.max(np.abs(x))) for x in a if np.size(x)), default=0.0)
    return {"max_abs": diff, "max_rel": diff / scale if scale else diff}
