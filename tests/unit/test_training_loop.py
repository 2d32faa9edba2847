"""lab_utils.training.loop without TensorFlow: shards, batches, the step loop, the timed result."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from lab_utils import report
from lab_utils.training import loop


@pytest.fixture
def events(tmp_path, monkeypatch):
    """The events this test reports, read back: ``events("step")``."""
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("LABS_REPORT_FILE", str(path))
    return lambda kind=None: report.read_events(path, kind) if path.exists() else []


def _data(n=10):
    return SimpleNamespace(
        x_train=np.arange(2 * n).reshape(n, 2), y_train=np.arange(n), x_test=np.zeros((3, 2)), y_test=np.zeros(3)
    )


def _batches(n=100, batch=2):
    return loop.batches(np.zeros((n, 1)), np.zeros(n), batch, seed=0)


def test_load_shard_takes_this_workers_part_and_checks_the_batch_size():
    s = loop.load_shard(3, 1, 2, data=_data(10))
    assert list(s.y) == [4, 5, 6] and s.x.shape == (3, 2) and s.n_train == 10
    with pytest.raises(
        ValueError,
        match=r"batch_size=4 is larger than this worker's shard "
        r"\(3 examples of 10 over 3 workers\)",
    ):
        loop.load_shard(3, 1, 4, data=_data(10))


def test_batches_are_full_paired_and_cover_the_shard_once_per_pass():
    x, y = np.arange(10) * 10, np.arange(10)
    it = loop.batches(x, y, 3, seed=0)
    one_pass = [next(it) for _ in range(3)]  # 3 full batches; the tenth example waits for the next pass
    assert all(len(by) == 3 and (bx == by * 10).all() for bx, by in one_pass)
    assert len(set(np.concatenate([by for _, by in one_pass]))) == 9
    again = loop.batches(x, y, 3, seed=0)
    assert all((next(again)[1] == by).all() for _, by in one_pass)  # the seed decides the order
    assert not all(
        (a[1] == b[1]).all() for a, b in zip(one_pass, [next(it) for _ in range(3)], strict=True)
    )  # reshuffled


def test_run_steps_reports_each_step_and_times_evaluations_apart(events):
    seen = []

    def step(xb, yb, at):
        seen.append((at.step, at.local_steps))  # the state before this step, for error messages
        return at.step + 2, 0.5

    clock = loop.Clock()
    stats = loop.run_steps(
        step,
        _batches(),
        10,
        clock=clock,
        global_step=lambda: 3,
        evaluate=lambda: 0.75,
        eval_every=4,
        extra=lambda previous, s: {"jump": s.step - previous},
    )
    assert (stats.step, stats.local_steps, stats.examples) == (11, 4, 8)
    assert seen == [(3, 0), (5, 1), (7, 2), (9, 3)]
    ev = events("step")
    assert [(e["step"], e["local_step"], e["examples"], e["jump"]) for e in ev] == [
        (5, 1, 2, 2),
        (7, 2, 4, 2),
        (9, 3, 6, 2),
        (11, 4, 8, 2),
    ]
    # an evaluation at the first step at or past each multiple of eval_every: 4 (at 5) and 8 (at 9)
    assert [e.get("accuracy") for e in ev] == [0.75, None, 0.75, None]
    assert stats.eval_time >= 0 and clock["ready"] <= clock["trained"]


def test_run_steps_without_evaluations_and_at_the_target_already(events):
    order = []

    def step(xb, yb, at):
        order.append("step")
        return at.step + 1, 1.0

    stats = loop.run_steps(
        step,
        _batches(),
        2,
        clock=loop.Clock(),
        global_step=lambda: 0,
        evaluate=lambda: 1.0,
        eval_every=0,
        before_step=lambda: order.append("before"),
    )
    assert order == ["before", "step", "before", "step"] and stats.eval_time == 0
    assert all("accuracy" not in e for e in events("step"))
    done = loop.run_steps(step, _batches(), 2, clock=loop.Clock(), global_step=lambda: 5)
    assert (done.step, done.local_steps) == (5, 0)


def test_report_result_orders_fields_and_reports_them(events):
    clock = loop.Clock()
    clock.marks.update(start=100.0, graph=101.0, session=102.0, ready=103.0, trained=108.0, end=109.0)
    stats = loop.LoopStats(step=10, local_steps=5, examples=300, eval_time=1.0)
    r = loop.report_result({"mode": "x"}, stats, clock, {"is_chief": True})
    assert list(r) == [
        "mode",
        "local_steps",
        "examples",
        "examples_per_sec",
        "exec_time",
        "train_time",
        "eval_time",
        "startup_time",
        "barrier_wait",
        "is_chief",
    ]
    assert r["train_time"] == 4.0 and r["examples_per_sec"] == 75.0  # evaluations are not training
    assert (r["exec_time"], r["startup_time"], r["barrier_wait"]) == (8.0, 3.0, 1.0)
    assert events("result")[0]["examples_per_sec"] == 75.0


def test_timings_without_training_time_and_missing_marks():
    clock = loop.Clock()
    clock.marks.update(graph=1.0, session=1.0, ready=2.0, trained=2.0, end=3.0)
    assert loop.timings(loop.LoopStats(), clock)["examples_per_sec"] is None
    with pytest.raises(KeyError, match="no 'trained' mark yet; marked so far: start"):
        loop.timings(loop.LoopStats(), loop.Clock())


def test_a_students_leave_rule_ends_the_loop_and_a_rule_that_never_leaves_fails(events):
    """Lab 3, Part 5: run_steps stops when ``done`` says so, on the value each step returned; a
    student's rule is wrapped by leave_when, which wants a bool and ends an endless rule."""

    def step(xb, yb, at):
        return at.step + 1, 1.0

    late = loop.run_steps(step, _batches(), 3, clock=loop.Clock(), global_step=lambda: 0,
                          done=loop.leave_when(lambda token, target: token > target, 3, "worker:1"))  # fmt: skip
    assert (late.step, late.local_steps) == (4, 4)  # one update past the target: what the visible test forbids
    right = loop.run_steps(step, _batches(), 3, clock=loop.Clock(), global_step=lambda: 0,
                           done=loop.leave_when(lambda token, target: token >= target, 3, "worker:1"))  # fmt: skip
    assert right.step == 3
    with pytest.raises(TypeError, match=r"worker:1: leave_loop\(0, 3\) must return True or False, got 0"):
        loop.run_steps(step, _batches(), 3, clock=loop.Clock(), global_step=lambda: 0,
                       done=loop.leave_when(lambda token, target: int(token >= target), 3, "worker:1"))  # fmt: skip
    with pytest.raises(RuntimeError, match="still False at global step 8, twice the target 3"):
        loop.run_steps(step, _batches(), 3, clock=loop.Clock(), global_step=lambda: 0,
                       done=loop.leave_when(lambda token, target: False, 3, "worker:1"))  # fmt: skip
