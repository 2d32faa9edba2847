"""Feedback tracebacks quote no hidden test (lab_utils.grading.tracebacks)."""

from __future__ import annotations

import json

from nbformat.v4 import new_code_cell, new_notebook, new_output

from lab_utils.grading.tracebacks import ClearTestCellHiddenTests, HideHiddenTracebacks, hidden_start, scrub_error

SOURCE = "\n".join(
    [
        "# Visible tests",
        "assert f(2) == 4, f(2)",
        'print("visible tests passed")',
        "### BEGIN HIDDEN TESTS",
        "_secret = f(12345)",
        "assert _secret == 24690, _secret",
        "### END HIDDEN TESTS",
    ]
)


def _error(line: int, evalue: str) -> dict:
    """An error output as IPython 8 writes it: ANSI colours, the cell frame, quoted lines."""
    quoted = "\n".join(f"\x1b[0;32m{n}\x1b[0m {text}" for n, text in enumerate(SOURCE.splitlines(), start=1))
    return new_output(
        "error",
        ename="AssertionError",
        evalue=evalue,
        traceback=[
            "\x1b[0;31m----------------\x1b[0m",
            f"Cell \x1b[0;32mIn[9], line {line}\x1b[0m\n{quoted}",
            f"\x1b[0;31mAssertionError\x1b[0m: {evalue}",
        ],
    )


def _feedback_outputs(output: dict) -> str:
    """The cell's outputs after the preprocessor, as the feedback would hold them (JSON)."""
    nb = new_notebook(cells=[new_code_cell(SOURCE, outputs=[output])])
    nb, _ = HideHiddenTracebacks()(nb, {})  # how nbconvert calls it (skipped unless enabled)
    return json.dumps(nb.cells[0].outputs)


def test_hidden_start_finds_the_marker_line():
    assert hidden_start(SOURCE) == 4
    assert hidden_start("assert True") is None


def test_an_error_in_the_visible_part_keeps_its_line_and_message_but_quotes_no_code():
    before = json.dumps(_error(2, "5"))
    assert "BEGIN HIDDEN" in before and "_secret = f(12345)" in before  # IPython quotes them
    text = _feedback_outputs(_error(2, "5"))
    assert "line 2 of this test cell: 5" in text
    assert "BEGIN HIDDEN" not in text and "_secret" not in text


def test_an_error_in_the_hidden_part_shows_only_its_type():
    out = scrub_error(_error(6, "24691"), hidden_line=4)
    assert out["evalue"] == "(raised in the hidden tests)"
    assert out["traceback"] == ["AssertionError raised in the hidden tests (their code and values are not shown)"]


def test_an_error_without_a_cell_frame_is_treated_as_hidden():
    out = scrub_error(new_output("error", ename="KeyError", evalue="'x'", traceback=["no frame here"]), 4)
    assert "hidden" in out["traceback"][0] and out["evalue"] != "'x'"


def test_cells_without_hidden_tests_keep_their_traceback():
    cell = new_code_cell("assert f(2) == 4", outputs=[_error(1, "5")])
    nb, _ = HideHiddenTracebacks()(new_notebook(cells=[cell]), {})
    assert len(nb.cells[0].outputs[0]["traceback"]) == 3


def test_the_module_does_not_shadow_the_course_feedback_function():
    # A submodule named lab_utils.grading.feedback would replace grading.feedback() once imported
    # (nbgrader_config.py imports this module), as it once did.
    import lab_utils.grading
    import lab_utils.grading.tracebacks  # noqa: F401

    assert callable(lab_utils.grading.feedback)


def test_solution_lines_are_the_writefile_solutions_only(tmp_path):
    from nbformat import write

    from lab_utils.grading.scripts import solution_lines

    nb = new_notebook(
        cells=[
            new_code_cell(
                "%%writefile train.py\nimport argparse  # given to students, long enough to count\n"
                "### BEGIN SOLUTION\nloss = tf.reduce_mean(cross_entropy(labels, logits))\nx = 1\n"
                "### END SOLUTION\n"
            ),
            new_code_cell("### BEGIN SOLUTION\nanswer = compute_the_answer_somewhere(42, 43)\n### END SOLUTION\n"),
        ]
    )
    (tmp_path / "source" / "07_x").mkdir(parents=True)
    write(nb, tmp_path / "source" / "07_x" / "07_x.ipynb")
    assert solution_lines(tmp_path) == ["loss = tf.reduce_mean(cross_entropy(labels, logits))"]


def test_hidden_tests_are_cleared_from_test_cells_and_a_student_s_markers_are_left_alone():
    """nbgrader's ClearHiddenTests raised on a student's unbalanced marker (the submission
    could never be graded); only the autograder's test cells hold hidden tests."""

    def cell(source, **nbgrader):
        c = new_code_cell(source)
        c.metadata["nbgrader"] = {"grade_id": "x", "points": 1, "schema_version": 3, "locked": False, **nbgrader}
        return c

    test = cell(
        "assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(2) == 3\n### END HIDDEN TESTS\n", grade=True, solution=False
    )
    students = [
        cell("### BEGIN HIDDEN TESTS\ndef f(x):\n    return x + 1\n", grade=False, solution=True),
        cell("### BEGIN HIDDEN TESTS\nprint(1)\n### END HIDDEN TESTS\n", grade=False, solution=True),
        new_code_cell("### BEGIN HIDDEN TESTS\n### BEGIN HIDDEN TESTS\n"),  # a cell the student added
    ]
    nb = new_notebook(cells=[test, *[c.copy() for c in students]])
    nb, _ = ClearTestCellHiddenTests().preprocess(nb, {})
    assert "f(2)" not in nb.cells[0].source and "assert f(1) == 2" in nb.cells[0].source
    assert [c.source for c in nb.cells[1:]] == [c.source for c in students]
