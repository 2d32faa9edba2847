"""The student environment (the installed lab_utils package + labs/) holds no solution
and no hidden test of any instructor notebook; and the checker can fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import lab_utils
from lab_utils.grading import check_student_environment, find_leaks, student_files
from lab_utils.grading.leaks import course_secrets, secret_lines, source_notebooks

PACKAGE = Path(lab_utils.__file__).resolve().parent
REPO = PACKAGE.parent


def test_the_course_has_secrets_to_look_for():
    notebooks = source_notebooks()
    assert [p.parent.name for p in notebooks] == [
        "01_single_node",
        "02_ps_async",
        "03_ps_sync",
        "04_allreduce",
        "05_alexnet",
        "06_communication",
        "07_model_parallel",
    ]
    kinds = {s.kind for s in course_secrets(notebooks).values()}
    assert kinds == {"solution", "hidden tests"}
    for nb in notebooks:
        assert secret_lines(nb), f"{nb.name}: no secret lines found (markers renamed?)"


def test_student_environment_holds_no_solution():
    files = student_files()
    assert any(p.suffix == ".ipynb" for p in files) and any(p.name == "__init__.py" for p in files)
    leaks = find_leaks(files, source_notebooks())
    assert not leaks, f"{len(leaks)} solution or hidden-test lines in the student environment:\n" + "\n".join(
        str(leak) for leak in leaks[:40]
    )


def test_lab_utils_holds_no_training_script():
    assert sorted(PACKAGE.rglob("train_*.py")) == []


# ------------------------------------------------------------------ the checker can fail
@pytest.fixture
def student_copy(tmp_path):
    """A copy of the student environment to plant leaks into."""
    package, labs = tmp_path / "lab_utils", tmp_path / "labs"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "labs", labs, ignore=shutil.ignore_patterns("train_*.py", "runs", ".ipynb_checkpoints"))
    return package, labs


def _secret(kind: str, notebook: str, cell: str):
    return next(
        s
        for s in course_secrets(source_notebooks()).values()
        if s.kind == kind and s.notebook == notebook and s.cell == cell
    )


def test_planted_lines_are_found(student_copy):
    package, labs = student_copy
    before = {str(leak) for leak in find_leaks(student_files(package, labs), source_notebooks())}
    solution = _secret("solution", "02_ps_async.ipynb", "train_async")
    hidden = _secret("hidden tests", "03_ps_sync.ipynb", "test_sync_run")
    answer = _secret("solution", "02_ps_async.ipynb", "q1_exec_time")  # a markdown answer
    with open(package / "models.py", "a") as f:  # other indentation, a comment
        f.write(f"\n\ndef _helper():\n        {solution.line}  # planted\n")
    (labs / "notes.md").write_text(f"Some notes\n\n    # {hidden.line}\n")  # commented out still counts
    nb_path = labs / "01_single_node" / "01_single_node.ipynb"
    nb = json.loads(nb_path.read_text())
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": ["A cell\n", answer.line + "\n"]})
    nb_path.write_text(json.dumps(nb, indent=1))

    leaks = [leak for leak in find_leaks(student_files(package, labs), source_notebooks()) if str(leak) not in before]
    found = {(leak.file.name, leak.secret.line) for leak in leaks}
    assert found == {("models.py", solution.line), ("notes.md", hidden.line), ("01_single_node.ipynb", answer.line)}, [
        str(leak) for leak in leaks
    ]
    where = {leak.file.name: leak.where for leak in leaks}
    assert where["notes.md"] == "line 3" and where["01_single_node.ipynb"].endswith(", line 2")


def test_a_training_script_in_the_package_is_a_problem(student_copy):
    package, labs = student_copy
    (package / "scripts").mkdir()
    (package / "scripts" / "train_async.py").write_text("print('hi')\n")
    problems = check_student_environment(package, labs)
    assert any("training script in the installed package" in p and "train_async.py" in p for p in problems)


# ------------------------------------------------------------------- which lines count
def _nb(path: Path, cells) -> Path:
    """cells: (cell_type, source, nbgrader metadata or None)."""
    path.write_text(
        json.dumps(
            {
                "cells": [
                    {"cell_type": t, "metadata": {"nbgrader": meta} if meta else {}, "source": s}
                    for t, s, meta in cells
                ],
                "metadata": {},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    return path


def test_secret_lines_keep_only_distinctive_lines(tmp_path):
    nb = _nb(
        tmp_path / "01_a.ipynb",
        [
            ("code", "total = compute_everything(a, b)\nsolution_value = 42\n", None),  # visible code
            (
                "code",
                "def f(a, b):\n    ### BEGIN SOLUTION\n    solution_value = 42\n    x = a + b\n"
                "    # a comment that is long enough\n    result = sorted(a, key=len)[::-1]\n"
                "    start = time.perf_counter()\n    ### END SOLUTION\n",
                {"solution": True, "grade_id": "f"},
            ),
            (
                "code",
                "assert f(1, 2)\n### BEGIN HIDDEN TESTS\nassert f([3], [4]) == [[4], [3]]\n### END HIDDEN TESTS\n",
                {"grade": True, "grade_id": "test_f"},
            ),
            (
                "markdown",
                "### BEGIN SOLUTION\nBecause the queue runner waits forever.\n### END SOLUTION\n",
                {"solution": True, "grade_id": "q1"},
            ),
            ("code", "answer_without_markers = list(range(10))\n", {"solution": True, "grade_id": "g"}),
        ],
    )
    secrets = secret_lines(nb)
    assert {text: (s.kind, s.cell) for text, s in secrets.items()} == {
        "result = sorted(a, key=len)[::-1]": ("solution", "f"),  # not: short, comment, visible, ordinary
        "assert f([3], [4]) == [[4], [3]]": ("hidden tests", "test_f"),
        "Because the queue runner waits forever.": ("solution", "q1"),  # markdown answers count
        "answer_without_markers = list(range(10))": ("solution", "g"),  # nbgrader clears the whole cell
    }


def test_an_earlier_lab_gives_lines_away_a_later_one_leaks_them(tmp_path):
    early = _nb(
        tmp_path / "01_a.ipynb",
        [
            ("code", 'y = v1.placeholder(tf.int64, [None], name="y")\n', None),
            ("code", "### BEGIN SOLUTION\nmodel = build_the_model(x, y)\n### END SOLUTION\n", {"solution": True}),
        ],
    )
    late = _nb(
        tmp_path / "02_b.ipynb",
        [
            ("code", "model = build_the_model(x, y)\n", None),  # shows Lab 1's solution
            (
                "code",
                '### BEGIN SOLUTION\ny = v1.placeholder(tf.int64, [None], name="y")\n'
                "opt = make_the_optimizer(0.5)\n### END SOLUTION\n",
                {"solution": True},
            ),
        ],
    )
    secrets = course_secrets([late, early])
    assert set(secrets) == {"model = build_the_model(x, y)", "opt = make_the_optimizer(0.5)"}
    student = tmp_path / "02_b_release.py"
    student.write_text("model = build_the_model(x, y)\n")
    assert [(leak.secret.notebook, leak.where) for leak in find_leaks([student], [early, late])] == [
        ("01_a.ipynb", "line 1")
    ]
