"""Course operations on the nbgrader course in ``grading/`` (the ``make`` targets call these).

::

    python -m lab_utils.grading release            # grading/source/<lab> -> labs/<lab>
    python -m lab_utils.grading check-release      # exit 1 if labs/ is stale or holds a solution
    python -m lab_utils.grading autograde DIR      # DIR/<student>/<lab>/<lab>.ipynb
    python -m lab_utils.grading export [--csv grading/grades.csv]
    python -m lab_utils.grading feedback           # grading/feedback/<student>/<lab>/*.html

Built on :mod:`lab_utils.grading.layout` (paths, ``labs/params.yml``, lab names) and
:mod:`lab_utils.grading.nbapi` (nbgrader's API, checked; ``export`` is its
``export_grades``); autograding a class is :mod:`lab_utils.grading.batch`.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from lab_utils.grading import batch, nbapi, results
from lab_utils.grading.layout import GRADING_ROOT, LABS_DIR, select_labs

__all__ = ["release", "check_release", "autograde", "feedback"]


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
    for lab in select_labs(labs, root):
        api = nbapi.course_api(root)
        nbapi.check(api.generate_assignment(lab, force=True, create=True), f"generate_assignment {lab}")
        out = root / "release" / lab
        if labs_dir is None:
            written.append(out)
            continue
        dest = Path(labs_dir) / lab
        dest.mkdir(parents=True, exist_ok=True)
        for item in out.iterdir():
            if item.is_dir():
                shutil.copytree(item, dest / item.name, dirs_exist_ok=True, copy_function=copy_into)
            else:
                copy_into(item, dest / item.name)
        written.append(dest)
    return written


def copy_into(src: Path | str, dst: Path | str) -> None:
    """``src``'s content at ``dst``. A file already there keeps its owner, mode and group: in a
    course its instructors' group shares, it may be another instructor's, whose times and mode
    only they may set (``copy2`` would fail there); a new file takes ``src``'s mode. A link at
    ``dst`` is replaced, not followed."""
    if os.path.islink(dst):
        os.unlink(dst)  # replaced, never written through
    if os.path.isfile(dst):
        shutil.copyfile(src, dst)
    else:
        shutil.copy2(src, dst)


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
        for lab in select_labs(labs, root):
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
    slurm: bool = False,
    sbatch_args: list[str] | tuple[str, ...] = (),
    max_running: int | None = None,
    unsafe_no_sandbox: bool = False,
) -> dict:
    """Grade ``submissions/<student>/<lab>/`` (see :mod:`lab_utils.grading.batch`; with
    ``slurm``, as Slurm job arrays: :mod:`lab_utils.grading.slurm`).
    Returns ``{(student, lab): score}``; raises RuntimeError listing any
    infrastructure error (those submissions are not scored: run again)."""
    if slurm:
        from lab_utils.grading import slurm as on_slurm

        rows = on_slurm.autograde(
            submissions,
            labs,
            root,
            resume=resume,
            settings_file=settings_file,
            sbatch_args=sbatch_args,
            max_running=max_running,
            out=out or sys.stdout,
            unsafe_no_sandbox=unsafe_no_sandbox,
        )
    else:
        rows = batch.autograde(
            submissions,
            labs,
            root,
            jobs=jobs,
            resume=resume,
            settings_file=settings_file,
            out=out or sys.stdout,
            unsafe_no_sandbox=unsafe_no_sandbox,
        )
    failed = [r for r in rows if r["status"] != "graded"]
    if failed:
        raise RuntimeError(
            "autograde failed for:\n"
            + "\n".join(
                f"{r['student']}/{r['lab']}: {r['reason']}\n  " + "\n  ".join(r["log_tail"][-15:]) for r in failed
            )
        )
    return {(r["student"], r["lab"]): r["score"] for r in rows}


def feedback(labs=None, root: Path | str = GRADING_ROOT) -> list[Path]:
    """Generate feedback HTML for every autograded submission, with its flags on top."""
    root = Path(root).resolve()
    out = []
    for lab in select_labs(labs, root):
        graded = root / "autograded"
        students = sorted(p.name for p in graded.iterdir() if (p / lab).is_dir()) if graded.is_dir() else []
        api = nbapi.course_api(root)
        for student in students:
            nbapi.check(api.generate_feedback(lab, student, force=True), f"generate_feedback {student}/{lab}")
            record = results.results_dir(root) / student / f"{lab}.json"
            if record.is_file():  # the batch's flags, at the top of the page (as autograde put them)
                results.add_flags_to_feedback(
                    root / "feedback" / student / lab, json.loads(record.read_text())["flags"]
                )
            out.extend(sorted((root / "feedback" / student / lab).glob("*.html")))
    return out
