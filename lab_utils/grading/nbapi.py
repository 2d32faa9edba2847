"""nbgrader's API, checked: a configured ``NbGraderAPI`` for the course and its gradebook.

Facts from nbgrader 0.9 this module respects: the API returns ``{"success": ...}``
instead of raising, so every call goes through :func:`check`; the per-cell timeout is
``Execute.timeout``, set per lab from ``grading/settings.yml``
(:func:`lab_utils.grading.layout.cell_timeout`). nbgrader is imported by the functions
that need it, so importing this module is cheap.
"""

from __future__ import annotations

import csv
import os
import shutil
import sys
from pathlib import Path

from lab_utils.grading.layout import GRADING_ROOT

__all__ = ["course_api", "check", "gradebook_rows", "export_grades"]


def _ensure_tools_on_path() -> None:
    """nbgrader runs the ``alembic`` executable when it creates a gradebook; when
    this interpreter was started by full path (``/venv/bin/python -m ...``) its
    ``bin`` folder may not be on PATH, so add it (this CLI's own process only)."""
    if shutil.which("alembic") is None:
        bindir = str(Path(sys.executable).parent)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def course_api(root: Path | str = GRADING_ROOT, timeout: int | None = None, extra=None):
    """An ``NbGraderAPI`` for the course at ``root``, configured from
    ``root/nbgrader_config.py`` (``Execute.timeout`` overridden when given, then
    the traitlets ``Config`` ``extra`` merged over it)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader

    root = Path(root).resolve()
    _ensure_tools_on_path()
    config = Config()
    cfg_file = root / "nbgrader_config.py"
    if cfg_file.is_file():
        config.merge(PyFileConfigLoader(cfg_file.name, path=str(root)).load_config())
    config.CourseDirectory.root = str(root)
    # nbgrader's InstantiateTests runs a notebook's code in a kernel of the grader's own, outside
    # any sandbox (the grading service is root); this course writes its tests by hand
    from nbgrader.converters import GenerateAssignment

    default = GenerateAssignment.class_traits()["preprocessors"].make_dynamic_default()
    config.GenerateAssignment.preprocessors = [p for p in default if p.__name__ != "InstantiateTests"]
    if timeout is not None:
        config.Execute.timeout = int(timeout)
    if extra is not None:
        config.merge(extra)
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


def check(result: dict, what: str) -> None:
    """Raise RuntimeError with nbgrader's log when an API call did not succeed."""
    if not result.get("success"):
        detail = (result.get("error") or "") + "\n" + (result.get("log") or "")
        raise RuntimeError(f"nbgrader {what} failed:\n{detail.strip()[-4000:]}")


def gradebook_rows(root: Path | str = GRADING_ROOT) -> list[dict]:
    """One row per (student, lab) of the Gradebook: score (auto + manual), max score, the auto
    score, whether manual grading is still needed, and status (submitted / missing)."""
    from nbgrader.api import Gradebook, MissingEntry

    api = course_api(Path(root).resolve())
    rows = []
    with Gradebook(api.coursedir.db_url) as gb:
        for assignment in gb.assignments:
            for student in gb.students:
                row = {"student_id": student.id, "lab": assignment.name, "max_score": assignment.max_score}
                try:
                    sub = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    rows.append(
                        {
                            **row,
                            "score": "",
                            "code_plus_written_score": "",
                            "needs_manual_grade": "",
                            "status": "missing",
                        }
                    )
                    continue
                rows.append(
                    {
                        **row,
                        "score": sub.score,
                        "max_score": sub.max_score,
                        "code_plus_written_score": sub.code_score + sub.written_score,
                        "needs_manual_grade": sub.needs_manual_grade,
                        "status": "submitted",
                        "timestamp": sub.timestamp,  # when it was handed in (nbgrader's: naive UTC)
                    }
                )
    return rows


def export_grades(csv_path: Path | str | None = None, root: Path | str = GRADING_ROOT) -> Path:
    """Write :func:`gradebook_rows` to ``csv_path`` (default ``<root>/grades.csv``)."""
    root = Path(root).resolve()
    csv_path = Path(csv_path) if csv_path else root / "grades.csv"
    columns = ["student_id", "lab", "score", "max_score", "code_plus_written_score", "needs_manual_grade", "status"]
    columns.append("ta_page")  # the TA's page of the submission's written answers (lab_utils.grading.ta_pages)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    from lab_utils.grading.results import spreadsheet_safe
    from lab_utils.grading.ta_pages import page_path

    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, columns, extrasaction="ignore")  # the rows' timestamp stays out
        w.writeheader()
        for row in gradebook_rows(root):
            page = page_path(root, row["student_id"], row["lab"])
            row["ta_page"] = os.path.relpath(page, csv_path.parent) if page.is_file() else ""
            w.writerow({k: spreadsheet_safe(v) for k, v in row.items()})
    return csv_path
