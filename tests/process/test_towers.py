"""Lab 5 on real processes, logical CPU devices: one device with batch 2b, hand-made towers
and MirroredStrategy on 2 devices with b each end with the same weights (and a wrong
average does not); a batch too large for a device's memory is an OOM row, not a crash,
and the sweep goes on; nothing is left running and every run directory is under tmp."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support import timelines

from lab_utils.grading import reference_script
from lab_utils.training import allreduce
from lab_utils.training.towers import runs as towers_runs

SOLUTION = reference_script("05_alexnet", "towers.py")  # the notebook's solution, extracted
BATCH = 32  # per device: one device trains on 2 x BATCH
EQUAL = {"width": 0.25, "dropout": 0.0, "steps": 8, "seed": 0, "learning_rate": 0.01}
# Relative to the largest weight. Float32 sums in another order differ by ~1e-7 after a step, but
# a ReLU whose input is within rounding of 0 can switch between the two runs and move its unit's
# gradient. Measured for the solution after 10 steps (2 logical CPU devices, batch 16-64 per
# device, seeds 0-2): up to 2e-4 at width 0.25 and 1e-3 at width 1.0; for a sum instead of a mean,
# or tower 0's gradients alone: 2.2e-2 .. 6.6e-2.
TOLERANCE = 1e-3


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def equal_runs(tmp_path_factory):
    """single (1 device, 2b), towers and mirrored (2 devices, b), and towers with a wrong average."""
    root = tmp_path_factory.mktemp("runs")
    bad = tmp_path_factory.mktemp("student") / "towers_sum.py"
    text = SOLUTION.read_text()
    assert "tf.add_n(grads) / len(grads)" in text
    bad.write_text(text.replace("tf.add_n(grads) / len(grads)", "tf.add_n(grads)"))  # a sum, not a mean
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LABS_RUN_ROOT", str(root))
        before = _children()
        runs = {
            "single": towers_runs.run_devices("single", 1, args={**EQUAL, "batch_size": 2 * BATCH}, save_weights=True)
        }
        for method, student in (("towers", SOLUTION), ("mirrored", SOLUTION), ("sum", bad)):
            runs[method] = towers_runs.run_devices(
                "towers" if method == "sum" else method,
                2,
                args={**EQUAL, "batch_size": BATCH},
                student=student,
                save_weights=True,
                monitor=False,
            )
        after = _children()
    return {"runs": runs, "root": root, "leaked": after - before}


def test_towers_and_mirrored_end_with_the_single_device_weights(equal_runs):
    runs = equal_runs["runs"]
    ref = runs["single"].weights()
    for method in ("towers", "mirrored"):
        diff = allreduce.max_difference(ref, runs[method].weights())
        assert diff["max_rel"] <= TOLERANCE, (method, diff)
    diff = allreduce.max_difference(runs["towers"].weights(), runs["mirrored"].weights())
    assert diff["max_rel"] <= TOLERANCE, ("towers vs mirrored", diff)


def test_a_wrong_average_is_caught(equal_runs):
    """The comparison can fail: summing the towers' gradients (twice the step) ends elsewhere."""
    runs = equal_runs["runs"]
    diff = allreduce.max_difference(runs["single"].weights(), runs["sum"].weights())
    assert diff["max_rel"] > 10 * TOLERANCE, diff


def test_the_runs_trained_the_same_examples(equal_runs):
    for name, run in equal_runs["runs"].items():
        r = run.result
        assert not run.oom and r["tier"] == "logical-cpu" and r["devices"] == (1 if name == "single" else 2), r
        assert r["global_batch"] == 2 * BATCH and r["local_steps"] == EQUAL["steps"], r
        assert r["examples"] == EQUAL["steps"] * 2 * BATCH and r["precision"] == "float32", r
        losses = run.events["loss"].tolist()
        assert len(losses) == EQUAL["steps"] and all(math.isfinite(x) for x in losses), losses
        assert math.isfinite(r["loss_first"]) and math.isfinite(r["loss"]) and run.examples_per_sec > 0
        assert 0 <= run.accuracy <= 1
    single, towers = equal_runs["runs"]["single"], equal_runs["runs"]["towers"]
    assert single.result["params"] == towers.result["params"]
    # the same batches in the same order: the first (warm-up) loss agrees to float rounding
    assert towers.result["loss_first"] == pytest.approx(single.result["loss_first"], rel=1e-5)


def test_each_run_s_timeline_adds_up_to_its_training_time(equal_runs):
    for name, run in equal_runs["runs"].items():
        tl = run.timeline()
        (task,) = tl.tasks  # one process
        sec = timelines.check(tl, {task: run.result["train_time"]})
        assert sec[task]["compute"] > 0.5 * sec[task]["step"], (name, sec)  # the one graph call, not the loop
        want = "forward/backward/update" if name == "single" else "2 towers and their all-reduce (one graph)"
        assert {p.name for p in tl.parts} == {want}, name


def test_equal_runs_left_nothing_running_and_stayed_under_tmp(equal_runs):
    assert not {pid for pid in equal_runs["leaked"] if psutil.pid_exists(pid)}
    for run in equal_runs["runs"].values():
        assert Path(run.run_dir).is_relative_to(equal_runs["root"]) and Path(run.weights_path).is_file()


def test_out_of_memory_is_a_row_and_the_sweep_goes_on(run_root):
    before = _children()
    # Growth of the process past its start of training (AlexNet-cifar, width 0.25, 2 towers): about
    # 90 MB at batch 4 per device, 400 MB at 512, 780 MB at 1024. (At width 1.0 even batch 4 grows
    # about 290 MB, half of it the final evaluation, so a 300 MB device fits no batch there.)
    runs = towers_runs.sweep_devices(
        [1024, 4],  # the OOM first: the next run must still happen
        [2],
        "towers",
        args={"width": 0.25, "steps": 3, "memory_limit_mb": 300},
        student=SOLUTION,
        verbose=False,
    )
    assert not _children() - before
    oom, ok = runs
    assert oom.oom and "memory" in oom.result["error"] and "300" in oom.result["error"], oom.result
    assert oom.result["tier"] == "logical-cpu" and oom.result["global_batch"] == 2048
    assert not ok.oom and ok.examples_per_sec > 0 and ok.result["memory_limit_mb"] == 300
    table = towers_runs.resource_table(runs)
    assert table["status"].str.startswith("OOM").tolist() == [True, False], table
    assert math.isnan(table.loc[0, "Examples/s"]) and table.loc[1, "Examples/s"] > 0
    assert (table["Peak Mem (B)"] > 0).all() and (table["Peak CPU"] > 0).all()  # monitored
    assert all(Path(r.run_dir).is_relative_to(run_root) for r in runs)
    with pytest.raises(ValueError):  # no weights of a run that ran out of memory
        oom.weights()


def test_the_task_refuses_bad_values_before_loading_tensorflow(tmp_path):
    argv = [sys.executable, "-m", "lab_utils.training.towers", "--method", "single", "--devices", "2"]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 2 and "--method single trains on one device" in out.stderr, out.stderr
    code = (
        "import sys, lab_utils.training.towers.runs, lab_utils.training.towers, lab_utils.training.devices;"
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


#: more crafted mistakes of Exercises 2 and 3 (issue 51: three of each), one of each per file, so that
#: one run of the quick check names both: (old, new) edits of the solution, and the words expected
MORE_MISTAKES = {
    "first tower only, each replica's own mean": (
        [
            ("optimizer.apply_gradients(average_gradients(tower_grads))", "optimizer.apply_gradients(tower_grads[0])"),
            (
                "scaled = tf.nn.compute_average_loss(losses, global_batch_size=global_batch_size)",
                "scaled = tf.reduce_mean(losses)",
            ),
        ],
        ("mean over the towers", "GLOBAL batch"),
    ),
    "every tower applied, the replicas' losses averaged": (
        [
            (
                "            tower_grads.append(list(zip(grads, model.trainable_variables)))",
                "            tower_grads.append(list(zip(grads, model.trainable_variables)))\n"
                "            optimizer.apply_gradients(tower_grads[-1])",
            ),
            ("strategy.reduce(tf.distribute.ReduceOp.SUM,", "strategy.reduce(tf.distribute.ReduceOp.MEAN,"),
        ],
        ("towers:", "mirrored:"),
    ),
}


@pytest.mark.parametrize("mistakes", sorted(MORE_MISTAKES))
def test_the_quick_check_names_more_mistakes(tmp_path, mistakes):
    edits, (towers_words, mirrored_words) = MORE_MISTAKES[mistakes]
    text = SOLUTION.read_text()
    for old, new in edits:
        assert text.count(old) == 1, f"the solution no longer holds {old!r}: update the crafted mistake"
        text = text.replace(old, new)
    bad = tmp_path / "towers_mistakes.py"
    bad.write_text(text)
    problems = towers_runs.check_steps(bad)
    assert len(problems) == 2, problems
    assert problems[0].startswith("towers:") and towers_words in problems[0], problems
    assert problems[1].startswith("mirrored:") and mirrored_words in problems[1], problems


def test_the_quick_check_passes_the_solution_and_names_each_mistake(tmp_path):
    """Exercises 2 and 3 checked in seconds, before any AlexNet run: the solution passes; a
    towers step that sums the gradients and a mirrored step that scales each replica's loss by
    its own batch (not the global one) are both named, in one run of the check."""
    text = SOLUTION.read_text()
    for old in ("tf.add_n(grads) / len(grads)", "global_batch_size=global_batch_size)"):
        assert old in text, old
    bad = tmp_path / "towers_two_mistakes.py"
    bad.write_text(
        text.replace("tf.add_n(grads) / len(grads)", "tf.add_n(grads)").replace(
            "global_batch_size=global_batch_size)", "global_batch_size=global_batch_size // 2)"
        )
    )
    before = _children()
    assert towers_runs.check_steps(SOLUTION) == []
    problems = towers_runs.check_steps(bad)
    assert len(problems) == 2, problems
    assert problems[0].startswith("towers:") and "mean over the towers" in problems[0], problems
    assert problems[1].startswith("mirrored:") and "GLOBAL batch" in problems[1], problems
    assert _children() <= before
