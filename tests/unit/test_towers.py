"""Lab 5 without processes: AlexNet's sizes, the task's and the notebook's argument checks,
the tables from hand-made runs, the tiers' expectations, and the solution's gradient
averaging. TensorFlow is imported in-process only by the tests that build models."""

from __future__ import annotations

import math
from itertools import pairwise
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from lab_utils import models
from lab_utils.grading import reference_script
from lab_utils.training import allreduce, devices, tables, towers
from lab_utils.training.towers import runs as towers_runs

SOLUTION = reference_script("05_alexnet", "towers.py")  # the notebook's solution, extracted


def _cifar_params(width: float = 1.0, num_classes: int = 10) -> int:
    """AlexNet-cifar's parameters from its layer shapes (3x3 convolutions, three 2x2 pools: 4x4 features)."""

    def ch(n):
        return max(4, round(n * width))

    convs = [3, ch(64), ch(192), ch(384), ch(256), ch(256)]
    total = sum((9 * cin + 1) * cout for cin, cout in pairwise(convs))
    hidden = ch(1024)
    dense = [4 * 4 * convs[-1], hidden, hidden, num_classes]
    return total + sum((i + 1) * o for i, o in pairwise(dense))


# ----------------------------------------------------------------------------- AlexNet


def test_alexnet_224_has_the_one_tower_alexnets_61_1_million_parameters():
    model = models.alexnet("224")
    assert model.count_params() == models.ALEXNET_224_PARAMS == 61_100_840
    assert model.input_shape == (None, 224, 224, 3) and model.output_shape == (None, 1000)


def test_alexnet_cifar_parameters_and_width_scaling():
    full = models.alexnet("cifar")
    assert full.count_params() == _cifar_params() == 7_506_762
    assert full.input_shape == (None, 32, 32, 3) and full.output_shape == (None, 10)
    counts = {w: models.alexnet("cifar", width=w).count_params() for w in (0.25, 0.5)}
    assert counts == {w: _cifar_params(w) for w in counts}
    assert counts[0.25] < counts[0.5] < full.count_params()
    assert counts[0.25] < full.count_params() / 10  # width 1/4: about 1/16 of the weights
    assert models.alexnet("cifar", width=0.25, num_classes=100).output_shape == (None, 100)


def test_alexnet_same_seed_same_weights():
    a = models.alexnet("cifar", width=0.25, seed=3).get_weights()
    b = models.alexnet("cifar", width=0.25, seed=3).get_weights()
    c = models.alexnet("cifar", width=0.25, seed=4).get_weights()
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"variant": "imagenet"}, "unknown AlexNet variant 'imagenet'"),
        ({"width": 0}, "width must be in"),
        ({"width": 4.5}, "width must be in"),
        ({"dropout": 1.0}, "dropout must be in"),
        ({"dropout": -0.1}, "dropout must be in"),
        ({"num_classes": 1}, "num_classes must be >= 2"),
    ],
)
def test_alexnet_rejects_bad_settings(kw, match):
    with pytest.raises(ValueError, match=match):
        models.alexnet(**kw)


# ----------------------------------------------------------------------------- the task's arguments


def test_parse_args_defaults_and_values(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no towers.py here: `single` does not need one
    a = towers.parse_args(["--method", "single", "--batch-size", "8", "--width", "0.25", "--precision", "mixed"])
    assert (a.method, a.devices, a.batch_size, a.width, a.precision, a.variant) == (
        "single",
        1,
        8,
        0.25,
        "mixed",
        "cifar",
    )
    b = towers.parse_args(["--method", "towers", "--devices", "3", "--student", str(SOLUTION)])
    assert (b.devices, b.student, b.device_kind, b.memory_limit_mb) == (3, str(SOLUTION), "auto", None)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--devices", "0"], "--devices must be >= 1, got 0"),
        (["--method", "single", "--devices", "2"], "--method single trains on one device, got --devices 2"),
        (["--method", "towers", "--devices", "2", "--student", "no_such_towers.py"], "no_such_towers.py: no such file"),
        (["--method", "mirrored", "--devices", "2"], "--student towers.py: no such file"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
        (["--width", "5"], "0 < --width <= 4"),
        (["--memory-limit-mb", "0"], "--memory-limit-mb must be >= 1"),
        (["--method", "pipeline"], "invalid choice: 'pipeline'"),
        (["--precision", "float16"], "invalid choice: 'float16'"),
    ],
)
def test_parse_args_exits_2_with_the_reason(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        towers.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


# ----------------------------------------------------------------------------- the notebook's checks


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: towers_runs.run_devices("towers", 0), ValueError, r"devices must be (an int )?>= 1, got 0"),
        (lambda: towers_runs.run_devices("towers", 2.0), ValueError, "--devices: invalid int value"),
        (lambda: towers_runs.run_devices("pipeline", 2), ValueError, "unknown method 'pipeline'"),
        (
            lambda: towers_runs.run_devices("towers", 2, args={"batch_size": 0}, student=SOLUTION),
            ValueError,
            r"batch.size must be (an int )?>= 1",
        ),
        (
            lambda: towers_runs.run_devices("towers", 2, args={"precision": "fp8"}, student=SOLUTION),
            ValueError,
            "invalid choice: 'fp8'",
        ),
        (
            lambda: towers_runs.run_devices("towers", 2, student="no_such_towers.py"),
            FileNotFoundError,
            "run the notebook's `%%writefile no_such_towers.py` cell first",
        ),
        (lambda: towers_runs.sweep_devices([], [1, 2]), ValueError, "at least one batch size"),
        (lambda: towers_runs.sweep_devices([8], []), ValueError, "at least one batch size"),
    ],
)
def test_bad_runs_fail_before_any_process_starts(refuse_processes, call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize(
    "method,n,args",
    [
        ("single", 2, {}),
        ("towers", 2, {"width": 5}),
        ("towers", 2, {"dropout": 1.0}),
        ("towers", 2, {"memory_limit_mb": 0}),
    ],
)
def test_values_the_task_refuses_fail_before_any_process_starts(refuse_processes, method, n, args):
    with pytest.raises(ValueError):
        towers_runs.run_devices(method, n, args=args, student=SOLUTION)


def test_check_args_passes_good_settings_and_names_the_bad_one():
    towers_runs.check_args({"batch_size": 64, "width": 0.25, "steps": 3, "memory_limit_mb": 256})
    with pytest.raises(ValueError, match=r"bad arguments .*invalid choice: 'resnet'"):
        towers_runs.check_args({"variant": "resnet"})
    with pytest.raises(ValueError, match="--steps"):
        towers_runs.check_args({"steps": True})  # a bare --steps flag
    with pytest.raises(ValueError, match=r"devices must be (an int )?>= 1, got 0"):
        towers_runs.check_args({"devices": 0})


# ----------------------------------------------------------------------------- tables from hand-made runs


class FakeMonitor:
    """What measurements() reads of a Monitor: summary()'s ``total`` row; no GPU sampler."""

    def __init__(self, peak_mem=5e8, peak_cpu=180.0, net_r=1e3, net_w=2e3):
        self.sampler = SimpleNamespace(gpu=None)
        self._row = {"Peak Mem": peak_mem, "Peak CPU": peak_cpu, "Network R": net_r, "Network W": net_w}

    def summary(self):
        return pd.DataFrame(
            [{**self._row, "Peak Mem": self._row["Peak Mem"] / 2}, self._row], index=["local:0", "total"]
        )


def _run(method, n, batch, examples_per_sec=None, *, oom=False, monitor=True, steps=10):
    """A DeviceRun with a hand-made result: ``examples_per_sec`` from examples and train_time."""
    result = {"method": method, "devices": n, "tier": "logical-cpu", "batch_size": batch, "global_batch": batch * n}
    if oom:
        result.update(oom=True, error="training needed more than 300 MB of device memory (305 MB)")
    else:
        examples = steps * batch * n
        result.update(oom=False, examples=examples, local_steps=steps, train_time=examples / examples_per_sec)
        result.update(loss_first=2.3, loss=2.1, accuracy=0.2)
    mon = FakeMonitor(peak_cpu=100.0 * n) if monitor else None
    return towers_runs.DeviceRun(method, n, result, label=f"{method}{n}", wall_time=3.0, monitor=mon)


def test_a_run_s_hang_guard_is_sized_to_its_work():
    """Part B's 300 steps at width 1.0 take about 19 minutes on one core: a fixed 15-minute
    guard stopped them. The guard grows with the examples trained and the width squared."""
    part_b = towers_runs.run_timeout({"devices": 2, "batch_size": 64, "steps": 300})
    training_at_one_core = 301 * 128 * towers_runs.CORE_SECONDS_PER_EXAMPLE
    assert part_b == pytest.approx(towers_runs.TIMEOUT_START_S + towers_runs.TIMEOUT_MARGIN * training_at_one_core)
    assert part_b > 3600 and towers_runs.TIMEOUT_MARGIN >= 3
    small = towers_runs.run_timeout({"devices": 1, "steps": 3})  # the parser's defaults fill the rest
    assert towers_runs.TIMEOUT_START_S < small < part_b / 4
    half = towers_runs.run_timeout({"devices": 2, "batch_size": 64, "steps": 300, "width": 0.5})
    assert half - towers_runs.TIMEOUT_START_S == pytest.approx((part_b - towers_runs.TIMEOUT_START_S) / 4)
    big = towers_runs.run_timeout({"devices": 1, "steps": 3, "variant": "224"})
    assert big - towers_runs.TIMEOUT_START_S == pytest.approx(2 * (small - towers_runs.TIMEOUT_START_S))


def test_device_run_properties_and_repr():
    run = _run("towers", 2, 32, 640.0)
    assert (run.size, run.oom, run.global_batch, run.tier) == (2, False, 64, "logical-cpu")
    assert run.examples_per_sec == pytest.approx(640.0) and run.step_time == pytest.approx(0.1)
    assert run.accuracy == pytest.approx(0.2) and "640 examples/s" in repr(run)
    oom = _run("towers", 2, 512, oom=True)
    assert oom.oom and math.isnan(oom.examples_per_sec) and math.isnan(oom.step_time)
    assert "OUT OF MEMORY" in repr(oom) and "300 MB" in repr(oom)
    with pytest.raises(ValueError, match="ran out of memory"):
        towers_runs.DeviceRun("towers", 2, oom.result, label="x", wall_time=1.0, weights_path="w.npz").weights()
    with pytest.raises(ValueError, match="without save_weights=True"):
        run.weights()


def test_measurements_of_a_run_and_of_an_oom_run():
    row = towers_runs.measurements(_run("mirrored", 2, 32, 640.0))
    assert row["method"] == towers_runs.METHOD_LABELS["mirrored"] and (row["devices"], row["Batch Size"]) == (2, 32)
    assert (row["Peak Mem (B)"], row["Peak CPU"], row["Network R"], row["Network W"]) == (5e8, 200.0, 1e3, 2e3)
    assert row["Examples/s"] == pytest.approx(640.0) and row["s/Batch"] == pytest.approx(0.1) and row["status"] == "ok"
    oom = towers_runs.measurements(_run("towers", 2, 512, oom=True))
    assert oom["status"].startswith("OOM") and "300 MB" in oom["status"]
    assert math.isnan(oom["Examples/s"]) and oom["Peak Mem (B)"] == 5e8
    bare = towers_runs.measurements(_run("single", 1, 64, 500.0, monitor=False))
    assert math.isnan(bare["Peak Mem (B)"]) and math.isnan(bare["Network W"]) and bare["Examples/s"] == 500.0


def test_resource_table_has_the_seeds_columns_and_marks_oom():
    runs = [_run("single", 1, 64, 500.0), _run("towers", 2, 32, 640.0), _run("towers", 2, 512, oom=True)]
    table = towers_runs.resource_table(runs)
    assert list(table.columns) == towers_runs.TABLE_COLUMNS  # no GPU columns without a GPU sampler
    assert list(table["status"].str.startswith("OOM")) == [False, False, True]
    assert table["Examples/s"].isna().tolist() == [False, False, True]
    assert table["Batch Size"].tolist() == [64, 32, 512]
    assert set(table.attrs["units"]) == set(towers_runs.TABLE_COLUMNS) - {"method", "devices", "status"}
    with pytest.raises(ValueError, match="at least one run"):
        towers_runs.resource_table([])


def test_scaling_table_speedup_over_the_single_device_run(monkeypatch):
    monkeypatch.setattr(tables, "usable_cores", lambda: 1)
    runs = [
        _run("single", 1, 32, 400.0),
        _run("towers", 2, 32, 600.0),
        _run("mirrored", 2, 32, 500.0),
        _run("towers", 4, 512, oom=True),  # left out
    ]
    t = towers_runs.scaling_table(runs).set_index(["method", "workers"])
    labels = towers_runs.METHOD_LABELS
    assert sorted(t.index) == sorted(
        [
            (labels["single"], 1),
            (labels["towers"], 1),
            (labels["towers"], 2),
            (labels["mirrored"], 1),
            (labels["mirrored"], 2),
        ]
    )
    # methods without a 1-device run start from the baseline at 1 device
    assert t.loc[(labels["towers"], 1), "examples/s"] == 400.0 and t.loc[(labels["towers"], 1), "speedup"] == 1.0
    assert t.loc[(labels["towers"], 2), "speedup"] == pytest.approx(1.5)
    assert t.loc[(labels["towers"], 2), "efficiency"] == pytest.approx(0.75)
    assert t.loc[(labels["mirrored"], 2), "speedup"] == pytest.approx(1.25)
    assert t["oversubscribed"].to_dict() == {k: k[1] > 1 for k in t.index}
    assert t.attrs["usable_cores"] == 1


def test_scaling_table_prefers_the_single_run_as_baseline_and_keeps_other_1_device_runs():
    runs = [_run("towers", 1, 32, 300.0), _run("single", 1, 32, 400.0), _run("towers", 2, 32, 600.0)]
    t = towers_runs.scaling_table(runs).set_index(["method", "workers"])
    label = towers_runs.METHOD_LABELS["towers"]
    assert t.loc[(label, 1), "speedup"] == pytest.approx(0.75)  # its own 1-device run, over single's
    assert t.loc[(label, 2), "speedup"] == pytest.approx(1.5)
    given = towers_runs.scaling_table(runs, baseline=runs[0]).set_index(["method", "workers"])
    assert given.loc[(label, 2), "speedup"] == pytest.approx(2.0)


def test_scaling_table_needs_a_finished_1_device_run():
    with pytest.raises(ValueError, match="needs a 1-device run"):
        towers_runs.scaling_table([_run("towers", 2, 32, 600.0)])
    with pytest.raises(ValueError, match="needs a 1-device run"):  # the only one ran out of memory
        towers_runs.scaling_table([_run("single", 1, 4096, oom=True), _run("towers", 2, 32, 600.0)])


# ----------------------------------------------------------------------------- tiers


# ids without "gpu": tests/conftest.py skips items whose keywords (parameter ids too) include "gpu"
@pytest.mark.parametrize("kind", ["gpu", "logical-gpu", "logical-cpu"], ids=["real", "logical-g", "logical-c"])
def test_expectation_names_the_device_count(kind):
    text = devices.expectation(kind, 3, cores=8)
    assert "3 " in text and ("real GPU" in text if kind == "gpu" else "share" in text)


def test_logical_cpu_expectation_is_bounded_by_the_cores():
    assert "at most about 2x" in devices.expectation("logical-cpu", 4, cores=2)
    assert "at most about 1x" in devices.expectation("logical-cpu", 2, cores=1)


def test_tier_describe_and_as_dict():
    tier = devices.Tier("logical-gpu", ("/GPU:0", "/GPU:1"), "/CPU:0", "1 x H100", 4096)
    assert tier.describe() == "logical-gpu: 2 device(s) on 1 x H100, 4,096 MB each; variables on /CPU:0"
    assert tier.as_dict()["devices"] == ["/GPU:0", "/GPU:1"]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"n": 0}, "devices must be an integer >= 1"),
        ({"n": True}, "devices must be an integer >= 1"),
        ({"n": 2, "kind": "tpu"}, "unknown device kind 'tpu'"),
        ({"n": 2, "memory_limit_mb": 0}, "memory_limit_mb must be >= 1"),
    ],
)
def test_configure_rejects_bad_input_before_touching_tensorflow(kw, match):
    with pytest.raises(ValueError, match=match):
        devices.configure(**kw)


# ----------------------------------------------------------------------------- the solution's averaging


@pytest.fixture(scope="module")
def solution():
    return towers.load_student(SOLUTION)


def test_average_gradients_is_the_mean_per_variable_in_order(solution):
    tf = models.import_tensorflow()
    rng = np.random.default_rng(0)
    variables = [tf.Variable(np.zeros(s, np.float32), name=f"v{i}") for i, s in enumerate([(3, 2), (2,), (4, 1, 5)])]
    grads = [[rng.normal(size=v.shape).astype(np.float32) for v in variables] for _ in range(3)]
    tower_grads = [[(tf.constant(g), v) for g, v in zip(gs, variables, strict=True)] for gs in grads]
    averaged = solution.average_gradients(tower_grads)
    assert len(averaged) == len(variables)
    for i, (g, v) in enumerate(averaged):
        assert v is variables[i]
        np.testing.assert_allclose(g.numpy(), np.mean([gs[i] for gs in grads], axis=0), rtol=1e-6, atol=1e-7)
    one = solution.average_gradients([tower_grads[0]])
    assert all(np.array_equal(g.numpy(), grads[0][i]) for i, (g, _) in enumerate(one))


def test_towers_step_on_one_device_twice_equals_the_single_step(solution):
    """The split-and-average maths without logical devices: two towers on the same CPU
    device take the same step as one device on the whole batch (one step: no ReLU kinks yet)."""
    tf = models.import_tensorflow()
    rng = np.random.default_rng(1)
    x = rng.uniform(size=(8, 32, 32, 3)).astype(np.float32)
    y = rng.integers(0, 10, size=8)
    built = []
    for _ in range(2):
        model = models.alexnet("cifar", width=0.25, dropout=0.0, seed=5)
        opt = tf.keras.optimizers.SGD(0.05, momentum=0.9)
        opt.build(model.trainable_variables)
        built.append((model, opt))
    (m1, o1), (m2, o2) = built
    start = m1.get_weights()
    loss1 = float(allreduce.plain_step(m1, o1, towers.loss_fn)(x, y))
    loss2 = float(solution.make_towers_step(m2, o2, ["/CPU:0", "/CPU:0"], "/CPU:0")(x, y))
    assert loss2 == pytest.approx(loss1, rel=1e-5)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(m1.get_weights(), start, strict=True))
    apart = max(float(np.abs(a - b).max()) for a, b in zip(m1.get_weights(), m2.get_weights(), strict=True))
    assert moved > 1e-4 and apart < 1e-3 * moved, (moved, apart)


def test_the_quick_checks_result_names_what_is_wrong():
    ok = {"tolerance": 1e-4, "devices": 2, "steps": 2, "loss_single": 2.5}
    ok.update(towers_weights_rel_diff=3e-7, towers_loss=2.5, mirrored_weights_rel_diff=2e-7, mirrored_loss=2.50001)
    assert towers_runs.step_problems(ok) == []
    summed = towers_runs.step_problems({**ok, "towers_weights_rel_diff": 1.9})
    assert len(summed) == 1 and summed[0].startswith("towers:") and "1.9e+00" in summed[0]
    # the right update and a loss reduced with MEAN over 2 replicas: half the global mean
    halved = towers_runs.step_problems({**ok, "mirrored_loss": 1.25})
    assert len(halved) == 1 and "ReduceOp.SUM" in halved[0] and "1.2500" in halved[0]
    # a wrong update explains a wrong loss: one sentence, about the update
    both = towers_runs.step_problems({**ok, "mirrored_weights_rel_diff": 0.5, "mirrored_loss": 5.0})
    assert len(both) == 1 and "GLOBAL batch" in both[0]
    assert towers_runs.step_problems({**ok, "towers_weights_rel_diff": float("nan")}) != []


def test_the_quick_check_refuses_one_device_and_a_missing_file(tmp_path):
    with pytest.raises(ValueError, match="devices must be an int >= 2"):
        towers_runs.check_steps(SOLUTION, devices=1)
    with pytest.raises(FileNotFoundError, match="%%writefile"):
        towers_runs.check_steps(tmp_path / "towers.py")
