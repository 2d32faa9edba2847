"""The network matters, for real: PS against ring all-reduce on emulated 100 Mbit/s links.

One run of 1 and 4 workers per mode (about 25 s), and two of the thesis's models (about
15 s). What is asserted is what the links force, not how fast this machine is: a slower
machine only adds the same delay to both modes' steps."""

from __future__ import annotations

import pytest
from support import timelines

from lab_utils import report, timeline
from lab_utils.cluster import netem
from lab_utils.training import netexp

pytestmark = [
    pytest.mark.skipif(
        netem.unavailable_reason() is not None, reason=f"no emulated hosts here: {netem.unavailable_reason()}"
    ),
]


def test_ps_levels_off_where_ring_allreduce_scales_and_ps_traffic_grows():
    named = netem.how() == "netns"  # else another user's named namespaces come and go beside ours
    before = set(netem.namespaces()) if named else set()
    table = netexp.experiment(workers=(1, 4), hosts="emulated:bandwidth=100mbit", mb=3, steps=2, compute_s=1.0)
    assert (set(netem.namespaces()) if named else set()) == before
    row = {(r.mode, r.workers): r for r in table.itertuples()}
    assert all(table["emulated"])
    ps = row[("ps", 4)].speedup
    # PS: 4 workers' 3 MB each way share the PS's link: 1 s + 4 x 0.48 s a step (about 2x).
    # A link-bandwidth bound: a busy or slower CPU only lowers it further.
    assert ps < 0.75 * 4, f"PS speedup {ps:.2f} with 4 workers"
    # Ring against PS in speed (ring 2.6-2.7x, PS 2.2-2.3x here) is CPU-bound as much as
    # link-bound: under 0.8 cores the ring's 6 TCP phases fell to the PS's figure (2.30 vs
    # 2.35). bench/bench_network.py measures it (ring_over_ps); what the mechanism guarantees
    # is asserted here: the PS's link carries what every worker sends, a ring rank's only its
    # share, so the busiest ring link carries well under half of the PS's (9 MB vs 24 a step).
    assert row[("allreduce", 4)].worker_mb_per_step < 0.5 * row[("ps", 4)].ps_mb_per_step
    # And the ring does scale: with compute a 1 s sleep, 4 ranks get well past one's work
    # (2.3x under 0.8 cores), whatever the CPU.
    assert row[("allreduce", 4)].speedup > 1.3, row[("allreduce", 4)]
    # The PS's traffic grows with the workers; a worker's does not.
    assert row[("ps", 4)].ps_mb_per_step == pytest.approx(4 * row[("ps", 1)].ps_mb_per_step, rel=0.05)
    assert row[("ps", 4)].ps_mb_per_step == pytest.approx(4 * 2 * 3.0, rel=0.05)
    assert row[("ps", 4)].worker_mb_per_step == pytest.approx(2 * 3.0, rel=0.05)
    assert row[("allreduce", 4)].worker_mb_per_step == pytest.approx(2 * 2 * 3 / 4 * 3.0, rel=0.05)
    assert row[("allreduce", 1)].worker_mb_per_step < 0.01  # one rank: nothing to exchange
    # each run's timeline: a track per rank (the PS's too), a worker's steps and their parts tile
    # what it timed itself (its steps' seconds, from the end of the barrier, plus the barrier)
    for mode, tl in netexp.timelines(table).items():
        events = [e for e in report.read_events(tl.path.parent / "ranks" / "rank-1.jsonl") if e["kind"] == "step"]
        # the barrier only: a PS's pull and a ring's all-reduce have waits of their own ("pull: waiting")
        barrier = sum(p.seconds for p in tl.parts if p.task == "rank:1" and p.name == "barrier")
        ranks = [f"rank:{r}" for r in range(4 + (mode == "ps"))]
        sec = timelines.check(tl, {"rank:1": sum(e["seconds"] for e in events) + barrier}, tasks=ranks)
        assert sec["rank:1"]["comm"] > 0.2 * sec["rank:1"]["step"], (mode, sec["rank:1"])  # 100 Mbit/s links
        names = {p.name.removesuffix(": waiting") for p in tl.parts if p.task == "rank:1"}
        assert names == (
            {"forward/backward", "push", "pull"} if mode == "ps" else {"barrier", "forward/backward", "allreduce"}
        )


def test_the_model_decides_alexnet_is_communication_bound_where_resnet50_is_not():
    """Lab 4's model sizes, at CI's scale (a quarter of each real step): what the links force
    is asserted, with wide margins (measured 3.1 against 1.7, and 1.4 against 2.6)."""
    table = netexp.models(["AlexNet", "ResNet50"], workers=(1, 4), hosts="emulated:100mbit", scale=0.25, steps=2)
    assert "reference" not in table.attrs
    alex, resnet = table.loc["AlexNet"], table.loc["ResNet50"]
    # head to head, the ring wins by more where a model sends more per computation
    assert alex["ring / PS examples/s"] > 1.3 * resnet["ring / PS examples/s"] > 1.3
    # and the PS scales the model that computes more per byte, not the one that sends more
    assert resnet["PS speedup"] > 1.3 * alex["PS speedup"]
    for name, row in table.iterrows():  # each model's own bytes on the links: a hundredth of them, times 0.25
        mb = netexp.model_step(name, "100mbit", 0.25)["mb"]
        assert row["PS host MB/step"] == pytest.approx(4 * 2 * mb, rel=0.05)
        assert row["ring rank MB/step"] == pytest.approx(2 * 2 * 3 / 4 * mb, rel=0.05)


@pytest.mark.parametrize("mode, waiter", [("ps", "rank:2"), ("allreduce", "rank:0")])
def test_a_worker_waits_for_the_stragglers_delay(monkeypatch, mode, waiter):
    """Why a step was slow (issue 55), over loopback: rank 1 sleeps 0.2 s a step. A ring rank
    waits at the barrier; a PS worker's pull waits until the PS has every worker's gradient,
    the last of them from the straggler, whose delay is the cause of both, and on the path."""
    monkeypatch.setenv("LABS_STRAGGLER", "rank:1=0.2")
    run = netexp.run_netexp(mode, 2, hosts="local", mb=1.0, steps=3, warmup=1, compute_s=0.05, progress=False)
    tl = timeline.load(run.trace)
    assert tl.problems() == []
    seconds = timelines.check_cause(tl, waiter, "rank:1")
    path = tl.critical_path()
    assert path[(path["task"] == "rank:1") & (path["cat"] == "delay")]["seconds"].sum() == pytest.approx(
        seconds, rel=0.1
    )
