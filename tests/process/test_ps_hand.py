"""Process tests for Lab 2, Part 1 (a cluster by hand): a 1 PS + 1 worker cluster whose tasks
build their own TF_CONFIG with the student's functions (``ps_runs.run_two_tasks``).

The script is the instructor notebook's solution, extracted by
``lab_utils.grading.reference_script`` (the one copy of it); the wrong scripts below reuse
its functions and change one thing. A successful run costs two TensorFlow imports (about
8 s on 2 cores); the wrong ones end before TensorFlow, in about a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab_utils.cluster import ClusterError
from lab_utils.grading import reference_script
from lab_utils.grading.layout import GRADING_ROOT
from lab_utils.training.ps import runs as ps_runs


@pytest.fixture(scope="module")
def solution() -> Path:
    if not (Path(GRADING_ROOT) / "source").is_dir():
        pytest.skip("not the instructor's repository: no grading/source")
    try:
        return reference_script("02_ps_async", "two_tasks.py")
    except LookupError as exc:
        pytest.fail(f"Lab 2's instructor notebook needs its `%%writefile two_tasks.py` cell (Part 1): {exc}")


def wrong(tmp_path: Path, solution: Path, body: str, name: str = "two_tasks.py") -> Path:
    """A script that takes the solution's functions and changes what ``body`` says."""
    script = tmp_path / name
    script.write_text(
        "import importlib.util\n"
        "from lab_utils.training.ps import hand as ps_hand\n"
        f"_spec = importlib.util.spec_from_file_location('solution', {str(solution)!r})\n"
        "solution = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(solution)\n"
        "cluster_spec, tf_config, start_server = solution.cluster_spec, solution.tf_config, solution.start_server\n"
        f"{body}\n"
        "if __name__ == '__main__':\n"
        "    ps_hand.main(cluster_spec, tf_config, start_server)\n"
    )
    return script


def test_each_task_starts_its_server_from_its_own_tf_config_and_they_talk(solution, capfd):
    run = ps_runs.run_two_tasks(solution, updates=4)
    assert run.values == [1.0, 2.0, 3.0, 4.0], "worker:0's increments of the counter on the PS"
    assert run.read_back == 4.0, "a second session reads the value the PS kept"
    assert run.device == "/job:ps/task:0"
    ps_address, worker_address = run.cluster["ps"], run.cluster["worker"]
    assert len(ps_address) == 1 and len(worker_address) == 1 and ps_address != worker_address
    assert set(run.tf_config) == {"ps:0", "worker:0"}, "each task reported the TF_CONFIG it started from"
    for name, cfg in run.tf_config.items():
        job, index = name.split(":")
        assert cfg == {"cluster": run.cluster, "task": {"type": job, "index": int(index)}}
    # every process ended: the worker by itself, the PS stopped by the launcher
    state = json.loads((Path(run.run_dir) / "state.json").read_text())
    assert state["status"] == "stopped"
    assert {t["name"]: t["state"] for t in state["tasks"]} == {"ps:0": "stopped", "worker:0": "done"}
    logs = {p.name: p.read_text() for p in Path(run.run_dir).glob("*.log")}
    assert "--job_name=ps --task_index=0" in logs["ps-0.log"] and "TF_CONFIG=" in logs["worker-0.log"]
    assert capfd.readouterr().err == "", "nbgrader scores a cell with stderr output 0"


@pytest.mark.parametrize(
    "body,task,message",
    [
        (  # TF_CONFIG with a job name the cluster does not have
            "def tf_config(cluster, job, index):\n"
            "    cfg = solution.tf_config(cluster, job, index)\n"
            "    cfg['task']['type'] = 'parameter_server' if job == 'ps' else job\n"
            "    return cfg\n",
            "ps:0",
            "['task']['type'] is 'parameter_server', which is not a job of the cluster (its jobs: 'ps', 'worker')",
        ),
        (  # an index one too far, in both tasks
            "def tf_config(cluster, job, index):\n    return solution.tf_config(cluster, job, index + 1)\n",
            None,
            "which is out of range: job ",
        ),
        (  # a cluster spec of one string per job
            "def cluster_spec(ps_hosts, worker_hosts):\n    return {'ps': ps_hosts, 'worker': worker_hosts}\n",
            None,
            "['ps'] is str ",
        ),
        (  # the released notebook: not written yet
            "def cluster_spec(ps_hosts, worker_hosts):\n    raise NotImplementedError()\n",
            None,
            "cluster_spec is not written yet (it raises NotImplementedError)",
        ),
    ],
    ids=["a-job-name-not-in-the-cluster", "an-index-out-of-range", "hosts-not-split", "not-written-yet"],
)
def test_a_wrong_function_fails_at_once_naming_the_task_and_what_is_wrong(solution, tmp_path, body, task, message):
    script = wrong(tmp_path, solution, body)
    with pytest.raises(ClusterError) as info:
        ps_runs.run_two_tasks(script, timeout=60)
    err = info.value
    assert err.task == task if task else err.task in ("ps:0", "worker:0")
    assert err.exit_code == 2
    first = str(err).splitlines()[0]
    assert first.startswith(f"two_tasks.py failed in {err.task}: ") and message in first, first
    assert "$ python two_tasks.py --ps_hosts=" in err.log_tail, "the log shows the command line the task got"


def test_a_start_server_that_returns_no_server_is_named(solution, tmp_path):
    script = wrong(tmp_path, solution, "def start_server():\n    solution.start_server()\n")
    with pytest.raises(ClusterError, match="start_server\\(\\) returned NoneType: expected a tf.distribute.Server"):
        ps_runs.run_two_tasks(script, timeout=60)


def test_a_script_that_never_calls_main_is_named(tmp_path):
    script = tmp_path / "two_tasks.py"
    script.write_text("def cluster_spec(ps_hosts, worker_hosts):\n    return {}\n")
    with pytest.raises(ClusterError, match="ended without calling ps_hand.main"):
        ps_runs.run_two_tasks(script, timeout=60)
