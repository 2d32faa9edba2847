"""Lab 7 from the notebook: one call per experiment, and the tables.

Every call launches NumPy (and, for the training parts, TensorFlow) ranks under
``mpirun`` with :class:`lab_utils.cluster.MPIJob` and returns plain data; nothing here
imports TensorFlow into the kernel.

* Part A: :func:`check_collectives` (a student's ``reduce_scatter`` and ``all_gather``
  against MPI's, and composed against ``Allreduce``, with the bytes each rank sent).
* Part B: :func:`run_zero` (data-parallel training with the optimizer state sharded
  by the student's ``zero_step``, stage 1 or 2, or plain data parallelism, stage 0),
  :func:`weights_table` (each run's final parameters against the reference's) and
  :func:`memory_table` (the bytes each rank's optimizer kept).
* Part C: :func:`check_tensor_parallel` (a student's Megatron split against the whole
  block, with the bytes of a step and of data parallelism on the same block).
* Part D: :func:`run_pipeline` (the student's micro-batch schedule on p stages, or the
  one-process reference), :class:`PipelineRun`'s ``bubble()`` from the run's spans, and
  :func:`bubble_table`.
* Part E: :func:`probe_link` (the links' alpha and beta, fitted to ring steps timed on them).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lab_utils import checks
from lab_utils.cluster import MPIJob, new_run_dir
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.training.modelpar.choice_runs import fit_link
from lab_utils.training.runs import LaunchOptions, Run, every_task_reported, median_step_time, takes_launch_options
from lab_utils.training.weights import max_difference

__all__ = [
    "RANK_MEMORY_BYTES",
    "TF_RANK_MEMORY_BYTES",
    "check_collectives",
    "ZeroRun",
    "run_zero",
    "weights_table",
    "memory_table",
    "plot_memory",
    "check_tensor_parallel",
    "PipelineRun",
    "run_pipeline",
    "bubble_table",
    "PROBE_SIZES",
    "probe_link",
]

MB = 1024**2
#: Memory of one NumPy rank (mpi4py, no TensorFlow) for the resource check.
RANK_MEMORY_BYTES = 200 * MB
#: Memory of one TensorFlow rank of Parts B and D (TensorFlow's runtime and a small MLP).
TF_RANK_MEMORY_BYTES = 600 * MB


def _file(path: str | os.PathLike, what: str) -> Path:
    p = Path(path).resolve()
    if not p.is_file():
        raise FileNotFoundError(f"{path} not found: run the `%%writefile {Path(path).name}` cell first ({what})")
    return p


def _job(np_: int, module: str, args: Sequence, *, memory: int, name: str, options: LaunchOptions, run_dir=None,
         hosts=None):  # fmt: skip
    return MPIJob(
        hosts=hosts,
        np=np_,
        script=f"-m lab_utils.training.modelpar.{module}",
        args=[str(a) for a in args],
        launcher="mpirun",
        env={
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "TF_NUM_INTEROP_THREADS": "1",
            "TF_NUM_INTRAOP_THREADS": "1",
        },  # fmt: skip
        memory_per_rank=memory,
        timeout=options.timeout,
        progress=options.progress,
        run_dir=run_dir,
        name=name,
    )


def _where(hosts) -> str:
    """A run's label's end: where its ranks ran, when not on this machine's loopback."""
    if hosts is None:
        return ""
    return f", {hosts.describe() if isinstance(hosts, EmulatedHosts) else hosts}"


# ----------------------------------------------------------------------------- Part A


@takes_launch_options(timeout=120, progress=False)
def check_collectives(
    file: str | os.PathLike,
    np: int = 2,
    sizes: Sequence[int] = (0, 1, 7, 1000),
    dtypes: Sequence[str] = ("int64", "float32"),
    *,
    seed: int = 0,
    options: LaunchOptions,
) -> pd.DataFrame:
    """Run ``reduce_scatter`` and ``all_gather`` from ``file`` on ``np`` ranks for every
    size x dtype, and ``all_gather(reduce_scatter(x))``, each against MPI's own collective.
    One row per case: ``operation``, ``ok``, ``problem``, the float error and ``bytes sent``
    (per rank). A function that deadlocks ends at ``timeout`` with an error that shows the
    ranks' output."""
    path = _file(file, "Part A")
    args = ["--file", path, "--sizes", *sizes, "--dtypes", *dtypes, "--seed", seed]
    with _job(np, "collectives", args, memory=RANK_MEMORY_BYTES, name="collectives", options=options) as job:
        cases = job.wait()["rank:0"]["cases"]
    table = pd.DataFrame(cases).drop(columns=["raised"], errors="ignore")
    return table.rename(columns={"bytes_sent": "bytes sent", "max_rel_err": "max rel error"})


# ----------------------------------------------------------------------------- Part B


@dataclass(kw_only=True, repr=False)
class ZeroRun(Run):
    """What one run of :func:`run_zero` reported: its ``stage``, ``ranks``, rank 0's ``result``
    (every rank's state bytes and bytes sent in it) and the saved parameters."""

    stage: int
    ranks: int
    result: dict
    weights_path: str

    @property
    def params(self) -> int:
        return int(self.result["params"])

    @property
    def size(self) -> int:
        return self.ranks

    @property
    def method(self) -> str:
        return "plain data parallelism" if self.stage == 0 else f"ZeRO stage {self.stage}"

    @property
    def accuracy(self) -> float:
        return float(self.result["accuracy"])

    @property
    def step_time(self) -> float:
        return median_step_time(self.events)

    @property
    def examples_per_sec(self) -> float:
        return self.ranks * int(self.args["batch_size"]) / self.step_time

    def bytes_per_step(self) -> float:
        """Every rank's bytes sent per step, as each counted them."""
        return float(sum(self.result["bytes_sent"])) / int(self.args["steps"])

    def weights(self) -> np.ndarray:
        with np.load(self.weights_path) as f:
            return f["params"]

    def state_bytes(self) -> int:
        """The most bytes any rank's optimizer kept (the averaged gradient and Adam's moments)."""
        return int(max(self.result["state_bytes"]))

    def describe(self) -> str:
        return (
            f"{self.method}, {self.ranks} rank(s), {self.params:,} parameters, optimizer state "
            f"{self.state_bytes() / MB:.2f} MB per rank, accuracy {self.result['accuracy']:.4f}, {self.wall_time:.1f} s"
        )


@takes_launch_options(timeout=300)
def run_zero(
    zero_file: str | os.PathLike | None,
    np: int = 2,
    stage: int = 1,
    *,
    collectives_file: str | os.PathLike | None = None,
    steps: int = 20,
    batch_size: int = 32,
    hidden: int = 256,
    layers: int = 2,
    seed: int = 0,
    label: str | None = None,
    hosts: str | EmulatedHosts | None = None,
    options: LaunchOptions,
) -> ZeroRun:
    """Train Part B's MLP for ``steps`` steps on ``np`` ranks, ``batch_size`` examples per rank
    per step. ``stage`` 0: plain data parallelism (``zero_file`` is not used: give None); 1 or
    2: the student's ``zero_step`` from ``zero_file``, with the student's collectives from
    ``collectives_file`` (None: MPI's). Rank 0 saves the final parameters. ``hosts``: where
    the ranks run, as :class:`~lab_utils.cluster.MPIJob` takes it (``"emulated:bandwidth=100mbit"``:
    each rank on an emulated host of its own, behind a link of that bandwidth)."""
    if stage not in (0, 1, 2):
        raise ValueError(f"stage must be 0, 1 or 2, got {stage!r}")
    args = ["--stage", stage, "--steps", steps, "--batch-size", batch_size, "--hidden", hidden, "--layers", layers]
    args += ["--seed", seed]
    if stage:
        if zero_file is None:
            raise ValueError(f"stage {stage} runs your zero_step: give zero_file='zero.py'")
        args += ["--zero", _file(zero_file, "Part B")]
    if collectives_file is not None:
        args += ["--collectives", _file(collectives_file, "Part A")]
    run_dir = new_run_dir(f"zero{stage}")
    weights = str(Path(run_dir) / "params.npz")
    args += ["--save-weights", weights]
    t0 = time.monotonic()
    job = _job(np, "zero", args, memory=TF_RANK_MEMORY_BYTES, name=f"zero{stage}", options=options, run_dir=run_dir,
               hosts=hosts)  # fmt: skip
    with job:
        results = job.wait()
    every_task_reported(results, ["rank:0"], job.run_dir)
    return ZeroRun(
        label=label or ("plain DP" if stage == 0 else f"stage {stage}") + f", {np} ranks" + _where(hosts),
        events=pd.DataFrame.from_records(job.events("step")),
        wall_time=time.monotonic() - t0,
        args={
            "steps": steps,
            "batch_size": batch_size,
            "hidden": hidden,
            "layers": layers,
            "seed": seed,
            "hosts": str(hosts) if hosts is not None else None,
        },  # fmt: skip
        run_dir=str(job.run_dir),
        stage=stage,
        ranks=np,
        result=results["rank:0"],
        weights_path=weights,
    )


def weights_table(runs: Iterable[ZeroRun], reference: ZeroRun) -> pd.DataFrame:
    """Each run's final parameters against ``reference``'s (plain data parallelism): the
    largest absolute difference, and the largest relative to the reference's largest value."""
    ref = reference.weights()
    scale = float(np.max(np.abs(ref)))
    rows = []
    for run in runs:
        w = run.weights()
        if w.shape != ref.shape:
            raise ValueError(f"{run.label}: {w.size} parameters, the reference has {ref.size}: not the same model")
        diff = float(np.max(np.abs(w.astype(np.float64) - ref)))
        rows.append({"run": run.label, "stage": run.stage, "ranks": run.ranks, "max |difference|": diff,
                     "relative to the largest weight": diff / scale})  # fmt: skip
    return pd.DataFrame(rows).set_index("run")


def memory_table(runs: Iterable[ZeroRun]) -> pd.DataFrame:
    """One row per run: the parameter count P, the ranks N, the stage, the bytes each rank's
    optimizer kept (the most of any rank) as bytes, as MB and per parameter, the peak a step
    allocated on top (temporary buffers), the most a rank held between steps (its anonymous
    resident memory: TensorFlow's runtime, the data, the model and the optimizer) and the largest
    peak resident memory of a rank (the whole process, start-up included)."""
    rows = []
    for run in runs:
        state = run.state_bytes()
        rows.append(
            {
                "run": run.label,
                "stage": run.stage,
                "ranks": run.ranks,
                "parameters": run.params,
                "state bytes": state,
                "state (MB)": state / MB,
                "bytes per parameter": state / run.params,
                "step's peak extra (MB)": max(run.result["transient_bytes"]) / MB,
                "resident between steps (MB)": max(run.result["rss_steps_bytes"]) / MB,
                "peak resident (MB)": max(run.result["rss_peak_bytes"]) / MB,
            }
        )
    return pd.DataFrame(rows).set_index("run")


def plot_memory(table: pd.DataFrame):
    """Part B's lesson in two panels, from :func:`memory_table`: the optimizer's bytes per rank by
    run, and how much less each run's optimizer and each run's rank held than the first run's
    (plain data parallelism), side by side: the resident memory falls by the megabytes sharded."""
    import matplotlib.pyplot as plt

    labels = [str(i) for i in table.index]
    x = np.arange(len(labels))
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(x, table["state (MB)"], color="C0")
    for i, (mb, per) in enumerate(zip(table["state (MB)"], table["bytes per parameter"], strict=True)):
        a.annotate(f"{mb:.1f} MB\n{per:.1f} B/param", (i, mb), ha="center", va="bottom", fontsize=8)
    a.set_xticks(x, labels, fontsize=8)
    a.set_ylabel("MB per rank")
    a.set_title("The optimizer's state: averaged gradient, m and v")
    a.margins(y=0.25)
    first = table.iloc[0]
    saved_state = first["state (MB)"] - table["state (MB)"]
    saved_held = first["resident between steps (MB)"] - table["resident between steps (MB)"]
    width = 0.38
    b.bar(x - width / 2, saved_state, width, label="optimizer state", color="C0")
    b.bar(x + width / 2, saved_held, width, label="resident between steps", color="C1")
    b.axhline(0, color="0.5", lw=0.8)
    b.set_xticks(x, labels, fontsize=8)
    b.set_ylabel(f"MB per rank less than {labels[0]}")
    b.set_title(f"Saved: of {first['resident between steps (MB)']:.0f} MB a rank holds")
    b.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- Part C


@takes_launch_options(timeout=180, progress=False)
def check_tensor_parallel(
    tensor_file: str | os.PathLike,
    collectives_file: str | os.PathLike,
    np: int = 2,
    *,
    d: int = 64,
    f: int = 256,
    batches: Sequence[int] = (8, 64, 512),
    seed: int = 0,
    options: LaunchOptions,
) -> pd.DataFrame:
    """The student's split block (``tensor_file``, with the all-reduce of ``collectives_file``)
    on ``np`` ranks against TensorFlow's whole block, for each batch size. One row per batch:
    ``ok``, ``problem``, the largest relative error, and per rank the bytes sent by the forward
    pass, by the whole step, and by data parallelism's all-reduce of the same block's gradients."""
    args = ["--file", _file(tensor_file, "Part C"), "--collectives", _file(collectives_file, "Part A")]
    args += ["--d", d, "--f", f, "--batches", *batches, "--seed", seed]
    with _job(np, "tensor", args, memory=TF_RANK_MEMORY_BYTES, name="tensor", options=options) as job:
        cases = job.wait()["rank:0"]["cases"]
    table = pd.DataFrame(cases).drop(columns=["raised"], errors="ignore")
    names = {"bytes_sent": "bytes sent", "forward_bytes": "forward bytes", "dp_bytes_sent": "data-parallel bytes"}
    return table.rename(columns={**names, "max_rel_err": "max rel error"})


# ----------------------------------------------------------------------------- Part D


@dataclass(kw_only=True, repr=False)
class PipelineRun(Run):
    """What one run of :func:`run_pipeline` reported: ``stages``, ``micro_batches``, every
    stage's result, and the folder of the saved weights (``stage<r>.npz``)."""

    stages: int
    micro_batches: int
    results: dict
    weights_dir: str

    accuracy = float("nan")  # the pipeline's check is its weights against one process's

    @property
    def size(self) -> int:
        return self.stages

    @property
    def method(self) -> str:
        return "one process" if self.stages == 1 else "pipeline (GPipe)"

    @property
    def step_time(self) -> float:
        return median_step_time(self.events)

    @property
    def examples_per_sec(self) -> float:
        return int(self.args["batch_size"]) / self.step_time

    def bytes_per_step(self) -> float:
        raise ValueError(f"{self.label}: a pipeline run counts no bytes")

    def weights(self) -> list[np.ndarray]:
        """Every layer's weights and biases, first stage first."""
        out = []
        for r in range(self.stages):
            with np.load(Path(self.weights_dir) / f"stage{r}.npz") as f:
                out += [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]
        return out

    def spans(self) -> pd.DataFrame:
        """Every span of every step: ``task``, ``step``, ``name``, ``cat``, ``start``, ``end``."""
        rows = [
            {"task": e["task"], "step": e["step"], "name": n, "cat": c, "start": a, "end": b}
            for e in self.events.to_dict("records")
            for n, c, a, b, *_ in (e.get("spans") if isinstance(e.get("spans"), list) else [])
        ]
        return pd.DataFrame(rows, columns=["task", "step", "name", "cat", "start", "end"])

    def bubble(self) -> pd.DataFrame:
        """Per stage: seconds computing and waiting over the steps after the first (its start
        is TensorFlow's warm-up), and the bubble, ``wait / (wait + compute)``."""
        s = self.spans()
        s = s[s["step"] > 1] if (s["step"] > 1).any() else s
        s = s.assign(seconds=s["end"] - s["start"])
        per = s.pivot_table(index="task", columns="cat", values="seconds", aggfunc="sum", fill_value=0.0)
        per = per.reindex(columns=["compute", "wait", "comm"], fill_value=0.0)
        per["bubble"] = per["wait"] / (per["wait"] + per["compute"])
        return per

    def describe(self) -> str:
        what = "one process (the reference)" if self.stages == 1 else f"{self.stages} stages"
        return f"{what}, {self.micro_batches} micro-batch(es), {self.wall_time:.1f} s"


@takes_launch_options(timeout=300)
def run_pipeline(
    pipeline_file: str | os.PathLike | None,
    stages: int = 2,
    micro_batches: int = 4,
    *,
    batch_size: int = 64,
    steps: int = 3,
    hidden: int = 128,
    layers: int = 3,
    compute_s: float = 0.0,
    seed: int = 0,
    label: str | None = None,
    hosts: str | EmulatedHosts | None = None,
    options: LaunchOptions,
) -> PipelineRun:
    """Train Part D's MLP (``layers`` hidden layers, then 10 outputs) for ``steps`` steps of
    ``batch_size`` examples, each cut into ``micro_batches``, on ``stages`` ranks, scheduled by
    ``gpipe_step`` from ``pipeline_file``; ``pipeline_file=None``: the reference, one process
    with the whole model and batch (``stages`` must be 1). ``compute_s``: seconds a stage's
    forward of the whole batch takes on top, and its backward (emulated compute); a micro-batch
    takes its share. ``hosts``: as :func:`run_zero` takes it."""
    if pipeline_file is None and stages != 1:
        raise ValueError("the reference (pipeline_file=None) is one process: stages=1")
    checks.count("micro_batches", micro_batches)
    if batch_size % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide batch_size={batch_size}")
    args = ["--micro-batches", micro_batches, "--batch-size", batch_size, "--steps", steps]
    args += ["--hidden", hidden, "--layers", layers, "--compute-s", compute_s, "--seed", seed]
    args += ["--reference"] if pipeline_file is None else ["--file", _file(pipeline_file, "Part D")]
    run_dir = new_run_dir("pipeline")
    args += ["--save-weights", run_dir]
    t0 = time.monotonic()
    job = _job(stages, "pipeline", args, memory=RANK_MEMORY_BYTES, name="pipeline", options=options, run_dir=run_dir,
               hosts=hosts)  # fmt: skip
    with job:
        results = job.wait()
    every_task_reported(results, [f"rank:{r}" for r in range(stages)], job.run_dir)
    m = 1 if pipeline_file is None else micro_batches
    return PipelineRun(
        label=label or ("reference" if pipeline_file is None else f"p={stages}, m={micro_batches}") + _where(hosts),
        events=pd.DataFrame.from_records(job.events("step")),
        wall_time=time.monotonic() - t0,
        args={"batch_size": batch_size, "steps": steps, "compute_s": compute_s, "hidden": hidden, "layers": layers},
        run_dir=str(job.run_dir),
        stages=stages,
        micro_batches=m,
        results=results,
        weights_dir=str(run_dir),
    )


def bubble_table(runs: Iterable[PipelineRun], reference: PipelineRun | None = None) -> pd.DataFrame:
    """One row per pipeline run: p, m, the bubble measured (the mean over stages of each
    stage's waiting share) and the largest stage's; with the one-process ``reference``, how far
    each run's final weights are from its (largest difference relative to the largest weight)."""
    ref = reference.weights() if reference is not None else None
    rows = []
    for run in runs:
        b = run.bubble()["bubble"]
        row = {"run": run.label, "stages": run.stages, "micro-batches": run.micro_batches,
               "bubble (mean of stages)": float(b.mean()), "bubble (largest)": float(b.max())}  # fmt: skip
        if ref is not None:
            row["weights vs reference (max rel)"] = max_difference(run.weights(), ref)["max_rel"]
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")


# ----------------------------------------------------------------------------- Part E

#: message sizes of :func:`probe_link`: 512 KiB to 4 MiB, the messages of Part B's rings (0.54 MB
#: and 3.7 MB a ring step for its 0.27 M and 1.9 M-parameter MLPs on 2 ranks); smaller ones pass
#: an emulated link's burst faster than its rate, which is not what the ring's large ones meet
PROBE_SIZES = (2**19, 2**20, 2**21, 2**22)


@takes_launch_options(timeout=180, progress=False)
def probe_link(
    hosts: str | EmulatedHosts | None = None,
    np: int = 2,
    sizes: Sequence[int] = PROBE_SIZES,
    repeats: int = 5,
    *,
    one_way: bool = False,
    options: LaunchOptions,
):
    """Lab 6's alpha and beta of the links between ``np`` ranks on ``hosts`` (as :func:`run_zero`
    takes them), fitted to ring steps of ``sizes`` bytes timed on them
    (:mod:`lab_utils.training.modelpar.probe`): a
    :class:`~lab_utils.training.modelpar.choice_runs.Link`. ``one_way``: fitted to rank 0's
    messages to rank 1 alone (each link busy in one direction), the link's own rate."""
    if one_way and np < 2:
        raise ValueError(f"one_way needs np >= 2, got {np}")
    args = ["--sizes", *sizes, "--repeats", repeats] + (["--one-way"] if one_way else [])
    with _job(np, "probe", args, memory=RANK_MEMORY_BYTES, name="probe", options=options, hosts=hosts) as job:
        result = job.wait()["rank:0"]
    where = f"{np} ranks" + (_where(hosts) or ", loopback") + (", one way" if one_way else "")
    return fit_link([(r["bytes"], r["seconds"]) for r in result["rows"]], where=where)
