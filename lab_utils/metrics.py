"""dstat-like metrics per role (PS, worker i, rank i), aligned with training steps.

The seeds' analyses (async vs sync, PS vs workers, batch sizes, AlexNet tables)
rest on dstat: CPU, memory and network per node. This module gives students the
same numbers per *task* of a local cluster, with history, from the notebook::

    from lab_utils.metrics import Monitor

    with TFCluster(ps=1, workers=2, script="train_async.py") as cluster, \\
         Monitor(cluster=cluster, interval=1.0) as mon:
        mon.live()                  # in JupyterLab: a figure updated in place
        cluster.wait()
    mon.summary()                   # the seeds' table: Peak Mem, Peak CPU, Network R/W, Examples/s, s/batch
    mon.frame()                     # tidy: time, role, task, metric, value
    mon.to_csv("metrics.csv")
    mon.plot()                      # throughput/accuracy, CPU, memory, network on one time axis

Without a cluster: ``Monitor(tasks={"ps:0": pid, "worker:0": pid2}, events="run_dir/")``.
In a terminal: ``python -m lab_utils.metrics --interval 1 [--count N] [--task worker:0=PID]``.

What is measured (every metric is declared once in :data:`METRICS`):

- per task, summed over the task's process tree (root pid + all descendants):
  CPU % of one core, RSS bytes, threads, and GPU memory when NVML lists its pids;
- host: usr/sys/idl/wai % of all cores, CPU % per core, memory used/available,
  network bytes/s per interface (``lo`` included: a local cluster talks over
  loopback), disk read/write bytes/s;
- GPU (NVML, probed once; no GPU is not an error): utilisation %, memory used.

Honesty about the network. Host counters count bytes per *interface*; they
cannot split loopback traffic between the PS and the workers of one machine.
So per-task network figures come only from sources that really are per task:
the task's own network namespace (a container or ``unshare -n``: its
``/proc/<pid>/net/dev``, loopback excluded; metrics ``task_net_recv/sent``), or
a training script that reports ``bytes_sent``/``bytes_recv`` (cumulative) in
its ``report.step`` events. Otherwise :meth:`Monitor.summary` leaves the per-task
cells empty and puts the host-level bytes (all interfaces, loopback included) on
the ``total`` row, and the ``network_scope`` column says which one you got.

How CPU % of a process tree is computed. Each sample reads ``user + system``
CPU seconds of every process in the tree (keyed by pid *and* create time, so a
recycled pid is a new process) and divides the sum of the per-process increases
by the monotonic time elapsed. A process seen for the first time counts in full
if it was born after the previous listing of the tree (none of its CPU time was
seen before), else it is only a baseline. Descendants are listed at most once a
second (listing scans all of /proc); the known processes are read every sample.
A process that ended between two samples loses its last slice (a small
undercount, never a spike). ``children_user``/``children_system`` are
*not* used: they jump when a parent reaps a child. Hence no negative values and
no spikes when children come and go. Counter rates (network, disk) use the same
rule: delta over monotonic time; a counter that goes backwards (wrap, interface
re-created) gives no value for that interval and is re-baselined.

Why a thread in the kernel and not a sidecar process: a sample of a 3-task TF
cluster costs about 1.7 ms CPU (5 ms when it also re-lists the process trees,
once a second), mostly ``/proc`` reads that release the GIL; the bench measured
0.5 % of one core at 1 Hz and 1.7 % at 10 Hz. A sidecar would cost a second
interpreter (~20 MB, ~0.3 s to start), IPC to bring rows back into the
notebook, and one more process that can outlive a killed kernel. The thread is a
daemon, holds no lock while sampling and stops with ``stop()``/``with``.
``bench/bench_metrics_overhead.py`` measures its cost (CPU % of one core).

Nothing here writes to stderr (nbgrader scores a cell with stderr 0): problems
are kept in :attr:`Monitor.notes`.
"""
from __future__ import annotations

import argparse
import collections
import glob
import html
import io
import math
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import psutil

from lab_utils import report

__all__ = [
    "Metric",
    "METRICS",
    "ROLES",
    "Sampler",
    "Monitor",
    "events_frame",
    "summary_table",
    "plot_metrics",
    "is_headless",
    "validate_interval",
    "role_of",
    "main",
]

# --------------------------------------------------------------------------- declarations


@dataclass(frozen=True)
class Metric:
    """One metric, declared once. ``scope``: ``task`` (rows per task), ``host``
    (role ``host``; ``task`` is ``host``, ``cpu<N>``, an interface name or ``disk``)
    or ``gpu`` (role ``gpu``, task ``gpu:<N>``)."""

    name: str
    unit: str
    is_rate: bool
    scope: str
    help: str


METRICS: dict[str, Metric] = {m.name: m for m in [
    Metric("cpu_percent", "% of one core", True, "task", "CPU time of the task's process tree / wall time"),
    Metric("rss", "B", False, "task", "resident memory summed over the task's process tree (shared pages counted per process)"),
    Metric("threads", "count", False, "task", "threads summed over the task's process tree"),
    Metric("processes", "count", False, "task", "processes in the task's tree"),
    Metric("task_gpu_mem", "B", False, "task", "GPU memory NVML attributes to the tree's pids"),
    Metric("task_net_recv", "B/s", True, "task", "bytes received by the task's own network namespace (not lo); only when it has one"),
    Metric("task_net_sent", "B/s", True, "task", "bytes sent by the task's own network namespace (not lo); only when it has one"),
    Metric("cpu_usr", "% of all cores", True, "host", "host user + nice CPU time"),
    Metric("cpu_sys", "% of all cores", True, "host", "host system + irq + softirq CPU time"),
    Metric("cpu_idl", "% of all cores", True, "host", "host idle CPU time"),
    Metric("cpu_wai", "% of all cores", True, "host", "host I/O wait CPU time"),
    Metric("cpu_core_percent", "%", True, "host", "busy time of one core (task column: cpu<N>)"),
    Metric("mem_used", "B", False, "host", "host memory used (psutil virtual_memory().used)"),
    Metric("mem_available", "B", False, "host", "host memory available"),
    Metric("net_recv", "B/s", True, "host", "bytes received per interface, host-level (task column: interface)"),
    Metric("net_sent", "B/s", True, "host", "bytes sent per interface, host-level (task column: interface)"),
    Metric("disk_read", "B/s", True, "host", "bytes read from all disks"),
    Metric("disk_write", "B/s", True, "host", "bytes written to all disks"),
    Metric("gpu_util", "%", False, "gpu", "GPU utilisation reported by NVML"),
    Metric("gpu_mem_used", "B", False, "gpu", "GPU memory used reported by NVML"),
]}

#: Roles a task name may carry: the part of ``role:index`` before ``:``. An
#: MPI/Horovod job is sampled as ``rank:<r>`` once every rank has reported its pid
#: (``MPIJob.task_pids``); before that as one task named ``mpirun`` / ``horovodrun``
#: (the launcher with all its ranks).
ROLES = ("ps", "worker", "chief", "evaluator", "rank", "local", "mpirun", "horovodrun")
_LAUNCHERS = ("mpirun", "horovodrun")  # one task, no index: the launcher and its ranks
_ROW_ROLES = ROLES + ("host", "gpu", "total")
MIN_INTERVAL, MAX_INTERVAL = 0.1, 60.0
_LOCAL_HOSTS = (None, "", "localhost", "127.0.0.1", "::1", socket.gethostname())

Row = tuple  # (time, role, task, metric, value)


def validate_interval(interval: Any) -> float:
    """Sampling interval in seconds: 0.1 (10 Hz) to 60."""
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval):
        raise ValueError(f"interval must be a number of seconds between {MIN_INTERVAL} and {MAX_INTERVAL}, got {interval!r}")
    if interval <= 0 or interval > MAX_INTERVAL:
        raise ValueError(f"interval must be > 0 and <= {MAX_INTERVAL} seconds, got {interval!r}")
    if interval < MIN_INTERVAL:
        raise ValueError(f"interval {interval!r} s is faster than 10 Hz; use at least {MIN_INTERVAL} s")
    return float(interval)


def role_of(task: str) -> str:
    """``"worker:1"`` -> ``"worker"``; ValueError for a role not in :data:`ROLES`."""
    if not isinstance(task, str) or not task:
        raise ValueError(f"task name must be a non-empty string like 'worker:0', got {task!r}")
    role, sep, index = task.partition(":")
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r} in task name {task!r}; allowed roles: {', '.join(ROLES)}")
    if (sep or role not in _LAUNCHERS) and not index.isdigit():
        raise ValueError(f"task name {task!r} must look like '{role}:<index>' with an integer index")
    return role


def _check_role_filter(role: str | None) -> None:
    if role is not None and role not in _ROW_ROLES:
        raise ValueError(f"unknown role {role!r}; allowed: {', '.join(_ROW_ROLES)}")


# --------------------------------------------------------------------------- the sampler


class _CounterRates:
    """Rates from monotonically increasing counters; totals of the increases."""

    def __init__(self):
        self.prev: dict[Any, tuple[float, float]] = {}
        self.totals: dict[Any, float] = collections.defaultdict(float)
        self.resets = 0

    def rate(self, key: Any, value: float, now: float) -> float | None:
        prev = self.prev.get(key)
        self.prev[key] = (now, value)
        if prev is None:
            return None  # baseline
        dt, dv = now - prev[0], value - prev[1]
        if dt <= 0:
            return None
        if dv < 0:  # wrap or reset: no value for this interval, re-baselined above
            self.resets += 1
            return None
        self.totals[key] += dv
        return dv / dt

    def forget_missing(self, keys: Iterable[Any]) -> None:
        keep = set(keys)
        for key in [k for k in self.prev if k not in keep]:
            del self.prev[key]


class _Gpu:
    """NVML, probed once. ``available`` False when there is no library or GPU."""

    def __init__(self, nvml: Any = None):
        self.available, self.handles, self.nvml, self.reason = False, [], None, ""
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError:
                self.reason = "pynvml (nvidia-ml-py) is not installed"
                return
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            self.reason = f"NVML not usable: {exc}"
            return
        self.available = bool(self.handles)
        if not self.available:
            self.reason = "NVML found no GPU"

    def sample(self) -> tuple[list[tuple[str, str, float]], dict[int, int]]:
        rows, per_pid = [], {}
        for i, h in enumerate(self.handles):
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                rows += [(f"gpu:{i}", "gpu_util", float(util.gpu)), (f"gpu:{i}", "gpu_mem_used", float(mem.used))]
                for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = getattr(p, "usedGpuMemory", None)
                    if used:
                        per_pid[p.pid] = per_pid.get(p.pid, 0) + int(used)
            except self.nvml.NVMLError:
                continue  # a device that stops answering is skipped for this sample
        return rows, per_pid


class _TaskState(NamedTuple):
    mono: float
    wall: float
    cpu: dict  # (pid, create_time) -> cpu seconds


TaskSource = Mapping[str, int] | Callable[[], Mapping[str, int]]


class Sampler:
    """One sample at a time (no thread): what :class:`Monitor` and the terminal mode call.

    ``tasks``: ``{task_name: root_pid}`` or a callable returning it (read at every
    sample, so tasks may come and go). ``tree_refresh``: seconds between
    listings of each task's descendants (a scan of /proc, the costly part at
    10 Hz); known processes are re-read at every sample. ``ps``/``clock``/
    ``wallclock``/``nvml`` are injection points for the unit tests.
    """

    def __init__(self, tasks: TaskSource | None = None, *, host: bool = True, gpu: bool = True,
                 ps: Any = psutil, clock: Callable[[], float] = time.monotonic,
                 wallclock: Callable[[], float] = time.time, nvml: Any = None, tree_refresh: float = 1.0,
                 netns: Callable[[int], dict | None] | None = None):
        if tasks is not None and not callable(tasks) and not isinstance(tasks, Mapping):
            raise TypeError(f"tasks must be a mapping {{task name: pid}} or a callable returning one, got {type(tasks).__name__}")
        if isinstance(tasks, Mapping):
            _validate_tasks(tasks)
        self._tasks, self.host, self.ps = tasks, host, ps
        self.clock, self.wallclock = clock, wallclock
        self.gpu = _Gpu(nvml) if gpu else None
        self.counters = _CounterRates()
        self._cpu_prev: tuple[float, Any, list] | None = None
        self._task_state: dict[str, _TaskState] = {}
        self._trees: dict[str, tuple] = {}  # task -> (root pid, mono, wall of the scan, [processes])
        self.tree_refresh = tree_refresh
        self.netns = netns if netns is not None else _netns_counters
        self.exited: dict[str, float] = {}  # task -> wall time it was first seen gone
        self.denied = 0  # processes we were not allowed to read
        self.samples = 0

    # -- tasks
    def task_pids(self) -> dict[str, int]:
        if self._tasks is None:
            return {}
        tasks = self._tasks() if callable(self._tasks) else self._tasks
        tasks = {k: v for k, v in (tasks or {}).items() if v is not None}
        _validate_tasks(tasks)
        return tasks

    def _tree(self, name: str, pid: int, mono: float, wall: float) -> list:
        """Root process and all descendants. The descendants are re-listed at most
        every ``tree_refresh`` seconds (listing them scans all of /proc); between
        scans the cached processes are re-read. NoSuchProcess if the root is gone."""
        cached = self._trees.get(name)
        if cached is not None and cached[0] == pid and mono - cached[1] < self.tree_refresh:
            return cached[3]
        root = cached[3][0] if cached is not None and cached[0] == pid else self.ps.Process(pid)
        procs = [root] + list(root.children(recursive=True))
        self._trees[name] = (pid, mono, wall, procs)
        return procs

    def _gone(self, name: str, wall: float) -> list:
        for metric in ("task_net_recv", "task_net_sent"):
            self.counters.prev.pop((name, metric), None)
        self._trees.pop(name, None)
        self._task_state.pop(name, None)
        self.exited.setdefault(name, wall)
        return []

    def _sample_task(self, name: str, pid: int, mono: float, wall: float, gpu_pids: dict) -> list[tuple]:
        prev_scan = self._trees[name][2] if name in self._trees else None
        try:
            procs = self._tree(name, pid, mono, wall)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return self._gone(name, wall)
        except psutil.AccessDenied:
            self.denied += 1
            return []
        prev = self._task_state.get(name)
        # A process we have not seen yet counts in full if it was born after the last
        # tree scan (it could not have been seen before), else it is only a baseline.
        born_after = prev_scan if prev_scan is not None else (prev.wall if prev is not None else math.inf)
        cpu_now: dict = {}
        cpu_delta = rss = threads = nproc = gpu_mem = 0
        for proc in procs:
            try:
                with proc.oneshot():
                    if proc is procs[0] and proc.status() == psutil.STATUS_ZOMBIE:
                        return self._gone(name, wall)  # the task ended; its launcher has not reaped it yet
                    key = (proc.pid, proc.create_time())
                    t = proc.cpu_times()
                    seconds = t.user + t.system
                    mem = proc.memory_info().rss
                    nthreads = proc.num_threads()
                if mem == 0:
                    # A user process always has resident pages; none means it is inside
                    # exit() (memory released, not yet a zombie): count it as gone.
                    raise psutil.ZombieProcess(proc.pid)
            except psutil.ZombieProcess:
                if proc is procs[0]:
                    return self._gone(name, wall)
                continue  # exited, not yet reaped: nothing left to count
            except psutil.NoSuchProcess:
                if proc is procs[0]:
                    return self._gone(name, wall)
                continue  # ended since the tree was listed
            except psutil.AccessDenied:
                self.denied += 1
                continue
            cpu_now[key] = seconds
            rss, threads, nproc = rss + mem, threads + nthreads, nproc + 1
            gpu_mem += gpu_pids.get(proc.pid, 0)
            if prev is not None:
                if key in prev.cpu:
                    cpu_delta += max(0.0, seconds - prev.cpu[key])
                elif key[1] >= born_after:
                    cpu_delta += seconds
        self.exited.pop(name, None)
        self._task_state[name] = _TaskState(mono, wall, cpu_now)
        out = [("rss", float(rss)), ("threads", float(threads)), ("processes", float(nproc))]
        if prev is not None and mono > prev.mono:
            out.insert(0, ("cpu_percent", 100.0 * cpu_delta / (mono - prev.mono)))
        if self.gpu is not None and self.gpu.available:
            out.append(("task_gpu_mem", float(gpu_mem)))
        nets = self.netns(pid)
        if nets is not None:  # the task has its own network namespace: its bytes are its own
            for metric, index in (("task_net_recv", 0), ("task_net_sent", 1)):
                r = self.counters.rate((name, metric), float(sum(v[index] for v in nets.values())), mono)
                if r is not None:
                    out.append((metric, r))
        return out

    # -- host
    def _sample_cpu(self, mono: float) -> list[tuple[str, str, float]]:
        per_core = self.ps.cpu_times(percpu=True)
        prev, self._cpu_prev = self._cpu_prev, (mono, per_core)
        if prev is None or len(prev[1]) != len(per_core):
            return []
        rows, sums = [], collections.defaultdict(float)
        for i, (a, b) in enumerate(zip(prev[1], per_core)):
            d = {f: max(0.0, getattr(b, f, 0.0) - getattr(a, f, 0.0)) for f in b._fields}
            total = sum(v for f, v in d.items() if f not in ("guest", "guest_nice"))  # guest is inside user
            if total <= 0:
                continue
            idle = d.get("idle", 0.0) + d.get("iowait", 0.0)
            rows.append((f"cpu{i}", "cpu_core_percent", 100.0 * (total - idle) / total))
            sums["total"] += total
            sums["usr"] += d.get("user", 0.0) + d.get("nice", 0.0)
            sums["sys"] += d.get("system", 0.0) + d.get("irq", 0.0) + d.get("softirq", 0.0) + d.get("steal", 0.0)
            sums["idl"] += d.get("idle", 0.0)
            sums["wai"] += d.get("iowait", 0.0)
        if sums["total"] > 0:
            for part in ("usr", "sys", "idl", "wai"):
                rows.append(("host", f"cpu_{part}", 100.0 * sums[part] / sums["total"]))
        return rows

    def _sample_host(self, mono: float) -> list[tuple[str, str, float]]:
        rows = self._sample_cpu(mono)
        vm = self.ps.virtual_memory()
        rows += [("host", "mem_used", float(vm.used)), ("host", "mem_available", float(vm.available))]
        nics = self.ps.net_io_counters(pernic=True) or {}
        for nic, c in nics.items():
            for metric, value in (("net_recv", c.bytes_recv), ("net_sent", c.bytes_sent)):
                r = self.counters.rate((nic, metric), value, mono)
                if r is not None:
                    rows.append((nic, metric, r))
        disk = self.ps.disk_io_counters(perdisk=False)  # None in some containers
        if disk is not None:
            for metric, value in (("disk_read", disk.read_bytes), ("disk_write", disk.write_bytes)):
                r = self.counters.rate(("disk", metric), value, mono)
                if r is not None:
                    rows.append(("disk", metric, r))
        self.counters.forget_missing([(n, m) for n in nics for m in ("net_recv", "net_sent")]
                                     + ([("disk", "disk_read"), ("disk", "disk_write")] if disk is not None else [])
                                     + [k for k in self.counters.prev if k[1].startswith("task_")])
        return rows

    # -- one sample
    def sample(self) -> tuple[float, list[Row]]:
        """Take one sample; return ``(wall_time, rows)``. The first one is a baseline
        (no rates yet)."""
        mono, wall = self.clock(), self.wallclock()
        rows: list[Row] = []
        gpu_pids: dict = {}
        if self.gpu is not None and self.gpu.available:
            gpu_rows, gpu_pids = self.gpu.sample()
            rows += [(wall, "gpu", dev, metric, value) for dev, metric, value in gpu_rows]
        if self.host:
            rows += [(wall, "host", dev, metric, value) for dev, metric, value in self._sample_host(mono)]
        tasks = self.task_pids()
        for name, pid in tasks.items():
            role = role_of(name)
            rows += [(wall, role, name, metric, value) for metric, value in self._sample_task(name, pid, mono, wall, gpu_pids)]
        for name in [n for n in self._task_state if n not in tasks]:
            del self._task_state[name]
        for name in [n for n in self._trees if n not in tasks]:
            del self._trees[name]
        self.samples += 1
        return wall, rows


def _netns_counters(pid: int, proc_root: str = "/proc") -> dict[str, tuple[int, int]] | None:
    """``{interface: (bytes_recv, bytes_sent)}`` of ``pid``'s network namespace when
    it differs from ours (a container or ``unshare -n`` task), else None: in the
    shared namespace the counters are the host's, not the task's."""
    try:
        if os.readlink(f"{proc_root}/{pid}/ns/net") == os.readlink(f"{proc_root}/self/ns/net"):
            return None
        with open(f"{proc_root}/{pid}/net/dev", encoding="ascii") as fh:
            lines = fh.readlines()[2:]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = {}
    for line in lines:
        nic, _, rest = line.partition(":")
        fields = rest.split()
        if nic.strip() != "lo" and len(fields) >= 9:
            out[nic.strip()] = (int(fields[0]), int(fields[8]))
    return out


def _validate_tasks(tasks: Mapping[str, Any]) -> None:
    for name, pid in tasks.items():
        role_of(name)
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"pid of task {name!r} must be a positive integer, got {pid!r}")


# --------------------------------------------------------------------------- events


def _event_files(spec: Any) -> list[Path]:
    """A file, a directory (its ``*.jsonl`` files, recursively) or a list of either."""
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
            out += _event_files(item)
        return out
    raise TypeError(f"events must be a path, a directory or a list of paths, got {type(spec).__name__}")


def events_frame(events: Any, kind: str | None = "step"):
    """Events of ``kind`` (default: step) from files/directories as a DataFrame
    with ``time``, ``role``, ``task`` and the event's fields, sorted by time."""
    import pandas as pd

    records = []
    for path in _event_files(events):
        records += [e for e in report.iter_events(path) if kind is None or e.get("kind") == kind]
    df = pd.DataFrame.from_records(records)
    if df.empty:
        return pd.DataFrame(columns=["time", "role", "task", "kind"])
    df["role"] = df["task"].astype(str).str.partition(":")[0]
    return df.sort_values("time", kind="stable").reset_index(drop=True)


def _throughput(steps, start: float | None = None, end: float | None = None) -> dict[str, dict]:
    """Per task from step events: Examples/s, s/batch and per-task network bytes."""
    out: dict[str, dict] = {}
    if steps is None or steps.empty:
        return out
    for task, g in steps.groupby("task", sort=False):
        all_g = g
        if start is not None:
            g = g[(g["time"] >= start) & (g["time"] <= (end if end is not None else math.inf))]
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
        for field, col in (("bytes_recv", "Network R"), ("bytes_sent", "Network W")):
            if field in g and g[field].notna().any():
                vals = g[field].dropna()
                first_ever = all_g[field].dropna().index[0] == vals.index[0]
                # cumulative counters: from the task's start if its first report is in the window
                row[col] = float(vals.iloc[-1] - (0 if first_ever else vals.iloc[0]))
        out[task] = row
    return out


# --------------------------------------------------------------------------- summary (the seeds' table)

SUMMARY_COLUMNS = ["role", "Peak Mem", "Peak CPU", "Avg CPU", "Network R", "Network W", "network_scope",
                   "Examples/s", "s/batch", "samples"]
SUMMARY_UNITS = {
    "Peak Mem": "bytes (RSS summed over the task's process tree; total: peak of the sum)",
    "Peak CPU": "% of one core (200 = two busy cores); total: peak of the sum over tasks",
    "Avg CPU": "% of one core, mean over samples",
    "Network R": "bytes received during the run",
    "Network W": "bytes sent during the run",
    "network_scope": ("task = the task's own network namespace or bytes it reports in its step events; "
                      "host = host counters of all interfaces incl. lo (cannot be split per task)"),
    "Examples/s": "from the task's step events (examples delta / time delta)",
    "s/batch": "from the task's step events (time delta / step delta; local_step when reported)",
}


def summary_table(agg: Mapping[tuple, list], host_bytes: Mapping[str, float], steps=None,
                  start: float | None = None, end: float | None = None,
                  task_bytes: Mapping[str, Mapping[str, float]] | None = None):
    """Build the table from running aggregates (see :class:`Monitor`). Per-task
    bytes: ``task_bytes`` (measured in the task's own network namespace) first,
    else ``bytes_recv``/``bytes_sent`` reported in the task's step events."""
    import pandas as pd

    tput = _throughput(steps, start, end)
    for task, b in (task_bytes or {}).items():
        t = tput.setdefault(task, {})
        t["Network R"], t["Network W"] = b.get("task_net_recv", 0.0), b.get("task_net_sent", 0.0)
        t["scope"] = "task (own network namespace)"
    tasks = sorted({k[1] for k in agg if k[0] not in ("host", "gpu", "total")} | set(tput),
                   key=lambda t: (ROLES.index(t.partition(":")[0]) if t.partition(":")[0] in ROLES else 99, t))
    rows = {}
    nan = float("nan")
    for task in tasks:
        cpu = agg.get(("task", task, "cpu_percent"))
        mem = agg.get(("task", task, "rss"))
        t = tput.get(task, {})
        per_task = "Network R" in t or "Network W" in t
        rows[task] = {
            "role": task.partition(":")[0],
            "Peak Mem": mem[0] if mem else nan,
            "Peak CPU": cpu[0] if cpu else nan,
            "Avg CPU": cpu[1] / cpu[2] if cpu and cpu[2] else nan,
            "Network R": t.get("Network R", nan),
            "Network W": t.get("Network W", nan),
            "network_scope": t.get("scope", "task (reported by the task)") if per_task else "n/a (host-level only, see total)",
            "Examples/s": t.get("Examples/s", nan),
            "s/batch": t.get("s/batch", nan),
            "samples": mem[2] if mem else 0,
        }
    df = pd.DataFrame.from_dict(rows, orient="index", columns=SUMMARY_COLUMNS)
    all_task_net = bool(rows) and all(r["network_scope"].startswith("task") for r in rows.values())
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
    df.loc["total"] = {
        "role": "total",
        "Peak Mem": mem[0] if mem else nan,
        "Peak CPU": cpu[0] if cpu else nan,
        "Avg CPU": cpu[1] / cpu[2] if cpu and cpu[2] else nan,
        "Network R": net_r, "Network W": net_w, "network_scope": scope,
        "Examples/s": df["Examples/s"].sum(min_count=1),
        "s/batch": sb.mean() if len(sb) else nan,
        "samples": mem[2] if mem else 0,
    }
    df.index.name = "task"
    df.attrs["units"] = dict(SUMMARY_UNITS)
    df.attrs["network_scope"] = scope
    return df


# --------------------------------------------------------------------------- plotting (metrics only)


def plot_metrics(frame, steps=None, *, title: str | None = None, t0: float | None = None):
    """One figure, one time axis: throughput (+ accuracy), CPU, memory, network.
    Built without pyplot (safe from a thread); a notebook displays the returned Figure."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 8.5), layout="constrained")
    axes = fig.subplots(4, 1, sharex=True)
    if t0 is None:
        times = [s for s in (frame["time"].min() if len(frame) else None,
                             steps["time"].min() if steps is not None and len(steps) else None) if s is not None]
        t0 = min(times) if times else 0.0
    ax = axes[0]
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
    task_rows = frame[~frame["role"].isin(("host", "gpu"))] if len(frame) else frame
    for ax, metric, scale, label in ((axes[1], "cpu_percent", 1.0, "CPU % of one core"),
                                     (axes[2], "rss", 1 / 2**20, "RSS (MiB)")):
        sub = task_rows[task_rows["metric"] == metric] if len(task_rows) else task_rows
        for task, g in sub.groupby("task", sort=True):
            ax.plot(g["time"] - t0, g["value"] * scale, label=task)
        ax.set_ylabel(label)
        if len(sub):
            ax.legend(loc="upper left", fontsize="small")
    ax = axes[3]
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
    axes[-1].set_xlabel("seconds")
    if title:
        fig.suptitle(title)
    return fig


def _png(fig) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def is_headless(env: Mapping[str, str] | None = None) -> bool:
    """True under papermill, nbgrader, nbconvert, plain Python or a terminal
    IPython: there a widget would never be seen, so draw a static figure instead.
    ``LABS_HEADLESS=0/1`` forces the answer."""
    env = os.environ if env is None else env
    forced = env.get("LABS_HEADLESS")
    if forced not in (None, ""):
        return forced.lower() not in ("0", "false", "no")
    if env.get("NBGRADER_EXECUTION") or any(k.startswith("PAPERMILL") for k in env):
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return True
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return True
    return _launched_headless(psutil.Process())


_HEADLESS_WORDS = ("papermill", "nbgrader", "nbconvert", "nbclient", "pytest", "run_labs")
_FRONTEND_WORDS = ("jupyter-lab", "jupyterlab", "jupyter-notebook", "jupyter_server", "jupyter-server",
                   "singleuser", "voila", "vscode", "code-server")


def _launched_headless(proc, depth: int = 4) -> bool:
    """Look at the kernel's ancestors: a papermill/nbgrader/nbconvert runner means
    headless, a Jupyter server or an editor means a frontend; unknown means headless
    (a static figure is always seen; a widget without a frontend never is)."""
    for _ in range(depth):
        try:
            proc = proc.parent()
            if proc is None:
                break
            cmd = " ".join(proc.cmdline()).lower()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            break
        if any(word in cmd for word in _HEADLESS_WORDS):
            return True
        if any(word in cmd for word in _FRONTEND_WORDS):
            return False
    return True


# --------------------------------------------------------------------------- the monitor


class Monitor:
    """Background sampler of a cluster's tasks and the host (a daemon thread).

    ``tasks``: ``{task: pid}`` or a callable returning it. ``cluster``: an object
    with ``task_pids()`` (else its ``tasks`` list of objects with ``name``/``pid``
    is used); its events files are used for summary/plot unless ``events`` is given.
    ``events``: events file(s) or directory (``*.jsonl``) for Examples/s, s/batch,
    per-task network bytes and plots. ``max_samples`` bounds the kept history
    (the summary's peaks and totals cover the whole run anyway).
    """

    def __init__(self, tasks: TaskSource | None = None, *, cluster: Any = None, interval: float = 1.0,
                 events: Any = None, max_samples: int = 3600, host: bool = True, gpu: bool = True,
                 sampler: Sampler | None = None):
        self.interval = validate_interval(interval)
        if isinstance(max_samples, bool) or not isinstance(max_samples, int) or max_samples < 2:
            raise ValueError(f"max_samples must be an integer >= 2, got {max_samples!r}")
        if tasks is not None and cluster is not None:
            raise ValueError("give either tasks= or cluster=, not both")
        self.cluster = cluster
        if cluster is not None:
            if not (callable(getattr(cluster, "task_pids", None)) or hasattr(cluster, "tasks")):
                raise TypeError(f"cluster {type(cluster).__name__} has neither task_pids() nor tasks; "
                                "pass tasks={'worker:0': pid, ...} instead")
            tasks = self._cluster_pids
        self.sampler = sampler or Sampler(tasks, host=host, gpu=gpu)
        self._events = events
        self._buffer: collections.deque = collections.deque(maxlen=max_samples)
        self._agg: dict[tuple, list] = {}  # (scope, task, metric) -> [max, sum, count]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._render: threading.Thread | None = None
        self._live: dict | None = None
        self._static_at_stop = False
        self.error: BaseException | None = None
        self.notes: list[str] = []
        self.start_time: float | None = None
        self.stop_time: float | None = None
        self.dropped = 0  # samples pushed out of the bounded buffer
        self.on_sample: Callable[[float, list[Row]], None] | None = None
        if self.sampler.gpu is not None and not self.sampler.gpu.available:
            self.notes.append(f"no GPU metrics: {self.sampler.gpu.reason}")

    # -- sources
    def _cluster_pids(self) -> dict[str, int]:
        c = self.cluster
        fn = getattr(c, "task_pids", None)
        if callable(fn):
            return dict(fn() or {})
        out = {}
        for t in getattr(c, "tasks", []):
            if not getattr(t, "pid", None):
                continue
            if getattr(t, "host", None) not in _LOCAL_HOSTS:  # the local pid is ssh's, not the task's
                note = f"{t.name} runs on {t.host}: not sampled (only local tasks can be)"
                if note not in self.notes:
                    self.notes.append(note)
                continue
            out[t.name] = t.pid
        return out

    def event_files(self) -> list[Path]:
        if self._events is not None:
            return _event_files(self._events)
        c = self.cluster
        if c is None:
            return []
        files = [getattr(t, "events_path", None) for t in getattr(c, "tasks", [])]
        files = [f for f in files if f]
        if not files and getattr(c, "run_dir", None):
            files = _event_files(c.run_dir)
        return [Path(f) for f in files]

    def steps(self):
        """Step events of the monitored tasks (a DataFrame)."""
        return events_frame(self.event_files(), "step")

    # -- life cycle
    def start(self) -> "Monitor":
        if self._thread is not None:
            raise RuntimeError("this Monitor is already running; use a new Monitor for a new run")
        self.start_time = time.time()
        self._record(*self.sampler.sample())  # baseline (first rates come with the next sample)
        self._thread = threading.Thread(target=self._run, name="lab_utils.metrics", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        clock = self.sampler.clock
        due = clock() + self.interval
        while not self._stop.wait(max(0.0, due - clock())):
            try:
                self._record(*self.sampler.sample())
            except Exception as exc:  # noqa: BLE001 - not swallowed: kept and re-raised by stop(), never printed
                self.error = exc
                return
            due += self.interval
            now = clock()
            if due < now:  # fell behind (suspended laptop, busy host): skip missed ticks
                due = now + self.interval

    def _record(self, wall: float, rows: list[Row]) -> None:
        cpu_total = rss_total = 0.0
        have_cpu = have_rss = False
        with self._lock:
            if len(self._buffer) == self._buffer.maxlen:
                self.dropped += 1
            self._buffer.append((wall, rows))
            for _, role, task, metric, value in rows:
                scope = METRICS[metric].scope
                key = (scope, task, metric)
                a = self._agg.get(key)
                if a is None:
                    self._agg[key] = [value, value, 1]
                else:
                    a[0] = max(a[0], value)
                    a[1] += value
                    a[2] += 1
                if scope == "task":
                    if metric == "cpu_percent":
                        cpu_total, have_cpu = cpu_total + value, True
                    elif metric == "rss":
                        rss_total, have_rss = rss_total + value, True
            for metric, value, ok in (("cpu_percent", cpu_total, have_cpu), ("rss", rss_total, have_rss)):
                if ok:
                    a = self._agg.setdefault(("total", "total", metric), [value, 0.0, 0])
                    a[0] = max(a[0], value)
                    a[1] += value
                    a[2] += 1
        if self.on_sample is not None:
            self.on_sample(wall, rows)

    def stop(self, _raise: bool = True) -> None:
        """Stop sampling (idempotent); draw the final live/static figure; raise a sampler error."""
        if self._thread is None or self.stop_time is not None:
            return
        self._stop.set()
        self._thread.join(timeout=max(5.0, 3 * self.interval))
        if self._render is not None:
            self._render.join(timeout=10.0)
        self.stop_time = time.time()
        if self._live is not None:
            self._draw_live()
        elif self._static_at_stop:
            self._display_static()
        if self.error is not None and not _raise:
            self.notes.append(f"metrics sampler stopped early: {self.error!r}")
        elif self.error is not None:
            raise RuntimeError(f"metrics sampler stopped early: {self.error!r}") from self.error

    def __enter__(self) -> "Monitor":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(_raise=exc_type is None)  # never hide the body's own exception

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- outputs
    def frame(self, role: str | None = None, metric: str | None = None):
        """Tidy DataFrame: ``time`` (epoch s, joins with report events), ``role``,
        ``task``, ``metric``, ``value``. Units: :data:`METRICS`."""
        import pandas as pd

        _check_role_filter(role)
        if metric is not None and metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        with self._lock:
            rows = [r for _, sample in self._buffer for r in sample]
        df = pd.DataFrame.from_records(rows, columns=["time", "role", "task", "metric", "value"])
        if role is not None:
            df = df[df["role"] == role]
        if metric is not None:
            df = df[df["metric"] == metric]
        return df.reset_index(drop=True)

    def to_csv(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.frame().to_csv(path, index=False)
        return path

    def summary(self, events: Any = None, role: str | None = None):
        """The seeds' table per task plus ``total``: Peak Mem, Peak CPU, Network R,
        Network W (with ``network_scope``), Examples/s, s/batch. Units in ``.attrs``."""
        _check_role_filter(role)
        steps = events_frame(events, "step") if events is not None else self.steps()
        with self._lock:
            agg = {k: list(v) for k, v in self._agg.items()}
            host_bytes = collections.defaultdict(float)
            task_bytes: dict = collections.defaultdict(dict)
            for (dev, metric), total in self.sampler.counters.totals.items():
                if metric in ("net_recv", "net_sent"):
                    host_bytes[metric] += total
                elif metric in ("task_net_recv", "task_net_sent"):
                    task_bytes[dev][metric] = total
        df = summary_table(agg, host_bytes, steps, self.start_time, self.stop_time, task_bytes)
        if role is not None:
            df = df[df["role"] == role]
        return df

    def plot(self, events: Any = None):
        """A static matplotlib Figure: throughput/accuracy, CPU, memory, network vs time."""
        steps = events_frame(events, "step") if events is not None else self.steps()
        return plot_metrics(self.frame(), steps, t0=self.start_time)

    # -- live view
    def live(self, every: float = 2.0, headless: bool | None = None):
        """In JupyterLab: show a figure updated in place at most every ``every``
        seconds (default 2). Headless (papermill, nbgrader, a script): returns at
        once and one static figure is displayed when the monitor stops."""
        if isinstance(every, bool) or not isinstance(every, (int, float)) or not (0.5 <= every <= 600):
            raise ValueError(f"every must be between 0.5 and 600 seconds, got {every!r}")
        if headless if headless is not None else is_headless():
            if self.stop_time is not None:
                self._display_static()
            else:
                self._static_at_stop = True
            return None
        import ipywidgets as widgets
        from IPython.display import display

        image, label = widgets.Image(format="png"), widgets.HTML()
        self._live = {"image": image, "label": label, "every": float(every)}
        display(widgets.VBox([label, image]))
        self._draw_live()
        if self.running and self._render is None:
            self._render = threading.Thread(target=self._render_loop, name="lab_utils.metrics.live", daemon=True)
            self._render.start()
        return None

    def _render_loop(self) -> None:
        while not self._stop.wait(self._live["every"]):
            try:
                self._draw_live()
            except Exception as exc:  # noqa: BLE001 - a thread's traceback would go to stderr; keep it visible instead
                self.notes.append(f"live view stopped: {exc!r}")
                self._live["label"].value = html.escape(f"live view stopped: {exc!r}")
                return

    def _draw_live(self) -> None:
        live = self._live
        live["image"].value = _png(self.plot())
        state = "running" if self.running else "stopped"
        live["label"].value = html.escape(f"metrics {state}: {self.sampler.samples} samples, every {self.interval:g} s")

    def _display_static(self) -> None:
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return
        if get_ipython() is not None:
            display(Image(_png(self.plot())))

    # -- notebook repr
    def __repr__(self) -> str:
        state = "running" if self.running else ("stopped" if self.stop_time else "not started")
        tasks = ", ".join(self.sampler.task_pids()) if self._thread else "?"
        return f"<Monitor {state}, every {self.interval:g} s, {self.sampler.samples} samples, tasks: {tasks}>"

    def _repr_html_(self) -> str:
        return f"<code>{html.escape(repr(self))}</code>" + (
            f"<br><small>{html.escape('; '.join(self.notes))}</small>" if self.notes else "")


# --------------------------------------------------------------------------- terminal mode


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":
            return f"{n:4.0f}{unit}" if unit == "" else (f"{n:4.1f}{unit}" if abs(n) < 10 else f"{n:4.0f}{unit}")
        n /= 1024
    return f"{n:.0f}"


_HEADER = ("----total-cpu---- ---memory--- -net/total- -dsk/total-" , " usr  sys  idl  wai  used  avail  recv  send  read  writ")


def _terminal_line(rows: list[Row]) -> str:
    v = collections.defaultdict(float)
    for _, role, task, metric, value in rows:
        if role == "host":
            v[metric] += value  # net: summed over interfaces (lo included)
    return (f"{v['cpu_usr']:4.0f} {v['cpu_sys']:4.0f} {v['cpu_idl']:4.0f} {v['cpu_wai']:4.0f} "
            f"{_human(v['mem_used']):>5} {_human(v['mem_available']):>6} {_human(v['net_recv']):>5} {_human(v['net_sent']):>5} "
            f"{_human(v['disk_read']):>5} {_human(v['disk_write']):>5}")


def _task_arg(text: str) -> tuple[str, int]:
    name, sep, pid = text.partition("=")
    if not sep or not pid.isdigit():
        raise argparse.ArgumentTypeError(f"--task wants NAME=PID like worker:0=1234, got {text!r}")
    try:
        role_of(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name, int(pid)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.metrics",
                                     description="dstat-like host metrics (and per-task CPU/RSS with --task).")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between lines (0.1-60, default 1)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many lines")
    parser.add_argument("--task", type=_task_arg, action="append", default=[], metavar="NAME=PID",
                        help="also show CPU %% and RSS of a task's process tree, e.g. worker:0=1234")
    parser.add_argument("--csv", default=None, help="also write the tidy samples to this CSV file")
    args = parser.parse_args(argv)
    try:
        interval = validate_interval(args.interval)
    except ValueError as exc:
        parser.error(str(exc))
    if args.count is not None and args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    tasks = dict(args.task)
    sampler = Sampler(tasks)
    head, cols = _HEADER
    extra = "".join(f" {n[:12]:>12}" for n in tasks)
    print(head + extra, flush=True)
    print(cols + "".join(f" {'cpu%/rss':>12}" for _ in tasks), flush=True)
    all_rows: list[Row] = []
    sampler.sample()
    due, printed = time.monotonic(), 0
    try:
        while args.count is None or printed < args.count:
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))  # the pace of the display, not a wait for state
            _, rows = sampler.sample()
            all_rows += rows
            per = {(r[2], r[3]): r[4] for r in rows if r[1] not in ("host", "gpu")}
            cells = "".join(f" {per.get((n, 'cpu_percent'), float('nan')):5.0f}/{_human(per.get((n, 'rss'), 0)):>6}"
                            if (n, "rss") in per else f" {'gone':>12}" for n in tasks)
            print(_terminal_line(rows) + cells, flush=True)
            printed += 1
    except KeyboardInterrupt:
        pass
    if args.csv:
        import pandas as pd

        pd.DataFrame.from_records(all_rows, columns=["time", "role", "task", "metric", "value"]).to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
