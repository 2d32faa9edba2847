"""Lab 3, Part 5's demos without processes: the ``--tf-defaults`` option, the default-token
hooks, the error line of a log, and how a watched run's tasks are described."""

from __future__ import annotations

import json
import time

import pytest

from lab_utils.training.ps import defaults as ps_defaults
from lab_utils.training.ps import demo_runs as ps_demos
from lab_utils.training.ps import settings as pst


def tf_config(workers=2):
    cluster = {"ps": ["localhost:1"], "worker": [f"localhost:{10 + i}" for i in range(workers)]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})}


def test_tf_defaults_is_a_sync_option():
    settings, _ = pst.parse_args("sync", ["--steps", "5", "--tf-defaults"], env=tf_config())
    assert settings.tf_defaults is True
    assert pst.parse_args("sync", ["--steps", "5"], env=tf_config())[0].tf_defaults is False
    with pytest.raises(ValueError, match="tf_defaults only applies to mode='sync'"):
        pst.check_settings("async", 60, 2, tf_defaults=True)
    with pytest.raises(TypeError, match="tf_defaults must be True or False"):
        pst.check_settings("sync", 60, 2, tf_defaults="yes")
    with pytest.raises(SystemExit):  # argparse: no such option for an async script
        pst.parse_args("async", ["--tf-defaults"], env=tf_config())


class _SyncReplicasOptimizerHook:  # named like TensorFlow's, which the hooks are told apart by
    def __init__(self, optimizer, is_chief, num_tokens=-1):
        self._sync_optimizer, self._is_chief, self._num_tokens = optimizer, is_chief, num_tokens


class _Optimizer:
    def make_session_run_hook(self, is_chief, num_tokens=-1):
        return _SyncReplicasOptimizerHook(self, is_chief, num_tokens)


def test_default_token_hooks_remakes_the_sync_hook_with_tensorflows_default_tokens():
    other = object()
    sync = _SyncReplicasOptimizerHook(_Optimizer(), True, num_tokens=0)
    hooks = ps_defaults.default_token_hooks([sync, other])
    assert hooks[1] is other and hooks[0] is not sync
    assert (hooks[0]._num_tokens, hooks[0]._is_chief, hooks[0]._sync_optimizer) == (-1, True, sync._sync_optimizer)


TRACEBACK = """worker:0: training
Traceback (most recent call last):
  File "x.py", line 3, in step
tensorflow.python.framework.errors_impl.DeadlineExceededError: Timed out

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "train_sync.py", line 40, in <module>
RuntimeError: worker:0: a train step blocked for more than 4 s at local step 7
"""


def test_error_line_is_the_last_exception_of_a_log():
    assert (
        ps_demos.error_line(TRACEBACK)
        == "RuntimeError: worker:0: a train step blocked for more than 4 s at local step 7"
    )
    assert ps_demos.error_line(TRACEBACK.rsplit("RuntimeError", 1)[0]).startswith("tensorflow.python.framework.")
    assert ps_demos.error_line("worker:1: training\nworker:1: session closed\n") is None
    assert ps_demos.error_line("KeyboardInterrupt\n") == "KeyboardInterrupt"


def _run(tasks, killed=None, watched_for=20.0):
    launched = time.time() - 100
    for o in tasks:
        if o.phase is not None:
            o.phase = {**o.phase, "time": launched + o.phase["time"]}
    return ps_demos.WatchedRun(
        label="TensorFlow's defaults",
        tasks={o.task: o for o in tasks},
        target=100,
        deadline=10.0,
        launched=launched,
        ready_after=8.0,
        watched_for=watched_for,
        run_dir="/nowhere",
        killed=killed,
    )


def test_a_hung_run_says_where_each_task_was_at_the_deadline():
    closing = {"phase": "closing", "what": "closing its session", "why": "TensorFlow waits up to 120 s", "time": 9.5}
    chief = ps_demos.TaskOutcome("worker:0", None, last_step=100, local_steps=201, left_loop_after=9.5, phase=closing)
    blocked = ps_demos.TaskOutcome(
        "worker:1",
        None,
        last_step=60,
        local_steps=30,
        last_step_after=9.0,
        phase={"phase": "training", "mode": "sync", "time": 8.5},
    )
    run = _run([ps_demos.TaskOutcome("ps:0", None), chief, blocked])
    assert run.still_running() == ["worker:0", "worker:1"] and not run.ended
    assert run.state(chief) == (
        "still running at the deadline: closing its session for 10.5 s; TensorFlow waits up to 120 s"
    )
    assert run.state(blocked) == (
        "still running at the deadline: blocked in a train step after global step 60 for 11.0 s "
        "(waiting for a token from the chief's queue runner)"
    )
    assert run.state(run.tasks["ps:0"]).startswith("serving until the launcher stopped it")
    table = run.table()
    assert list(table.index) == ["ps:0", "worker:0 (chief)", "worker:1"]
    assert "error" not in table.columns and table.loc["worker:0 (chief)", "local steps"] == 201
    assert "2 of 2 workers still running at the deadline" in run.summary()
    assert "closing its session" in run._repr_html_()


def test_a_failure_run_names_the_killed_worker_and_the_survivors_error():
    killed = ps_demos.TaskOutcome("worker:1", -9, exited_after=12.0, last_step=101, killed=True)
    error = "RuntimeError: worker:0: a train step blocked for more than 4 s"
    survivor = ps_demos.TaskOutcome("worker:0", 1, exited_after=17.0, last_step=101, error=error)
    run = _run(
        [ps_demos.TaskOutcome("ps:0", None), survivor, killed],
        killed={"task": "worker:1", "global_step": 101, "after": 12.0},
    )
    assert run.ended and run.still_running() == []
    assert run.state(killed) == "killed (SIGKILL) at global step 101, exit code -9"
    assert run.state(survivor) == "failed: exit code 1"
    table = run.table()
    assert table.loc["worker:0 (chief)", "error"] == error and table.loc["worker:1", "error"] == ""
    assert "worker:1 killed at global step 101" in run.summary() and "worker:0 1, worker:1 -9" in run.summary()
    demo = ps_demos.FailureDemo([run])
    with pytest.raises(ValueError, match="no 'async' run"):
        demo.run("async")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(workers=1), "workers >= 2"),
        (dict(kill="worker:2"), "kill must be one of"),
        (dict(kill="ps:0"), "kill must be one of"),
        (dict(at_step=100, steps=100), "at_step must be below steps"),
        (dict(step_timeout=0), "step_timeout must be"),
        (dict(deadline=3, step_timeout=4), "deadline must be longer than step_timeout"),
        (dict(args={"tf_defaults": True}), "args sets 'tf_defaults'"),
    ],
)
def test_worker_failure_demo_rejects_bad_arguments_before_starting_anything(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ps_demos.worker_failure_demo("train_sync.py", progress=False, **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(workers=0), "workers must be an integer >= 1"),
        (dict(steps=2.5), "steps must be an integer >= 1"),
        (dict(deadline=-1), "deadline must be a number of seconds > 0"),
        (dict(args={"epochs": 1}), "args sets 'epochs'"),
    ],
)
def test_shutdown_hang_demo_rejects_bad_arguments_before_starting_anything(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ps_demos.shutdown_hang_demo("train_sync.py", progress=False, **kwargs)
