"""Reading what a student controls, as the grader (often root), without following it elsewhere.

A submission folder may come from an extracted archive, and a graded notebook's folder is
written by the student's kernel while processes it left may still run: either can hold a
link to a file only root may read, a FIFO that blocks a reader for ever, or a file swapped
for a link between a check and a read. Everything here opens one component at a time with
``O_NOFOLLOW`` and checks what it opened (``fstat``), never what a path named a moment before:

- :func:`read_plain`: a plain file's bytes, up to a cap;
- :func:`plain_files`: the plain files of a folder (relative paths), and what was refused;
- :func:`copy_plain` and :func:`hash_plain`: a folder's plain files copied, or hashed.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

__all__ = ["read_plain", "plain_files", "copy_plain", "hash_plain", "refused_flags"]


def _open_file(path: Path | str, dir_fd: int | None = None) -> int | None:
    """A read descriptor of ``path`` when it is a plain file (no link followed), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_plain(path: Path | str, cap: int, dir_fd: int | None = None) -> bytes | int | None:
    """The bytes of ``path`` when it is a plain file (opened without following a link) of at
    most ``cap`` bytes; its size when larger; None when it is missing or not a plain file."""
    fd = _open_file(path, dir_fd)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > cap:
            return size
        data = f.read(size + 1)  # a file still growing: what it held when it was opened, and one byte
    return data if len(data) <= cap else len(data)


def plain_files(folder: Path | str) -> tuple[list[str], list[tuple[str, str]]]:
    """``(plain files, refused)`` under ``folder``: the relative paths of its plain files, in
    order, and ``(relative path, what it is)`` of every link, device, FIFO or socket, which
    are neither followed nor read. ``folder`` itself must be a real folder (OSError)."""
    top = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    files, refused = [], []
    try:
        for dirpath, dirs, names, dir_fd in os.fwalk(dir_fd=top):
            rel = os.path.relpath(dirpath, ".")
            for name in sorted(dirs + names):
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                path = name if rel == "." else os.path.join(rel, name)
                if stat.S_ISREG(st.st_mode):
                    files.append(path)
                elif not stat.S_ISDIR(st.st_mode):
                    kind = "a link" if stat.S_ISLNK(st.st_mode) else "a special file"
                    refused.append((path, kind))
    finally:
        os.close(top)
    return sorted(files), refused


def _read_rel(folder: Path, rel: str, cap: int = 2**40) -> bytes | None:
    """``folder/rel``'s bytes (None above ``cap``), every component opened without following a link."""
    parts = rel.split(os.sep)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        data = read_plain(parts[-1], cap, dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, bytes) else None


def copy_plain(src: Path | str, dest: Path | str, cap: int = 2**40) -> list[tuple[str, str]]:
    """Copy the plain files of ``src`` into ``dest`` (made); returns what was refused
    (:func:`plain_files`, and each file above ``cap`` bytes): nothing a link points to is ever read."""
    src, dest = Path(src), Path(dest)
    files, refused = plain_files(src)
    dest.mkdir(parents=True, exist_ok=True)
    for rel in files:
        data = _read_rel(src, rel, cap)
        if data is None:  # changed under us, or too large: refused
            refused.append((rel, "changed while copied, or above the size allowed"))
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)
    return refused


def hash_plain(folder: Path | str) -> str:
    """SHA-256 of ``folder``'s plain files (names and contents) and of the names of what it refused."""
    folder = Path(folder)
    h = hashlib.sha256()
    files, refused = plain_files(folder)
    for rel in files:
        h.update(rel.encode() + b"\0" + (_read_rel(folder, rel) or b"") + b"\0")
    for rel, what in refused:
        h.update(f"refused {rel} {what}".encode() + b"\0")
    return h.hexdigest()


def refused_flags(refused: list[tuple[str, str]]) -> list[dict]:
    """One flag per entry of a submission folder that was not copied."""
    return [
        {
            "kind": "symlink refused" if what == "a link" else "file refused",
            "detail": f"{rel} is {what}: not copied, not read (only plain files are graded)",
        }
        for rel, what in refused
    ]
