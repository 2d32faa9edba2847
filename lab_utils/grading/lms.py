"""Grades for the learning-management system: the CSV that Canvas's and Moodle's gradebooks
import, one row per student and one column per lab, with each lab's points possible and the
late hand-ins.

::

    python -m lab_utils.grading export --lms canvas --csv grading/canvas.csv
    python -m lab_utils.grading export --lms moodle --csv grading/moodle.csv

- **canvas**: Canvas's gradebook import layout: ``Student, ID, SIS User ID, SIS Login ID,
  Section``, then a column per lab; the first row after the header is ``Points Possible``.
  Students are matched by ``SIS Login ID`` (their Hub / nbgrader id); the other identity
  columns are left for Canvas to fill. A ``Late`` column lists the labs handed in late (Canvas
  offers to skip a column it does not know; keep it as a note, or drop it).
- **moodle**: ``username``, a column per lab (its points possible in the column's name, as
  ``02_ps_async (max 30)``) and ``late``; map ``username`` to the user field and each lab to its
  grade item when importing.

Scores are the Gradebook's (autograded plus hand-graded); a lab not handed in is empty, not 0,
so the LMS's own missing-work policy applies. Late comes from the grading results' ``late``
flags (:mod:`lab_utils.grading.late`).

With the term's schedule (:mod:`lab_utils.grading.schedule`, what ``export --lms`` passes), the
assignment columns are the term's labs, in its order (a lab its variant leaves out has none;
Moodle's columns also name the due date: ``02_ps_async (max 30, due 2027-02-19)``, while Canvas's
keep the lab's name, which Canvas matches to its assignment), and a hand-in is late when it
arrived after the schedule's due time: an extension typed into the schedule after grading is the
export's too.
"""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path

from lab_utils.grading import results
from lab_utils.grading.layout import GRADING_ROOT
from lab_utils.grading.nbapi import gradebook_rows
from lab_utils.grading.schedule import Schedule

__all__ = ["LMS", "rows", "export"]

LMS = ("canvas", "moodle")


def _late(root: Path, student: str, lab: str) -> bool:
    record = results.results_dir(root) / student / f"{lab}.json"
    try:
        return any(f["kind"] == "late" for f in json.loads(record.read_text())["flags"])
    except (FileNotFoundError, ValueError, KeyError):
        return False


def _score(value) -> str:
    return "" if value in ("", None) else f"{float(value):g}"


def _arrived_late(row: dict, due: datetime | None) -> bool | None:
    """Whether the hand-in of ``row`` arrived after ``due``; None when either is unknown."""
    arrived = row.get("timestamp")
    if due is None or not isinstance(arrived, datetime):
        return None
    return (arrived if arrived.tzinfo else arrived.replace(tzinfo=UTC)) > due


def rows(lms: str, gradebook: list[dict], root: Path, schedule: Schedule | None = None) -> list[list[str]]:
    """The CSV's rows (header first) for ``lms`` from :func:`lab_utils.grading.nbapi.gradebook_rows`;
    with ``schedule``, its labs and due times (the module's docstring)."""
    if lms not in LMS:
        raise ValueError(f"lms must be one of {LMS}, got {lms!r}")
    labs = sorted({r["lab"] for r in gradebook})
    due: dict = {}
    if schedule is not None:
        due = schedule.due()
        labs = [lab for lab in schedule.labs if lab in labs]
    possible = {r["lab"]: r["max_score"] for r in gradebook}
    students = sorted({r["student_id"] for r in gradebook})
    handed = {(r["student_id"], r["lab"]): r for r in gradebook if r["status"] == "submitted"}
    score = {key: r["score"] for key, r in handed.items()}

    def late(s: str, lab: str) -> bool:
        by_schedule = _arrived_late(handed[(s, lab)], due.get(lab))
        return _late(root, s, lab) if by_schedule is None else by_schedule

    late_labs = {s: [lab for lab in labs if (s, lab) in score and late(s, lab)] for s in students}

    def name(lab: str) -> str:  # Moodle's: an instructor maps each column to a grade item by hand
        parts = [f"max {_score(possible[lab])}"]
        if due.get(lab) is not None:
            parts.append(f"due {due[lab]:%Y-%m-%d}")
        return f"{lab} ({', '.join(parts)})"

    if lms == "canvas":  # Canvas matches a column to an assignment by its name: the lab's, as it is
        out = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *labs, "Late"]]
        out.append(["Points Possible", "", "", "", "", *(_score(possible[lab]) for lab in labs), ""])
        out += [
            ["", "", "", s, "", *(_score(score.get((s, lab))) for lab in labs), " ".join(late_labs[s])]
            for s in students
        ]
        return out
    out = [["username", *(name(lab) for lab in labs), "late"]]
    out += [[s, *(_score(score.get((s, lab))) for lab in labs), " ".join(late_labs[s])] for s in students]
    return out


def export(csv_path: Path | str, lms: str, root: Path | str = GRADING_ROOT, schedule: Schedule | None = None) -> Path:
    """Write the ``lms`` gradebook CSV of the course at ``root`` to ``csv_path``, with the term's
    ``schedule`` (default: the course's, :func:`lab_utils.grading.schedule.course_schedule`, when it has one)."""
    root = Path(root).resolve()
    if schedule is None:
        from lab_utils.grading import schedule as schedules

        path = schedules.course_schedule(root)
        schedule = schedules.load(path) if path.is_file() else None
    table = rows(lms, gradebook_rows(root), root, schedule)
    path = Path(csv_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([map(results.spreadsheet_safe, row) for row in table])
    return path
