"""lab_utils.resources: cgroup v1/v2 parsing from fixture trees, JupyterHub variables."""

from pathlib import Path

import psutil
import pytest

from lab_utils import resources
from lab_utils.cluster import TFCluster

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"
GiB = 1024**3


@pytest.mark.parametrize(
    "text, cores", [("max 100000", None), ("150000 100000", 1.5), ("50000 100000", 0.5), (None, None), ("", None)]
)
def test_parse_cpu_max(text, cores):
    assert resources.parse_cpu_max(text) == cores


@pytest.mark.parametrize(
    "text, value", [("max", None), ("2147483648", 2 * GiB), ("9223372036854771712", None), (None, None)]
)
def test_parse_memory(text, value):
    assert resources.parse_memory(text) == value


def test_v2_limits_take_the_tightest_level():
    lim = resources.cgroup_limits(FIX / "v2")
    assert lim.version == 2
    assert lim.cpu_quota_cores == 1.5  # own cgroup; parent says max
    assert lim.memory_bytes == 2 * GiB  # own 2 GiB is tighter than the parent's 4 GiB


def test_v2_unlimited():
    assert resources.cgroup_limits(FIX / "v2_unlimited") == resources.CgroupLimits(2, None, None)


def test_v1_limits():
    assert resources.cgroup_limits(FIX / "v1") == resources.CgroupLimits(1, 1.0, 2 * GiB)


def test_v1_unlimited_is_no_limit():
    assert resources.cgroup_limits(FIX / "v1_unlimited") == resources.CgroupLimits(1, None, None)


def test_no_cgroup_filesystem(tmp_path):
    assert resources.cgroup_limits(tmp_path) == resources.CgroupLimits(None, None, None)


def test_usable_cores_order(tmp_path):
    assert resources.usable_cores({}, FIX / "v2") == 1  # quota 1.5 -> 1 whole core
    assert resources.usable_cores({"CPU_LIMIT": "1"}, tmp_path) == 1
    many = {"CPU_LIMIT": "64"}
    assert resources.usable_cores(many, tmp_path) == len(__import__("os").sched_getaffinity(0))


def test_cpu_cores_keeps_the_fraction_of_a_quota(tmp_path):
    assert resources.cpu_cores({}, FIX / "v2") == 1.5  # what usable_cores rounds down to 1
    assert resources.cpu_cores({"CPU_LIMIT": "0.8"}, tmp_path) == 0.8
    assert resources.usable_cores({"CPU_LIMIT": "0.8"}, tmp_path) == 1  # never below one whole core


def test_bad_cpu_limit_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="CPU_LIMIT='lots'"):
        resources.usable_cores({"CPU_LIMIT": "lots"}, tmp_path)


def test_v1_limits_and_use_are_this_process_own_cgroup_when_nested(tmp_path):
    """On a host (a Hub's spawner, Slurm, make test-slow) a session's v1 cgroup is below the
    hierarchy's root, whose usage is the whole machine's: its own limit and usage count."""
    mem, cpu = tmp_path / "sys/fs/cgroup/memory", tmp_path / "sys/fs/cgroup/cpu"
    own_mem, own_cpu = mem / "hub/labhub-alice", cpu / "labhub-alice"
    for d in (own_mem, own_cpu):
        d.mkdir(parents=True)
    (mem / "memory.limit_in_bytes").write_text("9223372036854771712")
    (mem / "memory.usage_in_bytes").write_text(str(20 * GiB))  # the machine
    (mem / "hub" / "memory.limit_in_bytes").write_text(str(8 * GiB))
    (own_mem / "memory.limit_in_bytes").write_text(str(2 * GiB))
    (own_mem / "memory.usage_in_bytes").write_text(str(GiB // 2))  # the session
    (cpu / "cpu.cfs_quota_us").write_text("-1")
    (cpu / "cpu.cfs_period_us").write_text("100000")
    (own_cpu / "cpu.cfs_quota_us").write_text("100000")
    (own_cpu / "cpu.cfs_period_us").write_text("100000")
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/cgroup").write_text(
        "9:memory:/hub/labhub-alice\n5:cpu,cpuacct:/labhub-alice\n1:name=systemd:/\n"
    )
    assert resources.cgroup_limits(tmp_path) == resources.CgroupLimits(1, 1.0, 2 * GiB)
    available = resources.available_memory_bytes({"MEM_LIMIT": str(2 * GiB)}, tmp_path)
    assert available == min(psutil.virtual_memory().available, int(1.5 * GiB))
    # a container shows its own cgroup as the root: a path that is not there means the root
    (tmp_path / "proc/self/cgroup").write_text("9:memory:/docker/abc\n5:cpu,cpuacct:/docker/abc\n")
    assert resources.cgroup_limits(tmp_path) == resources.CgroupLimits(1, None, None)


def test_memory_limit_and_available(tmp_path):
    assert resources.memory_limit_bytes({}, FIX / "v2") == 2 * GiB
    assert resources.memory_limit_bytes({"MEM_LIMIT": str(GiB)}, FIX / "v2") == GiB
    assert resources.memory_limit_bytes({}, tmp_path) == psutil.virtual_memory().total
    # v2 fixture: limit 2 GiB, 1.5 GiB in use -> at most 0.5 GiB left
    assert resources.available_memory_bytes({}, FIX / "v2") <= GiB // 2
    assert resources.available_memory_bytes({}, FIX / "v1") <= int(1.5 * GiB)


@pytest.mark.parametrize(
    "env, kind",
    [
        ({"BINDER_LAUNCH_HOST": "https://mybinder.org/"}, "binder"),
        ({"JUPYTERHUB_USER": "ada"}, "jupyterhub"),
        ({"CI": "true"}, "ci"),
        ({}, "local"),
    ],
)
def test_host_kind(env, kind):
    assert resources.host_kind(env) == kind


def test_thread_pools_are_sized_to_the_quota_and_a_set_size_is_kept():
    """A pod with a 1.5-CPU quota on a big node: every pool gets 1 thread, not the node's cores;
    a size the student (or the site) set is theirs."""
    sized = resources.thread_env({}, FIX / "v2")
    assert sized == {name: "1" for name in resources.THREAD_VARS}
    assert "OMP_NUM_THREADS" not in resources.thread_env({"OMP_NUM_THREADS": "4"}, FIX / "v2")


def test_tensorflow_allocates_through_its_own_allocator_unless_told_otherwise(monkeypatch):
    assert resources.allocator_env({}) == {"TF_CPU_ALLOCATOR_USE_BFC": "1"}
    assert resources.allocator_env({"TF_CPU_ALLOCATOR_USE_BFC": "0"}) == {}  # the student's, or the site's
    # every task of a job gets it, wherever it runs
    monkeypatch.delenv("TF_CPU_ALLOCATOR_USE_BFC", raising=False)
    job = TFCluster(ps=1, workers=1, script="-m lab_utils.training.towers", progress=False)
    job.run_dir = Path("/tmp/x")
    assert job._base_env()["TF_CPU_ALLOCATOR_USE_BFC"] == "1"
    monkeypatch.setenv("TF_CPU_ALLOCATOR_USE_BFC", "false")
    assert job._base_env()["TF_CPU_ALLOCATOR_USE_BFC"] == "false"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_the_inactive_file_cache_is_not_counted_as_used(tmp_path, version):
    """What a session has read (a data set, TensorFlow's libraries) stays in its cgroup's
    usage until the kernel reclaims it, which it does before any OOM kill: the working set
    (usage less inactive files, as the kubelet counts it) is what a new task competes with."""
    base = tmp_path / "sys/fs/cgroup"
    if version == "v2":
        base.mkdir(parents=True)
        (base / "cgroup.controllers").write_text("cpu memory\n")
        (base / "memory.max").write_text(str(2 * GiB))
        (base / "memory.current").write_text(str(int(1.5 * GiB)))
        stat = base / "memory.stat"
        stat.write_text(f"anon {GiB // 2}\nfile {GiB}\nactive_file {GiB // 4}\ninactive_file {3 * GiB // 4}\n")
    else:
        mem = base / "memory"
        mem.mkdir(parents=True)
        (mem / "memory.limit_in_bytes").write_text(str(2 * GiB))
        (mem / "memory.usage_in_bytes").write_text(str(int(1.5 * GiB)))
        stat = mem / "memory.stat"
        stat.write_text(f"cache {GiB}\ninactive_file 1\ntotal_inactive_file {3 * GiB // 4}\n")
    room = min(psutil.virtual_memory().available, int(1.25 * GiB))  # 2 - (1.5 - 0.75) GiB
    assert resources.available_memory_bytes({}, tmp_path) == room
    stat.unlink()  # no memory.stat (a restricted view): the usage alone, as before
    assert resources.available_memory_bytes({}, tmp_path) == min(psutil.virtual_memory().available, GiB // 2)
