"""Training scripts of the labs: the instructor's reference, and a student's own.

A lab's training script (``train_async.py`` in Lab 2, ``train_sync.py`` in Lab 3)
is written by a ``%%writefile`` cell of the notebook, with the solution between
``### BEGIN SOLUTION`` and ``### END SOLUTION``. The instructor notebook in
``grading/source/<lab>/`` is the ONE copy of that solution: nothing in
``lab_utils`` (installed in every student environment) holds it.

- :func:`reference_script` extracts the instructor's script into the git-ignored
  ``grading/reference/<lab>/<name>`` (hidden throughput tests compare a student's
  script with it; ``make release`` extracts every one of them).
- :func:`find_lab_script` finds the script a student wrote in an earlier lab
  (Lab 3 runs the student's own Lab 2 ``train_async.py``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lab_utils import config
from lab_utils.grading.cells import is_grading
from lab_utils.grading.layout import GRADING_ROOT, resolve_labs, select_labs

__all__ = [
    "REFERENCE_DIR",
    "writefile_scripts",
    "solution_lines",
    "reference_script",
    "extract_references",
    "find_lab_script",
]

#: Where extracted reference scripts go (git-ignored): ``<course root>/reference/<lab>/<name>``.
REFERENCE_DIR = "reference"
_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


def _cells(notebook: Path) -> list[dict]:
    with open(notebook, encoding="utf-8") as f:
        return json.load(f).get("cells", [])


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def writefile_scripts(notebook: Path | str) -> dict[str, str]:
    """``{file name: text}`` of every ``%%writefile`` cell of ``notebook``, solution
    kept: the ``%%writefile`` line and the solution marker lines are dropped, the
    lines between the markers kept. Cells are taken in order, as IPython runs them
    (``%%writefile -a`` appends, a plain ``%%writefile`` starts the file over)."""
    scripts: dict[str, str] = {}
    for cell in _cells(Path(notebook)):
        if cell.get("cell_type") != "code":
            continue
        first, _, body = _source(cell).partition("\n")
        words = first.split()
        if not words or words[0] != "%%writefile":
            continue
        append = "-a" in words[1:] or "--append" in words[1:]
        names = [w for w in words[1:] if not w.startswith("-")]
        if len(names) != 1:
            raise ValueError(f"{notebook}: cannot read the file name of {first!r}")
        if names[0] != Path(names[0]).name or names[0].startswith("."):
            # the grader writes each script under reference/<lab>/ by this name, as root
            raise ValueError(f"{notebook}: {first!r} writes {names[0]!r}: a script is a plain file name, no folder")
        kept = "".join(line for line in body.splitlines(keepends=True) if line.strip() not in _MARKERS)
        if kept and not kept.endswith("\n"):
            kept += "\n"  # IPython's %%writefile ends the file with a newline
        scripts[names[0]] = (scripts.get(names[0], "") if append else "") + kept
    return scripts


def solution_lines(root: Path | str = GRADING_ROOT, min_chars: int = 30) -> list[str]:
    """The stripped lines (``min_chars`` or longer) inside the solution regions of every
    ``%%writefile`` cell of the instructor notebooks: what a reference script holds and
    the student release does not."""
    found: set[str] = set()
    for notebook in sorted(Path(root).glob("source/*/*.ipynb")):
        for cell in _cells(notebook):
            src = _source(cell)
            if cell.get("cell_type") != "code" or not src.startswith("%%writefile"):
                continue
            inside = False
            for line in src.splitlines():
                s = line.strip()
                if s in _MARKERS:
                    inside = s == _MARKERS[0]
                elif inside and len(s) >= min_chars:
                    found.add(s)
    return sorted(found)


def _write_if_changed(path: Path, text: str) -> None:
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # readers never see half a file
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _source_notebook(lab: str, root: Path) -> tuple[str, Path]:
    if not (root / "source").is_dir():
        raise FileNotFoundError(
            f"reference scripts exist only in the instructor's repository (no {root / 'source'} here): "
            "they are extracted from the instructor notebooks, which are never installed for students"
        )
    name = select_labs([lab], root)[0]  # ValueError naming the known labs
    notebook = root / "source" / name / f"{name}.ipynb"
    if not notebook.is_file():
        raise FileNotFoundError(f"lab {name}: no instructor notebook {notebook}")
    return name, notebook


def reference_script(lab: str, name: str, root: Path | str = GRADING_ROOT) -> Path:
    """The instructor's ``name`` (e.g. ``"train_async.py"``) of ``lab`` (``"02"`` or
    ``"02_ps_async"``), extracted from ``root/source/<lab>/<lab>.ipynb`` into
    ``root/reference/<lab>/<name>`` (rewritten whenever the notebook's text differs).

    Raises ValueError for an unknown lab, LookupError when the notebook has no
    ``%%writefile <name>`` cell, FileNotFoundError outside the instructor's repository."""
    shown = config.get(config.GRADING_REFERENCE_DIR)
    if shown:  # inside a grading sandbox: the instructor notebooks are out of reach, only the scripts are shown
        # (the folder of this lab's reference scripts, the only part of the course the kernel can read)
        labs = sorted(p.name for p in Path(shown).iterdir() if p.is_dir())
        path = Path(shown) / resolve_labs([lab], labs)[0] / name
        if not path.is_file():
            raise LookupError(f"the grading sandbox shows no reference {name} in {path.parent}")
        return path
    root = Path(root)
    lab_name, notebook = _source_notebook(lab, root)
    scripts = writefile_scripts(notebook)
    if name not in scripts:
        raise LookupError(
            f"{notebook.name} has no `%%writefile {name}` cell; it writes: {', '.join(sorted(scripts)) or 'no files'}"
        )
    path = root / REFERENCE_DIR / lab_name / name
    _write_if_changed(path, scripts[name])
    return path


def extract_references(labs=None, root: Path | str = GRADING_ROOT) -> list[Path]:
    """Extract every ``%%writefile`` script of each lab (all when ``labs`` is empty);
    ``make release`` calls it. Returns the written paths."""
    root = Path(root)
    paths = []
    for lab in select_labs(labs, root):
        _, notebook = _source_notebook(lab, root)
        paths += [reference_script(lab, name, root) for name in sorted(writefile_scripts(notebook))]
    return paths


def find_lab_script(name: str, lab: str, here: Path | str | None = None, root: Path | str = GRADING_ROOT) -> Path:
    """The training script ``name`` that a student wrote in an earlier ``lab`` (Lab 3, Part 2).

    Looks for ``./<name>``, then ``../<lab>/<name>`` (the earlier lab's folder next
    to this one), then ``../references/<lab>/<name>`` (the course's reference, which the
    student repository publishes after the earlier lab's due time:
    :mod:`lab_utils.grading.student_repo`), relative to ``here`` (default: the working
    directory, i.e. the notebook's folder). A student whose own script is broken copies the
    published reference next to the notebook, or removes theirs. While nbgrader grades (and under ``make run``, papermill)
    the instructor's reference comes first, so that a broken or stale earlier lab
    does not fail this one; in the instructor's repository it is the fallback.
    A student who has not written the script yet gets a FileNotFoundError saying
    which cell to run."""
    here = Path(here) if here is not None else Path.cwd()
    candidates = [here / name, here.parent / lab / name, here.parent / "references" / lab / name]
    automated = bool(is_grading() or config.get(config.RESULTS_FILE))  # nbgrader, or run_labs (papermill)
    if automated or (Path(root) / "source").is_dir():
        reference = reference_script(lab, name, root)
        candidates = [reference, *candidates] if automated else [*candidates, reference]
    for path in candidates:
        if path.is_file():
            return path.resolve()
    raise FileNotFoundError(
        f"{name} not found: looked for {', '.join(str(p) for p in candidates)}. It is the script you wrote in "
        f"{lab}: open {lab}/{lab}.ipynb and run its `%%writefile {name}` cell (Exercise 1), "
        f"or copy your {name} next to this notebook. After {lab}'s due time your instructor may publish its "
        "reference script (in the references folder beside the labs), which this lab then uses."
    )
