"""lab_utils.training.ps.runs against real processes: a student's graph built out of the kernel,
and one small cluster run whose tables must agree with each other. The scripts are the
instructor notebooks' solutions (``lab_utils.grading.reference_script``)."""

from __future__ import annotations

import pytest

from lab_utils.grading import reference_script
from lab_utils.training.ps import runs as ps_runs

ASYNC = ("02_ps_async", "train_async.py")
SYNC = ("03_ps_sync", "train_sync.py")


def test_inspect_graph_describes_placement_and_the_sync_hook():
    a = ps_runs.inspect_graph(reference_script(*ASYNC), mode="async", workers=1, ps=2, index=0)
    assert {v["device"] for v in a["variables"]} == {"/job:ps/task:0", "/job:ps/task:1"}  # round robin
    assert a["loss_device"].startswith("/job:worker/task:0") and a["hooks"] == []
    s = ps_runs.inspect_graph(
        reference_script(*SYNC), mode="sync", workers=3, index=2, args={"replicas_to_aggregate": 2}
    )
    assert s["hooks"] == [
        {
            "type": "_SyncReplicasOptimizerHook",
            "is_chief": False,
            "num_tokens": 0,
            "replicas_to_aggregate": 2,
            "total_num_replicas": 3,
        }
    ]


def test_inspect_graph_reports_the_students_error(tmp_path):
    broken = tmp_path / "train_broken.py"
    broken.write_text("def build_graph(task, settings):\n    raise NotImplementedError('YOUR CODE HERE')\n")
    with pytest.raises(RuntimeError, match="NotImplementedError: YOUR CODE HERE"):
        ps_runs.inspect_graph(broken, mode="async")
    with pytest.raises(RuntimeError, match="not a Python script"):
        ps_runs.inspect_graph(tmp_path / "notes.txt", mode="async")


def test_run_ps_tables_agree():
    r = ps_runs.run_ps(
        reference_script(*ASYNC),
        workers=2,
        args={"batch_size": 100, "epochs": 1, "eval_every": 10},
        interval=0.2,
        progress=False,
        label="t",
    )
    table = r.workers_table()
    assert len(table) == 2 and table["local steps"].sum() == max(w["final_global_step"] for w in r.results.values())
    assert table["examples"].sum() == sum(w["examples"] for w in r.results.values())
    curve = r.accuracy_curve()
    assert curve["global_step"].is_monotonic_increasing and len(curve) >= 2
    assert curve["accuracy"].iloc[-1] == pytest.approx(r.accuracy)
    d = r.dstat_table()
    assert list(d.index) == ["ps:0", "worker:0", "worker:1", "total"]
    assert (d.loc[["worker:0", "worker:1"], "Memory (MB)"] > 100).all()
    assert d.loc["total", "Total Read (MB)"] > 0  # host loopback carried the PS traffic
    assert ps_runs.compare([r]).loc["t", "global steps"] == r.final_global_step
