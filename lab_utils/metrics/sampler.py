"""One sample at a time: metric declarations, counter rates, GPU, process trees, host.

What is measured (every metric is declared once in :data:`METRICS`):

- per task, summed over the task's process tree (root pid + all descendants):
  CPU % of one core, RSS bytes, threads, and GPU memory when NVML lists its pids;
  bytes of the task's own network namespace when it has one (:func:`netns_counters`:
  a sandboxed task, or a task on an emulated host);
- host: usr/sys/idl/wai % of all cores, CPU % per core, memory used/available,
  network bytes/s per interface (``lo`` included: a local cluster talks over
  loopback), disk read/write bytes/s;
- GPU (NVML, probed once; no GPU is not an error): utilisation %, memory used.

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
"""

from __future__ import annotations

import collections
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import psutil

from lab_utils.cluster.hosts import LAUNCHERS
from lab_utils.cluster.netbase import parse_net_dev

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


METRICS: dict[str, Metric] = {
    m.name: m
    for m in [
        Metric("cpu_percent", "% of one core", True, "task", "CPU time of the task's process tree / wall time"),
        Metric(
            "rss",
            "B",
            False,
            "task",
            "resident memory summed over the task's process tree (shared pages counted per process)",
        ),
        Metric("threads", "count", False, "task", "threads summed over the task's process tree"),
        Metric("processes", "count", False, "task", "processes in the task's tree"),
        Metric("task_gpu_mem", "B", False, "task", "GPU memory NVML attributes to the tree's pids"),
        Metric(
            "task_net_recv",
            "B/s",
            True,
            "task",
            "bytes received by the task's own network namespace (not lo); only when it has one",
        ),
        Metric(
            "task_net_sent",
            "B/s",
            True,
            "task",
            "bytes sent by the task's own network namespace (not lo); only when it has one",
        ),
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
    ]
}

#: Roles a task name may carry: the part of ``role:index`` before ``:``. An
#: MPI/Horovod job is sampled as ``rank:<r>`` once every rank has reported its pid
#: (``MPIJob.task_pids``); before that as one task named after its launcher
#: (``mpirun`` / ``horovodrun``: the launcher with all its ranks, no index).
ROLES = ("ps", "worker", "chief", "evaluator", "rank", "local") + LAUNCHERS
MIN_INTERVAL, MAX_INTERVAL = 0.1, 60.0

Row = tuple  # (time, role, task, metric, value)


def validate_interval(interval: Any) -> float:
    """Sampling interval in seconds: 0.1 (10 Hz) to 60."""
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval):
        raise ValueError(
            f"interval must be a number of seconds between {MIN_INTERVAL} and {MAX_INTERVAL}, got {interval!r}"
        )
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
    if (sep or role not in LAUNCHERS) and not index.isdigit():
        raise ValueError(f"task name {task!r} must look like '{role}:<index>' with an integer index")
    return role


def _validate_tasks(tasks: Mapping[str, Any]) -> None:
    for name, pid in tasks.items():
        role_of(name)
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"pid of task {name!r} must be a positive integer, got {pid!r}")


# --------------------------------------------------------------------------- sources


class CounterRates:
    """Rates from monotonically increasing counters, keyed by ``(device, metric)``.

    ``totals``: the sum of the increases seen (bytes over the run); ``resets``: how
    many times a counter went backwards (wrap, interface re-created)."""

    def __init__(self):
        self.prev: dict[Any, tuple[float, float]] = {}
        self.totals: dict[Any, float] = collections.defaultdict(float)
        self.resets = 0

    def rate(self, key: Any, value: float, now: float) -> float | None:
        """Increase per second since the previous value of ``key``; None for a baseline."""
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
        """Drop the baselines of counters not in ``keys`` (a vanished interface)."""
        keep = set(keys)
        for key in [k for k in self.prev if k not in keep]:
            del self.prev[key]


class GpuProbe:
    """NVML, probed once. ``available`` False when there is no library or GPU (``reason`` says why)."""

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
        """``([(device, metric, value)], {pid: GPU bytes})``."""
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


class _NicBytes(NamedTuple):
    bytes_recv: int
    bytes_sent: int


def netns_counters(pid: int, proc_root: str = "/proc") -> dict[str, tuple[int, int]] | None:
    """``{interface: (bytes_recv, bytes_sent)}`` of ``pid``'s network namespace when
    it differs from ours (a container or ``unshare -n`` task), loopback excluded;
    else None: in the shared namespace the counters are the host's, not the task's.
    ``proc_root`` points at another ``/proc`` (tests)."""
    try:
        if os.readlink(f"{proc_root}/{pid}/ns/net") == os.readlink(f"{proc_root}/self/ns/net"):
            return None
        with open(f"{proc_root}/{pid}/net/dev", encoding="ascii") as fh:
            lines = fh.readlines()[2:]
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = {nic: c for nic, c in parse_net_dev(lines).items() if nic != "lo"}
    # loopback alone: a cluster's private network (shared by its tasks), not the task's own link
    return out or None


# --------------------------------------------------------------------------- process trees


class _TaskState(NamedTuple):
    mono: float
    wall: float
    cpu: dict  # (pid, create_time) -> cpu seconds


@dataclass
class _TreeSums:
    cpu: dict = field(default_factory=dict)  # (pid, create_time) -> cpu seconds
    cpu_delta: float = 0.0
    rss: int = 0
    threads: int = 0
    nproc: int = 0
    gpu_mem: int = 0


def _read_proc(proc: Any, root: bool) -> tuple[tuple, float, int, int]:
    """``((pid, create_time), cpu seconds, rss, threads)``; ZombieProcess for a
    zombie root and for a process inside exit()."""
    with proc.oneshot():
        if root and proc.status() == psutil.STATUS_ZOMBIE:
            raise psutil.ZombieProcess(proc.pid)  # the task ended; its launcher has not reaped it yet
        key = (proc.pid, proc.create_time())
        t = proc.cpu_times()
        mem = proc.memory_info().rss
        nthreads = proc.num_threads()
    if mem == 0:
        # A user process always has resident pages; none means it is inside
        # exit() (memory released, not yet a zombie): count it as gone.
        raise psutil.ZombieProcess(proc.pid)
    return key, t.user + t.system, mem, nthreads


TaskSource = Mapping[str, int] | Callable[[], Mapping[str, int]]


class Sampler:
    """One sample at a time (no thread): what :class:`Monitor` and the terminal mode call.

    ``tasks``: ``{task_name: root_pid}`` or a callable returning it (read at every
    sample, so tasks may come and go). ``tree_refresh``: seconds between
    listings of each task's descendants (a scan of /proc, the costly part at
    10 Hz); known processes are re-read at every sample. ``ps``/``clock``/
    ``wallclock``/``nvml``/``netns`` are injection points for the unit tests.
    """

    def __init__(
        self,
        tasks: TaskSource | None = None,
        *,
        host: bool = True,
        gpu: bool = True,
        ps: Any = psutil,
        clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
        nvml: Any = None,
        tree_refresh: float = 1.0,
        netns: Callable[[int], dict | None] | None = None,
        loopback: Callable[[], tuple[str, tuple[int, int]] | None] | None = None,
    ):
        if tasks is not None and not callable(tasks) and not isinstance(tasks, Mapping):
            raise TypeError(
                f"tasks must be a mapping {{task name: pid}} or a callable returning one, got {type(tasks).__name__}"
            )
        if isinstance(tasks, Mapping):
            _validate_tasks(tasks)
        self._tasks, self.host, self.ps = tasks, host, ps
        self.clock, self.wallclock = clock, wallclock
        self.gpu = GpuProbe(nvml) if gpu else None
        self.counters = CounterRates()
        self._cpu_prev: tuple[float, Any] | None = None
        self._task_state: dict[str, _TaskState] = {}
        self._trees: dict[str, tuple] = {}  # task -> (root pid, mono, wall of the scan, [processes])
        self.tree_refresh = tree_refresh
        self.netns = netns if netns is not None else netns_counters
        #: the tasks' private network's loopback, which carries their traffic (the ``lo`` row):
        #: ``(counter key, (bytes_recv, bytes_sent))``, or None where they have none
        self.loopback = loopback
        self.exited: dict[str, float] = {}  # task -> wall time it was first seen gone
        self.denied = 0  # processes we were not allowed to read
        self.samples = 0

    # -- tasks
    def task_pids(self) -> dict[str, int]:
        """The tasks to sample now (tasks whose pid is still None are left out)."""
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

    def _task_netns(self, procs: list) -> dict | None:
        """Counters of the first process in the tree with a network namespace of its own:
        the root itself (a sandboxed task), or the child its guard started on an emulated
        host (``ip netns exec``)."""
        for proc in procs:
            nets = self.netns(proc.pid)
            if nets is not None:
                return nets
        return None

    def _gone(self, name: str, wall: float) -> list:
        for metric in ("task_net_recv", "task_net_sent"):
            self.counters.prev.pop((name, metric), None)
        self._trees.pop(name, None)
        self._task_state.pop(name, None)
        self.exited.setdefault(name, wall)
        return []

    def _read_tree(self, procs: list, prev: _TaskState | None, born_after: float, gpu_pids: dict) -> _TreeSums | None:
        """Sums over the tree's processes; None when the root has gone."""
        sums = _TreeSums()
        for proc in procs:
            try:
                key, seconds, mem, nthreads = _read_proc(proc, proc is procs[0])
            except psutil.NoSuchProcess:  # also ZombieProcess: exited, not yet reaped
                if proc is procs[0]:
                    return None
                continue  # ended since the tree was listed: nothing left to count
            except psutil.AccessDenied:
                self.denied += 1
                continue
            sums.cpu[key] = seconds
            sums.rss, sums.threads, sums.nproc = sums.rss + mem, sums.threads + nthreads, sums.nproc + 1
            sums.gpu_mem += gpu_pids.get(proc.pid, 0)
            if prev is not None:
                if key in prev.cpu:
                    sums.cpu_delta += max(0.0, seconds - prev.cpu[key])
                elif key[1] >= born_after:
                    sums.cpu_delta += seconds
        return sums

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
        sums = self._read_tree(procs, prev, born_after, gpu_pids)
        if sums is None:
            return self._gone(name, wall)
        self.exited.pop(name, None)
        self._task_state[name] = _TaskState(mono, wall, sums.cpu)
        out = [("rss", float(sums.rss)), ("threads", float(sums.threads)), ("processes", float(sums.nproc))]
        if prev is not None and mono > prev.mono:
            out.insert(0, ("cpu_percent", 100.0 * sums.cpu_delta / (mono - prev.mono)))
        if self.gpu is not None and self.gpu.available:
            out.append(("task_gpu_mem", float(sums.gpu_mem)))
        nets = self._task_netns(procs)
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
        for i, (a, b) in enumerate(zip(prev[1], per_core, strict=True)):
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
        nics = {nic: (nic, c) for nic, c in (self.ps.net_io_counters(pernic=True) or {}).items()}
        private = self.loopback() if self.loopback else None
        if private is not None:  # the cluster talks over its own loopback, not this namespace's
            key, counts = private
            nics["lo"] = (key, _NicBytes(*counts))  # its own counter: no jump between the two
        for nic, (key, c) in nics.items():
            for metric, value in (("net_recv", c.bytes_recv), ("net_sent", c.bytes_sent)):
                r = self.counters.rate((key, metric), value, mono)
                if r is not None:
                    rows.append((nic, metric, r))
        disk = self.ps.disk_io_counters(perdisk=False)  # None in some containers
        if disk is not None:
            for metric, value in (("disk_read", disk.read_bytes), ("disk_write", disk.write_bytes)):
                r = self.counters.rate(("disk", metric), value, mono)
                if r is not None:
                    rows.append(("disk", metric, r))
        self.counters.forget_missing(
            [(key, m) for key, _ in nics.values() for m in ("net_recv", "net_sent")]
            + ([("disk", "disk_read"), ("disk", "disk_write")] if disk is not None else [])
            + [k for k in self.counters.prev if k[1].startswith("task_")]
        )
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
            rows += [
                (wall, role, name, metric, value)
                for metric, value in self._sample_task(name, pid, mono, wall, gpu_pids)
            ]
        for name in [n for n in self._task_state if n not in tasks]:
            del self._task_state[name]
        for name in [n for n in self._trees if n not in tasks]:
            del self._trees[name]
        self.samples += 1
        return wall, rows
