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

import ast
import copy
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
BY_HAND = re.compile(r"\(graded by hand, (\d+) points? each[:)]")


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
        and "show_error(" not in c.source  # the bad-input cell: refused before anything starts
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


# ---------------------------------------------------------------------- graded on the mechanism
#: The network labs (issue 51): each holds at least PREDICTION_POINTS of predict-then-measure
#: items, checked against the student's own runs.
NETWORK_LABS = ["02_ps_async", "03_ps_sync", "04_allreduce", "06_communication", "07_model_parallel"]
PREDICTION_POINTS = 4
GOALS = re.compile(r"\*\*Learning goals\.\*\*(.*?)(?:\n\n|\Z)", re.S)
HAND_SHARE = re.compile(r"(\w+) written answers? \((\d+) of the lab's (\d+) points\) (?:are|is) graded by hand")
COUNT = {"One": 1, "Two": 2, "Three": 3, "Four": 4, "Five": 5, "Six": 6}


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


def goal_problems(cells) -> list[str]:
    """Where a lab's learning goals and its graded cells disagree (empty: every goal is graded):
    the first cell's numbered ``**Learning goals.**``, each graded cell's ``goals`` metadata (the
    goals it grades), every goal graded by at least one cell, no cell naming a goal that is not there."""
    found = GOALS.search(cells[0].source)
    if not found:
        return ["the first cell lists no **Learning goals.**"]
    goals = {int(n) for n in re.findall(r"^(\d+)\. ", found[1], re.M)}
    problems, graded = [], set()
    for i, cell in enumerate(cells):
        if not _grading(cell).get("grade"):
            continue
        mapped = cell.metadata.get("goals")
        if not mapped or not isinstance(mapped, list):
            problems.append(f"cell {i} ({_grading(cell).get('grade_id')}) names no goal it grades")
            continue
        problems += [f"cell {i} grades goal {g}, which the first cell does not list" for g in mapped if g not in goals]
        graded.update(mapped)
    problems += [f"goal {g} is graded by no cell" for g in sorted(goals - graded)]
    return problems


@pytest.mark.parametrize("lab", LABS)
def test_every_learning_goal_is_graded(lab):
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    assert goal_problems(cells) == []


def test_the_goal_check_finds_an_ungraded_goal():
    first = _md("**Learning goals.** After this lab you can\n1. do a;\n2. do b.\n\n**How**")
    graded = _test(2)
    graded.metadata["goals"] = [1]
    assert goal_problems([first, graded]) == ["goal 2 is graded by no cell"]
    graded.metadata["goals"] = [1, 3]
    assert goal_problems([first, graded]) == [
        "cell 1 grades goal 3, which the first cell does not list",
        "goal 2 is graded by no cell",
    ]
    del graded.metadata["goals"]
    assert goal_problems([first, graded])[0] == "cell 1 (t) names no goal it grades"


@pytest.mark.parametrize("lab", LABS)
def test_the_first_cell_states_the_share_graded_by_hand(lab):
    """The share graded by hand is what the goals need (no ceiling); the first cell says it."""
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    hand, total = points_by_kind(cells)
    answers = sum(1 for c in cells if _grading(c).get("grade") and _grading(c).get("solution"))
    stated = HAND_SHARE.search(" ".join(cells[0].source.split()))
    assert stated, (
        f"{lab}: the first cell does not say how many written answers, of how many points, are graded by hand"
    )
    assert COUNT.get(stated[1]) == answers, (
        f"{lab}: the first cell says {stated[1]} written answers; there are {answers}"
    )
    assert (int(stated[2]), int(stated[3])) == (hand, total), f"{lab}: {hand:g} of {total:g} points by hand"


QUESTIONS = re.compile(
    r"^## Questions \(graded by hand, \d+ points? each: ([^;)]*)(?:; autograded: (.*), \d+ points?)?\)$"
)


def question_problems(cells) -> list[str]:
    """Where the ``## Questions`` header and its questions disagree (empty: they agree): the header
    names the questions graded by hand and the autograded ones; a question is autograded when its
    prompt says ``**QN (graded, K points)``, by hand otherwise (``**QN.**``), and each hand-graded
    question is followed by its answer cell."""
    at = next(
        (i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.startswith("## Questions")), None
    )
    if at is None:
        return ["no ## Questions section"]
    header = QUESTIONS.match(cells[at].source.splitlines()[0])
    if not header:
        return [f"the header {cells[at].source.splitlines()[0]!r} does not name its questions by grading"]
    hand, auto = [], []
    for cell in cells[at:]:
        if cell.cell_type == "markdown" and not _grading(cell).get("solution"):
            for m in re.finditer(r"^\*\*Q(\d+)(\.\*\*| \(graded, )", cell.source, re.M):
                (auto if m[2].startswith(" (graded") else hand).append(f"Q{m[1]}")
    named = {"by hand": re.findall(r"Q\d+", header[1]), "autograded": re.findall(r"Q\d+", header[2] or "")}
    problems = [
        f"the header says {named[k]} {k}, the questions are {v}"
        for k, v in (("by hand", hand), ("autograded", auto))
        if named[k] != v
    ]
    answers = sum(1 for c in cells[at:] if _grading(c).get("grade") and _grading(c).get("solution"))
    if answers != len(hand):
        problems.append(f"{len(hand)} questions are graded by hand, {answers} answer cells follow")
    return problems


@pytest.mark.parametrize("lab", LABS)
def test_the_questions_header_says_which_are_graded_by_hand(lab):
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    assert question_problems(cells) == []


def test_the_questions_check_finds_a_header_that_lumps_them_together():
    answer = _test(2, "q1", solution=True, markdown=True)
    old = [_md("## Questions (graded by hand, 2 points each)\n\nQ2 is autograded."), _md("**Q1.** why?"), answer]
    assert question_problems(old)[0].startswith("the header")
    new = [
        _md("## Questions (graded by hand, 2 points each: Q1; autograded: Q2, 1 point)"),
        _md("**Q1.** why?"),
        answer,
    ]
    new.append(_md("**Q2 (graded, 1 point): read it.**"))
    assert question_problems(new) == []
    assert question_problems([new[0], new[1], answer]) == ["the header says ['Q2'] autograded, the questions are []"]


def prediction_points(cells) -> tuple[float, list[str]]:
    """(points of the autograded cells marked ``prediction`` in their metadata, problems): a
    prediction is graded on made-up cases *and* against the student's own run (a marked cell that
    calls ``check_prediction``), and no marked cell comes before its solution function."""
    points, problems, defined = 0.0, [], set()
    for i, cell in enumerate(cells):
        if cell.cell_type == "code" and _grading(cell).get("solution"):
            defined |= {fn.name for fn in ast.parse(_python(cell.source)).body if isinstance(fn, ast.FunctionDef)}
        if not cell.metadata.get("prediction"):
            continue
        if not _is_test(cell):
            problems.append(f"cell {i} is marked a prediction but is no autograded test")
            continue
        used = {n.id for n in ast.walk(ast.parse(_python(cell.source))) if isinstance(n, ast.Name)}
        if not used & defined:
            problems.append(f"cell {i} ({_grading(cell).get('grade_id')}) tests no function defined before it")
        points += _grading(cell).get("points") or 0
    if points and not any(c.metadata.get("prediction") and "check_prediction(" in c.source for c in cells):
        problems.append("no prediction meets a run (check_prediction)")
    return points, problems


@pytest.mark.parametrize("lab", NETWORK_LABS)
def test_a_network_lab_grades_predictions_against_its_own_runs(lab):
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    points, problems = prediction_points(cells)
    assert problems == []
    assert points >= PREDICTION_POINTS, f"{lab}: {points:g} points of predictions"


def test_the_prediction_check_needs_a_run_and_a_function():
    sol = _code_cell("def guess(n):\n    ### BEGIN SOLUTION\n    return 2.0 * n\n    ### END SOLUTION", solution=True)
    made_up, own = _test(1, "made_up"), _test(1, "own")
    made_up.source, own.source = "assert guess(2) == 4.0", "check_prediction('x', guess(3), run.x, tolerance=0.25)"
    for cell in (made_up, own):
        cell.metadata["prediction"] = True
    assert prediction_points([sol, made_up, own]) == (2, [])
    assert prediction_points([sol, made_up])[1] == ["no prediction meets a run (check_prediction)"]
    assert prediction_points([made_up, sol, own])[1] == ["cell 0 (made_up) tests no function defined before it"]


def test_the_share_check_counts_written_answers_only():
    assert points_by_kind([_md("x"), _test(3), _test(2, "q", solution=True, markdown=True)]) == (2, 5)
    assert points_by_kind([_test(1)]) == (0, 1)


# ---------------------------------------------------------------------- nothing copyable
_SOLUTION = re.compile(r"^([ \t]*)### BEGIN SOLUTION\n.*?^[ \t]*### END SOLUTION[ \t]*$", re.S | re.M)
_HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*?^[ \t]*### END HIDDEN TESTS[ \t]*$", re.S | re.M)
#: the smallest answer expression the check compares (AST nodes): ``a * b`` is everybody's
_MIN_NODES = 6
_STRAIGHT = (ast.Assign, ast.AnnAssign, ast.Return, ast.Expr, ast.If)


def _python(source: str) -> str:
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def _shape(node: ast.AST) -> ast.AST:
    """``node`` with every name made the same, and a one-argument conversion (``float(...)``,
    ``int(...)``) peeled off: what is left is the computation, whatever the variables are called."""

    class Anonymous(ast.NodeTransformer):
        def visit_Name(self, name):
            return ast.Name(id="_", ctx=ast.Load())

    node = Anonymous().visit(copy.deepcopy(node))
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) == 1 and not node.keywords:
        node = node.args[0]
    return node


def _straight(body) -> bool:
    return all(isinstance(s, _STRAIGHT) and (not isinstance(s, ast.If) or _straight(s.body + s.orelse)) for s in body)


def copyable_answers(cells) -> list[str]:
    """Autograded answers a student can copy from another cell (empty: none). An answer is a
    function in a solution code cell whose body is straight-line code (a reading: assignments, an
    ``if``, a return); it is copyable when one of its expressions (six AST nodes or more, names
    aside, a ``float(...)`` peeled off) appears in the code a student sees in another cell: that
    cell with its solutions and hidden tests removed."""
    seen = {}
    for i, cell in enumerate(cells):
        if cell.cell_type == "code":
            visible = _HIDDEN.sub("", _SOLUTION.sub(lambda m: f"{m[1]}pass", cell.source))
            tree = ast.parse(_python(visible))
            seen[i] = {ast.dump(_shape(n)) for n in ast.walk(tree) if isinstance(n, ast.expr)}
    found = []
    for i, cell in enumerate(cells):
        if not (cell.cell_type == "code" and _grading(cell).get("solution")) or cell.source.startswith("%%writefile"):
            continue
        for fn in ast.parse(_python(cell.source)).body:
            if not (isinstance(fn, ast.FunctionDef) and _straight(fn.body)):
                continue
            for node in ast.walk(fn):
                if not (isinstance(node, (ast.Return, ast.Assign)) and node.value is not None):
                    continue
                shape = _shape(node.value)
                if sum(1 for n in ast.walk(shape) if isinstance(n, (ast.expr, ast.keyword))) < _MIN_NODES:
                    continue
                where = [j for j, shapes in seen.items() if j != i and ast.dump(shape) in shapes]
                if where:
                    found.append(f"cell {i} {fn.name}: {ast.unparse(node.value)} is in cell {where[0]}")
    return found


@pytest.mark.parametrize("lab", LABS)
def test_no_autograded_answer_can_be_copied_from_another_cell(lab):
    cells = nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells
    assert copyable_answers(cells) == []


def _code_cell(source: str, solution: bool = False):
    cell = nbformat.v4.new_code_cell(source)
    if solution:
        cell.metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "answer"}
    return cell


def test_the_copy_check_finds_the_readings_the_issue_named():
    """Issue 51's examples, as they were: Lab 1's Q2 answer was computed by the "what you measured"
    cell, and Lab 2's speedup column held its answer's denominator."""
    lab1 = [
        _code_cell(
            'fastest = sweep.dropna(subset=["time_to_accuracy_s"])\n'
            "print(int(fastest.loc[fastest['time_to_accuracy_s'].idxmin(), 'batch_size']))"
        ),
        _code_cell(
            "def fastest_to_target(sweep):\n    ### BEGIN SOLUTION\n"
            '    reached = sweep.dropna(subset=["time_to_accuracy_s"])\n    if reached.empty:\n        return None\n'
            '    return int(reached.loc[reached["time_to_accuracy_s"].idxmin(), "batch_size"])\n    ### END SOLUTION',
            solution=True,
        ),
    ]
    assert [line.split(":")[0] for line in copyable_answers(lab1)] == ["cell 1 fastest_to_target"] * 2
    lab2 = [
        _code_cell(
            "def speedup(table):\n    ### BEGIN SOLUTION\n"
            '    most = table.loc[table["workers"].idxmax(), "examples/s"]\n'
            '    fewest = table.loc[table["workers"].idxmin(), "examples/s"]\n'
            "    return float(most / fewest)\n    ### END SOLUTION",
            solution=True,
        ),
        _code_cell('_rows["speedup"] = _rows["examples/s"] / _rows.loc[_rows["workers"].idxmin(), "examples/s"]'),
    ]
    assert copyable_answers(lab2) == ["cell 0 speedup: table.loc[table['workers'].idxmin(), 'examples/s'] is in cell 1"]
    # the same answer is fine when only its hidden test, or another solution, computes it
    hidden = _code_cell(lab2[1].source.join(["### BEGIN HIDDEN TESTS\n", "\n### END HIDDEN TESTS"]))
    assert copyable_answers([lab2[0], hidden]) == []
    # and a loop is an exercise, not a reading
    loop = _code_cell("def f(t):\n    for x in t:\n        return t.loc[t['a'].idxmin(), 'b']", solution=True)
    assert copyable_answers([loop, _code_cell("t.loc[t['a'].idxmin(), 'b']")]) == []
