"""A sandbox per graded submission: everything it starts is found and killed afterwards.

::

    box = Sandbox("alice-02", memory_mb=4096, cpus=2, max_processes=512)
    proc = box.start([sys.executable, "-m", "lab_utils.grading.worker", spec], log=path)
    box.wait(proc, timeout=2000)
    leaked = box.sweep()      # [{pid, name, cmdline, listening}], all killed by now
    box.close()

Two modes, and :attr:`Sandbox.mode` says which one a grading run had:

- **isolated** (root, cgroups available, as in CI and on a grading server): its own
  cgroup (CPU quota, memory limit with swap off, ``pids.max``) that no process in it
  can leave, and its own network and mount namespaces (``unshare``): only a loopback
  interface, so clusters of two submissions never share ports and nothing reaches
  the network. The worker drops the kernel to an unprivileged uid of its own.
- **process group** (not root): its own session, ``RLIMIT_CORE`` 0 and an
  ``RLIMIT_CPU`` budget, and a sweep of its descendants and of every process that
  inherited its ``LAB_SANDBOX`` marker. A process that clears its environment and
  starts its own session can escape that sweep; memory and process limits need root.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import psutil

from lab_utils import config

__all__ = [
    "Sandbox",
    "SandboxError",
    "cgroup_support",
    "leftover_cgroups",
    "orphaned_cgroups",
    "remove_orphaned_cgroups",
    "listening_ports",
    "own_cgroup_v1",
    "memory_events",
    "pids_refused",
    "quota_ceiling_v1",
    "run_checked",
]

_V1 = Path("/sys/fs/cgroup")
_CONTROLLERS_V1 = ("memory", "pids", "cpu")


class SandboxError(RuntimeError):
    """The sandbox could not be set up (the grading run is an infrastructure failure)."""


def run_checked(*argv: str) -> None:
    """Run a setup command (``mount``, ``ip``); RuntimeError with its stderr if it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")


def cgroup_support() -> str | None:
    """``"v1"`` or ``"v2"`` when this process may create cgroups (root), else None."""
    if os.geteuid() != 0:
        return None
    if (_V1 / "cgroup.controllers").is_file():
        controllers = (_V1 / "cgroup.controllers").read_text().split()
        return "v2" if {"memory", "pids", "cpu"} <= set(controllers) else None
    if all((_V1 / c / "cgroup.procs").is_file() for c in _CONTROLLERS_V1):
        return "v1"
    return None


def own_cgroup_v1(controller: str, proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = _V1) -> Path:
    """This process's cgroup folder for a v1 ``controller``: a sandbox nests under it, so a
    quota or limit set above the grader (a Slurm job's, a container's, ``make test-slow``'s)
    also bounds every submission it grades. The hierarchy's root where none is listed."""
    for line in proc_cgroup.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return root / controller / path.lstrip("/")
    return root / controller


def _own_folder(controller: str, proc_cgroup: Path, root: Path) -> Path:
    """This process's cgroup folder for ``controller``: v2's one folder, or v1's per controller
    (StopIteration where v2 lists none)."""
    if (root / "cgroup.controllers").is_file():  # v2
        rel = next(ln[3:] for ln in proc_cgroup.read_text().splitlines() if ln.startswith("0::"))
        return root / rel.lstrip("/")
    return own_cgroup_v1(controller, proc_cgroup, root)


def memory_events(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = _V1) -> tuple[int, int | None] | None:
    """(OOM kills so far, peak bytes or None) of this process's memory cgroup: what a grading
    worker, inside its sandbox's cgroup, reads to tell a kernel the memory limit killed from one
    that died of something else. v1: ``memory.oom_control``'s ``oom_kill`` and
    ``memory.max_usage_in_bytes``; v2: ``memory.events``' ``oom_kill`` and ``memory.peak``.
    None where there is no such counter (no memory cgroup, a kernel before 4.13)."""
    try:
        folder = _own_folder("memory", proc_cgroup, root)
        v2 = (root / "cgroup.controllers").is_file()
        events, peak = ("memory.events", "memory.peak") if v2 else ("memory.oom_control", "memory.max_usage_in_bytes")
        counters = dict(line.split() for line in (folder / events).read_text().splitlines() if len(line.split()) == 2)
        kills = int(counters["oom_kill"])
    except (OSError, StopIteration, KeyError, ValueError):
        return None
    try:
        return kills, int((folder / peak).read_text())
    except (OSError, ValueError):
        return kills, None


def pids_refused(proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = _V1) -> int | None:
    """How many times this process's pids cgroup refused a new task at its ``pids.max``
    (``pids.events``' ``max``): what a grading worker reads to name the process limit as the
    cause of a cell's failed forks. None where there is no such counter."""
    try:
        folder = _own_folder("pids", proc_cgroup, root)
        counters = dict(ln.split() for ln in (folder / "pids.events").read_text().splitlines() if len(ln.split()) == 2)
        return int(counters["max"])
    except (OSError, StopIteration, KeyError, ValueError):
        return None


def quota_ceiling_v1(cpu_dir: Path, root: Path = _V1 / "cpu") -> float | None:
    """The tightest CPU quota, in cores, set on v1 ``cpu_dir`` or an ancestor up to ``root``
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; -1 is none), or None. A cgroup nested there
    may not be given more: the kernel refuses a child's quota above its parent's (EINVAL)."""
    ceiling, d = None, Path(cpu_dir)
    while True:
        try:
            quota = int((d / "cpu.cfs_quota_us").read_text())
            period = int((d / "cpu.cfs_period_us").read_text())
        except (FileNotFoundError, ValueError):
            quota, period = -1, 0
        if quota > 0 and period > 0:
            ceiling = quota / period if ceiling is None else min(ceiling, quota / period)
        if d == root or d == d.parent:
            return ceiling
        d = d.parent


def leftover_cgroups(pid: int) -> list[Path]:
    """The cgroups of the grading batch ``pid``'s sandboxes that still exist (named
    ``labgrade-<slot>-<pid>``, wherever they nest)."""
    if cgroup_support() == "v1":
        return sorted(p for c in _CONTROLLERS_V1 for p in own_cgroup_v1(c).glob(f"labgrade-*-{pid}"))
    return sorted(_V1.glob(f"labgrade-*-{pid}"))


def orphaned_cgroups(prefix: str = "labgrade") -> dict[str, list[Path]]:
    """Sandboxes' cgroups (``<prefix>-<slot>-<pid>``, beside the ones this process would
    make) whose grading process ``pid`` is gone, by name: a grader killed before its
    ``close`` (SIGKILL, the OOM killer, a ``scancel`` past Slurm's KillWait) leaves them,
    with whatever a submission still runs in them."""
    support = cgroup_support()
    if support is None:
        return {}
    parents = [own_cgroup_v1(c) for c in _CONTROLLERS_V1] if support == "v1" else [_V1]
    found: dict[str, list[Path]] = {}
    for parent in parents:
        for d in parent.glob(f"{prefix}-*-*"):
            pid = d.name.rsplit("-", 1)[1]
            if d.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
                found.setdefault(d.name, []).append(d)
    return found


def remove_orphaned_cgroups(prefix: str = "labgrade") -> tuple[list[str], list[str]]:
    """Kill what runs in every :func:`orphaned_cgroups` sandbox and remove its cgroups.
    Returns the names removed and, for any that would not go, why (it is left as it was)."""
    removed, failed = [], []
    support = cgroup_support()
    for name, dirs in sorted(orphaned_cgroups(prefix).items()):
        box = Sandbox.adopt({"name": name, "cgroup": support, "dirs": [str(d) for d in dirs]}, prefix)
        if box is None:
            continue
        try:
            box.close()
            removed.append(name)
        except (OSError, SandboxError) as exc:
            failed.append(f"{name}: {exc}")
    return removed, failed


def listening_ports(pid: int) -> list[int]:
    """TCP ports ``pid`` listens on, read from ITS network namespace (``/proc/<pid>/net``;
    psutil reads the caller's, which misses a sandbox's sockets)."""
    socket_inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                socket_inodes.add(target[8:-1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except (FileNotFoundError, PermissionError):
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and fields[9] in socket_inodes:  # 0A = LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def _write(path: Path, value) -> None:
    path.write_text(str(value))


class Sandbox:
    """One submission's processes: start them, bound them, find and kill what is left."""

    def __init__(
        self,
        name: str,
        *,
        memory_mb: float = 4096,
        cpus: float = 2.0,
        max_processes: int = 512,
        disk_mb: float | None = None,
        network: str = "loopback",
        cpu_seconds: int | None = None,
        isolate: bool | None = None,
        prefix: str = "labgrade",
    ):
        if not name or "/" in name:
            raise ValueError(f"sandbox name must be a non-empty string without '/', got {name!r}")
        self.name = f"{prefix}-{name}-{os.getpid()}"
        self.memory_mb, self.cpus, self.max_processes = memory_mb, cpus, max_processes
        self.disk_mb = disk_mb  # the worker mounts it (a tmpfs in the sandbox's mount namespace)
        self.network, self.cpu_seconds = network, cpu_seconds
        self.cgroup = cgroup_support() if isolate is not False else None
        if isolate and not self.cgroup:
            raise SandboxError("an isolated sandbox needs root and cgroups (memory, pids, cpu)")
        self._dirs: list[Path] = []
        self._memory_dir: Path | None = None
        self._proc: subprocess.Popen | None = None
        if self.cgroup:
            self._make_cgroup()

    @property
    def isolated(self) -> bool:
        return self.cgroup is not None

    @property
    def mode(self) -> str:
        if self.isolated:
            net = "network namespace with loopback only" if self.network == "loopback" else "host network"
            return (
                f"isolated: cgroup {self.cgroup} ({self.cpus:g} CPUs, {self.memory_mb:g} MB without swap, "
                f"{self.max_processes} processes), {net}, private mounts"
                + (f" ({self.disk_mb:g} MB to write: folder, home and /tmp)" if self.disk_mb else "")
                + ", unprivileged kernel"
            )
        return (
            "process group (not root): own session, CPU-time limit, sweep of descendants and marked processes; "
            "no memory, process or disk limit, no network isolation, the kernel runs as the grader's user"
        )

    # ------------------------------------------------------------------ cgroups
    def _make_cgroup(self) -> None:
        try:
            if self.cgroup == "v1":
                dirs = {ctrl: own_cgroup_v1(ctrl) / self.name for ctrl in _CONTROLLERS_V1}
                for d in dirs.values():
                    d.mkdir()
                    self._dirs.append(d)
                mem = self._memory_dir = dirs["memory"]
                _write(mem / "memory.limit_in_bytes", int(self.memory_mb * 2**20))
                if (mem / "memory.memsw.limit_in_bytes").exists():
                    _write(mem / "memory.memsw.limit_in_bytes", int(self.memory_mb * 2**20))
                _write(mem / "memory.swappiness", 0)
                _write(dirs["pids"] / "pids.max", int(self.max_processes))
                cpu = dirs["cpu"]
                period = int((cpu / "cpu.cfs_period_us").read_text())
                ceiling = quota_ceiling_v1(cpu.parent)  # a quota above the grader's (make test-slow, a Slurm job)
                cores = self._cpus() if ceiling is None else min(self._cpus(), ceiling)
                _write(cpu / "cpu.cfs_quota_us", int(cores * period))
            else:  # v2: at the root (a cgroup with processes in it cannot delegate controllers)
                parent = Path(_V1)
                _write(parent / "cgroup.subtree_control", "+memory +pids +cpu")
                d = self._memory_dir = parent / self.name
                d.mkdir()
                self._dirs.append(d)
                _write(d / "memory.max", int(self.memory_mb * 2**20))
                _write(d / "memory.swap.max", 0)
                _write(d / "pids.max", int(self.max_processes))
                _write(d / "cpu.max", f"{int(self._cpus() * 100000)} 100000")
        except OSError as exc:
            self.close()
            raise SandboxError(f"cannot create cgroup {self.name} ({self.cgroup}): {exc}") from exc

    def _cpus(self) -> float:
        return max(0.1, min(float(self.cpus), float(os.cpu_count() or 1)))

    def _procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self._dirs]

    # ------------------------------------------------------------------ running
    def command(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped for this sandbox (``unshare`` for the namespaces when isolated)."""
        if not self.isolated:
            return list(argv)
        # its own mounts, System V IPC and POSIX message queues (gone with its last process), network
        ns = ["--mount", "--propagation", "private", "--ipc"] + (["--net"] if self.network == "loopback" else [])
        return ["unshare", *ns, "--", *argv]

    def start(self, argv: list[str], *, log: Path, env: dict | None = None, cwd: Path | None = None, pass_fds=()):
        """Start ``argv`` in the sandbox (its own session), stdout and stderr to ``log``;
        ``pass_fds``: file descriptors it inherits (the batch's gate)."""
        if self._proc is not None:
            raise SandboxError(f"sandbox {self.name} already runs pid {self._proc.pid}")
        env = {**(env if env is not None else os.environ), config.SANDBOX: self.name}
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(
                self.command(argv),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
                preexec_fn=self.enter,  # noqa: PLW1509 (the grader's own, single-purpose child)
            )
        return self._proc

    def enter(self) -> None:
        """Join this sandbox and take its limits: what a child runs before exec (``start``'s,
        or another launcher's preexec function, e.g. the Hub's spawner)."""
        procs = self._procs_files()
        for f in procs:
            f.write_text(str(os.getpid()))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.cpu_seconds and not procs:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds))

    def wait(self, timeout: float) -> int | None:
        """The worker's exit code, or None when it ran past ``timeout`` (then it is killed)."""
        try:
            return self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._killpg(self._proc.pid)
            self._proc.wait()
            return None

    def peak_memory_bytes(self) -> int | None:
        """The most memory the sandbox's processes held together so far (the cgroup's
        high-water mark, swap not counted); None without a cgroup, or where the kernel
        does not keep one (cgroup v2 before Linux 5.19)."""
        if not self._dirs:
            return None
        try:
            return int(
                (self._memory_dir / ("memory.max_usage_in_bytes" if self.cgroup == "v1" else "memory.peak")).read_text()
            )
        except (FileNotFoundError, ValueError):
            return None

    def working_set_bytes(self) -> tuple[int, int] | None:
        """``(working set, private)`` memory of the sandbox's processes now: the cgroup's
        usage less its inactive file cache (what the kubelet and ``docker stats`` count:
        the kernel reclaims inactive files before any OOM kill), and its anonymous memory
        alone. None without a cgroup."""
        if not self._dirs:
            return None
        v1 = self.cgroup == "v1"
        try:
            usage = int((self._memory_dir / ("memory.usage_in_bytes" if v1 else "memory.current")).read_text())
            stat = dict(line.split() for line in (self._memory_dir / "memory.stat").read_text().splitlines())
        except (FileNotFoundError, ValueError):  # the cgroup is being removed
            return None
        inactive = int(stat.get("total_inactive_file" if v1 else "inactive_file", 0))
        anon = int(stat.get("total_rss" if v1 else "anon", 0))
        return max(0, usage - inactive), anon

    # ------------------------------------------------------------------ leftovers
    def members(self) -> list[int]:
        """PIDs of every process still in the sandbox."""
        if self.isolated:
            pids = set()
            for f in self._procs_files():
                try:
                    pids.update(int(p) for p in f.read_text().split())
                except FileNotFoundError:
                    continue
            return sorted(pids)
        found = set()
        if self._proc is not None:
            try:
                found.update(c.pid for c in psutil.Process(self._proc.pid).children(recursive=True))
                found.add(self._proc.pid)
            except psutil.NoSuchProcess:
                pass
        me = os.getuid()
        for p in psutil.process_iter(["pid", "uids"]):
            try:
                if (
                    p.info["uids"]
                    and p.info["uids"].real == me
                    and config.get(config.SANDBOX, p.environ()) == self.name
                ):
                    found.add(p.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return sorted(pid for pid in found if psutil.pid_exists(pid))

    @staticmethod
    def describe(pid: int) -> dict | None:
        try:
            p = psutil.Process(pid)
            with p.oneshot():
                return {
                    "pid": pid,
                    "name": p.name(),
                    "cmdline": " ".join(p.cmdline())[:300],
                    "listening": listening_ports(pid),
                }
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied:
            return {"pid": pid, "name": "?", "cmdline": "?", "listening": []}

    def sweep(self, settle_s: float = 10.0) -> list[dict]:
        """Processes still in the sandbox once its worker has exited, described, then
        killed. Children that exit by themselves within ``settle_s`` (the clusters'
        parent-death guards) are not counted as leaked."""
        deadline = time.monotonic() + settle_s
        while (left := self.members()) and time.monotonic() < deadline:
            time.sleep(0.2)  # polling the sandbox's process list under a deadline
        leaked = [d for d in (self.describe(pid) for pid in left) if d]
        self.kill()
        return leaked

    def kill(self, deadline_s: float = 15.0) -> None:
        """SIGKILL every process of the sandbox, until none is left (bounded)."""
        deadline = time.monotonic() + deadline_s
        while pids := self.members():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            if time.monotonic() > deadline:
                raise SandboxError(f"sandbox {self.name}: processes {pids} survive SIGKILL")
            time.sleep(0.05)  # polling until the kernel has reaped them
        if self._proc is not None and self._proc.poll() is None:
            self._proc.wait(timeout=5)

    def _killpg(self, pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.kill()

    def close(self, deadline_s: float = 30.0) -> None:
        """Kill what is left and remove the cgroups: every one that will go within
        ``deadline_s`` (a loaded machine takes seconds to let its killed tasks leave), then
        :class:`SandboxError` naming those that would not (the next batch removes them,
        :func:`remove_orphaned_cgroups`)."""
        if self._dirs:
            self.kill()
        deadline = time.monotonic() + deadline_s
        left = list(self._dirs)
        while left:
            failures = []
            for d in left:
                try:
                    d.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    failures.append((d, exc))
            left = [d for d, _ in failures]
            if left and time.monotonic() > deadline:
                self._dirs = left
                raise SandboxError(
                    f"sandbox {self.name}: cannot remove " + "; ".join(f"{d} ({e})" for d, e in failures)
                )
            if left:
                time.sleep(0.05)  # the last killed task leaves the cgroup asynchronously
        self._dirs = []

    # ------------------------------------------------------------------ another process's
    def state(self) -> dict:
        """What finds this sandbox's cgroups again from another process (a restarted Hub's
        spawner keeps it in its state): JSON-able."""
        return {"name": self.name, "cgroup": self.cgroup, "dirs": [str(d) for d in self._dirs]}

    @classmethod
    def adopt(cls, state: dict, prefix: str) -> Sandbox | None:
        """The sandbox :meth:`state` described, to kill what it holds and remove it; None when
        its cgroups are gone or the state is not one this code wrote (its folders must be
        ``<prefix>-...`` cgroups under the cgroup mount)."""
        name, dirs = state.get("name"), [Path(d) for d in state.get("dirs") or []]
        if not (isinstance(name, str) and name.startswith(f"{prefix}-") and "/" not in name):
            return None
        root = _V1.resolve()
        dirs = [d for d in dirs if d.name == name and root in d.parents and d.is_dir()]
        if not dirs:
            return None
        box = cls.__new__(cls)  # no new cgroup: the ones found are this sandbox's
        box.name, box.cgroup, box._dirs, box._proc = name, state.get("cgroup"), dirs, None
        box._memory_dir = dirs[0] if box.cgroup != "v1" else next((d for d in dirs if "memory" in d.parts), None)
        box.memory_mb = box.cpus = box.max_processes = box.disk_mb = box.cpu_seconds = None
        box.network = "loopback"
        return box

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<Sandbox {self.name}: {self.mode}>"
