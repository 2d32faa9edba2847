"""lab_utils.metrics with psutil, the clocks and NVML replaced by fakes (fast, deterministic)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import namedtuple
from types import SimpleNamespace

import psutil
import pytest

from lab_utils import display, metrics
from lab_utils.metrics import METRICS, Monitor, Sampler, netns_counters
from lab_utils.plots import png_bytes

CpuTimes = namedtuple("CpuTimes", "user system")
CoreTimes = namedtuple("CoreTimes", "user nice system idle iowait irq softirq steal guest guest_nice")
Mem = namedtuple("Mem", "rss")
VM = namedtuple("VM", "total available percent used")
Nic = namedtuple("Nic", "bytes_sent bytes_recv")
Disk = namedtuple("Disk", "read_bytes write_bytes")


class FakeProc:
    def __init__(self, ps, pid, ppid=None, create=0.0, cpu=0.0, rss=100, threads=1):
        self.ps, self.pid, self.ppid, self.create, self.cpu, self.rss, self.threads = (
            ps,
            pid,
            ppid,
            create,
            cpu,
            rss,
            threads,
        )
        self.state = "alive"  # alive, gone, zombie, denied

    def _check(self):
        if self.state == "gone":
            raise psutil.NoSuchProcess(self.pid)
        if self.state == "zombie":
            raise psutil.ZombieProcess(self.pid)
        if self.state == "denied":
            raise psutil.AccessDenied(self.pid)

    def status(self):
        if self.state == "gone":
            raise psutil.NoSuchProcess(self.pid)
        return psutil.STATUS_ZOMBIE if self.state == "zombie" else psutil.STATUS_RUNNING

    def children(self, recursive=False):
        if self.state == "gone":
            raise psutil.NoSuchProcess(self.pid)
        out, frontier = [], [self.pid]
        while frontier:
            parent = frontier.pop()
            kids = [p for p in self.ps.procs.values() if p.ppid == parent and p.state != "gone"]
            out += kids
            if recursive:
                frontier += [k.pid for k in kids]
        return out

    def oneshot(self):
        return contextlib.nullcontext()

    def create_time(self):
        self._check()
        return self.create

    def cpu_times(self):
        self._check()
        return CpuTimes(self.cpu * 0.75, self.cpu * 0.25)

    def memory_info(self):
        self._check()
        return Mem(self.rss)

    def num_threads(self):
        self._check()
        return self.threads


class FakePs:
    """The slice of psutil the sampler uses."""

    NoSuchProcess, ZombieProcess, AccessDenied, Error = (
        psutil.NoSuchProcess,
        psutil.ZombieProcess,
        psutil.AccessDenied,
        psutil.Error,
    )

    def __init__(self):
        self.procs: dict[int, FakeProc] = {}
        self.cores = [CoreTimes(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)] * 2
        self.nics = {"lo": Nic(0, 0), "eth0": Nic(0, 0)}
        self.disk = Disk(0, 0)
        self.used = 1000
        self.netns = {}  # pid -> {iface: (recv, sent)} for tasks in their own network namespace

    def add(self, pid, **kw):
        self.procs[pid] = FakeProc(self, pid, **kw)
        return self.procs[pid]

    def Process(self, pid):
        if pid not in self.procs or self.procs[pid].state == "gone":
            raise psutil.NoSuchProcess(pid)
        return self.procs[pid]

    def cpu_times(self, percpu=False):
        return list(self.cores)

    def virtual_memory(self):
        return VM(10_000, 10_000 - self.used, 10.0, self.used)

    def net_io_counters(self, pernic=False):
        return dict(self.nics)

    def disk_io_counters(self, perdisk=False):
        return self.disk


class Clock:
    def __init__(self, t=100.0):
        self.t = t

    def __call__(self):
        return self.t


class NoNvml:
    class NVMLError(Exception):
        pass

    def nvmlInit(self):
        raise self.NVMLError("NVML Shared Library Not Found")


def make(tasks, ps=None, tree_refresh=1.0):
    ps = ps or FakePs()
    mono, wall = Clock(100.0), Clock(1_000.0)
    s = Sampler(
        tasks,
        ps=ps,
        clock=mono,
        wallclock=wall,
        nvml=NoNvml(),
        tree_refresh=tree_refresh,
        netns=lambda pid: ps.netns.get(pid),
    )
    return s, ps, mono, wall


def advance(mono, wall, dt):
    mono.t += dt
    wall.t += dt


def values(rows, task, metric):
    return [r[4] for r in rows if r[2] == task and r[3] == metric]


# ---------------------------------------------------------------- declarations and inputs


def test_every_metric_declared_once_with_unit_and_scope():
    assert len(METRICS) == len({m.name for m in METRICS.values()})
    for m in METRICS.values():
        assert m.unit and m.scope in ("task", "host", "gpu")
    assert METRICS["net_recv"].is_rate and not METRICS["rss"].is_rate


@pytest.mark.parametrize("bad", [0, -1, 0.0, 60.5, 1e9, float("nan"), "1", None, True])
def test_bad_interval_is_a_clear_valueerror(bad):
    with pytest.raises(ValueError, match="interval"):
        Monitor({}, interval=bad)


def test_interval_bounds_accepted():
    assert metrics.validate_interval(0.1) == 0.1
    assert metrics.validate_interval(60) == 60.0
    with pytest.raises(ValueError, match="10 Hz"):
        metrics.validate_interval(0.05)


@pytest.mark.parametrize("name", ["gpu:0", "server:1", "worker", "", "worker:x"])
def test_unknown_role_or_bad_task_name_is_valueerror(name):
    with pytest.raises(ValueError, match="role|task name"):
        Sampler({name: 123}, nvml=NoNvml())


def test_unknown_role_in_filters_and_bad_pid():
    mon = Monitor({}, interval=1, sampler=make({})[0])
    with pytest.raises(ValueError, match="unknown role 'server'"):
        mon.frame(role="server")
    with pytest.raises(ValueError, match="unknown role"):
        mon.summary(role="server")
    with pytest.raises(ValueError, match="pid of task 'ps:0'"):
        Sampler({"ps:0": -5}, nvml=NoNvml())


def test_unknown_role_from_a_callable_source_raises_at_sample():
    s, *_ = make(lambda: {"boss:0": 1})
    with pytest.raises(ValueError, match="unknown role 'boss'"):
        s.sample()


# ---------------------------------------------------------------- rates from deltas


def test_first_sample_is_a_baseline_then_rates_from_deltas_over_monotonic_time():
    s, ps, mono, wall = make({})
    _, rows = s.sample()
    assert not [r for r in rows if METRICS[r[3]].is_rate]
    ps.nics = {"lo": Nic(bytes_sent=4000, bytes_recv=2000), "eth0": Nic(0, 0)}
    ps.disk = Disk(read_bytes=1000, write_bytes=500)
    ps.cores = [CoreTimes(1.5, 0, 0.5, 0, 0, 0, 0, 0, 0, 0), CoreTimes(0, 0, 0, 2.0, 0, 0, 0, 0, 0, 0)]
    mono.t += 2.0
    wall.t += 500.0  # wall clock jumps (NTP): rates must not care
    _, rows = s.sample()
    assert values(rows, "lo", "net_sent") == [2000.0]
    assert values(rows, "lo", "net_recv") == [1000.0]
    assert values(rows, "eth0", "net_recv") == [0.0]
    assert values(rows, "disk", "disk_read") == [500.0]
    assert values(rows, "cpu0", "cpu_core_percent") == [100.0]
    assert values(rows, "cpu1", "cpu_core_percent") == [0.0]
    assert values(rows, "host", "cpu_usr") == [37.5]
    assert values(rows, "host", "cpu_sys") == [12.5]
    assert values(rows, "host", "cpu_idl") == [50.0]
    assert s.counters.totals[("lo", "net_sent")] == 4000


def test_counter_wrap_or_reset_gives_no_value_then_resumes():
    s, ps, mono, wall = make({})
    ps.nics = {"lo": Nic(10_000, 10_000)}
    s.sample()
    ps.nics = {"lo": Nic(50, 50)}  # wrapped / interface re-created
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert values(rows, "lo", "net_sent") == []
    assert s.counters.resets == 2
    ps.nics = {"lo": Nic(150, 1050)}
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert values(rows, "lo", "net_sent") == [100.0]
    assert values(rows, "lo", "net_recv") == [1000.0]
    assert all(r[4] >= 0 for r in rows)


def test_interface_that_appears_is_baselined_and_one_that_vanishes_is_forgotten():
    s, ps, mono, wall = make({})
    s.sample()
    ps.nics = {"lo": Nic(0, 0), "veth9": Nic(10**9, 10**9)}
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert values(rows, "veth9", "net_sent") == []  # no spike from its lifetime total
    assert ("eth0", "net_sent") not in s.counters.prev


def test_no_disk_counters_in_container_is_fine():
    s, ps, mono, wall = make({})
    ps.disk = None
    s.sample()
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert not [r for r in rows if r[3].startswith("disk")]


# ---------------------------------------------------------------- process trees


def test_process_tree_is_summed_and_attributed_to_its_task():
    s, ps, mono, wall = make({"ps:0": 10, "worker:0": 20})
    ps.add(10, create=1.0, cpu=1.0, rss=1000, threads=5)
    ps.add(20, create=1.0, cpu=5.0, rss=2000, threads=2)
    ps.add(21, ppid=20, create=1.0, cpu=5.0, rss=300, threads=3)
    ps.add(22, ppid=21, create=1.0, cpu=5.0, rss=30, threads=1)  # grandchild
    s.sample()
    ps.procs[10].cpu += 0.1
    for pid in (20, 21, 22):
        ps.procs[pid].cpu += 0.5
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert values(rows, "worker:0", "cpu_percent") == [pytest.approx(150.0)]
    assert values(rows, "worker:0", "rss") == [2330.0]
    assert values(rows, "worker:0", "threads") == [6.0]
    assert values(rows, "worker:0", "processes") == [3.0]
    assert values(rows, "ps:0", "cpu_percent") == [pytest.approx(10.0)]
    assert values(rows, "ps:0", "rss") == [1000.0]
    assert {r[1] for r in rows if r[2] in ("ps:0", "worker:0")} == {"ps", "worker"}


def test_children_that_come_and_go_make_no_spikes_or_negatives():
    s, ps, mono, wall = make({"worker:0": 20})
    ps.add(20, create=1.0, cpu=0.0)
    old = ps.add(21, ppid=20, create=1.0, cpu=100.0)  # lived long before monitoring
    s.sample()
    # old child ends (its 100 s must not vanish as a negative), a new one is born during
    # the interval and used 0.4 s; one existed before the previous sample but unseen: baseline.
    old.state = "gone"
    advance(mono, wall, 1)
    ps.add(22, ppid=20, create=wall.t - 0.5, cpu=0.4)
    ps.add(23, ppid=20, create=900.0, cpu=50.0)
    ps.procs[20].cpu += 0.2
    _, rows = s.sample()
    assert values(rows, "worker:0", "cpu_percent") == [pytest.approx(60.0)]
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert values(rows, "worker:0", "cpu_percent") == [pytest.approx(0.0)]


def test_tree_listed_at_most_every_tree_refresh_and_late_found_children_count_in_full():
    s, ps, mono, wall = make({"worker:0": 20}, tree_refresh=1.0)
    root = ps.add(20, create=1.0)
    calls = []
    orig = root.children
    root.children = lambda recursive=False: calls.append(1) or orig(recursive)
    s.sample()
    for _ in range(4):  # 10 Hz for 0.4 s: no new listing
        advance(mono, wall, 0.1)
        s.sample()
    assert len(calls) == 1
    ps.add(21, ppid=20, create=wall.t + 0.05, cpu=0.3)  # born after the last listing
    for _ in range(8):
        advance(mono, wall, 0.1)
        _, rows = s.sample()
        if len(calls) == 2:
            break
    assert len(calls) == 2
    assert values(rows, "worker:0", "processes") == [2.0]
    assert values(rows, "worker:0", "cpu_percent") == [pytest.approx(300.0)]  # 0.3 s in 0.1 s: 3 cores


def test_recycled_pid_is_a_new_process():
    s, ps, mono, wall = make({"worker:0": 20})
    ps.add(20, create=1.0)
    ps.add(21, ppid=20, create=1.0, cpu=10.0)
    s.sample()
    advance(mono, wall, 1)
    ps.add(21, ppid=20, create=2.0, cpu=1.0)  # same pid, different process, older than the sample
    _, rows = s.sample()
    assert values(rows, "worker:0", "cpu_percent") == [0.0]


def test_a_task_that_exits_mid_sample_is_dropped_not_an_error():
    s, ps, mono, wall = make({"ps:0": 10, "worker:0": 20})
    ps.add(10, create=1.0)
    w = ps.add(20, create=1.0)
    child = ps.add(21, ppid=20, create=1.0)
    s.sample()
    advance(mono, wall, 1)
    child.state = "gone"  # vanished between children() and cpu_times()
    orig = w.children
    w.children = lambda recursive=False: [child]
    _, rows = s.sample()
    assert values(rows, "worker:0", "processes") == [1.0]
    w.children = orig
    w.state = "gone"  # root gone
    advance(mono, wall, 1)
    _, rows = s.sample()
    assert not [r for r in rows if r[2] == "worker:0"]
    assert values(rows, "ps:0", "rss") == [100.0]
    assert "worker:0" in s.exited


def test_zombie_root_counts_as_exited_and_access_denied_is_counted():
    s, ps, mono, wall = make({"ps:0": 10, "worker:0": 20})
    ps.add(10, create=1.0).state = "zombie"
    ps.add(20, create=1.0)
    ps.add(21, ppid=20, create=1.0).state = "denied"
    _, rows = s.sample()
    assert "ps:0" in s.exited and not [r for r in rows if r[2] == "ps:0"]
    assert values(rows, "worker:0", "processes") == [1.0]
    assert s.denied == 1


def test_exiting_process_with_no_memory_left_is_not_sampled():
    """Between releasing its memory and becoming a zombie a process reads as running
    with rss 0 (seen in CI): it must count as exited, not as a task using 0 bytes."""
    s, ps, mono, wall = make({"ps:0": 10, "worker:0": 20})
    ps.add(10, create=1.0, rss=0)
    ps.add(20, create=1.0)
    ps.add(21, ppid=20, create=1.0, rss=0)
    _, rows = s.sample()
    assert "ps:0" in s.exited and not [r for r in rows if r[2] == "ps:0"]
    assert values(rows, "worker:0", "processes") == [1.0]
    assert values(rows, "worker:0", "rss") == [100.0]


def test_task_source_callable_and_pid_none_while_starting():
    table = {"ps:0": None}
    s, ps, mono, wall = make(lambda: table)
    ps.add(10, create=1.0)
    _, rows = s.sample()
    assert not [r for r in rows if r[1] == "ps"]
    table["ps:0"] = 10
    _, rows = s.sample()
    assert values(rows, "ps:0", "rss") == [100.0]


# ---------------------------------------------------------------- GPU


def test_no_gpu_is_not_an_error():
    s, *_ = make({})
    assert s.gpu.available is False and "NVML" in s.gpu.reason
    _, rows = s.sample()
    assert not [r for r in rows if r[1] == "gpu" or r[3] == "task_gpu_mem"]


def test_gpu_probed_once_and_sampled_with_per_pid_memory():
    calls = {"init": 0}

    class Nvml:
        NVMLError = NoNvml.NVMLError

        def nvmlInit(self):
            calls["init"] += 1

        def nvmlDeviceGetCount(self):
            return 1

        def nvmlDeviceGetHandleByIndex(self, i):
            return i

        def nvmlDeviceGetUtilizationRates(self, h):
            return SimpleNamespace(gpu=42)

        def nvmlDeviceGetMemoryInfo(self, h):
            return SimpleNamespace(used=5000)

        def nvmlDeviceGetComputeRunningProcesses(self, h):
            return [SimpleNamespace(pid=21, usedGpuMemory=700), SimpleNamespace(pid=99, usedGpuMemory=None)]

    ps = FakePs()
    ps.add(20, create=1.0)
    ps.add(21, ppid=20, create=1.0)
    s = Sampler({"worker:0": 20}, ps=ps, clock=Clock(), wallclock=Clock(1000.0), nvml=Nvml())
    s.sample()
    _, rows = s.sample()
    assert calls["init"] == 1
    assert values(rows, "gpu:0", "gpu_util") == [42.0]
    assert values(rows, "gpu:0", "gpu_mem_used") == [5000.0]
    assert values(rows, "worker:0", "task_gpu_mem") == [700.0]


# ---------------------------------------------------------------- monitor: buffers, frame, summary


def _monitor(tasks, max_samples=3600):
    s, ps, mono, wall = make(tasks)
    mon = Monitor(interval=1.0, max_samples=max_samples, sampler=s)
    return mon, s, ps, mono, wall


def test_buffer_is_bounded_but_peaks_cover_the_whole_run():
    mon, s, ps, mono, wall = _monitor({"worker:0": 20}, max_samples=5)
    w = ps.add(20, create=1.0, rss=100)
    for i in range(50):
        w.rss = 10_000 if i == 3 else 100
        advance(mono, wall, 1)
        mon.record(*s.sample())
    df = mon.frame()
    assert df["time"].nunique() == 5 and mon.dropped == 45
    assert list(df.columns) == ["time", "role", "task", "metric", "value"]
    assert mon.summary().loc["worker:0", "Peak Mem"] == 10_000


def test_max_samples_validated():
    with pytest.raises(ValueError, match="max_samples"):
        Monitor({}, max_samples=1)


def _write_events(path, task, rows):
    with open(path, "w") as fh:
        for r in rows:
            fh.write(json.dumps({"kind": "step", "task": task, "pid": 1, **r}) + "\n")
        fh.write('{"time": 1, "kind": "step", "ta')  # half-written line is ignored


def test_summary_has_the_seeds_columns_with_host_level_network(tmp_path):
    mon, s, ps, mono, wall = _monitor({"ps:0": 10, "worker:0": 20, "worker:1": 30})
    for pid in (10, 20, 30):
        ps.add(pid, create=1.0, rss=pid * 100)
    mon.start_time = wall.t
    for i in range(4):
        ps.procs[20].cpu += 0.5
        ps.procs[30].cpu += 0.8
        ps.nics = {"lo": Nic(1000 * i, 3000 * i)}
        mon.record(*s.sample())
        advance(mono, wall, 1)
    mon.stop_time = wall.t
    _write_events(
        tmp_path / "worker-0.jsonl",
        "worker:0",
        [{"time": 1000.0 + t, "step": 10 * t, "examples": 320 * t, "loss": 1.0} for t in range(4)],
    )
    df = mon.summary(events=tmp_path)
    for col in ("Peak Mem", "Peak CPU", "Network R", "Network W", "Examples/s", "s/batch"):
        assert col in df.columns
    assert list(df.index) == ["ps:0", "worker:0", "worker:1", "total"]
    assert df.loc["worker:0", "Examples/s"] == pytest.approx(320.0)
    assert df.loc["worker:0", "s/batch"] == pytest.approx(0.1)
    _write_events(
        tmp_path / "worker-0.jsonl",
        "worker:0",  # async PS: global step counts both workers
        [{"time": 1000.0 + t, "step": 20 * t, "local_step": 10 * t, "examples": 320 * t} for t in range(4)],
    )
    assert mon.summary(events=tmp_path).loc["worker:0", "s/batch"] == pytest.approx(0.1)
    assert df.loc["worker:1", "Peak CPU"] == pytest.approx(80.0)
    assert df.loc["ps:0", "Peak CPU"] == pytest.approx(0.0)
    assert df.loc["total", "Peak CPU"] == pytest.approx(130.0)
    assert df.loc["total", "Peak Mem"] == pytest.approx(6000.0)
    # host counters cannot split loopback per task: per-task cells empty, total labelled host
    assert df["Network R"].iloc[:3].isna().all()
    assert df.loc["total", "Network R"] == 9000 and df.loc["total", "Network W"] == 3000
    assert df.loc["total", "network_scope"].startswith("host")
    assert "lo" in df.attrs["network_scope"] and "units" in df.attrs


def test_summary_uses_per_task_bytes_when_tasks_report_them(tmp_path):
    mon, s, ps, mono, wall = _monitor({"worker:0": 20, "worker:1": 30})
    for pid in (20, 30):
        ps.add(pid, create=1.0)
    mon.start_time = wall.t
    mon.record(*s.sample())
    for i, task in enumerate(("worker:0", "worker:1")):
        _write_events(
            tmp_path / f"w{i}.jsonl",
            task,
            [
                {
                    "time": 1000.0 + t,
                    "step": t,
                    "examples": 10 * t,
                    "bytes_sent": 100 * t * (i + 1),
                    "bytes_recv": 50 * t,
                }
                for t in range(1, 4)
            ],
        )
    df = mon.summary(events=[tmp_path / "w0.jsonl", tmp_path / "w1.jsonl"])
    assert df.loc["worker:1", "Network W"] == 600 and df.loc["worker:0", "Network R"] == 150
    assert df.loc["worker:0", "network_scope"].startswith("task")
    assert df.loc["total", "Network W"] == 900 and df.loc["total", "network_scope"].startswith("task")


def test_csv_export_roundtrip_and_plot(tmp_path):
    import pandas as pd

    mon, s, ps, mono, wall = _monitor({"worker:0": 20})
    ps.add(20, create=1.0)
    for _ in range(3):
        advance(mono, wall, 1)
        ps.procs[20].cpu += 0.3
        mon.record(*s.sample())
    back = pd.read_csv(mon.to_csv(tmp_path / "m.csv"))
    assert len(back) == len(mon.frame()) > 0
    assert set(back["metric"]) >= {"cpu_percent", "rss", "net_recv", "mem_used"}
    _write_events(
        tmp_path / "e.jsonl",
        "worker:0",
        [{"time": wall.t - 2 + t, "step": t, "examples": 8 * t, "accuracy": 0.1 * t} for t in range(3)],
    )
    fig = mon.plot(events=tmp_path)
    assert len(fig.axes) == 5  # 4 panels + accuracy twin axis
    assert png_bytes(fig).startswith(b"\x89PNG")


def test_events_frame_joins_on_time_with_roles(tmp_path):
    _write_events(tmp_path / "a.jsonl", "worker:1", [{"time": 5.0, "step": 1, "examples": 1}])
    _write_events(tmp_path / "b.jsonl", "rank:0", [{"time": 2.0, "step": 1, "examples": 1}])
    df = metrics.events_frame(tmp_path)
    assert list(df["task"]) == ["rank:0", "worker:1"] and list(df["role"]) == ["rank", "worker"]
    with pytest.raises(TypeError, match="events"):
        metrics.events_frame(42)


# ---------------------------------------------------------------- thread, cluster, headless


def test_thread_samples_and_stops_cleanly():
    s, ps, mono, wall = make({})
    real = Sampler({}, ps=ps, nvml=NoNvml())  # real clocks, fake psutil
    mon = Monitor(interval=0.1, sampler=real)
    seen = threading.Event()
    mon.on_sample = lambda wall, rows: seen.set() if real.samples >= 3 else None
    with mon:
        assert seen.wait(5.0)
        assert mon.running
    assert not mon.running and mon.frame()["time"].nunique() >= 3
    mon.stop()  # idempotent


def test_sampler_error_is_raised_by_stop_not_printed():
    table = {}
    mon = Monitor(lambda: table, interval=0.1, gpu=False)
    mon.start()
    table["boss:0"] = 1
    deadline = time.monotonic() + 5
    while mon.running and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(RuntimeError, match="boss"):
        mon.stop()


def test_cluster_object_task_pids_or_tasks_list():
    class WithMethod:
        def task_pids(self):
            return {"ps:0": 10}

    class WithTasks:
        tasks = [
            SimpleNamespace(name="worker:0", pid=20, events_path="/x/w0.jsonl"),
            SimpleNamespace(name="worker:1", pid=None, events_path=None),
        ]

    assert Monitor(cluster=WithMethod(), gpu=False).sampler.task_pids() == {"ps:0": 10}
    mon = Monitor(cluster=WithTasks(), gpu=False)
    assert mon.sampler.task_pids() == {"worker:0": 20}
    assert [str(p) for p in mon.event_files()] == ["/x/w0.jsonl"]
    with pytest.raises(TypeError, match="task_pids"):
        Monitor(cluster=object())
    with pytest.raises(ValueError, match="either"):
        Monitor({"ps:0": 1}, cluster=WithMethod())


@pytest.mark.parametrize(
    "env,expected",
    [
        ({"NBGRADER_EXECUTION": "autograde"}, True),
        ({"PAPERMILL_RUN": "1"}, True),
        ({"LABS_HEADLESS": "1"}, True),
        ({"LABS_HEADLESS": "0", "NBGRADER_EXECUTION": "autograde"}, False),
        ({}, True),  # plain Python (pytest): no kernel with a frontend
    ],
)
def test_headless_detection(env, expected):
    assert display.is_headless(env) is expected


def test_live_when_headless_never_builds_a_widget(monkeypatch, capsys):
    s, *_ = make({})
    mon = Monitor(interval=1.0, sampler=s)
    assert mon.view is None
    with mon:
        assert mon.live(every=1.0, headless=True) is None
    assert mon.view == "static"  # one static figure at stop, no widget
    with pytest.raises(ValueError, match="every"):
        mon.live(every=0.01)
    assert capsys.readouterr().err == ""


def test_watch_samples_until_the_job_ends_and_shows_it_only_when_asked(monkeypatch):
    monkeypatch.setenv("LABS_HEADLESS", "1")

    class Job:  # a cluster that trains for 0.3 s
        done = False

        def task_pids(self):
            return {"worker:0": os.getpid()}

        def wait(self):
            time.sleep(0.3)
            self.done = True

    job = Job()
    mon = metrics.watch(job, interval=0.1)
    assert job.done and not mon.running and mon.stop_time is not None
    assert mon.sampler.samples >= 2 and mon.view is None  # sampled, nothing shown
    assert metrics.watch(Job(), interval=0.1, live=True).view == "static"  # headless: one figure at the end


def test_terminal_mode_prints_dstat_columns(capsys):
    assert metrics.main(["--interval", "0.1", "--count", "2"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert "usr" in lines[1] and "recv" in lines[1] and "writ" in lines[1]
    assert len(lines) == 4 and out.err == ""
    with pytest.raises(SystemExit):
        metrics.main(["--interval", "0"])
    with pytest.raises(SystemExit):
        metrics.main(["--task", "boss:0=1"])


def test_python_dash_m_runs_the_terminal_view_without_stderr():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "lab_utils.metrics", "--interval", "0.1", "--count", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stderr == ""  # no runpy "found in sys.modules" warning
    assert len(out.stdout.splitlines()) == 3


class _Anc:
    def __init__(self, *cmds):
        self.cmds = list(cmds)

    def parent(self):
        if not self.cmds:
            return None
        nxt = _Anc(*self.cmds[1:])
        nxt.cmd = self.cmds[0]
        return nxt

    def cmdline(self):
        return self.cmd.split()


@pytest.mark.parametrize(
    "chain,expected",
    [
        (["/usr/bin/python -m ipykernel_launcher -f k.json", "/usr/bin/python /usr/bin/jupyter-lab"], False),
        (["/usr/bin/python /usr/bin/papermill in.ipynb out.ipynb"], True),
        (["/usr/bin/python /usr/bin/nbgrader autograde lab1"], True),
        (["/opt/hub/bin/jupyterhub-singleuser"], False),
        (["/usr/bin/python some_script.py"], True),  # unknown launcher: static figure
        ([], True),
        # JupyterLab serving a folder whose path names a headless runner: still a frontend
        (["/v/bin/python /v/bin/jupyter lab --ServerApp.root_dir=/tmp/pytest-of-root/papermill0"], False),
        (["/usr/bin/python -m papermill /home/jupyter-lab-fan/in.ipynb out.ipynb"], True),
    ],
)
def test_kernel_launcher_decides_headless(chain, expected):
    assert display.launched_headless(_Anc(*chain)) is expected


def test_per_task_bytes_from_a_tasks_own_network_namespace():
    mon, s, ps, mono, wall = _monitor({"worker:0": 20, "worker:1": 30})
    for pid in (20, 30):
        ps.add(pid, create=1.0)
    ps.netns[20] = {"eth0": (1000, 500)}
    ps.netns[30] = {"eth0": (0, 0)}
    mon.record(*s.sample())
    advance(mono, wall, 2)
    ps.netns[20] = {"eth0": (5000, 2500), "veth1": (1000, 0)}
    ps.netns[30] = {"eth0": (10, 20)}
    _, rows = s.sample()
    mon.record(wall.t, rows)
    assert values(rows, "worker:0", "task_net_recv") == [2500.0]
    assert values(rows, "worker:0", "task_net_sent") == [1000.0]
    df = mon.summary(events=[])
    assert df.loc["worker:0", "Network R"] == 5000 and df.loc["worker:1", "Network W"] == 20
    assert df.loc["worker:0", "network_scope"] == "task (own network namespace)"
    assert df.loc["total", "Network R"] == 5010 and df.loc["total", "network_scope"].startswith("task")


def fake_proc(tmp_path, pid: int, dev_rows: str) -> str:
    """A /proc under ``tmp_path`` where ``pid`` has a network namespace of its own (not this
    process's) whose ``net/dev`` lists ``dev_rows`` under the kernel's two header lines."""
    proc = tmp_path / "proc"
    (proc / str(pid) / "ns").mkdir(parents=True)
    (proc / str(pid) / "net").mkdir()
    (proc / "self" / "ns").mkdir(parents=True)
    os.symlink("net:[1]", proc / "self" / "ns" / "net")
    os.symlink("net:[2]", proc / str(pid) / "ns" / "net")
    (proc / str(pid) / "net" / "dev").write_text(
        "Inter-|   Receive\n face |bytes packets errs drop fifo frame compressed multicast|bytes\n" + dev_rows
    )
    return str(proc)


def test_netns_reader_says_none_in_the_shared_namespace(tmp_path):
    assert netns_counters(os.getpid()) is None  # same namespace as ours: host-level, not per task
    proc = fake_proc(
        tmp_path,
        7,
        "    lo: 999 1 0 0 0 0 0 0 999 1 0 0 0 0 0 0\n  eth0: 1234 5 0 0 0 0 0 0 5678 6 0 0 0 0 0 0\n",
    )
    assert netns_counters(7, proc) == {"eth0": (1234, 5678)}
    assert netns_counters(8, proc) is None


def test_a_private_cluster_network_s_loopback_is_the_lo_row(tmp_path):
    """A namespace with loopback alone is a cluster's private network: not a task's own
    link (netns_counters says None), and its lo counters stand in for this namespace's."""
    from lab_utils.cluster import netbase

    proc = fake_proc(tmp_path, 9, "    lo: 4000 1 0 0 0 0 0 0 4000 1 0 0 0 0 0 0\n")
    assert netns_counters(9, proc) is None
    assert netbase.loopback_of(9, proc) == (4000, 4000)
    assert netbase.loopback_of(10, proc) is None


def test_the_lo_row_counts_the_private_network_when_there_is_one():
    ps = FakePs()
    lo = {"value": 1000}
    mono, wall = Clock(100.0), Clock(1_000.0)
    s = Sampler({}, ps=ps, gpu=False, clock=mono, wallclock=wall, loopback=lambda: ("lo@42", (lo["value"],) * 2))
    s.sample()
    advance(mono, wall, 1.0)
    lo["value"] += 500  # the cluster sent 500 bytes over its loopback in that second
    ps.nics["lo"] = Nic(10**9, 10**9)  # this namespace's own loopback: not the cluster's
    rows = {(r[2], r[3]): r[4] for r in s.sample()[1]}
    assert rows[("lo", "net_sent")] == 500.0 and rows[("lo", "net_recv")] == 500.0


def test_a_sample_after_the_private_network_went_still_counts_its_last_bytes(monkeypatch):
    """A job stops its tasks and removes its private network before the monitor's last sample
    (issue 52: Lab 2's 1-worker run measured 0.55x the bytes predicted, when the last tick came
    long before the end). The network reads its loopback just before it goes; the sampler counts
    those bytes under the same key, not as a fresh baseline of this namespace's own ``lo``."""
    from lab_utils.cluster import userns

    lo = {"value": 1000}
    monkeypatch.setattr(userns, "loopback_of", lambda pid: (lo["value"],) * 2 if pid == 42 else None)
    monkeypatch.setattr(userns, "_end_holder", lambda holder: None)
    net = userns.PrivateNetwork(userns=True)
    net.holder = SimpleNamespace(pid=42)
    ps = FakePs()
    mono, wall = Clock(100.0), Clock(1_000.0)
    s = Sampler({}, ps=ps, gpu=False, clock=mono, wallclock=wall, loopback=net.loopback)
    s.sample()
    advance(mono, wall, 1.0)
    lo["value"] += 700  # the last bytes, after the last tick
    net.destroy()
    lo["value"] = 0  # the holder is gone: its counters with it
    rows = {(r[2], r[3]): r[4] for r in s.sample()[1]}
    assert rows[("lo", "net_sent")] == 700.0
    assert net.loopback() == ("lo@42", (1700, 1700))


class _CountingSampler:
    """A sampler that counts its samples (and fails from the ``fail_from``-th on, when given)."""

    clock = staticmethod(time.monotonic)
    gpu = None

    def __init__(self, fail_from: int | None = None):
        self.calls, self.fail_from = 0, fail_from

    def sample(self):
        self.calls += 1
        if self.fail_from is not None and self.calls >= self.fail_from:
            raise OSError("gone")
        return time.time(), []


def test_stop_takes_a_last_sample_so_a_short_run_loses_nothing_since_the_last_tick():
    """A run shorter than a few intervals lost what moved after the last tick (issue 52's suite:
    a 1-worker run measured half its bytes); stop() now samples once more."""
    sampler = _CountingSampler()
    mon = Monitor({}, interval=60, sampler=sampler).start()  # no tick before stop
    mon.stop()
    assert sampler.calls == 2 and not mon.notes  # the baseline, and the last sample at stop


def test_a_failing_last_sample_is_noted_not_raised():
    mon = Monitor({}, interval=60, sampler=_CountingSampler(fail_from=2)).start()
    mon.stop()
    assert mon.notes == ["metrics: the last sample failed: OSError('gone')"]
