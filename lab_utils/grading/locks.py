"""The grader's locks: in a folder only the grader may write, opened without following links,
and never waited on without a deadline.

::

    folder = lock_dir()                      # /run/labgrade as root, else this user's own
    with held(folder / "timing.lock", deadline_s=600) as got:
        ...                                  # got is False when the deadline passed first

A student's code never sees these files (its kernel's view holds none of them,
:mod:`lab_utils.grading.view`), and another user of the machine cannot create, replace or
hold them: the folder is the grader's alone, and a lock file that is not a plain file of
the grader's own is refused.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from contextlib import contextmanager
from pathlib import Path

__all__ = ["lock_dir", "open_lock", "acquire", "held", "LockError"]

#: root's lock folder (machine-wide: two batches, or two Slurm elements on one node, share it)
ROOT_LOCKS = Path("/run/labgrade")


class LockError(RuntimeError):
    """A lock folder or file that someone else controls."""


def _private(path: Path) -> None:
    """Refuse ``path`` (a folder) unless it is a real folder of this user that nobody else may write."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise LockError(f"{path} is not the grader's own folder (owner uid {st.st_uid}, mode {st.st_mode & 0o7777:o})")


def lock_dir() -> Path:
    """The grader's lock folder, made when missing: ``/run/labgrade`` where ``/run`` is writable
    (root; 0755),
    else ``$XDG_RUNTIME_DIR/labgrade`` or ``~/.cache/labgrade/locks`` (0700)."""
    if os.access(ROOT_LOCKS.parent, os.W_OK):  # /run: root's
        folder = ROOT_LOCKS
        mode = 0o755
    else:
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        base = Path(runtime) if runtime and Path(runtime).is_dir() else Path.home() / ".cache"
        folder, mode = base / "labgrade" / "locks", 0o700
    folder.mkdir(mode=mode, parents=True, exist_ok=True)
    _private(folder)
    return folder


def open_lock(path: Path | str) -> int:
    """A descriptor of the lock file ``path`` (made when missing, 0600): a plain file of this
    user's, opened without following a link; LockError otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise LockError(f"cannot open the lock {path}: {exc.strerror}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise LockError(f"{path} is not a lock file of the grader's own (owner uid {st.st_uid})")
    return fd


def acquire(fd: int, deadline_s: float | None, poll_s: float = 0.05) -> bool:
    """Take ``fd``'s exclusive lock: True once held, False when ``deadline_s`` passed first
    (None: wait as long as it takes; 0: one try)."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(poll_s)  # polling a lock another grader holds, under a deadline


@contextmanager
def held(path: Path | str, deadline_s: float | None):
    """Hold the lock ``path`` for the ``with`` block; yields whether it was taken in time."""
    fd = open_lock(path)
    try:
        got = acquire(fd, deadline_s)
        try:
            yield got
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
