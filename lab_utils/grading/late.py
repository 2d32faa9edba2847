"""Late hand-ins: a lab's due time (``due`` in ``grading/settings.yml``, or the class's due file
that its ``due_file`` names, :class:`DueFile`) against the time a
submission arrived (``timestamp.txt`` beside it, nbgrader's convention; written by
``python -m lab_utils.hub collect`` from the hand-in service's own clock, so a student cannot
set it).

::

    due = parse_due("2026-12-04T23:59:00+01:00")
    late_flag(Path("submitted/alice/02_ps_async"), due)
    # {"kind": "late", "detail": "handed in 2 h 13 min after the due time (2026-12-04 23:59 +01:00)", "late_s": 7980}

The flag costs no points by itself: it is shown in the batch's summary, ``grades.csv``, the
feedback and the LMS export, and the instructor's late policy decides.
"""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path

from lab_utils.grading.safefiles import read_plain
from lab_utils.grading.schedule import is_schedule, parse, parse_due

__all__ = ["DueFile", "parse_due", "handed_in_at", "late_flag"]

_LAB_NAME = re.compile(r"^[0-9]{2}_[a-z0-9_]+$")


class DueFile:
    """The class's due times from one YAML file, read by the hand-in service (the receipt's
    LATE) and the grader (the grades' late flag and the LMS's Late column) alike: the term's
    schedule (``grading/course.yml``, :mod:`lab_utils.grading.schedule`), or a due file::

        01_single_node: 2026-12-04T23:59:00+01:00
        02_ps_async: 2026-12-11T23:59:00+01:00
        03_ps_sync: null          # open, with no due time

    :meth:`read` reads it again whenever it changed, so a new due time needs no restart. The
    first read raises ValueError for a bad file; a later bad edit keeps the last good times and
    is logged and kept in :attr:`problem`, so a typo at 23:58 closes no lab."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._seen: tuple | None = None
        self._due: dict[str, datetime | None] = {}
        self.problem: str | None = None
        self.read(strict=True)

    def _parse(self) -> dict[str, datetime | None]:
        import yaml

        try:
            raw = yaml.safe_load(self.path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"{self.path}: {exc}") from None
        if raw is None:
            raw = {}
        if is_schedule(raw):  # the term's schedule: its labs (in the variant it picks) and their due times
            return parse(raw, self.path).due()
        if not isinstance(raw, dict):
            raise ValueError(f"{self.path}: expected `lab: due time` lines, got {type(raw).__name__}")
        due = {}
        for lab, when in raw.items():
            if not isinstance(lab, str) or not _LAB_NAME.match(lab):
                raise ValueError(f"{self.path}: lab names look like 02_ps_async, got {lab!r}")
            try:
                due[lab] = parse_due(when)
            except ValueError as exc:
                raise ValueError(f"{self.path}: {lab}: {exc}") from None
        return due

    def read(self, strict: bool = False) -> dict[str, datetime | None]:
        """Each lab's due time (None: open without one), as the file says now."""
        try:
            st = self.path.stat()
            seen = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError as exc:
            seen = ("missing", str(exc))
        if seen != self._seen:
            try:
                self._due, self.problem = self._parse(), None
            except ValueError as exc:
                if strict:
                    raise
                self.problem = f"{exc} (the last good due times stay in force)"
                logging.getLogger(__name__).error("due file: %s", self.problem)
            self._seen = seen
        return dict(self._due)


def handed_in_at(folder: Path) -> datetime | None:
    """When the submission in ``folder`` arrived, from its ``timestamp.txt``; None without one
    (or one that is not a time: it is not evidence of lateness)."""
    data = read_plain(Path(folder) / "timestamp.txt", 4096)  # a link in a submission is never followed
    if not isinstance(data, bytes):
        return None
    text = data.decode(errors="replace").strip()
    from dateutil import parser  # nbgrader reads it the same way (nbgrader.utils.parse_utc)

    try:
        when = parser.parse(text)
    except (ValueError, OverflowError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _span(seconds: float) -> str:
    minutes = int(seconds // 60)
    days, hours, mins = minutes // 1440, minutes // 60 % 24, minutes % 60
    parts = (
        [f"{days} d"] * bool(days) + [f"{hours} h"] * bool(hours) + [f"{mins} min"] * bool(mins or not (days or hours))
    )
    return " ".join(parts) if seconds >= 60 else f"{int(seconds)} s"


def late_flag(folder: Path, due: datetime | None) -> dict | None:
    """A ``late`` flag when the submission in ``folder`` arrived after ``due``, else None."""
    arrived = handed_in_at(folder)
    if due is None or arrived is None or arrived <= due:
        return None
    late_s = (arrived - due).total_seconds()
    when = due.strftime("%Y-%m-%d %H:%M %z")
    return {
        "kind": "late",
        "detail": f"handed in {_span(late_s)} after the due time ({when[:-2]}:{when[-2:]})",
        "late_s": round(late_s),
    }
