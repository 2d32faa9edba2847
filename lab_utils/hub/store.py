"""The hand-in store: what students hand in and the feedback returned to them, on the
hand-in service's own disk (never on a volume a student's server mounts).

::

    store = Store(root, due={"02_ps_async": datetime(2026, 12, 1, 23, 59, tzinfo=UTC)})
    receipt = store.hand_in("alice", "02_ps_async", notebook_bytes)   # Receipt(..., late=False)
    store.collect("02_ps_async", dest)      # dest/<student>/02_ps_async/02_ps_async.ipynb + timestamp.txt
    store.put_feedback("alice", "02_ps_async", "02_ps_async.html", html)
    store.feedback("alice", "02_ps_async")  # {"02_ps_async.html": b"..."}: hers only

Who is who is the caller's business (the service takes it from the Hub's token, never from
the request); this module only keeps each student's files apart and never lets a name or a
lab reach outside its folder. Layout, every folder mode 700:

    <root>/submitted/<student>/<lab>/<stamp>/<lab>.ipynb    one folder per hand-in, kept
    <root>/feedback/<student>/<lab>/<file>.html             replaced by each return

``<stamp>`` is the service's UTC clock when the hand-in arrived (a student cannot set it),
as ``20261126T081500.123456Z``; late means after the lab's due time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path

__all__ = [
    "Store",
    "Receipt",
    "HandInError",
    "MAX_NOTEBOOK_BYTES",
    "MAX_FEEDBACK_BYTES",
    "safe_name",
    "student_of",
    "write_submission",
]

#: A handed-in notebook larger than this is refused (the labs' notebooks are well under 5 MB
#: with their figures; the grader cuts huge outputs anyway).
MAX_NOTEBOOK_BYTES = 20 * 2**20
#: A feedback page larger than this is refused.
MAX_FEEDBACK_BYTES = 20 * 2**20
_STAMP = "%Y%m%dT%H%M%S.%fZ"
_LAB = re.compile(r"^[0-9]{2}_[a-z0-9_]+$")
_FILE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}\.html$")


class HandInError(ValueError):
    """A hand-in or a return the store refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Receipt:
    """One hand-in, as the store keeps it."""

    student: str
    lab: str
    stamp: str  # the service's UTC clock at arrival, _STAMP format
    sha256: str
    size: int
    late: bool

    @property
    def time(self) -> datetime:
        return datetime.strptime(self.stamp, _STAMP).replace(tzinfo=UTC)

    def to_json(self) -> dict:
        return {**asdict(self), "time": self.time.isoformat()}

    @classmethod
    def from_json(cls, data: dict) -> Receipt:
        """The receipt :meth:`to_json` wrote (its ``time`` is derived from the stamp)."""
        return cls(**{k: v for k, v in data.items() if k != "time"})

    def __repr__(self) -> str:  # what a notebook shows under hand_in(): one line, not the fields
        when = self.time.strftime("%Y-%m-%d %H:%M:%S UTC")
        return f"<hand-in of {self.lab} by {self.student} at {when}, {'LATE' if self.late else 'on time'}, sha256 {self.sha256[:12]}>"


def safe_name(name: str) -> str:
    """A Hub user name as a folder name: letters, digits and ``._@+-`` kept, anything else
    (``/``, spaces, non-ASCII) as ``%XX`` of its UTF-8 bytes; never ``.``-led."""
    if not isinstance(name, str) or not name:
        raise HandInError(f"a student name must be a non-empty string, got {name!r}")
    out = "".join(
        c if c.isascii() and (c.isalnum() or c in "_@+-.") else "".join(f"%{b:02X}" for b in c.encode()) for c in name
    )
    return "%2E" + out[1:] if out.startswith(".") else out


def student_of(folder: str) -> str:
    """The student name :func:`safe_name` made ``folder`` from."""
    return re.sub(rb"%([0-9A-F]{2})", lambda m: bytes([int(m.group(1), 16)]), folder.encode()).decode()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".incoming-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_notebook(data: bytes) -> None:
    """Refuse what cannot be a notebook: too large, not JSON, or no list of cells. (What is in
    the cells is the grader's business: it grades anything, flagging what it must.)"""
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise HandInError(
            f"the notebook is {len(data) / 2**20:.1f} MB, above the {MAX_NOTEBOOK_BYTES // 2**20} MB a hand-in may be: "
            "clear the outputs of the largest cells (Edit > Clear Outputs), save, and hand in again",
            413,
        )
    try:
        nb = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandInError(f"this is not a notebook file (not JSON: {exc})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise HandInError("this is not a notebook file (no list of cells)")


class Store:
    """Hand-ins and feedback under ``root``; ``due`` maps each lab that may be handed in to its
    due time (aware datetime) or None (no due time)."""

    def __init__(self, root: str | os.PathLike, due: dict[str, datetime | None]):
        bad = [lab for lab in due if not _LAB.match(lab)]
        if bad:
            raise ValueError(f"lab names look like 02_ps_async; got {bad}")
        naive = [lab for lab, t in due.items() if t is not None and t.tzinfo is None]
        if naive:
            raise ValueError(f"due times need a time zone (e.g. 2026-12-01T23:59:00+01:00); naive for {naive}")
        self.root, self.due = Path(root), dict(due)
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.root, 0o700)

    def _lab(self, lab: str) -> str:
        if lab not in self.due:
            raise HandInError(f"no lab {lab!r} is open for hand-in; open: {', '.join(sorted(self.due)) or 'none'}", 404)
        return lab

    def _folder(self, kind: str, student: str, lab: str) -> Path:
        return self.root / kind / safe_name(student) / self._lab(lab)

    # ---------------------------------------------------------------- hand-ins
    def hand_in(self, student: str, lab: str, data: bytes, now: datetime | None = None) -> Receipt:
        """Keep ``data`` as ``student``'s hand-in of ``lab``, stamped with ``now`` (the service's
        clock); earlier hand-ins are kept too."""
        folder = self._folder("submitted", student, lab)
        check_notebook(data)
        now = (now or datetime.now(UTC)).astimezone(UTC)
        stamp = now.strftime(_STAMP)
        _write_atomic(folder / stamp / f"{lab}.ipynb", data)
        return self._receipt(student, lab, folder / stamp)

    def _receipt(self, student: str, lab: str, folder: Path) -> Receipt:
        data = (folder / f"{lab}.ipynb").read_bytes()
        stamp = folder.name
        due = self.due.get(lab)
        late = due is not None and datetime.strptime(stamp, _STAMP).replace(tzinfo=UTC) > due
        return Receipt(student, lab, stamp, sha256(data).hexdigest(), len(data), late)

    def hand_ins(self, student: str, lab: str) -> list[Receipt]:
        """``student``'s hand-ins of ``lab``, oldest first."""
        folder = self._folder("submitted", student, lab)
        stamps = sorted(p for p in folder.iterdir() if (p / f"{lab}.ipynb").is_file()) if folder.is_dir() else []
        return [self._receipt(student, lab, p) for p in stamps]

    def students(self, lab: str) -> list[str]:
        """Everyone who handed ``lab`` in."""
        self._lab(lab)
        base = self.root / "submitted"
        found = [student_of(p.name) for p in base.iterdir() if (p / lab).is_dir()] if base.is_dir() else []
        return sorted(s for s in found if self.hand_ins(s, lab))

    def latest(self, student: str, lab: str) -> tuple[Receipt, bytes] | None:
        """``student``'s last hand-in of ``lab`` and its bytes, or None."""
        receipts = self.hand_ins(student, lab)
        if not receipts:
            return None
        last = receipts[-1]
        return last, (self._folder("submitted", student, lab) / last.stamp / f"{lab}.ipynb").read_bytes()

    def collect(self, lab: str, dest: str | os.PathLike) -> list[Receipt]:
        """Each student's last hand-in of ``lab`` into ``dest/<student>/<lab>/<lab>.ipynb``, the
        layout ``make autograde SUBMISSIONS=dest`` grades, with nbgrader's ``timestamp.txt``."""
        out = []
        for student in self.students(lab):
            receipt, data = self.latest(student, lab)
            write_submission(Path(dest), receipt, data)
            out.append(receipt)
        return out

    # ---------------------------------------------------------------- feedback
    def put_feedback(self, student: str, lab: str, name: str, data: bytes) -> None:
        """Return feedback page ``name`` to ``student`` (replacing one of the same name)."""
        if not _FILE.match(name or ""):
            raise HandInError(f"a feedback file is a plain .html name, got {name!r}")
        if len(data) > MAX_FEEDBACK_BYTES:
            raise HandInError(f"feedback page {name} is {len(data)} bytes, above {MAX_FEEDBACK_BYTES}", 413)
        _write_atomic(self._folder("feedback", student, lab) / name, data)

    def feedback(self, student: str, lab: str) -> dict[str, bytes]:
        """The feedback pages returned to ``student`` for ``lab`` (none yet: empty)."""
        folder = self._folder("feedback", student, lab)
        if not folder.is_dir():
            return {}
        return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if _FILE.match(p.name) and p.is_file()}

    def remove(self) -> None:
        """Remove the whole store (tests; the end of a course)."""
        shutil.rmtree(self.root)


def write_submission(dest: Path, receipt: Receipt, data: bytes) -> Path:
    """``data`` as ``dest/<student>/<lab>/<lab>.ipynb`` with nbgrader's ``timestamp.txt``
    (the service's arrival time); returns the notebook's path."""
    folder = dest / safe_name(receipt.student) / receipt.lab
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{receipt.lab}.ipynb"
    path.write_bytes(data)
    (folder / "timestamp.txt").write_text(receipt.time.strftime("%Y-%m-%d %H:%M:%S.%f UTC"))
    return path
