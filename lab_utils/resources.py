"""What this host really lets us use: cores, memory, the kind of host.

``os.cpu_count()`` and ``psutil.virtual_memory()`` describe the machine, not the
container a student runs in. JupyterHub exports ``CPU_LIMIT`` and ``MEM_LIMIT``;
Docker, Binder and Kubernetes set cgroup limits (v1 or v2). Both ``doctor`` and
the cluster's resource guard read these facts from here, so they never disagree.

Every reader takes a ``root`` so the unit tests can point it at fixture trees.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import psutil

__all__ = [
    "CgroupLimits",
    "cgroup_limits",
    "usable_cores",
    "cpu_cores",
    "thread_env",
    "allocator_env",
    "memory_limit_bytes",
    "available_memory_bytes",
    "host_kind",
]

# cgroup v1 reports "no limit" as a huge number close to 2**63 rounded to a page.
_V1_UNLIMITED = 2**60


@dataclass(frozen=True)
class CgroupLimits:
    """Limits read from the cgroup file system. ``None`` means no limit set."""

    version: int | None  # 1, 2, or None when no cgroup file system was found
    cpu_quota_cores: float | None
    memory_bytes: int | None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, PermissionError, NotADirectoryError):
        return None


def _own_cgroup_v2_path(root: Path) -> Path:
    """The directory of this process's cgroup (v2), or the root when unknown."""
    text = _read(root / "proc/self/cgroup")
    if text:
        for line in text.splitlines():
            if line.startswith("0::"):
                rel = line[3:].lstrip("/")
                candidate = root / "sys/fs/cgroup" / rel
                if candidate.is_dir():
                    return candidate
    return root / "sys/fs/cgroup"


def _own_cgroup_v1_path(root: Path, base: Path, controller: str) -> Path:
    """The directory of this process's v1 ``controller`` cgroup under its hierarchy ``base``,
    or ``base`` when unknown or not visible (a container's namespace shows its own cgroup as
    the root). A Hub's spawner, Slurm or ``make test-slow`` nest a session below the root."""
    text = _read(root / "proc/self/cgroup")
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and controller in parts[1].split(","):
            candidate = base / parts[2].lstrip("/")
            return candidate if candidate.is_dir() else base
    return base


def _tightest(cg: Path, top: Path, read) -> list:
    """``read(folder)`` for ``cg`` and each parent up to ``top``, the Nones left out."""
    found = []
    while True:
        value = read(cg)
        if value is not None:
            found.append(value)
        if cg == top or top not in cg.parents:
            return found
        cg = cg.parent


def parse_cpu_max(text: str | None) -> float | None:
    """cgroup v2 ``cpu.max``: ``"max 100000"`` or ``"150000 100000"`` -> cores."""
    if not text:
        return None
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    quota, period = int(parts[0]), int(parts[1])
    return quota / period if quota > 0 and period > 0 else None


def parse_v1_cpu(quota: str | None, period: str | None) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; -1 means no limit."""
    if quota is None or period is None:
        return None
    q, p = int(quota), int(period)
    return q / p if q > 0 and p > 0 else None


def parse_memory(text: str | None) -> int | None:
    """``memory.max`` (v2: "max" or bytes) or ``memory.limit_in_bytes`` (v1)."""
    if not text or text == "max":
        return None
    value = int(text)
    return value if 0 < value < _V1_UNLIMITED else None


def cgroup_limits(root: str | os.PathLike = "/") -> CgroupLimits:
    """Read CPU quota and memory limit from cgroup v2, else v1, under ``root``."""
    root = Path(root)
    if (root / "sys/fs/cgroup/cgroup.controllers").exists():
        # v2: walk from our own cgroup up to the root; the tightest limit wins.
        cg, top = _own_cgroup_v2_path(root), root / "sys/fs/cgroup"
        cpus = _tightest(cg, top, lambda d: parse_cpu_max(_read(d / "cpu.max")))
        mems = _tightest(cg, top, lambda d: parse_memory(_read(d / "memory.max")))
        return CgroupLimits(2, min(cpus) if cpus else None, min(mems) if mems else None)
    v1cpu = root / "sys/fs/cgroup/cpu"
    if not v1cpu.exists():
        v1cpu = root / "sys/fs/cgroup/cpu,cpuacct"
    v1mem = root / "sys/fs/cgroup/memory"
    if v1cpu.exists() or v1mem.exists():
        # v1: from this process's own cgroup of each controller up to its hierarchy's root
        own_cpu, own_mem = _own_cgroup_v1_path(root, v1cpu, "cpu"), _own_cgroup_v1_path(root, v1mem, "memory")
        cpus = _tightest(
            own_cpu, v1cpu, lambda d: parse_v1_cpu(_read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us"))
        )
        mems = _tightest(own_mem, v1mem, lambda d: parse_memory(_read(d / "memory.limit_in_bytes")))
        return CgroupLimits(1, min(cpus) if cpus else None, min(mems) if mems else None)
    return CgroupLimits(None, None, None)


def _env_float(name: str, env) -> float | None:
    raw = env.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number; unset it or give e.g. {name}=2") from None
    return value if value > 0 else None


def cpu_cores(env=None, root: str | os.PathLike = "/") -> float:
    """The CPU this process may really use, in cores, fractions kept (a quota of 0.8): the
    smallest of CPU_LIMIT, the cgroup quota and the CPU affinity mask."""
    env = os.environ if env is None else env
    candidates = [float(len(os.sched_getaffinity(0)))]
    hub = _env_float("CPU_LIMIT", env)
    if hub is not None:
        candidates.append(hub)
    quota = cgroup_limits(root).cpu_quota_cores
    if quota is not None:
        candidates.append(quota)
    return min(candidates)


def usable_cores(env=None, root: str | os.PathLike = "/") -> int:
    """Whole cores this process may really use (:func:`cpu_cores`, rounded down): CPU_LIMIT,
    then the cgroup quota, then the CPU affinity mask. Always at least 1."""
    return max(1, math.floor(cpu_cores(env, root)))


#: The thread pools a process sizes from its environment: TensorFlow's two, and the OpenMP and
#: BLAS libraries numpy and TensorFlow link.
THREAD_VARS = (
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)


def thread_env(env=None, root: str | os.PathLike = "/") -> dict[str, str]:
    """Thread-pool sizes for a process started on this machine: :func:`usable_cores` (the
    cgroup's CPU quota, ``CPU_LIMIT``, the affinity mask), not the machine's cores. Otherwise
    TensorFlow sizes each pool to every core of the node: on a 64-core JupyterHub node a pod
    with a 1-CPU quota runs 64-thread pools and spends its quota switching between them. Where
    there is no quota the size is the cores, TensorFlow's own default. A variable already set
    (by the student, by a site's configuration) is kept."""
    env = os.environ if env is None else env
    cores = str(usable_cores(env, root))
    return {name: cores for name in THREAD_VARS if not env.get(name)}


#: How a TensorFlow process allocates host memory: through TensorFlow's own best-fit allocator
#: with coalescing (BFC, the one it uses for GPU memory), which reuses freed tensors' memory,
#: instead of glibc's malloc, whose per-thread arenas keep what a step freed fragmented. Lab 5's
#: MirroredStrategy process (AlexNet, width 1.0, 2 devices, batch 64 each) peaked at 0.66 GB
#: of private memory with it and 0.87 GB without.
ALLOCATOR_VARS = {"TF_CPU_ALLOCATOR_USE_BFC": "1"}


def allocator_env(env=None) -> dict[str, str]:
    """:data:`ALLOCATOR_VARS` for a process about to import TensorFlow; a variable already set
    (by the student, by a site's configuration) is kept."""
    env = os.environ if env is None else env
    return {name: value for name, value in ALLOCATOR_VARS.items() if not env.get(name)}


def memory_limit_bytes(env=None, root: str | os.PathLike = "/") -> int:
    """The memory this session may use: the smallest of MEM_LIMIT (JupyterHub),
    the cgroup limit and the machine's total memory."""
    env = os.environ if env is None else env
    candidates = [psutil.virtual_memory().total]
    hub = _env_float("MEM_LIMIT", env)
    if hub is not None:
        candidates.append(int(hub))
    cg = cgroup_limits(root).memory_bytes
    if cg is not None:
        candidates.append(cg)
    return int(min(candidates))


def _cgroup_memory_used(root: Path) -> int | None:
    """This session's cgroup's working set: its usage less its inactive file cache, as the
    kubelet and ``docker stats`` count it. The usage alone counts every file the session
    has read (a data set, TensorFlow's libraries) until the kernel needs the memory back,
    which it reclaims before any OOM kill; a fit decided on it refused tasks that fit."""
    base = root / "sys/fs/cgroup"
    if (base / "cgroup.controllers").exists():
        own = _own_cgroup_v2_path(root)
        text, inactive = _read(own / "memory.current"), _stat(own / "memory.stat", "inactive_file")
    else:
        own = _own_cgroup_v1_path(root, base / "memory", "memory")
        text, inactive = _read(own / "memory.usage_in_bytes"), _stat(own / "memory.stat", "total_inactive_file")
    if not (text and text.isdigit()):
        return None
    return max(0, int(text) - inactive)


def _stat(path: Path, key: str) -> int:
    """``key``'s value in a cgroup's ``memory.stat`` (0 when the file or the key is missing)."""
    for line in (_read(path) or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def available_memory_bytes(env=None, root: str | os.PathLike = "/") -> int:
    """Memory a new process can still get: the machine's available memory,
    capped by what is left under the session's limit."""
    env = os.environ if env is None else env
    free = psutil.virtual_memory().available
    limit = memory_limit_bytes(env, root)
    if limit < psutil.virtual_memory().total:
        used = _cgroup_memory_used(Path(root))
        if used is None:
            # MEM_LIMIT without a cgroup: count this user's processes.
            used = sum(_rss(p) for p in psutil.process_iter() if _same_user(p))
        free = min(free, max(0, limit - used))
    return int(free)


def _rss(proc: psutil.Process) -> int:
    try:
        return proc.memory_info().rss
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return 0


def _same_user(proc: psutil.Process) -> bool:
    try:
        return proc.uids().real == os.getuid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def host_kind(env=None) -> str:
    """Where we run, from the variables each host sets: binder, jupyterhub, ci, local."""
    env = os.environ if env is None else env
    if env.get("BINDER_LAUNCH_HOST") or env.get("BINDER_REQUEST") or env.get("BINDER_SERVICE_HOST"):
        return "binder"
    if env.get("JUPYTERHUB_API_TOKEN") or env.get("JUPYTERHUB_USER"):
        return "jupyterhub"
    if env.get("CI") or env.get("GITHUB_ACTIONS") or env.get("GITLAB_CI"):
        return "ci"
    return "local"
