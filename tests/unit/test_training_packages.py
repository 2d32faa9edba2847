"""The technique packages' front names, their laziness, and the former flat names."""

import subprocess
import sys

import pytest

import lab_utils.training as training


def test_a_package_answers_its_front_module_s_names_and_its_submodules():
    from lab_utils.training import netexp, ps
    from lab_utils.training.netexp import runs as netexp_runs
    from lab_utils.training.ps import graph, task

    assert ps.train_worker is task.train_worker and ps.PSGraph is graph.PSGraph
    assert netexp.run_netexp is netexp_runs.run_netexp  # netexp's front is its notebook side
    assert ps.runs.__name__ == "lab_utils.training.ps.runs"
    assert "train_worker" in dir(ps)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        ps.no_such_name  # noqa: B018


def test_importing_a_package_or_its_task_side_loads_no_notebook_side():
    code = (
        "import sys; from lab_utils.training import ps; from lab_utils.training.ps import PSGraph; "
        "ps.parse_args; "
        "print(sorted(m for m in sys.modules if m.endswith('runs') or m in ('pandas', 'tensorflow')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_a_former_flat_name_is_gone():
    """The spring 2027 term dropped the flat names (``ps_runs``: ``ps.runs``; CHANGELOG)."""
    with pytest.raises(AttributeError):
        training.ps_runs  # noqa: B018


def test_a_student_s_file_is_loaded_afresh_and_a_wrong_one_is_named(tmp_path):
    from lab_utils.training.student import load_student, student_function

    script = tmp_path / "ring.py"
    with pytest.raises(FileNotFoundError, match=r"ring\.py not found: run the `%%writefile ring\.py` cell first"):
        load_student(script)
    script.write_text("def ring_allreduce(comm, x):\n    return 1\n")
    assert student_function(script, "ring_allreduce", "ring_allreduce(comm, x)")(None, None) == 1
    script.write_text("def ring_allreduce(comm, x):\n    return 2\n")  # an edited, re-run cell
    assert load_student(script).ring_allreduce(None, None) == 2
    script.write_text("ring_allreduce = 3\n")
    with pytest.raises(ImportError, match=r"defines no function ring_allreduce\(comm, x\)"):
        student_function(script, "ring_allreduce", "ring_allreduce(comm, x)")
    with pytest.raises(ImportError, match="notes.txt: not a Python script"):
        load_student(tmp_path / "notes.txt")


def test_a_task_sees_what_a_student_s_code_replaced_of_its_measurements(monkeypatch):
    """lab_utils.training.student.replaced: a lab_utils function, a method of one of its classes, a
    clock or a builtin whose code is not Python's, the environment's or lab_utils' own."""
    import time

    from lab_utils.training import student
    from lab_utils.training.modelpar import pipeline, zero

    assert student.replaced() == []
    student.check_untouched("nothing")  # nothing replaced: no error
    monkeypatch.setattr(zero, "_checked_state", lambda state, step: 1)
    monkeypatch.setattr(pipeline.Stage, "_recv", lambda self, what, i, frm: None)
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert student.replaced() == [
        "lab_utils.training.modelpar.pipeline.Stage._recv",
        "lab_utils.training.modelpar.zero._checked_state",
        "time.perf_counter",
    ]
    import sys
    import types

    main = types.ModuleType("__main__")  # a task run with -m: its module is __main__, spec and all
    main.__spec__ = zero.__spec__
    main.width = lambda: 1  # what the forged zero.py of the crafted "attacked" class does
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert "lab_utils.training.modelpar.zero.width" in student.replaced()
    with pytest.raises(RuntimeError, match=r"your code replaced .*zero\._checked_state.*: the lab measures the bubble"):
        student.check_untouched("the bubble")
