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

What a submission prints that quotes a hidden test or a solution (a reference script
it could read, a captured test cell) is removed before anything is kept:
:mod:`lab_utils.grading.quotes`.
"""

from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor
from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests
from traitlets import Bool

__all__ = [
    "HIDDEN_BEGIN",
    "hidden_start",
    "scrub_error",
    "HideHiddenTracebacks",
    "ClearTestCellHiddenTests",
    "hide_hidden_tracebacks",
]

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


def hide_hidden_tracebacks(cell) -> None:
    """Reduce the error tracebacks of ``cell`` when it holds hidden tests (see the module doc)."""
    if cell.get("cell_type") == "code":
        start = hidden_start(cell.get("source", ""))
        if start is not None:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    scrub_error(output, start)


class HideHiddenTracebacks(Preprocessor):
    """Reduce the error tracebacks of cells that hold hidden tests (see the module doc)."""

    enabled = Bool(True, help="nbconvert skips a preprocessor that is not enabled").tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        hide_hidden_tracebacks(cell)
        return cell, resources
