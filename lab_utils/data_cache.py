"""Decoded datasets kept once per user, as read-only memory-mapped ``.npy`` files.

Every process of a run (the kernel, each worker, each rank) used to decode the whole
dataset into its own private memory: under Binder's 2 GB, Lab 5's CIFAR-10 bytes
(184 MB) were held once per process, and decoding them cost a transient 360 MB and a
few seconds of CPU each time. Here the first load decodes the source once and writes
the arrays to ``<cache>/<name>-<key>/``; every later load, in any process, maps those
files read-only (``np.load(mmap_mode="r")``). The pages are the kernel's page cache:
one copy for all the processes that map them, counted once in the session's memory,
and clean, so that under pressure the kernel can drop them and read them again rather
than kill a process.

``<cache>`` is ``LABS_CACHE_DIR``, else ``$XDG_CACHE_HOME/lab_utils``, else
``~/.cache/lab_utils``, created private to its user (mode 700); ``LABS_CACHE_DIR=off``
turns the cache off. ``<key>`` is a digest of the source files' names, inodes, sizes and
times, not their folders (the same files seen through another mount are the same entry):
a source replaced or edited gets a new entry, and a dataset keeps its :data:`KEEP` newest
entries. An entry appears whole or not at all (written beside, then renamed into place);
one that cannot be read is rebuilt. An entry is read wherever it is (a grader's read-only
copy, say); only a folder of this user's own is written. Where nothing can be written (a
read-only home, a full disk, a folder owned by someone else) the load goes on with the
decoded arrays in this process's memory, as before, and says why on stderr.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from lab_utils import config

__all__ = ["CACHE_VERSION", "cache_root", "fingerprint", "mapped"]

#: Raised when the layout of an entry changes: entries of older versions are rebuilt.
CACHE_VERSION = 1
#: Arrays smaller than this are read into memory (labels): mapping them saves nothing.
MAP_AT_LEAST = 1 << 20
#: Entries kept per dataset (the newest): one source per dataset is the rule, a few is a
#: developer switching between the real files and the stand-ins.
KEEP = 3


def cache_root(env=None) -> Path | None:
    """Where entries go (see the module docstring); None when ``LABS_CACHE_DIR=off``."""
    value = config.get("LABS_CACHE_DIR", env)
    if value == "off":
        return None
    if value:
        return Path(value).expanduser()
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "lab_utils"


def fingerprint(paths: Iterable[Path]) -> str:
    """A digest of the files' names, inodes, sizes and change and modification times (and
    the cache's version): it changes when any of them is replaced or edited."""
    h = hashlib.sha256(f"lab_utils-cache-v{CACHE_VERSION}".encode())
    for path in paths:
        st = path.stat()
        h.update(f"{path.name}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\n".encode())
    return h.hexdigest()[:20]


def _say(message: str) -> None:
    print(f"lab_utils: {message}", file=sys.stderr, flush=True)


def _private_dir(root: Path) -> None:
    """``root`` exists, is a folder of this user and nobody else can write it, or OSError."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.stat()
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{root} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o022:
        raise PermissionError(f"{root} can be written by other users (mode {st.st_mode & 0o777:o})")


def _open(entry: Path, names: Iterable[str]) -> dict[str, np.ndarray]:
    """An entry's arrays: the large ones mapped read-only, the small ones read."""
    arrays = {}
    for name in names:
        path = entry / f"{name}.npy"
        if path.stat().st_size >= MAP_AT_LEAST:
            arrays[name] = np.asarray(np.load(path, mmap_mode="r", allow_pickle=False))
        else:
            arrays[name] = np.load(path, allow_pickle=False)
    return arrays


def _write(root: Path, entry: Path, arrays: dict[str, np.ndarray]) -> None:
    """The arrays as ``entry``, whole or not at all: written in a folder beside it, renamed."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=root))
    try:
        for name, array in arrays.items():
            with open(tmp / f"{name}.npy", "wb") as f:
                np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        try:
            os.rename(tmp, entry)
        except OSError:
            if not entry.is_dir():  # another process renamed its own copy first: keep that one
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_older(root: Path, name: str) -> None:
    """This dataset's entries past the :data:`KEEP` newest (older sources, older versions). A
    process that maps one keeps its pages: an unlinked file lives on until it is unmapped."""

    def age(entry: Path) -> float:
        try:
            return entry.stat().st_mtime
        except FileNotFoundError:  # another process removed it just now
            return 0.0

    entries = sorted((p for p in root.glob(f"{name}-*") if p.is_dir()), key=age, reverse=True)
    for old in entries[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)


def mapped(
    name: str,
    sources: list[Path],
    names: tuple[str, ...],
    build: Callable[[], dict[str, np.ndarray]],
    *,
    what: str | None = None,
) -> tuple[dict[str, np.ndarray], bool]:
    """``build()``'s arrays (``names``), from this user's cache when an entry for ``sources``
    is there, else built now and written there for the next process. Returns ``(arrays,
    mapped)``: ``mapped`` is False when the cache is off or could not be used (the arrays are
    then ``build()``'s own, in memory). ``what`` names the data in messages."""
    what = what or name
    root = cache_root()
    if root is None:
        return build(), False
    try:
        key = fingerprint(sources)
    except OSError:  # a source is missing or unreadable: build() meets it too, and names it in its error
        return build(), False
    entry = root / f"{name}-{key}"
    if entry.is_dir():
        try:
            return _open(entry, names), True
        except (OSError, ValueError) as exc:  # damaged: truncated, edited, unreadable
            _say(f"the cached {what} in {entry} cannot be read ({exc.__class__.__name__}: {exc}); decoding it again")
            shutil.rmtree(entry, ignore_errors=True)
    arrays = build()
    if sorted(arrays) != sorted(names):
        raise ValueError(f"{what}: built {sorted(arrays)}, expected {sorted(names)}")
    try:
        _private_dir(root)
        _write(root, entry, arrays)
        _remove_older(root, name)
        return _open(entry, names), True
    except (OSError, ValueError) as exc:
        _say(
            f"could not keep {what} in {root} ({exc.__class__.__name__}: {exc}): this process holds its own copy "
            "(set LABS_CACHE_DIR to a folder you can write, or LABS_CACHE_DIR=off)"
        )
        return arrays, False
