"""The hand-in store: what students hand in and the feedback returned to them, on the
hand-in service's own disk (never on a volume a student's server mounts).

::

    store = Store(root, due={"02_ps_async": datetime(2026, 12, 1, 23, 59, tzinfo=UTC)})
    receipt = store.hand_in("alice", "02_ps_async", notebook_bytes)   # Receipt(..., late=False)
    store.collect("02_ps_async", dest)      # dest/<key>/02_ps_async/02_ps_async.ipynb + timestamp.txt
    store.put_feedback("alice", "02_ps_async", "02_ps_async.html", html)
    store.feedback("alice", "02_ps_async")  # {"02_ps_async.html": b"..."}: hers only

Who is who is the caller's business (the service takes it from the Hub's token, never from
the request); this module only keeps each student's files apart and never lets a name or a
lab reach outside its folder. Layout, every folder mode 700:

    <root>/submitted/<key>/<lab>/<stamp>/<lab>.ipynb     one folder per hand-in
    <root>/submitted/<key>/<lab>/<stamp>/receipt.json    what the student was told, read back
    <root>/feedback/<key>/<lab>/<file>.html              replaced by each return
    <root>/incoming/                                     bodies on their way in (the service's)

``<key>`` is the student's name as a folder name (:func:`safe_name`); ``<stamp>`` is the
service's UTC clock when the hand-in arrived (a student cannot set it), as
``20261126T081500.123456Z``; late means after the lab's due time. A hand-in exists once its
``receipt.json`` does: both files and their folder are on disk (``fsync``) before it is written,
and it is written before the student is answered, so a receipt a student holds names a file
that survives a crash.

Limits, so that one student cannot stop another from handing in: each student keeps their last
:attr:`Store.keep` hand-ins of a lab, plus their last on-time one and their first late one (what
a late policy needs), and at most :attr:`Store.quota` bytes in all; nothing is taken once the
disk's free space would fall below :attr:`Store.min_free` (507, which says so).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime, timedelta
from hashlib import sha256
from pathlib import Path
from typing import BinaryIO

from ..grading.late import DueFile

__all__ = [
    "Store",
    "Receipt",
    "Incoming",
    "HandInError",
    "MAX_NOTEBOOK_BYTES",
    "MAX_FEEDBACK_BYTES",
    "MAX_ELEMENTS",
    "check_notebook",
    "safe_name",
    "student_of",
    "valid_key",
    "write_submission",
]

#: A handed-in notebook larger than this is refused (the labs' notebooks are well under 5 MB
#: with their figures; the grader cuts huge outputs anyway).
MAX_NOTEBOOK_BYTES = 20 * 2**20
#: A feedback page larger than this is refused.
MAX_FEEDBACK_BYTES = 20 * 2**20
#: JSON elements (values in lists, members of objects, containers) a notebook may hold: what
#: bounds the memory its parsing takes (about 40 bytes each at most, measured), whatever its
#: size. A lab notebook with every output holds a few thousand; a long training log, tens of
#: thousands.
MAX_ELEMENTS = 500_000
_STAMP = "%Y%m%dT%H%M%S.%fZ"
_LAB = re.compile(r"^[0-9]{2}_[a-z0-9_]+$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}\.html$")
_KEY = re.compile(r"^(?!\.)(?:[A-Za-z0-9_@+.-]|%[0-9A-F]{2})+(?:~[0-9a-f]{16})?$")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
#: A folder name longer than this (bytes) is cut, and the cut marked by a hash of the whole name.
_KEY_BYTES = 120
RECEIPT = "receipt.json"


class HandInError(ValueError):
    """A hand-in or a return the store refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Receipt:
    """One hand-in, as the store keeps it (and as the student was told)."""

    student: str
    lab: str
    stamp: str  # the service's UTC clock at arrival, _STAMP format
    sha256: str
    size: int
    late: bool

    @property
    def time(self) -> datetime:
        return datetime.strptime(self.stamp, _STAMP).replace(tzinfo=UTC)

    @property
    def key(self) -> str:
        """The student's folder name: how the instructor's routes and ``collect`` name them."""
        return safe_name(self.student)

    def to_json(self) -> dict:
        return {**asdict(self), "time": self.time.isoformat(), "key": self.key}

    @classmethod
    def from_json(cls, data: dict) -> Receipt:
        """The receipt :meth:`to_json` wrote (``time`` and ``key`` are derived)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def __repr__(self) -> str:  # what a notebook shows under hand_in(): one line, not the fields
        when = self.time.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"<hand-in of {self.lab} by {self.student} at {when}, {'LATE' if self.late else 'on time'}, sha256 {self.sha256[:12]}>"


def safe_name(name: str) -> str:
    """A Hub user name as a folder name: letters, digits and ``._@+-`` kept, anything else
    (``/``, spaces, ``%``, ``~``, non-ASCII) as ``%XX`` of its UTF-8 bytes; never ``.``-led.
    A name whose folder name would pass 120 bytes keeps a readable head and ``~`` plus a hash
    of the whole name (file systems refuse names over 255 bytes); its receipts keep the name."""
    if not isinstance(name, str) or not name:
        raise HandInError(f"a student name must be a non-empty string, got {name!r}")
    out = "".join(
        c if c.isascii() and (c.isalnum() or c in "_@+-.") else "".join(f"%{b:02X}" for b in c.encode()) for c in name
    )
    out = "%2E" + out[1:] if out.startswith(".") else out
    if len(out) > _KEY_BYTES:
        head = out[: _KEY_BYTES - 17]
        head = re.sub(r"%[0-9A-F]?$", "", head)  # never half an escape
        out = f"{head}~{sha256(name.encode()).hexdigest()[:16]}"
    return out


def student_of(folder: str) -> str:
    """The student name :func:`safe_name` made ``folder`` from (a cut name: its readable head;
    the whole name is in its receipts)."""
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), folder.split("~")[0].encode()).decode(
        "utf-8", "replace"
    )


def valid_key(key: str) -> str:
    """``key`` if it is a folder name :func:`safe_name` can make, else HandInError (404)."""
    if not isinstance(key, str) or not _KEY.match(key) or len(key) > _KEY_BYTES:
        raise HandInError(f"no student folder {key!r}", 404)
    return key


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def durable_file(path: Path, prefix: str = ".incoming-", suffix: str = "") -> Iterator[BinaryIO]:
    """A new file (mode 600) beside ``path`` to write in the block; when the block ends it is
    synced, renamed to ``path`` and its folder synced: on disk, whole, before the block's
    next line. If the block raises, it is removed and ``path`` is untouched."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _write_durable(path: Path, data: bytes) -> None:
    """``data`` as ``path``, on disk before this returns (:func:`durable_file`)."""
    with durable_file(path) as f:
        f.write(data)


def _disk_full(exc: OSError) -> HandInError:
    return HandInError(
        f"the hand-in store has no room left ({exc.strerror}): nothing was kept; tell your instructor", 507
    )


def count_elements(data: bytes) -> int:
    """How many JSON elements ``data`` holds, at most: separators and containers, first counted
    in the raw bytes (an upper bound, at C speed), and outside strings only where that bound is
    above :data:`MAX_ELEMENTS`."""
    marks = b",:{["
    upper = sum(data.count(bytes([m])) for m in marks)
    if upper <= MAX_ELEMENTS:
        return upper
    bare = _STRING.sub(b'""', data)
    return sum(bare.count(bytes([m])) for m in marks)


def check_notebook(data: bytes) -> None:
    """Refuse what cannot be a notebook: empty, too large, too many elements to parse within the
    service's memory, not JSON (or nested past the parser's depth), or no list of cells. (What is
    in the cells is the grader's business: it grades anything, flagging what it must.)"""
    if not data.strip():
        raise HandInError("the file is empty: an empty file is not a hand-in (save the notebook, then hand it in)")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise HandInError(
            f"the notebook is {len(data) / 2**20:.1f} MB, above the {MAX_NOTEBOOK_BYTES // 2**20} MB a hand-in may be: "
            "clear the outputs of the largest cells (Edit > Clear Outputs), save, and hand in again",
            413,
        )
    n = count_elements(data)
    if n > MAX_ELEMENTS:
        raise HandInError(
            f"the notebook holds {n:,} JSON elements, above the {MAX_ELEMENTS:,} a hand-in may hold: clear the "
            "outputs of the cells that print the most (Edit > Clear Outputs), save, and hand in again",
            413,
        )
    try:
        nb = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandInError(f"this is not a notebook file (not JSON: {exc})") from None
    except RecursionError:
        raise HandInError("this is not a notebook file (JSON nested deeper than a notebook is)") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise HandInError("this is not a notebook file (no list of cells)")


class Incoming:
    """A body on its way in, written to the store's disk as it arrives (never held in memory);
    hashed when it is checked (off the service's event loop). ``discard()`` when it is not kept."""

    def __init__(self, folder: Path, limit: int):
        self.limit, self.size, self.kept, self.sha256 = limit, 0, False, None
        fd, name = tempfile.mkstemp(dir=folder, prefix="body-")
        self.path, self._file = Path(name), os.fdopen(fd, "wb")

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.limit:
            raise HandInError(f"the body passes {self.limit // 2**20} MB, the most a hand-in may be", 413)
        try:
            self._file.write(chunk)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(exc) from None
            raise

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()

    def discard(self) -> None:
        """Remove the body unless the store kept it (then it is a hand-in, elsewhere)."""
        if not self._file.closed:
            self._file.close()
        if not self.kept:
            self.path.unlink(missing_ok=True)


class Store:
    """Hand-ins and feedback under ``root``; ``due`` maps each lab that may be handed in to its
    due time (aware datetime) or None (no due time), or is the class's due file
    (:class:`~lab_utils.grading.late.DueFile`, read again when it changes; a lab it no longer
    names is closed for hand-in, and its hand-ins are still collected). ``keep``: hand-ins kept per student and
    lab (besides the last on-time and first late one); ``quota``: bytes a student's kept hand-ins
    may hold in all; ``min_free``: bytes of disk that a hand-in may not take."""

    def __init__(
        self,
        root: str | os.PathLike,
        due: dict[str, datetime | None] | DueFile,
        *,
        keep: int = 5,
        quota: int = 200 * 2**20,
        min_free: int = 256 * 2**20,
    ):
        if not isinstance(due, DueFile):
            bad = [lab for lab in due if not _LAB.match(lab)]
            if bad:
                raise ValueError(f"lab names look like 02_ps_async; got {bad}")
            naive = [lab for lab, t in due.items() if t is not None and t.tzinfo is None]
            if naive:
                raise ValueError(f"due times need a time zone (e.g. 2026-12-01T23:59:00+01:00); naive for {naive}")
            due = dict(due)
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.root, self._due = Path(root), due
        self.keep, self.quota, self.min_free = keep, quota, min_free
        for folder in (self.root, self.root / "incoming"):
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(folder, 0o700)
        for stale in (self.root / "incoming").iterdir():  # bodies a stopped service was receiving
            stale.unlink(missing_ok=True)

    @property
    def due(self) -> dict[str, datetime | None]:
        """Each open lab's due time, now."""
        return self._due.read() if isinstance(self._due, DueFile) else self._due

    def _lab(self, lab: str) -> str:
        """``lab``, when it is open for hand-in (HandInError 404 otherwise)."""
        due = self.due
        if lab not in due:
            raise HandInError(f"no lab {lab!r} is open for hand-in; open: {', '.join(sorted(due)) or 'none'}", 404)
        return lab

    def _folder(self, kind: str, key: str, lab: str) -> Path:
        if not _LAB.match(lab):
            raise HandInError(f"no lab {lab!r}: lab names look like 02_ps_async", 404)
        return self.root / kind / valid_key(key) / lab

    # ---------------------------------------------------------------- room
    def room_for(self, size: int) -> None:
        """HandInError 507 unless ``size`` more bytes leave :attr:`min_free` free."""
        free = shutil.disk_usage(self.root).free
        if free - size < self.min_free:
            raise HandInError(
                f"the hand-in store is nearly full ({free / 2**20:.0f} MB free): nothing was kept. "
                "Tell your instructor; hand in again once they have made room",
                507,
            )

    def incoming(self, limit: int = MAX_NOTEBOOK_BYTES) -> Incoming:
        """A new body to receive (the service streams each hand-in into one)."""
        return Incoming(self.root / "incoming", limit)

    # ---------------------------------------------------------------- hand-ins
    def hand_in(self, student: str, lab: str, data: bytes, now: datetime | None = None) -> Receipt:
        """Keep ``data`` as ``student``'s hand-in of ``lab``, stamped with ``now`` (the service's
        clock); returns the receipt once it is on disk."""
        body = self.incoming()
        try:
            body.write(data)
            self.check_body(body)
            return self.keep_body(student, lab, body, now)
        finally:
            body.discard()

    def check_body(self, body: Incoming) -> None:
        """HandInError unless a received body is a notebook (the step that takes memory: the
        service runs one at a time)."""
        body.close()
        data = body.path.read_bytes()
        body.sha256 = sha256(data).hexdigest()  # hashlib lets go of the GIL for a body this size
        check_notebook(data)

    def keep_body(self, student: str, lab: str, body: Incoming, now: datetime | None = None) -> Receipt:
        """Keep a checked body as ``student``'s hand-in of ``lab``, on disk before this returns."""
        key, lab = safe_name(student), self._lab(lab)
        if body.sha256 is None:
            raise ValueError("keep_body() needs a body check_body() took")
        body.close()
        self.room_for(body.size)
        self._within_quota(student, body.size)
        now = (now or datetime.now(UTC)).astimezone(UTC)
        folder = self._folder("submitted", key, lab)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        while True:  # one folder per arrival, even two in the same microsecond
            stamp = folder / now.strftime(_STAMP)
            try:
                stamp.mkdir(mode=0o700)
                break
            except FileExistsError:
                now += timedelta(microseconds=1)
        receipt = Receipt(student, lab, stamp.name, body.sha256, body.size, self._late(lab, now))
        try:
            os.replace(body.path, stamp / f"{lab}.ipynb")
            body.kept = True
            _fsync_dir(stamp)
            _write_durable(stamp / RECEIPT, json.dumps(asdict(receipt)).encode())
            _fsync_dir(folder)
        except OSError as exc:
            shutil.rmtree(stamp, ignore_errors=True)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(exc) from None
            raise
        self._prune(key, lab)
        return receipt

    def _late(self, lab: str, when: datetime) -> bool:
        due = self.due.get(lab)
        return due is not None and when > due

    def _within_quota(self, student: str, size: int) -> None:
        key = safe_name(student)
        base = self.root / "submitted" / key
        labs = [p.name for p in base.iterdir() if _LAB.match(p.name)] if base.is_dir() else []
        used = sum(r.size for lab in labs for r in self._receipts(key, lab))
        if used + size > self.quota:
            raise HandInError(
                f"your kept hand-ins hold {used / 2**20:.1f} MB; this one ({size / 2**20:.1f} MB) would pass the "
                f"{self.quota / 2**20:.0f} MB each student may keep. Clear large outputs and hand in again",
                413,
            )

    def _prune(self, key: str, lab: str) -> None:
        """Keep the last :attr:`keep`, the last on-time and the first late hand-in; remove the rest."""
        receipts = self._receipts(key, lab)
        kept = set(r.stamp for r in receipts[-self.keep :])
        on_time = [r for r in receipts if not r.late]
        late = [r for r in receipts if r.late]
        kept |= {on_time[-1].stamp} if on_time else set()
        kept |= {late[0].stamp} if late else set()
        folder = self._folder("submitted", key, lab)
        for r in receipts:
            if r.stamp not in kept:
                shutil.rmtree(folder / r.stamp)

    def _receipts(self, key: str, lab: str) -> list[Receipt]:
        """The receipts kept for ``key``'s hand-ins of ``lab``, oldest first. A folder with a
        notebook and no receipt (kept by a service older than receipts, or cut short by a crash
        before its answer) gets its receipt once, from the notebook; one without a notebook is
        nothing."""
        folder = self._folder("submitted", key, lab)
        if not folder.is_dir():
            return []
        out = []
        for stamp in sorted(p for p in folder.iterdir() if p.is_dir()):
            try:
                out.append(Receipt.from_json(json.loads((stamp / RECEIPT).read_bytes())))
            except FileNotFoundError:
                notebook = stamp / f"{lab}.ipynb"
                if notebook.is_file():
                    data = notebook.read_bytes()
                    when = datetime.strptime(stamp.name, _STAMP).replace(tzinfo=UTC)
                    name = out[-1].student if out else student_of(key)
                    receipt = Receipt(name, lab, stamp.name, sha256(data).hexdigest(), len(data), self._late(lab, when))
                    _write_durable(stamp / RECEIPT, json.dumps(asdict(receipt)).encode())
                    out.append(receipt)
        return out

    def hand_ins(self, student: str, lab: str) -> list[Receipt]:
        """``student``'s kept hand-ins of ``lab``, oldest first."""
        return self._receipts(safe_name(student), lab)

    def keys(self, lab: str) -> list[str]:
        """The folder of everyone who handed ``lab`` in."""
        base = self._folder("submitted", "x", lab).parent.parent
        found = [p.name for p in base.iterdir() if _KEY.match(p.name) and (p / lab).is_dir()] if base.is_dir() else []
        return sorted(k for k in found if self._receipts(k, lab))

    def students(self, lab: str) -> list[str]:
        """Everyone who handed ``lab`` in, by name (from their receipts)."""
        return sorted(self._receipts(k, lab)[-1].student for k in self.keys(lab))

    def latest_of(self, key: str, lab: str) -> tuple[Receipt, bytes] | None:
        """The last hand-in of ``lab`` in folder ``key`` and its bytes, or None."""
        receipts = self._receipts(key, lab)
        if not receipts:
            return None
        last = receipts[-1]
        return last, (self._folder("submitted", key, lab) / last.stamp / f"{lab}.ipynb").read_bytes()

    def latest(self, student: str, lab: str) -> tuple[Receipt, bytes] | None:
        """``student``'s last hand-in of ``lab`` and its bytes, or None."""
        return self.latest_of(safe_name(student), lab)

    def index(self, lab: str) -> list[Receipt]:
        """Each student's last receipt for ``lab`` (what ``collect`` fetches)."""
        return [self._receipts(k, lab)[-1] for k in self.keys(lab)]

    def collect(self, lab: str, dest: str | os.PathLike) -> list[Receipt]:
        """Each student's last hand-in of ``lab`` into ``dest/<key>/<lab>/<lab>.ipynb``, the
        layout ``make autograde SUBMISSIONS=dest`` grades, with nbgrader's ``timestamp.txt``."""
        out = []
        for key in self.keys(lab):
            receipt, data = self.latest_of(key, lab)
            write_submission(Path(dest), receipt, data)
            out.append(receipt)
        return out

    # ---------------------------------------------------------------- feedback
    def put_feedback_of(self, key: str, lab: str, name: str, data: bytes) -> None:
        """Return feedback page ``name`` to the student of folder ``key`` (replacing one of the
        same name); only a student who handed ``lab`` in has a folder to return to."""
        if not _FILE.match(name or ""):
            raise HandInError(f"a feedback file is a plain .html name, got {name!r}")
        if len(data) > MAX_FEEDBACK_BYTES:
            raise HandInError(f"feedback page {name} is {len(data)} bytes, above {MAX_FEEDBACK_BYTES}", 413)
        if not self._receipts(key, lab):
            raise HandInError(f"{student_of(key)!r} ({key}) has not handed in {lab}: no feedback to return", 404)
        folder = self._folder("feedback", key, lab)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            _write_durable(folder / name, data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(exc) from None
            raise

    def put_feedback(self, student: str, lab: str, name: str, data: bytes) -> None:
        """Return feedback page ``name`` to ``student``."""
        self.put_feedback_of(safe_name(student), lab, name, data)

    def feedback(self, student: str, lab: str) -> dict[str, bytes]:
        """The feedback pages returned to ``student`` for ``lab`` (none yet: empty)."""
        folder = self._folder("feedback", safe_name(student), lab)
        if not folder.is_dir():
            return {}
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if _FILE.match(p.name) and p.is_file()}

    def remove(self) -> None:
        """Remove the whole store (tests; the end of a course)."""
        shutil.rmtree(self.root)


def write_submission(dest: Path, receipt: Receipt, data: bytes) -> Path:
    """``data`` as ``dest/<key>/<lab>/<lab>.ipynb`` with nbgrader's ``timestamp.txt``
    (the service's arrival time); returns the notebook's path."""
    folder = dest / valid_key(receipt.key) / receipt.lab
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{receipt.lab}.ipynb"
    path.write_bytes(data)
    (folder / "timestamp.txt").write_text(receipt.time.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    return path
