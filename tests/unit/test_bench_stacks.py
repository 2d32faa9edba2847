"""bench/bench_stacks.py's figures: the stacks take turns, and each figure is its stack's best
round's, so a slower spell of the machine does not read as one stack's regression."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench_stacks(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # it imports its neighbours, as a script does
    spec = importlib.util.spec_from_file_location("bench_stacks", ROOT / "bench" / "bench_stacks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_figure_is_its_best_round_and_the_ring_ratio_follows_the_kept_bandwidths(monkeypatch):
    bench = _bench_stacks(monkeypatch)
    slow = {"ring_busbw_64MB_GBps": 1.0, "mpi_busbw_64MB_GBps": 2.0, "ring_over_mpi_64MB": 0.5,
            "cluster_start_to_all_ready_s": 9.0, "cluster_start_ratio_to_bound": 1.2, "gloo_step_s": 0.3}  # fmt: skip
    fast = {"ring_busbw_64MB_GBps": 1.5, "mpi_busbw_64MB_GBps": 1.8, "ring_over_mpi_64MB": 0.833,
            "cluster_start_to_all_ready_s": 7.0, "cluster_start_ratio_to_bound": 1.4, "gloo_step_s": 0.2}  # fmt: skip
    best = bench.best_of([slow, fast])
    assert best["ring_busbw_64MB_GBps"] == 1.5 and best["mpi_busbw_64MB_GBps"] == 2.0
    assert best["ring_over_mpi_64MB"] == 0.75  # 1.5 / 2.0: neither round's own ratio
    assert best["cluster_start_to_all_ready_s"] == 7.0 and best["gloo_step_s"] == 0.2
    assert best["cluster_start_ratio_to_bound"] == 1.2
    assert bench.best_of([slow]) == slow


def test_a_figure_within_its_tolerance_is_not_moved_and_one_beyond_it_is(monkeypatch):
    bench = _bench_stacks(monkeypatch)
    out = bench.compare_numbers(
        {"gloo_step_s": 0.20, "test_accuracy": 0.90}, {"gloo_step_s": 0.23, "test_accuracy": 0.92}
    )
    assert out["moved"] == ["test_accuracy"] and abs(out["numbers"]["gloo_step_s"]["relative"] - 0.15) < 1e-9
