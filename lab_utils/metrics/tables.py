"""Tables: step events as frames, throughput per task, and the seeds' summary table.

Honesty about the network. Host counters count bytes per *interface*; they
cannot split loopback traffic between the PS and the workers of one machine.
So per-task network figures come only from sources that really are per task:
the task's own network namespace (a container or ``unshare -n``: metrics
``task_net_recv/sent``), or a training script that reports
``bytes_sent``/``bytes_recv`` (cumulative) in its ``report.step`` events.
Otherwise :func:`summary_table` leaves the per-task cells empty and puts the
host-level bytes (all interfaces, loopback included) on the ``total`` row, and
the ``network_scope`` column says which one you got.

Events are read only through :mod:`lab_utils.report`.
"""

from __future__ import annotations

import glob
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lab_utils import report
from lab_utils.metrics.sampler import ROLES

__all__ = ["event_files", "events_frame", "summary_table", "SUMMARY_COLUMNS", "SUMMARY_UNITS"]

SUMMARY_COLUMNS = [
    "role",
    "Peak Mem",
    "Peak CPU",
    "Avg CPU",
    "Network R",
    "Network W",
    "network_scope",
    "Examples/s",
    "s/batch",
    "samples",
]
SUMMARY_UNITS = {
    "Peak Mem": "bytes (RSS summed over the task's process tree; total: peak of the sum)",
    "Peak CPU": "% of one core (200 = two busy cores); total: peak of the sum over tasks",
    "Avg CPU": "% of one core, mean over samples",
    "Network R": "bytes received during the run",
    "Network W": "bytes sent during the run",
    "network_scope": (
        "task = the task's own network namespace or bytes it reports in its step events; "
        "host = host counters of all interfaces incl. lo (cannot be split per task)"
    ),
    "Examples/s": "from the task's step events (examples delta / time delta)",
    "s/batch": "from the task's step events (time delta / step delta; local_step when reported)",
}

# --------------------------------------------------------------------------- events


def event_files(spec: Any) -> list[Path]:
    """Events files named by ``spec``: a file, a directory (its ``*.jsonl`` files,
    recursively) or a list of either; ``None`` names none."""
    if spec is None:
        return []
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if path.is_dir():
            return sorted(Path(p) for p in glob.glob(str(path / "**" / "*.jsonl"), recursive=True))
        return [path]
    if isinstance(spec, Iterable):
        out = []
        for item in spec:
            out += event_files(item)
        return out
    raise TypeError(f"events must be a path, a directory or a list of paths, got {type(spec).__name__}")


def events_frame(events: Any, kind: str | None = "step"):
    """Events of ``kind`` (default: step; None: all) from files/directories as a
    DataFrame with ``time``, ``role``, ``task`` and the event's fields, sorted by time."""
    import pandas as pd

    records = []
    for path in event_files(events):
        records += report.read_events(path, kind)
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return pd.DataFrame(columns=["time", "role", "task", "kind"])
    df["role"] = df["task"].astype(str).str.partition(":")[0]
    return df.sort_values("time", kind="stable").reset_index(drop=True)


def _task_throughput(g, all_g) -> dict:
    """Examples/s, s/batch, steps and reported network bytes of one task's step
    events ``g`` (inside the window) out of ``all_g`` (all of them)."""
    row: dict = {}
    if len(g) >= 2:
        dt = g["time"].iloc[-1] - g["time"].iloc[0]
        dex = g["examples"].iloc[-1] - g["examples"].iloc[0] if "examples" in g else float("nan")
        # a PS script may report the *global* step; ``local_step``, when given, is this task's own
        col = "local_step" if "local_step" in g and g["local_step"].notna().all() else "step"
        dsteps = g[col].iloc[-1] - g[col].iloc[0] if col in g else float("nan")
        row["Examples/s"] = dex / dt if dt > 0 else float("nan")
        row["s/batch"] = dt / dsteps if dsteps and dsteps > 0 else float("nan")
        row["steps"] = int(dsteps) if dsteps == dsteps else None
    for name, col in (("bytes_recv", "Network R"), ("bytes_sent", "Network W")):
        if name in g and g[name].notna().any():
            vals = g[name].dropna()
            first_ever = all_g[name].dropna().index[0] == vals.index[0]
            # cumulative counters: from the task's start if its first report is in the window
            row[col] = float(vals.iloc[-1] - (0 if first_ever else vals.iloc[0]))
    return row


def _throughput(steps, start: float | None = None, end: float | None = None) -> dict[str, dict]:
    """Per task from step events in ``[start, end]``: Examples/s, s/batch and per-task network bytes."""
    out: dict[str, dict] = {}
    if steps is None or steps.empty:
        return out
    for task, g in steps.groupby("task", sort=False):
        all_g = g
        if start is not None:
            g = g[(g["time"] >= start) & (g["time"] <= (end if end is not None else math.inf))]
        out[task] = _task_throughput(g, all_g)
    return out


# --------------------------------------------------------------------------- summary (the seeds' table)


def _task_order(task: str) -> tuple:
    role = task.partition(":")[0]
    return (ROLES.index(role) if role in ROLES else 99, task)


def _task_row(task: str, agg: Mapping[tuple, list], t: Mapping[str, Any]) -> dict:
    nan = float("nan")
    cpu = agg.get(("task", task, "cpu_percent"))
    mem = agg.get(("task", task, "rss"))
    per_task = "Network R" in t or "Network W" in t
    return {
        "role": task.partition(":")[0],
        "Peak Mem": mem[0] if mem else nan,
        "Peak CPU": cpu[0] if cpu else nan,
        "Avg CPU": cpu[1] / cpu[2] if cpu and cpu[2] else nan,
        "Network R": t.get("Network R", nan),
        "Network W": t.get("Network W", nan),
        "network_scope": t.get("scope", "task (reported by the task)")
        if per_task
        else "n/a (host-level only, see total)",
        "Examples/s": t.get("Examples/s", nan),
        "s/batch": t.get("s/batch", nan),
        "samples": mem[2] if mem else 0,
    }


def _total_row(df, agg: Mapping[tuple, list], host_bytes: Mapping[str, float], all_task_net: bool) -> dict:
    """The ``total`` row: peaks of the per-sample sums, and network bytes from the
    tasks when every task has its own figures, else from the host counters."""
    nan = float("nan")
    cpu, mem = agg.get(("total", "total", "cpu_percent")), agg.get(("total", "total", "rss"))
    if all_task_net:
        net_r, net_w, scope = df["Network R"].sum(), df["Network W"].sum(), "task (sum over tasks)"
    elif host_bytes:
        net_r, net_w = host_bytes.get("net_recv", nan), host_bytes.get("net_sent", nan)
        scope = "host (all interfaces incl. lo; not per task)"
    else:
        net_r = net_w = nan
        scope = "none"
    sb = df["s/batch"].dropna()
    return {
        "role": "total",
        "Peak Mem": mem[0] if mem else nan,
        "Peak CPU": cpu[0] if cpu else nan,
        "Avg CPU": cpu[1] / cpu[2] if cpu and cpu[2] else nan,
        "Network R": net_r,
        "Network W": net_w,
        "network_scope": scope,
        "Examples/s": df["Examples/s"].sum(min_count=1),
        "s/batch": sb.mean() if len(sb) else nan,
        "samples": mem[2] if mem else 0,
    }


def summary_table(
    agg: Mapping[tuple, list],
    host_bytes: Mapping[str, float],
    steps=None,
    start: float | None = None,
    end: float | None = None,
    task_bytes: Mapping[str, Mapping[str, float]] | None = None,
):
    """The seeds' table per task plus ``total`` (index ``task``, columns :data:`SUMMARY_COLUMNS`,
    units in ``.attrs["units"]``).

    ``agg``: running aggregates ``{(scope, task, metric): [max, sum, count]}`` (see
    :class:`~lab_utils.metrics.Monitor`); ``host_bytes``: ``{"net_recv"/"net_sent": bytes}``;
    ``steps``: step events (:func:`events_frame`), used between ``start`` and ``end``.
    Per-task bytes: ``task_bytes`` (measured in the task's own network namespace)
    first, else ``bytes_recv``/``bytes_sent`` reported in the task's step events."""
    import pandas as pd

    tput = _throughput(steps, start, end)
    for task, b in (task_bytes or {}).items():
        t = tput.setdefault(task, {})
        t["Network R"], t["Network W"] = b.get("task_net_recv", 0.0), b.get("task_net_sent", 0.0)
        t["scope"] = "task (own network namespace)"
    tasks = sorted({k[1] for k in agg if k[0] not in ("host", "gpu", "total")} | set(tput), key=_task_order)
    rows = {task: _task_row(task, agg, tput.get(task, {})) for task in tasks}
    df = pd.DataFrame.from_dict(rows, orient="index", columns=SUMMARY_COLUMNS)
    all_task_net = bool(rows) and all(r["network_scope"].startswith("task") for r in rows.values())
    total = _total_row(df, agg, host_bytes, all_task_net)
    df.loc["total"] = total
    df.index.name = "task"
    df.attrs["units"] = dict(SUMMARY_UNITS)
    df.attrs["network_scope"] = total["network_scope"]
    return df
