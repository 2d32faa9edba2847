"""Every run kind answers the same six questions (lab_utils.training.runs.ANSWERS), built here
from made-up results: what tables and notebooks read, and nothing else."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab_utils.training.compression.runs import CompressionRun
from lab_utils.training.modelpar.runs import PipelineRun, ZeroRun
from lab_utils.training.ps.demo_runs import TaskOutcome, WatchedRun
from lab_utils.training.ps.runs import PSRun
from lab_utils.training.ps.strategy.runs import StrategyRun
from lab_utils.training.runs import ANSWERS, RanksRun, Run, TrainRun
from lab_utils.training.tables import scaling_table
from lab_utils.training.towers.runs import DeviceRun

NAN = float("nan")


class _Monitor:
    """A monitor whose run wrote ``written`` bytes in all."""

    def __init__(self, written: float):
        self.written = written

    def summary(self) -> pd.DataFrame:
        return pd.DataFrame({"Network W": [self.written]}, index=["total"])


def _events(task_times: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        {"time": t, "task": task, "step": i + 1, "examples": 0}
        for task, times in task_times.items()
        for i, t in enumerate(times)
    ]
    return pd.DataFrame(rows)


def _rank(accuracy=None, **more) -> dict:
    out = {"train_time": 2.0, "local_steps": 40, "steps": 41, "examples": 4000, "batch_size": 100}
    if accuracy is not None:
        out["accuracy"] = accuracy
    return {**out, **more}


def _ps() -> PSRun:
    worker = {"mode": "sync", "train_time": 3.0, "final_global_step": 60, "examples": 3000, "batch_size": 50}
    results = {"worker:0": {**worker, "accuracy": 0.91}, "worker:1": dict(worker), "worker:2": dict(worker)}
    return PSRun(results, started=0.0, label="sync PS", monitor=_Monitor(6_000_000.0))


def _train() -> TrainRun:
    results = {"rank:0": _rank(0.9), "rank:1": _rank()}
    return TrainRun("horovod (gloo)", 2, results, label="hvd", monitor=_Monitor(4_100_000.0))


def _compression() -> CompressionRun:
    results = {"rank:0": _rank(0.88, bytes_per_step=1000), "rank:1": _rank(bytes_per_step=1000)}
    return CompressionRun(
        "horovod (gloo)", 2, results, label="topk", compression="topk", emulated=True, link_bytes_per_step=1500.0
    )


def _device() -> DeviceRun:
    result = {"train_time": 4.0, "local_steps": 20, "examples": 2560, "batch_size": 64, "global_batch": 128}
    return DeviceRun("towers", 2, result, label="towers x2")


def _strategy() -> StrategyRun:
    result = {"num_workers": 2, "accuracy": 0.87, "examples_per_sec": 900.0, "train_time": 5.0, "steps_scheduled": 200}
    return StrategyRun(result=result, steps=pd.DataFrame(), wall_time=9.0)


def _watched() -> WatchedRun:
    chief = TaskOutcome("worker:0", 0, phase={"phase": "training", "mode": "sync", "time": 1.0})
    tasks = {"ps:0": TaskOutcome("ps:0", None), "worker:0": chief, "worker:1": TaskOutcome("worker:1", 0)}
    return WatchedRun(
        label="hang", tasks=tasks, target=10, deadline=5.0, launched=0.0, ready_after=1.0, watched_for=4.0
    )


def _ranks() -> RanksRun:
    row = {"mode": "allreduce", "workers": 4, "network": "100mbit links", "step_s": 1.25, "examples_per_s": 204.8}
    return RanksRun(label="ring x4", row=row, sent_per_step=7.5e6)


def _zero() -> ZeroRun:
    result = {"params": 1000, "accuracy": 0.8, "bytes_sent": [3000, 3000], "state_bytes": [8000, 8000]}
    return ZeroRun(
        label="stage 1",
        events=_events({"rank:0": [0.0, 0.5, 0.7, 0.9, 1.1], "rank:1": [0.0, 0.4, 0.7, 1.0, 1.3]}),
        args={"batch_size": 32, "steps": 5},
        stage=1,
        ranks=2,
        result=result,
        weights_path="/nowhere",
    )


def _pipeline() -> PipelineRun:
    return PipelineRun(
        label="p=2, m=4",
        events=_events({"rank:0": [0.0, 1.0, 1.5, 2.0], "rank:1": [0.0, 1.0, 1.25, 1.5]}),
        args={"batch_size": 64, "steps": 4},
        stages=2,
        micro_batches=4,
        results={},
        weights_dir="/nowhere",
    )


# kind -> (run, its six answers); bytes_per_step None: the run counted none (a ValueError says why)
CASES = {
    "PSRun": (_ps, (3, "PS (sync)", 0.91, 3 * 3000 / 3.0, 3.0 / 60, 6_000_000.0 / 60)),
    "TrainRun": (_train, (2, "horovod (gloo)", 0.9, 8000 / 2.0, 2.0 / 40, 4_100_000.0 / 41)),
    "CompressionRun": (_compression, (2, "horovod (gloo)", 0.88, 8000 / 2.0, 2.0 / 40, 2 * 1500.0)),
    "DeviceRun": (_device, (2, "towers", NAN, 2560 / 4.0, 4.0 / 20, 0.0)),
    "StrategyRun": (_strategy, (2, "ParameterServerStrategy", 0.87, 900.0, 5.0 / 200, None)),
    "WatchedRun": (_watched, (2, "PS (sync)", NAN, NAN, NAN, None)),
    "RanksRun": (_ranks, (4, "allreduce", NAN, 204.8, 1.25, 7.5e6)),
    "ZeroRun": (_zero, (2, "ZeRO stage 1", 0.8, 2 * 32 / 0.3, 0.3, 6000 / 5)),
    "PipelineRun": (_pipeline, (2, "pipeline (GPipe)", NAN, 64 / 0.5, 0.5, None)),
}


def _same(got, want) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return got == pytest.approx(want) if isinstance(want, float) else got == want


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_run_kind_answers_the_six_questions(kind):
    make, (size, method, accuracy, eps, step_time, per_step) = CASES[kind]
    run = make()
    assert type(run).__name__ == kind and isinstance(run, Run)
    got = (run.size, run.method, run.accuracy, run.examples_per_sec, run.step_time)
    for name, value, want in zip(ANSWERS, got, (size, method, accuracy, eps, step_time), strict=False):
        assert _same(value, want), f"{kind}.{name}: {value!r}, expected {want!r}"
    if per_step is None:
        with pytest.raises(ValueError, match=run.label):
            run.bytes_per_step()
    else:
        assert run.bytes_per_step() == pytest.approx(per_step)


def test_every_run_kind_is_covered_here():
    import lab_utils.training  # noqa: F401 (every technique package: their runs are Run's subclasses)

    kinds, todo = set(), [Run]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("lab_utils."):
                kinds.add(sub.__name__)
            todo.append(sub)
    assert kinds == set(CASES), f"run kinds without a case here: {kinds - set(CASES)}"


def test_a_run_kind_that_leaves_a_question_out_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match="Half must answer accuracy, examples_per_sec, step_time, bytes_per_step"):

        class Half(Run):
            size = 1
            method = "half"


def test_bytes_without_a_monitor_name_the_run_and_the_way_to_count_them():
    run = _train()
    run.monitor = None
    with pytest.raises(ValueError, match="hvd: run with monitor=True"):
        run.bytes_per_step()


def test_one_speedup_table_reads_every_kind_by_its_answers():
    table = scaling_table([_ps(), _train(), _ranks()])
    assert list(table["method"]) == ["PS (sync)", "horovod (gloo)", "allreduce"]
    assert list(table["workers"]) == [3, 2, 4]
