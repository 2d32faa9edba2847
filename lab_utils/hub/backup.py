"""Back up, and restore, what a class cannot make again: the hand-in store and the gradebook.

    sudo python -P -m lab_utils.hub backup --store /srv/handin --course /var/lib/labs/grading /var/backups/labs
    sudo python -P -m lab_utils.hub restore /var/backups/labs/labs-20261204T235901Z.tar.gz --store /srv/handin --course /var/lib/labs/grading

A backup is one ``.tar.gz`` (mode 600: it holds every student's work): ``store/`` (hand-ins with
their receipts, and returned feedback; not the bodies still arriving) and ``gradebook.db`` (a
consistent copy, taken with SQLite's own backup, while the grader may be writing). Each
hand-in's notebook is checked against its receipt's sha256 on the way out and on the way back.

A restore refuses a store that already holds hand-ins, unless ``--replace``: the store and
gradebook there are then kept beside, as ``<name>.before-restore-<time>``, never deleted. What it
restores belongs to the store's owner (the hand-in service's account) and the course's group.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sqlite3
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from .store import RECEIPT, durable_file

__all__ = ["backup", "restore", "hand_ins_of"]

GRADEBOOK = "gradebook.db"


class BackupError(RuntimeError):
    """A backup or restore that cannot be done, and why."""


def hand_ins_of(store: Path) -> dict[str, str]:
    """Each hand-in under ``store`` (its path from the store) and the sha256 its receipt gives;
    BackupError when a notebook differs from its receipt."""
    found = {}
    for receipt in sorted((store / "submitted").glob(f"*/*/*/{RECEIPT}")):
        meta = json.loads(receipt.read_text())
        notebook = receipt.parent / f"{meta['lab']}.ipynb"
        digest = hashlib.sha256(notebook.read_bytes()).hexdigest() if notebook.is_file() else None
        if digest != meta["sha256"]:
            raise BackupError(f"{notebook} does not match its receipt ({RECEIPT}: sha256 {meta['sha256'][:12]})")
        found[str(notebook.relative_to(store))] = digest
    return found


def _gradebook_copy(db: Path, into: Path) -> None:
    """A consistent copy of the SQLite database ``db`` (its writers may go on meanwhile)."""
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        dst = sqlite3.connect(into)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def backup(store: Path, course: Path, dest: Path, now: datetime | None = None) -> Path:
    """``dest/labs-<UTC time>.tar.gz`` of ``store`` and ``course``'s gradebook; returns it."""
    store, course, dest = Path(store), Path(course), Path(dest)
    if not (store / "submitted").is_dir() and not (store / "feedback").is_dir():
        raise BackupError(f"{store} holds no hand-in store (no submitted/ or feedback/)")
    hand_ins = hand_ins_of(store)
    has_gradebook = (course / GRADEBOOK).is_file()  # one answer, for the archive and its index alike
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    out = dest / f"labs-{stamp}.tar.gz"
    # mode 600, whole or not at all: the tar is closed (its gzip trailer written) before the file is synced
    with durable_file(out, prefix=".labs-", suffix=".part") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for kind in ("submitted", "feedback"):
            if (store / kind).is_dir():
                tar.add(store / kind, arcname=f"store/{kind}")
        if has_gradebook:
            with tempfile.TemporaryDirectory() as tmp:
                _gradebook_copy(course / GRADEBOOK, Path(tmp) / GRADEBOOK)
                tar.add(Path(tmp) / GRADEBOOK, arcname=GRADEBOOK)
        index = json.dumps({"hand_ins": hand_ins, "gradebook": has_gradebook}).encode()
        info = tarfile.TarInfo("index.json")
        info.size, info.mtime = len(index), int(datetime.now(UTC).timestamp())
        tar.addfile(info, io.BytesIO(index))
    print(
        f"backed up {len(hand_ins)} hand-in(s)"
        + (" and the gradebook" if has_gradebook else " (no gradebook yet)")
        + f" into {out}"
    )
    return out


def _set_aside(path: Path, stamp: str) -> Path | None:
    if not path.exists():
        return None
    aside = path.with_name(f"{path.name}.before-restore-{stamp}")
    path.rename(aside)
    return aside


def _own(path: Path, uid: int, gid: int, dir_mode: int, file_mode: int) -> None:
    """``path`` and all under it: owned by ``uid``:``gid``, with the modes given."""
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        st = p.lstat()
        if (st.st_uid, st.st_gid) != (uid, gid):
            try:
                os.chown(p, uid, gid, follow_symlinks=False)
            except PermissionError:
                raise BackupError(
                    f"cannot give {p} to uid {uid}, gid {gid}: restore as root (or as the store's owner)"
                ) from None
        os.chmod(p, dir_mode if p.is_dir() else file_mode)


def restore(archive: Path, store: Path, course: Path, replace: bool = False) -> dict:
    """Put ``archive`` (a :func:`backup`) back into ``store`` and ``course``; returns what it
    restored (``hand_ins``, ``gradebook``, ``kept_aside``)."""
    archive, store, course = Path(archive), Path(store), Path(course)
    if not course.is_dir():
        raise BackupError(f"{course} is no course folder (make it first: the class's setup lays it out)")
    if store.exists() and any((store / "submitted").glob("*")) and not replace:
        raise BackupError(
            f"{store} already holds hand-ins: restore into an empty store, or add --replace (what is "
            "there now is then kept beside it, as .before-restore-<time>)"
        )
    parent = store.parent
    with tempfile.TemporaryDirectory(dir=parent, prefix=".restore-") as tmp:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(tmp, filter="data")
        got = Path(tmp)
        index = json.loads((got / "index.json").read_text())
        restored = hand_ins_of(got / "store")
        if restored != index["hand_ins"]:
            missing = sorted(set(index["hand_ins"]) - set(restored))
            raise BackupError(f"{archive} is incomplete: {len(missing)} hand-in(s) missing, e.g. {missing[:3]}")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        owner = (store if store.exists() else parent).stat()
        (got / "store" / "incoming").mkdir(exist_ok=True)
        _own(got / "store", owner.st_uid, owner.st_gid, 0o700, 0o600)
        if index["gradebook"]:
            group = course.stat()
            _own(got / GRADEBOOK, group.st_uid, group.st_gid, 0o770, 0o660)
        kept = [p for p in (_set_aside(store, stamp),) if p]
        (got / "store").rename(store)
        if index["gradebook"]:
            aside = _set_aside(course / GRADEBOOK, stamp)
            kept += [aside] if aside else []
            shutil.move(got / GRADEBOOK, course / GRADEBOOK)
    print(
        f"restored {len(restored)} hand-in(s)"
        + (" and the gradebook" if index["gradebook"] else "")
        + f" from {archive}"
        + "".join(f"; kept {p}" for p in kept)
    )
    return {"hand_ins": restored, "gradebook": index["gradebook"], "kept_aside": kept}
