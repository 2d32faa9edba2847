"""The network matters, for real: PS against ring all-reduce on emulated 100 Mbit/s links.

One run of 1 and 4 workers per mode (about 40 s). What is asserted is what the links
force, not how fast this machine is: a slower machine only adds the same delay to
both modes' steps."""

from __future__ import annotations

import pytest

from lab_utils.cluster import netem
from lab_utils.training import netexp

pytestmark = [
    pytest.mark.process,
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
