"""Lab 6 from the notebook: training runs with compressed gradients, and their figures.

::

    from lab_utils.training.compression import runs as compression_runs
    runs = [compression_runs.run_compression(m, 2, hosts="emulated:bandwidth=100mbit", steps=200, student="compressors.py")
            for m in ("none", "fp16", "onebit", "topk")]
    display(compression_runs.summary(runs))
    compression_runs.plot(runs)

Each :func:`run_compression` is ``horovodrun`` (MPI controller by default, the one that runs on
emulated hosts too) of :mod:`lab_utils.training.compression.task` on ``np`` ranks, and
returns a :class:`CompressionRun`: Lab 4's :class:`~.allreduce_runs.TrainRun` plus the
method, the accuracy curve (:meth:`CompressionRun.curve`), the step time, the bytes a
rank sends per step by :func:`~.compression.wire_bytes` and, on emulated hosts, those
its link actually carried. On loopback the network is free and compression only adds
work; on 100 Mbit/s links the 3.3 MB of float32 gradients take about 0.26 s a step and
the saving shows up in time. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab_utils.cluster import netem, new_run_dir
from lab_utils.cluster.job import format_args
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.training.compression import settings as compression_settings
from lab_utils.training.compression.codecs import METHODS, STUDENT_FUNCTIONS, ErrorFeedback, make_codec, student_needs
from lab_utils.training.runs import LaunchOptions, TrainRun, finish_run, horovod_job, takes_launch_options
from lab_utils.training.weights import load_weights_file

__all__ = ["CompressionRun", "check_student", "run_compression", "summary", "plot"]

_TASK = "-m lab_utils.training.compression.task"


@dataclass(repr=False)
class CompressionRun(TrainRun):
    """One :func:`run_compression`: a :class:`TrainRun` with the compression method and its network."""

    compression: str = "none"
    network: str = "loopback (not emulated)"
    emulated: bool = False
    link_bytes_per_step: float | None = None  # emulated hosts: what a host's link carried out per timed step

    @property
    def steps(self) -> int:
        """Timed training steps (the untimed warm-up step excluded)."""
        return int(self._rank0()["steps"])

    @property
    def wire_bytes_per_step(self) -> int:
        """Bytes one rank sends per step (:func:`~lab_utils.training.compression.wire_bytes`)."""
        return int(self._rank0()["bytes_per_step"])

    def bytes_per_step(self) -> float:
        """Every rank's link bytes per timed step where emulated (each host's own counter);
        on loopback the monitor's (:meth:`TrainRun.bytes_per_step`)."""
        if self.link_bytes_per_step is not None:
            return self.link_bytes_per_step * self.ranks
        return super().bytes_per_step()

    def curve(self) -> pd.DataFrame:
        """Rank 0's test accuracy at each evaluation: ``step``, ``train_s`` (seconds of
        training so far), ``bytes_sent`` (bytes one rank sent so far), ``accuracy``."""
        cols = ["step", "train_s", "bytes_sent", "accuracy"]
        ev = self.events
        if ev.empty or "accuracy" not in ev:
            return pd.DataFrame(columns=cols)
        ev = ev[(ev["task"] == "rank:0") & ev["accuracy"].notna()]
        return ev[cols].reset_index(drop=True)

    def rank_weights(self, rank: int) -> list:
        """Rank ``rank``'s final weights (run with ``save_weights=True``)."""
        if not self.weights_path:
            raise ValueError(f"{self.label}: run without save_weights=True")
        if not 0 <= rank < self.ranks:
            raise ValueError(f"rank must be in [0, {self.ranks}), got {rank!r}")
        return load_weights_file(self.weights_path.replace(".rank0.npz", f".rank{rank}.npz"))

    def describe(self) -> str:
        return (
            f"{self.compression}, {self.ranks} rank(s), {self.network}, {self.step_time * 1e3:.1f} ms/step, "
            f"{self.wire_bytes_per_step:,} B/step sent per rank, accuracy {self.accuracy:.4f}"
        )


def check_student(student: str | os.PathLike, method: str) -> None:
    """Two steps of the student's functions for ``method`` (``onebit``: ``onebit`` and
    ``onebit_decompress``; ``topk``: ``topk``) from the file ``student``, on small
    random gradients, here in the kernel (NumPy only), before any process starts: a
    missing function, a wrong return type, shape or count (top-k: exactly k entries)
    raises ``ValueError`` saying which, and so does a step that loses or invents
    something: what the message decodes to plus ``new_error`` must be ``grad + error``
    (the second step has an error to add)."""
    codec = make_codec(method, compression_settings.load_compressors(student, method), ratio=0.2)
    generator = np.random.default_rng(0)
    feedback = ErrorFeedback(codec, [(5, 7)])
    sent = "onebit_decompress(signs, scale)" if method == "onebit" else "the values at the indices"
    for step in (1, 2):
        grad = generator.normal(size=(5, 7)).astype(np.float32)
        owed = grad + feedback.residuals[0]  # grad + error
        (decoded,) = feedback.decode(feedback.encode(grad))
        if not np.allclose(decoded + feedback.residuals[0], owed, rtol=1e-5, atol=1e-6):
            diff = np.max(np.abs(decoded + feedback.residuals[0] - owed))
            raise ValueError(
                f"{student}: step {step}: {sent} + new_error differs from grad + error (largest difference "
                f"{diff:.3g}): new_error must be what was not sent of grad + error"
            )


@takes_launch_options()
def run_compression(
    method: str,
    np: int = 2,
    *,
    hosts: str | EmulatedHosts | None = None,
    steps: int = 200,
    student: str | os.PathLike | None = None,
    args: Mapping[str, Any] | None = None,
    controller: str = "mpi",
    save_weights: bool = False,
    label: str | None = None,
    options: LaunchOptions,
) -> CompressionRun:
    """Train Lab 6's MLP on ``np`` ranks with ``method`` (none, fp16, onebit, topk).

    ``hosts``: None/"local" (loopback) or emulated hosts, one per rank
    (``"emulated:bandwidth=100mbit"``; local with a note where they cannot be built);
    ``student``: ``compressors.py``, the file with ``onebit`` and ``onebit_decompress``
    (needed for onebit) and ``topk`` (for topk), checked first (:func:`check_student`);
    ``args``: the task's other settings (``{"batch_size": 60, "ratio": 0.01,
    "eval_every": 20, "hidden": 1024, "learning_rate": 0.1, "seed": 0}``), checked by
    the task's own parser before anything starts (``ValueError``); ``save_weights``:
    every rank saves its final weights (:meth:`CompressionRun.rank_weights`)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method in STUDENT_FUNCTIONS and student is None:
        raise ValueError(
            f"method {method!r} needs student=: compressors.py, the file with your {student_needs(method)}"
        )
    argv: dict[str, Any] = {**dict(args or {}), "method": method, "steps": steps}
    if student is not None:
        argv["student"] = str(Path(student).resolve())
    compression_settings.check_args(format_args(argv))
    if method in STUDENT_FUNCTIONS:
        check_student(argv["student"], method)
    spec = netem.host_per_rank(hosts)
    run_dir = new_run_dir(f"compression-{method}")
    weights = None
    if save_weights:
        argv["save_weights"] = str(run_dir / "weights")
        weights = f"{argv['save_weights']}.rank0.npz"
    t0 = time.monotonic()
    name = f"compression-{method}"
    job = horovod_job(np, _TASK, argv, controller=controller, hosts=spec, run_dir=run_dir, name=name, options=options)
    with job:
        results = job.wait()
    emulated = job.emulated
    network = spec.describe() if emulated else "loopback (not emulated)"
    link = None
    if emulated:  # each rank counted its host's link over the timed steps only (not the job's start or end)
        link = statistics.mean(r["link_sent"] for r in results.values()) / steps
    label = label or f"{method}, {np} ranks, {network}"
    return finish_run(
        job,
        results=results,
        label=label,
        method=f"horovod ({controller})",
        ranks=np,
        args=argv,
        t0=t0,
        weights=weights,
        cls=CompressionRun,
        compression=method,
        network=network,
        emulated=emulated,
        link_bytes_per_step=link,
    )


def summary(runs: Sequence[CompressionRun]) -> pd.DataFrame:
    """One row per run: method, network, ranks, ms per step, bytes a rank sends per step
    (computed) and, on emulated hosts, what its link carried over the timed steps (measured
    by each rank from its own host's counters: the payload plus TCP/IP headers and Horovod's
    own messages; not the job's start and end), and the final test accuracy."""
    if not runs:
        raise ValueError("summary needs at least one run")
    rows = [
        {
            "run": r.label,
            "method": r.compression,
            "network": r.network,
            "ranks": r.ranks,
            "ms/step": r.step_time * 1e3,
            "bytes/step (sent per rank)": r.wire_bytes_per_step,
            "link bytes/step (measured)": r.link_bytes_per_step,
            "test accuracy": r.accuracy,
        }
        for r in runs
    ]
    return pd.DataFrame(rows).set_index("run")


def plot(runs: Sequence[CompressionRun], title: str | None = None):
    """Test accuracy against training steps, seconds of training and MB sent per rank
    (log scale: the methods differ by up to 50x), one line per run."""
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("plot needs at least one run")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    panels = (
        ("step", "training step", 1.0),
        ("train_s", "seconds of training", 1.0),
        ("bytes_sent", "MB sent per rank", 1e-6),
    )
    for r in runs:
        c = r.curve()
        for ax, (col, _, scale) in zip(axes, panels, strict=True):
            ax.plot(c[col] * scale, c["accuracy"], marker=".", label=r.label)
    for ax, (_, xlabel, _) in zip(axes, panels, strict=True):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[2].set_xscale("log")
    axes[0].set_ylabel("test accuracy")
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
