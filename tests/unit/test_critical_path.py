"""lab_utils.critical_path on made-up runs whose answer is known: a synchronous PS with a
straggler, a ring whose barrier waits for the slowest rank, a wait that names what it is on;
the critical path, the waits by cause and the what-if replay."""

from __future__ import annotations

import pytest

from lab_utils import critical_path, report
from lab_utils.timeline import Timeline, load

T0 = 1_800_000_000.0
PERIOD = 1.2


def _step(task, n, start, end, *spans):
    return {"kind": "step", "task": task, "time": T0 + end, "step": n, "started": T0 + start,
            "spans": [[name, cat, T0 + a, T0 + b, *more] for name, cat, a, b, *more in spans]}  # fmt: skip


def _straggler_run(steps=5, delay=1.0, third=False, on=None):
    """Sync PS, 2 workers: worker:1 sleeps ``delay`` each step before its push; worker:0 waits
    for its token until worker:1's push is in (0.02 s later). ``third``: a worker:2 whose compute
    ends just before the release, unrelated to it."""
    events = []
    for k in range(steps):
        t = k * PERIOD
        more = [on] if on else []
        theirs = [["worker:0"]] if on else []  # the straggler's own token wait, named the same way
        events.append(_step("worker:0", k + 1, t, t + PERIOD, ("compute", "compute", t, t + 0.1),
                            ("push", "comm", t + 0.1, t + 0.15),
                            ("token", "wait", t + 0.15, t + 0.15 + delay + 0.02, *more)))  # fmt: skip
        events.append(_step("worker:1", k + 1, t, t + PERIOD, ("compute", "compute", t, t + 0.1),
                            ("straggle", "delay", t + 0.1, t + 0.1 + delay),
                            ("push", "comm", t + 0.1 + delay, t + 0.15 + delay),
                            ("token", "wait", t + 0.15 + delay, t + 0.17 + delay, *theirs)))  # fmt: skip
        if third:
            events.append(_step("worker:2", k + 1, t, t + PERIOD, ("compute", "compute", t + 0.3, t + 0.16 + delay)))
    return Timeline.from_events(events, ["worker:0", "worker:1", *(["worker:2"] if third else [])])


def test_a_fast_workers_wait_is_the_stragglers_delay():
    table = critical_path.waits_by_cause(_straggler_run())
    mine = table[table["task"] == "worker:0"].set_index("cause")["seconds"]
    assert mine.index[0] == "worker:1: injected delay"  # the largest cause first
    assert mine["worker:1: injected delay"] == pytest.approx(5 * 1.0)  # all of it: the compute both did cancels
    assert "worker:1: communicating" not in mine.index and "worker:1: computing" not in mine.index
    # noticed 0.02 s late each time, but then each step begins 0.02 s late too: once in all
    assert mine["the release (message, queue)"] == pytest.approx(0.02)
    assert mine.sum() == pytest.approx(table[table["task"] == "worker:0"]["waited (s)"].iloc[0])
    sentence = critical_path.describe_waits(_straggler_run())[0]
    assert sentence.startswith("worker:0 waited 5.10 s: 5.00 s for worker:1: injected delay"), sentence


def test_the_critical_path_of_a_step_runs_through_the_straggler_and_adds_up_to_the_step():
    path = critical_path.critical_path(_straggler_run(), step=3)
    assert path["seconds"].sum() == pytest.approx(PERIOD)
    by = path.groupby(["task", "cat"])["seconds"].sum()
    assert by[("worker:1", "delay")] == pytest.approx(1.0) and by[("worker:1", "compute")] == pytest.approx(0.1)
    assert ("worker:0", "compute") not in by.index  # worker:0's own work is off the path
    assert list(path["start"]) == sorted(path["start"])
    whole = critical_path.critical_path(_straggler_run())
    assert whole["seconds"].sum() == pytest.approx(5 * PERIOD)


def test_without_the_straggler_the_replay_predicts_the_fast_step():
    run = _straggler_run()
    table = critical_path.what_if(run, tasks={"worker:1": {"delay": 0}})
    assert table.loc["worker:0", "measured step (s)"] == pytest.approx(PERIOD)
    # compute 0.1, push 0.05, the release 0.02, the step's rest 0.03: what a run without it takes
    assert table.loc["worker:0", "predicted step (s)"] == pytest.approx(0.2)
    assert table.loc["worker:1", "predicted step (s)"] == pytest.approx(0.2)
    assert "keeps its duration" in table.attrs["assumptions"]
    same = critical_path.what_if(run)
    assert list(same["predicted / measured"]) == pytest.approx([1.0, 1.0])
    half = critical_path.what_if(run, scale={"delay": 0.5})
    assert half.loc["worker:0", "predicted step (s)"] == pytest.approx(PERIOD - 0.5)


def test_a_wait_that_names_its_task_is_not_blamed_on_a_bystander():
    blamed = critical_path.waits_by_cause(_straggler_run(third=True))
    causes = set(blamed[blamed["task"] == "worker:0"]["cause"])
    assert "worker:2: computing" in causes  # its compute ended last before the release: a guess
    named = critical_path.waits_by_cause(_straggler_run(third=True, on=["worker:1"]))
    mine = named[named["task"] == "worker:0"].set_index("cause")["seconds"]
    assert "worker:2: computing" not in mine.index
    assert mine["worker:1: injected delay"] == pytest.approx(5 * 1.0)


def test_a_ring_step_waits_at_the_barrier_for_the_slowest_rank_and_faster_links_shrink_it():
    events = []
    for k in range(4):
        t = k * 1.0
        events.append(_step("rank:0", k + 1, t, t + 1.0, ("compute", "compute", t, t + 0.2),
                            ("barrier", "wait", t + 0.2, t + 0.4), ("all-reduce", "comm", t + 0.4, t + 1.0)))  # fmt: skip
        events.append(_step("rank:1", k + 1, t, t + 1.0, ("compute", "compute", t, t + 0.4),
                            ("all-reduce", "comm", t + 0.4, t + 1.0)))  # fmt: skip
    run = Timeline.from_events(events)
    waits = critical_path.waits_by_cause(run).set_index("cause")["seconds"]
    assert waits["rank:1: computing"] == pytest.approx(4 * 0.2)
    faster = critical_path.what_if(run, scale={"comm": 0.1})
    assert faster.loc["rank:1", "predicted step (s)"] == pytest.approx(0.46)
    assert faster.loc["rank:0", "predicted step (s)"] == pytest.approx(0.46)


def test_a_wait_released_by_nothing_traced_keeps_its_time_and_is_unattributed():
    events = [_step("worker:0", k + 1, k, k + 1, ("compute", "compute", k, k + 0.5), ("queue", "wait", k + 0.5, k + 1))
              for k in range(3)]  # fmt: skip
    run = Timeline.from_events(events)
    assert critical_path.waits_by_cause(run)["cause"].tolist() == [critical_path.UNATTRIBUTED]
    assert critical_path.what_if(run, scale={"compute": 0})["predicted step (s)"].iloc[0] == pytest.approx(0.5)


def test_what_a_wait_was_on_survives_the_trace_file(tmp_path):
    run = _straggler_run(on=["worker:1"])
    run.write(tmp_path / "trace.json")
    back = load(tmp_path / "trace.json")
    assert {p.on for p in back.parts if p.cat == "wait" and p.task == "worker:0"} == {("worker:1",)}


def test_a_wait_or_a_collective_is_on_other_tasks_and_on_names_them(tmp_path, monkeypatch):
    monkeypatch.setenv("LABS_REPORT_FILE", str(tmp_path / "events.jsonl"))
    monkeypatch.setattr(report, "_tracing", None)
    with pytest.raises(ValueError, match="a wait, or a collective"):
        report.add_span("slept", "delay", T0, T0 + 1, on="worker:1")
    with pytest.raises(ValueError, match="on must name tasks"):
        report.span("token", "wait", on=[""])
    with report.span("token", "wait", on="worker:1"):
        pass
    report.add_span("barrier", "wait", T0, T0 + 1, on=["rank:1", "rank:2"])
    report.step(1, 1, started=T0)
    (event,) = report.read_events(tmp_path / "events.jsonl", "step")
    assert [s[4] for s in event["spans"]] == [["worker:1"], ["rank:1", "rank:2"]]
    with pytest.raises(ValueError, match="waits are not scaled"):
        critical_path.what_if(_straggler_run(), scale={"wait": 0})


def test_a_timeline_answers_the_same_questions(capsys):
    import matplotlib

    matplotlib.use("Agg")
    run = _straggler_run()
    run.why(interactive=False)  # what a lab shows: the figure with its path, the shares, the causes
    out = capsys.readouterr().out
    assert "worker:0 waited 5.10 s: 5.00 s for worker:1: injected delay" in out and "The trace:" in out
    assert run.critical_path(step=2)["seconds"].sum() == pytest.approx(PERIOD)
    assert run.waits_by_cause().equals(critical_path.waits_by_cause(run))
    assert run.what_if(tasks={"worker:1": {"delay": 0}})["predicted step (s)"].tolist() == pytest.approx([0.2, 0.2])


def test_the_figures_draw_the_path_over_the_timeline(capsys):
    import matplotlib

    matplotlib.use("Agg")
    run = _straggler_run()
    fig = critical_path.figure(run, steps=(2, 3))
    (path,) = [t for t in fig.data if t.name == "critical path"]
    assert set(path.y) == {"worker:1"} and sum(path.x) == pytest.approx(2 * PERIOD * 1e3)  # the straggler sets the pace
    static = critical_path.static_figure(run)
    labels = [t.get_text() for t in static.axes[0].get_legend().get_texts()]
    assert labels[-1] == "critical path" and "injected delay" in labels
    critical_path.show(run, interactive=False)
    out = capsys.readouterr().out
    assert "worker:0 waited 5.10 s: 5.00 s for worker:1: injected delay" in out


def test_a_release_is_what_ended_before_the_wait_ended_or_else_just_after_it():
    """A push's reply can come back after the token it released (two processes' clocks and the
    RPC's return): within 2 ms after the wait's end it is still the release, unless something
    of another task ended before the wait did."""
    late = [_step("worker:0", 1, 0, 1, ("compute", "compute", 0, 0.1), ("token", "wait", 0.1, 0.5)),
            _step("worker:1", 1, 0, 1, ("compute", "compute", 0, 0.09), ("push", "comm", 0.09, 0.501))]  # fmt: skip
    chains = critical_path.pieces(Timeline.from_events(late))
    (wait,) = [p for p in chains["worker:0"] if p.cat == "wait"]
    assert critical_path.releasers(chains)[wait].name == "push"
    early = [*late, _step("worker:2", 1, 0, 1, ("compute", "compute", 0, 0.49))]
    chains = critical_path.pieces(Timeline.from_events(early))
    (wait,) = [p for p in chains["worker:0"] if p.cat == "wait"]
    assert critical_path.releasers(chains)[wait].task == "worker:2"


def test_two_waits_released_within_the_slack_after_each_other_do_not_loop():
    """worker:0's wait is released by worker:1's push that ends 1 ms after it (the slack), and
    worker:1's next wait by worker:0's piece that ends 1 ms after that: the walk must not go
    forward in time and back again."""
    events = [
        _step("worker:0", 1, 0, 1, ("compute", "compute", 0, 0.1), ("token", "wait", 0.1, 0.5),
              ("apply", "compute", 0.5, 0.5015), ("tail", "wait", 0.5015, 0.6)),
        _step("worker:1", 1, 0, 1, ("compute", "compute", 0, 0.09), ("push", "comm", 0.09, 0.501),
              ("token", "wait", 0.501, 0.5012), ("more", "compute", 0.5012, 0.6)),
    ]  # fmt: skip
    run = Timeline.from_events(events)
    assert critical_path.critical_path(run)["seconds"].sum() == pytest.approx(1.0)
    table = critical_path.waits_by_cause(run)
    for _task, rows in table.groupby("task"):
        assert rows["seconds"].sum() == pytest.approx(rows["waited (s)"].iloc[0]), rows
    critical_path.what_if(run, scale={"compute": 0.5})


def test_backup_workers_replay_releases_each_wait_at_the_first_gradient():
    """R = 1 of 2: worker:0 no longer waits for worker:1's delay, only as long as a wait took
    when its own gradient was the one awaited (worker:1's: 0.02 s); worker:1 keeps its pace."""
    run = _straggler_run()
    fewer = critical_path.what_if(run, replicas=1)
    # compute 0.1, push 0.05, its own release 0.02, the step's rest 0.03
    assert fewer.loc["worker:0", "predicted step (s)"] == pytest.approx(0.2)
    assert fewer.loc["worker:1", "predicted step (s)"] == pytest.approx(PERIOD)
    assert fewer.attrs["rules"] == {"replicas": 1}
    every = critical_path.what_if(run, replicas=2)
    assert list(every["predicted / measured"]) == pytest.approx([1.0, 1.0])
    with pytest.raises(ValueError, match="replicas must be an int >= 1"):
        critical_path.what_if(run, replicas=0)


def _ssp_run(steps=8, delay=0.5):
    """SSP with s = 0, 2 workers: each step reads the clocks (10 ms); worker:1 sleeps ``delay``
    then computes 0.1 s; worker:0 computes 0.1 s but may start step k only once worker:1 has
    finished k steps (its wait ends 1 ms after)."""
    events, ends1, t = [], [], 0.0
    for k in range(steps):
        spans = [("read clocks", "comm", t, t + 0.01), ("straggler delay", "delay", t + 0.01, t + 0.01 + delay),
                 ("compute", "compute", t + 0.01 + delay, t + 0.11 + delay)]  # fmt: skip
        events.append(_step("worker:1", k + 1, t, t + 0.11 + delay, *spans))
        t += 0.11 + delay
        ends1.append(t)
    t = 0.0
    for k in range(steps):
        spans = [("read clocks", "comm", t, t + 0.01)]
        go = t + 0.01
        if k and ends1[k - 1] + 0.001 > go:
            go = ends1[k - 1] + 0.001
            spans.append(("ssp wait", "wait", t + 0.01, go))
        spans.append(("compute", "compute", go, go + 0.1))
        events.append(_step("worker:0", k + 1, t, go + 0.1, *spans))
        t = go + 0.1
    return Timeline.from_events(events, ["worker:0", "worker:1"])


def test_another_ssp_bound_is_replayed_from_the_clocks_the_steps_read():
    run = _ssp_run()
    measured = critical_path.what_if(run).loc["worker:0", "measured step (s)"]
    assert measured == pytest.approx(0.61, abs=0.01)  # lockstep with the straggler
    free = critical_path.what_if(run, staleness=float("inf"))
    assert free.loc["worker:0", "predicted step (s)"] == pytest.approx(0.11)  # its own read and compute
    assert free.loc["worker:1", "predicted step (s)"] == pytest.approx(0.61)
    same = critical_path.what_if(run, staleness=0)  # its own bound: the polling's notice, not 1 ms
    assert same.loc["worker:0", "predicted step (s)"] == pytest.approx(measured, abs=0.03)
    longer = _ssp_run(steps=20)  # s = 3: 3 steps ahead, then the straggler's pace again
    looser = critical_path.what_if(longer, staleness=3)
    assert looser.loc["worker:0", "predicted step (s)"] == pytest.approx(measured, abs=0.03)
    ahead = critical_path.what_if(run, staleness=3)  # in 8 steps, 3 of the 7 after the first are free
    assert ahead.loc["worker:0", "predicted step (s)"] < measured - 0.2
    with pytest.raises(ValueError, match="staleness must be a number >= 0"):
        critical_path.what_if(run, staleness=-1)


def test_a_collective_waits_for_its_last_member_and_the_straggler_is_the_cause():
    """An all-gather ``on`` the other rank cannot finish before that rank begins its own: the
    time until then is waiting, caused by what the late rank did (its injected delay)."""
    events = []
    for k in range(3):
        t = k * 1.0
        events.append(_step("rank:0", k + 1, t, t + 1.0, ("compute", "compute", t, t + 0.2),
                            ("allgather", "comm", t + 0.2, t + 1.0, ["rank:1"])))  # fmt: skip
        events.append(_step("rank:1", k + 1, t, t + 1.0, ("straggler delay", "delay", t, t + 0.6),
                            ("compute", "compute", t + 0.6, t + 0.8), ("allgather", "comm", t + 0.8, t + 1.0, ["rank:0"])))  # fmt: skip
    run = Timeline.from_events(events)
    assert run.problems() == []
    mine = [p for p in run.parts if p.task == "rank:0" and p.step == 1]
    assert [(p.name, p.cat, round(p.seconds, 6)) for p in mine] == [
        ("compute", "compute", 0.2), ("allgather: waiting", "wait", 0.6), ("allgather", "comm", 0.2)]  # fmt: skip
    assert not any(p.cat == "wait" for p in run.parts if p.task == "rank:1")  # it came last
    causes = critical_path.waits_by_cause(run)
    top = causes[causes["task"] == "rank:0"].iloc[0]
    assert top["cause"] == "rank:1: injected delay" and top["seconds"] == pytest.approx(3 * 0.6)


def test_a_step_number_that_repeats_keeps_each_steps_own_parts():
    """A stale push leaves a PS worker's global step as it was: two steps of one task share a
    number, and each keeps its own parts (not both steps' twice)."""
    events = [_step("worker:0", 7, 0, 1, ("compute", "compute", 0, 0.5)),
              _step("worker:0", 7, 1, 2, ("compute", "compute", 1, 1.5))]  # fmt: skip
    chains = critical_path.pieces(Timeline.from_events(events))
    assert [(p.name, p.index, p.start - T0) for p in chains["worker:0"]] == [
        ("compute", 0, 0), ("other", 0, 0.5), ("compute", 1, 1), ("other", 1, 1.5)]  # fmt: skip
    assert critical_path.what_if(Timeline.from_events(events))["measured step (s)"].iloc[0] == pytest.approx(1.0)


def test_a_straggler_named_in_the_environment_sleeps_each_step_as_a_delay(tmp_path, monkeypatch):
    slept = []
    monkeypatch.setenv("LABS_REPORT_FILE", str(tmp_path / "events.jsonl"))
    monkeypatch.setenv("LABS_TASK", "rank:1")
    monkeypatch.setenv("LABS_STRAGGLER", "rank:0=0.5,rank:1=25ms")
    monkeypatch.setattr(report, "_tracing", None)
    monkeypatch.setattr(report, "_straggle", None)
    monkeypatch.setattr(report.time, "sleep", slept.append)
    assert report.straggle() == pytest.approx(0.025) and slept == [pytest.approx(0.025)]
    report.step(1, 1, started=T0)
    (event,) = report.read_events(tmp_path / "events.jsonl", "step")
    assert [s[:2] for s in event["spans"]] == [["straggler delay", "delay"]]
    monkeypatch.setenv("LABS_TASK", "rank:2")
    monkeypatch.setattr(report, "_straggle", None)
    assert report.straggle() == 0.0 and len(slept) == 1  # not named: nothing


def test_peers_are_the_other_ranks_of_the_job(monkeypatch):
    for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "PMI_RANK", "PMIX_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    assert report.peers() == ["rank:0", "rank:2"]
    assert report.peers(range(1, 3)) == ["rank:2"]  # the workers, rank 0 serving
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    monkeypatch.delenv("OMPI_COMM_WORLD_SIZE")
    assert report.peers() == []
