"""Lab 5 from the notebook: AlexNet runs on several devices, sweeps and the CS 744 tables.

Every run is its own process (``python -m lab_utils.training.towers``, started by
``TFCluster(ps=0, workers=1)``): the devices of a TensorFlow process are fixed at its
start, and the monitor measures one run at a time. Nothing here imports TensorFlow.

* :func:`run_devices`: one run of ``single``, ``towers`` or ``mirrored`` on N devices;
* :func:`sweep_devices`: batch sizes x device counts, one run each; a batch that does not fit
  is recorded as OOM and the sweep goes on;
* :func:`resource_table`: the seed's Tables 5-8 (Peak Mem, Peak CPU, Network R/W,
  Examples/s, s/Batch; GPU utilisation and memory when NVML sees a GPU), for these
  runs and for Lab 4's Horovod / MultiWorkerMirrored runs (``TrainRun``) alike;
* :func:`scaling_table` / :func:`plot_scaling`: speedup over one device, with the ideal line.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab_utils.cluster import ClusterError, TFCluster, new_run_dir
from lab_utils.cluster.job import format_args
from lab_utils.training import loop, tables
from lab_utils.training.runs import Run, RunOptions, one_result, saved_weights, takes_run_options
from lab_utils.training.student import load_student
from lab_utils.training.towers.settings import METHODS, make_parser, parse_args

__all__ = [
    "METHOD_LABELS",
    "TABLE_COLUMNS",
    "DeviceRun",
    "check_args",
    "check_steps",
    "load_student",
    "run_devices",
    "sweep_devices",
    "measurements",
    "resource_table",
    "scaling_table",
    "plot_scaling",
]

#: How each method appears in tables and plots: what it does with the gradients.
METHOD_LABELS = {
    "single": "one device",
    "towers": "towers (parameter device)",
    "mirrored": "MirroredStrategy (all-reduce)",
}
#: The seed's Tables 5-8, plus what says which run a row is.
TABLE_COLUMNS = ["method", "devices", "Batch Size", "Peak Mem (B)", "Peak CPU", "Network R", "Network W"]
TABLE_COLUMNS += ["Examples/s", "s/Batch", "status"]
TABLE_UNITS = {
    "Batch Size": "examples per device and step (a step trains on devices x Batch Size)",
    "Peak Mem (B)": "host memory: peak RSS summed over the run's processes",
    "Peak CPU": "% of one core, peak of the sum over the run's processes (200 = two busy cores)",
    "Network R": "bytes received on the host's interfaces, loopback included, during the run",
    "Network W": "bytes sent on the host's interfaces, loopback included, during the run",
    "Examples/s": "training examples of all devices per second (warm-up excluded)",
    "s/Batch": "seconds per training step",
    "GPU util (%)": "peak NVML utilisation of the busiest GPU",
    "GPU Mem (B)": "peak NVML memory in use, summed over GPUs",
}
#: Private (anonymous) resident memory of one run's process at the lab's defaults (width 1.0),
#: measured (/proc/PID/status RssAnon, 2026-11-27, full-size CIFAR-10 mapped from the data
#: cache, TensorFlow's BFC allocator, Binder's 1 CPU and 2 GB): the sweep's largest run, towers
#: at 2 x 256, peaked at 1.02 GB; MirroredStrategy on 2 devices at batch 64 at 0.69 GB through
#: Part B's 300 steps. (Before the cache and the allocator: 1.29-1.41 GB for the latter.)
#: TensorFlow's library pages (0.24 GB more resident) are the kernel's, which imported it first.
TASK_MEMORY_BYTES = 1130 * 2**20


#: Seconds of one core per training example of AlexNet-cifar at width 1.0, forward and backward:
#: 29 ms measured (MirroredStrategy on 2 devices at batch 64, one thread, on a loaded core of this
#: machine kind, 2026-11-27). The compute grows as the square of the width; the 224 network's
#: is about twice the cifar one's per example.
CORE_SECONDS_PER_EXAMPLE = 0.03
#: A run is stopped as hung after its start-up allowance plus this many times its training's
#: time on one such core (:func:`run_timeout`).
TIMEOUT_MARGIN = 3
#: Seconds a run may take beyond its training: start-up (an import of TensorFlow, the data, the
#: first step's tracing) and the evaluation, at one loaded core.
TIMEOUT_START_S = 900


def run_timeout(args: Mapping[str, Any]) -> float:
    """Seconds after which a run of ``args`` (the task's, with ``devices``) is stopped as hung:
    :data:`TIMEOUT_START_S` plus :data:`TIMEOUT_MARGIN` times its training examples at
    :data:`CORE_SECONDS_PER_EXAMPLE`, as if on one core (Binder's). Part B's 300 steps of
    2 x 64 at width 1.0 train for about 19 minutes there: a guard of 73 minutes, where a fixed
    15 minutes stopped a run that was merely slow."""
    d = {**vars(make_parser().parse_args([])), **dict(args)}
    examples = (int(d["steps"]) + int(d["warmup_steps"])) * int(d["batch_size"]) * int(d["devices"])
    per_example = CORE_SECONDS_PER_EXAMPLE * float(d["width"]) ** 2 * (2 if d["variant"] == "224" else 1)
    return TIMEOUT_START_S + TIMEOUT_MARGIN * examples * per_example


def check_args(args: Mapping[str, Any]) -> None:
    """The task's own checks on ``args`` (``{"batch_size": 64}``): ValueError with its
    message for bad values, before anything starts (the student file is checked at launch)."""
    loop.parse_or_raise(lambda: parse_args(format_args({**args, "student": __file__})), dict(args))
    for key in ("devices", "batch_size", "steps"):
        if key in args and (not isinstance(args[key], int) or isinstance(args[key], bool) or args[key] < 1):
            raise ValueError(f"{key} must be an int >= 1, got {args[key]!r}")


@dataclass(repr=False)
class DeviceRun(Run):
    """One process's run of AlexNet on ``devices`` devices (see :func:`run_devices`)."""

    method: str  # single, towers, mirrored
    devices: int
    result: dict
    weights_path: str | None = None

    @property
    def size(self) -> int:
        """Devices."""
        return self.devices

    @property
    def oom(self) -> bool:
        return bool(self.result.get("oom"))

    @property
    def batch_size(self) -> int:
        return int(self.result["batch_size"])

    @property
    def global_batch(self) -> int:
        return int(self.result["global_batch"])

    @property
    def tier(self) -> str:
        return str(self.result.get("tier", "?"))

    @property
    def examples_per_sec(self) -> float:
        return float("nan") if self.oom else loop.cluster_examples_per_sec({"task": self.result})

    @property
    def step_time(self) -> float:
        """Seconds per batch (NaN: out of memory)."""
        return float("nan") if self.oom else self.result["train_time"] / self.result["local_steps"]

    def bytes_per_step(self) -> float:
        """0: one process, whose devices exchange nothing over a network."""
        return 0.0

    @property
    def accuracy(self) -> float:
        acc = self.result.get("accuracy")
        return float("nan") if acc is None else float(acc)

    def weights(self) -> list[np.ndarray]:
        if self.weights_path and self.oom:
            raise ValueError(f"{self.label}: ran out of memory, no weights")
        return saved_weights(self)

    def describe(self) -> str:
        if self.oom:
            return f"OUT OF MEMORY ({self.result.get('error', '')})"
        return (
            f"{self.tier}, {self.result.get('precision', '?')}, {self.global_batch} examples/step, "
            f"loss {self.result['loss_first']:.3f} -> {self.result['loss']:.3f}, "
            f"{self.examples_per_sec:,.0f} examples/s, {self.wall_time:.1f} s"
        )


def _task(args: dict, name: str, run_dir: Path, timeout, progress, memory: int = TASK_MEMORY_BYTES) -> TFCluster:
    """The one-process job that runs ``python -m lab_utils.training.towers`` with ``args``."""
    return TFCluster(
        ps=0,
        workers=1,
        script="-m lab_utils.training.towers",
        args=args,
        timeout=timeout,
        progress=progress,
        run_dir=run_dir,
        name=name,
        memory_per_task=memory,
    )


def _student_file(student: str | os.PathLike) -> str:
    """The student's script, resolved; a clear error when its cell has not been run."""
    path = Path(student)
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the notebook's `%%writefile {path.name}` cell first")
    return str(path.resolve())


def _launch(method: str, devices: int, args: dict, run_dir: Path, options: RunOptions):
    cluster = _task(args, f"{method}{devices}", run_dir, options.timeout, options.progress)
    t0 = time.monotonic()
    mon = options.watch(cluster)
    result = one_result(cluster)
    events = pd.DataFrame.from_records(cluster.events("step"))
    return result, events, time.monotonic() - t0, mon


def _killed(exc: ClusterError, method: str, devices: int, args: dict) -> dict:
    """A result for a run the kernel killed (SIGKILL: out of host memory, or a cgroup's limit)."""
    batch = int(args.get("batch_size", make_parser().get_default("batch_size")))
    return {
        "method": method,
        "devices": devices,
        "batch_size": batch,
        "global_batch": batch * devices,
        "oom": True,
        "error": f"killed by signal {-exc.exit_code} (out of host memory?)",
    }


@takes_run_options(monitor=True, timeout=None, progress=False)
def run_devices(
    method: str = "towers",
    devices: int = 1,
    *,
    args: Mapping[str, Any] | None = None,
    student: str | os.PathLike = "towers.py",
    save_weights: bool = False,
    options: RunOptions,
) -> DeviceRun:
    """Train AlexNet with ``method`` (single, towers, mirrored) on ``devices`` devices of
    one process; ``args`` go to the task (``batch_size`` per device, ``steps``, ``width``,
    ``dropout``, ``memory_limit_mb``, ...). ``monitor`` samples CPU, memory, network (and
    GPUs) for the resource table; ``live`` shows them as it trains (a static figure when
    headless). Out of memory gives a run with ``oom`` True, not an error. ``timeout``: seconds
    before the run is stopped as hung (default :func:`run_timeout`, sized to its work)."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {METHODS}")
    args = {**dict(args or {}), "method": method, "devices": devices}
    check_args(args)
    if options.timeout is None:
        options = replace(options, timeout=run_timeout(args))
    if method != "single":
        args["student"] = _student_file(student)
    run_dir = new_run_dir(f"{method}{devices}")
    weights = str(run_dir / "weights.npz") if save_weights else None
    if weights:
        args["save_weights"] = weights
    label = options.label or f"{METHOD_LABELS[method]}, {devices} device(s), batch {args.get('batch_size', 64)}"
    try:
        result, events, wall, mon = _launch(method, devices, args, run_dir, replace(options, label=label))
    except ClusterError as exc:
        if exc.exit_code not in (-9, 137):
            raise
        result, events, wall, mon = _killed(exc, method, devices, args), pd.DataFrame(), float("nan"), None
    return DeviceRun(
        method,
        devices,
        result,
        label=label,
        events=events,
        wall_time=wall,
        args=args,
        run_dir=str(run_dir),
        weights_path=weights,
        monitor=mon,
    )


#: Seconds the quick check of the step functions may take before it is stopped as hung
#: (about 6 s of one core: an import of TensorFlow and three tiny models traced).
CHECK_TIMEOUT_S = 120


def check_steps(
    student: str | os.PathLike = "towers.py", devices: int = 2, *, timeout: float = CHECK_TIMEOUT_S
) -> list[str]:
    """Exercises 2 and 3 in seconds, before any AlexNet run: the student's
    ``make_towers_step`` and ``make_mirrored_step`` train a tiny model for two steps on
    ``devices`` logical CPU devices (a process of its own: a kernel's devices are fixed),
    from the same weights and on the same examples as one device with the whole batch.
    Returns what is wrong, one sentence each (empty: both agree with one device)."""
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 2:
        raise ValueError(f"devices must be an int >= 2 (towers need two devices to differ from one), got {devices!r}")
    args = {"check": True, "devices": devices, "batch_size": 4, "steps": 2, "learning_rate": 0.1}
    args["student"] = _student_file(student)
    cluster = _task(args, "check", new_run_dir("check"), timeout, False, TASK_MEMORY_BYTES // 2)
    with cluster:
        cluster.wait()
    return step_problems(one_result(cluster))


def step_problems(result: Mapping[str, Any]) -> list[str]:
    """What a quick check's result (:func:`lab_utils.training.towers.check_steps`) says is wrong."""
    tol, n = result["tolerance"], result["devices"]
    problems = []
    loss = result["loss_single"]
    hints = {
        "towers": "is each gradient the mean over the towers (not their sum, not one tower's), paired with its variable?",
        "mirrored": "scale each replica's loss by the GLOBAL batch: tf.nn.compute_average_loss(per_example_losses, "
        "global_batch_size=...)",
    }
    for method in ("towers", "mirrored"):
        diff = result[f"{method}_weights_rel_diff"]
        if not diff <= tol:
            problems.append(
                f"{method}: after {result['steps']} steps on {n} devices the weights differ from one device's by "
                f"{diff:.1e} (relative; rounding alone stays under {tol:g}): {hints[method]}"
            )
        got = result[f"{method}_loss"]
        if diff <= tol and not abs(got - loss) <= 1e-4 * max(1.0, abs(loss)):  # right update, wrong loss
            reduce = (
                "add the towers' losses and divide by their number"
                if method == "towers"
                else ("reduce the replicas' scaled losses with tf.distribute.ReduceOp.SUM")
            )
            problems.append(
                f"{method}: the first step returned loss {got:.4f}; the mean over the global batch is {loss:.4f}: {reduce}"
            )
    return problems


def sweep_devices(
    batch_sizes: Sequence[int],
    device_counts: Sequence[int],
    method: str = "towers",
    *,
    args: Mapping[str, Any] | None = None,
    student: str | os.PathLike = "towers.py",
    interval: float = 0.25,
    verbose: bool = True,
) -> list[DeviceRun]:
    """One monitored run per (batch size, device count), in that order; prints a line per
    run. Runs that run out of memory are kept (``oom``) and the sweep goes on."""
    if not batch_sizes or not device_counts:
        raise ValueError("sweep needs at least one batch size and one device count")
    runs = []
    for n in device_counts:
        for b in batch_sizes:
            m = "single" if method == "single" and n == 1 else method
            run = run_devices(m, n, args={**dict(args or {}), "batch_size": b}, student=student, interval=interval)
            if verbose:
                print(f"  {run!r}")
            runs.append(run)
    return runs


# ----------------------------------------------------------------------------- tables


def _gpu_peaks(mon) -> dict:
    if mon is None or getattr(mon.sampler, "gpu", None) is None or not mon.sampler.gpu.available:
        return {}
    frame = mon.frame(role="gpu")
    if frame.empty:
        return {}
    util = frame[frame["metric"] == "gpu_util"]["value"]
    mem = frame[frame["metric"] == "gpu_mem_used"].groupby("time")["value"].sum()
    return {"GPU util (%)": float(util.max()), "GPU Mem (B)": float(mem.max())}


def measurements(run) -> dict:
    """What a run measured, by the seed's names: a :class:`DeviceRun` or Lab 4's
    ``TrainRun`` (Horovod, MultiWorkerMirrored: ``devices`` = ranks, one device each)."""
    nan = float("nan")
    status = "ok"
    if isinstance(run, DeviceRun):
        batch = run.batch_size
        if run.oom:
            status = f"OOM: {run.result.get('error', '')}"
    else:  # a TrainRun: per-rank batch
        batch = int((run.results.get("rank:0") or next(iter(run.results.values())))["batch_size"])
    method, devices, eps, spb = METHOD_LABELS.get(run.method, run.method), run.size, run.examples_per_sec, run.step_time
    row = {"method": method, "devices": devices, "Batch Size": batch}
    total = run.monitor.summary().loc["total"] if run.monitor is not None else {}
    for col, key in (("Peak Mem (B)", "Peak Mem"), ("Peak CPU", "Peak CPU")):
        row[col] = float(total[key]) if key in total else nan
    for col in ("Network R", "Network W"):
        row[col] = float(total[col]) if col in total else nan
    row.update({"Examples/s": eps, "s/Batch": spb, "status": status})
    row.update(_gpu_peaks(run.monitor))
    return row


def resource_table(runs: Sequence[Any]) -> pd.DataFrame:
    """The seed's Tables 5-8 for ``runs``: one row per run (``status`` says OOM), the
    GPU columns when a GPU was measured. Units in ``.attrs["units"]``."""
    if not runs:
        raise ValueError("resource_table needs at least one run")
    rows = [measurements(r) for r in runs]
    extra = [c for c in ("GPU util (%)", "GPU Mem (B)") if any(c in r for r in rows)]
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS[:-1] + extra + ["status"])
    table.attrs["units"] = {k: v for k, v in TABLE_UNITS.items() if k in table.columns}
    return table


def _baseline(runs: Sequence[Any]):
    ones = [r for r in runs if r.size == 1]
    if not ones:
        raise ValueError("scaling_table needs a 1-device run to compare with (e.g. run_devices('single', 1))")
    return next((r for r in ones if r.method == "single"), ones[0])


def scaling_table(runs: Sequence[Any], baseline: Any = None) -> pd.DataFrame:
    """Speedup (examples/s over ``baseline``'s: default the ``single`` 1-device run) and
    efficiency (speedup / devices) of every finished run, one line per method, each
    starting from the baseline at 1 device (:func:`lab_utils.training.tables.scaling_table`).
    ``oversubscribed``: more devices or ranks than usable cores (logical CPU devices then
    share cores). Lab 4's ``TrainRun`` works too."""
    kept = [r for r in runs if not math.isnan(r.examples_per_sec)]
    return tables.scaling_table(kept, baseline or _baseline(kept), METHOD_LABELS)


def plot_scaling(table: pd.DataFrame, title: str | None = None):
    """Speedup against devices, with the ideal line."""
    return tables.plot_scaling(table, title=title or "AlexNet: speedup against devices")
