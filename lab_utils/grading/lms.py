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
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from lab_utils.grading import results
from lab_utils.grading.layout import GRADING_ROOT
from lab_utils.grading.nbapi import gradebook_rows

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


def rows(lms: str, gradebook: list[dict], root: Path) -> list[list[str]]:
    """The CSV's rows (header first) for ``lms`` from :func:`lab_utils.grading.nbapi.gradebook_rows`."""
    if lms not in LMS:
        raise ValueError(f"lms must be one of {LMS}, got {lms!r}")
    labs = sorted({r["lab"] for r in gradebook})
    possible = {r["lab"]: r["max_score"] for r in gradebook}
    students = sorted({r["student_id"] for r in gradebook})
    score = {(r["student_id"], r["lab"]): r["score"] for r in gradebook if r["status"] == "submitted"}
    late = {s: [lab for lab in labs if (s, lab) in score and _late(root, s, lab)] for s in students}
    if lms == "canvas":
        out = [["Student", "ID", "SIS User ID", "SIS Login ID", "Section", *labs, "Late"]]
        out.append(["Points Possible", "", "", "", "", *(_score(possible[lab]) for lab in labs), ""])
        out += [
            ["", "", "", s, "", *(_score(score.get((s, lab))) for lab in labs), " ".join(late[s])] for s in students
        ]
        return out
    out = [["username", *(f"{lab} (max {_score(possible[lab])})" for lab in labs), "late"]]
    out += [[s, *(_score(score.get((s, lab))) for lab in labs), " ".join(late[s])] for s in students]
    return out


def export(csv_path: Path | str, lms: str, root: Path | str = GRADING_ROOT) -> Path:
    """Write the ``lms`` gradebook CSV of the course at ``root`` to ``csv_path``."""
    root = Path(root).resolve()
    table = rows(lms, gradebook_rows(root), root)
    path = Path(csv_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([map(results.spreadsheet_safe, row) for row in table])
    return path
