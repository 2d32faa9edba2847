"""The datasets' files themselves: fetching one under a deadline, and reading CIFAR-10's.

:mod:`lab_utils.data` decides where a dataset comes from (``LABS_DATA_DIR``, the Keras
cache, a download, the offline fallbacks) and what a :class:`~lab_utils.data.Dataset`
holds; this module knows the files, and nothing of those sources:

- :func:`download`: a URL into a file, within a deadline (even a stalled DNS lookup), and
  only if its SHA-256 is the one expected: nothing half-written or corrupt is left behind;
- CIFAR-10's python version (``cifar-10-python.tar.gz``, its ``cifar-10-batches-py/``
  folder of pickled batches), read from the folder or streamed from the archive in place,
  with an unpickler that loads arrays and nothing else, and every kind of damage reported
  as a ``ValueError`` naming the file (:func:`read_cifar_folder`, :func:`read_cifar_tarball`);
- :func:`cifar_images`, the batches' channel-major rows as one NHWC uint8 array, and
  :func:`give_back_freed_heap`, what decoding them leaves to the system.

Python and numpy only; no TensorFlow, no network but :func:`download`'s.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import tarfile
import tempfile
import threading
import urllib.error
import urllib.request
import zlib
from pathlib import Path, PurePosixPath

import numpy as np

__all__ = [
    "CIFAR_BATCHES",
    "CIFAR_DIRNAME",
    "CIFAR_PIXELS",
    "CIFAR_TARBALL",
    "cifar_images",
    "download",
    "file_sha256",
    "give_back_freed_heap",
    "read_cifar_batch",
    "read_cifar_folder",
    "read_cifar_tarball",
]

CIFAR_DIRNAME = "cifar-10-batches-py"  # the folder inside the archive, and Keras' cache folder
CIFAR_TARBALL = "cifar-10-python.tar.gz"  # the archive's name on www.cs.toronto.edu
CIFAR_BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
CIFAR_PIXELS = 32 * 32 * 3


# ------------------------------------------------------------------- downloads
def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def download(url: str, dest: Path, timeout: float, sha256: str) -> None:
    """Fetch ``url`` into ``dest`` within ``timeout`` seconds overall, or raise; ``dest`` appears
    only whole and with the SHA-256 ``sha256`` (hex digits).

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
        if file_sha256(tmp) != sha256:
            raise OSError(f"download of {url} is corrupt (SHA-256 mismatch)")
        os.replace(tmp, dest)
    finally:
        if tmp.exists() and not t.is_alive():
            tmp.unlink()


# ------------------------------------------------------- CIFAR-10's pickled batches
class _BatchUnpickler(pickle.Unpickler):
    """Unpickles a CIFAR-10 batch and nothing else: a batch holds a dict of
    bytes, lists and one uint8 array, so the only globals it may name are
    numpy's array and dtype constructors (and ``_codecs.encode``, which Python 3
    uses for bytes at protocol 2). Anything else (which could run code) is refused."""

    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),  # protocols 2-4, numpy 1.x
        ("numpy._core.multiarray", "_reconstruct"),  # the same, written by numpy 2
        ("numpy.core.numeric", "_frombuffer"),  # protocol 5
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("_codecs", "encode"),  # how Python 3 writes bytes at protocol 2 (the array's raw data)
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a CIFAR-10 batch holds only arrays")
        return super().find_class(module, name)


def read_cifar_batch(f, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch from the open binary file ``f`` -> (uint8 (N, 3072), int64 (N,)).
    ``where`` names the file in errors."""
    try:
        batch = _BatchUnpickler(f, encoding="bytes").load()
    except Exception as exc:  # pickle reports damage as UnpicklingError, EOFError, ValueError, TypeError, ...
        raise ValueError(
            f"{where}: not a readable CIFAR-10 batch ({exc.__class__.__name__}: {exc}): truncated or corrupt? "
            "Delete it, or replace it with a fresh copy of cifar-10-python.tar.gz"
        ) from exc
    if not isinstance(batch, dict):
        raise ValueError(f"{where}: a CIFAR-10 batch is a pickled dict, this holds a {type(batch).__name__}")
    batch = {k.decode("utf-8", "replace") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ValueError(
            f"{where}: a CIFAR-10 batch has 'data' and 'labels' entries, this has {sorted(map(str, batch))}"
        )
    x = batch["data"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != CIFAR_PIXELS:
        got = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
        raise ValueError(f"{where}: CIFAR-10 'data' must be a uint8 array of shape (N, {CIFAR_PIXELS}), got {got}")
    try:
        y = np.asarray(batch["labels"], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: CIFAR-10 'labels' must be a list of ints ({exc})") from exc
    if y.shape != (len(x),):
        raise ValueError(f"{where}: {len(x)} images but labels of shape {y.shape}")
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{where}: CIFAR-10 labels must lie in 0-9, got [{y.min()}, {y.max()}]")
    return x, y


def read_cifar_folder(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    batches = {}
    for name in CIFAR_BATCHES:
        path = folder / name
        if not path.is_file():
            raise ValueError(
                f"{path} is missing: {folder} is an incomplete CIFAR-10 folder (it needs {', '.join(CIFAR_BATCHES)})"
            )
        with open(path, "rb") as f:
            batches[name] = read_cifar_batch(f, str(path))
    return batches


def read_cifar_tarball(archive: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The batches of a ``cifar-10-python.tar.gz``, read in one streaming pass
    (no extraction to disk, no seeking back through the gzip stream)."""
    batches = {}
    try:
        with tarfile.open(archive, mode="r|gz") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if member.isfile() and len(parts) >= 2 and parts[-2] == CIFAR_DIRNAME and parts[-1] in CIFAR_BATCHES:
                    f = tar.extractfile(member)
                    batches[parts[-1]] = read_cifar_batch(f, f"{archive}:{member.name}")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise ValueError(
            f"{archive}: not a readable CIFAR-10 archive (truncated or corrupt? {exc.__class__.__name__}: {exc})"
        ) from exc
    missing = [name for name in CIFAR_BATCHES if name not in batches]
    if missing:
        raise ValueError(f"{archive}: no {', '.join(f'{CIFAR_DIRNAME}/{m}' for m in missing)} inside")
    return batches


def cifar_images(parts: list[np.ndarray]) -> np.ndarray:
    """uint8 (N, 3072) rows, channel-major (1024 R, 1024 G, 1024 B, each row by
    row), one array per batch -> one C-contiguous uint8 (sum N, 32, 32, 3) array
    (:func:`lab_utils.data.pixels` turns it into float32 in [0, 1]). Each batch is written
    into the result in place: no concatenated copy."""
    out = np.empty((sum(len(x) for x in parts), 32, 32, 3), dtype=np.uint8)
    start = 0
    for x in parts:
        out[start : start + len(x)] = x.reshape(len(x), 3, 32, 32).transpose(0, 2, 3, 1)
        start += len(x)
    return out


def give_back_freed_heap() -> None:
    """Hand the heap pages that decoding freed back to the system (glibc's ``malloc_trim``).

    Unpickling a CIFAR-10 batch makes tens of MB of temporary strings. Once the first of
    them is freed, glibc raises its mmap threshold, so the later ones come from the heap,
    and freeing them leaves about 150 MB that the process would hold, unused, for the rest
    of its life: in each rank and each kernel of Lab 5, under a 2 GB limit. Without glibc
    (musl, macOS) there is no such function, and nothing to do."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc: its allocator gives memory back by itself, or not at all
        return
    trim(0)
