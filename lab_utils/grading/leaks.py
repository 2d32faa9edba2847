"""Does the student environment hold a solution or a hidden test?

The student environment is every file of the installed ``lab_utils`` package
plus everything under ``labs/``. The secrets are the lines of each instructor
notebook's ``### BEGIN SOLUTION``/``### END SOLUTION`` regions (code and
markdown answer cells; a solution cell without markers is a secret as a whole)
and ``### BEGIN HIDDEN TESTS``/``### END HIDDEN TESTS`` regions. Only distinctive
lines count: at least ``MIN_LENGTH`` characters, not a comment, not in
``ORDINARY_LINES``, and not written anywhere outside those regions in the same
notebook or in an earlier lab's notebook (a line a lab gives away is no secret
from then on; a *later* lab that shows an earlier lab's solution is a leak).

Lines are compared as :func:`normalize` writes them, so a copy with other
comments or indentation, or commented out, is still found. ``check-release`` runs
:func:`check_student_environment`; so does ``tests/unit/test_student_environment.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from lab_utils.grading.layout import LABS_DIR, SOURCE_DIR

__all__ = [
    "MIN_LENGTH",
    "ORDINARY_LINES",
    "Secret",
    "Leak",
    "normalize",
    "secret_lines",
    "course_secrets",
    "source_notebooks",
    "student_files",
    "find_leaks",
    "check_student_environment",
]

#: Shorter lines (``return problems``, ``else:``) are too common to be a solution's fingerprint.
MIN_LENGTH = 20
#: Long enough, but ordinary code that a solution shares with the rest of the world (Lab 1's
#: measure_throughput; the line every mpi4py program opens with, Lab 7's collectives):
#: listed one by one rather than weakening the rules for every line.
ORDINARY_LINES = frozenset(
    {"start = time.perf_counter()", "for _ in range(steps):", "rank, size = comm.Get_rank(), comm.Get_size()"}
)
_REGIONS = {"BEGIN SOLUTION": ("END SOLUTION", "solution"), "BEGIN HIDDEN TESTS": ("END HIDDEN TESTS", "hidden tests")}
_SKIP_DIRS = {"__pycache__", ".git"}
_BINARY_PROBE = 8192


class Secret(NamedTuple):
    """A line of a solution or hidden-test region of an instructor notebook."""

    line: str  # as compared (see normalize)
    notebook: str  # file name, e.g. 02_ps_async.ipynb
    cell: str  # the cell's nbgrader grade_id, else "cell <index>"
    kind: str  # "solution" or "hidden tests"


class Leak(NamedTuple):
    """A secret line found in a student file."""

    file: Path
    where: str  # "line 12", or "cell 4, line 3" in a notebook
    secret: Secret

    def __str__(self) -> str:
        s = self.secret
        return f"{self.file} ({self.where}): {s.kind} of {s.notebook} [{s.cell}]: {s.line}"


def normalize(line: str) -> str:
    """A line as compared: stripped, without an inline ``  # comment``, and without
    the ``#`` of a commented-out line (a commented copy of a solution still counts)."""
    return line.strip().lstrip("#").split("  #", 1)[0].strip()


def _cell_lines(path: Path) -> Iterator[tuple[int, dict, str]]:
    """(index, cell, source) of a notebook's cells."""
    with open(path, encoding="utf-8") as f:
        cells = json.load(f).get("cells", [])
    for i, cell in enumerate(cells):
        src = cell.get("source", "")
        yield i, cell, "".join(src) if isinstance(src, list) else src


def _regions(cell: dict, source: str) -> Iterator[tuple[str | None, str]]:
    """(kind or None, line) for each line of a cell, marker lines left out. As in
    nbgrader, a marker is a line containing ``BEGIN SOLUTION`` etc."""
    whole = bool(cell.get("metadata", {}).get("nbgrader", {}).get("solution")) and "BEGIN SOLUTION" not in source
    end = kind = None
    for line in source.splitlines():
        begin = next((b for b in _REGIONS if b in line), None)
        if end is None and begin:
            end, kind = _REGIONS[begin]
        elif end is not None and end in line:
            end = kind = None
        else:
            yield (kind or ("solution" if whole else None)), line


def _split(notebook: Path) -> tuple[dict[str, Secret], set[str]]:
    """(candidate secret lines, public lines) of a notebook, lines as compared."""
    found: dict[str, Secret] = {}
    public: set[str] = set()
    for i, cell, source in _cell_lines(notebook):
        cell_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or f"cell {i}"
        for kind, line in _regions(cell, source):
            text = normalize(line)
            if kind is None:
                public.add(text)
            elif len(text) >= MIN_LENGTH and not line.lstrip().startswith("#") and text not in ORDINARY_LINES:
                found.setdefault(text, Secret(text, notebook.name, cell_id, kind))
    return found, public


def _distinct(found: dict[str, Secret], given: set[str]) -> dict[str, Secret]:
    return {text: s for text, s in found.items() if text not in given}


def secret_lines(notebook: Path | str, public: Iterable[str] = ()) -> dict[str, Secret]:
    """The distinctive secret lines of an instructor notebook, keyed by the line as
    compared; lines in ``public`` (what earlier labs gave away) do not count."""
    found, own_public = _split(Path(notebook))
    return _distinct(found, own_public | {normalize(line) for line in public})


def course_secrets(source_notebooks: Iterable[Path | str]) -> dict[str, Secret]:
    """The secret lines of every notebook, taken in lab order (``01_...`` first) so
    that a line an earlier lab shows in the open is public for the later ones."""
    secrets: dict[str, Secret] = {}
    public: set[str] = set()
    for nb in sorted(map(Path, source_notebooks), key=lambda p: p.name):
        found, own_public = _split(nb)
        for text, secret in _distinct(found, own_public | public).items():
            secrets.setdefault(text, secret)
        public |= own_public
    return secrets


def source_notebooks(source_dir: Path | str = SOURCE_DIR) -> list[Path]:
    """Every instructor notebook: ``source_dir/<lab>/<lab>.ipynb``."""
    source_dir = Path(source_dir)
    return (
        sorted(p / f"{p.name}.ipynb" for p in source_dir.iterdir() if (p / f"{p.name}.ipynb").is_file())
        if source_dir.is_dir()
        else []
    )


def _package_dir(package_dir: Path | str | None) -> Path:
    if package_dir is not None:
        return Path(package_dir)
    import lab_utils

    return Path(lab_utils.__file__).resolve().parent


def student_files(package_dir: Path | str | None = None, labs_dir: Path | str | None = LABS_DIR) -> list[Path]:
    """Every file of a student environment: the installed ``lab_utils`` package
    (``package_dir``) and ``labs_dir``, caches left out."""
    files = []
    for top in (_package_dir(package_dir), labs_dir):
        if top is None or not Path(top).is_dir():
            continue
        files += [
            p
            for p in sorted(Path(top).rglob("*"))
            if p.is_file() and not _SKIP_DIRS & set(p.relative_to(top).parts[:-1])
        ]
    return files


def _text_lines(path: Path) -> Iterator[tuple[str, str]]:
    """(where, line) of a text file; a notebook's cell sources and text outputs; nothing for a binary file."""
    data = path.read_bytes()
    if b"\0" in data[:_BINARY_PROBE]:
        return
    text = data.decode("utf-8", errors="replace")
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(text).get("cells", [])
        except (json.JSONDecodeError, AttributeError):
            cells = None
        if cells is not None:
            for i, cell in enumerate(cells):
                parts = [cell.get("source", "")]
                for out in cell.get("outputs", []):
                    parts += [out.get("text", ""), out.get("data", {}).get("text/plain", "")]
                body = "".join("".join(p) if isinstance(p, list) else p for p in parts)
                for n, line in enumerate(body.splitlines(), 1):
                    yield f"cell {i}, line {n}", line
            return
    for n, line in enumerate(text.splitlines(), 1):
        yield f"line {n}", line


def find_leaks(student_files: Iterable[Path | str], source_notebooks: Iterable[Path | str]) -> list[Leak]:
    """Every line of ``student_files`` that is a secret line of one of ``source_notebooks``."""
    secrets = course_secrets(source_notebooks)
    leaks = []
    for path in map(Path, student_files):
        for where, line in _text_lines(path):
            hit = secrets.get(normalize(line))
            if hit is not None:
                leaks.append(Leak(path, where, hit))
    return leaks


def check_student_environment(
    package_dir: Path | str | None = None, labs_dir: Path | str | None = LABS_DIR, source_dir: Path | str = SOURCE_DIR
) -> list[str]:
    """Problems with the student environment (empty: it holds no solution): leaked
    lines, and any ``train_*.py`` inside ``lab_utils`` (a complete lab answer)."""
    files = student_files(package_dir, labs_dir)
    problems = [f"solution leak: {leak}" for leak in find_leaks(files, source_notebooks(source_dir))]
    scripts = sorted(_package_dir(package_dir).rglob("train_*.py"))
    return problems + [f"training script in the installed package: {p}" for p in scripts]
