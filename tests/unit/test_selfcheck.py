"""The throughput self-check: the estimate, its margin and its call, with a fake clock; the
published yardsticks against what the hidden tests grade."""

from __future__ import annotations

import ast
import json
import re

import pytest
from support.fakeclock import FakeClock

from lab_utils import reference_runs
from lab_utils.grading import selfcheck, throughput
from lab_utils.grading.layout import GRADING_ROOT

LABS = ["01_single_node", "02_ps_async", "03_ps_sync", "04_allreduce", "05_alexnet"]


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(throughput, "_clock", c)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    return c


@pytest.fixture
def lab(monkeypatch):
    """A published lab of made-up ratios: the reference takes 1.2x the yardstick's time, +/- 5 %."""
    info = {"points": 2, "bands": [[0.5, 1.0], [0.3, 0.5]], "yardstick": "a stand-in", "job": {"steps": 10}}
    info["ratios"] = {"a": 1.14, "b": 1.2, "c": 1.26}
    monkeypatch.setattr(selfcheck, "published", lambda name: info)
    return info


def test_the_estimate_scales_the_measured_ratio_by_the_published_one(clock, lab, capsys):
    # yardstick 1.0 s, yours 1.5 s: 0.67 x 1.2 = 0.8 of the reference's throughput, clear of the 0.5 edge
    out = selfcheck.self_check(clock.job(1.5), clock.job(1.0), lab="x", rounds=2)
    assert out.scale == pytest.approx(1.2)
    assert out.estimate == pytest.approx(0.8)
    assert out.margin == pytest.approx(0.10 * 1.02 + 0.02, rel=0.01)  # spread 5 % < MIN_SPREAD 10 %, noise 2 %
    assert (out.band, out.credit) == (0, 2.0)
    text = capsys.readouterr().out
    assert "about 0.80x the reference's" in text and "expect 2 of 2 points" in text


def test_near_a_band_edge_it_does_not_call_it_and_measures_more(clock, lab, capsys):
    out = selfcheck.self_check(clock.job(2.3), clock.job(1.0), lab="x", rounds=2)  # 0.52: within the margin of 0.5
    assert out.band is None and out.credit is None
    assert clock.runs == 6  # 2 pairs, then one more (max_rounds defaults to rounds + 1)
    assert "too close to a band edge" in capsys.readouterr().out


def test_a_slow_job_and_an_incomplete_one(clock, lab, capsys):
    out = selfcheck.self_check(clock.job(6.0), clock.job(1.0), lab="x", rounds=1)  # 0.2: no band
    assert (out.band, out.credit, clock.runs) == (2, 0.0, 2)
    out = selfcheck.self_check(clock.job(1.0), clock.job(1.0), lab="x", rounds=1, valid=lambda r: r == "all")
    assert out.complete is False and out.credit == 0.0
    assert "did not do the whole job" in capsys.readouterr().out


def test_while_grading_it_runs_nothing(clock, lab, monkeypatch, capsys):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert selfcheck.self_check(clock.job(1.0), clock.job(1.0), lab="x") is None
    assert clock.runs == 0 and "not run while grading" in capsys.readouterr().out


def test_jobs_take_the_published_length_and_drop_epochs(lab, monkeypatch):
    from lab_utils.training.ps import runs as ps_runs

    calls = []
    monkeypatch.setattr(ps_runs, "run_ps", lambda script, **kw: calls.append((script, kw)))
    mine, yard = selfcheck.jobs("02_ps_async", "train_async.py", {"workers": 2}, {"epochs": 2, "batch_size": 60})
    mine(), yard()
    assert [c[0] for c in calls] == ["train_async.py", "-m lab_utils.training.ps.yardstick"]
    assert calls[0][1]["args"] == calls[1][1]["args"] == {"batch_size": 60, "steps": 10}
    assert calls[0][1]["workers"] == 2
    with pytest.raises(ValueError, match="no yardstick jobs"):
        selfcheck.jobs("06_communication", "x.py", {})


def test_plain_steps_runs_the_train_op_and_nothing_else():
    import numpy as np

    fed = []

    class Sess:
        def run(self, fetch, feed_dict):
            fed.append((fetch, len(feed_dict["x"]), len(feed_dict["y"])))

    g = type("G", (), {"x": "x", "y": "y", "train_op": "train"})
    assert selfcheck.plain_steps(Sess(), g, np.zeros((50, 784)), np.zeros(50), 8, 5) == 5
    assert fed == [("train", 8, 8)] * 5


def _graded(lab: str) -> dict:
    """points and bands of the throughput.compare call in the lab's hidden test."""
    nb = json.loads((GRADING_ROOT / "source" / lab / f"{lab}.ipynb").read_text())
    source = next("".join(c["source"]) for c in nb["cells"] if "throughput.compare(" in "".join(c["source"]))
    call = source[source.index("throughput.compare(") :]
    points = re.search(r"points=([\d.]+)", call).group(1)
    bands = re.search(r"bands=(\(\([^=]*\)\))", call).group(1)
    return {"points": float(points), "bands": [list(b) for b in ast.literal_eval(bands)]}


@pytest.mark.parametrize("lab", LABS)
def test_each_published_yardstick_matches_its_hidden_test_and_was_measured_on_two_machines(lab):
    info = reference_runs.load(selfcheck.YARDSTICKS)["labs"][lab]
    assert {"points": float(info["points"]), "bands": info["bands"]} == _graded(lab)
    assert len(info["ratios"]) >= 2, info["ratios"]
    assert all(0.2 < r < 5 for r in info["ratios"].values()), info["ratios"]


@pytest.mark.parametrize("lab", LABS)
def test_each_lab_has_a_self_check_after_its_throughput_test(lab):
    nb = json.loads((GRADING_ROOT / "source" / lab / f"{lab}.ipynb").read_text())
    sources = ["".join(c["source"]) for c in nb["cells"]]
    at = next(i for i, s in enumerate(sources) if f'lab="{lab}"' in s and "selfcheck.self_check(" in s)
    assert "### BEGIN" not in sources[at]  # visible, and not an answer cell


def test_a_ratio_measured_on_other_devices_gives_no_estimate(clock, lab, capsys):
    lab["tier"] = "logical-cpu"
    assert selfcheck.self_check(clock.job(1.0), clock.job(1.0), lab="x", tier="gpu") is None
    assert clock.runs == 0 and "measured on logical-cpu devices, not on gpu" in capsys.readouterr().out
    assert selfcheck.self_check(clock.job(1.0), clock.job(1.0), lab="x", tier="logical-cpu", rounds=1).credit == 2.0


def test_the_bench_measures_a_lab_and_publishes_only_complete_measurements(tmp_path):
    """grading/README's commands: Lab 1 measured for real (one round), then published with
    made-up measurements of the other labs; a lab measured nowhere is refused."""
    import os
    import subprocess
    import sys

    from lab_utils.grading.layout import REPO_ROOT

    bench = [sys.executable, str(REPO_ROOT / "bench" / "bench_yardsticks.py")]
    one = tmp_path / "one.json"
    env = dict(os.environ, LABS_OFFLINE="1")
    run = subprocess.run(
        [*bench, "--machine", "here", "--labs", "01", "--rounds", "1", "--out", str(one)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    measured = json.loads(one.read_text())
    lab1 = measured["labs"]["01_single_node"]
    assert len(lab1["reference_s"]) == len(lab1["yardstick_s"]) == 1
    assert lab1["ratio"] == pytest.approx(lab1["reference_s"][0] / lab1["yardstick_s"][0], rel=1e-3)

    shipped = tmp_path / "yardsticks.json"
    refused = subprocess.run([*bench, "--publish", str(one), "--to", str(shipped)], capture_output=True, text=True)
    assert refused.returncode != 0 and "no measurement of 02_ps_async" in refused.stderr and not shipped.exists()

    other = {
        "machine": "there",
        "labs": {lab: {"ratio": 1.5, "reference_s": [3.0], "yardstick_s": [2.0], "noise": 0.1} for lab in LABS},
    }
    (tmp_path / "other.json").write_text(json.dumps(other))
    done = subprocess.run(
        [*bench, "--publish", str(one), str(tmp_path / "other.json"), "--to", str(shipped)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    labs = json.loads(shipped.read_text())["labs"]
    assert labs["01_single_node"]["ratios"] == {"here": lab1["ratio"], "there": 1.5}
    assert labs["05_alexnet"]["tier"] == "logical-cpu" and labs["02_ps_async"]["ratios"] == {"there": 1.5}
