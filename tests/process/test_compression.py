"""Lab 6 on real processes: every compression method trains on 2 Horovod ranks that end
with the same weights, sending the bytes their method says; and on emulated 100 Mbit/s
links, compressed gradients make a step shorter than float32 ones (the link forces it).

1-bit and top-k run with the instructor's ``compressors.py``, extracted from the
instructor notebook (the one copy of the solution) as the student's file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import timelines

from lab_utils.cluster import netem
from lab_utils.grading import reference_script
from lab_utils.training import compression
from lab_utils.training.compression import runs as compression_runs

pytestmark = pytest.mark.horovod

REFERENCE = reference_script("06_communication", "compressors.py")
MLP = [784 * 1024, 1024, 1024 * 10, 10]  # the task's default MLP, its tensors' sizes


def test_every_method_trains_and_both_ranks_end_with_the_same_weights(monkeypatch):
    monkeypatch.setenv("LABS_STRAGGLER", "rank:1=0.05")  # what rank 0 waits for is known (issue 55)
    runs = {
        m: compression_runs.run_compression(
            m, 2, steps=8, student=REFERENCE, args={"eval_every": 4}, save_weights=True, progress=False
        )
        for m in compression.METHODS
    }
    for m, r in runs.items():
        first, second = r.rank_weights(0), r.rank_weights(1)
        assert all(np.array_equal(a, b) for a, b in zip(first, second, strict=True)), m
        assert r.accuracy > 0.3, (m, r.accuracy)  # 8 steps from 0.1: it learns
        assert r.curve()["step"].tolist() == [4, 8], m
        assert not r.emulated and r.link_bytes_per_step is None
    sent = {m: r.wire_bytes_per_step for m, r in runs.items()}
    k = sum(compression.topk_count(n, 0.01) for n in MLP)
    assert sent == {m: compression.wire_bytes(m, MLP, k if m == "topk" else None) for m in compression.METHODS}
    assert sent["none"] > sent["fp16"] > max(sent["onebit"], sent["topk"])
    for m in ("onebit", "topk"):
        norms = runs[m].events["error_norm"]
        assert norms.notna().all() and norms.max() < 100, m  # error feedback: bounded
    # each run's timeline adds up to the training time each rank measured; a codec's step shows
    # its encoding, the all-gather of what it sends, and its decoding
    for m, r in runs.items():
        sec = timelines.check(r.timeline(), {t: res["train_time"] for t, res in r.results.items()})
        if m in ("onebit", "topk"):
            assert all(sec[t]["comm"] > 0 and sec[t]["compute"] > 0 for t in r.results), (m, sec)
            assert {p.name for p in r.timeline().parts} >= {"encode", "allgather", "decode"}, m
            # the all-gather waits for the last rank to send: rank 0 for the straggler's delay
            timelines.check_cause(r.timeline(), "rank:0", "rank:1")


@pytest.mark.skipif(
    netem.unavailable_reason() is not None, reason=f"no emulated hosts here: {netem.unavailable_reason()}"
)
def test_on_100mbit_links_compressed_steps_are_shorter_and_the_links_carry_what_is_counted():
    none, topk = (
        compression_runs.run_compression(
            m, 2, hosts="emulated:bandwidth=100mbit", steps=5, student=REFERENCE, progress=False
        )
        for m in ("none", "topk")
    )
    # Each run's own namespaces are gone (others' emulated tests may run beside this one).
    made = [json.loads((Path(r.run_dir) / "state.json").read_text())["network"] for r in (none, topk)]
    assert all(len(m["hosts"]) == 2 for m in made)
    assert not {name for m in made for name in (m["hub"], *m["hosts"])} & set(netem.namespaces())
    assert none.emulated and topk.emulated
    # float32: 3.3 MB a rank and step cannot cross a 100 Mbit/s link in less than 0.26 s.
    assert none.step_time >= 0.9 * none.wire_bytes_per_step * 8 / 100e6, none
    # Top-k saves what its bytes cost on the link; the CPU's share of a step is not the link's
    # to save. Measured: 25 ms against 440 ms on 2 cores; under a 0.8-core quota, where both
    # steps compute 2.5x longer, 262 ms against 553 ms. So the saving is checked against the link
    # time removed (at least half of it), not as a ratio of step times.
    saved_on_link = (none.wire_bytes_per_step - topk.wire_bytes_per_step) * 8 / 100e6
    assert none.step_time - topk.step_time >= 0.5 * saved_on_link, (topk, none, saved_on_link)
    # Each rank counts its link over the timed steps: the payload plus TCP/IP headers and
    # Horovod's own messages (these grow with time, not bytes: measured 0.1 % over float32's
    # steps, 6-8 % over top-k's), within Lab 6's Prediction 1 (25 %).
    assert none.wire_bytes_per_step <= none.link_bytes_per_step <= 1.1 * none.wire_bytes_per_step, none
    assert topk.wire_bytes_per_step <= topk.link_bytes_per_step <= 1.25 * topk.wire_bytes_per_step, topk
