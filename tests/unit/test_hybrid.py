"""The Parallax idea without launching anything: arguments, the synthetic data, the byte
accounting, and how a run's row is made from the ranks' results and the link counters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lab_utils.cluster import netem
from lab_utils.training import runs as training_runs
from lab_utils.training.hybrid import runs as hybrid
from lab_utils.training.hybrid import task as hybrid_task

SMALL = hybrid_task.Settings(batch_size=64, users=500, items=2000, dim=8, hidden=16)


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="sharded", workers=2), "mode must be one of"),
        (dict(mode="ps", workers=0), "workers must be an integer >= 1"),
        (dict(mode="ps", workers=True), "workers must be an integer >= 1"),
        (dict(mode="ps", workers="2"), "workers must be an integer >= 1"),
        (dict(mode="hybrid", workers=2, hosts="emulated:n=2,bandwidth=100mbit"), "one emulated host per rank"),
        (dict(mode="hybrid", workers=2, hosts="cloud"), "hosts must be"),
        (dict(mode="hybrid", workers=2, steps=0), "--steps must be >= 1, got 0"),
        (dict(mode="hybrid", workers=2, batch_size=-1), "--batch-size must be >= 1"),
        (dict(mode="hybrid", workers=2, learning_rate=0), "--learning-rate must be > 0"),
        (dict(mode="hybrid", workers=2, colour="red"), "unrecognized arguments: --colour red"),
    ],
)
def test_run_refuses_bad_arguments_before_launching(kwargs, match, monkeypatch):
    monkeypatch.setattr(training_runs, "MPIJob", None)  # nothing may launch
    with pytest.raises(ValueError, match=match):
        hybrid.run_hybrid(**kwargs)


def test_experiment_refuses_unknown_modes():
    with pytest.raises(ValueError, match=r"modes must be a non-empty selection of \('ps', 'allreduce', 'hybrid'\)"):
        hybrid.experiment(workers=(2,), modes=("ps", "parallax"))
    with pytest.raises(ValueError, match="non-empty"):
        hybrid.experiment(workers=(2,), modes=())


def test_task_settings_and_sizes():
    s = hybrid_task.parse_args(["--mode", "hybrid"])
    assert s == hybrid_task.Settings(mode="hybrid")
    assert s.table_rows == 100_000
    assert s.table_rows * s.dim * 4 == 12_800_000  # the 12.8 MB table
    assert s.dense_params == 64 * 1024 + 1024 + 1024 * 1024 + 1024 + 1024 + 1
    with pytest.raises(ValueError, match="invalid choice: 'sharded'"):
        hybrid_task.check_args(["--mode", "sharded"])
    with pytest.raises(ValueError, match="--warmup must be >= 0, got -1"):
        hybrid_task.check_args(["--mode", "ps", "--warmup", "-1"])


# ----------------------------------------------------------------------------- data


def test_the_data_is_deterministic_and_differs_by_worker_and_step():
    world = hybrid_task.make_world(SMALL)
    ids, labels = hybrid_task.batch(world, SMALL, worker=1, step=3)
    again_ids, again_labels = hybrid_task.batch(hybrid_task.make_world(SMALL), SMALL, worker=1, step=3)
    np.testing.assert_array_equal(ids, again_ids)
    np.testing.assert_array_equal(labels, again_labels)
    assert not np.array_equal(ids, hybrid_task.batch(world, SMALL, worker=0, step=3)[0])
    assert not np.array_equal(ids, hybrid_task.batch(world, SMALL, worker=1, step=4)[0])
    assert ids.shape == (64, 2) and ids.dtype == np.int32 and labels.dtype == np.float32
    assert ids[:, 0].min() >= 0 and ids[:, 0].max() < SMALL.users  # users first in the table
    assert ids[:, 1].min() >= SMALL.users and ids[:, 1].max() < SMALL.table_rows  # then items
    assert set(np.unique(labels)) <= {0.0, 1.0}


def test_ids_are_zipf_like_and_clicks_follow_the_hidden_model():
    s = hybrid_task.Settings()
    world = hybrid_task.make_world(s)
    draws = [hybrid_task.batch(world, s, worker=0, step=t) for t in range(40)]
    items = np.concatenate([ids[:, 1] for ids, _ in draws]) - s.users
    counts = np.bincount(items, minlength=s.items)
    assert counts[:10].sum() > 0.15 * len(items)  # a few popular items...
    assert (counts > 0).sum() > 0.2 * len(items)  # ...and a long tail of rare ones
    assert len(np.unique(draws[0][0])) < 0.75 * draws[0][0].size  # a batch repeats rows
    clicks = np.concatenate([labels for _, labels in draws])
    assert 0.15 < clicks.mean() < 0.35
    # Items the ground truth favours are clicked more often: the data can be learnt.
    favoured = world.item_bias[items] > 0
    assert clicks[favoured].mean() > clicks[~favoured].mean() + 0.1


def test_every_rank_starts_from_the_same_weights():
    table, dense = hybrid_task.init_params(SMALL)
    table2, dense2 = hybrid_task.init_params(SMALL)
    np.testing.assert_array_equal(table, table2)
    assert table.shape == (SMALL.table_rows, SMALL.dim) and table.dtype == np.float32
    assert [w.shape for w in dense] == hybrid_task.dense_shapes(SMALL.dim, SMALL.hidden)
    assert all(np.array_equal(a, b) for a, b in zip(dense, dense2, strict=True))
    assert sum(w.size for w in dense) == SMALL.dense_params


# ----------------------------------------------------------------------------- bytes


def test_ring_bytes():
    assert hybrid_task.ring_bytes(1000, 1) == 0
    assert hybrid_task.ring_bytes(1000, 2) == 1000
    assert hybrid_task.ring_bytes(1000, 4) == 1500
    with pytest.raises(ValueError, match="ranks must be >= 1, got 0"):
        hybrid_task.ring_bytes(1000, 0)


def test_message_bytes_per_mode():
    k, dim, dense, rows = 300, 32, 1_000_000, 100_000
    ps = hybrid_task.message_bytes("ps", 4, k, dim, dense, rows)
    # Pull: k ids out, k rows in; push: k ids and k summed rows out. Plus the whole MLP each way.
    assert ps == {
        "sparse_sent": 300 * 4 + 300 * 4 + 300 * 32 * 4,
        "sparse_received": 300 * 32 * 4,
        "dense_sent": 4_000_000,
        "dense_received": 4_000_000,
    }
    hyb = hybrid_task.message_bytes("hybrid", 4, k, dim, dense, rows)
    assert hyb["sparse_sent"] == ps["sparse_sent"] and hyb["sparse_received"] == ps["sparse_received"]
    assert hyb["dense_sent"] == hyb["dense_received"] == 2 * 3 / 4 * 4_000_000  # the ring, not the PS
    ar = hybrid_task.message_bytes("allreduce", 4, k, dim, dense, rows)
    assert ar["sparse_sent"] == ar["sparse_received"] == 0  # made dense: no sparse traffic...
    assert ar["dense_sent"] == 2 * 3 / 4 * (4_000_000 + 100_000 * 32 * 4)  # ...the whole table in the ring
    assert hybrid_task.message_bytes("allreduce", 1, k, dim, dense, rows)["dense_sent"] == 0
    with pytest.raises(ValueError, match="mode must be one of"):
        hybrid_task.message_bytes("parallax", 4, k, dim, dense, rows)


# ----------------------------------------------------------------------------- a run's row


class _FakeNetwork:
    """A Network whose links counted ``counters`` (its own per-step arithmetic, unchanged)."""

    def __init__(self, counters):
        self._counters = counters

    def counters(self):
        return self._counters

    mb_per_step = netem.Network.mb_per_step


class _FakeJob:
    """What hybrid.run_hybrid reads from an MPIJob: wait() -> results, .network, .emulated."""

    made: list[_FakeJob] = []
    emulated = True
    timeline = None  # no trace written
    run_dir = "/nowhere"

    def __init__(self, np, script, args, **kwargs):
        self.np, self.args, self.kwargs = np, args, kwargs
        self.network = _FakeNetwork({i: {"sent": 10e6 * (i + 1), "received": 10e6} for i in range(np)})
        _FakeJob.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def wait(self):
        worker = {
            "role": "worker",
            "step_s": 0.5,
            "examples_per_s": 512.0,
            "loss_start": 0.7,
            "loss_end": 0.6,
            "unique_rows": 300,
            "sparse_sent_per_step": 1e5,
            "sparse_received_per_step": 2e5,
            "dense_sent_per_step": 3e6,
            "dense_received_per_step": 3e6,
        }
        results = {f"rank:{r}": dict(worker, step_s=0.5 + r / 10) for r in range(1, self.np)}
        results["rank:0"] = {"role": "ps", "sent_per_step": 4e5, "received_per_step": 6e5}
        return results


def test_a_runs_row_from_the_ranks_results_and_the_link_counters(monkeypatch):
    monkeypatch.setattr(training_runs, "MPIJob", _FakeJob)
    run = hybrid.run_hybrid("hybrid", 2, hosts="emulated:100mbit", steps=3, warmup=1)
    row = run.row
    job = _FakeJob.made[-1]
    assert job.np == 3  # a PS and two workers
    assert job.args["mode"] == "hybrid" and job.args["steps"] == 3
    assert job.kwargs["launcher"] == "mpirun" and job.kwargs["launcher_args"] == training_runs.RING
    assert row["step_s"] == pytest.approx(0.7)  # the slowest worker
    assert row["examples_per_s"] == 1024.0
    assert row["sparse_mb"] == pytest.approx(0.3) and row["dense_mb"] == pytest.approx(6.0)
    assert row["ps_task_mb"] == pytest.approx(1.0)
    # Host 0 (the PS): 10 + 10 MB over 4 steps; hosts 1 and 2: 30 and 40 MB, over 4 steps.
    assert row["ps_mb_per_step"] == pytest.approx(5.0)
    assert row["worker_mb_per_step"] == pytest.approx(8.75)
    assert row["emulated"] is True and row["network"] == "100mbit links"
    # what every run answers: the row's figures, and every link's bytes sent (10 + 20 + 30 MB over 4 steps)
    assert (run.size, run.method, run.step_time, run.examples_per_sec) == (2, "hybrid", row["step_s"], 1024.0)
    assert run.bytes_per_step() == pytest.approx(15e6) and math.isnan(run.accuracy)


def test_an_incomplete_run_is_an_error(monkeypatch):
    class Lost(_FakeJob):
        def wait(self):
            return {k: v for k, v in super().wait().items() if k != "rank:2"}

    monkeypatch.setattr(training_runs, "MPIJob", Lost)
    with pytest.raises(RuntimeError, match="hybrid with 2 workers: not every rank reported"):
        hybrid.run_hybrid("hybrid", 2, hosts="local")


def test_each_mode_is_checked_with_its_own_measured_rank_memory(monkeypatch):
    monkeypatch.setattr(training_runs, "MPIJob", _FakeJob)
    for mode in hybrid.MODES:
        if mode == "allreduce":  # the fake job's results hold a PS: the run refuses them, after launching
            with pytest.raises(RuntimeError, match="not every rank reported"):
                hybrid.run_hybrid(mode, 2, hosts="emulated:100mbit")
        else:
            hybrid.run_hybrid(mode, 2, hosts="emulated:100mbit")
        assert _FakeJob.made[-1].kwargs["memory_per_rank"] == hybrid.RANK_MEMORY_BYTES[mode]
    assert hybrid.RANK_MEMORY_BYTES["allreduce"] > hybrid.RANK_MEMORY_BYTES["hybrid"] >= hybrid.RANK_MEMORY_BYTES["ps"]


def test_fit_workers_keeps_the_sizes_whose_every_mode_fits(capsys):
    mb = hybrid.MB
    # allreduce: 480 MB a rank; hybrid and ps: 320 MB a rank, a PS rank too
    assert hybrid.fit_sweep([2, 4], available=2000 * mb) == [2, 4]  # 4 x 480 = 1,920; 5 x 320 = 1,600
    assert capsys.readouterr().out == ""
    assert hybrid.fit_sweep([2, 3, 4], available=1700 * mb) == [2, 3]  # Binder: 4 allreduce ranks do not fit
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "4 workers do not fit here (allreduce with 4 workers (4 ranks)" in out
    assert "1,920 MB, 1,700 MB available): the runs use 2, 3; the PS's traffic still grows" in out
    assert hybrid.fit_sweep([2, 4], available=1700 * mb) == [2, 3]  # the largest that fits, in place of 4
    assert "the runs use 2, 3;" in capsys.readouterr().out
    assert hybrid.fit_sweep([4, 2], modes=("ps", "hybrid"), available=1000 * mb) == [2]  # 3 x 320 = 960
    assert "(ps with 4 workers (5 ranks) needs about 1,600 MB" in capsys.readouterr().out
    assert hybrid.fit_sweep([2, 3], available=1000 * mb) == [2]
    assert "the runs use 2; one size shows the three modes side by side, not how they grow" in capsys.readouterr().out
    assert hybrid.fit_sweep([3], available=1000 * mb) == [2]  # 3 do not fit: 2 do, in their place


def test_fit_workers_refuses_when_nothing_fits_or_the_sizes_are_bad():
    from lab_utils.cluster import ResourceError

    with pytest.raises(
        ResourceError,
        match=r"no size of this experiment fits: ps with 2 workers \(3 ranks\) needs about 960 MB, 900 MB",
    ):
        hybrid.fit_sweep([2, 4], available=900 * hybrid.MB)
    for bad in ([], [0], [True], ["2"]):
        with pytest.raises(ValueError, match="workers must be a non-empty list of integers >= 1"):
            hybrid.fit_sweep(bad, available=10**12)


@pytest.mark.parametrize("emulated", [True, False])
def test_plot_shows_throughput_and_bytes_per_host(emulated):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    rows = []
    for mode in hybrid.MODES:
        for w in (2, 4):
            ps = None if mode == "allreduce" else 1.0 * w
            rows.append(
                dict(
                    mode=mode,
                    workers=w,
                    examples_per_s=100.0 * w,
                    sparse_mb=0.1,
                    dense_mb=9.0,
                    ps_task_mb=ps,
                    ps_mb_per_step=ps if emulated else None,
                    worker_mb_per_step=9.1 if emulated else None,
                )
            )
    fig = hybrid.plot(pd.DataFrame(rows))
    throughput, traffic = fig.axes
    assert len(throughput.lines) == 3  # one line per mode
    assert len(traffic.lines) == 5  # a worker's per mode, the PS's for ps and hybrid
    assert ("link counters" in traffic.get_title()) is emulated
