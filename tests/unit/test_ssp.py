"""Stale-synchronous parallel (Lab 6) without processes: settings, the wait, the bound check, tables and figures."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from lab_utils.grading import reference_script
from lab_utils.training import ps
from lab_utils.training.ps import clocks as ssp
from lab_utils.training.ps import runs as ps_runs
from lab_utils.training.ssp import runs as ssp_runs

REFERENCE = reference_script("06_communication", "train_ssp.py")  # the instructor notebook's


def tf_config(workers=2, index=0):
    cluster = {"ps": ["localhost:1"], "worker": [f"localhost:{10 + i}" for i in range(workers)]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})}


# ----------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "given, expected",
    [(0, 0), (1, 1), (4, 4), ("4", 4), (" 2 ", 2), (4.0, 4), (math.inf, math.inf), (-1, math.inf)]
    + [("inf", math.inf), ("Inf", math.inf), ("infinity", math.inf), ("-1", math.inf), ("∞", math.inf)],
)
def test_parse_staleness(given, expected):
    got = ps.parse_staleness(given)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "given, error, message",
    [
        (-2, ValueError, "integer >= 0, or math.inf / -1"),
        (1.5, ValueError, "got 1.5"),
        (float("nan"), ValueError, "got nan"),
        (-math.inf, ValueError, "got -inf"),
        ("fast", ValueError, "got 'fast'"),
        ("", ValueError, "got ''"),
        (True, TypeError, "got bool True"),
        (None, TypeError, "got NoneType None"),
        ([1], TypeError, "got list"),
    ],
)
def test_parse_staleness_rejects(given, error, message):
    with pytest.raises(error, match=message):
        ps.parse_staleness(given)


def test_check_settings_ssp():
    s = ps.check_settings("ssp", 50, 2, epochs=None, steps=100, staleness="inf", straggler="worker:1=30ms")
    assert (s.mode, s.staleness, s.straggler) == ("ssp", math.inf, {"worker:1": 0.03})
    assert ps.check_settings("ssp", 50, 2, staleness=0).staleness == 0
    assert ps.check_settings("async", 50, 2).staleness is None  # the other modes are unchanged


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="ssp"), "mode='ssp' needs a staleness bound"),
        (dict(mode="ssp", staleness=-3), "staleness must be an integer >= 0"),
        (dict(mode="async", staleness=1), "staleness only applies to mode='ssp', got staleness=1 with mode='async'"),
        (dict(mode="sync", staleness=0), "only applies to mode='ssp'"),
        (dict(mode="ssp", staleness=1, replicas_to_aggregate=1), "only applies to mode='sync'"),
        (dict(mode="bsp", staleness=1), r"mode must be one of \('async', 'sync', 'ssp'\)"),
    ],
)
def test_check_settings_ssp_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ps.check_settings(batch_size=50, num_workers=2, **kwargs)


def test_parse_args_ssp():
    settings, task = ps.parse_args("ssp", ["--steps", "20", "--staleness", "inf"], env=tf_config(3, 2))
    assert (settings.mode, settings.staleness, settings.num_workers, task.index) == ("ssp", math.inf, 3, 2)
    settings, _ = ps.parse_args("ssp", ["--staleness", "1"], env=tf_config())
    assert settings.staleness == 1 and settings.epochs == 1.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "20"], "the following arguments are required: --staleness"),
        (["--staleness", "soon"], "staleness must be an integer >= 0, or 'inf' / -1 for no bound, got 'soon'"),
    ],
)
def test_parse_args_ssp_rejects(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        ps.parse_args("ssp", argv, env=tf_config())
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_staleness_is_not_an_option_of_the_other_modes(capsys):
    with pytest.raises(SystemExit):
        ps.parse_args("async", ["--staleness", "1"], env=tf_config())
    assert "unrecognized arguments: --staleness 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "mode, rule, error, message",
    [
        ("ssp", None, ValueError, "mode='ssp' needs the rule"),
        ("ssp", 3, TypeError, "may_start must be a function"),
        ("async", lambda *a: True, ValueError, "may_start only applies to mode='ssp'"),
    ],
)
def test_train_worker_checks_the_rule_before_anything_starts(mode, rule, error, message):
    settings = ps.check_settings(mode, 50, 2, epochs=None, steps=10, staleness=1 if mode == "ssp" else None)
    with pytest.raises(error, match=message):  # no data loaded, no server: it fails at once
        ps.train_worker(object(), settings, build=lambda task, s: None, may_start=rule)


# ----------------------------------------------------------------------------- the wait


class FakeTime:
    """A clock that only moves when somebody sleeps."""

    def __init__(self):
        self.t, self.pauses = 0.0, []

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.pauses.append(seconds)
        self.t += seconds


def reads(*vectors):
    """``read()`` returning each vector in turn, then the last one forever."""
    it = iter(vectors)
    last = [None]

    def read():
        last[0] = next(it, last[0])
        return last[0]

    return read


def rule(clock, clocks, s):  # what the tests of the wait need; the lab's own rule is the student's
    return min(clocks) >= clock - s


def test_wait_for_turn_polls_until_the_rule_says_yes():
    fake = FakeTime()
    got = ssp.wait_for_turn(reads([3, 1], [3, 1], [3, 2]), rule, 0, 3, 1, 10.0, sleep=fake.sleep, now=fake.now)
    assert (got.clock, got.min_clock, got.staleness, got.polls) == (3, 2, 1, 3)
    assert fake.pauses == [ssp.FIRST_PAUSE_SECS, 2 * ssp.FIRST_PAUSE_SECS]
    assert got.wait == pytest.approx(sum(fake.pauses))
    assert got.fields() == {"clock": 3, "min_clock": 2, "staleness": 1, "wait": round(got.wait, 6)}


def test_asking_is_not_waiting_each_read_costs_a_round_trip_and_a_yes_at_once_waits_nothing():
    """A read of the clocks is a round trip to the PS, every step, bound or no bound: the wait is
    counted from the first answer (a run without a bound waits 0 s, as Lab 6's model says)."""
    fake = FakeTime()
    slow = reads([3, 1], [3, 2])

    def read():  # each read takes 3 ms
        fake.sleep(0.003)
        return slow()

    got = ssp.wait_for_turn(read, rule, 0, 3, 1, 10.0, sleep=fake.sleep, now=fake.now)
    assert got.asked == pytest.approx(0.003) and got.wait == pytest.approx(ssp.FIRST_PAUSE_SECS + 0.003)
    at_once = ssp.wait_for_turn(read, rule, 0, 3, 5, 10.0, sleep=fake.sleep, now=fake.now)
    assert (at_once.polls, at_once.wait, at_once.asked) == (1, 0.0, pytest.approx(0.003))


def test_wait_for_turn_backs_off_to_a_bounded_pause_and_fails_at_the_deadline():
    fake = FakeTime()
    with pytest.raises(RuntimeError) as info:
        ssp.wait_for_turn(reads([5, 0, 5]), rule, 2, 5, 1, 2.0, task="worker:2", sleep=fake.sleep, now=fake.now)
    message = str(info.value)
    assert "worker:2: waited 2.0 s (more than the step timeout 2 s) to start step 6 with staleness bound s=1" in message
    assert "clocks on the PS [5, 0, 5]" in message and "did it fail or hang?" in message
    assert max(fake.pauses) == ssp.MAX_PAUSE_SECS and 2.0 <= fake.t <= 2.0 + ssp.MAX_PAUSE_SECS


def test_finished_workers_are_infinitely_far_ahead():
    seen = []

    def spy(clock, clocks, s):
        seen.append(list(clocks))
        return rule(clock, clocks, s)

    got = ssp.wait_for_turn(reads([ssp.DONE, 7]), spy, 1, 7, 0, 1.0)
    assert seen == [[math.inf, 7]] and (got.min_clock, got.staleness) == (7, 0)
    assert ssp.as_clocks([0, ssp.DONE, ssp.DONE + 1]) == [0, math.inf, math.inf]


def test_a_rule_that_never_says_yes_is_named_when_nobody_else_is_left():
    fake = FakeTime()
    with pytest.raises(RuntimeError, match="every other worker has finished.*may_start never said yes"):
        ssp.wait_for_turn(reads([4, ssp.DONE]), lambda *a: False, 0, 4, 1, 0.5, sleep=fake.sleep, now=fake.now)


def test_the_rule_must_answer_true_or_false_and_cannot_change_the_record():
    with pytest.raises(TypeError, match=r"may_start\(2, \[2, 2\], 1\) must return True or False, got NoneType"):
        ssp.wait_for_turn(reads([2, 2]), lambda *a: None, 0, 2, 1, 1.0)

    def vandal(clock, clocks, s):
        clocks[1] = 99
        return True

    assert ssp.wait_for_turn(reads([2, 1]), vandal, 0, 2, 1, 1.0).min_clock == 1


def test_wait_for_turn_refuses_a_clock_that_is_not_this_workers():
    with pytest.raises(RuntimeError, match="holds clock 3 for this worker, which has finished 2 steps"):
        ssp.wait_for_turn(reads([3, 3]), rule, 0, 2, 1, 1.0)


# ----------------------------------------------------------------------------- the bound check


def events(task, clocks_and_mins, start=1):
    return [
        {"task": task, "local_step": start + i, "step": 0, "clock": c, "min_clock": m, "staleness": c - m, "wait": 0.0}
        for i, (c, m) in enumerate(clocks_and_mins)
    ]


GOOD = events("worker:0", [(0, 0), (1, 0), (2, 1), (3, 2)]) + events("worker:1", [(0, 0), (1, 1), (2, 2)])


def test_check_bound_passes_a_good_sequence():
    for given in (GOOD, pd.DataFrame(GOOD)):
        out = ssp_runs.check_bound(given, 1)
        assert out.empty and list(out.columns) == ssp_runs.VIOLATION_COLUMNS
    assert ssp_runs.check_bound(GOOD, "inf").empty


def test_check_bound_catches_a_worker_too_far_ahead():
    out = ssp_runs.check_bound(GOOD, 0)  # worker:0 ran one step ahead three times
    assert list(out["local_step"]) == [2, 3, 4] and set(out["task"]) == {"worker:0"}
    assert "started at clock 1 while a worker had finished only 0 steps: 1 > s=0" in out["problem"].iloc[0]
    crafted = events("worker:0", [(0, 0), (1, 0), (2, 0), (3, 2)])
    out = ssp_runs.check_bound(crafted, 1)
    assert out[["local_step", "clock", "min_clock", "staleness"]].values.tolist() == [[3, 2, 0, 2]]


@pytest.mark.parametrize(
    "bad, message",
    [
        (events("worker:0", [(0, 0), (1, 1), (3, 3)]), "clock 3 at local step 3"),
        (events("worker:0", [(0, 0), (1, 0)]) + events("worker:0", [(3, 3)], start=4), "local step 4 after 2"),
        (events("worker:0", [(0, 0), (1, 1), (1, 1)]), "clock 1 at local step 3"),
        (events("worker:0", [(0, 0), (1, 2)]), "min clock 2 above its own clock 1"),
        (events("worker:0", [(0, 0), (1, 1), (2, 0)]), "min clock went down from 1 to 0"),
        ([{**GOOD[0], "clock": None}], "no clock in this step event"),
    ],
)
def test_check_bound_flags_events_that_cannot_be_right(bad, message):
    out = ssp_runs.check_bound(bad, math.inf)
    assert any(message in p for p in out["problem"]), out["problem"].tolist()


def test_check_bound_needs_ssp_events():
    with pytest.raises(ValueError, match="no step events"):
        ssp_runs.check_bound([], 1)
    with pytest.raises(ValueError, match="have no clock, min_clock .*only the step events of a mode='ssp' run"):
        ssp_runs.check_bound([{"task": "worker:0", "local_step": 1, "step": 1, "staleness": 0}], 1)
    with pytest.raises(ValueError, match="staleness must be"):
        ssp_runs.check_bound(GOOD, -5)


def simulate(rule_fn, s, durations, steps):
    """Workers taking ``durations[i]`` time units per step, each asking ``rule_fn`` before a
    step; returns their step events (clock and min clock as train_worker records them)."""
    n = len(durations)
    clocks, busy_until, started, out, total = [0] * n, [0] * n, [None] * n, [], 0
    for t in range(10_000):
        for i in range(n):
            if started[i] is not None and busy_until[i] == t:  # a step ends: tick, report
                clocks[i] += 1
                total += 1
                out.append({"task": f"worker:{i}", "local_step": clocks[i], **started[i]})
                started[i] = None
        for i in range(n):
            if started[i] is None and total >= steps:
                clocks[i] = math.inf  # finished: holds nobody back
        if all(c == math.inf for c in clocks):
            return out
        for i in range(n):
            if started[i] is None and clocks[i] != math.inf and rule_fn(clocks[i], list(clocks), s):
                low = min(clocks)
                started[i] = {"clock": clocks[i], "min_clock": low, "staleness": clocks[i] - low, "wait": 0.0}
                busy_until[i] = t + durations[i]
    raise AssertionError("the simulation did not end")


@pytest.mark.parametrize("s", [0, 1, 4])
def test_the_reference_rule_keeps_the_bound_and_always_true_breaks_it(s):
    import runpy

    reference = runpy.run_path(str(REFERENCE))["may_start"]
    kept = simulate(reference, s, [1, 5], 60)
    assert ssp_runs.check_bound(kept, s).empty
    assert max(e["staleness"] for e in kept) == s  # the fast worker uses all the room it is given
    broken = simulate(lambda *a: True, s, [1, 5], 60)
    assert not ssp_runs.check_bound(broken, s).empty


# ----------------------------------------------------------------------------- tables and figures


def ssp_run(s, straggler_steps=3, fast_steps=6, label=None):
    fast = [(c, max(0, c - (s if s != math.inf else c))) for c in range(fast_steps)]
    slow = [(c, c) for c in range(straggler_steps)]
    rows = events("worker:0", fast) + events("worker:1", slow)
    for k, e in enumerate(rows):
        e["time"] = 100.0 + k
    rows[0]["accuracy"] = 0.5
    rows[len(fast) - 1]["accuracy"] = 0.85
    result = {
        "mode": "ssp",
        "accuracy": 0.9,
        "final_global_step": fast_steps + straggler_steps,
        "target_global_steps": fast_steps + straggler_steps,
        "batch_size": 50,
        "train_time": 2.0,
        "staleness_bound": "inf" if s == math.inf else s,
    }
    results = {
        "worker:0": {**result, "local_steps": fast_steps, "is_chief": True},
        "worker:1": {**result, "local_steps": straggler_steps, "train_time": 2.5, "straggler_delay": 0.03},
    }
    return ps_runs.PSRun(
        label=label or ssp_runs.bound_label(s), results=results, events=pd.DataFrame(rows), wall_time=10.0, started=99.0
    )


def test_bound_of_and_labels():
    assert [ssp_runs.bound_of(ssp_run(s)) for s in ssp_runs.BOUNDS] == [0, 1, 4, math.inf]
    assert [ssp_runs.bound_label(s) for s in ssp_runs.BOUNDS] == ["s=0", "s=1", "s=4", "s=∞"]
    r = ssp_run(1)
    del r.results["worker:0"]["staleness_bound"]
    with pytest.raises(ValueError, match="not an SSP run"):
        ssp_runs.bound_of(r)


def test_staleness_table_and_compare():
    t = ssp_runs.staleness_table(ssp_run(math.inf))
    assert list(t.index) == ["worker:0", "worker:1"]
    assert list(t["local steps"]) == [6, 3] and list(t["staleness max"]) == [5, 0]
    assert t.loc["worker:1", "straggler delay (s/step)"] == 0.03
    runs = [ssp_run(s) for s in (0, 1, math.inf)]
    c = ssp_runs.compare(runs, target_accuracy=0.8)
    assert list(c["s"]) == ["s=0", "s=1", "s=∞"] and list(c["violations"]) == [0, 0, 0]
    assert list(c["staleness max"]) == [0, 1, 5] and c["local steps"].iloc[0] == "6 / 3"
    assert c["train time (s)"].iloc[0] == 2.5 and c["time to 0.8 (s)"].iloc[0] == pytest.approx(6.0)
    assert ssp_runs.compare([ssp_run(1, label="wrong")], target_accuracy=0.99)["time to 0.99 (s)"].isna().all()
    counts = ssp_runs.staleness_counts(runs)
    assert list(counts.columns) == ["s=0", "s=1", "s=∞"] and counts["s=∞"].sum() == 9
    assert counts.loc[0, "s=0"] == 9 and counts.loc[1, "s=1"] == 5
    wide = ssp_runs.staleness_counts(runs, top=2)
    assert list(wide.index) == [0, 1, 2, ">2"] and list(wide["s=∞"]) == [4, 1, 1, 3]
    with pytest.raises(ValueError, match="top must be an integer >= 0, got -1"):
        ssp_runs.staleness_counts(runs, top=-1)


def test_straggler_extra_is_the_straggler_step_less_the_others_own_work():
    # worker:0 works 0.1 s a step and waits 0.3 s for worker:1, whose steps take 0.4 s
    fast = events("worker:0", [(c, c) for c in range(5)])
    slow = events("worker:1", [(c, c) for c in range(5)])
    for k, e in enumerate(fast):
        e["time"], e["wait"] = 10.0 + 0.4 * k, (0.3 if k else 0.0)
    for k, e in enumerate(slow):
        e["time"] = 10.05 + 0.4 * k
    r = ssp_run(0)
    r.events = pd.DataFrame(fast + slow)
    assert ssp_runs.straggler_extra(r) == pytest.approx(0.3)
    assert ssp_runs.compare([r])["straggler extra (s/step)"].iloc[0] == pytest.approx(0.3)
    r.results["worker:1"]["straggler_delay"] = 0.0  # no straggler: nothing extra
    assert ssp_runs.straggler_extra(r) == 0.0
    r.results["worker:1"]["straggler_delay"] = 0.03
    r.events = pd.DataFrame(fast[:1] + slow)  # one step: no interval to measure
    assert math.isnan(ssp_runs.straggler_extra(r))
    r.events = pd.DataFrame(fast + slow).drop(columns="time")
    with pytest.raises(ValueError, match="no time"):
        ssp_runs.straggler_extra(r)


def test_compare_counts_violations():
    r = ssp_run(1)
    r.results["worker:0"]["staleness_bound"] = 0  # the events show up to 1 step ahead: above s=0
    assert ssp_runs.compare([r])["violations"].iloc[0] == 5


def test_figures(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    runs = [ssp_run(s) for s in ssp_runs.BOUNDS]
    fig = ssp_runs.plot_staleness(runs)
    assert [ax.get_title() for ax in fig.axes] == ["s=0", "s=1", "s=4", "s=∞"]
    fig = ssp_runs.plot_progress(runs[:2])
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 2
    for plot in (ssp_runs.plot_staleness, ssp_runs.plot_progress):
        with pytest.raises(ValueError, match="at least one run"):
            plot([])


def test_sweep_checks_every_bound_before_running(monkeypatch):
    launched = []
    monkeypatch.setattr(ssp_runs, "run_ps", lambda script, **kw: launched.append(kw) or kw)
    with pytest.raises(ValueError, match="staleness must be"):
        ssp_runs.sweep_bounds("train_ssp.py", [0, "soon"])
    with pytest.raises(ValueError, match="each bound once"):
        ssp_runs.sweep_bounds("train_ssp.py", [1, "1"])
    assert launched == []
    out = ssp_runs.sweep_bounds(
        "train_ssp.py", [0, -1], args={"steps": 10, "straggler": "worker:1=30ms"}, monitor=False
    )
    assert list(out) == [0, math.inf]
    assert [kw["args"]["staleness"] for kw in launched] == [0, "inf"]
    assert launched[1]["label"] == "SSP s=∞, straggler worker:1=30ms" and launched[1]["monitor"] is False
