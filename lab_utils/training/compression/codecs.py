"""Gradient compression (Lab 6): the students' compressors on the wire, and the exchange with Horovod.

Data-parallel training sends every gradient of every step; on a slow link that is the
step. Lab 6 sends less:

* ``none``: Lab 4's all-reduce of float32 gradients (the baseline);
* ``fp16``: Horovod's ``hvd.Compression.fp16``: each gradient is cast to float16
  before the all-reduce and back after it: half the bytes, and the sum itself is done
  in float16 (about 3 significant digits, overflow above 65504);
* ``onebit``: 1-bit SGD with error feedback (Seide et al., 2014), written by the
  students: one sign bit per entry and one scale per tensor; what the quantisation
  lost is kept on the rank and added to the next step's gradient;
* ``topk``: top-k sparsification with error accumulation (Stich et al., 2018; Lin et
  al., 2018, "Deep Gradient Compression"), written by the students too: each tensor
  sends only its ``k`` entries of largest magnitude (index and value); the rest
  accumulates locally until it is large enough to be sent.

The students write ``onebit``, ``onebit_decompress`` and ``topk`` in one file,
``compressors.py`` (the notebook's ``%%writefile`` cell; :data:`STUDENT_FUNCTIONS`
says which each method needs). Nothing here computes a compression itself: the
codecs pack what the student's functions return into bytes and check it.

Compressed gradients cannot be summed on the wire (two ranks' top-k pick different
entries; two sign vectors do not add up to a sign vector), so those methods use an
*all-gather*: every rank receives every other rank's message and decodes and averages
them itself, in the same order, so every rank ends with the same weights. An
all-gather's traffic grows with the ranks (:func:`wire_bytes`), where the ring
all-reduce's does not.

Here, in NumPy: the dense array a top-k message stands for (:func:`topk_decompress`)
and its ``k`` (:func:`topk_count`), what one rank's message weighs
(:func:`message_bytes`) and sends per step (:func:`wire_bytes`), the byte layouts of
the messages (:class:`TopK`, which wraps the student's ``topk``; :class:`OneBit`,
which wraps ``onebit`` / ``onebit_decompress``; :func:`make_codec` picks one), and the
residuals of error feedback (:class:`ErrorFeedback`). NumPy only, for both sides: the
TensorFlow step's exchange through Horovod
(:func:`lab_utils.training.compression.task.make_exchange`) and the task that trains with
it are :mod:`lab_utils.training.compression.task`; the notebook side is
:mod:`lab_utils.training.compression.runs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lab_utils import checks

__all__ = [
    "METHODS",
    "STUDENT_FUNCTIONS",
    "student_needs",
    "student_functions",
    "topk_decompress",
    "topk_count",
    "message_bytes",
    "wire_bytes",
    "TopK",
    "OneBit",
    "make_codec",
    "ErrorFeedback",
]

METHODS = ("none", "fp16", "onebit", "topk")
#: Bytes per entry of each method's message (``onebit``: one bit, plus 4 bytes of scale per tensor).
_ENTRY_BYTES = {"none": 4, "fp16": 2, "topk": 8}
_SCALE_BYTES = 4  # one float32 per tensor (onebit)

#: ``onebit(grad, error) -> (signs, scale, new_error)``, the student's compressor.
OneBitFn = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, Any, np.ndarray]]
#: ``onebit_decompress(signs, scale) -> array``, its inverse.
OneBitDecompressFn = Callable[[np.ndarray, Any], np.ndarray]
#: ``topk(grad, k, error) -> (indices, values, new_error)``, the student's top-k selection.
TopKFn = Callable[[np.ndarray, int, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]

#: The functions of the student's ``compressors.py`` that each compressed method calls.
STUDENT_FUNCTIONS = {"onebit": ("onebit", "onebit_decompress"), "topk": ("topk",)}
_SIGNATURES = {
    "onebit": "onebit(grad, error)",
    "onebit_decompress": "onebit_decompress(signs, scale)",
    "topk": "topk(grad, k, error)",
}


# ----------------------------------------------------------------------------- checks


def checked_method(method: str) -> str:
    """``method``, or ValueError naming the methods there are."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    return method


def student_needs(method: str) -> str:
    """What the student's ``compressors.py`` must define for ``method``, in words:
    ``"topk(grad, k, error)"``; ``"onebit(grad, error) and onebit_decompress(signs, scale)"``."""
    if checked_method(method) not in STUDENT_FUNCTIONS:
        raise ValueError(f"method {method!r} uses no student functions; these do: {', '.join(STUDENT_FUNCTIONS)}")
    return " and ".join(_SIGNATURES[f] for f in STUDENT_FUNCTIONS[method])


def student_functions(student: Any, method: str, where: str = "the student's file") -> tuple[Callable, ...]:
    """The functions of ``student`` (the loaded ``compressors.py``: a module or any
    namespace) that ``method`` calls, in :data:`STUDENT_FUNCTIONS`' order;
    ``ValueError`` naming the missing ones (``where``: the file, for the message)."""
    wanted = student_needs(method)
    names = STUDENT_FUNCTIONS[method]
    missing = [f for f in names if not callable(getattr(student, f, None))]
    if missing:
        raise ValueError(f"{where} must define {wanted} for method {method!r}; missing {missing}")
    return tuple(getattr(student, f) for f in names)


# ----------------------------------------------------------------------------- top-k messages


def topk_decompress(indices: Any, values: Any, shape: int | Sequence[int]) -> np.ndarray:
    """The dense array of ``shape`` with ``values`` at the flat ``indices``, zeros elsewhere."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    idx, vals = np.asarray(indices), np.asarray(values)
    if idx.shape != vals.shape or idx.ndim != 1:
        raise ValueError(f"indices and values must be 1-D of one length, got shapes {idx.shape} and {vals.shape}")
    n = int(np.prod(shape))
    if idx.size and (idx.min() < 0 or idx.max() >= n):
        raise ValueError(f"indices must lie in [0, {n}) for shape {shape}, got {idx.min()}..{idx.max()}")
    out = np.zeros(n, dtype=vals.dtype if np.issubdtype(vals.dtype, np.floating) else np.float32)
    out[idx] = vals
    return out.reshape(shape)


def topk_count(n: int, ratio: float) -> int:
    """Entries kept of a tensor of ``n``: ``ratio x n`` rounded, at least 1 (Lab 6's ``--ratio``)."""
    n = checks.count("n", n)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not 0 < ratio <= 1:
        raise ValueError(f"ratio must be a fraction in (0, 1], got {ratio!r}")
    return max(1, min(n, round(ratio * n)))


# ----------------------------------------------------------------------------- bytes


def _sizes(n_params: int | Sequence[int]) -> list[int]:
    if isinstance(n_params, (int, np.integer)) and not isinstance(n_params, bool):
        return [checks.count("n_params", n_params)]
    try:
        sizes = [checks.count("each tensor's size", n) for n in n_params]
    except TypeError:
        raise ValueError(f"n_params must be an int or a sequence of tensor sizes, got {n_params!r}") from None
    if not sizes:
        raise ValueError("n_params: no tensors given")
    return sizes


def message_bytes(method: str, n_params: int | Sequence[int], k: int | None = None) -> int:
    """Bytes of ONE rank's gradients as the method puts them on the wire.

    ``n_params``: the parameter count, or each tensor's size (1-bit packs each tensor
    apart: its bits rounded up to whole bytes, plus its scale). ``none``: 4 bytes
    per entry (float32); ``fp16``: 2; ``onebit``: ``ceil(n / 8) + 4`` per tensor;
    ``topk``: 8 per kept entry (an int32 index and a float32 value), ``k`` being the
    entries kept over all tensors (required for topk, ignored otherwise)."""
    sizes = _sizes(n_params)
    if checked_method(method) == "onebit":
        return sum(-(-n // 8) + _SCALE_BYTES for n in sizes)
    if method == "topk":
        if k is None:
            raise ValueError("topk needs k, the entries kept per step (over all tensors)")
        k = checks.count("k", k)
        if k > sum(sizes):
            raise ValueError(f"k must be at most the parameter count {sum(sizes)}, got {k}")
        return _ENTRY_BYTES["topk"] * k
    return _ENTRY_BYTES[method] * sum(sizes)


def wire_bytes(method: str, n_params: int | Sequence[int], k: int | None = None, *, ranks: int = 2) -> int:
    """Bytes ONE rank sends per step with ``ranks`` ranks (payload only: no headers).

    ``none`` and ``fp16`` are all-reduced: a ring sends ``2 (N - 1) / N`` times the
    message per rank (reduce-scatter, then all-gather), whatever N. ``onebit`` and
    ``topk`` are all-gathered: every other rank must receive this rank's message, so
    each rank sends ``N - 1`` messages' worth (directly or forwarded along a ring):
    it grows with N, and at some N compression stops paying. One rank sends nothing.
    See :func:`message_bytes` for a message."""
    ranks = checks.count("ranks", ranks)
    size = message_bytes(method, n_params, k)
    if method in ("none", "fp16"):
        return round(2 * (ranks - 1) * size / ranks)
    return (ranks - 1) * size


# ----------------------------------------------------------------------------- messages (NumPy)


class TopK:
    """Top-k of each tensor (``topk_count(n, ratio)`` entries) with the student's
    ``select(grad, k, error) -> (indices, values, new_error)`` (``indices``: ``k``
    distinct positions in ``grad.ravel()``; ``values``: the entries of
    ``grad + error`` there; ``new_error``: what was not sent, ``grad``'s shape). Its
    message per tensor: the int32 indices then the float32 values, little-endian.
    What the student's function returns is checked: a wrong count, type or shape
    raises ``ValueError`` saying which."""

    name = "topk"

    def __init__(self, select: TopKFn, ratio: float):
        if not callable(select):
            raise ValueError(f"topk needs a function select(grad, k, error), got {select!r}")
        topk_count(1, ratio)  # checks ratio
        self.select, self.ratio = select, float(ratio)

    def count(self, n: int) -> int:
        return topk_count(n, self.ratio)

    def message_bytes(self, n: int) -> int:
        return message_bytes("topk", n, self.count(n))

    def encode(self, grad: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(message, new_error)`` for one tensor."""
        if grad.size >= 2**31:
            raise ValueError(f"a tensor of {grad.size} entries does not fit int32 indices")
        k = self.count(grad.size)
        out = self.select(grad, k, error)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise ValueError(f"topk(grad, k, error) must return (indices, values, new_error), got {type(out).__name__}")
        idx, vals, new_error = (np.asarray(x) for x in out)
        _check_topk(idx, vals, new_error, grad, k)
        msg = np.concatenate([idx.astype("<i4").view(np.uint8), vals.astype("<f4").view(np.uint8)])
        return msg, new_error.astype(np.float32)

    def decode(self, message: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        k = self.count(int(np.prod(shape)))
        return topk_decompress(message[: 4 * k].view("<i4"), message[4 * k :].view("<f4"), shape)

    def __repr__(self) -> str:
        return f"TopK({getattr(self.select, '__name__', self.select)}, ratio={self.ratio:g})"


def _check_topk(idx: np.ndarray, vals: np.ndarray, new_error: np.ndarray, grad: np.ndarray, k: int) -> None:
    """``ValueError`` naming what is wrong with what the student's ``topk`` returned."""
    n = grad.size
    if not np.issubdtype(idx.dtype, np.integer) or idx.shape != (k,):
        raise ValueError(
            f"topk must return indices as a 1-D integer array of exactly k={k} positions in grad.ravel(), "
            f"got {idx.dtype} of shape {idx.shape}"
        )
    if idx.min() < 0 or idx.max() >= n:
        raise ValueError(f"topk's indices must lie in [0, {n}) (grad.size), got {idx.min()}..{idx.max()}")
    if np.unique(idx).size != k:
        raise ValueError(f"topk's indices must be k={k} distinct positions, got {np.unique(idx).size} distinct")
    if not np.issubdtype(vals.dtype, np.number) or vals.shape != (k,):
        raise ValueError(f"topk must return values as k={k} numbers, got {vals.dtype} of shape {vals.shape}")
    if new_error.shape != grad.shape:
        raise ValueError(f"topk's new_error must have grad's shape {grad.shape}, got {new_error.shape}")


class OneBit:
    """1-bit compression with the student's pair: ``compress(grad, error) -> (signs,
    scale, new_error)`` (``signs``: a bool array of ``grad``'s shape, True for
    ``+scale``; ``scale``: one number) and ``decompress(signs, scale) -> array``.
    Its message per tensor: the signs packed 8 to a byte (``np.packbits``, row-major)
    then the scale as a float32. What the student's functions return is checked: a
    wrong shape or type raises ``ValueError`` saying which."""

    name = "onebit"

    def __init__(self, compress: OneBitFn, decompress: OneBitDecompressFn):
        if not (callable(compress) and callable(decompress)):
            raise ValueError(f"onebit needs two functions (compress, decompress), got {compress!r}, {decompress!r}")
        self.compress, self.decompress = compress, decompress

    def message_bytes(self, n: int) -> int:
        return message_bytes("onebit", n)

    def encode(self, grad: np.ndarray, error: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self.compress(grad, error)
        if not (isinstance(out, tuple) and len(out) == 3):
            raise ValueError(f"onebit(grad, error) must return (signs, scale, new_error), got {type(out).__name__}")
        signs, scale, new_error = (np.asarray(x) for x in out)
        if signs.dtype != np.bool_ or signs.shape != grad.shape:
            raise ValueError(
                f"onebit must return signs as a bool array of grad's shape {grad.shape} (True: +scale), "
                f"got {signs.dtype} of shape {signs.shape}"
            )
        if scale.size != 1 or not np.isfinite(scale).all():
            raise ValueError(f"onebit must return one finite scale per tensor, got {scale!r}")
        if new_error.shape != grad.shape:
            raise ValueError(f"onebit's new_error must have grad's shape {grad.shape}, got {new_error.shape}")
        scale_bytes = np.asarray([scale.item()], "<f4").view(np.uint8)
        return np.concatenate([np.packbits(signs.ravel()), scale_bytes]), new_error.astype(np.float32)

    def decode(self, message: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        n = int(np.prod(shape))
        nbits = -(-n // 8)
        signs = np.unpackbits(message[:nbits], count=n).astype(bool).reshape(shape)
        scale = np.float32(message[nbits : nbits + _SCALE_BYTES].copy().view("<f4")[0])
        out = np.asarray(self.decompress(signs, scale))
        if out.shape != tuple(shape):
            raise ValueError(f"onebit_decompress must return an array of shape {tuple(shape)}, got {out.shape}")
        return out

    def __repr__(self) -> str:
        return f"OneBit({getattr(self.compress, '__name__', self.compress)})"


def make_codec(method: str, student: Any, *, ratio: float = 0.01) -> TopK | OneBit:
    """The codec of ``method`` (``onebit`` or ``topk``, ``ratio`` of each tensor) around
    the functions of ``student``, the loaded ``compressors.py``; ``ValueError`` naming
    the functions it lacks."""
    fns = student_functions(student, method, getattr(student, "__file__", None) or "the student's file")
    return OneBit(*fns) if method == "onebit" else TopK(*fns, ratio)


class ErrorFeedback:
    """One rank's side of a compressed exchange: a residual per tensor (what was not
    sent yet, zeros at first) and the message of a step, every tensor's encoding
    (``codec``: :class:`TopK` or :class:`OneBit`) one after the other.

    :meth:`encode` takes this rank's gradients and returns its message (uint8, always
    :attr:`message_bytes` long), keeping the new residuals; :meth:`decode` takes every
    rank's messages, one after the other as an all-gather leaves them, and returns the
    average of the decoded gradients (summed in rank order: the same on every rank)."""

    def __init__(self, codec: TopK | OneBit, shapes: Sequence[Sequence[int]]):
        if not isinstance(codec, (TopK, OneBit)):
            raise ValueError(f"codec must be a TopK or OneBit, got {codec!r}")
        self.codec = codec
        self.shapes = [tuple(int(d) for d in s) for s in shapes]
        if not self.shapes or any(int(np.prod(s)) < 1 for s in self.shapes):
            raise ValueError(f"shapes must be a non-empty list of non-empty tensor shapes, got {self.shapes}")
        self.residuals = [np.zeros(s, np.float32) for s in self.shapes]
        self.sizes = [codec.message_bytes(int(np.prod(s))) for s in self.shapes]
        self.message_bytes = sum(self.sizes)

    def encode(self, *grads: np.ndarray) -> np.ndarray:
        if len(grads) != len(self.shapes):
            raise ValueError(f"encode takes {len(self.shapes)} gradients (one per tensor), got {len(grads)}")
        parts = []
        for i, g in enumerate(grads):
            g = np.asarray(g, np.float32)
            if not np.all(np.isfinite(g)):
                raise ValueError(f"tensor {i}: the gradient is not finite (NaN or inf: the training has diverged)")
            msg, self.residuals[i] = self.codec.encode(g, self.residuals[i])
            if msg.size != self.sizes[i]:
                raise ValueError(f"tensor {i}: a message of {msg.size} bytes, expected {self.sizes[i]}")
            parts.append(msg)
        return np.concatenate(parts)

    def decode(self, gathered: np.ndarray) -> list[np.ndarray]:
        gathered = np.asarray(gathered, np.uint8).ravel()
        if gathered.size == 0 or gathered.size % self.message_bytes:
            raise ValueError(f"gathered {gathered.size} bytes: not whole messages of {self.message_bytes} bytes")
        rows = gathered.reshape(-1, self.message_bytes)
        out = [np.zeros(s, np.float32) for s in self.shapes]
        for row in rows:
            start = 0
            for i, (shape, size) in enumerate(zip(self.shapes, self.sizes, strict=True)):
                out[i] += self.codec.decode(row[start : start + size], shape)
                start += size
        return [(o / np.float32(len(rows))).astype(np.float32) for o in out]

    def error_norm(self) -> float:
        """The L2 norm of all residuals together: with error feedback it stays bounded."""
        return float(np.sqrt(sum(float(np.sum(np.square(r, dtype=np.float64))) for r in self.residuals)))

    def __repr__(self) -> str:
        return f"<ErrorFeedback {self.codec!r}: {len(self.shapes)} tensors, {self.message_bytes:,} bytes a message>"
