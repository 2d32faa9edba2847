"""What a lab's notebook shows once it ran: the checks the suite's CI runs make on their
papermill output, and that bench/bench_validation.py records of each lab's graded known-good
submission (``notebook_facts``; tests/unit/test_validation.py asserts them).

One copy of each check: a quiet notebook (no error, nothing on stderr), its TensorFlow imported,
every figure its text announces shown, no cell near the grader's output cap, and a feedback page
that quotes no hidden test."""

from __future__ import annotations

import json
import re

import nbformat

#: what marks a hidden test's source in the instructor's notebook (never in a student's feedback)
HIDDEN_MARKERS = ("HIDDEN TESTS", "_checks")
#: the lines a graded lab prints about the scripts it compares with (Lab 3: the instructor's Lab 2
#: script; Lab 4: Lab 3's), never a student's or a stale copy: grading/reference/ or its view
REFERENCE_LINE = re.compile(r"^(?:async|sync PS) runs use \S+$", re.M)


def nbgrader(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def stderr_or_errors(nb) -> list[tuple[int, str | None, str]]:
    """(cell index, grade id, text) of every error and every stderr output."""
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error" or (out.output_type == "stream" and out.name == "stderr"):
                bad.append((i, nbgrader(cell).get("grade_id"), out.get("text") or out.get("evalue")))
    return bad


def printed(nb) -> str:
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "stream"
    )


def setup_printed(nb) -> str:
    setup = next((c for c in nb.cells if nbgrader(c).get("grade_id") == "setup"), None)
    return "".join(o.get("text", "") for o in setup.outputs if o.output_type == "stream") if setup else ""


def figures_missing(nb, source) -> tuple[list[str], list[str]]:
    """(ids of the cells tagged ``figure`` in ``source``, those of them without an image in
    ``nb``): cells whose figure the lab's text announces, matched by cell id (autograding
    may clear cell metadata)."""
    tagged = [c.id for c in source.cells if "figure" in c.metadata.get("tags", [])]
    shown = {c.id for c in nb.cells if any("image/png" in o.get("data", {}) for o in c.get("outputs", []))}
    return tagged, [i for i in tagged if i not in shown]


def largest_output_bytes(nb) -> int:
    """The bytes of the largest cell's outputs (the grader caps a cell's; a cut is flagged)."""
    return max(
        (sum(len(json.dumps(o, ensure_ascii=False).encode()) for o in c.get("outputs", [])) for c in nb.cells),
        default=0,
    )


def notebook_facts(graded_path, source_path, feedback_html: str) -> dict:
    """What bench/bench_validation.py records of a lab's graded known-good submission."""
    graded = nbformat.read(graded_path, as_version=4)
    source = nbformat.read(source_path, as_version=4)
    tagged, missing = figures_missing(graded, source)
    return {
        "noisy_cells": [f"cell {i} ({gid}): {str(text)[:200]}" for i, gid, text in stderr_or_errors(graded)],
        "tensorflow_imported": "TensorFlow 2." in setup_printed(graded),
        "figures": len(tagged),
        "figures_missing": missing,
        "largest_output_bytes": largest_output_bytes(graded),
        "reference_lines": REFERENCE_LINE.findall(printed(graded)),
        "feedback_quotes_hidden_tests": any(m in feedback_html for m in HIDDEN_MARKERS),
        "feedback_shows_visible_tests": "visible tests passed" in feedback_html,
    }
