"""One launched process and how it ends: ``Task``, the one kill-tree, the one resource-fit rule.

Every child runs in its own session (``start_new_session=True``), so its process
group is its whole tree (the :mod:`lab_utils._guard` middleman and the script).
:func:`terminate` is the only place that stops processes: SIGTERM to each
group, a grace period, SIGKILL to what is left, and it says which survived.
:meth:`TFCluster.stop`, the restart after a failed bind and :func:`reap` all
call it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import psutil

from lab_utils import report, resources

#: Memory one more TensorFlow CPU task (its server and a small model, no data) adds to
#: a session's cgroup: its private (anonymous) resident memory. Measured on the course host
#: with TF 2.15 (/proc/PID/status RssAnon): a PS 245 MB, a worker with the 5,000-image MNIST sample
#: 273 MB (253 MB without its data), with the full set 476-504 MB; 288 MB leaves 14 % over
#: the largest (tests/process/test_ps_training.py and test_ps_strategy.py hold a real cluster's
#: tasks under it, on TF 2.21 as on 2.15). Its
#: file pages, about 240 MB more resident, are TensorFlow's library, shared by every
#: TensorFlow process and charged once, to the kernel that imported it first. (Counted per
#: task, at 450 MB, a Binder session of 2 GB refused Lab 2's second worker, which fits.)
TF_TASK_MEMORY_BYTES = 288 * 1024**2
#: Resident memory of one lab_utils._guard middleman (measured: 12 MB).
GUARD_MEMORY_BYTES = 15 * 1024**2
MB = 1024**2


class ClusterError(RuntimeError):
    """A task failed, did not become ready in time, or the run timed out.

    ``task`` (e.g. ``"worker:1"``), ``exit_code`` (None if it was still running;
    negative = killed by that signal) and ``log_tail`` (last lines of its log)."""

    def __init__(self, message: str, task: str | None = None, exit_code: int | None = None, log_tail: str = ""):
        self.task, self.exit_code, self.log_tail = task, exit_code, log_tail
        text = message
        if log_tail:
            text += f"\n--- last lines of {task}'s log ---\n{log_tail}"
        super().__init__(text)


class ResourceError(ValueError):
    """The cluster would not fit in the memory this session may use."""


# --------------------------------------------------------------------------- resources


def task_bytes(memory_per_task: int | None = None, *, guard: bool = True) -> int:
    """Memory one task needs: the TensorFlow task (or ``memory_per_task``) plus its guard."""
    per = TF_TASK_MEMORY_BYTES if memory_per_task is None else int(memory_per_task)
    return per + (GUARD_MEMORY_BYTES if guard else 0)


def tasks_that_fit(memory_per_task: int | None = None, *, guard: bool = True, available: int | None = None) -> int:
    """How many tasks fit in the memory this session may use (cgroup / ``MEM_LIMIT``)."""
    avail = resources.available_memory_bytes() if available is None else available
    return int(avail // task_bytes(memory_per_task, guard=guard))


#: What to do when a run does not fit: said by every error about memory.
FREE_MEMORY = "close other notebooks (Kernel > Shut Down Kernel) or run `python -m lab_utils reap`"


def fit_count(requested: int, need: Callable[[int], int], *, available: int | None = None) -> int:
    """The largest ``n <= requested`` whose ``need(n)`` bytes fit the memory this session may
    use (``available``: that figure, measured if None); 0 when not even one fits. The rule
    every ``fit_*`` of the labs applies to its own memory model."""
    avail = resources.available_memory_bytes() if available is None else available
    return next((n for n in range(requested, 0, -1) if need(n) <= avail), 0)


def nothing_fits(what: str, need: int, available: int) -> ResourceError:
    """The error when not even the smallest run fits: ``what`` (``"not even 1 PS + 1 worker
    fits: they need"``), the bytes it needs and those available, and what to do."""
    return ResourceError(
        f"{what} about {need / MB:,.0f} MB, {available / MB:,.0f} MB are available under this session's limit; "
        + FREE_MEMORY
    )


def check_fit(
    tasks: int, what: str, memory_per_task: int | None, *, guard: bool, hint: Callable[[int], str | None]
) -> None:
    """Raise :class:`ResourceError` when ``tasks`` local tasks do not fit.

    ``what`` names the request (``"1 PS + 4 workers"``); ``hint(fit)`` turns the
    number of tasks that do fit into a suggestion (None: nothing smaller works)."""
    per = task_bytes(memory_per_task, guard=guard)
    avail = resources.available_memory_bytes()
    if tasks * per <= avail:
        return
    advice = hint(int(avail // per)) or FREE_MEMORY
    raise ResourceError(
        f"{what} needs about {tasks * per / 1024**3:.1f} GB ({per / MB:.0f} MB per task), "
        f"{avail / 1024**3:.1f} GB available under this session's limit; {advice}"
    )


# --------------------------------------------------------------------------- processes


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def same_process_alive(pid: int, created: float | None) -> bool:
    """True if ``pid`` runs and is the process we recorded (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(proc.create_time() - created) < 0.01
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def signal_group(pgid: int, pid: int, sig: int) -> None:
    """Signal the process group; fall back to the process itself (group gone or not ours)."""
    try:
        os.killpg(pgid, sig)
        return
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path | None, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if it does not exist)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            data = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class Stoppable(Protocol):
    """What :func:`terminate` needs: a pid, a process group and a bounded wait."""

    pid: int | None
    pgid: int | None

    def wait_exit(self, timeout: float) -> bool: ...


@dataclass
class Recorded:
    """A process known only from a state file (pid + create time): used by reap."""

    name: str
    pid: int
    pgid: int
    created: float | None

    def alive(self) -> bool:
        return same_process_alive(self.pid, self.created)

    def wait_exit(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.alive():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.03)  # polling a process we cannot wait() on (not our child)
        try:
            os.waitpid(self.pid, os.WNOHANG)  # our child (a stray of an interrupted start): no zombie left
        except ChildProcessError:
            pass  # not our child: its own parent (or init) reaps it
        return True


class Outcome(NamedTuple):
    survivors: list  # processes still alive after SIGKILL
    interrupted: bool  # a KeyboardInterrupt cut the graceful wait short (re-raise it when done)


def _tree(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


def _listening_sockets(pid: int, port: int) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` in process ``pid``'s network namespace."""
    found = set()
    for table in ("tcp", "tcp6"):
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:  # gone, or not ours to read
            continue
        for row in rows:  # sl local_address rem_address st ... inode
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found.add(fields[9])
    return found


def _net_namespace(pid: int) -> str:
    """Process ``pid``'s network namespace (``net:[4026531840]``); the pid itself where unreadable."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return f"pid {pid}"


def _open_sockets(pid: int) -> set[str]:
    """Inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _kill(procs: Sequence[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()  # psutil checks the create time first: a reused pid is never hit
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue


def terminate(procs: Sequence[Stoppable], grace: float, kill_wait: float = 5.0) -> Outcome:
    """SIGTERM every group, wait up to ``grace`` s, SIGKILL the rest, wait ``kill_wait`` s.

    The SIGKILL goes to each group *and* to every descendant seen before the
    SIGTERM (MPI ranks may live in sessions of their own, out of the group's
    reach once the guard is gone). Returns the processes still alive after
    SIGKILL (to be reported, never forgotten). An interrupt during the graceful
    wait skips straight to SIGKILL; the caller re-raises it once its bookkeeping
    is done, so Interrupt never leaves a half-stopped cluster."""
    procs = [p for p in procs if p.pid]
    trees = {id(p): _tree(p.pid) for p in procs}
    for p in procs:
        signal_group(p.pgid or p.pid, p.pid, signal.SIGTERM)
    interrupted = False
    deadline = time.monotonic() + grace
    try:
        alive = [p for p in procs if not p.wait_exit(max(0.0, deadline - time.monotonic()))]
    except KeyboardInterrupt:
        interrupted, alive = True, list(procs)
    for p in alive:
        signal_group(p.pgid or p.pid, p.pid, signal.SIGKILL)
        _kill(trees[id(p)])
    deadline = time.monotonic() + kill_wait
    return Outcome([p for p in alive if not p.wait_exit(max(0.0, deadline - time.monotonic()))], interrupted)


class Task:
    """One launched process (a TF task, or the mpirun/horovodrun launcher)."""

    def __init__(
        self,
        name: str,
        log_path: Path,
        events_path: Path | None = None,
        host: str | None = None,
        port: int | None = None,
    ):
        self.name, self.log_path, self.events_path, self.host, self.port = name, log_path, events_path, host, port
        self.popen: subprocess.Popen | None = None
        self.pid: int | None = None
        self.create_time: float | None = None
        self.state = "pending"  # pending, starting, ready, running, done, failed, stopped, survived
        self.exit_code: int | None = None

    @property
    def role(self) -> str:
        return self.name.split(":")[0]

    @property
    def pgid(self) -> int | None:
        return self.pid  # its own session: the group id is its pid

    def poll(self) -> int | None:
        if self.popen is not None and self.exit_code is None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = code
                if self.state != "stopped":
                    self.state = "done" if code == 0 else "failed"
        return self.exit_code

    def running(self) -> bool:
        return self.popen is not None and self.poll() is None

    def wait_exit(self, timeout: float) -> bool:
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        self.poll()
        return True

    def events(self, kind: str | None = None) -> list[dict]:
        return report.read_events(self.events_path, kind) if self.events_path else []

    def listening(self) -> bool:
        """Whether a process of this task's tree (the guard, the script, what it started)
        listens on :attr:`port`: a listening socket on that port in the process's own
        network namespace (``/proc/PID/net/tcp``, which psutil would read in this one) that
        is one of its open files. False where the tree cannot be read (gone, or another
        user's) and for a task started elsewhere (its ssh client listens on nothing)."""
        if self.port is None or self.pid is None or self.exit_code is not None:
            return False
        held = {
            pid: sockets for pid in (self.pid, *(p.pid for p in _tree(self.pid))) if (sockets := _open_sockets(pid))
        }
        tables: dict[str, set[str]] = {}  # network namespace -> its listening sockets, read once
        for pid, sockets in held.items():
            namespace = _net_namespace(pid)
            if namespace not in tables:
                tables[namespace] = _listening_sockets(pid, self.port)
            if sockets & tables[namespace]:
                return True
        return False

    def as_state(self) -> dict:
        return {
            "name": self.name,
            "pid": self.pid,
            "pgid": self.pid,
            "create_time": self.create_time,
            "host": self.host,
            "port": self.port,
            "log": str(self.log_path),
            "state": self.state,
        }

    def __repr__(self) -> str:
        code = "" if self.exit_code is None else f" exit={self.exit_code}"
        port = f" port={self.port}" if self.port else ""
        return f"<Task {self.name} pid={self.pid}{port} {self.state}{code}>"
