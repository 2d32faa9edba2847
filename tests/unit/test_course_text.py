"""What the labs tell a student about their grading agrees with what nbgrader does.

- every point nbgrader gives is stated in the text before its test: an exercise's
  ``**Exercise N (K points)**``, a run's or a timing's ``(graded, K points)``, and the
  hand-graded questions' ``(graded by hand, K points each)``;
- every hand-graded answer has a rubric for its graders, which students never see;
- every exercise is checked (a cell tagged ``check``, or its test) before a cell tagged
  ``long-run`` uses it, so a student's retry costs seconds, not a cluster run;
- every script a lab's ``%%writefile`` cells write (a student's solution) is kept out of git,
  out of the student image's build context and out of nbgrader's releases and collections.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

import nbformat
import pytest
from traitlets.config import Config

from lab_utils.grading.scripts import writefile_scripts

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grading" / "source"
LABS = sorted(p.name for p in SOURCE.iterdir() if (p / f"{p.name}.ipynb").exists())

EXERCISE = re.compile(r"\*\*Exercise (\d+) \((\d+) points?\)")
GRADED = re.compile(r"\(graded, (\d+) points?\)")
BY_HAND = re.compile(r"\(graded by hand, (\d+) points? each\)")


def _grading(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def stated_points(cells) -> list[str]:
    """Where the text and nbgrader disagree, one line each (empty: they agree).

    Statements are read in order and autograded test cells pay them off in order: the
    tests after a statement must add up to its points before the next statement's tests
    start (``Exercise 1 (4 points)``, ``Exercise 2 (2 points)`` in one cell, then tests
    of 4 and 2): a statement met while the one before is partly paid ends that one. An exercise stated twice (introduced early, set later) counts once.
    Each hand-graded cell is worth what the last ``graded by hand`` statement says."""
    problems, owed, seen, by_hand = [], [], set(), None
    for i, cell in enumerate(cells):
        meta = _grading(cell)
        if cell.cell_type == "markdown" and not meta.get("solution"):
            found = [(m.start(), f"Exercise {m[1]}", int(m[2])) for m in EXERCISE.finditer(cell.source)]
            found += [(m.start(), f"cell {i}: graded", int(m[1])) for m in GRADED.finditer(cell.source)]
            for _, what, points in sorted(found):
                if what in seen:
                    continue
                seen.add(what)
                if owed and 0 < owed[0][2] < owed[0][1]:  # its tests stopped short
                    problems.append(f"{owed[0][0]} states {owed[0][1]} points, its tests give {owed[0][2]}")
                    owed.pop(0)
                owed.append([what, points, 0])
            for m in BY_HAND.finditer(cell.source):
                by_hand = int(m[1])
        if not meta.get("grade"):
            continue
        points = meta.get("points") or 0
        if meta.get("solution"):  # a written answer, graded by hand
            if by_hand != points:
                problems.append(f"cell {i} ({meta.get('grade_id')}) is worth {points} by hand; the text says {by_hand}")
            continue
        while owed and owed[0][2] == owed[0][1]:
            owed.pop(0)
        if not owed:
            problems.append(f"cell {i} ({meta.get('grade_id')}) gives {points} points that no text states")
            continue
        owed[0][2] += points
        if owed[0][2] > owed[0][1]:
            problems.append(f"{owed[0][0]} states {owed[0][1]} points, its tests give {owed[0][2]} or more")
            owed.pop(0)
    problems += [
        f"{what} states {points} points, its tests give {paid}" for what, points, paid in owed if paid != points
    ]
    return problems


@pytest.mark.parametrize("lab", LABS)
def test_every_point_nbgrader_gives_is_stated_before_its_test(lab):
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    assert any(_grading(c).get("grade") for c in cells), f"{lab} has no graded cell: is this the instructor notebook?"
    assert stated_points(cells) == []


def _md(text):
    return nbformat.v4.new_markdown_cell(text)


def _test(points, gid="t", solution=False, markdown=False):
    make = nbformat.v4.new_markdown_cell if markdown else nbformat.v4.new_code_cell
    cell = make("answer" if markdown else "assert True")
    cell.metadata["nbgrader"] = {"grade": True, "solution": solution, "points": points, "grade_id": gid}
    return cell


def test_the_points_check_finds_each_kind_of_slip():
    good = [
        _md("**Exercise 1 (4 points).** a\n\n**Exercise 2 (2 points).** b"),
        _test(4),
        _test(2),
        _md("### Timing (graded, 2 points)"),
        _test(2),
        _md("## Questions (graded by hand, 2 points each)"),
        _test(2, solution=True, markdown=True),
    ]
    assert stated_points(good) == []
    assert stated_points([_md("**Exercise 3 (2 points).**"), _test(3)]) == [
        "Exercise 3 states 2 points, its tests give 3 or more"
    ]
    assert stated_points([_md("**Exercise 4 (1 point).**"), _test(3)]) != []
    assert stated_points([_md("**Exercise 1 (3 points).**"), _test(3), _test(3, "run")]) == [
        "cell 2 (run) gives 3 points that no text states"
    ]
    assert stated_points([_md("**Exercise 1 (3 points).**"), _test(2)]) == [
        "Exercise 1 states 3 points, its tests give 2"
    ]
    assert stated_points([_md("**Exercise 1 (3 points).**")]) == ["Exercise 1 states 3 points, its tests give 0"]
    assert stated_points([_md("(graded by hand, 2 points each)"), _test(3, "q", solution=True, markdown=True)]) != []
    assert stated_points([_test(2, "q", solution=True, markdown=True)]) != []  # no statement at all
    # an exercise named again later, with the same points, is not a second debt
    again = [_md("**Exercise 3 (3 points).** later"), _test(2), _md("**Exercise 3 (3 points).** now"), _test(1)]
    assert stated_points(again) == []


@pytest.mark.parametrize("lab", LABS)
def test_every_hand_graded_answer_has_a_rubric_the_students_do_not_see(lab):
    """Next to the model answer (inside the solution, so the release drops it): one criterion
    line per point, and a sample answer worth each score from the full marks down to 0."""
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    answers = [
        c for c in cells if _grading(c).get("grade") and _grading(c).get("solution") and c.cell_type == "markdown"
    ]
    assert answers, f"{lab} has no hand-graded answer"
    for cell in answers:
        meta, text = _grading(cell), cell.source
        solution = text[text.index("### BEGIN SOLUTION") : text.index("### END SOLUTION")]
        assert "**Rubric**" in solution, f"{meta['grade_id']}: no rubric inside its solution"
        rubric = solution[solution.index("**Rubric**") :]
        criteria = re.findall(r"^- \*(\d+) points?:\* \S", rubric, re.M)
        assert sum(map(int, criteria)) == meta["points"], (
            f"{meta['grade_id']}: criteria for {criteria}, not {meta['points']} points"
        )
        for score in range(meta["points"] + 1):
            assert re.search(rf"^- \*Worth {score}:\* \S", rubric, re.M), f"{meta['grade_id']}: no sample worth {score}"
    release = (ROOT / "labs" / lab / f"{lab}.ipynb").read_text()
    assert "Rubric" not in release and "*Worth 2:*" not in release, f"labs/{lab} shows a rubric to students"


#: a cell that starts processes or trains for long (a cluster, a job, a sweep): tagged ``long-run``
LAUNCH = re.compile(
    r"\b(run_ps|run_hvd|run_single|run_mwms|run_devices|run_ssp|busbw_sweep|same_weights_runs|four_runs"
    r"|check_ring|compression_runs\.run|run_ps_strategy|shutdown_hang_demo|worker_failure_demo)\(|\.(sweep|experiment)\("
)


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def first_checks_late(cells) -> list[str]:
    """Exercises whose first check comes after a long run: for every solution cell that
    defines code (a function, or a script by ``%%writefile``), the first cell after it that
    checks it (tagged ``check``, or an autograded test) must come before the first cell
    tagged ``long-run`` after it."""
    late = []
    for i, cell in enumerate(cells):
        meta = _grading(cell)
        if not (
            cell.cell_type == "code" and meta.get("solution") and re.search(r"^(def |%%writefile)", cell.source, re.M)
        ):
            continue
        check = next((j for j in range(i + 1, len(cells)) if "check" in _tags(cells[j]) or _is_test(cells[j])), None)
        run = next((j for j in range(i + 1, len(cells)) if "long-run" in _tags(cells[j])), None)
        if check is None or (run is not None and run < check):
            late.append(
                f"{meta.get('grade_id')} (cell {i}): first checked in cell {check}, after the long run in cell {run}"
            )
    return late


def _is_test(cell) -> bool:
    return cell.cell_type == "code" and bool(_grading(cell).get("grade")) and not _grading(cell).get("solution")


@pytest.mark.parametrize("lab", LABS)
def test_every_exercise_is_checked_before_a_long_run_uses_it(lab):
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    untagged = [
        i
        for i, c in enumerate(cells)
        if c.cell_type == "code"
        and LAUNCH.search(c.source)
        and not _grading(c).get("grade")
        and "check" not in _tags(c)
        and "def show_error" not in c.source  # Part 5's bad input: refused before anything starts
        and "long-run" not in _tags(c)
    ]
    assert untagged == [], f"{lab}: cells {untagged} start runs: tag them long-run"
    assert first_checks_late(cells) == []


def test_the_order_check_finds_a_check_after_the_run():
    sol = nbformat.v4.new_code_cell("def f():\n    pass\n")
    sol.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "f"}
    run = nbformat.v4.new_code_cell("ps_runs.run_ps('x.py')")
    run.metadata["tags"] = ["long-run"]
    quick = nbformat.v4.new_code_cell("assert f() is None")
    quick.metadata["tags"] = ["check"]
    assert first_checks_late([sol, quick, run]) == []
    assert first_checks_late([sol, run, quick]) == ["f (cell 0): first checked in cell 2, after the long run in cell 1"]
    assert first_checks_late([sol, run]) != []


# ---------------------------------------------------------------------- students' own scripts
def _written(lab: str) -> list[str]:
    return sorted(writefile_scripts(SOURCE / lab / f"{lab}.ipynb"))


def test_the_labs_write_scripts_to_check():
    names = {name for lab in LABS for name in _written(lab)}
    assert {"train_async.py", "ring.py", "towers.py", "compressors.py"} <= names, names


@pytest.mark.parametrize("lab", LABS)
def test_a_script_a_lab_writes_is_in_every_ignore_list(lab):
    from docker.utils.build import PatternMatcher  # docker-py: Docker's own .dockerignore rules

    docker = PatternMatcher(
        [
            line.strip()
            for line in (ROOT / "deploy/student/Dockerfile.dockerignore").read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
    )
    config = Config()
    exec(  # noqa: S102 (the course's own nbgrader config, with nbgrader's get_config)
        compile((ROOT / "grading/nbgrader_config.py").read_text(), "nbgrader_config.py", "exec"),
        {"get_config": lambda: config, "__file__": str(ROOT / "grading/nbgrader_config.py")},
    )
    for name in _written(lab):
        path = f"labs/{lab}/{name}"
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT).returncode == 0
        assert ignored, f"{path} (a student's solution) is not in .gitignore"
        assert docker.matches(path), f"{path} would enter the student image: add it to Dockerfile.dockerignore"
        assert any(fnmatch.fnmatch(name, p) for p in config.CourseDirectory.ignore), (
            f"{name} is not in nbgrader's CourseDirectory.ignore (grading/nbgrader_config.py)"
        )


# ---------------------------------------------------------------------- graded by hand
#: The share of the course's points graders give by hand (a written answer, read by a person).
HAND_GRADED_SHARE = 0.25


def points_by_kind(cells) -> tuple[float, float]:
    """(points graded by hand, points in all) of one notebook: a hand-graded cell is an
    nbgrader grade cell that is also a solution (the student's written answer)."""
    hand = total = 0.0
    for cell in cells:
        meta = _grading(cell)
        if meta.get("grade"):
            total += meta.get("points") or 0
            if meta.get("solution"):
                hand += meta.get("points") or 0
    return hand, total


def test_at_most_a_quarter_of_the_course_is_graded_by_hand():
    """Written answers that only read a number off the student's table, or paraphrase an
    earlier cell, are autograded functions of the student's own tables; what is left for
    graders is reasoning."""
    per_lab = {lab: points_by_kind(nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells) for lab in LABS}
    hand = sum(h for h, _ in per_lab.values())
    total = sum(t for _, t in per_lab.values())
    assert total > 0 and hand > 0, per_lab
    assert hand / total <= HAND_GRADED_SHARE, f"{hand:g} of {total:g} points by hand ({hand / total:.0%}): {per_lab}"


def test_the_share_check_counts_written_answers_only():
    assert points_by_kind([_md("x"), _test(3), _test(2, "q", solution=True, markdown=True)]) == (2, 5)
    assert points_by_kind([_test(1)]) == (0, 1)
