"""Verdicts no submission can forge (issue 48), tested without a kernel: plain values handed in,
the judge that runs outside the kernel, the grader-driven timing, and every test cell of every
lab written that way."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pandas as pd
import pytest
from nbformat.notebooknode import NotebookNode
from support.fakeclock import FakeClock

from lab_utils.grading import handin, judge, layout, throughput


class _EqualToAll(float):
    def __eq__(self, other):
        return True

    __hash__ = float.__hash__


class _MyInt(int):
    pass


def _roundtrip(**values):
    """What the judge sees of ``values``: encoded as the kernel does, through JSON, decoded."""
    return handin.Values(json.loads(json.dumps(handin.encode(values), allow_nan=False)))


# ---------------------------------------------------------------- plain values
def test_plain_values_arrive_as_they_were_type_for_type():
    frame = pd.DataFrame({"task": ["ps:0", "worker:0"], "steps": [3, 4], "t": [0.5, float("nan")]})
    frame.index = pd.Index(["a", "b"], name="run")
    v = _roundtrip(
        b=True,
        i=3,
        f=2.5,
        nan=float("nan"),
        s="x",
        n=None,
        lst=[1, [2.0, None]],
        tup=(1, "a"),
        d={"k": {"$": 1}},
        np_int=np.int64(7),
        np_f32=np.float32(0.25),
        arr=np.arange(6, dtype=np.float32).reshape(2, 3),
        bools=np.array([True, False]),
        frame=frame,
        series=pd.Series([1.5, 2.5], index=[10, 20], name="eps"),
    )
    assert v.b is True and type(v.i) is int and v.f == 2.5 and math.isnan(v.nan) and v.s == "x" and v.n is None
    assert v.lst == [1, [2.0, None]] and v.tup == (1, "a") and v.d == {"k": {"$": 1}}
    assert type(v.np_int) is np.int64 and v.np_int == 7 and type(v.np_f32) is np.float32
    assert v.arr.dtype == np.float32 and v.arr.shape == (2, 3) and v.arr[1, 2] == 5.0
    assert v.bools.dtype == bool and list(v.bools) == [True, False]
    pd.testing.assert_frame_equal(v.frame, frame)
    assert list(v.series.index) == [10, 20] and v.series.name == "eps" and v.series[20] == 2.5
    assert v["s"] == "x" and "s" in v and "absent" not in v


@pytest.mark.parametrize(
    "value",
    [
        _EqualToAll(1.0),
        _MyInt(3),
        [1, _EqualToAll(2.0)],
        {"a": _MyInt(1)},
        {1: "key not a str"},
        np.array([1, 2]).view(type("Sub", (np.ndarray,), {})),
        np.array([object(), 1], dtype=object),
        object(),
    ],
)
def test_anything_else_is_refused_and_the_judge_cannot_use_it(value):
    v = _roundtrip(answer=value, fine=1)
    assert v.fine == 1 and list(v.refused()) == ["answer"]
    with pytest.raises(handin.NotPlain, match="answer was"):
        v.answer  # noqa: B018 (the judge's first use of it)


def test_hand_in_outside_grading_returns_the_plain_copies(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    v = handin.hand_in(x=np.float64(1.5), eq=_EqualToAll(0.0))
    assert v.x == 1.5 and v.refused() == {"eq": v.refused()["eq"]} and "_EqualToAll" in v.refused()["eq"]


# ---------------------------------------------------------------- the judge
CELL = """# visible
_got = f(3)
assert _got == 9
### BEGIN HIDDEN TESTS
v = hand_in(a=f(4), b=f(5))
### JUDGE
assert v.a == 16
credit((v.b == 25) / 1, 2)
### END HIDDEN TESTS
"""


def test_the_judge_is_split_off_and_never_sent_to_the_kernel():
    kernel, judged = judge.split(CELL)
    assert "hand_in(a=f(4), b=f(5))" in kernel and "### END HIDDEN TESTS" in kernel
    assert "v.a == 16" not in kernel and "credit(" not in kernel
    assert judged.startswith("assert v.a == 16") and "END HIDDEN" not in judged
    assert judge.split("print(1)\n") == ("print(1)\n", None)


def test_a_judge_gives_full_marks_partial_credit_or_a_failure_on_plain_values_only():
    _, judged = judge.split(CELL)
    assert judge.run(judged, _roundtrip(a=16, b=25), 2).status == "passed"
    partial = judge.run(judged, _roundtrip(a=16, b=24), 2)
    assert partial.status == "failed" and partial.score == 0.0
    failed = judge.run(judged, _roundtrip(a=15, b=25), 2)
    assert failed.status == "failed" and failed.ename == "AssertionError" and "judge line 1" in failed.detail
    forged = judge.run(judged, _roundtrip(a=_EqualToAll(0.0), b=25), 2)
    assert forged.status == "error" and forged.ename == "NotPlain"
    broken = judge.run("v.missing\n", _roundtrip(a=1), 1)
    assert broken.status == "error" and broken.evalue == "raised in the hidden tests"


def _cell(outputs=()):
    return NotebookNode(cell_type="code", source=CELL, outputs=list(outputs), execution_count=3, metadata={})


def test_the_verdict_writes_the_outputs_nbgrader_scores_and_drops_what_the_kernel_showed():
    _, judged = judge.split(CELL)
    fake_result = NotebookNode(output_type="execute_result", data={"text/plain": "full marks"}, metadata={})
    cell = _cell([fake_result])
    v = judge.verdict(cell, reply_ok=True, judge=judged, values=handin.encode({"a": 16, "b": 24}), timing=None,
                      timed=False, points=2, grade_id="t")  # fmt: skip
    assert v.score == 0.0 and [o["data"]["text/plain"] for o in cell.outputs] == ["0.0"]
    cell = _cell()
    v = judge.verdict(cell, reply_ok=True, judge=judged, values=None, timing=None, timed=False, points=2, grade_id="t")
    assert v.ename == "NoHandIn" and v.flags[0]["kind"] == "tampered with grading"
    assert cell.outputs[-1]["output_type"] == "error"  # nbgrader: 0
    cell = _cell()
    v = judge.verdict(cell, reply_ok=False, judge=judged, values=handin.encode({"a": 16, "b": 25}), timing=None,
                      timed=False, points=2, grade_id="t")  # fmt: skip
    assert (
        v.status == "error" and cell.outputs[-1]["output_type"] == "error"
    )  # the kernel raised: whatever it handed in


def test_lines_only_the_grader_writes_are_taken_out_of_a_test_cell_and_hand_ins_too():
    forged = NotebookNode(
        output_type="stream", name="stdout", text="ok\n[grading-flag] late: no\n [grading-timing] {}\n"
    )
    bundle = NotebookNode(output_type="display_data", data={handin.MIME: {"values": {"x": 1}}}, metadata={})
    cell = _cell([forged, bundle])
    assert judge.take_handin(cell) == {"x": 1}
    assert judge.drop_forged_lines(cell) == ["[grading-flag] late: no", "[grading-timing] {}"]
    assert [o["text"] for o in cell.outputs] == ["ok\n"]


def test_timed_call_reads_points_and_bands_from_the_source_never_from_the_kernel():
    src = "throughput.compare(a, b, points=3, bands=((0.5, 1.0), (0.3, 0.5)), work=520 * B, warmup=1, rounds=None)"
    assert judge.timed_call(src) == {"points": 3, "bands": ((0.5, 1.0), (0.3, 0.5)), "warmup": 1}
    assert judge.timed_call("print(1)") is None
    with pytest.raises(ValueError, match="literal"):
        judge.timed_call("throughput.compare(a, b, points=P, bands=B)")


def _test_cells(lab: str):
    nb = json.loads(layout.source_notebook(lab).read_text())
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] == "code" and meta.get("grade") and not meta.get("solution"):
            yield meta["grade_id"], "".join(cell["source"])


@pytest.mark.parametrize("lab", layout.source_labs())
def test_every_test_cell_of_every_lab_is_judged_outside_the_kernel_on_what_it_hands_in(lab):
    """Its verdict never depends on what the kernel shows: each test cell ends its hidden part
    with hand_in and a judge that names nothing of the kernel's; a timed one's bands are literals."""
    for grade_id, source in _test_cells(lab):
        kernel, judged = judge.split(source)
        assert judged, f"{lab} {grade_id}: no ### JUDGE in its hidden tests"
        assert "hand_in(" in kernel.split("### BEGIN HIDDEN TESTS")[1], f"{lab} {grade_id}: hands nothing in"
        assert judge.free_names(judged) == set(), f"{lab} {grade_id}: the judge reads {judge.free_names(judged)}"
        compile(kernel, grade_id, "exec")
        judge.timed_call(kernel)  # literal points and bands where it times


def test_lab3s_slope_is_judged_equal_to_the_graders_fit_even_where_a_time_is_zero():
    """A table that shows 0.00 s (a forger's run, its time divided by 50 and rounded to 0.01 s):
    the student's slope and the grader's fit are both nan, the same; a slope off the fit is not.
    (The judge compared them with `abs(a - b) < 1e-6`, false for nan: a right function lost.)"""
    _, judged = judge.split(dict(_test_cells("03_ps_sync"))["test_loglog_slope"])
    table = pd.DataFrame({"Batch Size": [10, 30, 60, 120], "Training Loop (seconds)": [0.02, 0.01, 0.0, 0.01]})
    fine = pd.DataFrame({"Batch Size": [10, 30, 60], "Training Loop (seconds)": [3.0, 1.0, 0.5]})
    with np.errstate(divide="ignore", invalid="ignore"):
        fits = [float(np.polyfit(np.log(t["Batch Size"].astype(float)),
                                 np.log(t["Training Loop (seconds)"]), 1)[0]) for t in (table, fine)]  # fmt: skip
    assert math.isnan(fits[0]) and not math.isnan(fits[1])
    curve = float(np.polyfit(np.log([10, 30, 60, 120]), np.log([5.0, 4.0, 2.5, 2.0]), 1)[0])

    def verdict(own):
        values = _roundtrip(made_up=-1.0, flat=0.0, curve=curve, own=own, tables=[table, fine])
        return judge.run(judged, values, 1, "test_loglog_slope").status

    assert verdict(fits) == "passed"
    assert verdict([fits[0], fits[1] + 0.01]) == "failed"  # the honest table's slope is still checked
    assert verdict([-1.0, fits[1]]) == "failed"  # a number where the fit is undefined is not it


def test_free_names_finds_what_a_judge_could_only_read_in_the_kernel():
    assert judge.free_names("import math\n_x = math.sqrt(v.a)\nassert _x < LIMIT\n") == {"LIMIT"}
    assert judge.free_names("def _f(a):\n    return a\nassert _f(v.a) and [z for z in range(3)]\n") == set()


# ---------------------------------------------------------------- timing the grader drives
def _ask(driver: throughput.Driver, last: dict) -> str:
    return driver.answer(throughput.PROMPT + json.dumps(last))


def test_the_grader_times_each_job_on_its_own_clock_and_decides_the_credit():
    clock = FakeClock()
    driver = throughput.Driver({"points": 2, "bands": ((0.5, 1.0), (0.3, 0.5))}, {"rounds": 2, "max_rounds": 2,
                               "noise": 0.1}, clock=clock)  # fmt: skip
    job = _ask(driver, {"ready": True, "work": 100.0, "unit": "examples/s"})
    seconds = {"student": 4.0, "reference": 1.0}  # four times slower: no credit, whatever the kernel says
    while job != "done":
        clock.now += seconds[job]
        job = _ask(driver, {"job": job, "valid": True, "reported": 1e9})
    got = driver.outcome()
    assert got.timing["student_s"] == [4.0, 4.0] and got.timing["ratio"] == 0.25 and got.credit == 0.0
    assert [f["kind"] for f in got.flags] == ["forged throughput"]  # it claimed as much work as the reference


def test_a_kernel_that_runs_another_job_or_stops_asking_gets_no_timing():
    driver = throughput.Driver({"points": 2, "bands": ((0.5, 1.0),)}, {"rounds": 1, "max_rounds": 1, "noise": 0.1})
    assert _ask(driver, {"ready": True}) == "student"
    assert _ask(driver, {"job": "reference", "valid": True}) == "done"  # it ran the other one
    assert driver.protocol_error and driver.outcome() is None
    assert throughput.Driver({"points": 1, "bands": ((0.5, 1.0),)}, {"rounds": 1, "max_rounds": 1,
                             "noise": 0.1}).answer("tell me") == "done"  # fmt: skip


def test_compare_runs_only_the_jobs_it_is_asked_for_while_graded(monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("LAB_GRADING_DRIVEN", "1")
    answers, asked, ran = iter(["student", "reference", "done"]), [], []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or next(answers))
    got = throughput.compare(lambda: ran.append("s") or 7, lambda: ran.append("r") or 9, points=2,
                             bands=((0.5, 1.0),), valid=lambda r: r == 7, reported=float)  # fmt: skip
    assert got is None and ran == ["s", "r"]
    told = [json.loads(p.removeprefix(throughput.PROMPT)) for p in asked]
    assert told[1] == {"job": "student", "valid": True, "reported": 7.0}
    assert told[2] == {"job": "reference", "valid": True, "reported": 9.0}


def test_no_timed_job_runs_with_an_injected_straggler(monkeypatch, capsys):
    """LABS_STRAGGLER set in the kernel would make both jobs' tasks sleep each step, pulling the
    ratio towards 1: each timed job runs without it, however often the kernel sets it again."""
    import os

    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    monkeypatch.setenv("LAB_GRADING_DRIVEN", "1")
    monkeypatch.setenv("LABS_STRAGGLER", "worker:1=1")
    answers, seen = iter(["student", "reference", "done"]), []

    def job(value):
        seen.append(os.environ.get("LABS_STRAGGLER"))
        os.environ["LABS_STRAGGLER"] = "worker:0=1"  # set again between the grader's questions
        return value

    monkeypatch.setattr("builtins.input", lambda prompt: next(answers))
    throughput.compare(lambda: job(7), lambda: job(9), points=2, bands=((0.5, 1.0),))
    assert seen == [None, None]
    assert "LABS_STRAGGLER unset" in capsys.readouterr().out


# ---------------------------------------------------------------- what the kernel is asked
def test_the_graders_own_kernel_code_touches_no_name_of_the_notebook():
    ns = {"_lc": "the student's", "_lab_probe": 1}
    exec(judge.cleanup_code("n0nce"), ns)  # noqa: S102
    assert ns["_lc"] == "the student's" and ns["_lab_probe"] == 1
    assert set(ns) == {"_lc", "_lab_probe", "__builtins__"}


def test_the_probe_names_what_a_notebook_replaced(capsys):
    import sys
    import time

    import lab_utils.grading.throughput as tp

    here = os.path.dirname(os.path.dirname(tp.__file__))  # lab_utils: this test file is not in it
    trusted = tuple(os.path.join(p, "") for p in (here, sys.prefix, sys.base_prefix))
    exec(judge.probe_code("n1", trusted), {})  # noqa: S102
    assert judge.read_probe([{"output_type": "stream", "text": capsys.readouterr().out}], "n1") == []
    saved = tp._clock, time.perf_counter
    try:
        tp._clock = lambda: 0.0  # defined here, outside lab_utils and Python
        time.perf_counter = lambda: 0.0
        exec(judge.probe_code("n2", trusted), {})  # noqa: S102
    finally:
        tp._clock, time.perf_counter = saved
    found = judge.read_probe([{"output_type": "stream", "text": capsys.readouterr().out}], "n2")
    assert "lab_utils.grading.throughput._clock" in found and "time.perf_counter" in found
    assert judge.read_probe([], "n3") is None  # no answer: the grader flags that too


def test_the_kernels_environment_keeps_what_the_labs_read_and_no_secret():
    from lab_utils.grading.kernel import kernel_env

    env = kernel_env(
        {
            "PATH": "/bin",
            "LABS_OFFLINE": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "JUPYTERHUB_API_TOKEN": "t",
            "AWS_SECRET_ACCESS_KEY": "k",
            "LAB_API_KEY": "k2",
            "SSH_AUTH_SOCK": "/s",
            "PYTHONPATH": "/x",
            "JUPYTERHUB_USER": "prof",
            "JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:1/",
            "JPY_API_TOKEN": "t2",
            "GOOGLE_APPLICATION_CREDENTIALS": "/c.json",
            "CI_JOB_JWT": "j",
            "TF_VAR_db_password": "p",
        },  # fmt: skip
        {"HOME": "/h", "LAB_GRADING_DRIVEN": "1"},
    )
    assert env == {"PATH": "/bin", "LABS_OFFLINE": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/h",
                   "LAB_GRADING_DRIVEN": "1"}  # fmt: skip


def test_grading_without_a_sandbox_is_refused_unless_asked_and_says_what_is_exposed(tmp_path, monkeypatch, capsys):
    from lab_utils.grading import batch, unsafe

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret-value")
    root = tmp_path / "course"
    with pytest.raises(unsafe.NoSandbox) as caught:
        batch.autograde(tmp_path / "subs", None, root, isolate=False)  # before anything is read or made
    said = str(caught.value)
    assert f"{root}/source (every solution and hidden test)" in said and "--unsafe-no-sandbox" in said
    assert "JUPYTERHUB_API_TOKEN" in said and "secret-value" not in said
    assert not root.exists()
    warning = unsafe.require_sandbox(root, False, unsafe=True)
    assert warning.startswith("autograde: --unsafe-no-sandbox: no sandbox") and "JUPYTERHUB_API_TOKEN" in warning
    if unsafe.cgroup_support():
        assert unsafe.require_sandbox(root, None, unsafe=False) is None  # isolated: nothing to say


# ---------------------------------------------------------------- what a kernel sees
def test_a_kernel_sees_only_the_reference_scripts_its_tests_run():
    from lab_utils.grading.view import references_needed

    assert references_needed(layout.source_notebook("01")) == []
    assert references_needed(layout.source_notebook("03")) == [
        ("02_ps_async", "train_async.py"),
        ("03_ps_sync", "train_sync.py"),
    ]


def test_the_kernels_lab_utils_holds_no_autograder_module(tmp_path):
    from lab_utils.grading.view import KERNEL_GRADING, kernel_package

    package = kernel_package(tmp_path / "lab_utils")
    assert sorted(p.name for p in (package / "grading").glob("*.py")) == sorted(KERNEL_GRADING)
    assert not (package / "hub").exists() and (package / "training" / "ps").is_dir()
    assert list((package / "grading" / "__pycache__").glob("throughput*.pyc"))  # compiled: imports stay fast
    assert all(p.stat().st_mode & 0o777 in (0o644, 0o755) for p in package.rglob("*"))


def test_a_kernel_that_cannot_start_says_why_in_one_line(tmp_path):
    """What the worker's log (the batch's 'infrastructure error') shows, never only "Kernel died"."""
    import subprocess
    import sys

    spec = tmp_path / "view.json"
    spec.write_text(json.dumps({"uid": 61099, "root": str(tmp_path / "no-such-root")}))
    (tmp_path / "conn.json").write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "lab_utils.grading.kernel", "--view", str(spec), "-f", str(tmp_path / "conn.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("grading kernel: cannot start the sandbox's kernel: "), proc.stderr


def test_without_root_the_kernel_still_starts_without_the_graders_secrets(monkeypatch):
    """The process group (a pod, a laptop): the kernel is the grader's user, its environment not."""
    from lab_utils.grading import kernel

    started = {}

    def execve(exe, argv, env):  # what the kernel would be started as (execve does not return)
        started.update(argv=argv, env=env)
        raise SystemExit(0)

    monkeypatch.setattr(kernel.os, "execve", execve)
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "hub-token-123")
    monkeypatch.setenv("HOME", "/home/prof")
    monkeypatch.setenv("LABS_OFFLINE", "1")
    with pytest.raises(SystemExit):
        kernel.main(["--environment-only", "-f", "/tmp/kernel-1.json"])
    assert started["argv"][-3:] == ["ipykernel_launcher", "-f", "/tmp/kernel-1.json"]
    assert started["env"]["HOME"] == "/home/prof" and started["env"]["LABS_OFFLINE"] == "1"
    assert "JUPYTERHUB_API_TOKEN" not in started["env"]
