"""Unit tests for Lab 2's cluster by hand (Part 1; lab_utils.training.ps.hand, ps_hand_runs):
the CS 744 flags, the checks of what a student's functions return, a task's way to a clear
error, and the launcher's translation of TF_CONFIG into the flags. No process starts and
TensorFlow is not imported: every path here ends before the server."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from lab_utils.training.ps import runs as ps_runs
from lab_utils.training.ps.hand import runs as ps_hand_runs
from lab_utils.training.ps.hand import task as ps_hand
from lab_utils.training.ps.hand.task import TwoTasksError, check_cluster, check_tf_config, parse_flags


@pytest.fixture(autouse=True)
def no_processes(refuse_processes):
    """Nothing in this file may start a process."""


def flags(job="worker", index=1, ps="10.0.0.1:2222", workers="10.0.0.2:2222,10.0.0.3:2222"):
    return parse_flags([f"--ps_hosts={ps}", f"--worker_hosts={workers}", f"--job_name={job}", f"--task_index={index}"])


CLUSTER = {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}


def config(job="worker", index=1, cluster=CLUSTER):
    return {"cluster": cluster, "task": {"type": job, "index": index}}


# ----------------------------------------------------------------------------- flags


def test_flags_are_the_cs744_command_line():
    f = flags()
    assert (f.ps_hosts, f.worker_hosts, f.job_name, f.task_index, f.updates) == (
        "10.0.0.1:2222",
        "10.0.0.2:2222,10.0.0.3:2222",
        "worker",
        1,
        ps_hand.UPDATES,
    )
    assert ps_hand.hosts(" a:1, b:2 ,") == ["a:1", "b:2"]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--job_name=worker", "--task_index=2"], "--task_index=2 is not a task of job 'worker' (2 host(s))"),
        (["--job_name=chief", "--task_index=0"], "invalid choice: 'chief'"),
        (["--job_name=ps", "--task_index=-1"], "--task_index=-1 is not a task of job 'ps'"),
        (["--job_name=ps", "--task_index=0", "--updates=0"], "--updates must be >= 1"),
    ],
)
def test_bad_flags_exit_2_with_argparses_message(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse_flags(["--ps_hosts=a:1", "--worker_hosts=b:2,c:3", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------------------- what cluster_spec returns


def test_a_right_cluster_passes_as_lists():
    spec = check_cluster({"ps": ("10.0.0.1:2222",), "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]}, flags())
    assert spec == CLUSTER and all(isinstance(v, list) for v in spec.values())


@pytest.mark.parametrize(
    "cluster,message",
    [
        (None, "returned NoneType None: expected a dict of jobs"),
        ([["10.0.0.1:2222"]], "expected a dict of jobs"),
        ({"parameter_server": ["10.0.0.1:2222"], "worker": CLUSTER["worker"]}, "'ps' missing"),
        ({**CLUSTER, "chief": ["x:1"]}, "the jobs 'chief' that no task was started as"),
        ({"ps": "10.0.0.1:2222", "worker": CLUSTER["worker"]}, "['ps'] is str '10.0.0.1:2222': expected a list"),
        ({"ps": CLUSTER["ps"], "worker": ["10.0.0.2:2222,10.0.0.3:2222"]}, "expected the --worker_hosts addresses"),
        ({"ps": CLUSTER["ps"], "worker": CLUSTER["worker"][::-1]}, "expected the --worker_hosts addresses"),
    ],
)
def test_a_wrong_cluster_says_what_was_expected(cluster, message):
    with pytest.raises(TwoTasksError, match="^cluster_spec\\('10.0.0.1:2222', '10.0.0.2:2222,10.0.0.3:2222'\\)") as e:
        check_cluster(cluster, flags())
    assert message in str(e.value)


# ----------------------------------------------------------------------------- what tf_config returns


def test_a_right_tf_config_passes_and_is_json():
    assert json.loads(json.dumps(check_tf_config(config(), CLUSTER, flags()))) == config()
    assert check_tf_config(config("ps", 0), CLUSTER, flags("ps", 0)) == config("ps", 0)


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"cluster": CLUSTER}, "returned ['cluster']: TF_CONFIG is a dict with exactly the keys 'cluster' and 'task'"),
        ("{}", "returned str"),
        (config(cluster={"ps": [], "worker": []}), "['cluster'] is {'ps': [], 'worker': []}: expected the cluster"),
        ({"cluster": CLUSTER, "task": ["worker", 1]}, "expected a dict with the keys 'type' and 'index'"),
        (
            config("parameter_server", 1),
            "'parameter_server', which is not a job of the cluster (its jobs: 'ps', 'worker')",
        ),
        (config("worker", "1"), "['task']['index'] is str '1': expected an int"),
        (config("worker", True), "is bool True: expected an int"),
        (config("worker", 2), "names task worker:2, which is out of range: job 'worker' has 2 task(s), indices 0..1"),
        (config("worker", 0), "names worker:0, but this task was started as worker:1"),
        (config("ps", 0), "names ps:0, but this task was started as worker:1 (--job_name=worker --task_index=1)"),
        (
            {"cluster": CLUSTER, "task": types.MappingProxyType({"type": "worker", "index": 1})},
            "cannot be written as JSON",
        ),
    ],
)
def test_a_wrong_tf_config_names_the_task_and_what_is_wrong(cfg, message):
    with pytest.raises(TwoTasksError, match="^tf_config\\(cluster, 'worker', 1\\)") as e:
        check_tf_config(cfg, CLUSTER, flags())
    assert message in str(e.value)


# ----------------------------------------------------------------------------- a task's way to a clear error


def good_spec(ps_hosts, worker_hosts):
    return {"ps": ps_hand.hosts(ps_hosts), "worker": ps_hand.hosts(worker_hosts)}


def never_called():
    raise AssertionError("the server must not start after a wrong TF_CONFIG")


ARGV = ["--ps_hosts=a:1", "--worker_hosts=b:2", "--job_name=ps", "--task_index=0"]


@pytest.mark.parametrize(
    "spec,tf_config,message",
    [
        (lambda p, w: {"ps": [p], "workers": [w]}, None, "cluster_spec('a:1', 'b:2') returned jobs 'ps', 'workers'"),
        (good_spec, lambda c, j, i: {"cluster": c, "task": {"type": j, "index": i + 1}}, "out of range"),
        (lambda p, w: 1 / 0, None, "cluster_spec raised ZeroDivisionError: division by zero"),
        (good_spec, lambda c, j, i: c[j][i + 5], "tf_config raised IndexError: list index out of range"),
    ],
)
def test_main_ends_the_task_with_exit_2_and_a_problem_event(spec, tf_config, message, capsys, monkeypatch):
    monkeypatch.delenv("LABS_REPORT_FILE", raising=False)  # events on stdout
    monkeypatch.delenv("LABS_REPORT_DIR", raising=False)
    monkeypatch.setenv("LABS_TASK", "ps:0")
    monkeypatch.setenv("TF_CONFIG", "the launcher's")
    with pytest.raises(SystemExit) as info:
        ps_hand.main(spec, tf_config or (lambda c, j, i: None), never_called, argv=ARGV)
    assert info.value.code == ps_hand.BAD_FUNCTION_EXIT
    out = capsys.readouterr().out.splitlines()
    problems = [json.loads(line) for line in out if line.startswith("{") and '"problem"' in line]
    assert len(problems) == 1 and message in problems[0]["message"], out
    assert out[-1].startswith("lab_utils.training.ps.hand: ps:0: ") and message in out[-1]
    assert os.environ["TF_CONFIG"] == "the launcher's", "no TF_CONFIG is set from a wrong one"


def test_a_function_not_written_yet_says_where_to_write_it(capsys, monkeypatch):
    monkeypatch.delenv("LABS_REPORT_FILE", raising=False)
    monkeypatch.delenv("LABS_REPORT_DIR", raising=False)

    def cluster_spec(ps_hosts, worker_hosts):
        raise NotImplementedError()  # what the released notebook holds

    with pytest.raises(SystemExit):
        ps_hand.main(cluster_spec, None, never_called, argv=ARGV)
    out = capsys.readouterr().out
    assert "cluster_spec is not written yet (it raises NotImplementedError): write it where it says YOUR CODE" in out


# ----------------------------------------------------------------------------- the launcher's entry


def test_launch_gives_the_script_the_four_flags_and_no_tf_config(tmp_path, monkeypatch, capsys):
    script = tmp_path / "shows.py"
    script.write_text(
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'tf_config': os.environ.get('TF_CONFIG'), 'name': __name__}))\n"
        "raise SystemExit(0)\n"
    )
    launcher = {
        "cluster": {"ps": ["10.1.0.1:40001"], "worker": ["10.1.0.2:40002"]},
        "task": {"type": "worker", "index": 0},
    }
    monkeypatch.setenv("TF_CONFIG", json.dumps(launcher))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(SystemExit) as info:
        ps_hand.launch([str(script), "--updates", "3"])
    assert info.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    flags = "--ps_hosts=10.1.0.1:40001 --worker_hosts=10.1.0.2:40002 --job_name=worker --task_index=0 --updates=3"
    assert lines[0] == f"$ python shows.py {flags}"
    seen = json.loads(lines[1])
    assert seen == {"argv": flags.split(), "tf_config": None, "name": "__main__"}


def test_launch_fails_a_script_that_never_calls_main(tmp_path, monkeypatch, capsys):
    script = tmp_path / "two_tasks.py"
    script.write_text("def cluster_spec(ps_hosts, worker_hosts):\n    return {}\n")
    cfg = {"cluster": {"ps": ["a:1"], "worker": ["b:2"]}, "task": {"type": "ps", "index": 0}}
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.delenv("LABS_REPORT_FILE", raising=False)
    monkeypatch.delenv("LABS_REPORT_DIR", raising=False)
    with pytest.raises(SystemExit) as info:
        ps_hand.launch([str(script)], env={"TF_CONFIG": json.dumps(cfg)})
    assert info.value.code == ps_hand.BAD_FUNCTION_EXIT
    assert "two_tasks.py ended without calling ps_hand.main(cluster_spec, tf_config, start_server)" in (
        capsys.readouterr().out
    )


# ----------------------------------------------------------------------------- the notebook side


def test_load_two_tasks_reads_the_file_again_after_an_edit(tmp_path):
    script = tmp_path / "two_tasks.py"
    script.write_text("def cluster_spec(ps_hosts, worker_hosts):\n    return 1\n")
    assert ps_runs.load_two_tasks(script).cluster_spec("a", "b") == 1
    script.write_text("def cluster_spec(ps_hosts, worker_hosts):\n    return 2\n")
    assert ps_runs.load_two_tasks(script).cluster_spec("a", "b") == 2
    with pytest.raises(FileNotFoundError, match="run the `%%writefile nothing.py` cell first"):
        ps_runs.load_two_tasks(tmp_path / "nothing.py")


def test_run_two_tasks_refuses_bad_input_before_starting_anything(tmp_path):
    with pytest.raises(FileNotFoundError, match="run the `%%writefile two_tasks.py` cell first"):
        ps_runs.run_two_tasks(tmp_path / "two_tasks.py")
    script = tmp_path / "two_tasks.py"
    script.write_text("")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="updates must be an integer >= 1"):
            ps_runs.run_two_tasks(script, updates=bad)


def test_two_tasks_explains_itself():
    run = ps_hand_runs.TwoTasks(
        values=[1.0, 2.0, 3.0],
        read_back=3.0,
        device="/job:ps/task:0",
        cluster={"ps": ["localhost:4001"], "worker": ["localhost:4002"]},
        wall_time=6.25,
    )
    assert repr(run) == (
        "<TwoTasks (ps: localhost:4001, worker: localhost:4002): worker:0 added 1 to a counter on /job:ps/task:0 "
        "3 times (1, 2, 3) and read 3 back in a new session; 6.2 s>"
    )
