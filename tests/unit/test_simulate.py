"""The scaling model (lab_utils.simulate): closed forms, limits, calibration, validation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from lab_utils import simulate as sim

A, B, M, C = 1e-3, 8e-8, 3e6, 0.5  # 1 ms per message, 100 Mbit/s, 3 MB of gradients, 0.5 s of compute
P = sim.Params(alpha=A, beta=B, grad_bytes=M, compute_s=C)


@pytest.mark.parametrize(
    ("model", "n", "expected"),
    [
        ("ps", 1, C + 2 * (A + M * B)),
        ("ps", 4, C + 2 * (A + 4 * M * B)),
        ("ring", 1, C),
        ("ring", 4, C + 6 * (A + M / 4 * B)),
        ("ring", 5, C + 8 * (A + M / 5 * B)),
        ("tree", 1, C),
        ("tree", 2, C + 2 * (A + M * B)),
        ("tree", 5, C + 6 * (A + M * B)),  # ceil(log2 5) = 3 rounds, each way
        ("tree", 8, C + 6 * (A + M * B)),
    ],
)
def test_closed_forms(model, n, expected):
    assert sim.step_time(model, n, P) == pytest.approx(expected, rel=1e-12)


def test_keywords_instead_of_params():
    assert sim.ring_allreduce_step(4, alpha=A, beta=B, grad_bytes=M, compute_s=C) == sim.ring_allreduce_step(4, P)
    assert sim.ps_step(3, P, beta=2 * B) == pytest.approx(C + 2 * (A + 3 * M * 2 * B))


def test_sharded_ps():
    assert sim.sharded_ps_step(8, P, shards=1) == sim.ps_step(8, P)
    assert sim.sharded_ps_step(8, P, shards=4) == pytest.approx(C + 2 * (A + 2 * M * B))
    # beyond one shard per worker, each worker's own link (M each way) is the bottleneck
    assert sim.sharded_ps_step(8, P, shards=16) == pytest.approx(C + 2 * (A + M * B))
    times = [sim.sharded_ps_step(16, P, shards=k) for k in (1, 2, 4, 8, 16)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_gamma_and_duplex_terms():
    g, d = 1e-9, 4e-8
    p = dataclasses.replace(P, gamma=g, beta_duplex=d)
    assert sim.ps_step(4, p) == pytest.approx(C + 2 * (A + 4 * M * B) + 4 * M * g)
    assert sim.ring_allreduce_step(4, p) == pytest.approx(C + 6 * (A + M / 4 * (B + d)) + 3 * M / 4 * g)
    # the PS moves one direction at a time: duplex does not touch it
    assert sim.ps_step(4, dataclasses.replace(P, beta_duplex=d)) == sim.ps_step(4, P)


def test_hybrid():
    assert sim.hybrid_step(4, P) == sim.ring_allreduce_step(4, P)  # no sparse rows: no PS
    s = 1e6
    ring_comm = sim.ring_allreduce_step(4, P) - C
    ps_comm = sim.sharded_ps_step(4, P, grad_bytes=s, shards=2) - C
    assert sim.hybrid_step(4, P, sparse_bytes=s, shards=2) == pytest.approx(C + ring_comm + ps_comm)
    assert sim.hybrid_step(4, P, dense_bytes=2e6) == sim.ring_allreduce_step(4, P, grad_bytes=2e6)


def test_ring_tends_to_twice_m_beta():
    p = dataclasses.replace(P, alpha=0.0)
    gaps = [sim.ring_allreduce_step(n, p) - C - 2 * M * B for n in (2, 8, 64, 1024, 10**6)]
    assert all(g < 0 for g in gaps)
    assert [abs(g) for g in gaps] == sorted((abs(g) for g in gaps), reverse=True)
    assert abs(gaps[-1]) <= 1.01e-6 * 2 * M * B  # 2 M beta / N
    # latency grows linearly: 2 (N - 1) alpha
    assert sim.ring_allreduce_step(1025, P) - sim.ring_allreduce_step(1025, P, alpha=0.0) == pytest.approx(2048 * A)


def test_ps_grows_linearly():
    steps = [sim.ps_step(n, P) for n in range(1, 40)]
    assert np.allclose(np.diff(steps), 2 * M * B)


@pytest.mark.parametrize("model", sorted(sim.MODELS))
def test_step_time_never_falls_with_workers(model):
    p = dataclasses.replace(P, sparse_bytes=1e5, shards=2)
    steps = [sim.step_time(model, n, p) for n in range(1, 300)]
    assert all(b >= a for a, b in zip(steps, steps[1:], strict=False))


def test_ring_beats_ps_at_scale_and_throughput_grows():
    table = sim.predict(("ps", "ring"), params=P)
    ps, ring = (table[table["model"] == m].set_index("workers") for m in ("ps", "ring"))
    assert (ring.loc[[8, 64, 1024], "throughput"] > ps.loc[[8, 64, 1024], "throughput"]).all()
    assert ring["throughput"].is_monotonic_increasing
    assert ps.loc[1024, "efficiency"] < 0.01 < ring.loc[1024, "efficiency"]


def test_predict_table():
    table = sim.predict("allreduce", [1, 2, 4], P, batch_size=32)
    assert list(table["model"]) == ["ring"] * 3
    first = table.iloc[0]
    assert first["speedup"] == first["efficiency"] == 1.0 and first["comm_s"] == 0.0
    assert first["throughput"] == pytest.approx(32 / C)
    four = table.iloc[2]
    assert four["comm_s"] == pytest.approx(6 * (A + M / 4 * B))
    assert four["throughput"] == pytest.approx(sim.throughput(four["step_s"], 4, 32))
    assert four["efficiency"] == pytest.approx(four["speedup"] / 4)
    assert sim.predict("ps", params=P)["workers"].max() == 1024


def test_shared_cores_slow_cpu_work_and_communication_not_compute():
    local = dataclasses.replace(P, cores=2, cpu_s=0.1)
    assert sim.ring_allreduce_step(2, local) == pytest.approx(sim.ring_allreduce_step(2, P) + 0.1)
    comm4 = sim.ring_allreduce_step(4, P) - C
    assert sim.ring_allreduce_step(4, local) == pytest.approx(C + 2 * (0.1 + comm4))  # 4 processes, 2 cores
    assert sim.ps_step(1, local) == pytest.approx(sim.ps_step(1, P) + 0.1)  # a worker and the PS: 2 processes
    assert sim.ps_step(3, local) == pytest.approx(C + 2 * (0.1 + sim.ps_step(3, P) - C))


def test_throughput_efficiency_and_beta_of():
    assert sim.throughput(0.5, 4, 64) == 512
    assert sim.efficiency(300.0, 4, 100.0) == 0.75
    assert sim.beta_of("100mbit") == pytest.approx(8e-8)
    assert sim.beta_of(1e9) == pytest.approx(8e-9)


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "4", None])
@pytest.mark.parametrize("model", sorted(sim.MODELS))
def test_bad_worker_counts(model, n):
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        sim.step_time(model, n, P)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        (dict(beta=-1e-8), "beta must be a finite number >= 0, got -1e-08"),
        (dict(alpha=math.nan), "alpha must be"),
        (dict(alpha=math.inf), "alpha must be"),
        (dict(compute_s=-0.1), "compute_s must be"),
        (dict(grad_bytes="3MB"), "grad_bytes must be"),
        (dict(shards=0), "shards must be an integer >= 1"),
        (dict(batch_size=2.5), "batch_size must be an integer >= 1"),
        (dict(cores=0), "cores must be None"),
    ],
)
def test_bad_params(fields, match):
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(P, **fields)
    with pytest.raises(ValueError, match=match):
        sim.ring_allreduce_step(2, P, **fields)


def test_other_bad_inputs():
    with pytest.raises(ValueError, match="model must be one of"):
        sim.step_time("butterfly", 2, P)
    with pytest.raises(TypeError, match="simulate.Params"):
        sim.ps_step(2, {"alpha": A})
    with pytest.raises(ValueError, match="step_s must be"):
        sim.throughput(0.0, 2, 64)
    with pytest.raises(ValueError, match="bandwidth must"):
        sim.beta_of(-5)
    with pytest.raises(ValueError, match="workers must be an integer"):
        sim.predict("ps", [1, 0], P)
    with pytest.raises(dataclasses.FrozenInstanceError):
        P.alpha = 0.0


def _synthetic(truth: sim.Params, noise: float = 0.0, seed: int = 0) -> list[dict]:
    """netexp-shaped rows generated by the model itself (step times times 1 + noise)."""
    rng = np.random.default_rng(seed)
    rows = []
    for mode, model in (("ps", "ps"), ("allreduce", "ring")):
        for n in (1, 2, 4, 8):
            for mb in (1.0, 3.0):
                step = sim.step_time(model, n, truth, grad_bytes=mb * 1e6) * (1 + noise * rng.standard_normal())
                rows.append(
                    {"mode": mode, "workers": n, "gradient_mb": mb, "step_s": step, "examples_per_s": n * 64 / step}
                )
    return rows


def test_calibrate_recovers_the_terms():
    truth = sim.Params(alpha=5e-3, beta=8e-8, grad_bytes=3e6, compute_s=1.0, beta_duplex=3e-8)
    got = sim.calibrate(_synthetic(truth))
    for k in sim.FIT:
        assert getattr(got, k) == pytest.approx(getattr(truth, k), rel=1e-6), k
    assert got.batch_size == 64 and got.grad_bytes == 1e6  # each size twice: the first most common
    noisy = sim.calibrate(_synthetic(truth, noise=0.01, seed=1))
    assert noisy.compute_s == pytest.approx(1.0, rel=0.03)
    assert noisy.beta == pytest.approx(8e-8, rel=0.1)
    assert noisy.alpha == pytest.approx(5e-3, rel=0.5)
    check = sim.compare(_synthetic(truth, noise=0.01, seed=1), noisy)
    assert check["rel_error"].abs().max() < 0.05 and not check["disagrees"].any()


def test_calibrate_keeps_terms_non_negative_and_fixed_ones():
    truth = sim.Params(alpha=0.0, beta=8e-8, grad_bytes=3e6, compute_s=1.0)
    got = sim.calibrate(_synthetic(truth, noise=0.02, seed=3), cores=2, gamma=1e-12)
    assert min(got.alpha, got.beta, got.beta_duplex, got.compute_s) >= 0.0
    assert got.cores == 2 and got.gamma == 1e-12
    fixed = sim.calibrate(
        _synthetic(truth), sim.Params(alpha=0.0, beta=1e-9, grad_bytes=3e6), fit=("compute_s", "beta")
    )
    assert fixed.alpha == 0.0 and fixed.beta == pytest.approx(8e-8, rel=1e-6)


def test_calibrate_refuses_what_rows_cannot_tell():
    ps_only = [r for r in _synthetic(P) if r["mode"] == "ps"]
    with pytest.raises(ValueError, match=r"cannot tell \['compute_s', 'alpha'\] apart"):
        sim.calibrate(ps_only, fit=("compute_s", "alpha", "beta"))
    assert sim.calibrate(ps_only, fit=("compute_s", "beta")).beta == pytest.approx(B)
    with pytest.raises(ValueError, match="fit must name"):
        sim.calibrate(_synthetic(P), fit=("latency",))
    with pytest.raises(ValueError, match="no measured rows"):
        sim.calibrate([])
    with pytest.raises(ValueError, match="missing"):
        sim.calibrate([{"mode": "ps", "workers": 2}])


def test_compare_flags_disagreements():
    rows = [{"mode": "ps", "workers": 2, "gradient_mb": 3.0, "step_s": 2 * sim.ps_step(2, P), "network": "x"}]
    table = sim.compare(rows, P)
    assert table.loc[0, "rel_error"] == pytest.approx(1.0)  # the model says twice the measured throughput
    assert bool(table.loc[0, "disagrees"]) and table.loc[0, "network"] == "x"
    assert not sim.compare(rows, P, tolerance=1.5).loc[0, "disagrees"]


def test_plot_marks_disagreements():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        {"mode": "ps", "workers": n, "gradient_mb": 3.0, "step_s": sim.ps_step(n, P) * f}
        for n, f in ((1, 1.0), (2, 1.05), (4, 1.6))
    ]
    check = sim.compare(rows, P)
    check["note"] = ["", "", "busy machine"]
    fig = sim.plot(sim.predict(("ps", "ring"), params=P), check)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert len(texts) == 1 and "model +60%" in texts[0] and "busy machine" in texts[0]
    assert fig.axes[0].get_xscale() == "log"
    plt.close(fig)
