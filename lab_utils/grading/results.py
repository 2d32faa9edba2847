"""What a grading batch writes: one JSON per student x lab with its provenance, the grades
CSV, the summary of flags, and the merge of a sandbox's grades into the course gradebook.

:mod:`lab_utils.grading.batch` grades; this module records. A result is resumable by its
provenance: the hashes of the submission and of the tests and settings it was graded with.
"""

from __future__ import annotations

import csv
import hashlib
import html
import json
import os
import platform
import re
import shutil
import subprocess
import warnings
from collections import Counter
from importlib import metadata
from pathlib import Path

from lab_utils.grading.layout import GRADING_ROOT, REPO_ROOT
from lab_utils.grading.safefiles import copy_plain, hash_plain

__all__ = [
    "results_dir",
    "hashes",
    "provenance",
    "write_json",
    "merge",
    "install",
    "not_graded",
    "line",
    "flag_lines",
    "add_flags_to_feedback",
    "write_csv",
    "spreadsheet_safe",
    "summary",
]

_VERSIONED = ("tensorflow-cpu", "tensorflow", "horovod", "nbgrader", "numpy", "ipykernel")


def results_dir(root: Path | str = GRADING_ROOT) -> Path:
    return Path(root) / "results"


def hashes(root: Path, submission: Path, lab: str, settings: dict) -> dict:
    """What a result was graded from: the submission folder, and the lab's tests (its
    instructor notebook), the nbgrader configuration and the grading settings. A result
    whose hashes still match is not graded again."""
    tests = hashlib.sha256((root / "source" / lab / f"{lab}.ipynb").read_bytes())
    tests.update((root / "nbgrader_config.py").read_bytes())
    tests.update(json.dumps(settings, sort_keys=True).encode())
    return {"submission_sha256": hash_plain(submission), "tests_sha256": tests.hexdigest()}


def provenance() -> dict:
    """The grading machine: host, Python, the versions that decide a result, lab_utils' commit."""
    versions = {}
    for name in _VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    proc = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    commit = (proc.stdout.strip() or None) if proc.returncode == 0 else None
    return {
        "host": platform.node(),
        "python": platform.python_version(),
        "versions": versions,
        "lab_utils_commit": commit,
    }


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def merge(db_url: str, worker_db: Path, lab: str, student: str, course_id: str) -> None:
    """Copy the worker's grades and comments of ``student``/``lab`` into the course gradebook."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    with (
        warnings.catch_warnings(),
        Gradebook(f"sqlite:///{worker_db}", course_id) as src,
        Gradebook(db_url, course_id) as dst,
    ):
        # nbgrader 0.9's add_submission builds the submission's notebooks and grades
        # before adding it to the session; SQLAlchemy 2 warns, then adds them all with it
        warnings.filterwarnings("ignore", message=r"Object of type <Submitted\w+> not in session", category=SAWarning)
        graded = src.find_submission(lab, student)
        dst.update_or_create_student(student)
        dst.update_or_create_submission(lab, student, timestamp=graded.timestamp)
        for nb in graded.notebooks:
            for g in nb.grades:
                d = dst.find_grade(g.name, nb.name, lab, student)
                d.auto_score, d.manual_score, d.extra_credit = g.auto_score, g.manual_score, g.extra_credit
                d.needs_manual_grade = g.needs_manual_grade
            for cm in nb.comments:
                d = dst.find_comment(cm.name, nb.name, lab, student)
                d.auto_comment, d.manual_comment = cm.auto_comment, cm.manual_comment
            dst.find_submission_notebook(nb.name, lab, student).flagged = nb.flagged
        dst.db.commit()


def _replace_tree(src: Path, dest: Path) -> None:
    """``dest`` made anew with the plain files of ``src`` (a link is neither followed nor copied)."""
    shutil.rmtree(dest, ignore_errors=True)
    copy_plain(src, dest)


def copy_files(src: Path, names: list[str], dest: Path) -> None:
    """``dest`` made anew with only ``names`` of ``src`` (plain files; a link is not followed)."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for name in names:
        f = src / name
        if f.is_file() and not f.is_symlink():
            shutil.copy2(f, dest / name)


def install(root: Path, db_url: str, course_id: str, submissions: Path, result: dict) -> None:
    """Merge a graded sandbox into the course: gradebook, submitted/, autograded/, feedback/
    (the caller holds the batch's lock: one writer). Into autograded/ go only the files the
    worker kept (``autograded_files``: the notebook, and the lab's own scripts within their
    size cap), never what else a submission wrote while it ran."""
    student, lab = result["student"], result["lab"]
    merge(db_url, Path(result["db"]), lab, student, course_id)
    _replace_tree(submissions / student / lab, root / "submitted" / student / lab)
    kept = result.pop("autograded_files", None) or [f"{lab}.ipynb"]
    copy_files(Path(result["autograded"]), kept, root / "autograded" / student / lab)
    if Path(result["feedback"]).is_dir():
        pages = sorted(p.name for p in Path(result["feedback"]).glob("*.html"))  # nbgrader's pages only
        copy_files(Path(result["feedback"]), pages, root / "feedback" / student / lab)
        add_flags_to_feedback(root / "feedback" / student / lab, result["flags"])
    for key in ("autograded", "feedback", "db"):
        result.pop(key, None)


def not_graded(student: str, lab: str, reason: str, log: Path | None = None, *, status: str = "infrastructure error",
               flags: list[dict] | None = None) -> dict:  # fmt: skip
    """A result without a score (never a 0): ``status`` and why, with the last 40 lines of
    ``log`` when there is one; the next run grades it again."""
    tail = log.read_text(errors="replace").splitlines()[-40:] if log is not None and log.is_file() else []
    return {
        "status": status,
        "student": student,
        "lab": lab,
        "reason": reason,
        "log_tail": tail,
        "score": None,
        "max_score": None,
        "cells": [],
        "flags": list(flags or []),
    }


def line(result: dict) -> str:
    if result["status"] != "graded":
        return f"{result['status'].upper()}: {result['reason']}"
    flags = f"  flags: {', '.join(sorted({f['kind'] for f in result['flags']}))}" if result["flags"] else ""
    return f"{result['score']:g}/{result['max_score']:g}{flags}"


#: Examples one kind's line shows; the result JSON keeps every flag.
FLAG_EXAMPLES = 3


def _grouped(flags: list[dict]) -> dict[str, Counter]:
    """kind -> Counter of what was flagged (a flag's ``group``: its detail without what
    differs per instance, such as a pid; else its detail), both in order of first appearance."""
    kinds: dict[str, Counter] = {}
    for f in flags:
        kinds.setdefault(f["kind"], Counter())[f.get("group") or f["detail"]] += 1
    return kinds


def _described(seen: Counter, examples: int) -> str:
    """``what``, or ``what ×n; what; ... and M more``: the first ``examples`` of one kind."""
    shown = [what if n == 1 else f"{what} ×{n}" for what, n in list(seen.items())[:examples]]
    return "; ".join(shown) + (f"; and {len(seen) - examples} more" if len(seen) > examples else "")


def flag_lines(flags: list[dict], examples: int = FLAG_EXAMPLES) -> list[str]:
    """One line per kind of flag of one submission: ``kind: detail`` for one flag, and for
    several ``kind ×N: what ×n; what; ... and M more`` (the first ``examples`` of them).
    A process bomb's 493 leaked processes make one line, not 493."""
    lines = []
    for kind, seen in _grouped(flags).items():
        total = sum(seen.values())
        lines.append(f"{kind if total == 1 else f'{kind} ×{total}'}: {_described(seen, examples)}")
    return lines


#: The feedback section :func:`add_flags_to_feedback` writes (and replaces when run again).
_FLAGS_SECTION = re.compile(r'\n?<section id="grading-flags"[^>]*>.*?</section>\n?', re.S)


def add_flags_to_feedback(folder: Path, flags: list[dict]) -> None:
    """Put a submission's flags (:func:`flag_lines`) at the top of each feedback HTML file in
    ``folder``, where the student reads why points went; run again, it replaces its section."""
    lines = flag_lines(flags)
    for page in sorted(Path(folder).glob("*.html")):
        text = _FLAGS_SECTION.sub("\n", page.read_text(encoding="utf-8", errors="replace"))
        if lines:
            items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
            section = (
                '\n<section id="grading-flags" style="border:2px solid #c60;padding:0 1em;margin:1em">'
                f"<h2>Grading notes</h2><ul>{items}</ul></section>\n"
            )
            body = re.search(r"<body[^>]*>", text)
            at = body.end() if body else 0
            text = text[:at] + section + text[at:]
        page.write_text(text, encoding="utf-8")


#: what a spreadsheet takes a cell starting with for a formula (OWASP's list)
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value):
    """``value`` for a CSV an instructor opens in a spreadsheet: a text that would start a
    formula (``=HYPERLINK(...)`` in a student's name or a flag) gets a leading quote."""
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    return value


def write_csv(results: list[dict], path: Path) -> Path:
    """One row per student x lab: score, status, flags, and the test cells that did not pass."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", "lab", "status", "score", "max_score", "flags", "not_passed"])
        for r in sorted(results, key=lambda r: (r["student"], r["lab"])):
            w.writerow(
                map(
                    spreadsheet_safe,
                    [
                        r["student"],
                        r["lab"],
                        r["status"],
                        "" if r["score"] is None else r["score"],
                        "" if r["max_score"] is None else r["max_score"],
                        " | ".join(flag_lines(r["flags"])),
                        "; ".join(f"{c['grade_id']} {c['status']}" for c in r["cells"] if c["status"] != "passed"),
                    ],
                )
            )
    return path


def summary(results: list[dict], say=print) -> None:
    """Print the flags by kind (what the instructor should look at): under each kind, one line
    per submission (:func:`flag_lines`: a count and the first examples where it has many)."""
    flagged = [r for r in results if r["flags"]]
    infra = [r for r in results if r["status"] != "graded"]
    say(
        f"graded {len(results) - len(infra)} of {len(results)}; {len(flagged)} flagged; "
        f"{len(infra)} infrastructure error(s)"
    )
    for r in infra:
        label = "CANCELLED" if r["status"] == "cancelled" else "INFRASTRUCTURE"
        say(f"  {label} {r['student']}/{r['lab']}: {r['reason']} (not scored; run again)")
    grouped = [(r, _grouped(r["flags"])) for r in flagged]  # once per submission
    for kind in sorted({kind for _, kinds in grouped for kind in kinds}):
        say(f"  {kind}:")
        for r, kinds in grouped:
            seen = kinds.get(kind)
            if seen:
                count = f" ({sum(seen.values())})" if sum(seen.values()) > 1 else ""
                say(f"    {r['student']}/{r['lab']}{count}: {_described(seen, FLAG_EXAMPLES)}")
