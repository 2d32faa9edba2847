"""Outputs that quote what a submission must never show, removed from everything kept.

A grading kernel runs the lab's hidden tests (the part above each judge) and its reference
scripts; a submission can capture either (a frame, the line cache, the script's file) and
print it. Every output of the graded notebook is searched, before the notebook is kept and
before its feedback is written, for:

- a line of a **hidden test** of any lab (``quoted hidden tests``);
- a line of a **solution** of any lab: a reference script's (``quoted reference``) or a
  solution cell's (``quoted solution``), unless the submission's own cells hold that line
  (a student may print their own code);
- the value of a grader's environment variable named like a secret (``quoted secret``).

It is searched as printed, with escapes undone (``print(In)`` shows a list of strings), and
in every base64 or hex run long enough to hold a line (an encoded copy). An output that
quotes any of these is replaced by a notice and the submission flagged, with the cells named.
Only lines of :data:`MIN_CHARS` or more that appear nowhere in a release or in the public
source (``lab_utils``), not even as part of a line, count: what every student has is no secret.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import zlib
from pathlib import Path

__all__ = ["MIN_CHARS", "NOTICE", "course_secrets", "secret_values", "scrub", "strip_hidden_tests"]

MIN_CHARS = 16
NOTICE = "[output removed by the grader: it quoted {what}]\n"
_MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION", "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
_WHAT = {
    "quoted hidden tests": "the hidden tests",
    "quoted reference": "the instructor's reference script",
    "quoted solution": "an instructor's solution",
    "quoted secret": "a secret of the grader's",
}
_B64 = re.compile(r"[A-Za-z0-9+/=_-]{24,}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){16,}")
_SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL", re.I)


def _cells(notebook: Path) -> list[dict]:
    return json.loads(Path(notebook).read_text(encoding="utf-8")).get("cells", [])


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _regions(source: str):
    """(kind, stripped line) of every line inside a solution or hidden-test region."""
    region = None
    for line in source.splitlines():
        s = line.strip()
        if s.startswith("### BEGIN SOLUTION"):
            region = "solution"
        elif s.startswith("### BEGIN HIDDEN TESTS"):
            region = "hidden"
        elif s.startswith(("### END SOLUTION", "### END HIDDEN TESTS")):
            region = None
        elif region and s:
            yield region, s


def _public(root: Path) -> str:
    """What every student has, as one text: the releases' cells and lab_utils' sources."""
    import lab_utils

    texts = []
    for notebook in sorted((root / "release").glob("*/*.ipynb")) or sorted(root.parent.glob("labs/*/*.ipynb")):
        texts += [_source(cell) for cell in _cells(notebook)]
    for py in sorted(Path(lab_utils.__file__).resolve().parent.rglob("*.py")):
        texts.append(py.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(texts)


def course_secrets(root: Path | str, min_chars: int = MIN_CHARS) -> dict[str, str]:
    """``{line: flag kind}`` of every lab's hidden-test and solution lines (see the module doc)."""
    root = Path(root)
    public = _public(root)
    found: dict[str, str] = {}
    for notebook in sorted(root.glob("source/*/*.ipynb")):
        for cell in _cells(notebook):
            src = _source(cell)
            script = src.startswith("%%writefile")
            for region, line in _regions(src):
                if len(line) < min_chars or line in public or line.startswith("#") or line in _MARKERS:
                    continue
                if region == "hidden":
                    found[line] = "quoted hidden tests"
                else:
                    found.setdefault(line, "quoted reference" if script else "quoted solution")
    return found


def secret_values(environ: dict[str, str] | None = None, min_chars: int = 8) -> list[str]:
    """The values of the environment's variables named like secrets (tokens, keys, passwords)."""
    env = os.environ if environ is None else environ
    return sorted({v for k, v in env.items() if _SECRET.search(k) and len(v) >= min_chars})


def _decoded(text: str):
    """``text``, with escapes undone, and what its base64 and hex runs decode to."""
    yield text
    if "\\" in text:
        try:
            yield text.encode("latin-1", "backslashreplace").decode("unicode_escape", "ignore")
        except (UnicodeDecodeError, ValueError):
            pass
    for run in _B64.findall(text):
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                raw = decode(run + "=" * (-len(run) % 4))
            except (binascii.Error, ValueError):
                continue
            yield raw.decode("utf-8", "ignore")
            try:
                yield zlib.decompress(raw).decode("utf-8", "ignore")
            except zlib.error:
                pass
    for run in _HEX.findall(text):
        yield bytes.fromhex(run).decode("utf-8", "ignore")


def _texts(output: dict) -> list[tuple[dict, str]]:
    """(holder, key) of every text an output shows."""
    kind = output.get("output_type")
    if kind == "stream":
        return [(output, "text")]
    if kind == "error":
        return [(output, "evalue"), (output, "traceback")]
    data = output.get("data") or {}
    return [(data, key) for key in data if key.startswith("text/") or key.endswith("json")]


def _joined(value) -> str:
    if isinstance(value, list):
        return "\n".join(str(x) for x in value)
    return value if isinstance(value, str) else json.dumps(value)


def _quoted(text: str, lines: dict[str, str], values: list[str], own: set[str]) -> str | None:
    """The kind of the first secret ``text`` quotes, or None."""
    for candidate in _decoded(text):
        for value in values:
            if value in candidate:
                return "quoted secret"
        for line, kind in lines.items():
            if line in candidate and not (kind != "quoted hidden tests" and line in own):
                return kind
    return None


def scrub(nb, lines: dict[str, str], values: list[str] = (), own: set[str] = frozenset()) -> list[dict]:
    """Replace every output of ``nb`` that quotes a secret (see the module doc) with a notice;
    returns the flags, one per kind, naming the cells. ``own``: the submission's own lines."""
    hits: dict[str, list[int]] = {}
    for index, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        for output in cell.get("outputs", []):
            kind = next(
                (
                    k
                    for holder, key in _texts(output)
                    if (k := _quoted(_joined(holder.get(key, "")), lines, values, own))
                ),
                None,
            )
            if kind is None:
                continue
            hits.setdefault(kind, []).append(index)
            notice = NOTICE.format(what=_WHAT[kind])
            if output.get("output_type") == "error":
                output["evalue"], output["traceback"] = notice.strip(), [notice.strip()]
            else:
                for holder, key in _texts(output):
                    holder[key] = notice
    return [
        {"kind": kind, "detail": f"{', '.join(f'cell {i}' for i in sorted(set(cells)))}: not kept, not in feedback"}
        for kind, cells in hits.items()
    ]


def strip_hidden_tests(nb) -> None:
    """Remove the hidden-test region of every test cell's source (what nbgrader restored for
    grading): the notebook that is kept shows the tests as the release does."""
    from lab_utils.grading.tracebacks import ClearTestCellHiddenTests

    clear = ClearTestCellHiddenTests()
    for index, cell in enumerate(nb.cells):
        clear.preprocess_cell(cell, {}, index)
