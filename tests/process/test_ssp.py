"""Process tests for stale-synchronous parallel (Lab 6): the reference train_ssp.py on 1 PS + 2 workers.

The script is Lab 6's instructor train_ssp.py (Lab 2's graph, the reference ``may_start``);
worker:1 is a straggler (50 ms more per step). Each cluster takes about 6-8 s on 2 cores
(three TensorFlow imports); the module runs four: s = 0, 1, no bound, and a peer that never
finishes its step, which must fail within the step timeout. Data: the offline MNIST sample.
"""

from __future__ import annotations

import math

import pytest
from support import timelines

from lab_utils import report
from lab_utils.cluster import ClusterError, TFCluster
from lab_utils.grading import reference_script
from lab_utils.training.ssp import runs as ssp_runs

SCRIPT = reference_script("06_communication", "train_ssp.py")  # the instructor notebook's
RUN_BOUND = 120.0  # seconds: a run that takes longer than this counts as hung
ARGS = {"steps": 80, "batch_size": 50, "eval_every": 20, "straggler": "worker:1=50ms"}


def run(args: dict, workers: int = 2, seen: dict | None = None):
    """Run a cluster to the end; return (results, every worker's step events); ``seen``
    gets its ``timeline``."""
    with TFCluster(ps=1, workers=workers, script=SCRIPT, args=args, timeout=RUN_BOUND, progress=False) as c:
        results = c.wait()
    events = [e for t in c.tasks if t.role == "worker" for e in report.read_events(t.events_path, "step")]
    if seen is not None:
        seen["timeline"] = c.timeline
    # the run ended by itself: workers exit 0 on their own, the launcher stopped the PS, nothing runs
    states = {t.name: (t.state, t.exit_code) for t in c.tasks}
    assert all(states[f"worker:{i}"] == ("done", 0) for i in range(workers)), states
    assert states["ps:0"][0] == "stopped" and not any(t.running() for t in c.tasks), states
    return results, events


def by_task(events, task):
    return [e for e in events if e["task"] == task]


@pytest.mark.parametrize("s", [0, 1])
def test_bound_holds_with_a_straggler(s):
    seen = {}
    results, events = run({**ARGS, "staleness": s}, seen=seen)
    fast, slow = results["worker:0"], results["worker:1"]
    assert fast["mode"] == "ssp" and fast["staleness_bound"] == s and slow["straggler_delay"] == pytest.approx(0.05)
    assert 80 <= fast["final_global_step"] <= 81 and fast["accuracy"] >= 0.8
    # every step of every worker is in the events, and none started more than s steps ahead
    assert len(events) == fast["local_steps"] + slow["local_steps"]
    assert ssp_runs.check_bound(events, s).empty, ssp_runs.check_bound(events, s)
    # the bound binds: the fast worker uses all the room it has, then waits for the straggler ...
    assert max(e["staleness"] for e in by_task(events, "worker:0")) == s
    assert fast["staleness_max"] == s and fast["wait_time"] > slow["wait_time"]
    # ... so it is held to the straggler's pace: at most s + 1 more steps than it
    assert fast["local_steps"] - slow["local_steps"] <= s + 1
    # On the timeline: the waits are worker:0's `ssp wait` parts, as long as it measured them,
    # and the straggler's injected delay is its own (50 ms a step)
    measured = {w: r["train_time"] for w, r in results.items()}
    sec = timelines.check(seen["timeline"], measured, tasks=["ps:0", "worker:0", "worker:1"])
    waits = [p for p in seen["timeline"].parts if p.name == "ssp wait" and p.task == "worker:0"]
    assert sum(p.seconds for p in waits) == pytest.approx(fast["wait_time"], rel=0.05, abs=0.005)
    assert sec["worker:0"]["wait"] > 0.2 * sec["worker:0"]["step"], sec["worker:0"]
    assert sec["worker:1"]["delay"] == pytest.approx(0.05 * slow["local_steps"], rel=0.15)
    # and why: the fast worker's waits are the straggler's injected delay (issue 55)
    timelines.check_cause(seen["timeline"], "worker:0", "worker:1")


def test_without_a_bound_the_fast_worker_runs_ahead():
    r = ssp_runs.run_ssp(SCRIPT, math.inf, args=ARGS, monitor=False, progress=False, timeout=RUN_BOUND)
    fast, slow = r.results["worker:0"], r.results["worker:1"]
    assert ssp_runs.bound_of(r) == math.inf and r.label == "SSP s=∞, straggler worker:1=50ms"
    assert ssp_runs.check_bound(r.events, math.inf).empty
    # ASP: nobody waits, so the fast worker gets far ahead of the straggler, and a bound of 1
    # would have been broken (the check can fail on real events)
    ahead = ssp_runs.staleness_table(r)["staleness max"]
    assert ahead["worker:0"] > 1 and ahead["worker:0"] > ahead["worker:1"]
    assert fast["local_steps"] > slow["local_steps"] + 1
    assert len(ssp_runs.check_bound(r.events, 1)) > 0
    table = ssp_runs.compare([r], target_accuracy=0.5)
    assert table["violations"].iloc[0] == 0 and table["s"].iloc[0] == "s=∞"


@pytest.mark.timeout(300)  # a hang guard: the 1 s step timeout must end the run
def test_a_peer_that_never_finishes_its_step_fails_the_run_in_bounded_time():
    # worker:1 takes 20 s per step; at s=0 worker:0 may not start its second step before
    # worker:1 finished its first, and gives up after the 1 s step timeout with a clear message
    with pytest.raises(ClusterError) as info:
        run({"steps": 20, "batch_size": 50, "staleness": 0, "straggler": "worker:1=20", "step_timeout": 1})
    assert info.value.task == "worker:0"
    assert "more than the step timeout 1 s) to start step 2 with staleness bound s=0" in info.value.log_tail
    assert "the slowest (worker:1, clock 0) has not finished its step: did it fail or hang?" in info.value.log_tail
