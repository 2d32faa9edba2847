"""Lab 5 on GPUs: towers and MirroredStrategy on 2 devices (real GPUs, or GPU 0 split into 2
logical GPUs) end with the same weights; the tier says which; ``--precision mixed`` trains in
bfloat16; a batch too large for a GPU's memory is an OOM row, not a crash.

Skipped, without importing TensorFlow into pytest, when ``nvidia-smi -L`` lists no GPU; on a
machine where it does, a subprocess asks TensorFlow, and the tests skip when it sees none."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lab_utils.grading import reference_script
from lab_utils.training import allreduce
from lab_utils.training import devices as lab_devices
from lab_utils.training.towers import runs as towers_runs

GPUS = lab_devices.nvidia_gpus()

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not GPUS, reason="no GPU: nvidia-smi is not installed or lists none"),
]

SOLUTION = reference_script("05_alexnet", "towers.py")  # the notebook's solution, extracted
# float32 without TF32: what is left is the order of the sums, amplified where a ReLU's input is
# within rounding of zero (on CPUs, 3 steps: below 2.2e-4; a wrong average: over 2e-2).
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def tf_gpus() -> int:
    """GPUs TensorFlow sees, asked in a subprocess (pytest itself never initialises CUDA)."""
    code = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    n = int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0
    if n == 0:
        pytest.skip(
            f"nvidia-smi lists {len(GPUS)} GPU(s) but TensorFlow sees none (tensorflow-cpu, or no CUDA libraries?)"
        )
    return n


def test_towers_and_mirrored_on_two_gpus_end_with_the_same_weights(tf_gpus, monkeypatch):
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")  # Ampere and later: plain float32 matmuls and convolutions
    args = {"width": 0.5, "dropout": 0.0, "steps": 3, "batch_size": 64, "precision": "float32", "seed": 0}
    runs = {
        m: towers_runs.run_devices(m, 2, args=args, student=SOLUTION, save_weights=True, monitor=False)
        for m in ("towers", "mirrored")
    }
    tier = "gpu" if tf_gpus >= 2 else "logical-gpu"
    for m, run in runs.items():
        r = run.result
        assert not run.oom and r["tier"] == tier and r["precision"] == "float32", (m, r)
        assert r["examples"] == 3 * 128 and run.examples_per_sec > 0, (m, r)
    diff = allreduce.max_difference(runs["towers"].weights(), runs["mirrored"].weights())
    assert diff["max_rel"] <= TOLERANCE, diff
    if tf_gpus < 2:
        assert runs["towers"].result["memory_limit_mb"] > 0  # logical GPUs share GPU 0's memory


def test_mixed_precision_on_one_gpu_reports_bfloat16_and_gpu_measurements(tf_gpus):
    run = towers_runs.run_devices(
        "single", 1, args={"variant": "224", "batch_size": 64, "steps": 5, "precision": "mixed"}, interval=0.1
    )
    r = run.result
    assert not run.oom and r["tier"] == "gpu" and r["precision"] == "mixed_bfloat16", r
    assert r["params"] == 61_100_840 and run.examples_per_sec > 0 and run.events["loss"].notna().all(), r
    table = towers_runs.resource_table([run])
    assert {"GPU util (%)", "GPU Mem (B)"} <= set(table.columns), table.columns
    assert table.loc[0, "GPU Mem (B)"] > 0 and table.loc[0, "status"] == "ok", table.T


def test_a_batch_too_large_for_the_gpu_is_an_oom_row(tf_gpus):
    """AlexNet-224 needs ~0.7 GB for weights, gradients and momentum alone: 512 MB cannot hold it at batch 256."""
    runs = towers_runs.sweep_devices(
        [256],
        [1],
        "single",
        args={"variant": "224", "steps": 2, "memory_limit_mb": 512, "precision": "float32"},
        interval=0.1,
        verbose=False,
    )
    run = runs[0]
    assert run.oom, run.result
    error = run.result["error"]
    assert "OOM" in error or "ResourceExhausted" in error, error
    assert run.result["tier"] == "gpu" and run.result["memory_limit_mb"] == 512
    assert towers_runs.resource_table(runs).loc[0, "status"].startswith("OOM")
