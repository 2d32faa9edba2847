"""lab_utils.timeline on made-up events: tracks, nesting, clipping, shares, Horovod's
timeline merged onto the tasks' clock, the file round trip and the two figures."""

from __future__ import annotations

import json

import pytest

from lab_utils import report, timeline
from lab_utils.timeline import Span, Timeline

T0 = 1_800_000_000.0


def _step(task, n, start, end, *spans, **more):
    return {
        "kind": "step",
        "task": task,
        "time": T0 + end,
        "step": n,
        "started": T0 + start,
        "spans": [[name, cat, T0 + a, T0 + b] for name, cat, a, b in spans],
        **more,
    }


def _events():
    return [
        {"kind": "ready", "task": "ps:0", "time": T0 - 1},
        _step(
            "worker:0",
            1,
            0.0,
            1.0,
            ("pull", "comm", 0.0, 0.2),
            ("compute", "compute", 0.2, 0.6),
            ("push", "comm", 0.6, 0.8),
        ),
        _step(
            "worker:0",
            2,
            1.0,
            2.0,
            ("pull", "comm", 1.0, 1.1),
            ("compute", "compute", 1.1, 1.5),
            ("token wait", "wait", 1.5, 1.9),
        ),
        _step("worker:1", 1, 0.0, 2.0, ("straggler delay", "delay", 0.0, 1.0), ("compute", "compute", 1.0, 1.4)),
        {"kind": "result", "task": "worker:1", "time": T0 + 2.1},
    ]


def test_every_task_has_a_track_and_parts_nest_in_their_step(tmp_path):
    tl = timeline.write_trace(tmp_path, _events(), ["ps:0", "worker:0", "worker:1"], label="made up")
    assert tl.tasks == ["ps:0", "worker:0", "worker:1"] and tl.problems() == []
    trace = json.loads((tmp_path / "trace.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(names.values()) == ["ps:0", "worker:0", "worker:1"]
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    # the PS serves while the workers train: from the first step to the run's last event
    (serving,) = [e for e in spans if names[e["pid"]] == "ps:0"]
    assert serving["name"] == "serving" and serving["cat"] == "idle"
    assert serving["ts"] == 0 and serving["dur"] == pytest.approx(2.0e6)
    assert min(e["ts"] for e in spans) == 0  # microseconds from the run's first span
    w0 = sorted((e for e in spans if names[e["pid"]] == "worker:0"), key=lambda e: (e["ts"], -e["dur"]))
    assert [e["name"] for e in w0[:4]] == ["step 1", "pull", "compute", "push"]
    assert tl.wait_seconds("worker:0") == pytest.approx(0.4) and tl.wait_seconds("worker:1") == 0


def test_seconds_and_shares_add_up_with_what_no_span_covers_as_other():
    tl = Timeline.from_events(_events(), ["ps:0", "worker:0", "worker:1"])
    sec = tl.seconds()
    w0 = sec["worker:0"]
    assert w0["step"] == pytest.approx(2.0) and w0["comm"] == pytest.approx(0.5) and w0["wait"] == pytest.approx(0.4)
    assert w0["compute"] == pytest.approx(0.8) and w0["other"] == pytest.approx(0.3)
    assert sec["worker:1"]["delay"] == pytest.approx(1.0) and sec["worker:1"]["other"] == pytest.approx(0.6)
    table = tl.summary()
    assert list(table.index) == ["worker:0", "worker:1"]  # the PS has no steps
    shares = table.drop(columns=["steps", "ms/step", "overlap"])
    assert shares.sum(axis=1).tolist() == pytest.approx([1.0, 1.0])
    assert table.loc["worker:0", "communication"] == pytest.approx(0.25)
    assert table.loc["worker:0", "overlap"] == 0.0  # blocking calls: nothing beside them


def test_overlapping_or_stray_parts_are_clipped_and_evaluation_is_not_training():
    events = [
        _step("w", 1, 0.0, 1.0, ("a", "comm", -0.5, 0.5), ("b", "compute", 0.3, 0.9), ("c", "wait", 0.95, 1.5)),
        _step("w", 2, 1.0, 3.0, ("evaluate", "eval", 1.5, 2.5)),
    ]
    tl = Timeline.from_events(events)
    assert [(p.name, round(p.start - T0, 3), round(p.end - T0, 3)) for p in tl.parts] == [
        ("a", 0.0, 0.5),
        ("b", 0.5, 0.9),
        ("c", 0.95, 1.0),
        ("evaluate", 1.5, 2.5),
    ]
    assert tl.problems() == []
    assert tl.seconds()["w"]["step"] == pytest.approx(2.0)  # 3 s of steps less 1 s of evaluation


def test_problems_name_an_overlap_a_stray_part_and_a_task_without_track():
    step = Span("w", "step 1", "step", 0.0, 1.0, 1)
    bad = Timeline(
        ["w", "ghost"], [step], [Span("w", "a", "comm", 0.0, 0.6, 1), Span("w", "b", "compute", 0.5, 1.2, 1)], [], []
    )
    problems = bad.problems()
    assert "ghost: no track" in problems
    assert "w: a and b of step 1 overlap" in problems
    assert "w: b (compute) lies outside step 1" in problems


def test_horovod_s_timeline_is_merged_onto_the_tasks_clock(tmp_path):
    start_us = (T0 + 0.1) * 1e6  # Horovod's own clock starts 0.1 s after the run's origin
    hvd = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": start_us}},
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "HorovodAllreduce_grad_0"}},
        {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": 300_000, "pid": 1},
        {"ph": "E", "ts": 500_000, "pid": 1},
        {"ph": "B", "name": "ALLREDUCE", "ts": 500_000, "pid": 1},
        {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 510_000, "pid": 1},
        {"ph": "E", "ts": 690_000, "pid": 1},
        {"ph": "E", "ts": 700_000, "pid": 1},
    ]
    (tmp_path / "timeline.json").write_text(json.dumps(hvd)[:-1] + ",")  # a killed job leaves it open
    events = [
        {"kind": "step", "task": "rank:0", "time": T0 + 1.0, "step": 1, "started": T0},
        {"kind": "step", "task": "rank:1", "time": T0 + 1.0, "step": 1, "started": T0},
    ]
    tl = timeline.write_trace(tmp_path, events, ["rank:0", "rank:1"])
    parts = {(p.task, p.name): (round(p.start - T0, 3), round(p.end - T0, 3), p.cat) for p in tl.parts}
    assert parts == {
        ("rank:0", "gradients"): (0.0, 0.4, "compute"),
        ("rank:0", "negotiate"): (0.4, 0.6, "wait"),
        ("rank:0", "all-reduce"): (0.6, 0.8, "comm"),
        ("rank:1", "gradients"): (0.0, 0.6, "compute"),
        ("rank:1", "all-reduce"): (0.6, 0.8, "comm"),
    }
    trace = json.loads((tmp_path / "trace.json").read_text())
    hv = [e for e in trace["traceEvents"] if e.get("pid", 0) >= 1000]
    assert {e["args"]["name"] for e in hv if e.get("name") == "process_name"} == {
        "horovod (rank 0's view)",
        "horovod: HorovodAllreduce_grad_0",
    }
    assert min(e["ts"] for e in hv if "ts" in e) == pytest.approx(400_000)  # on the tasks' clock
    again = timeline.load(tmp_path)
    assert again.summary().round(6).equals(tl.summary().round(6))
    assert again.chrome_trace() == tl.chrome_trace()  # a round trip changes nothing


def test_load_says_where_it_looked(tmp_path):
    with pytest.raises(FileNotFoundError, match="no timeline at"):
        timeline.load(tmp_path)


def test_both_figures_draw_every_category_used():
    tl = Timeline.from_events(_events(), ["ps:0", "worker:0", "worker:1"], horovod=None)
    fig = tl.figure()
    assert {t.name for t in fig.data} == {
        "step (what no part covers: input, Python)",
        "communication",
        "compute",
        "waiting",
        "injected delay",
        "serving (no steps)",
    }
    assert sum(len(t.x) for t in fig.data) == len(tl.steps) + len(tl.parts) + len(tl.idle)
    assert len(tl.figure(steps=(2, 2)).data[0].x) == 1  # one step kept
    static = tl.static_figure()
    ax = static.axes[0]
    rows = dict(zip((t.get_text() for t in ax.get_yticklabels()), ax.get_yticks(), strict=True))
    assert rows["ps:0"] > rows["worker:0"] > rows["worker:1"]  # the job's order, top down


def test_show_draws_an_image_when_nobody_watches(monkeypatch, capsys):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(type(obj).__name__))
    Timeline.from_events(_events()).show(interactive=False)
    assert shown[0] == "Figure" and shown[1] == "Styler"
    assert "ui.perfetto.dev" in capsys.readouterr().out


def test_report_spans_go_with_the_next_step_and_can_be_switched_off(tmp_path, monkeypatch):
    path = tmp_path / "events.jsonl"
    monkeypatch.setenv("LABS_REPORT_FILE", str(path))
    monkeypatch.setattr(report, "_tracing", None)
    with report.span("compute", "compute"):
        pass
    report.add_span("push", "comm", T0, T0 + 1)
    with pytest.raises(ValueError, match="category must be one of"):
        report.add_span("x", "network", T0, T0 + 1)
    report.step(1, 10, started=T0)
    report.step(2, 20, started=T0 + 1)
    monkeypatch.setenv("LABS_TRACE", "0")
    monkeypatch.setattr(report, "_tracing", None)
    report.add_span("push", "comm", T0, T0 + 1)
    report.step(3, 30, started=T0 + 2)
    monkeypatch.setattr(report, "_tracing", None)
    first, second, third = report.read_events(path, "step")
    assert [s[:2] for s in first["spans"]] == [["compute", "compute"], ["push", "comm"]]
    assert first["started"] == T0 and "spans" not in second
    assert "started" not in third and "spans" not in third
