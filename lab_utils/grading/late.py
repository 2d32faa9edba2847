"""Late hand-ins: a lab's due time (``due`` in ``grading/settings.yml``) against the time a
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

from datetime import UTC, datetime
from pathlib import Path

from lab_utils.grading.safefiles import read_plain

__all__ = ["parse_due", "handed_in_at", "late_flag"]


def parse_due(value) -> datetime | None:
    """A due time from the settings: ISO 8601 with a zone (a string, or the datetime YAML makes
    of one), or None. ValueError for anything else, naming what was given."""
    if value is None:
        return None
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"due must be ISO 8601 like 2026-12-04T23:59:00+01:00, got {value!r}") from None
    else:
        raise ValueError(f"due must be ISO 8601 like 2026-12-04T23:59:00+01:00, got {value!r}")
    if when.tzinfo is None:
        raise ValueError(f"due needs a time zone (like 2026-12-04T23:59:00+01:00 or ...Z), got {value!r}")
    return when


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
