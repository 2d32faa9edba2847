"""Lab 7's pieces without processes: shards, Adam on a shard, bytes kept, the pipeline's stage
arithmetic and cut, and the tables read from runs (made up here, as a run would report them)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lab_utils.training.modelpar import choice_runs as choice
from lab_utils.training.modelpar import pipeline, runs, zero
from lab_utils.training.modelpar.shards import adam_update, array_bytes, shard_bounds, shard_counts


@pytest.mark.parametrize("n, size", [(0, 1), (0, 3), (1, 3), (7, 2), (1001, 4), (12, 12), (5, 8)])
def test_shards_cover_the_vector_in_order_the_first_ones_longer(n, size):
    bounds = shard_bounds(n, size)
    assert len(bounds) == size and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))  # contiguous, in rank order
    counts = shard_counts(n, size)
    assert counts == [hi - lo for lo, hi in bounds] and max(counts) - min(counts) <= 1
    assert counts == sorted(counts, reverse=True)


@pytest.mark.parametrize("n, size, message", [(-1, 2, "n must be"), (3, 0, "size must be"), (True, 2, "n must be")])
def test_shards_refuse_bad_input(n, size, message):
    with pytest.raises(ValueError, match=message):
        shard_bounds(n, size)


def test_adam_on_shards_gives_the_bits_of_adam_on_the_whole_vector():
    rng = np.random.default_rng(1)
    whole = rng.standard_normal(1001).astype(np.float32)
    parts = [whole[lo:hi].copy() for lo, hi in shard_bounds(whole.size, 3)]
    m, v = np.zeros_like(whole), np.zeros_like(whole)
    state = [(np.zeros(p.size, np.float32), np.zeros(p.size, np.float32)) for p in parts]
    for t in range(1, 6):
        g = rng.standard_normal(whole.size).astype(np.float32)
        adam_update(whole, g, m, v, t)
        for p, (pm, pv), (lo, hi) in zip(parts, state, shard_bounds(whole.size, 3), strict=True):
            adam_update(p, g[lo:hi], pm, pv, t)
    assert np.array_equal(np.concatenate(parts), whole)  # element by element: the same bits
    with pytest.raises(ValueError, match="counts steps from 1"):
        adam_update(whole, g, m, v, 0)
    with pytest.raises(ValueError, match="one shape"):
        adam_update(whole, g[:5], m, v, 1)


def test_array_bytes_counts_what_a_view_keeps_alive_once():
    big = np.zeros(1000, np.float32)
    assert array_bytes(big) == 4000
    assert array_bytes({"m": big[:10]}) == 4000  # a shard that is a view keeps the whole vector
    assert array_bytes({"m": big[:10].copy(), "v": np.zeros(10, np.float32)}) == 80
    assert array_bytes({"a": big, "b": [big, (big[5:],)], "x": 3, "s": "text"}) == 4000
    assert array_bytes([]) == 0


def test_a_pipeline_cut_is_contiguous_and_refuses_more_stages_than_layers():
    assert [list(r) for r in pipeline.stage_layers(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [list(r) for r in pipeline.stage_layers(4, 4)] == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="cannot be cut into 5 stages"):
        pipeline.stage_layers(4, 5)
    assert pipeline.layer_sizes(32, 2) == [(784, 32), (32, 32), (32, 10)]


class OneRank:
    def Get_rank(self):  # noqa: N802 (mpi4py's name)
        return 0

    def Get_size(self):  # noqa: N802
        return 1


def _loss(stage_weights, x, y):
    s = pipeline.Stage(OneRank(), stage_weights, last=True, micro_batches=1, compute_s=0.0)
    s.forward(0, x)
    return s.loss_grad(0, y)[0]


def test_a_stage_computes_the_gradient_of_its_loss():
    """Its backward against finite differences of its loss (float64 weights through float32)."""
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((6, 5)) * 0.5, np.full(5, 0.1)), (rng.standard_normal((5, 3)) * 0.5, np.zeros(3))]
    x, y = rng.standard_normal((4, 6)).astype(np.float32), np.array([0, 2, 1, 2])
    stage = pipeline.Stage(OneRank(), weights, last=True, micro_batches=1, compute_s=0.0)
    stage.forward(0, x)
    dx = stage.backward(0, stage.loss_grad(0, y)[1])
    assert dx.shape == x.shape
    for layer, which in ((0, 0), (1, 0), (0, 1)):
        k = 2 * layer + which
        idx = (1, 2) if which == 0 else (3,)
        eps = 1e-2
        plus = [[np.array(a, np.float64) for a in pair] for pair in weights]
        minus = [[np.array(a, np.float64) for a in pair] for pair in weights]
        plus[layer][which][idx] += eps
        minus[layer][which][idx] -= eps
        numeric = (_loss(plus, x, y) - _loss(minus, x, y)) / (2 * eps)
        assert stage.grads[k][idx] == pytest.approx(numeric, rel=2e-2, abs=1e-4)
    with pytest.raises(RuntimeError, match="before forward"):
        stage.backward(0, np.zeros((4, 3)))
    with pytest.raises(RuntimeError, match="went forward, never backward"):
        stage.forward(1, x)
        stage.apply_sgd(0.1)


def test_only_the_last_stage_has_a_loss():
    stage = pipeline.Stage(OneRank(), [(np.ones((2, 2)), np.zeros(2))], last=False, micro_batches=2, compute_s=0.0)
    with pytest.raises(RuntimeError, match="not the last"):
        stage.loss_grad(0, np.array([0]))


def test_the_argument_checks_name_what_is_wrong(capsys):
    with pytest.raises(SystemExit):
        zero.main(["--stage", "1", "--steps", "3"])
    assert "give --zero zero.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        pipeline.main(["--reference", "--micro-batches", "3", "--batch-size", "64"])
    assert "must divide --batch-size 64" in capsys.readouterr().err
    with pytest.raises(ValueError, match="stage must be 0, 1 or 2"):
        runs.run_zero(None, stage=3)
    with pytest.raises(ValueError, match="stage 1 runs your zero_step"):
        runs.run_zero(None, stage=1)
    with pytest.raises(ValueError, match="must divide batch_size"):
        runs.run_pipeline("pipeline.py", micro_batches=5, batch_size=64)
    with pytest.raises(ValueError, match="one process"):
        runs.run_pipeline(None, stages=2)
    with pytest.raises(FileNotFoundError, match="%%writefile nowhere.py"):
        runs.check_collectives("nowhere.py")


# ----------------------------------------------------------------------------- tables of runs


def _zero_run(tmp_path, stage, params, state, ranks=2):
    path = tmp_path / f"zero{stage}.npz"
    np.savez(path, params=params)
    result = {"params": params.size, "state_bytes": state, "transient_bytes": [100, 200], "accuracy": 0.9,
              "rss_peak_bytes": [500 * 2**20, 510 * 2**20], "rss_steps_bytes": [300 * 2**20, 290 * 2**20],
              "bytes_sent": [0, 0]}  # fmt: skip
    return runs.ZeroRun(label=f"stage {stage}", stage=stage, ranks=ranks, result=result, weights_path=str(path))


def test_the_zero_tables_read_the_weights_and_the_bytes(tmp_path):
    w = np.linspace(-2, 2, 12).astype(np.float32)
    ref = _zero_run(tmp_path, 0, w, [144, 144])
    near = _zero_run(tmp_path, 1, w + np.float32(1e-6), [96, 96])
    off = _zero_run(tmp_path, 2, w * 2, [72, 70])
    table = runs.weights_table([near, off], ref)
    assert table.loc["stage 1", "max |difference|"] == pytest.approx(1e-6, rel=0.1)
    assert table.loc["stage 2", "relative to the largest weight"] == pytest.approx(1.0)
    mem = runs.memory_table([ref, near, off])
    assert list(mem["bytes per parameter"]) == [12.0, 8.0, 6.0]  # the most of any rank
    assert mem.loc["stage 0", "peak resident (MB)"] == 510
    assert mem.loc["stage 0", "resident between steps (MB)"] == 300
    assert "ZeRO stage 2" in repr(off) and "0.00 MB per rank" in repr(off)
    other = _zero_run(tmp_path, 3, np.zeros(5, np.float32), [1, 1])
    with pytest.raises(ValueError, match="not the same model"):
        runs.weights_table([other], ref)


def _step(task, step, spans):
    return {"task": task, "step": step, "time": 0.0, "spans": [[n, c, a, b, *on] for n, c, a, b, *on in spans]}


def test_the_bubble_is_the_waiting_share_after_the_first_step(tmp_path):
    events = pd.DataFrame(
        [
            _step("rank:0", 1, [("forward 0", "compute", 0, 10), ("wait for grad 0", "wait", 10, 90)]),  # warm-up
            _step(
                "rank:0",
                2,
                [
                    ("forward 0", "compute", 0, 3),
                    ("wait for grad 0", "wait", 3, 4, ["rank:1"]),  # what it waited on, as the stage says
                    ("send activations 0", "comm", 4, 4.5),
                    ("backward 0", "compute", 4.5, 7.5),
                ],
            ),
            _step("rank:1", 2, [("wait for activations 0", "wait", 0, 3), ("forward 0", "compute", 3, 6)]),
        ]  # fmt: skip
    )
    np.savez(tmp_path / "stage0.npz", np.ones((2, 2)), np.zeros(2))
    np.savez(tmp_path / "stage1.npz", np.ones((2, 1)), np.zeros(1))
    run = runs.PipelineRun(label="p=2, m=1", events=events, stages=2, micro_batches=1, results={},
                           weights_dir=str(tmp_path))  # fmt: skip
    b = run.bubble()
    assert b.loc["rank:0", "compute"] == 6 and b.loc["rank:0", "wait"] == 1 and b.loc["rank:0", "comm"] == 0.5
    assert b.loc["rank:0", "bubble"] == pytest.approx(1 / 7) and b.loc["rank:1", "bubble"] == pytest.approx(0.5)
    assert [w.shape for w in run.weights()] == [(2, 2), (2,), (2, 1), (1,)]
    table = runs.bubble_table([run], reference=run)
    assert table.loc["p=2, m=1", "bubble (mean of stages)"] == pytest.approx((1 / 7 + 0.5) / 2)
    assert table.loc["p=2, m=1", "weights vs reference (max rel)"] == 0


# ------------------------------------------------------------------ Part E
def _toy_costs(strategy, s):
    """Not the lab's model (that is the student's): made-up prices that order the strategies."""
    held = {"data": 16, "zero1": 12, "zero2": 8, "tensor": 4, "pipeline": 4}[strategy] * s.params
    seconds = {"data": 1.0, "zero1": 1.0, "zero2": 1.0, "tensor": 3.0, "pipeline": 2.0}[strategy]
    return held, seconds


def test_the_choice_is_the_fastest_that_fits_and_the_simplest_on_a_tie():
    s = choice.Setting(params=100, ranks=4, memory_bytes=1600)
    assert choice.choose(_toy_costs, s) == "data"  # data, zero1 and zero2 tie: the simplest
    assert choice.choose(_toy_costs, choice.Setting(params=100, ranks=4, memory_bytes=900)) == "zero2"
    assert choice.choose(_toy_costs, choice.Setting(params=100, ranks=4, memory_bytes=400)) == "pipeline"
    assert choice.choose(_toy_costs, choice.Setting(params=100, ranks=4, memory_bytes=399)) is None
    t = choice.table(_toy_costs, choice.Setting(params=100, ranks=4, memory_bytes=900))
    assert list(t.index) == list(choice.STRATEGIES) and list(t["fits"]) == [False, False, True, True, True]
    assert t.loc["data", "bytes per rank"] == 1600 and t.loc["tensor", "step (s)"] == 3.0


@pytest.mark.parametrize(
    "returned, message",
    [
        (5.0, "must return"),
        ((1, "x"), "must return"),
        ((1, 2, 3), "must return"),
        ((-1, 2), "finite and >= 0"),
        ((1, float("nan")), "finite and >= 0"),
    ],  # fmt: skip
)
def test_a_costs_function_that_returns_the_wrong_thing_is_named(returned, message):
    with pytest.raises(ValueError, match=message):
        choice.table(lambda strategy, s: returned, choice.Setting(params=1, ranks=1))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"params": 0}, "must be >= 1"),
        ({"ranks": 2.0}, "ranks must be an integer"),
        ({"beta": -1}, "beta must be"),
        ({"memory_bytes": float("nan")}, "memory_bytes must be"),
        ({"micro_batches": True}, "must be an integer"),
    ],  # fmt: skip
)
def test_a_setting_refuses_what_no_cluster_has(kwargs, message):
    with pytest.raises(ValueError, match=message):
        choice.Setting(**{"params": 10, "ranks": 2, **kwargs})


def _timed_step(task, step, started, took, compute):
    return {"task": task, "step": step, "started": started, "time": started + took,
            "spans": [["gradient", "compute", started, started + compute], ["optimizer", "comm", started + compute,
                                                                             started + took]]}  # fmt: skip


def test_a_runs_setting_and_step_time_are_read_from_its_steps_after_the_first(tmp_path):
    events = pd.DataFrame(
        [_timed_step("rank:0", 1, 0.0, 9.0, 5.0)]  # the warm-up: not counted
        + [_timed_step("rank:0", t, 10.0 * t, 0.5, 0.1) for t in range(2, 6)]
        + [_timed_step("rank:1", t, 10.0 * t, 0.6, 0.2) for t in range(2, 6)]
    )
    run = _zero_run(tmp_path, 2, np.zeros(1000, np.float32), [6000, 6000])
    run.events = events
    assert choice.step_seconds(run) == pytest.approx(0.6) and choice.compute_seconds(run) == pytest.approx(0.2)
    s = choice.zero_setting(run, 100e6, memory_bytes=2**20)
    assert (s.params, s.ranks, s.compute_s, s.beta, s.memory_bytes) == (1000, 2, pytest.approx(0.4), 8e-8, 2**20)
    table = choice.against_runs(_toy_costs, [("zero2", s, run)])
    assert table.loc["stage 2", "measured / predicted"] == pytest.approx(0.6)
    run.events = pd.DataFrame([{"task": "rank:0", "step": 1, "time": 1.0}])
    with pytest.raises(ValueError, match="no timed steps"):
        choice.step_seconds(run)


def test_a_link_is_fitted_to_its_ring_steps_and_prices_a_setting(tmp_path):
    alpha, beta = 2e-4, 8 / 90e6  # 200 us, 90 Mbit/s
    rows = [(m, alpha + m * beta) for m in (2**14, 2**18, 2**20, 2**22)]
    link = choice.fit_link(rows, where="2 ranks, test")
    assert link.alpha == pytest.approx(alpha, rel=1e-6) and link.beta == pytest.approx(beta, rel=1e-6)
    assert link.bandwidth_bps == pytest.approx(90e6) and "90 Mbit/s" in link.describe()
    assert list(link.table()["alpha + m beta (s)"]) == pytest.approx([t for _, t in rows])
    # a latency the fit puts below 0 (noise on tiny steps): the line through the origin
    assert choice.fit_link([(1000, 1e-5), (2000, 2.2e-5)]).alpha == 0.0
    for bad in ([(1000, 1e-3)], [(1000, 1e-3), (1000, 2e-3)], [(1000, 0.0), (2000, 1e-3)]):
        with pytest.raises(ValueError, match="two sizes"):
            choice.fit_link(bad)
    run = _zero_run(tmp_path, 2, np.zeros(1000, np.float32), [6000, 6000])
    run.events = pd.DataFrame([_timed_step("rank:0", t, 10.0 * t, 0.5, 0.1) for t in range(1, 4)])
    s = choice.zero_setting(run, link)
    assert (s.alpha, s.beta) == (link.alpha, link.beta)
    for bad in (0, -1e6, "100mbit", True):
        with pytest.raises(ValueError, match="link must be"):
            choice.zero_setting(run, bad)


def test_the_one_way_probe_needs_two_ranks():
    with pytest.raises(ValueError, match="one_way needs np >= 2"):
        runs.probe_link(np=1, one_way=True)
