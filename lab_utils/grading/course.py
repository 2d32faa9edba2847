"""Course operations on the nbgrader course in ``grading/`` (the ``make`` targets call these).

::

    python -m lab_utils.grading release            # grading/source/<lab> -> labs/<lab>
    python -m lab_utils.grading check-release      # exit 1 if labs/ is stale or holds a solution
    python -m lab_utils.grading autograde DIR      # DIR/<student>/<lab>/<lab>.ipynb
    python -m lab_utils.grading export [--csv grading/grades.csv]
    python -m lab_utils.grading feedback           # grading/feedback/<student>/<lab>/*.html

Facts from nbgrader 0.9 this module respects: the API returns
``{"success": ...}`` instead of raising, so every call is checked here; the
per-cell timeout is ``Execute.timeout``, set per lab from ``grading/settings.yml``
(:mod:`lab_utils.grading.settings`).
"""

from __future__ import annotations

import csv
import filecmp
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

__all__ = [
    "REPO_ROOT",
    "GRADING_ROOT",
    "SOURCE_DIR",
    "LABS_DIR",
    "PARAMS_FILE",
    "load_params",
    "lab_settings",
    "cell_timeout",
    "source_labs",
    "resolve_labs",
    "source_notebook",
    "course_api",
    "check",
    "release",
    "check_release",
    "autograde",
    "export_grades",
    "feedback",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
GRADING_ROOT = REPO_ROOT / "grading"
SOURCE_DIR = GRADING_ROOT / "source"
LABS_DIR = REPO_ROOT / "labs"
PARAMS_FILE = LABS_DIR / "params.yml"


# -------------------------------------------------------------- course settings
def load_params(path: Path | str | None = None) -> dict[str, dict]:
    """``labs/params.yml`` (or ``path``) as ``{lab: {"ci": ..., "full": ..., "cell_timeout": ...}}``.

    The one reader of that file: ``lab_settings``, ``run_labs`` and
    ``grading/nbgrader_config.py`` all call it. An empty entry reads as ``{}``."""
    import yaml

    path = Path(path) if path is not None else PARAMS_FILE
    with open(path) as f:
        table = yaml.safe_load(f) or {}
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected a mapping of lab name -> settings, got {type(table).__name__}")
    bad = [lab for lab, entry in table.items() if entry is not None and not isinstance(entry, dict)]
    if bad:
        raise ValueError(f"{path}: the entries of {bad} must be mappings (keys ci, full, cell_timeout)")
    return {str(lab): dict(entry or {}) for lab, entry in table.items()}


def lab_settings(lab: str, params_file: Path | str | None = None) -> dict:
    """The entry for ``lab`` (``"01"`` or ``"01_single_node"``) in ``labs/params.yml``
    (keys: ci, full, cell_timeout), with its full name under ``"name"``."""
    table = load_params(params_file)
    matches = [name for name in table if name == lab or name.split("_", 1)[0] == lab]
    if len(matches) != 1:
        raise ValueError(
            f"lab {lab!r} not found (or ambiguous) in {params_file or PARAMS_FILE}; known: {sorted(table)}"
        )
    return {**table[matches[0]], "name": matches[0]}


def cell_timeout(lab: str | None = None, settings_file: Path | str | None = None) -> int:
    """nbgrader's per-cell timeout for ``lab`` from ``grading/settings.yml``; with no
    lab, the largest of all labs (what a plain ``nbgrader`` command gets)."""
    from lab_utils.grading.settings import grading_settings, load_settings

    if lab:
        return int(grading_settings(lab, settings_file)["cell_timeout"])
    table = load_settings(settings_file)
    return int(max([table["defaults"], *table["labs"].values()], key=lambda e: e["cell_timeout"])["cell_timeout"])


# ---------------------------------------------------------------- lab selection
def source_labs(root: Path | str = GRADING_ROOT) -> list[str]:
    """The labs of the course at ``root``: the folders of ``root/source``."""
    src = Path(root) / "source"
    if not src.is_dir():
        return []
    return sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def resolve_labs(labs, known: list[str]) -> list[str]:
    """Full lab names for what a user typed (``01``, ``01_single_node``); all of ``known`` when empty."""
    if not labs:
        return list(known)
    chosen = []
    for lab in labs:
        hits = [k for k in known if k == lab or k.split("_", 1)[0] == lab]
        if len(hits) != 1:
            raise ValueError(f"unknown lab {lab!r}; known labs: {', '.join(known) or 'none'}")
        chosen.append(hits[0])
    return chosen


def source_notebook(lab: str, root: Path | str = GRADING_ROOT) -> Path:
    """``root/source/<lab>/<lab>.ipynb`` for ``lab`` (``"02"`` or ``"02_ps_async"``)."""
    name = resolve_labs([lab], source_labs(root))[0]
    return Path(root) / "source" / name / f"{name}.ipynb"


def _select(labs, root) -> list[str]:
    return resolve_labs(labs, source_labs(root))


# ------------------------------------------------------------------- nbgrader API
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


# ------------------------------------------------------------ course operations
def release(
    labs=None,
    root: Path | str = GRADING_ROOT,
    labs_dir: Path | str | None = LABS_DIR,
) -> list[Path]:
    """Generate the student version of each lab (all when ``labs`` is empty)
    into ``root/release/<lab>`` and copy it to ``labs_dir/<lab>`` (the
    committed release students open). Returns the written folders."""
    root = Path(root)
    written = []
    for lab in _select(labs, root):
        api = course_api(root)
        check(api.generate_assignment(lab, force=True, create=True), f"generate_assignment {lab}")
        out = root / "release" / lab
        if labs_dir is None:
            written.append(out)
            continue
        dest = Path(labs_dir) / lab
        dest.mkdir(parents=True, exist_ok=True)
        for item in out.iterdir():
            if item.is_dir():
                shutil.copytree(item, dest / item.name, dirs_exist_ok=True)
            else:
                shutil.copy2(item, dest / item.name)
        written.append(dest)
    return written


def check_release(labs=None, root: Path | str = GRADING_ROOT, labs_dir: Path | str = LABS_DIR) -> list[str]:
    """Regenerate every release in a temporary course and compare it with
    ``labs_dir``; returns a list of problems (empty when up to date)."""
    root, labs_dir = Path(root), Path(labs_dir)
    problems = []
    with tempfile.TemporaryDirectory(prefix="lab-release-") as tmp:
        tmp_root = Path(tmp) / "course"
        tmp_root.mkdir()
        shutil.copy2(root / "nbgrader_config.py", tmp_root / "nbgrader_config.py")
        shutil.copytree(root / "source", tmp_root / "source")
        for lab in _select(labs, root):
            out = release([lab], tmp_root, labs_dir=None)[0]
            for item in sorted(out.rglob("*")):
                if item.is_dir():
                    continue
                rel = item.relative_to(out)
                committed = labs_dir / lab / rel
                if not committed.is_file():
                    problems.append(f"{lab}: {rel} missing from {labs_dir / lab}")
                elif not filecmp.cmp(item, committed, shallow=False):
                    problems.append(f"{lab}: {rel} differs from the source (run `make release`)")
    return problems


def autograde(
    submissions: Path | str,
    labs=None,
    root: Path | str = GRADING_ROOT,
    *,
    jobs: int | None = None,
    resume: bool = True,
    settings_file: Path | str | None = None,
    out=None,
) -> dict:
    """Grade ``submissions/<student>/<lab>/`` (see :mod:`lab_utils.grading.batch`).
    Returns ``{(student, lab): score}``; raises RuntimeError listing any
    infrastructure error (those submissions are not scored: run again)."""
    from lab_utils.grading import batch

    results = batch.autograde(
        submissions, labs, root, jobs=jobs, resume=resume, settings_file=settings_file, out=out or sys.stdout
    )
    failed = [r for r in results if r["status"] != "graded"]
    if failed:
        raise RuntimeError(
            "autograde failed for:\n"
            + "\n".join(
                f"{r['student']}/{r['lab']}: {r['reason']}\n  " + "\n  ".join(r["log_tail"][-15:]) for r in failed
            )
        )
    return {(r["student"], r["lab"]): r["score"] for r in results}


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
                    }
                )
    return rows


def export_grades(csv_path: Path | str | None = None, root: Path | str = GRADING_ROOT) -> Path:
    """Write :func:`gradebook_rows` to ``csv_path`` (default ``<root>/grades.csv``)."""
    root = Path(root).resolve()
    csv_path = Path(csv_path) if csv_path else root / "grades.csv"
    columns = ["student_id", "lab", "score", "max_score", "code_plus_written_score", "needs_manual_grade", "status"]
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(gradebook_rows(root))
    return csv_path


def feedback(labs=None, root: Path | str = GRADING_ROOT) -> list[Path]:
    """Generate feedback HTML for every autograded submission, with its flags on top."""
    from lab_utils.grading import results  # (results imports this module)

    root = Path(root).resolve()
    out = []
    for lab in _select(labs, root):
        graded = root / "autograded"
        students = sorted(p.name for p in graded.iterdir() if (p / lab).is_dir()) if graded.is_dir() else []
        api = course_api(root)
        for student in students:
            check(api.generate_feedback(lab, student, force=True), f"generate_feedback {student}/{lab}")
            record = results.results_dir(root) / student / f"{lab}.json"
            if record.is_file():  # the batch's flags, at the top of the page (as autograde put them)
                results.add_flags_to_feedback(
                    root / "feedback" / student / lab, json.loads(record.read_text())["flags"]
                )
            out.extend(sorted((root / "feedback" / student / lab).glob("*.html")))
    return out
