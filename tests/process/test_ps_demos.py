"""Lab 3, Part 5's demos on real clusters: the shutdown hang with TensorFlow's defaults beside
the course's settings, and a worker killed mid-run in async and sync mode.

Four 1 PS + 2 worker clusters of the reference scripts (about a minute on 2 cores) on the
offline MNIST sample (conftest sets LABS_OFFLINE=1). conftest's leak check fails a test that
leaves a process behind; each test also checks it right after the demo returns.
"""

from __future__ import annotations

import psutil
from support.procs import alive

from lab_utils.grading import reference_script
from lab_utils.training.ps import demo_runs as ps_demos

STEPS = 100


def _children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if alive(p)]


def test_tensorflow_defaults_hang_at_shutdown_and_the_course_settings_end():
    before = {p.pid for p in _children()}
    # deadline: 15 s after start-up, for a chief that trains in about a second (margin for a loaded machine)
    demo = ps_demos.shutdown_hang_demo(
        reference_script("03_ps_sync", "train_sync.py"), workers=2, steps=STEPS, deadline=15, progress=False
    )
    assert [p for p in _children() if p.pid not in before] == [], "the demo left processes running"

    hung = demo.defaults
    assert hung.still_running(), f"every worker exited with TensorFlow's defaults:\n{hung!r}"
    chief = hung.tasks["worker:0"]
    # the chief trained to the target, then sat in its session's close (TF's 120 s grace period)
    assert chief.running and chief.last_step >= STEPS and chief.phase["phase"] == "closing", repr(hung)
    assert "stop_grace_period_secs=120" in hung.state(chief), hung.state(chief)
    for name in hung.still_running():  # every hung worker says where it was
        assert hung.tasks[name].phase is not None, repr(hung)
        assert hung.state(hung.tasks[name]).startswith("still running at the deadline: "), repr(hung)
    assert hung.tasks["ps:0"].running
    table = hung.table()
    assert "still running at the deadline" in table.loc["worker:0 (chief)", "state"]

    fixed = demo.fixed
    assert fixed.ended, f"the course's settings did not end by themselves:\n{fixed!r}"
    for w in fixed.workers():
        assert (w.exit_code, w.last_step, w.phase["phase"]) == (0, STEPS, "closed"), repr(fixed)
        assert w.left_loop_after is not None and w.left_loop_after <= w.exited_after
    assert list(demo.table().index.get_level_values("run").unique()) == ["TensorFlow's defaults", "course settings"]


def test_a_killed_worker_async_carries_on_sync_fails_with_the_step_deadline():
    before = {p.pid for p in _children()}
    at_step, steps = 100, 400
    demo = ps_demos.worker_failure_demo(
        reference_script("03_ps_sync", "train_sync.py"),
        async_script=reference_script("02_ps_async", "train_async.py"),
        workers=2,
        kill="worker:1",
        at_step=at_step,
        steps=steps,
        step_timeout=4.0,
        deadline=60.0,
        progress=False,
    )
    assert [p for p in _children() if p.pid not in before] == [], "the demo left processes running"

    for run in (demo.run("async"), demo.run("sync")):
        victim = run.tasks["worker:1"]
        assert victim.killed and victim.exit_code == -9, repr(run)  # SIGKILL, as a crash
        assert run.killed["task"] == "worker:1" and run.killed["global_step"] >= at_step, run.killed
        assert run.state(victim).startswith("killed (SIGKILL)")
        assert run.ended, f"a worker was still running at the deadline:\n{run!r}"  # no silent hang
        assert run.tasks["ps:0"].running, repr(run)  # the PS kept serving until the launcher stopped it

    survivor = demo.run("async").tasks["worker:0"]
    assert (survivor.exit_code, survivor.last_step) == (0, steps), repr(demo.run("async"))

    sync = demo.run("sync")
    survivor = sync.tasks["worker:0"]
    assert survivor.exit_code not in (None, 0) and survivor.last_step < steps, repr(sync)
    assert survivor.error is not None and survivor.error.startswith("RuntimeError: worker:0: "), survivor.error
    assert "blocked for more than 4 s" in survivor.error or "did not take its token" in survivor.error
    assert sync.table().loc["worker:0 (chief)", "error"] == survivor.error
