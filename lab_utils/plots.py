"""Figures shared by the labs, and TensorBoard with a static fallback.

Introduced in Lab 1: :func:`batch_size_sweep` (examples/s and time-to-accuracy
against batch size), :func:`learning_curve`, and :func:`show_tensorboard`,
which always draws the logged scalars with matplotlib (read from the event
files) and, in an interactive session, also opens live TensorBoard through the
``%tensorboard`` magic. Headless runs (papermill via ``make run``, nbgrader,
``LABS_HEADLESS=1``) get only the static figure, so nothing waits for a server.
"""
from __future__ import annotations

import os
from pathlib import Path

from lab_utils.metrics import is_headless  # one definition of "nobody can see a widget here"

import numpy as np
import pandas as pd

__all__ = ["batch_size_sweep", "learning_curve", "read_scalars", "plot_scalars", "show_tensorboard", "is_headless"]


def _plt():
    import matplotlib.pyplot as plt

    return plt


def batch_size_sweep(table: pd.DataFrame, target_accuracy: float | None = None):
    """Two panels from a sweep table with columns ``batch_size``,
    ``examples_per_sec`` and ``time_to_accuracy_s`` (NaN = target not reached)."""
    plt = _plt()
    t = table.sort_values("batch_size")
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.plot(t["batch_size"], t["examples_per_sec"], "o-")
    a.set_xscale("log")
    a.set_xticks(t["batch_size"], [str(v) for v in t["batch_size"]])
    a.set_xlabel("batch size")
    a.set_ylabel("training examples / s")
    a.set_title("Throughput (warm-up excluded)")
    reached = t["time_to_accuracy_s"].notna()
    b.bar([str(v) for v in t["batch_size"]], t["time_to_accuracy_s"].fillna(0.0),
          color=["C0" if r else "0.8" for r in reached])
    for i, (ok, v) in enumerate(zip(reached, t["time_to_accuracy_s"])):
        b.annotate(f"{v:.1f} s" if ok else "not reached", (i, v if ok else 0.0),
                   ha="center", va="bottom", fontsize=8)
    b.set_xlabel("batch size")
    b.set_ylabel("training seconds")
    b.set_title(f"Time to {target_accuracy:.0%} test accuracy" if target_accuracy else "Time to target accuracy")
    fig.tight_layout()
    return fig


def learning_curve(history: pd.DataFrame, x: str = "examples_seen", y: str = "test_accuracy", hue: str | None = None):
    """Test accuracy (or any column) against examples seen, one line per ``hue``."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    groups = history.groupby(hue) if hue else [(None, history)]
    for key, part in groups:
        ax.plot(part[x], part[y], marker=".", label=None if key is None else f"{hue}={key}")
    ax.set_xlabel(x.replace("_", " "))
    ax.set_ylabel(y.replace("_", " "))
    if hue:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def read_scalars(logdir: str | os.PathLike) -> pd.DataFrame:
    """Every scalar in the TensorBoard event files under ``logdir`` as a tidy
    table (run, tag, step, value, wall_time); ``run`` is the sub-folder."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    logdir = Path(logdir)
    rows = []
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        run = str(path.parent.relative_to(logdir)) if path.parent != logdir else "."
        for event in EventFileLoader(str(path)).Load():
            for v in event.summary.value:
                if v.HasField("simple_value"):
                    value = float(v.simple_value)
                elif v.HasField("tensor"):
                    arr = tensor_util.make_ndarray(v.tensor)
                    if arr.size != 1 or arr.dtype.kind not in "fiu":
                        continue
                    value = float(arr.reshape(()))
                else:
                    continue
                rows.append((run, v.tag, int(event.step), value, float(event.wall_time)))
    return pd.DataFrame(rows, columns=["run", "tag", "step", "value", "wall_time"])


def plot_scalars(scalars: pd.DataFrame, max_points: int = 2000):
    """One panel per tag, one line per run: the static stand-in for TensorBoard."""
    plt = _plt()
    tags = sorted(scalars["tag"].unique()) if len(scalars) else []
    if not tags:
        fig, ax = plt.subplots(figsize=(5, 2))
        ax.text(0.5, 0.5, "no scalars logged yet", ha="center", va="center")
        ax.axis("off")
        return fig
    fig, axes = plt.subplots(1, len(tags), figsize=(4.5 * len(tags), 3.4), squeeze=False)
    for ax, tag in zip(axes[0], tags):
        for run, part in scalars[scalars["tag"] == tag].groupby("run"):
            part = part.sort_values("step")
            if len(part) > max_points:  # thin long runs evenly
                part = part.iloc[np.linspace(0, len(part) - 1, max_points).astype(int)]
            ax.plot(part["step"], part["value"], label=run, lw=1)
        ax.set_title(tag)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def show_tensorboard(logdir: str | os.PathLike, live: bool | None = None):
    """Plot the scalars in ``logdir`` (always), and open live TensorBoard with
    the ``%tensorboard`` magic when ``live`` (default: when not headless)."""
    fig = plot_scalars(read_scalars(logdir))
    if live is None:
        live = not is_headless()
    if live:
        from IPython import get_ipython

        shell = get_ipython()
        shell.run_line_magic("load_ext", "tensorboard")
        shell.run_line_magic("tensorboard", f"--logdir {Path(logdir)}")
    return fig
