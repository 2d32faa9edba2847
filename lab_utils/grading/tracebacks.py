"""Feedback tracebacks that show what a test cell found, but none of its hidden tests.

nbgrader's ``ClearHiddenTests`` removes the hidden region from a test cell's
*source* in the feedback, but an error's traceback quotes the lines around the
failing one: a visible ``assert`` that fails on line 2 shows the
``### BEGIN HIDDEN TESTS`` line and what follows, and an error raised inside the
hidden region shows hidden code and its values. :class:`HideHiddenTracebacks`
(in ``grading/nbgrader_config.py``, before ``ClearHiddenTests``) replaces the
traceback of every error in a cell with hidden tests by one line: where it was
raised (visible part: the line number, the exception and its message; hidden
part: only the exception's type).

The reference scripts must be readable while grading (the hidden tests run them
for the throughput comparison), so a submission could print one into its own
feedback. :class:`HideReferenceQuotes` replaces any output that quotes ``min_lines``
lines of their solution regions (30 characters or more) with a notice; the batch
flags such a submission ("quoted reference"). A student whose code is the reference's,
line for line, and who prints it is flagged too: the instructor reads the cell. An encoded copy is not caught: the
feedback of a flagged or suspicious submission is for the instructor to read first.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import Bool, Int, Unicode

__all__ = [
    "HIDDEN_BEGIN",
    "hidden_start",
    "scrub_error",
    "HideHiddenTracebacks",
    "ClearTestCellHiddenTests",
    "reference_quotes",
    "HideReferenceQuotes",
    "QUOTE_NOTICE",
]
QUOTE_NOTICE = "[output removed from the feedback: it quoted the instructor's reference script]\n"

HIDDEN_BEGIN = "### BEGIN HIDDEN TESTS"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: IPython 8 names the frame of a notebook cell "Cell In[9], line 2".
_CELL_FRAME = re.compile(r"Cell In\s*\[\d*\],\s*line (\d+)")


def hidden_start(source: str) -> int | None:
    """The 1-based line of the hidden-tests marker in ``source``, or None."""
    for number, line in enumerate(source.splitlines(), start=1):
        if line.strip().startswith(HIDDEN_BEGIN):
            return number
    return None


def scrub_error(output: dict, hidden_line: int) -> dict:
    """``output`` (an ``error`` output of a cell whose hidden tests start at
    ``hidden_line``) with its traceback reduced to one line that quotes no code."""
    plain = _ANSI.sub("", "\n".join(output.get("traceback") or []))
    frames = _CELL_FRAME.findall(plain)
    line = int(frames[0]) if frames else None  # the first frame is the test cell itself
    ename = output.get("ename", "Error")
    if line is not None and line < hidden_line:
        text = f"{ename} on line {line} of this test cell: {output.get('evalue', '')}"
    else:
        output["evalue"] = "(raised in the hidden tests)"
        text = f"{ename} raised in the hidden tests (their code and values are not shown)"
    output["traceback"] = [text]
    return output


class ClearTestCellHiddenTests(ClearHiddenTests):
    """nbgrader's ``ClearHiddenTests`` for the autograder's test cells only: those the
    autograde restored from the instructor's source, where the hidden tests are. A student's
    own cells are shown as written: a ``### BEGIN HIDDEN TESTS`` line a student typed (with no
    END, or outside a test cell) made nbgrader's version raise, and the submission could
    never be graded (an "infrastructure error" every time)."""

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell):
            return super().preprocess_cell(cell, resources, index)
        return cell, resources


class HideHiddenTracebacks(Preprocessor):
    """Reduce the error tracebacks of cells that hold hidden tests (see the module doc)."""

    enabled = Bool(True, help="nbconvert skips a preprocessor that is not enabled").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            start = hidden_start(cell.source)
            if start is not None:
                for output in cell.get("outputs", []):
                    if output.get("output_type") == "error":
                        scrub_error(output, start)
        return cell, resources


def _texts(output: dict) -> list[tuple[dict, str]]:
    """(holder, key) of every text an output shows: a stream's text, a result's text/plain."""
    if output.get("output_type") == "stream":
        return [(output, "text")]
    data = output.get("data") or {}
    return [(data, key) for key in data if key.startswith("text/")]


def _joined(value) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def reference_quotes(nb, lines: set[str], min_lines: int = 3) -> list[int]:
    """Indices of the code cells of ``nb`` with an output quoting ``min_lines`` of ``lines``."""
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not lines:
            continue
        for output in cell.get("outputs", []):
            if any(
                sum(line in lines for line in {x.strip() for x in _joined(h[k]).splitlines()}) >= min_lines
                for h, k in _texts(output)
            ):
                found.append(index)
                break
    return found


class HideReferenceQuotes(Preprocessor):
    """Replace outputs that quote a reference script with :data:`QUOTE_NOTICE` (see the module doc)."""

    enabled = Bool(True, help="nbconvert skips a preprocessor that is not enabled").tag(config=True)
    lines_file = Unicode(
        "", help="JSON list of the reference scripts' solution lines (lab_utils.grading.scripts.solution_lines)"
    ).tag(config=True)
    min_lines = Int(3, help="quoted distinctive lines that make an output a quote").tag(config=True)

    def preprocess(self, nb, resources):
        lines = set(json.loads(Path(self.lines_file).read_text())) if self.lines_file else set()
        for index in reference_quotes(nb, lines, self.min_lines):
            for output in nb.cells[index].get("outputs", []):
                for holder, key in _texts(output):
                    holder[key] = QUOTE_NOTICE
        return nb, resources
