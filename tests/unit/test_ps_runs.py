"""lab_utils.training.ps.runs without processes: worker fitting, tables and figures from synthetic results."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab_utils import data
from lab_utils.cluster import GUARD_MEMORY_BYTES, TF_TASK_MEMORY_BYTES, ResourceError
from lab_utils.training.ps import runs as ps_runs

PER_TASK = ps_runs.task_memory() + GUARD_MEMORY_BYTES  # a worker's
PS_TASK = ps_runs.task_memory("ps") + GUARD_MEMORY_BYTES


def test_a_task_counts_the_mnist_it_loads(monkeypatch, tmp_path):
    monkeypatch.setenv("LABS_OFFLINE", "1")
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # no Keras cache here
    monkeypatch.delenv("LABS_DATA_DIR", raising=False)
    sample = ps_runs.task_memory() - TF_TASK_MEMORY_BYTES
    assert ps_runs.cluster_memory(2) == PS_TASK + 2 * (TF_TASK_MEMORY_BYTES + sample + GUARD_MEMORY_BYTES)
    monkeypatch.setenv("LABS_OFFLINE", "0")  # online: the full set (a download is assumed to work)
    full = ps_runs.task_memory() - TF_TASK_MEMORY_BYTES
    shared = data.mnist_shared_bytes()
    # 5,000 images as float32 + uint8; 70,000: the test images as float32 of each worker's own,
    # and, once for all the workers, the uint8 images they map from the data cache
    assert 15e6 < sample < 25e6 and 30e6 < full < 35e6 and shared == 70_000 * 784
    assert ps_runs.task_memory("ps") == TF_TASK_MEMORY_BYTES  # a PS loads no data
    worker = TF_TASK_MEMORY_BYTES + full + GUARD_MEMORY_BYTES
    assert ps_runs.cluster_memory(3) == PS_TASK + 3 * worker + shared
    assert ps_runs.fit_workers(4, available=PS_TASK + shared + 2 * worker, cores=8) == 2
    assert ps_runs.fit_workers(4, available=PS_TASK + 2 * worker, cores=8) == 1  # the shared bytes count
    monkeypatch.setenv("LABS_CACHE_DIR", "off")  # no cache: each worker holds its own uint8 images
    assert 80e6 < ps_runs.task_memory() - TF_TASK_MEMORY_BYTES < 95e6 and data.mnist_shared_bytes() == 0


def test_a_ps_counts_without_data_and_a_cluster_is_its_tasks():
    assert ps_runs.cluster_memory(2) == PS_TASK + 2 * PER_TASK
    assert ps_runs.cluster_memory(3, ps=0, memory_per_task=100) == 3 * (100 + GUARD_MEMORY_BYTES)
    with pytest.raises(ValueError, match="role must be 'ps' or 'worker'"):
        ps_runs.task_memory("chief")


def test_fit_workers_keeps_what_fits(capsys):
    assert ps_runs.fit_workers(4, available=20 * PER_TASK, cores=2) == 4
    assert capsys.readouterr().out == ""


def test_fit_workers_scales_down_on_memory_with_a_message(capsys):
    assert ps_runs.fit_workers(4, available=PS_TASK + 2 * PER_TASK + 1, cores=8) == 2  # 1 PS + 2 workers
    out = capsys.readouterr().out
    assert "4 workers do not fit" in out and "using 2" in out and "MB per worker" in out
    assert ps_runs.fit_workers(4, available=PS_TASK + 2 * PER_TASK - 1, cores=8) == 1


def test_a_sweep_keeps_the_sizes_that_fit_and_says_which_it_leaves_out(capsys):
    room = PS_TASK + 3 * PER_TASK  # Binder's 2 GB beside Lab 4's kernel holds 1 PS + 3 workers
    assert ps_runs.fit_sweep([1, 2, 3, 4], available=room) == [1, 2, 3]
    out = capsys.readouterr().out
    assert out.startswith("[lab_utils] 4 workers do not fit here (1 PS + 4 workers need") and "runs 1, 2, 3" in out
    assert ps_runs.fit_sweep([4, 1], available=room + PER_TASK) == [4, 1]  # all fit: the order kept, nothing said
    assert capsys.readouterr().out == ""
    with pytest.raises(ResourceError, match="no size of this sweep fits: 1 PS \\+ 1 worker need"):
        ps_runs.fit_sweep([1, 2], available=PS_TASK)
    for bad in ([], [0, 1], [1.5], [True]):
        with pytest.raises(ValueError, match="sizes must be a non-empty list of integers"):
            ps_runs.fit_sweep(bad, available=room)


def test_any_kind_of_rank_is_sized_by_the_clusters_one_rule(capsys):
    """Horovod ranks (no PS), and Lab 5's AlexNet ranks of their own size: lab_utils.cluster.fit_ranks,
    the rule ps_runs.fit_workers applies to a PS cluster."""
    from lab_utils.cluster import RANKS_PER_CORE, fit_ranks

    assert fit_ranks(4, available=2 * PER_TASK + data.mnist_shared_bytes(), cores=8) == 2  # no PS to hold
    out = capsys.readouterr().out
    assert out.startswith("[lab_utils] 4 ranks do not fit here (memory:") and "MB per rank" in out, out
    assert "PS" not in out and out.rstrip().endswith("using 2")
    alexnet = 900 * 2**20
    assert fit_ranks(3, memory_per_task=alexnet, available=2 * (alexnet + GUARD_MEMORY_BYTES), cores=8) == 2
    assert fit_ranks(8, available=100 * PER_TASK, cores=1) == RANKS_PER_CORE
    assert "cores: 1 usable, at most 2 ranks per core" in capsys.readouterr().out.splitlines()[-1]
    with pytest.raises(ResourceError, match="not even 1 rank fits: it needs about"):
        fit_ranks(2, memory_per_task=alexnet, available=alexnet)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="requested ranks must be an integer >= 1"):
            fit_ranks(bad, available=100 * PER_TASK)


def test_fit_workers_scales_down_on_cores(capsys):
    assert ps_runs.fit_workers(4, available=100 * PER_TASK, cores=1) == 2
    assert "cores: 1 usable" in capsys.readouterr().out


def test_fit_workers_refuses_when_nothing_fits():
    with pytest.raises(ResourceError, match="not even 1 PS \\+ 1 worker fits"):
        ps_runs.fit_workers(2, available=PER_TASK, cores=2)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_fit_workers_bad_input(bad):
    with pytest.raises(ValueError, match="requested workers"):
        ps_runs.fit_workers(bad, available=100 * PER_TASK, cores=2)


def _result(index, mode="async", **kw):
    r = {
        "mode": mode,
        "accuracy": 0.9 - 0.01 * index,
        "final_global_step": 100,
        "target_global_steps": 100,
        "local_steps": 50 + 10 * index,
        "examples": (50 + 10 * index) * 60,
        "examples_per_sec": 1000.0 + index,
        "exec_time": 5.0 + index,
        "train_time": 4.0 + index,
        "startup_time": 2.0,
        "batch_size": 60,
        "num_workers": 2,
        "straggler_delay": 0.05 * index,
        "is_chief": index == 0,
    }
    if mode == "async":
        r.update(staleness_mean=0.5 + index, staleness_max=3 + index)
    r.update(kw)
    return r


def _run(mode="async", label=None, batch=60, events=None):
    results = {f"worker:{i}": _result(i, mode, batch_size=batch) for i in (1, 0)}
    if events is None:
        events = pd.DataFrame(
            [
                {"time": 101.0, "task": "worker:0", "step": 10, "examples": 600, "accuracy": 0.5},
                {"time": 101.5, "task": "worker:1", "step": 11, "examples": 600},
                {"time": 102.0, "task": "worker:0", "step": 50, "examples": 1200, "accuracy": 0.8},
            ]
        )
    return ps_runs.PSRun(label=label or f"{mode} {batch}", results=results, events=events, wall_time=7.5, started=100.0)


def test_psrun_scalars_come_from_the_chief():
    r = _run()
    assert (r.mode, r.workers, r.batch_size, r.final_global_step) == ("async", 2, 60, 100)
    assert r.accuracy == pytest.approx(0.9)
    # all examples over the longest training time
    assert r.examples_per_sec == pytest.approx((50 * 60 + 60 * 60) / 5.0)


def test_workers_table_is_sorted_and_marks_the_chief():
    t = _run().workers_table()
    assert list(t.index) == ["worker:0 (chief)", "worker:1"]
    assert list(t["exec time (s)"]) == [5.0, 6.0]
    assert list(t["staleness max"]) == [3, 4]
    assert "staleness mean" not in _run("sync").workers_table().columns


def test_accuracy_curve_adds_the_final_value_and_is_relative_to_launch():
    c = _run().accuracy_curve()
    assert list(c["global_step"]) == [10, 50, 100]
    assert list(c["accuracy"]) == pytest.approx([0.5, 0.8, 0.9])
    assert list(c["time"]) == pytest.approx([1.0, 2.0, 7.5])


def test_accuracy_curve_without_evaluations_has_the_final_point():
    ev = pd.DataFrame([{"time": 101.0, "task": "worker:1", "step": 3, "examples": 60}])
    c = _run(events=ev).accuracy_curve()
    assert list(c["global_step"]) == [100] and c["accuracy"].iloc[0] == pytest.approx(0.9)


def test_settled_accuracy_is_the_mean_of_the_last_three_evaluations():
    assert _run().settled_accuracy == pytest.approx((0.5 + 0.8 + 0.9) / 3)
    ev = pd.DataFrame(
        [{"time": 100.0 + s / 100, "task": "worker:0", "step": s, "accuracy": a} for s, a in ((20, 0.1), (40, 0.7))]
        + [{"time": 101.0, "task": "worker:0", "step": 60, "accuracy": 0.6}]
    )
    # the final value (0.9 at step 100) counts; the evaluation at step 20 is older than the last three
    assert _run(events=ev).settled_accuracy == pytest.approx((0.7 + 0.6 + 0.9) / 3)
    ev = pd.DataFrame([{"time": 101.0, "task": "worker:1", "step": 3, "examples": 60}])
    assert _run(events=ev).settled_accuracy == pytest.approx(0.9)  # no evaluations: the final one alone


def test_dstat_table_needs_a_monitor():
    with pytest.raises(ValueError, match="monitor=False"):
        _run().dstat_table()


def test_compare_and_exec_time_table():
    runs = [_run("async", batch=120), _run("sync", batch=10)]
    c = ps_runs.compare(runs)
    assert list(c["mode"]) == ["async", "sync"]
    assert list(c["exec time spread (s)"]) == [1.0, 1.0]
    t = ps_runs.exec_time_table(runs)
    assert list(t.columns) == ["Batch Size", "Execution Time (seconds)"]
    assert list(t["Batch Size"]) == [10, 120] and list(t["Execution Time (seconds)"]) == [6.0, 6.0]


def test_plot_accuracy(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    fig = ps_runs.plot_accuracy([_run(), _run("sync")], x="time")
    assert len(fig.axes[0].lines) == 2 and fig.axes[0].get_title() == ""
    assert ps_runs.plot_accuracy([_run()], title="Table 3 runs").axes[0].get_title() == "Table 3 runs"
    with pytest.raises(ValueError, match="global_step"):
        ps_runs.plot_accuracy([_run()], x="epoch")
    assert not math.isnan(_run().accuracy)


def test_plot_accuracy_draws_every_run_and_frames_the_accuracies():
    import matplotlib

    matplotlib.use("Agg")
    ax = ps_runs.plot_accuracy([_run(label="same"), _run("sync", label="same")]).axes[0]
    assert len(ax.lines) == 2  # one line per run, even when two runs share a label
    assert ax.get_xlabel() == "global step" and ax.get_ylim() == pytest.approx((0.45, 0.92))


class _FakeMonitor:
    """The two things dstat_table reads from a Monitor."""

    def __init__(self, scale):
        self.start_time, self.stop_time, self.scale = 0.0, 2.0, scale

    def summary(self):
        nan = float("nan")
        df = pd.DataFrame(
            {
                "Peak CPU": [50.0, 100.0 * self.scale],
                "Avg CPU": [20.0, 80.0 * self.scale],
                "Peak Mem": [400 * 2**20, 1200 * 2**20],
                "Network R": [nan, 8 * 2**20],
                "Network W": [nan, 4 * 2**20],
            },
            index=["ps:0", "total"],
        )
        df.attrs["network_scope"] = "host"
        return df


def test_dstat_table_units_and_rates():
    r = _run()
    r.monitor = _FakeMonitor(1)
    t = r.dstat_table()
    assert list(t.index) == ["ps:0", "total"]
    assert t.loc["total", "Memory (MB)"] == 1200 and t.loc["total", "Total Read (MB)"] == 8
    assert t.loc["total", "Avg Read (MB/s)"] == 4 and t.loc["total", "Avg Write (MB/s)"] == 2  # over 2 s
    assert math.isnan(t.loc["ps:0", "Total Read (MB)"]) and t.attrs["network_scope"] == "host"


def test_dstat_compare_takes_the_total_row_of_each_run():
    a, s = _run("async", label="A"), _run("sync", label="S")
    a.monitor, s.monitor = _FakeMonitor(1), _FakeMonitor(2)
    c = ps_runs.dstat_compare([a, s])
    assert list(c.index) == ["A", "S"] and list(c["Max CPU (%)"]) == [100.0, 200.0]


def _sweep_run(batch, exec_times, train_times):
    results = {
        f"worker:{i}": {
            "mode": "sync",
            "batch_size": batch,
            "exec_time": e,
            "train_time": t,
            "accuracy": 0.9,
            "final_global_step": 10,
            "examples": 600,
        }
        for i, (e, t) in enumerate(zip(exec_times, train_times, strict=True))
    }
    return ps_runs.PSRun(label=f"b{batch}", results=results, events=pd.DataFrame(), wall_time=1.0, started=0.0)


def test_sweep_table_adds_the_slowest_loop_time_per_batch_size():
    runs = [_sweep_run(120, [1.5, 0.9], [0.83, 0.841]), _sweep_run(10, [1.63, 1.1], [0.94, 0.952])]  # unsorted
    t = ps_runs.sweep_table(runs)
    assert list(t.columns) == ["Batch Size", "Execution Time (seconds)", ps_runs.LOOP_COLUMN]
    assert list(t["Batch Size"]) == [10, 120]
    assert list(t["Execution Time (seconds)"]) == [1.63, 1.5]
    assert list(t[ps_runs.LOOP_COLUMN]) == [0.95, 0.84]


def test_sweep_table_bad_input():
    with pytest.raises(ValueError, match="at least one run"):
        ps_runs.sweep_table([])
    with pytest.raises(ValueError, match="one run per batch size"):
        ps_runs.sweep_table([_sweep_run(10, [1.0], [0.5]), _sweep_run(10, [1.0], [0.5])])


def test_in_a_sync_run_every_worker_waits_out_the_chiefs_evaluations():
    """R = N: while the chief evaluates, no token is handed out, so the other worker's loop holds the
    chief's evaluation time too; it is taken out of that worker's train time (issue 52: the sync
    workers' loops then agree, as Lab 3 says)."""
    from lab_utils.training.ps.runs import chief_evaluations_out

    chief = {"mode": "sync", "is_chief": True, "train_time": 10.0, "eval_time": 0.5, "examples": 1000}
    other = {"mode": "sync", "is_chief": False, "train_time": 10.52, "eval_time": 0.0, "examples": 1000}
    out = chief_evaluations_out({"worker:0": chief, "worker:1": other})
    assert out["worker:0"] is chief and out["worker:1"]["waited_for_eval"] == 0.5
    assert abs(out["worker:1"]["train_time"] - 10.02) < 1e-9
    assert abs(out["worker:1"]["examples_per_sec"] - 1000 / 10.02) < 1e-9
    assert other["train_time"] == 10.52  # the reported dicts are not changed
    backup = {**chief, "replicas_to_aggregate": 1}  # R < N: the others go on without the chief
    assert chief_evaluations_out({"worker:0": backup, "worker:1": other})["worker:1"] is other
    asynchronous = {**chief, "mode": "async"}
    assert chief_evaluations_out({"worker:0": asynchronous, "worker:1": other})["worker:1"] is other
