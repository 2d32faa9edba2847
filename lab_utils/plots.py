"""Figures shared by the labs, and TensorBoard with a static fallback.

Introduced in Lab 1: :func:`batch_size_sweep` (examples/s and time-to-accuracy
against batch size), :func:`learning_curve`, and :func:`show_tensorboard`,
which always draws the logged scalars with matplotlib (read from the event
files) and, in an interactive session, also opens live TensorBoard through the
``%tensorboard`` magic. Headless runs (papermill via ``make run``, nbgrader,
``LABS_HEADLESS=1``) get only the static figure, so nothing waits for a server.

Introduced in Lab 2: :func:`plot_metrics`, the figure behind
``lab_utils.metrics.Monitor.plot()`` (throughput, CPU, memory and network of a
cluster's tasks on one time axis), and :func:`png_bytes` for the live view.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from lab_utils.display import is_headless  # one definition of "nobody can see a widget here"

__all__ = [
    "batch_size_sweep",
    "learning_curve",
    "read_scalars",
    "plot_scalars",
    "show_tensorboard",
    "is_headless",
    "accuracy_curves",
    "plot_metrics",
    "png_bytes",
    "bandwidth_curves",
    "speedup_curves",
]


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
    b.bar(
        [str(v) for v in t["batch_size"]],
        t["time_to_accuracy_s"].fillna(0.0),
        color=["C0" if r else "0.8" for r in reached],
    )
    for i, (ok, v) in enumerate(zip(reached, t["time_to_accuracy_s"], strict=True)):
        b.annotate(f"{v:.1f} s" if ok else "not reached", (i, v if ok else 0.0), ha="center", va="bottom", fontsize=8)
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
    for ax, tag in zip(axes[0], tags, strict=True):
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
    """Plot the scalars in ``logdir`` (always); when ``live`` (default: when not headless),
    also serve them with TensorBoard and show it below the cell
    (:func:`lab_utils.cluster.tensorboard.tensorboard`: a port the OS picks, stopped with
    the kernel; never TensorBoard's own ``%tensorboard``, whose server outlives it)."""
    fig = plot_scalars(read_scalars(logdir))
    if live is None:
        live = not is_headless()
    if live:
        from lab_utils.cluster.tensorboard import tensorboard

        embed_tensorboard(tensorboard(logdir).port)
    return fig


def embed_tensorboard(port: int, height: int = 620) -> None:
    """Show the TensorBoard serving ``port`` on this machine in the notebook. Behind
    JupyterHub (Binder too) the browser reaches it only through jupyter-server-proxy;
    without one, say so instead of showing a frame that cannot load."""
    import importlib.util

    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if prefix and "TENSORBOARD_PROXY_URL" not in os.environ:
        if importlib.util.find_spec("jupyter_server_proxy") is None:
            print(
                f"TensorBoard serves port {port} of this server, which your browser cannot reach without "
                "jupyter-server-proxy: the figure shows the same scalars."
            )
            return
        os.environ["TENSORBOARD_PROXY_URL"] = f"{prefix.rstrip('/')}/proxy/%PORT%/"
    from tensorboard import notebook

    notebook.display(port=port, height=height)


def accuracy_curves(curves, x: str = "global_step", title: str | None = None):
    """Test accuracy against ``global_step`` or ``time`` (s since launch), one line
    per curve. ``curves``: label -> frame, or ``(label, frame)`` pairs; each frame
    has columns ``time``, ``global_step`` and ``accuracy`` (Labs 2-3: ``PSRun.accuracy_curve()``)."""
    if x not in ("global_step", "time"):
        raise ValueError(f"x must be 'global_step' or 'time', got {x!r}")
    pairs = list(curves.items()) if hasattr(curves, "items") else list(curves)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for label, c in pairs:
        ax.plot(c[x], c["accuracy"], marker=".", label=label)
    ax.set_xlabel("global step" if x == "global_step" else "seconds since launch")
    ax.set_ylabel("test accuracy")
    finite = [v for _, c in pairs for v in c["accuracy"] if not np.isnan(v)]
    if finite:
        ax.set_ylim(max(0.0, min(finite) - 0.05), min(1.0, max(finite) + 0.02))
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------- metrics (Lab 2)


def _metrics_t0(frame, steps) -> float:
    times = [
        s
        for s in (
            frame["time"].min() if len(frame) else None,
            steps["time"].min() if steps is not None and len(steps) else None,
        )
        if s is not None
    ]
    return min(times) if times else 0.0


def _throughput_panel(ax, steps, t0: float) -> None:
    """Examples/s per task from step events, with accuracy on a twin axis when reported."""
    if steps is not None and len(steps) and "examples" in steps:
        acc_ax = None
        for task, g in steps.groupby("task", sort=True):
            g = g.sort_values("time")
            dt, dex = g["time"].diff(), g["examples"].diff()
            ok = dt > 0
            ax.plot(g["time"][ok] - t0, (dex[ok] / dt[ok]), label=task)
            if "accuracy" in g and g["accuracy"].notna().any():
                acc_ax = acc_ax or ax.twinx()
                acc_ax.plot(g["time"] - t0, g["accuracy"], linestyle="--", alpha=0.6, label=f"{task} acc")
        if acc_ax is not None:
            acc_ax.set_ylabel("accuracy (--)")
        ax.legend(loc="upper left", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no step events", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("examples/s")


def _task_panels(axes, frame, t0: float) -> None:
    """CPU % and RSS of each task's process tree."""
    task_rows = frame[~frame["role"].isin(("host", "gpu"))] if len(frame) else frame
    for ax, metric, scale, label in (
        (axes[0], "cpu_percent", 1.0, "CPU % of one core"),
        (axes[1], "rss", 1 / 2**20, "RSS (MiB)"),
    ):
        sub = task_rows[task_rows["metric"] == metric] if len(task_rows) else task_rows
        for task, g in sub.groupby("task", sort=True):
            ax.plot(g["time"] - t0, g["value"] * scale, label=task)
        ax.set_ylabel(label)
        if len(sub):
            ax.legend(loc="upper left", fontsize="small")


def _network_panel(ax, frame, steps, t0: float) -> None:
    """Per-task bytes when they really are per task (own network namespace, or
    reported by the tasks), else host-level bytes per interface, labelled as such."""
    netns = frame[frame["metric"].isin(("task_net_recv", "task_net_sent"))] if len(frame) else frame
    per_task = steps is not None and len(steps) and "bytes_sent" in steps and steps["bytes_sent"].notna().any()
    if len(netns):
        for (task, metric), g in netns.groupby(["task", "metric"], sort=True):
            ax.plot(g["time"] - t0, g["value"] / 2**20, label=f"{task} {metric[9:]}")
        ax.set_ylabel("MiB/s per task\n(own network namespace)")
    elif per_task:
        for task, g in steps.dropna(subset=["bytes_sent"]).groupby("task", sort=True):
            dt = g["time"].diff()
            ok = dt > 0
            ax.plot(g["time"][ok] - t0, (g["bytes_sent"].diff()[ok] / dt[ok]) / 2**20, label=f"{task} sent")
        ax.set_ylabel("MiB/s per task\n(reported by tasks)")
    elif len(frame):
        net = frame[frame["metric"].isin(("net_recv", "net_sent"))]
        for (nic, metric), g in net.groupby(["task", "metric"], sort=True):
            if g["value"].max() > 0:
                ax.plot(g["time"] - t0, g["value"] / 2**20, label=f"{nic} {metric[4:]}")
        ax.set_ylabel("MiB/s, host-level\n(all tasks together)")
    if ax.lines:
        ax.legend(loc="upper left", fontsize="small")


def plot_metrics(frame, steps=None, *, title: str | None = None, t0: float | None = None):
    """One figure, one time axis: throughput (+ accuracy), CPU, memory, network.

    ``frame``: tidy samples (``Monitor.frame()``: time, role, task, metric, value);
    ``steps``: step events (``lab_utils.metrics.events_frame``); ``t0``: epoch
    seconds shown as 0 (default: the first sample or event). Built without pyplot
    (safe from a thread); a notebook displays the returned Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 8.5), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True)
    if t0 is None:
        t0 = _metrics_t0(frame, steps)
    _throughput_panel(axes[0], steps, t0)
    _task_panels(axes[1:3], frame, t0)
    _network_panel(axes[3], frame, steps, t0)
    axes[-1].set_xlabel("seconds")
    if title:
        fig.suptitle(title)
    return fig


def png_bytes(fig, dpi: int = 80) -> bytes:
    """A matplotlib Figure as PNG bytes (for an ``ipywidgets.Image`` or ``IPython.display.Image``)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


# --------------------------------------------------------------------------- scaling (Lab 4)


def bandwidth_curves(table: pd.DataFrame, title: str | None = None):
    """Bandwidth against message size, log-log: one line per ``... (GB/s)`` column of
    ``table`` (indexed by message size in bytes; Lab 4's ``busbw_table``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    for col in [c for c in table.columns if str(c).endswith("(GB/s)")]:
        ax.plot(table.index, table[col], marker="o", label=str(col).replace(" (GB/s)", ""))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bandwidth (GB/s)")
    if title:
        ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def speedup_curves(table: pd.DataFrame, title: str | None = None):
    """Speedup against workers, one line per ``method``, with the ideal line. Rows whose
    ``oversubscribed`` is true (more processes than usable cores: they measure the
    scheduler) are circled and named in the legend (Lab 4's ``scaling_table``)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    top = int(table["workers"].max())
    ax.plot([1, top], [1, top], "k--", alpha=0.5, label="ideal (linear)")
    for method, g in table.groupby("method"):
        g = g.sort_values("workers")
        (line,) = ax.plot(g["workers"], g["speedup"], marker="o", label=method)
        over = g[g["oversubscribed"]]
        if not over.empty:
            ax.plot(over["workers"], over["speedup"], "o", mfc="none", mec=line.get_color(), ms=14)
    if table["oversubscribed"].any():
        cores = table.attrs.get("usable_cores", "the")
        ax.plot([], [], "o", mfc="none", mec="gray", ms=14, label=f"oversubscribed (more processes than {cores} cores)")
    ax.set_xlabel("workers / ranks")
    ax.set_ylabel("speedup over 1 worker")
    ax.set_xticks(sorted(table["workers"].unique()))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
