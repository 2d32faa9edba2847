"""Grading: helpers for nbgrader test cells, and the course operations.

In test cells (introduced in Lab 1)::

    from lab_utils.grading import credit, ratio_credit, is_grading
    credit(0.5, points=2)                 # -> 1.0, a clamped Python float
    ratio_credit(student_eps / ref_eps, points=3)

nbgrader gives partial credit when a test cell's last expression is a Python
``float`` in [0, points]; a NumPy scalar or another type gives full credit and
a value above ``points`` makes autograde fail. ``credit`` is the one place that
produces that value.

Course operations (the ``make`` targets call these; course root = ``grading/``)::

    python -m lab_utils.grading release            # grading/source/<lab> -> labs/<lab>
    python -m lab_utils.grading check-release      # exit 1 if labs/ is stale
    python -m lab_utils.grading autograde DIR      # DIR/<student>/<lab>/<lab>.ipynb
    python -m lab_utils.grading export [--csv grading/grades.csv]
    python -m lab_utils.grading feedback           # grading/feedback/<student>/<lab>/*.html

Facts from nbgrader 0.9 this module respects: the API returns
``{"success": ...}`` instead of raising, so every call is checked here; the
per-cell timeout is ``Execute.timeout``, set per lab from ``labs/params.yml``.
"""
from __future__ import annotations

import argparse
import csv
import filecmp
import math
import os
import shutil
import sys
import tempfile
from numbers import Real
from pathlib import Path

__all__ = [
    "credit",
    "ratio_credit",
    "is_grading",
    "REPO_ROOT",
    "course_api",
    "release",
    "check_release",
    "autograde",
    "export_grades",
    "feedback",
    "lab_settings",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
GRADING_ROOT = REPO_ROOT / "grading"
LABS_DIR = REPO_ROOT / "labs"
PARAMS_FILE = LABS_DIR / "params.yml"
DEFAULT_TIMEOUT = 300
DEFAULT_BANDS = ((0.8, 1.0), (0.5, 0.5), (0.25, 0.25))


# ------------------------------------------------------------ test-cell helpers
def is_grading() -> str | None:
    """``"autograde"`` or ``"validate"`` while nbgrader executes the notebook
    (it sets ``NBGRADER_EXECUTION``), else ``None``. Notebooks use it to size
    their runs so grading stays fast."""
    value = os.environ.get("NBGRADER_EXECUTION", "").strip()
    return value or None


def credit(fraction, points) -> float:
    """Partial credit for a test cell: ``fraction`` of ``points``, clamped to
    [0, points] and returned as a Python float (what nbgrader requires).
    ``True``/``False`` count as 1/0; NaN counts as 0."""
    if isinstance(points, bool) or not isinstance(points, Real) or not points >= 0:
        raise ValueError(f"points must be a non-negative number, got {points!r}")
    if isinstance(fraction, bool):
        fraction = float(fraction)
    try:
        f = float(fraction)
    except (TypeError, ValueError):
        raise TypeError(f"fraction must be a number, got {type(fraction).__name__} {fraction!r}") from None
    if math.isnan(f):
        f = 0.0
    return float(min(max(f, 0.0), 1.0) * float(points))


def ratio_credit(ratio, points, bands=DEFAULT_BANDS) -> float:
    """Credit for a measured/reference ratio (e.g. throughput against a
    reference measured in the same grading run on the same machine).

    ``bands`` are ``(minimum_ratio, fraction)`` pairs; the best band whose
    minimum the ratio reaches gives the fraction (default: >= 0.8 full credit,
    >= 0.5 half, >= 0.25 a quarter, else 0)."""
    ordered = sorted(((float(lo), float(fr)) for lo, fr in bands), reverse=True)
    if not ordered:
        raise ValueError("bands must hold at least one (minimum_ratio, fraction) pair")
    try:
        r = float(ratio)
    except (TypeError, ValueError):
        return credit(0.0, points)
    if math.isnan(r):
        return credit(0.0, points)
    for lo, fraction in ordered:
        if r >= lo:
            return credit(fraction, points)
    return credit(0.0, points)


# -------------------------------------------------------------- course settings
def lab_settings(lab: str, params_file: Path | str = PARAMS_FILE) -> dict:
    """The entry for ``lab`` in ``labs/params.yml`` (keys: ci, full, timeout)."""
    import yaml

    with open(params_file) as f:
        table = yaml.safe_load(f) or {}
    matches = [name for name in table if name == lab or name.split("_", 1)[0] == lab]
    if len(matches) != 1:
        raise ValueError(f"lab {lab!r} not found (or ambiguous) in {params_file}; known: {sorted(table)}")
    entry = dict(table[matches[0]] or {})
    entry["name"] = matches[0]
    return entry


def _timeout_for(lab: str, params_file: Path) -> int:
    try:
        return int(lab_settings(lab, params_file).get("timeout", DEFAULT_TIMEOUT))
    except (FileNotFoundError, ValueError):
        return DEFAULT_TIMEOUT


def _ensure_tools_on_path() -> None:
    """nbgrader runs the ``alembic`` executable when it creates a gradebook; when
    this interpreter was started by full path (``/venv/bin/python -m ...``) its
    ``bin`` folder may not be on PATH, so add it (this CLI's own process only)."""
    if shutil.which("alembic") is None:
        bindir = str(Path(sys.executable).parent)
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


def course_api(root: Path | str = GRADING_ROOT, timeout: int | None = None):
    """An ``NbGraderAPI`` for the course at ``root``, configured from
    ``root/nbgrader_config.py`` (``Execute.timeout`` overridden when given)."""
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
    coursedir = CourseDirectory(config=config)
    return NbGraderAPI(coursedir=coursedir, config=config)


def source_labs(root: Path | str = GRADING_ROOT) -> list[str]:
    src = Path(root) / "source"
    return sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))) if src.is_dir() else []


def resolve_labs(labs, known: list[str]) -> list[str]:
    """Full lab names for what a user typed (``01``, ``01_single_node``); all of ``known`` when empty."""
    if not labs:
        return list(known)
    chosen = []
    for lab in labs:
        hits = [k for k in known if k == lab or k.split("_", 1)[0] == lab]
        if len(hits) != 1:
            raise ValueError(f"unknown lab {lab!r}; known labs: {', '.join(known)}")
        chosen.append(hits[0])
    return chosen


def _select(labs, root) -> list[str]:
    return resolve_labs(labs, source_labs(root))


def _check(result: dict, what: str) -> None:
    if not result.get("success"):
        detail = (result.get("error") or "") + "\n" + (result.get("log") or "")
        raise RuntimeError(f"nbgrader {what} failed:\n{detail.strip()[-4000:]}")


# ------------------------------------------------------------ course operations
def release(labs=None, root: Path | str = GRADING_ROOT, labs_dir: Path | str | None = LABS_DIR,
            params_file: Path | str = PARAMS_FILE) -> list[Path]:
    """Generate the student version of each lab (all when ``labs`` is empty)
    into ``root/release/<lab>`` and copy it to ``labs_dir/<lab>`` (the
    committed release students open). Returns the written folders."""
    root = Path(root)
    written = []
    for lab in _select(labs, root):
        api = course_api(root, _timeout_for(lab, Path(params_file)))
        _check(api.generate_assignment(lab, force=True, create=True), f"generate_assignment {lab}")
        out = root / "release" / lab
        if labs_dir is not None:
            dest = Path(labs_dir) / lab
            dest.mkdir(parents=True, exist_ok=True)
            for item in out.iterdir():
                target = dest / item.name
                if item.is_dir():
                    shutil.copytree(item, target, dirs_exist_ok=True)
                else:
                    shutil.copy2(item, target)
            written.append(dest)
        else:
            written.append(out)
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


def _submissions(folder: Path):
    """(student, lab) pairs in ``folder/<student>/<lab>/``."""
    for student in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for lab in sorted(p for p in student.iterdir() if p.is_dir() and not p.name.startswith(".")):
            yield student.name, lab.name


def autograde(submissions: Path | str, labs=None, root: Path | str = GRADING_ROOT,
              params_file: Path | str = PARAMS_FILE) -> dict:
    """Copy ``submissions/<student>/<lab>/`` into the course's ``submitted/``
    folder and autograde each one with the lab's timeout. Returns
    ``{(student, lab): score}``; raises RuntimeError listing any failures."""
    from nbgrader.api import Gradebook, MissingEntry

    root, submissions = Path(root).resolve(), Path(submissions).resolve()
    if not submissions.is_dir():
        raise ValueError(f"submissions folder {submissions} does not exist")
    wanted = set(_select(labs, root))
    scores, failures = {}, []
    for student, lab in _submissions(submissions):
        if lab not in wanted:
            continue
        dest = root / "submitted" / student / lab
        if dest.resolve() != (submissions / student / lab):
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(submissions / student / lab, dest)
        api = course_api(root, _timeout_for(lab, Path(params_file)))
        with Gradebook(api.coursedir.db_url) as gb:
            try:
                gb.find_assignment(lab)
            except MissingEntry:
                _check(api.generate_assignment(lab, force=True, create=True), f"generate_assignment {lab}")
        result = api.autograde(lab, student, force=True, create=True)
        if not result.get("success"):
            failures.append(f"{student}/{lab}: {(result.get('error') or result.get('log') or '')[-1500:]}")
            continue
        with Gradebook(api.coursedir.db_url) as gb:
            scores[(student, lab)] = gb.find_submission(lab, student).score
        print(f"autograded {student}/{lab}: {scores[(student, lab)]:g}")
    if failures:
        raise RuntimeError("autograde failed for:\n" + "\n".join(failures))
    return scores


def export_grades(csv_path: Path | str | None = None, root: Path | str = GRADING_ROOT) -> Path:
    """Write one row per (student, lab) with score, max score, auto score and
    whether manual grading is still needed, from the Gradebook."""
    from nbgrader.api import Gradebook, MissingEntry

    root = Path(root).resolve()
    csv_path = Path(csv_path) if csv_path else root / "grades.csv"
    api = course_api(root)
    rows = []
    with Gradebook(api.coursedir.db_url) as gb:
        for assignment in gb.assignments:
            for student in gb.students:
                try:
                    sub = gb.find_submission(assignment.name, student.id)
                except MissingEntry:
                    rows.append([student.id, assignment.name, "", assignment.max_score, "", "", "missing"])
                    continue
                rows.append([student.id, assignment.name, sub.score, sub.max_score,
                             sub.code_score + sub.written_score, sub.needs_manual_grade, "submitted"])
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", "lab", "score", "max_score", "code_plus_written_score", "needs_manual_grade", "status"])
        w.writerows(rows)
    return csv_path


def feedback(labs=None, root: Path | str = GRADING_ROOT) -> list[Path]:
    """Generate feedback HTML for every autograded submission."""
    root = Path(root).resolve()
    out = []
    for lab in _select(labs, root):
        graded = root / "autograded"
        students = sorted(p.name for p in graded.iterdir() if (p / lab).is_dir()) if graded.is_dir() else []
        api = course_api(root)
        for student in students:
            _check(api.generate_feedback(lab, student, force=True), f"generate_feedback {student}/{lab}")
            out.extend(sorted((root / "feedback" / student / lab).glob("*.html")))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.grading", description="nbgrader course operations")
    parser.add_argument("--root", default=str(GRADING_ROOT), help="course root (default: grading/)")
    sub = parser.add_subparsers(dest="command", required=True)
    parser.add_argument("--labs-dir", default=None, help="committed student releases (default: <root>/../labs)")
    p = sub.add_parser("release", help="generate the student release of every lab into labs/")
    p.add_argument("--labs", default="", help="comma-separated labs, e.g. 01,03 (default: all)")
    p = sub.add_parser("check-release", help="exit 1 when labs/ differs from a fresh release")
    p.add_argument("--labs", default="")
    p = sub.add_parser("autograde", help="autograde SUBMISSIONS/<student>/<lab>/<lab>.ipynb")
    p.add_argument("submissions")
    p.add_argument("--labs", default="")
    p = sub.add_parser("export", help="write grades to CSV")
    p.add_argument("--csv", default=None, help="output file (default: grading/grades.csv)")
    p = sub.add_parser("feedback", help="generate feedback HTML for autograded submissions")
    p.add_argument("--labs", default="")
    args = parser.parse_args(argv)
    labs = [s for s in getattr(args, "labs", "").split(",") if s]
    labs_dir = Path(args.labs_dir) if args.labs_dir else Path(args.root).resolve().parent / "labs"
    try:
        if args.command == "release":
            for path in release(labs, args.root, labs_dir):
                print(f"released {path}")
        elif args.command == "check-release":
            problems = check_release(labs, args.root, labs_dir)
            for line in problems:
                print(line)
            if problems:
                return 1
            print("labs/ is up to date with grading/source/")
        elif args.command == "autograde":
            autograde(args.submissions, labs, args.root)
        elif args.command == "export":
            print(f"wrote {export_grades(args.csv, args.root)}")
        elif args.command == "feedback":
            for path in feedback(labs, args.root):
                print(f"feedback {path}")
    except (RuntimeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
