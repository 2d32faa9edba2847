"""The public student repository: what a class may see of this (private) instructor repository.

``python -m lab_utils.grading student-repo DEST`` (``make student-repo DEST=path``) writes a
git repository a class can publish, and nbgitpuller links and Binder can point at: the
student notebooks (``labs/``), ``lab_utils``, ``binder/``, ``environment.yml`` and the lock,
the setup and lab scripts, and a student README and Makefile (``deploy/student-repo/``).
Only files git tracks are taken (no run outputs, no course state), by an allow-list: no
``grading/`` (instructor notebooks, hidden tests, reference scripts), ``tests/``,
``bench/`` or ``deploy/``. Before anything is written every file is checked for solution
and hidden-test lines of the instructor notebooks (:mod:`lab_utils.grading.leaks`); one
found refuses the whole repository.

Run again on the same DEST (a mid-term fix), it replaces the tree with the new one and
commits the difference, so the public history shows what changed and nbgitpuller merges it
into each student's copy without losing their cells.

**References after the due date.** ``--references 02_ps_async`` (``make student-repo
REFERENCES=02_ps_async``) also publishes that lab's reference scripts (its ``%%writefile``
scripts, the instructor's solutions) into ``labs/references/<lab>/``, once the lab is past its
due time in the term's schedule (:mod:`lab_utils.grading.schedule`), and never before: a lab
that is not due yet, has no due time or is not part of the term is refused. A student stuck
with a broken earlier script (Labs 3 and 6 run Lab 2's, Lab 4 runs Lab 3's, Lab 5 runs Lab 4's)
continues with it (:func:`lab_utils.grading.scripts.find_lab_script` finds it). What was
published stays published: a later update keeps it (and checks it against the schedule again)."""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from lab_utils.grading import course, leaks
from lab_utils.grading.layout import REPO_ROOT

REPO = REPO_ROOT
#: Files (or folders, ending in /) of this repository the student repository takes, as git tracks them.
TAKEN = (
    "labs/",
    "lab_utils/",
    "binder/",
    "environment.yml",
    "pyproject.toml",
    "requirements/constraints.txt",
    "requirements/constraints-2.15.txt",
    "requirements/base.in",
    "scripts/setup.sh",
    "scripts/stacks.sh",
    "scripts/stack-keras.sh",
    "scripts/horovod-patches/",
    "scripts/find-python.sh",
    "scripts/build-horovod.sh",
    "scripts/jupyterlab-overrides.json",
    "scripts/lab.sh",
)
#: Written over what TAKEN gives: the student's README and Makefile.
OWN = {
    "README.md": "deploy/student-repo/README.md",
    "Makefile": "deploy/student-repo/Makefile",
    "AGENTS.md": "deploy/student-repo/AGENTS.md",  # the course's policy on AI assistants, where they look for one
}
#: A file only this tool writes: a DEST holding it may be updated, any other non-empty DEST is refused.
MARK = ".student-repo"


#: git with no hook and no file-system monitor of the repository's own: it may be another
#: account's (a class's instructors share the course and the student repository)
PLAIN_GIT = ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false"]


def _tracked(root: Path) -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(root), *PLAIN_GIT, "ls-files", "-z"], capture_output=True, text=True, check=False, timeout=60
    )
    if out.returncode != 0:
        raise ValueError(f"{root} is not a git checkout (git ls-files: {out.stderr.strip()})")
    return [p for p in out.stdout.split("\0") if p]


def files(root: Path | str = REPO) -> dict[str, Path]:
    """Path in the student repository -> the file it is copied from."""
    root = Path(root)
    chosen = {
        rel: root / rel
        for rel in _tracked(root)
        if any(rel == t or (t.endswith("/") and rel.startswith(t)) for t in TAKEN) and (root / rel).is_file()
    }
    for rel, src in OWN.items():
        chosen[rel] = root / src
    return chosen


def _git(dest: Path, *args: str) -> subprocess.CompletedProcess:
    who = ["-c", "user.name=" + os.environ.get("GIT_AUTHOR_NAME", "Course staff")]
    who += ["-c", "user.email=" + os.environ.get("GIT_AUTHOR_EMAIL", "course-staff@localhost")]
    return subprocess.run(
        ["git", "-C", str(dest), *who, *PLAIN_GIT, *args], capture_output=True, text=True, timeout=120
    )


#: Where a lab's published reference scripts go in the student repository
REFERENCES = "labs/references"


def references(labs, root: Path, now: datetime | None = None) -> dict[str, Path]:
    """Path in the student repository -> the reference script it is copied from, for each lab of
    ``labs`` (names or numbers) that is past its due time in the course's schedule. ValueError
    naming the lab and its due time for one that is not (or has none, or is not in the term)."""
    from lab_utils.grading import schedule, scripts

    labs = [lab for lab in labs if lab]
    if not labs:
        return {}
    grading = root / "grading"
    path = schedule.course_schedule(grading)
    if not path.is_file():
        raise ValueError(f"no schedule at {path}: a lab's references are published after its due time, which it gives")
    term = schedule.load(path)
    now = now or datetime.now(UTC)
    chosen = {}
    for lab in labs:
        try:
            entry = term.entry(lab)
        except KeyError as exc:
            raise ValueError(f"refused: {exc.args[0]}") from None
        if entry.due is None:
            raise ValueError(f"refused: {entry.lab} has no due time in {path}: its references wait for one")
        if now < entry.due:
            raise ValueError(
                f"refused: {entry.lab} is due {entry.due.isoformat()} ({path}): its reference scripts are "
                "published after that, never before"
            )
        for script in scripts.extract_references([entry.lab], grading):
            chosen[f"{REFERENCES}/{entry.lab}/{script.name}"] = script
    return chosen


def write(
    dest: Path | str,
    root: Path | str = REPO,
    message: str | None = None,
    publish: list[str] | tuple[str, ...] = (),
    now: datetime | None = None,
) -> str:
    """Write (or update) the student repository at ``dest`` and commit it; return one line
    saying what was done. ``publish``: labs whose reference scripts to publish too (past their
    due time; those published before stay). ``ValueError``: a solution or hidden-test line would
    be published (each named), a lab to publish is not past its due time, ``labs/`` is not the
    release of ``grading/source/``, ``dest`` is inside this repository, or ``dest`` is something
    this tool did not make."""
    root, dest = Path(root).resolve(), Path(dest).resolve()
    if dest == root or root in dest.parents:
        raise ValueError(f"DEST={dest} is inside the instructor repository {root}: choose a folder outside it")
    if dest.exists() and not dest.is_dir():
        raise ValueError(f"DEST={dest} is a file: give a new or empty folder")
    fresh = not dest.exists() or not any(dest.iterdir())
    if not fresh and not (dest / MARK).is_file():
        raise ValueError(f"DEST={dest} is not empty and was not written by student-repo: give a new or empty folder")
    chosen = files(root)
    missing = sorted(rel for rel, src in chosen.items() if not src.is_file())
    if missing:
        raise ValueError(f"the student repository needs {', '.join(missing)}, missing from {root}")
    sources = leaks.source_notebooks(root / "grading" / "source")
    if not sources:
        raise ValueError(f"no instructor notebooks under {root / 'grading' / 'source'}: nothing to check against")
    stale = course.check_release([], root / "grading", root / "labs")
    if stale:
        raise ValueError("labs/ is not the release of grading/source/ (run make release first):\n" + "\n".join(stale))
    published = (
        sorted(p.name for p in (dest / REFERENCES).iterdir() if p.is_dir()) if (dest / REFERENCES).is_dir() else []
    )
    refs = references(sorted({*published, *publish}), root, now)
    found = leaks.find_leaks(sorted(chosen.values()), sources)  # the references are the solutions they are
    if found:
        raise ValueError(
            f"refused: {len(found)} solution or hidden-test line(s) would be published, e.g.\n"
            + "\n".join(str(x) for x in found[:10])
        )
    chosen.update(refs)
    dest.mkdir(parents=True, exist_ok=True)
    if fresh:
        init = _git(dest, "init", "-q", "-b", "main")
        if init.returncode != 0:
            raise RuntimeError(f"git init {dest}: {init.stderr.strip()}")
    for old in dest.rglob("*"):  # the previous tree goes (a file deleted upstream is deleted here too)
        rel = old.relative_to(dest)
        if rel.parts[0] != ".git" and old.is_file() and str(rel) not in chosen and rel.name != MARK:
            old.unlink()
    for rel, src in chosen.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        course.copy_into(src, target)
    for folder in sorted((p for p in dest.rglob("*") if p.is_dir() and ".git" not in p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    head = _git(root, "rev-parse", "--short", "HEAD").stdout.strip() or "unknown"
    sources = [str(src.relative_to(root)) for src in chosen.values()]
    if _git(root, "status", "--porcelain", "--", *sources).stdout.strip():
        head += " with uncommitted changes"
    (dest / MARK).write_text("Written by `make student-repo` from the course's instructor repository: edit that one.\n")
    done = _git(dest, "add", "-A")
    if done.returncode != 0:
        raise RuntimeError(f"git add in {dest}: {done.stderr.strip()}")
    labs_published = sorted({rel.split("/")[2] for rel in refs})
    what = f"{len(chosen) + 1} files, no solution or hidden test" + (
        f" but the reference scripts of {', '.join(labs_published)}, past their due time" if refs else ""
    )
    if _git(dest, "diff", "--cached", "--quiet").returncode == 0 and not fresh:
        return f"student repository at {dest}: {what}; unchanged, nothing committed"
    done = _git(dest, "commit", "-q", "-m", message or f"Course update (instructor repository {head})")
    if done.returncode != 0:
        raise RuntimeError(f"git commit in {dest}: {(done.stderr or done.stdout).strip()}")
    return f"student repository at {dest}: {what}; {'created' if fresh else 'updated'}, committed"
