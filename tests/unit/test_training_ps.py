"""Unit tests for lab_utils.training.ps and the Lab 2-3 scripts' argument checks (no TensorFlow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lab_utils.training import ps as pst

SCRIPTS = {"async": ("02_ps_async", "train_async.py"), "sync": ("03_ps_sync", "train_sync.py")}


def tf_config(workers=2, job="worker", index=0):
    cluster = {"ps": ["localhost:1"], "worker": [f"localhost:{10 + i}" for i in range(workers)]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})}


@pytest.mark.parametrize(
    "spec, expected",
    [
        (None, {}),
        ("", {}),
        ("worker:1=0.05", {"worker:1": 0.05}),
        ("worker:1=50ms", {"worker:1": 0.05}),
        ("worker:0=1s, worker:2=0", {"worker:0": 1.0, "worker:2": 0.0}),
        ({"worker:1": 0.2}, {"worker:1": 0.2}),
    ],
)
def test_parse_straggler(spec, expected):
    assert pst.parse_straggler(spec) == pytest.approx(expected)


@pytest.mark.parametrize("spec", ["worker:1", "worker:1=", "=0.1", "worker:1=fast", "worker:1=-1"])
def test_parse_straggler_rejects(spec):
    with pytest.raises(ValueError, match="straggler"):
        pst.parse_straggler(spec)


def test_check_settings_defaults():
    s = pst.check_settings("sync", 60, 4)
    assert s.replicas == 4 and s.epochs == 1.0 and s.steps is None
    assert pst.check_settings("sync", 60, 4, replicas_to_aggregate=3).replicas == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="sgd"), "mode must be one of"),
        (dict(batch_size=0), "batch_size must be >= 1, got 0"),
        (dict(batch_size=-5), "batch_size must be >= 1"),
        (dict(mode="sync", replicas_to_aggregate=3), "replicas_to_aggregate=3 is more than the 2 worker"),
        (dict(mode="sync", replicas_to_aggregate=0), "replicas_to_aggregate must be >= 1"),
        (dict(replicas_to_aggregate=1), "only applies to mode='sync'"),
        (dict(epochs=1.0, steps=10), "exactly one of epochs or steps"),
        (dict(epochs=0), "epochs must be a number > 0"),
        (dict(epochs=None, steps=0), "steps must be >= 1"),
        (dict(learning_rate=0.0), "learning_rate must be a number > 0"),
        (dict(learning_rate=float("nan")), "learning_rate"),
        (dict(straggler="worker:2=0.1"), "worker:0..worker:1"),
        (dict(straggler="ps:0=0.1"), "worker:0..worker:1"),
        (dict(eval_every=-1), "eval_every must be >= 0"),
        (dict(step_timeout=0), "step_timeout"),
    ],
)
def test_check_settings_rejects(kwargs, message):
    args = dict(mode="async", batch_size=60, num_workers=2)
    args.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        pst.check_settings(**args)


def test_check_settings_rejects_non_integer_batch():
    with pytest.raises(TypeError, match="batch_size must be an integer"):
        pst.check_settings("async", 6.5, 2)


def test_steps_per_epoch_and_target():
    assert pst.steps_per_epoch(60000, 60) == 1000
    assert pst.steps_per_epoch(4000, 60) == 67
    s = pst.check_settings("sync", 60, 2, epochs=6)
    assert pst.target_global_steps(s, 60000) == 6000  # CS 744: 6 epochs = 6000 sync global steps
    assert pst.target_global_steps(pst.check_settings("async", 60, 2, epochs=0.5), 4000) == 34
    assert pst.target_global_steps(pst.check_settings("async", 60, 2, epochs=None, steps=7), 4000) == 7
    with pytest.raises(ValueError):
        pst.steps_per_epoch(4000, 0)


def test_parse_args_good(monkeypatch):
    settings, task = pst.parse_args(
        "sync",
        ["--steps", "30", "--replicas-to-aggregate", "1", "--straggler", "worker:1=20ms"],
        env=tf_config(2, "worker", 1),
    )
    assert (task.job, task.index, task.is_chief) == ("worker", 1, False)
    assert settings.steps == 30 and settings.epochs is None and settings.replicas == 1
    assert settings.straggler == {"worker:1": pytest.approx(0.02)}
    assert settings.save_weights is None
    saving, _ = pst.parse_args("async", ["--save-weights", "/tmp/w.npz"], env=tf_config(2, "worker", 0))
    assert saving.save_weights == "/tmp/w.npz"  # the chief writes its final weights there (Lab 4)


@pytest.mark.parametrize(
    "mode, argv, message",
    [
        ("sync", ["--batch-size", "0"], "batch_size must be >= 1, got 0"),
        ("sync", ["--replicas-to-aggregate", "3"], "replicas_to_aggregate=3 is more than the 2 worker(s)"),
        ("async", ["--replicas-to-aggregate", "1"], "unrecognized arguments"),
        ("async", ["--epochs", "1", "--steps", "5"], "not allowed with argument"),
        ("async", ["--straggler", "worker:5=1"], "worker:0..worker:1"),
    ],
)
def test_parse_args_exits_2_with_message(mode, argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        pst.parse_args(mode, argv, env=tf_config(2))
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_args_without_tf_config_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        pst.parse_args("async", [], env={})
    assert info.value.code == 2
    assert "TF_CONFIG is not set" in capsys.readouterr().err


@pytest.mark.parametrize(
    "mode, argv, message",
    [
        ("sync", ["--batch-size", "0"], "batch_size must be >= 1"),
        ("sync", ["--replicas-to-aggregate", "3"], "replicas_to_aggregate=3 is more than"),
        ("async", ["--learning-rate", "-1"], "learning_rate must be a number > 0"),
    ],
)
def test_scripts_reject_bad_input_before_tensorflow(mode, argv, message):
    """The reference script, run as __main__: exit code 2, the message on stderr, TensorFlow never imported."""
    from lab_utils.grading import reference_script  # extracts it from the instructor notebook

    script = str(reference_script(*SCRIPTS[mode]))
    code = (
        "import runpy, sys\n"
        f"sys.argv = [{script!r}] + {argv!r}\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, 'tensorflow' in sys.modules)\n"
    )
    env = dict(os.environ, **tf_config(2, "ps", 0))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "exit 2 False", (out.stdout, out.stderr)
    assert message in out.stderr


class _SyncReplicasOptimizerHook:  # the name train_worker looks for; only its token count matters here
    def __init__(self, num_tokens):
        self._num_tokens = num_tokens


def _graph(*hooks):
    return pst.PSGraph(None, None, None, None, None, None, hooks=list(hooks))


def test_only_sync_runs_with_r_equal_n_and_no_initial_tokens_are_paced():
    """The token-queue pacing (one gradient per worker per update) applies exactly where an
    update must average every worker once: sync, R = N > 1, num_tokens=0."""
    hook = _SyncReplicasOptimizerHook(0)
    assert pst._token_queue_size(_graph(hook), pst.check_settings("async", 60, 2)) is None
    assert pst._token_queue_size(_graph(hook), pst.check_settings("sync", 60, 3, replicas_to_aggregate=2)) is None
    assert pst._token_queue_size(_graph(hook), pst.check_settings("sync", 60, 1)) is None
    assert pst._token_queue_size(_graph(_SyncReplicasOptimizerHook(-1)), pst.check_settings("sync", 60, 2)) is None
    assert pst._token_queue_size(_graph(), pst.check_settings("sync", 60, 2)) is None


class _Queue:
    """A session whose token queue empties after ``left`` reads (or never)."""

    def __init__(self, left):
        self.left, self.reads = left, 0

    def run(self, _op):
        self.reads += 1
        return max(0, self.left - self.reads + 1) if self.left is not None else 1


def test_a_worker_starts_once_every_token_is_taken_and_fails_by_name_when_one_never_is():
    task = type("Task", (), {"task": "worker:0"})()
    sess = _Queue(left=3)
    pst._wait_for_tokens_taken(sess, "size", task, timeout=5)
    assert sess.reads == 4  # three reads with a token waiting, then the empty queue
    with pytest.raises(RuntimeError, match="worker:0: another worker did not take its token for 0.05 s"):
        pst._wait_for_tokens_taken(_Queue(left=None), "size", task, timeout=0.05)


def _raise_in_thread(name: str, error: BaseException) -> None:
    import threading

    def fail():
        raise error

    thread = threading.Thread(target=fail, name=name)
    thread.start()
    thread.join()


def test_a_queue_runner_cancelled_by_the_session_close_says_so_in_one_line(monkeypatch, capsys):
    """After a step past its deadline, closing the session cancels the chief's queue runner;
    its traceback used to interleave with the main thread's error in the log (and its
    CancelledError could end up as the log's last exception line)."""
    import threading

    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.thread.name))
    # TensorFlow's class, by name and module, without importing TensorFlow
    cancelled = type("CancelledError", (Exception,), {"__module__": "tensorflow.python.framework.errors_impl"})
    pst._one_line_for_cancelled_queue_runners()
    pst._one_line_for_cancelled_queue_runners()  # once per process: not chained twice

    _raise_in_thread("QueueRunnerThread-sync_token_q-sync_token_q_EnqueueMany", cancelled("Step was cancelled"))
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "QueueRunnerThread-sync_token_q-sync_token_q_EnqueueMany stopped: its step was cancelled when "
        "the session closed (Step was cancelled)"
    ]
    assert seen == []

    # anything else still reaches the previous hook: another error, another thread, another CancelledError
    _raise_in_thread("QueueRunnerThread-q", ValueError("bad"))
    _raise_in_thread("Thread-7", cancelled("x"))
    _raise_in_thread("QueueRunnerThread-q", type("CancelledError", (Exception,), {})("not TensorFlow's"))
    assert seen == ["QueueRunnerThread-q", "Thread-7", "QueueRunnerThread-q"]
    assert capsys.readouterr().err == ""


def test_the_yardstick_rejects_bad_input_before_tensorflow():
    """Labs 2-3's throughput yardstick takes the students' scripts' command line, and refuses it the same way."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['ps_yardstick', '--batch-size', '0']\n"
        "try:\n"
        "    runpy.run_module('lab_utils.training.ps.yardstick', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code, 'tensorflow' in sys.modules)\n"
    )
    env = dict(os.environ, **tf_config(2, "worker", 0))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert out.stdout.strip() == "exit 2 False", (out.stdout, out.stderr)
    assert "batch_size must be >= 1" in out.stderr


# ----------------------------------------------------------------------------- the step's timeline stamps


def test_step_stamps_make_spans_that_never_overlap_or_go_backwards():
    from lab_utils.training.ps.graph import StepStamps

    sync = StepStamps(None, token=True)
    assert sync.spans(10.0, [0.5, 10.2, 10.5], 11.0) == [
        ("pull", "comm", 10.0, 10.2),
        ("compute", "compute", 10.2, 10.5),
        ("push + token wait", "wait", 10.5, 11.0),
    ]
    # a stamp before the call, or "computed" before "pulled" (the executor ran them in parallel),
    # or after the call returned: clamped, never a negative span
    spans = StepStamps(None, token=False).spans(10.0, [0.5, 9.0, 9.5], 11.0)
    assert spans == [("pull", "comm", 10.0, 10.0), ("compute", "compute", 10.0, 10.0), ("push", "comm", 10.0, 11.0)]
    assert StepStamps(None, token=False).spans(10.0, [0.5, 12.0, 13.0], 11.0)[1] == ("compute", "compute", 11.0, 11.0)


def _two_task_graph(placed_on_ps: bool):
    import tensorflow as tf

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        cluster = {"ps": ["localhost:1"], "worker": ["localhost:2"]}
        setter = v1.train.replica_device_setter(worker_device="/job:worker/task:0", cluster=cluster)
        with v1.device(setter if placed_on_ps else "/job:worker/task:0"):
            x = v1.placeholder(tf.float32, [None, 4])
            w = v1.get_variable("w", [4, 1])
            loss = tf.reduce_mean(tf.matmul(x, w))
            train = v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph, train, loss


@pytest.mark.parametrize("placed_on_ps", [True, False])
def test_step_stamps_split_a_step_only_where_it_crosses_to_a_ps(placed_on_ps):
    """The parameters on the PS: a stamp after they arrive and one after the gradients are
    ready, packed with the loss; everything on the worker: nothing to split (None)."""
    from lab_utils.training.ps.graph import StepStamps

    graph, train, loss = _two_task_graph(placed_on_ps)
    with graph.as_default():
        stamps = StepStamps.build(train, loss, ("worker", 0), token=False)
    if not placed_on_ps:
        assert stamps is None
        return
    assert stamps.tensor.shape.as_list() == [3] and stamps.tensor.dtype.name == "float64"
    kinds = [op.type for op in graph.get_operations() if op.name.startswith("step_stamps/")]
    assert kinds.count("Timestamp") == 2 and kinds.count("Identity") == 1  # one parameter pulled
    assert all(op.device == "/job:worker/task:0" for op in graph.get_operations() if op.name.startswith("step_stamps/"))
