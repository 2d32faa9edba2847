"""The mutation check (issue 51): the visible tests a student runs catch what the hidden tests
catch. For each exercise and prediction, crafted wrong solutions, each the instructor's solution
with one typical mistake (``(old, new)`` edits of the solution cell), must each fail the
exercise's *visible* checks (the part of its test cells a release shows, and its cells tagged
``check``) with a message that names the mistake (``words``, a regex). The instructor's own
solution passes the same checks, and a prediction that is a constant fails the hidden tests too.

The checks run here as in the notebook, on stand-in runs where they read the student's own (the
figures a CI run of the lab measured): a mistake caught by a prediction's comparison with a run
is caught against those figures. Checks that build a TensorFlow graph or start processes do so,
as the notebook does (a few seconds each).

Exercises whose visible check is one library call that starts processes keep their crafted mistakes
beside that function's own tests: Lab 4's ring (``check_ring``: ``BAD_RINGS``) and Horovod script
(``check_hvd_script``: ``HVD_MISTAKES``) in tests/process/test_allreduce.py, Lab 5's towers and
mirrored steps (``check_steps``) in tests/process/test_towers.py.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pandas as pd
import pytest

from lab_utils.grading import check_prediction, check_replay, hand_in
from lab_utils.training.student import load_student

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "grading" / "source"
HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS\n.*", re.S | re.M)
VISIBLE = re.compile(r".*?^[ \t]*### BEGIN HIDDEN TESTS\n", re.S | re.M)


@dataclass(frozen=True)
class Mutant:
    solution: str  # grade_id of the solution cell
    name: str  # the mistake, in a few words
    edits: tuple[tuple[str, str], ...]  # (old, new) in the solution cell's source
    words: str  # what the failing visible check's message says (a regex)


@dataclass(frozen=True)
class Lab:
    name: str
    namespace: Callable[[], dict]  # the notebook's names the checks use, stand-in runs included
    checks: dict[str, list[str]]  # solution -> the cells checking it: test grade_ids, or "check:<text>"
    before: dict[str, list[str]] = field(default_factory=dict)  # solution -> solution cells it needs first
    mutants: list[Mutant] = field(default_factory=list)
    constants: dict[str, tuple[str, str]] = field(default_factory=dict)  # prediction -> (old, new): a constant


def _cells(lab: str) -> list[nbformat.NotebookNode]:
    return nbformat.read(SOURCE / lab / f"{lab}.ipynb", as_version=4).cells


def _by_id(lab: str) -> dict[str, nbformat.NotebookNode]:
    return {c.metadata["nbgrader"]["grade_id"]: c for c in _cells(lab) if "nbgrader" in c.metadata}


def _check_source(lab: str, ref: str) -> str:
    """The visible part of a test cell (by grade_id), or a ``check`` cell (``check:<its first words>``)."""
    if ref.startswith("check:"):
        found = [
            c.source for c in _cells(lab) if c.source.startswith(ref[6:]) and "check" in c.metadata.get("tags", [])
        ]
        assert len(found) == 1, f"{lab}: no single check cell starting {ref[6:]!r}"
        return found[0]
    return HIDDEN.sub("", _by_id(lab)[ref].source)


def _run(source: str, ns: dict, where: Path) -> None:
    """One cell: a ``%%writefile NAME`` cell writes NAME in ``where``; any other runs in ``ns``."""
    if source.startswith("%%writefile"):
        first, _, body = source.partition("\n")
        (where / first.split()[-1]).write_text(body)
        return
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(source, "<cell>", "exec"), ns)  # noqa: S102 (the course's own notebook cells)


def _mutated(source: str, mutant: Mutant) -> str:
    for old, new in mutant.edits:
        assert source.count(old) == 1, f"{mutant.name}: {old!r} is not once in {mutant.solution}"
        source = source.replace(old, new)
    return source


def _prepare(lab: Lab, solution: str, source: str, tmp_path: Path, monkeypatch) -> dict:
    """A fresh namespace and folder with ``solution``'s cell (as ``source``) and what it needs run."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in ("train_sync", "train_async", "compressors", "towers"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    ns = lab.namespace()
    cells = _by_id(lab.name)
    for needed in lab.before.get(solution, []):
        _run(cells[needed].source, ns, tmp_path)
    _run(source, ns, tmp_path)
    return ns


def _visible(lab: Lab, solution: str, source: str, tmp_path: Path, monkeypatch) -> None:
    ns = _prepare(lab, solution, source, tmp_path, monkeypatch)
    for ref in lab.checks[solution]:
        _run(_check_source(lab.name, ref), ns, tmp_path)


def _stand_in_run(**figures) -> SimpleNamespace:
    """A finished run as a test cell reads it: its attributes, and methods returning figures."""
    methods = {
        k: (lambda v=v: v) for k, v in figures.items() if k.endswith(("_per_global_step", "_table")) or k == "timeline"
    }
    plain = {k: v for k, v in figures.items() if k not in methods}
    return SimpleNamespace(**plain, **methods)


class _Measured:
    """A second run's timeline as a what-if test reads it: only its measured median steps."""

    def __init__(self, **steps):
        self.steps = steps

    def what_if(self, *args, **kwargs):
        assert not args and not kwargs, "a stand-in second run is measured, not replayed"
        return pd.DataFrame({"measured step (s)": self.steps}).rename_axis("task")


def _shipped(name: str):
    from lab_utils import reference_runs

    return reference_runs.timeline(name)


def _base() -> dict:
    from lab_utils import reference_runs

    return {
        "math": math,
        "np": np,
        "pd": pd,
        "reference_runs": reference_runs,
        "check_prediction": check_prediction,
        "check_replay": check_replay,
        "load_student": load_student,
        "hand_in": hand_in,
        "record": lambda **figures: None,
        "display": lambda *objects: None,
    }


# ---------------------------------------------------------------------- Lab 1
@functools.cache
def _lab1_base() -> dict:
    """Lab 1's parameters (as CI passes them: the offline sample) and setup cell, run once: TensorFlow
    is imported here, as the notebook's kernel does."""
    ns = _base()
    cells = _by_id("01_single_node")
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(cells["parameters"].source, "<parameters>", "exec"), ns)  # noqa: S102
        ns.update(OFFLINE=True, SWEEP_BATCH_SIZES=[10, 30, 60, 120])
        exec(compile(cells["setup"].source, "<setup>", "exec"), ns)  # noqa: S102
    return ns


def _lab1() -> dict:
    ns = dict(_lab1_base())
    ns["sweep"] = pd.DataFrame({"batch_size": ns["SWEEP_BATCH_SIZES"]})  # the sweep's table, as the long run leaves it
    return ns


_GRAPH = ["model_loss", "train_step", "build_graph"]
LAB1 = Lab(
    "01_single_node",
    _lab1,
    checks={
        "model_loss": ["test_model_loss"],
        "train_step": ["test_train_step"],
        "evaluate": ["test_evaluate"],
        "throughput": ["test_throughput"],
        "sweep": ["check:# Check Exercise 5 here", "test_sweep"],
        "q2_readings": ["test_fastest_to_target", "test_time_from_rates"],
    },
    before={
        "train_step": ["model_loss", "build_graph"],
        "evaluate": _GRAPH,
        "sweep": [*_GRAPH, "evaluate"],
    },
    mutants=[
        Mutant(
            "model_loss",
            "random initial weights",
            (
                (
                    '"W", [dim, num_classes], tf.float32, initializer=v1.zeros_initializer()',
                    '"W", [dim, num_classes], tf.float32',
                ),
            ),
            r"log\(10\)",
        ),
        Mutant(
            "model_loss",
            "softmax, not its log",
            (("targets * tf.nn.log_softmax(logits)", "targets * tf.nn.softmax(logits)"),),
            r"log\(10\)",
        ),
        Mutant(
            "model_loss",
            "the sum over the batch",
            (("return tf.reduce_mean(-tf.reduce_sum(targets", "return tf.reduce_sum(-tf.reduce_sum(targets"),),
            "averaged over the batch|mean over the batch",
        ),
        Mutant(
            "model_loss",
            "no bias",
            (
                (
                    "-tf.reduce_sum(targets * tf.nn.log_softmax(logits), axis=1)",
                    "-tf.reduce_mean(targets * tf.nn.log_softmax(logits), axis=1)",
                ),
            ),
            r"log\(10\)",
        ),
        Mutant(
            "model_loss",
            "the log of the softmax",
            (("targets * tf.nn.log_softmax(logits)", "targets * tf.math.log(tf.nn.softmax(logits))"),),
            "log_softmax",
        ),
        Mutant(
            "train_step",
            "the global step not incremented",
            ((".minimize(loss, global_step=global_step)", ".minimize(loss)"),),
            "increment the global step",
        ),
        Mutant(
            "train_step",
            "no shuffle",
            (("    order = rng.permutation(len(x))", "    order = np.arange(len(x))"),),
            "shuffle",
        ),
        Mutant(
            "train_step",
            "the last partial batch dropped",
            (
                (
                    "for start in range(0, len(x), batch_size):",
                    "for start in range(0, len(x) - batch_size + 1, batch_size):",
                ),
            ),
            "exactly once",
        ),
        Mutant(
            "train_step",
            "ascent, not descent",
            (("GradientDescentOptimizer(learning_rate)", "GradientDescentOptimizer(-learning_rate)"),),
            "lower that batch's loss",
        ),
        Mutant(
            "evaluate",
            "the unweighted mean of the batches",
            (
                (
                    "correct += sess.run(g.accuracy, {g.x: xb, g.y: yb}) * len(xb)",
                    "correct += sess.run(g.accuracy, {g.x: xb, g.y: yb})",
                ),
                ("return float(correct / len(x))", "return float(correct / -(-len(x) // batch_size))"),
            ),
            "weight each batch",
        ),
        Mutant(
            "evaluate",
            "the first batch only",
            (("    return float(correct / len(x))", "        break\n    return float(correct / len(xb))"),),
            r"should score|weight each batch|one batch",
        ),
        Mutant(
            "evaluate",
            "a NumPy float64",
            (("return float(correct / len(x))", "return np.float64(correct / len(x))"),),
            "Python float",
        ),
        Mutant(
            "evaluate",
            "a NumPy float",
            (("return float(correct / len(x))", "return np.float32(correct / len(x))"),),
            "Python float",
        ),
        Mutant(
            "throughput",
            "the warm-up timed",
            (
                ("    start = time.perf_counter()\n    for _ in range(steps):", "    for _ in range(steps):"),
                (
                    "    for _ in range(warmup_steps):\n        step()",
                    "    start = time.perf_counter()\n    for _ in range(warmup_steps):\n        step()",
                ),
            ),
            "warm-up",
        ),
        Mutant(
            "throughput",
            "the whole set each step",
            (("sess.run(g.train_op, {g.x: x[idx], g.y: y[idx]})", "sess.run(g.train_op, {g.x: x, g.y: y})"),),
            "batch_size=32",
        ),
        Mutant(
            "throughput",
            "the warm-up's examples counted",
            (("return float(steps * batch_size /", "return float((steps + warmup_steps) * batch_size /"),),
            "faster than possible",
        ),
        Mutant(
            "throughput", "no warm-up at all", (("    for _ in range(warmup_steps):\n        step()\n", ""),), "warm-up"
        ),
        Mutant(
            "sweep",
            "never stops at the target",
            (
                (
                    "                        break\n            if not np.isnan(reached_s):\n                break",
                    "                        pass\n            if False:\n                break",
                ),
            ),
            "stop",
        ),
        Mutant(
            "sweep",
            "0, not nan, when never reached",
            (('reached_s = reached_examples = float("nan")', "reached_s = reached_examples = 0.0"),),
            "nan",
        ),
        Mutant(
            "sweep",
            "the examples counted to the next evaluation",
            (
                (
                    "reached_s, reached_examples = seconds, float(seen)",
                    "reached_s, reached_examples = seconds, float(next_eval)",
                ),
            ),
            "stop at the evaluation",
        ),
        Mutant(
            "q2_readings",
            "the slowest",
            (('reached["time_to_accuracy_s"].idxmin()', 'reached["time_to_accuracy_s"].idxmax()'),),
            "least time",
        ),
        Mutant(
            "q2_readings",
            "a NumPy integer",
            (
                (
                    'return int(reached.loc[reached["time_to_accuracy_s"].idxmin(), "batch_size"])',
                    'return reached.loc[reached["time_to_accuracy_s"].idxmin(), "batch_size"]',
                ),
            ),
            "least time",
        ),
        Mutant(
            "q2_readings",
            "the rate upside down",
            (
                (
                    '(sweep["examples_to_accuracy"] / sweep["examples_per_sec"])',
                    '(sweep["examples_per_sec"] / sweep["examples_to_accuracy"])',
                ),
            ),
            "examples to accuracy / examples per second",
        ),
        Mutant(
            "q2_readings",
            "indexed by row",
            (('index=sweep["batch_size"].to_numpy()', "index=sweep.index"),),
            "by batch size",
        ),
    ],
)


# ---------------------------------------------------------------------- Lab 2
def _lab2() -> dict:
    from lab_utils.training.ps import runs as ps_runs

    def dstat(mb):
        return pd.DataFrame({"Total Write (MB)": [mb]}, index=["total"])

    workers = pd.DataFrame(
        {"train time (s)": [0.30, 0.31], "local steps": [120, 6], "staleness mean": [0.05, 19.0]},
        index=pd.Index(["worker:0 (chief)", "worker:1"], name="task"),
    )
    # the straggler's run: worker:1 sleeps 50 ms a step and updates every 52.5 ms, worker:0 every 2.5 ms between
    slow = [i * 0.0525 for i in range(6)]
    fast = [0.001 + i * 0.0025 for i in range(106)]
    events = pd.DataFrame(
        [{"time": 100 + t, "task": "worker:1"} for t in slow] + [{"time": 100 + t, "task": "worker:0"} for t in fast]
    )
    sleeps = [SimpleNamespace(task="worker:1", name="straggler delay", seconds=0.05) for _ in slow]
    # the CI run: 4,000 examples, batch 60, 2 epochs: 134 updates of 62,800 bytes (8.4 MB), measured 8.9 MB
    return {
        **_base(),
        "ps_runs": ps_runs,
        "json": __import__("json"),
        "N_PARAMS": 7850,
        "N_TRAIN": 4000,
        "BATCH_SIZE": 60,
        "EPOCHS": 2,
        "STRAGGLER_DELAY": 0.05,
        "runs": {1: _stand_in_run(dstat_table=dstat(8.5)), 2: _stand_in_run(dstat_table=dstat(8.9))},
        "straggler_run": _stand_in_run(workers_table=workers, events=events, timeline=SimpleNamespace(parts=sleeps)),
    }


LAB2 = Lab(
    "02_ps_async",
    _lab2,
    checks={
        "two_tasks": ["test_two_tasks"],
        "train_async": ["test_build_graph"],
        "expected_steps": ["test_expected_steps"],
        "predict_run_bytes": ["test_predict_run_bytes", "test_run_bytes_measured"],
        "staleness": ["check:# Check Exercise 3", "test_staleness"],
        "predict_staleness": ["test_predict_staleness", "test_staleness_measured"],
    },
    before={"predict_run_bytes": ["expected_steps"]},
    mutants=[
        Mutant(
            "two_tasks",
            "one PS task only",
            (('return {"ps": ps_hosts.split(","), ', 'return {"ps": [ps_hosts], '),),
            "two PS tasks",
        ),
        Mutant(
            "two_tasks",
            "the hosts sorted",
            (('"worker": worker_hosts.split(",")}', '"worker": sorted(worker_hosts.split(","), reverse=True)}'),),
            "order",
        ),
        Mutant(
            "two_tasks",
            "the task's index as text",
            (('"index": index}}', '"index": str(index)}}'),),
            r"'index': '0'",
        ),
        Mutant(
            "train_async",
            "every variable on the first PS",
            (
                (
                    'with v1.device(v1.train.replica_device_setter(\n            worker_device=f"/job:worker/task:{task.index}", cluster=task.cluster)):',
                    'with v1.device("/job:ps/task:0"):',
                ),
            ),
            r"spread over both|computes on worker|device",
        ),
        Mutant(
            "train_async",
            "the global step not incremented",
            (("optimizer.minimize(loss, global_step=global_step)", "optimizer.minimize(loss)"),),
            "increment global_step",
        ),
        Mutant(
            "train_async",
            "the worker device forgotten",
            (('worker_device=f"/job:worker/task:{task.index}", ', ""),),
            r"computes|worker 1",
        ),
        Mutant(
            "expected_steps",
            "the whole run rounded, not each epoch",
            (
                (
                    "max(1, math.ceil(epochs * math.ceil(n_train / batch_size)))",
                    "max(1, math.ceil(epochs * n_train / batch_size))",
                ),
            ),
            "two epochs of 4 steps",
        ),
        Mutant(
            "expected_steps",
            "rounded down",
            (("math.ceil(n_train / batch_size)", "n_train // batch_size"),),
            "round up",
        ),
        Mutant(
            "expected_steps",
            "fractions of steps",
            (
                (
                    "max(1, math.ceil(epochs * math.ceil(n_train / batch_size)))",
                    "max(1, epochs * math.ceil(n_train / batch_size))",
                ),
            ),
            "whole steps",
        ),
        Mutant(
            "expected_steps",
            "no step at all",
            (
                (
                    "max(1, math.ceil(epochs * math.ceil(n_train / batch_size)))",
                    "math.floor(epochs * math.ceil(n_train / batch_size))",
                ),
            ),
            "whole steps|at least one",
        ),
        Mutant("predict_run_bytes", "the pull forgotten", (("* 2 * 4 * n_params", "* 4 * n_params"),), "both ways"),
        Mutant(
            "predict_run_bytes",
            "steps rounded down",
            (("expected_global_steps(n_train, batch_size, epochs)", "(epochs * n_train // batch_size)"),),
            "partial batch",
        ),
        Mutant(
            "predict_run_bytes", "8-byte floats", (("* 2 * 4 * n_params", "* 2 * 8 * n_params"),), "your run measured"
        ),
        Mutant(
            "predict_run_bytes",
            "a constant",
            (("return float(expected_global_steps(n_train, batch_size, epochs) * 2 * 4 * n_params)", "return 8.4e6"),),
            "twice the parameters",
        ),
        Mutant(
            "staleness", "negative values kept", (("max(0, int(b) - int(a) - 1)", "int(b) - int(a) - 1"),), "negative"
        ),
        Mutant(
            "staleness",
            "the gap, not the updates between",
            (("max(0, int(b) - int(a) - 1)", "max(0, int(b) - int(a))"),),
            r"staleness|\[0, 3, 0, 0\]|\[0, 2, 0\]",
        ),
        Mutant(
            "staleness",
            "by label, not by position",
            (("steps = list(steps_after)", "steps = [steps_after[i] for i in range(len(steps_after))]"),),
            "position|Series|KeyError",
        ),
        Mutant("predict_staleness", "the other workers forgotten", (("(workers - 1) * ", ""),), "two fast workers"),
        Mutant(
            "predict_staleness", "the delay alone", (("(step_s + delay) / step_s", "delay / step_s"),), "taking turns"
        ),
        Mutant(
            "predict_staleness",
            "a constant",
            (("return float((workers - 1) * (step_s + delay) / step_s)", "return 11.0"),),
            "taking turns",
        ),
    ],
    constants={
        "predict_run_bytes": (
            "return float(expected_global_steps(n_train, batch_size, epochs) * 2 * 4 * n_params)",
            "return 8.4e6",
        ),
        "predict_staleness": ("return float((workers - 1) * (step_s + delay) / step_s)", "return 11.0"),
    },
)


# ---------------------------------------------------------------------- Lab 3
def _lab3() -> dict:
    from lab_utils.training.ps import runs as ps_runs
    from lab_utils.training.ps.graph import COUNTER_SLOTS

    # the CI run (2 workers, offline sample): bytes and seconds per global step of the Part 2 runs,
    # and of Part 4's R = N run with a 50 ms straggler
    return {
        **_base(),
        "ps_runs": ps_runs,
        "N": 2,
        "N_PARAMS": 784 * 10 + 10,
        "COUNTER_SLOTS": COUNTER_SLOTS,
        "STRAGGLER_DELAY": 0.05,
        "async_run": _stand_in_run(
            mode="async", label="async", bytes_per_global_step=68_500.0, seconds_per_global_step=0.0026
        ),
        "sync_run": _stand_in_run(
            mode="sync", label="sync", bytes_per_global_step=173_000.0, seconds_per_global_step=0.0077
        ),
        # R = N: the shipped run (the same settings); R = N - 1: worker:0's median step in the CI run
        "backup_runs": [
            _stand_in_run(
                mode="sync", label="R=N", seconds_per_global_step=0.0586, timeline=_shipped("what_if_sync_straggler")
            ),
            _stand_in_run(mode="sync", label="R=N-1", timeline=_Measured(**{"worker:0": 0.0029, "worker:1": 0.0541})),
        ],
    }


LAB3 = Lab(
    "03_ps_sync",
    _lab3,
    checks={
        "train_sync": ["test_build_graph"],
        "check_updates": ["test_check_updates"],
        "predict_bytes": ["test_predict_bytes", "test_bytes_measured"],
        "predict_step": ["test_predict_step", "test_step_measured"],
        "predict_backups": ["test_predict_backups", "test_backups_measured"],
        "sync_ending": ["test_leave_loop", "test_device_filters"],
        "q3_readings": ["test_loglog_slope"],
    },
    before={"sync_ending": ["train_sync"]},
    mutants=[
        Mutant("train_sync", "initial tokens", (("num_tokens=0)", ")"),), "num_tokens"),
        Mutant("train_sync", "every worker the chief", (("is_chief=task.is_chief", "is_chief=False"),), "chief"),
        Mutant(
            "train_sync",
            "no backup workers: R = N always",
            (("replicas_to_aggregate=settings.replicas", "replicas_to_aggregate=settings.num_workers"),),
            "replicas_to_aggregate",
        ),
        Mutant(
            "check_updates", "backup workers held to exactly R", (("if replicas == workers:", "if True:"),), "backup"
        ),
        Mutant(
            "check_updates",
            "no upper bound with backup workers",
            (("if hi > workers:", "if False:"),),
            "3 gradients in one update from 2",
        ),
        Mutant(
            "check_updates", "no lower bound with backup workers", (("if lo < replicas:", "if False:"),), "fewer than R"
        ),
        Mutant(
            "check_updates",
            "the gradients applied not counted",
            (('if result["gradients_applied"] != replicas * updates:', "if False:"),),
            "19 gradients applied",
        ),
        Mutant(
            "check_updates",
            "the updates not counted",
            (('if updates != result["final_global_step"]:', "if False:"),),
            "not counted",
        ),
        Mutant(
            "predict_bytes",
            "the pull forgotten",
            (("pull_and_push = 2 * 4 * n_params", "pull_and_push = 4 * n_params"),),
            "both ways",
        ),
        Mutant(
            "predict_bytes",
            "a counter in async too",
            (("return float(pull_and_push)  # one worker's step", "return float(pull_and_push + 4 * counter_slots)"),),
            "no counter",
        ),
        Mutant(
            "predict_bytes",
            "sync counted as one worker's step",
            (
                (
                    "return float(workers * (pull_and_push + 4 * counter_slots))",
                    "return float(pull_and_push + 4 * counter_slots)",
                ),
            ),
            "every worker",
        ),
        Mutant(
            "predict_bytes",
            "the counter forgotten",
            (("return float(workers * (pull_and_push + 4 * counter_slots))", "return float(workers * pull_and_push)"),),
            "counter slots",
        ),
        Mutant(
            "predict_bytes",
            "8-byte floats",
            (("pull_and_push = 2 * 4 * n_params", "pull_and_push = 2 * 8 * n_params"),),
            "your run measured",
        ),
        Mutant(
            "predict_bytes",
            "a constant",
            (("    pull_and_push = 2 * 4 * n_params\n", "    return 62800.0\n"),),
            "twice the parameters",
        ),
        Mutant(
            "predict_step",
            "the delay overlapping the step",
            (("step_s + max(delays)", "max(step_s, max(delays))"),),
            "a longer step adds",
        ),
        Mutant("predict_step", "the delays added up", (("max(delays)", "sum(delays)"),), "same time"),
        Mutant(
            "predict_step", "the mean delay", (("max(delays)", "sum(delays) / len(delays)"),), "straggler's gradient"
        ),
        Mutant("predict_step", "the delay ignored", (("step_s + max(delays)", "step_s"),), "straggler's gradient"),
        Mutant(
            "predict_step", "the step itself forgotten", (("step_s + max(delays)", "max(delays)"),), "without delays"
        ),
        Mutant("predict_step", "a constant", (("float(step_s + max(delays))", "0.055"),), "without delays"),
        Mutant(
            "predict_backups",
            "R = the backups",
            (("replicas=workers - backups)", "replicas=max(backups, 1))"),),
            "no backups: the replay is the run|no longer waits",
        ),
        Mutant(
            "predict_backups",
            "the straggler's step",
            (('replay.loc["worker:0", "predicted step (s)"]', 'replay.loc["worker:1", "predicted step (s)"]'),),
            "no longer waits",
        ),
        Mutant(
            "predict_backups",
            "the run's own step",
            (('replay.loc["worker:0", "predicted step (s)"]', 'replay.loc["worker:0", "measured step (s)"]'),),
            "no longer waits",
        ),
        Mutant(
            "predict_backups",
            "the PS counted as a worker",
            (('sum(task.startswith("worker:") for task in timeline.tasks)', "len(timeline.tasks)"),),
            "no backups: the replay is the run|no longer waits|replicas",
        ),
        Mutant(
            "sync_ending",
            "1 and 0 for True and False",
            (("return token >= target", "return int(token >= target)"),),
            "True or False",
        ),
        Mutant(
            "sync_ending",
            "leaves after the target",
            (("return token >= target", "return token > target"),),
            "final update",
        ),
        Mutant(
            "sync_ending",
            "leaves a step early",
            (("return token >= target", "return token >= target - 1"),),
            "not happened yet",
        ),
        Mutant(
            "sync_ending",
            "leaves only on the target",
            (("return token >= target", "return token == target"),),
            "past the target",
        ),
        Mutant(
            "sync_ending",
            "TensorFlow's default filters",
            (('return ["/job:ps", f"/job:worker/task:{task.index}"]', "return []"),),
            "every task",
        ),
        Mutant(
            "sync_ending",
            "every worker",
            (('return ["/job:ps", f"/job:worker/task:{task.index}"]', 'return ["/job:ps", "/job:worker"]'),),
            "also lets the session talk to",
        ),
        Mutant(
            "sync_ending",
            "no PS",
            (('return ["/job:ps", f"/job:worker/task:{task.index}"]', 'return [f"/job:worker/task:{task.index}"]'),),
            "needs the PS",
        ),
        Mutant(
            "q3_readings",
            "a linear fit",
            (('np.log(table["Batch Size"].astype(float))', 'table["Batch Size"].astype(float)'),),
            "slope -1",
        ),
        Mutant(
            "q3_readings",
            "the end points",
            (
                (
                    "    slope, _ = np.polyfit(",
                    "    _t = table.sort_values('Batch Size')\n"
                    "    slope = np.log(_t['Training Loop (seconds)'].iloc[-1] / _t['Training Loop (seconds)'].iloc[0]) / "
                    "np.log(_t['Batch Size'].iloc[-1] / _t['Batch Size'].iloc[0])\n    _unused = (",
                ),
            ),
            "all four points",
        ),
        Mutant(
            "q3_readings",
            "the time ratio",
            (
                (
                    "return float(slope)",
                    "return float(table['Training Loop (seconds)'].iloc[-1] / table['Training Loop (seconds)'].iloc[0])",
                ),
            ),
            "slope",
        ),
    ],
    constants={
        "predict_bytes": ("    pull_and_push = 2 * 4 * n_params\n", "    return 62800.0\n"),
        "predict_step": ("float(step_s + max(delays))", "0.055"),
        "predict_backups": ('float(replay.loc["worker:0", "predicted step (s)"])', "0.0029"),
    },
)


# ---------------------------------------------------------------------- Lab 4
def _lab4() -> dict:
    from lab_utils import reference_runs
    from lab_utils.cluster import netem

    # the CI run: Exercise 1's checks (2 ranks, 1000 float32: 4000 bytes each) and Part D on 100 Mbit/s links
    checks = pd.DataFrame({"np": [2], "n": [1000], "dtype": ["float32"], "bytes sent": [[4000, 4000]]})
    net = pd.DataFrame(
        {
            "mode": ["ps", "ps", "allreduce", "allreduce"],
            "workers": [1, 4, 1, 4],
            "step_s": [0.3747, 0.6745, 0.2502, 0.3444],
            "speedup": [1.0, 2.2671, 1.0, 2.9126],
            "emulated": [True] * 4,
        }
    )
    return {
        **_base(),
        "netem": netem,
        "reference_runs": reference_runs,
        "checks": checks,
        "net": net,
        "NETWORK": "emulated:100mbit",
        "NETWORK_SIZE": 0.25,
        "NETWORK_WORKERS": [1, 4],
        "PART_D": net.assign(mb=0.75, compute_s=0.25, bits=100e6),  # the cell before the tests makes it
        "PART_D_ON": "your runs",
        "FASTER": _faster(),  # the shipped runs, as where the runs are on loopback
    }


def _faster() -> dict:
    from lab_utils.training import netexp

    with contextlib.redirect_stdout(io.StringIO()):
        return netexp.faster_links(pd.DataFrame({"emulated": [False]}), "local")


LAB4 = Lab(
    "04_allreduce",
    _lab4,
    checks={
        "traffic": ["test_traffic"],
        "equivalent_runs": ["check:# Check Exercise 4 here"],
        "predict_step_time": [
            "test_predict_step_time",
            "test_predict_speedup",
            "test_step_time_measured",
            "test_speedup_measured",
        ],
        "predict_faster_links": ["test_predict_faster_links", "test_faster_links_measured"],
        "q2_readings": ["test_wait_over_reduce"],
    },
    mutants=[
        Mutant(
            "traffic",
            "the ring's two phases as one",
            (('"ring_per_rank": 2 * (n - 1) / n * nbytes', '"ring_per_rank": (n - 1) / n * nbytes'),),
            "2 ranks",
        ),
        Mutant(
            "traffic",
            "the ring without its chunks",
            (
                (
                    '"ring_per_rank": 2 * (n - 1) / n * nbytes',
                    '"ring_per_rank": 2 * (n - 1) / n * nbytes if n > 2 else nbytes if n == 2 else nbytes',
                ),
            ),
            "one rank sends nothing",
        ),
        Mutant(
            "traffic",
            "one copy from the PS",
            (('"ps_server": n * nbytes', '"ps_server": nbytes'),),
            "one copy per worker",
        ),
        Mutant(
            "traffic",
            "a worker's pull counted too",
            (('"ps_worker": nbytes', '"ps_worker": 2 * nbytes'),),
            "gradient once",
        ),
        Mutant(
            "equivalent_runs",
            "the rate not scaled",
            (('"learning_rate": learning_rate * n}\n    sync_ps', '"learning_rate": learning_rate}\n    sync_ps'),),
            "scales the learning rate",
        ),
        Mutant(
            "equivalent_runs",
            "one big batch instead of emulated ranks",
            (
                (
                    'single = {"emulate_ranks": n, "batch_size": batch_size,',
                    'single = {"emulate_ranks": 1, "batch_size": n * batch_size,',
                ),
            ),
            "emulates the 3 ranks",
        ),
        Mutant(
            "equivalent_runs",
            "backup workers",
            (('"replicas_to_aggregate": n,', '"replicas_to_aggregate": n - 1,'),),
            r"R = N",
        ),
        Mutant(
            "predict_step_time",
            "the PS one way only",
            (("compute_s + 2 * workers * once", "compute_s + workers * once"),),
            "gradient in, then the parameters out",
        ),
        Mutant(
            "predict_step_time",
            "one PS link per worker",
            (("compute_s + 2 * workers * once", "compute_s + 2 * once"),),
            "every worker's share",
        ),
        Mutant(
            "predict_step_time",
            "bytes, not bits",
            (("once = mb * 1e6 * 8 / bits_per_s", "once = mb * 1e6 / bits_per_s"),),
            "8 Mbit/s takes 1 s",
        ),
        Mutant(
            "predict_step_time",
            "the ring's whole buffer",
            (("compute_s + 2 * (workers - 1) / workers * once", "compute_s + 2 * once"),),
            "ring of one worker sends nothing",
        ),
        Mutant(
            "predict_step_time",
            "the speedup upside down",
            (("return float(workers * one / step_time(", "return float(one / workers / step_time("),),
            "4 times the work|one worker against one",
        ),
        Mutant(
            "predict_step_time",
            "the speedup without the work",
            (("return float(workers * one / step_time(", "return float(one / step_time("),),
            "4 times the work",
        ),
        Mutant(
            "q2_readings",
            "the ratio upside down",
            (
                (
                    'return float(ms["NEGOTIATE_ALLREDUCE"] / ms["ALLREDUCE"])',
                    'return float(ms["ALLREDUCE"] / ms["NEGOTIATE_ALLREDUCE"])',
                ),
            ),
            "is 6",
        ),
        Mutant(
            "q2_readings",
            "the difference, not the ratio",
            (('ms["NEGOTIATE_ALLREDUCE"] / ms["ALLREDUCE"]', 'ms["NEGOTIATE_ALLREDUCE"] - ms["ALLREDUCE"]'),),
            "is 6",
        ),
        Mutant(
            "predict_faster_links",
            "the ratio upside down",
            (("bits_now / bits_then", "bits_then / bits_now"),),
            "shorter step",
        ),
        Mutant(
            "predict_faster_links",
            "the computation faster too",
            (('{"comm": bits_now / bits_then}', '{"comm": bits_now / bits_then, "compute": bits_now / bits_then}'),),
            "computation",
        ),
        Mutant(
            "predict_faster_links",
            "the whole step scaled",
            (
                (
                    'float(replay["predicted step (s)"].median())',
                    'float(replay["measured step (s)"].median() * bits_now / bits_then)',
                ),
            ),
            "computation",
        ),
        Mutant(
            "predict_faster_links",
            "the measured step",
            (('float(replay["predicted step (s)"].median())', 'float(replay["measured step (s)"].median())'),),
            "shorter step",
        ),
        Mutant(
            "q2_readings",
            "the wrong rows",
            (('ms["NEGOTIATE_ALLREDUCE"] / ms["ALLREDUCE"]', 'ms["NEGOTIATE_ALLREDUCE"] / ms.iloc[-1]'),),
            "is 6",
        ),
    ],
    constants={
        "predict_step_time": (
            "    once = mb * 1e6 * 8 / bits_per_s",
            "    return 1.36\n    once = mb * 1e6 * 8 / bits_per_s",
        ),
        "predict_faster_links": ('float(replay["predicted step (s)"].median())', "1.1"),
    },
)


# ---------------------------------------------------------------------- Lab 5
def _lab5() -> dict:
    from lab_utils.training.towers import runs as towers_runs

    return {**_lab1_base(), "towers_runs": towers_runs}  # TensorFlow, imported once


LAB5 = Lab(
    "05_alexnet",
    _lab5,
    # Exercises 2 and 3 (make_towers_step, make_mirrored_step) are checked by towers_runs.check_steps,
    # a process of its own: their crafted mistakes are in tests/process/test_towers.py
    checks={"towers": ["check:student = towers_runs.load_student", "test_average"]},
    mutants=[
        Mutant(
            "towers",
            "the sum of the towers",
            (("tf.add_n(grads) / len(grads)", "tf.add_n(grads)"),),
            "the mean over every tower",
        ),
        Mutant(
            "towers",
            "the first tower only",
            (("tf.add_n(grads) / len(grads)", "grads[0]"),),
            "the mean over every tower",
        ),
        Mutant(
            "towers",
            "two towers whatever their number",
            (("tf.add_n(grads) / len(grads)", "tf.add_n(grads[:2]) / 2"),),
            "3 towers",
        ),
    ],
)


# ---------------------------------------------------------------------- Lab 6
def _lab6() -> dict:
    from lab_utils import simulate
    from lab_utils.training import hybrid
    from lab_utils.training.ssp import runs as ssp_runs

    toy = simulate.Params(alpha=1e-4, beta=8e-8, grad_bytes=3e6, compute_s=0.25)  # about 100 Mbit/s

    def comp(method, wire, link):
        return _stand_in_run(emulated=True, wire_bytes_per_step=wire, link_bytes_per_step=link)

    # the CI run: 2 ranks on 100 Mbit/s links, a 784-256-10 MLP; SSP with worker:1 +30 ms, 200 global steps
    hyb = pd.DataFrame(
        {
            "mode": ["ps", "allreduce", "hybrid"],
            "workers": [2, 2, 2],
            "unique_rows": [329.33] * 3,
            "worker_mb_per_step": [9.0514, 34.6513, 9.0695],
            "sparse_mb": [0.0869, 0.0, 0.0869],
            "dense_mb": [8.9375, 34.5375, 8.9375],
        }
    )
    return {
        **_base(),
        "hybrid": hybrid,
        "ssp_runs": ssp_runs,
        "N": 2,
        "W": 2,
        "SIZES": [784 * 256, 256, 256 * 10, 10],
        "TOPK_RATIO": 0.01,
        "COMPRESSION_METHODS": ["none", "fp16", "onebit", "topk"],
        "comp_runs": {
            "none": comp("none", 814120, 818189.0),
            "fp16": comp("fp16", 407060, 410489.0),
            "onebit": comp("onebit", 25458, 28969.0),
            "topk": comp("topk", 16296, 18972.0),
        },
        "SSP_STEPS": 200,
        "SSP_BOUNDS": [0, 1, "inf"],
        "STRAGGLER_DELAY": 0.03,
        "ssp_table": pd.DataFrame(
            {
                "s": ["s=0", "s=1", "s=∞"],
                "wait (s)": [3.34, 3.32, 0.19],
                "straggler extra (s/step)": [0.0334, 0.0335, 0.031],
            }
        ),
        # s = 0: the shipped run (the same settings); s = inf: worker:0's median step in the CI run
        "ssp": {
            0: _stand_in_run(timeline=_shipped("what_if_ssp_s0")),
            math.inf: _stand_in_run(timeline=_Measured(**{"worker:0": 0.0026, "worker:1": 0.0334})),
        },
        "hyb": hyb,
        "HYBRID_WORKERS": [2],
        "SEED": 0,
        "simulate": simulate,
        "params": {"slow": toy},
        "slow": "slow",
        "measured": {"slow": pd.DataFrame({"network": ["100mbit links"]})},
    }


LAB6 = Lab(
    "06_communication",
    _lab6,
    checks={
        "compressors": ["test_onebit", "test_topk"],
        "predict_wire": ["test_predict_wire", "test_wire_measured"],
        "train_ssp": ["check:# Check Exercise 3"],
        "predict_ssp_wait": ["test_predict_ssp_wait", "test_ssp_wait_measured"],
        "predict_fast_step": ["test_predict_fast_step", "test_fast_step_measured"],
        "router": ["test_route", "test_worker_bytes", "test_router_measured"],
        "shards": ["test_shards"],
    },
    mutants=[
        Mutant("compressors", "zero counted as minus", (("signs = c >= 0", "signs = c > 0"),), "zero counts as"),
        Mutant(
            "compressors",
            "the largest magnitude as the scale",
            (("np.mean(np.abs(c))", "np.max(np.abs(c))"),),
            "the mean of",
        ),
        Mutant(
            "compressors",
            "no error feedback",
            (("    c = np.asarray(grad) + np.asarray(error)\n    signs", "    c = np.asarray(grad)\n    signs"),),
            "sum\\(sent\\)|fed back",
        ),
        Mutant(
            "compressors",
            "a float64 scale",
            (
                (
                    "scale = c.dtype.type(np.mean(np.abs(c))) if c.size else c.dtype.type(0)",
                    "scale = float(np.mean(np.abs(c)))",
                ),
            ),
            "dtype",
        ),
        Mutant(
            "compressors",
            "top-k in magnitude order",
            (("indices = np.sort(np.concatenate(", "indices = (np.concatenate("),),
            "sorted ascending|ties",
        ),
        Mutant(
            "compressors",
            "top-k of the gradient alone",
            (("    c = np.asarray(grad) + np.asarray(error)\n    flat", "    c = np.asarray(grad)\n    flat"),),
            "grad \\+ error",
        ),
        Mutant(
            "compressors",
            "the error flattened",
            (("return indices, values, rest.reshape(c.shape)", "return indices, values, rest"),),
            "shape",
        ),
        Mutant(
            "shards",
            "one shard or none",
            (("for k in range(1, workers + 1):", "for k in range(1, 2):"),),
            "fewest shards",
        ),
        Mutant(
            "shards",
            "the most shards",
            (("for k in range(1, workers + 1):", "for k in range(workers, 0, -1):"),),
            "fewest shards",
        ),
        Mutant(
            "shards",
            "one shard too few tried",
            (("for k in range(1, workers + 1):", "for k in range(1, workers):"),),
            "one worker needs one shard",
        ),
        Mutant(
            "predict_wire",
            "no ring factor",
            (("return float(2 * (ranks - 1) / ranks * message)", "return float(message)"),),
            "alone sends nothing",
        ),
        Mutant(
            "predict_wire",
            "one all-gather message",
            (("return float((ranks - 1) * message)", "return float(message)"),),
            "other ranks",
        ),
        Mutant(
            "predict_wire",
            "bits not in whole bytes",
            (("sum(math.ceil(n / 8) + 4 for n in sizes)", "sum(n / 8 + 4 for n in sizes)"),),
            "whole bytes",
        ),
        Mutant(
            "predict_wire",
            "one scale for the whole gradient",
            (("sum(math.ceil(n / 8) + 4 for n in sizes)", "math.ceil(sum(sizes) / 8) + 4"),),
            "its own scale",
        ),
        Mutant(
            "predict_wire",
            "top-k of the whole gradient",
            (("sum(max(1, round(ratio * n)) for n in sizes)", "round(ratio * sum(sizes))"),),
            "every tensor",
        ),
        Mutant(
            "predict_wire",
            "a constant",
            (
                (
                    '    if method == "none":\n        message',
                    '    return 814120.0\n    if method == "none":\n        message',
                ),
            ),
            "float|nothing",
        ),
        Mutant(
            "train_ssp",
            "strictly ahead",
            (("min(clocks) >= clock - staleness", "min(clocks) > clock - staleness"),),
            "may_start",
        ),
        Mutant(
            "train_ssp",
            "the fastest, not the slowest",
            (("min(clocks) >= clock - staleness", "max(clocks) >= clock - staleness"),),
            "may_start",
        ),
        Mutant(
            "train_ssp",
            "one step too loose",
            (("min(clocks) >= clock - staleness", "min(clocks) >= clock - staleness - 1"),),
            "may_start",
        ),
        Mutant(
            "predict_ssp_wait",
            "one fast worker counted",
            (("return float((workers - 1) * straggler_steps * delay)", "return float(straggler_steps * delay)"),),
            "two fast workers",
        ),
        Mutant(
            "predict_ssp_wait",
            "every step waits",
            (("straggler_steps = max(0.0, (steps - (workers - 1) * bound) / workers)", "straggler_steps = steps"),),
            "slack|half the 100 steps",
        ),
        Mutant(
            "predict_ssp_wait",
            "the bound ignored",
            (("(steps - (workers - 1) * bound) / workers", "steps / workers"),),
            "one step of slack",
        ),
        Mutant(
            "predict_ssp_wait",
            "one bound for all the fast workers",
            (("(steps - (workers - 1) * bound) / workers", "(steps - bound) / workers"),),
            "28 of the 90",
        ),
        Mutant(
            "predict_ssp_wait",
            "the straggler's share of two workers",
            (("(steps - (workers - 1) * bound) / workers", "(steps - (workers - 1) * bound) / 2"),),
            "a third",
        ),
        Mutant(
            "router",
            "sparse always to the PS",
            (
                (
                    'return "ps" if through_ps < variable_bytes(variable, "allreduce", workers) else "allreduce"',
                    'return "ps"',
                ),
            ),
            "small table",
        ),
        Mutant(
            "router",
            "everything through the ring",
            (
                (
                    '    if variable["rows_touched"] is None:\n        return "allreduce"\n    through_ps',
                    '    return "allreduce"\n    through_ps',
                ),
            ),
            "300 rows",
        ),
        Mutant(
            "router",
            "sent, not received",
            (
                (
                    "return 2 * 2 * (workers - 1) / workers * full",
                    "return 2 * (workers - 1) / workers * full",
                ),
            ),
            "each way|sends and receives",
        ),
        Mutant(
            "predict_fast_step",
            "the bound ignored",
            (("staleness=bound)", "staleness=0)"),),
            "no longer waits",
        ),
        Mutant(
            "predict_fast_step",
            "the straggler's step",
            (("replay.drop(index=straggler)", "replay.loc[[straggler]]"),),
            "the replay is the run|no longer waits",
        ),
        Mutant(
            "predict_fast_step",
            "the run's own step",
            (('["predicted step (s)"].median()', '["measured step (s)"].median()'),),
            "no longer waits",
        ),
        Mutant(
            "router",
            "the ids forgotten",
            (('return variable["rows_touched"] * (2 * 4 + 2 * row)', 'return variable["rows_touched"] * 2 * row'),),
            "ids twice",
        ),
    ],
    constants={
        "predict_wire": (
            '    if method == "none":\n        message',
            '    return 814120.0\n    if method == "none":\n        message',
        ),
        "predict_ssp_wait": (
            "    if bound == math.inf or workers < 2:\n",
            "    return 3.0\n    if bound == math.inf or workers < 2:\n",
        ),
        "predict_fast_step": ('float(replay.drop(index=straggler)["predicted step (s)"].median())', "0.0026"),
    },
)


# ---------------------------------------------------------------------- Lab 7
def _timed_run(label: str, step_s: float, tasks: int = 2, **figures) -> SimpleNamespace:
    """A Part B or D run as ``choice.step_seconds`` reads it: each task's steps, ``step_s`` each."""
    events = pd.DataFrame(
        [
            {"task": f"rank:{t}", "step": s, "started": 100 + s * step_s, "time": 100 + (s + 1) * step_s}
            for t in range(tasks)
            for s in range(1, 7)
        ]
    )
    return SimpleNamespace(label=label, events=events, **figures)


def _lab7() -> dict:
    from lab_utils.training.modelpar import choice_runs as choice
    from lab_utils.training.modelpar import shard_bounds

    ns = _base()
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(_by_id("07_model_parallel")["parameters"].source, "<parameters>", "exec"), ns)  # noqa: S102
    # the CI run's sizes (labs/params.yml): 2 ranks, an MLP of 0.27 M parameters, 2-stage pipelines
    ns.update(ZERO_STEPS=20, ZERO_HIDDEN=256, TP_BATCHES=[64, 4096], PIPE_STAGES=[2], PIPE_STEPS=3, E_STEPS=6)
    n_ranks, params = ns["NP"], 784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10

    def ring_bytes(n, itemsize, skip):  # what each rank sends: every shard but the one `skip` names
        lengths = [hi - lo for lo, hi in shard_bounds(n, n_ranks)]
        return [(n - lengths[skip(r) % n_ranks]) * itemsize for r in range(n_ranks)]

    rows = []
    for op in ("reduce_scatter", "all_gather", "all_reduce"):
        for dtype, itemsize in (("int64", 8), ("float32", 4)):
            for n in ns["COLLECTIVE_SIZES"]:
                rs, ag = ring_bytes(n, itemsize, lambda r: r), ring_bytes(n, itemsize, lambda r: r + 1)
                sent = {
                    "reduce_scatter": rs,
                    "all_gather": ag,
                    "all_reduce": [a + b for a, b in zip(rs, ag, strict=True)],
                }[op]
                rows.append({"operation": op, "n": n, "dtype": dtype, "ok": True, "problem": "", "bytes sent": sent})
    coll = pd.DataFrame(rows)
    d, f = ns["TP_D"], ns["TP_F"]
    tp = pd.DataFrame(
        [
            {
                "batch": b,
                "ok": True,
                "problem": "",
                "max rel error": 2.4e-7,
                "forward bytes": [b * d * 4] * n_ranks,  # on 2 ranks: one all-reduce sends half of it twice
                "bytes sent": [2 * b * d * 4] * n_ranks,
                "data-parallel bytes": [2 * d * f * 4] * n_ranks,
            }
            for b in ns["TP_BATCHES"]
        ]
    )
    # Part B's runs: the bytes each stage kept (12, 8 and 6 per parameter on 2 ranks)
    zero = {
        s: SimpleNamespace(
            label=("plain DP" if s == 0 else f"stage {s}") + f", {n_ranks} ranks",
            stage=s,
            params=params,
            state_bytes=lambda kept=kept: float(kept * params),
            result={"rss_peak_bytes": [612e6, 608e6], "rss_steps_bytes": [300e6, 296e6]},
        )
        for s, kept in ((0, 12), (1, 8), (2, 6))
    }
    zero_weights = pd.DataFrame(
        {"stage": [1, 2], "relative to the largest weight": [1.7e-7, 1.7e-7]},
        index=pd.Index([zero[1].label, zero[2].label], name="run"),
    )
    # Part D's pipelines (2 stages, 0.4 s a pass): the bubble each run's timeline showed
    pipes = [SimpleNamespace(label=f"p=2, m={m}", stages=2, micro_batches=m) for m in ns["PIPE_MICRO_BATCHES"]]
    pipe_table = pd.DataFrame(
        {
            "stages": 2,
            "micro-batches": ns["PIPE_MICRO_BATCHES"],
            "bubble (mean of stages)": [0.502, 0.338, 0.206, 0.118],
            "weights vs reference (max rel)": 1.2e-7,
        },
        index=pd.Index([r.label for r in pipes], name="run"),
    )
    # Part E: the MLP on 2 emulated hosts behind 100 Mbit/s (a ring step moved about 47 Mbit/s), and the
    # pipeline of 2 stages and 4 micro-batches on loopback (1.6 s of compute: 5 slots of 0.1 s each way)
    link = dict(alpha=3e-4, beta=8 / 47e6)
    e_cases = [
        ("data", choice.Setting(params=params, ranks=2, compute_s=0.008, **link), _timed_run("plain DP", 0.193)),
        ("zero2", choice.Setting(params=params, ranks=2, compute_s=0.008, **link), _timed_run("stage 2", 0.197)),
        (
            "pipeline",
            choice.Setting(params=params, ranks=2, compute_s=1.6, activation_bytes=64 * 256 * 4, micro_batches=4),
            _timed_run("p=2, m=4", 1.02),
        ),
    ]
    return {
        **ns,
        "dataclasses": __import__("dataclasses"),
        "choice": choice,
        "coll": coll,
        "_sent": coll[(coll["n"] == max(ns["COLLECTIVE_SIZES"])) & (coll["dtype"] == "float32")].set_index("operation"),
        "tp": tp,
        "zero": zero,
        "zero_weights": zero_weights,
        "pipes": pipes,
        "pipe_table": pipe_table,
        "e_cases": e_cases,
    }


LAB7 = Lab(
    "07_model_parallel",
    _lab7,
    # Exercises 1 to 4 (collectives.py, zero.py, tensor.py, pipeline.py) are checked by mp_runs, on
    # processes of their own: their crafted mistakes are in tests/process/test_modelpar.py
    checks={
        "predict_half": ["test_predict_half"],
        "predict_state": ["test_predict_state", "test_zero"],
        "predict_tp": ["test_predict_tp"],
        "predict_bubble": ["test_predict_bubble"],  # after Part D's runs; test_pipeline checks GPipe's own
        "costs": ["test_costs", "test_predict_steps"],
    },
    before={"predict_tp": ["predict_half"]},
    mutants=[
        Mutant(
            "predict_half",
            "the whole vector",
            (("return float((ranks - 1) / ranks * n * itemsize)", "return float(n * itemsize)"),),
            "alone sends nothing",
        ),
        Mutant(
            "predict_half",
            "one step of the ring",
            (("(ranks - 1) / ranks * n * itemsize", "n / ranks * itemsize"),),
            "alone sends nothing",
        ),
        Mutant(
            "predict_half",
            "the whole vector at each step",
            (("(ranks - 1) / ranks * n * itemsize", "(ranks - 1) * n * itemsize"),),
            "the half it does not keep",
        ),
        Mutant(
            "predict_half",
            "an all-reduce's bytes",
            (("(ranks - 1) / ranks * n * itemsize", "2 * (ranks - 1) / ranks * n * itemsize"),),
            "the half it does not keep",
        ),
        Mutant(
            "predict_half",
            "an integer",
            (("return float((ranks - 1) / ranks * n * itemsize)", "return (ranks - 1) * n * itemsize // ranks"),),
            "return a float",
        ),
        Mutant(
            "predict_state",
            "stage 1 shards the gradient too",
            (("if stage == 2 else 4 * params", "if stage >= 1 else 4 * params"),),
            "2 the gradient too",
        ),
        Mutant(
            "predict_state",
            "stage 2 keeps the whole gradient",
            (("grad = 4 * params / ranks if stage == 2 else 4 * params", "grad = 4 * params"),),
            "2 the gradient too",
        ),
        Mutant(
            "predict_state",
            "the moments sharded in stage 2 only",
            (("if stage >= 1 else 8 * params", "if stage == 2 else 8 * params"),),
            "1 shards m and v",
        ),
        Mutant(
            "predict_state",
            "the weights counted",
            (("return float(grad + moments)", "return float(4 * params + grad + moments)"),),
            "12 bytes per parameter",
        ),
        Mutant(
            "predict_state",
            "one moment",
            (
                (
                    "moments = 8 * params / ranks if stage >= 1 else 8 * params",
                    "moments = 4 * params / ranks if stage >= 1 else 4 * params",
                ),
            ),
            "12 bytes per parameter",
        ),
        Mutant(
            "predict_state",
            "an integer",
            (("return float(grad + moments)", "return grad + moments"),),
            "return a float",
        ),
        Mutant(
            "predict_tp",
            "one all-reduce",
            (("float(2 * 2 * (ranks - 1) / ranks * batch * d * 4)", "float(2 * (ranks - 1) / ranks * batch * d * 4)"),),
            "two all-reduces",
        ),
        Mutant(
            "predict_tp",
            "no ring factor for the activations",
            (("float(2 * 2 * (ranks - 1) / ranks * batch * d * 4)", "float(2 * 2 * batch * d * 4)"),),
            "alone sends nothing",
        ),
        Mutant(
            "predict_tp",
            "one matrix's gradient",
            (("float(2 * (ranks - 1) / ranks * 2 * d * f * 4)", "float(2 * (ranks - 1) / ranks * d * f * 4)"),),
            "gradients of a and b",
        ),
        Mutant(
            "predict_tp",
            "the gradients' all-reduce as one half",
            (("float(2 * (ranks - 1) / ranks * 2 * d * f * 4)", "float((ranks - 1) / ranks * 2 * d * f * 4)"),),
            r"data-parallel bytes per rank: .*2\.00x",
        ),
        Mutant(
            "predict_tp",
            "no ring factor for the gradients",
            (("float(2 * (ranks - 1) / ranks * 2 * d * f * 4)", "float(2 * 2 * d * f * 4)"),),
            "alone sends nothing",
        ),
        Mutant(
            "predict_bubble",
            "(p - 1) / m",
            (("(micro_batches + stages - 1))", "micro_batches)"),),
            "half the time",
        ),
        Mutant(
            "predict_bubble",
            "(p - 1) / (m + p)",
            (("(micro_batches + stages - 1))", "(micro_batches + stages))"),),
            "half the time",
        ),
        Mutant(
            "predict_bubble",
            "the share a stage works",
            (("float((stages - 1) / (micro_batches", "float(micro_batches / (micro_batches"),),
            "never waits",
        ),
        Mutant(
            "predict_bubble",
            "the micro-batches ignored",
            (("(micro_batches + stages - 1))", "stages)"),),
            "more micro-batches, a smaller bubble",
        ),
        Mutant(
            "predict_bubble",
            "(p - 1) / (m p)",
            (("(micro_batches + stages - 1))", "(micro_batches * stages))"),),
            r"p=2, m=2: the bubble: you predicted 0\.25",
        ),
        Mutant(
            "costs",
            "data parallelism without the weights",
            (("return 16 * P, s.compute_s / N + ring(4 * P)", "return 12 * P, s.compute_s / N + ring(4 * P)"),),
            "weights, gradients, m and v",
        ),
        Mutant(
            "costs",
            "stage 1 shards the gradients too",
            (("return 8 * P + 8 * P / N,", "return 4 * P + 12 * P / N,"),),
            "each stage shards more",
        ),
        Mutant(
            "costs",
            "stage 2 pays one more all-gather",
            (
                (
                    "return 4 * P + 12 * P / N, s.compute_s / N + ring(4 * P)",
                    "return 4 * P + 12 * P / N, s.compute_s / N + ring(4 * P) + (N - 1) * (s.alpha + 4 * P / N * s.beta)",
                ),
            ),
            "ZeRO moves the all-reduce's bytes",
        ),
        Mutant(
            "costs",
            "the compute not shared",
            (
                ("return 16 * P, s.compute_s / N + ring(4 * P)", "return 16 * P, s.compute_s + ring(4 * P)"),
                ("return 8 * P + 8 * P / N, s.compute_s / N", "return 8 * P + 8 * P / N, s.compute_s"),
                ("return 4 * P + 12 * P / N, s.compute_s / N", "return 4 * P + 12 * P / N, s.compute_s"),
            ),
            "share the compute",
        ),
        Mutant(
            "costs",
            "one all-reduce of activations",
            (("s.allreduces * ring(s.activation_bytes)", "ring(s.activation_bytes)"),),
            "`allreduces` all-reduces",
        ),
        Mutant(
            "costs",
            "tensor parallelism holds everything",
            (("return 16 * P / N, s.compute_s / N + s.allreduces", "return 16 * P, s.compute_s / N + s.allreduces"),),
            "1/N of everything",
        ),
        Mutant(
            "costs",
            "the ring's whole buffer at each step",
            (("nbytes / N * s.beta", "nbytes * s.beta"),),
            r"seconds per step \(data\)",
        ),
        Mutant(
            "costs",
            "the ring's first half only",
            (("return 2 * (N - 1) * (s.alpha", "return (N - 1) * (s.alpha"),),
            r"seconds per step \(data\)",
        ),
        Mutant(
            "costs",
            "bits for bytes",
            (("nbytes / N * s.beta", "8 * nbytes / N * s.beta"),),
            r"seconds per step \(data\)",
        ),
        Mutant(
            "costs",
            "the pipeline without its bubble",
            (("s.compute_s / N * slots / m + sends", "s.compute_s / N + sends"),),
            "more micro-batches, a smaller bubble",
        ),
        Mutant(
            "costs",
            "each stage computes the whole model",
            (("s.compute_s / N * slots / m", "s.compute_s * slots / m"),),
            r"seconds per step \(pipeline\)",
        ),
        Mutant(
            "costs",
            "one stage sends",
            ((" if N > 1 else 0.0", ""),),
            "one rank: no messages",
        ),
    ],
    constants={
        "predict_half": ("return float((ranks - 1) / ranks * n * itemsize)", "return 200000.0"),
        "predict_state": ("    grad = 4 * params / ranks", "    return 1200.0\n    grad = 4 * params / ranks"),
        "predict_tp": ("return float(2 * (ranks - 1) / ranks * 2 * d * f * 4)", "return 2097152.0"),
        "predict_bubble": ("return float((stages - 1) / (micro_batches + stages - 1))", "return 0.2"),
        "costs": ("    P, N = s.params, s.ranks\n", "    return 16000.0, 0.25\n    P, N = s.params, s.ranks\n"),
    },
)


LABS = [LAB1, LAB2, LAB3, LAB4, LAB5, LAB6, LAB7]
SOLUTIONS = [(lab, s) for lab in LABS for s in lab.checks]
MUTANTS = [(lab, m) for lab in LABS for m in lab.mutants]
CONSTANTS = [(lab, s) for lab in LABS for s in lab.constants]


@pytest.mark.parametrize(("lab", "solution"), SOLUTIONS, ids=[f"{lab.name[:2]} {s}" for lab, s in SOLUTIONS])
def test_the_solutions_pass_their_visible_checks(lab, solution, tmp_path, monkeypatch):
    _visible(lab, solution, _by_id(lab.name)[solution].source, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("lab", "mutant"), MUTANTS, ids=[f"{lab.name[:2]} {m.solution}: {m.name}" for lab, m in MUTANTS]
)
def test_the_visible_checks_catch_each_mistake(lab, mutant, tmp_path, monkeypatch):
    source = _mutated(_by_id(lab.name)[mutant.solution].source, mutant)
    with pytest.raises((AssertionError, KeyError, TypeError, ValueError)) as caught:
        _visible(lab, mutant.solution, source, tmp_path, monkeypatch)
    assert re.search(mutant.words, str(caught.value)), f"{mutant.name}: caught, but the message says {caught.value}"


@pytest.mark.parametrize(("lab", "solution"), CONSTANTS, ids=[f"{lab.name[:2]} {s}" for lab, s in CONSTANTS])
def test_a_constant_prediction_fails_the_hidden_tests(lab, solution, tmp_path, monkeypatch):
    """The hidden part, run as the grader would judge it, on a prediction that ignores its arguments
    (the visible asserts removed first, so that only the hidden ones can catch it)."""
    old, new = lab.constants[solution]
    source = _mutated(_by_id(lab.name)[solution].source, Mutant(solution, "a constant", ((old, new),), ""))
    ns = _prepare(lab, solution, source, tmp_path, monkeypatch)
    ns["check_prediction"] = lambda *args, **kwargs: 1.0  # the visible comparisons, out of the way
    ns["check_replay"] = lambda *args, **kwargs: 0.0
    for ref in lab.checks[solution]:
        if ref.startswith("check:"):
            continue
        cell = _by_id(lab.name)[ref].source
        visible, hidden = VISIBLE.match(cell)[0], cell[VISIBLE.match(cell).end() :]
        with pytest.raises(AssertionError):
            _run(_without_asserts(visible) + "\n" + hidden, ns, tmp_path)
        return
    raise AssertionError(f"{solution}: no test cell")


def _without_asserts(source: str) -> str:
    """``source`` with its ``assert`` statements taken out (the rest unchanged in meaning)."""

    class Drop(ast.NodeTransformer):
        def visit_Assert(self, node):
            return ast.Pass()

    return ast.unparse(Drop().visit(ast.parse(source)))


def test_every_exercise_and_prediction_has_three_crafted_mistakes():
    counts = {(lab.name, s): sum(m.solution == s for m in lab.mutants) for lab in LABS for s in lab.checks}
    assert all(n >= 3 for n in counts.values()), counts
