"""Networks held by a process: a user namespace of the job's own (emulated hosts without
root, :class:`UserNetwork`) and a cluster's private network (:class:`PrivateNetwork`).

Both end with the process that holds them, which ends when the job's pipe to it closes: on
``destroy``, or when the kernel dies, even by SIGKILL. :mod:`lab_utils.cluster.netem` picks
them (``netem.network``, ``private_network``) from what this process may do; what they share
with its named namespaces (the hosts' spec, names, shaping, :class:`BaseNetwork`) is
:mod:`lab_utils.cluster.netbase`'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from lab_utils.cluster.netbase import (
    CAP_NET_ADMIN,
    CAP_SYS_ADMIN,
    COMMAND_TIMEOUT,
    NAMESPACE_NAME,
    BaseNetwork,
    EmulatedHosts,
    NetworkError,
    has_capability,
    host_tmp,
    loopback_of,
    pick_subnet,
    port_counters,
    run_command,
    shaping,
    userns_refusal,
)
from lab_utils.cluster.process import Recorded


@lru_cache(maxsize=1)
def private_how() -> tuple[str | None, str | None]:
    """How this process makes a cluster's private network: ``"netns"`` (CAP_SYS_ADMIN:
    ``unshare --net``), ``"userns"``, or None and why. Creates nothing that outlives the probe."""
    if not os.uname().sysname == "Linux":
        return None, "network namespaces are Linux only"
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            return None, f"`{tool}` is not installed"
    up = ["--net", "ip", "link", "set", "lo", "up"]
    tries = [  # the student's own uid inside where unshare can keep its capabilities, else uid 0
        ("userns", ["unshare", "--user", "--map-current-user", "--keep-caps", *up]),
        ("userns-root", ["unshare", "--user", "--map-root-user", *up]),
    ]
    if has_capability(CAP_SYS_ADMIN) and has_capability(CAP_NET_ADMIN):
        tries.insert(0, ("netns", ["unshare", "--net", "ip", "link", "set", "lo", "up"]))
    errors = []
    for kind, cmd in tries:
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            errors.append(f"`{' '.join(cmd)}` did not finish within {COMMAND_TIMEOUT:g} s")
            continue
        if done.returncode == 0:
            return kind, None
        errors.append(done.stderr.strip())
    return None, userns_refusal(errors[-1])


class UserNetwork(BaseNetwork):
    """The same network inside a user namespace this process owns
    (:func:`~lab_utils.cluster.netem.how` ``"userns"``):
    no root, no capability, nothing created outside it.

    One process holds it (:mod:`lab_utils.cluster.usernet`, started under ``unshare --user
    --map-root-user --net``): its own network namespace is the hub; each host is a network
    namespace held by a child of it. Tasks join host ``i`` with ``nsenter --target <pid>
    --user --net --preserve-credentials``: uid 0 inside the namespace (Open MPI's
    run-as-root switches apply there), the student outside it, on the student's files. The
    holder ends when its standard input closes: on :meth:`destroy`, or when this process
    dies, even by SIGKILL; the namespaces vanish with their last process."""

    kind = "userns"
    inside_uid0 = True

    def __init__(self, spec: EmulatedHosts, n_hosts: int, lock_dir: str | os.PathLike | None = None):
        super().__init__(spec, n_hosts, lock_dir)
        self.holder: subprocess.Popen | None = None
        self.holder_started: float | None = None
        self.pids: list[int] = []  # a process inside host i's namespace

    @property
    def record(self) -> dict:
        return {
            **super().record,
            "kind": self.kind,
            "holder": self.holder.pid if self.holder else None,
            "holder_started": self.holder_started,
        }

    def _enter(self, pid: int) -> list[str]:
        return ["nsenter", "--target", str(pid), "--user", "--net", "--preserve-credentials"]

    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on emulated host ``i``: ``nsenter`` execs it (same pid)."""
        return [*self._enter(self.pids[i]), *cmd]

    def _ssh_case(self, i: int) -> str:
        return f"ns={self.hosts[i]} pid={self.pids[i]}"

    # already inside the job's user namespace (mpirun on host 0): join the host's network only
    _ssh_enter = (
        'if [ "$(readlink /proc/self/ns/user)" = "$(readlink /proc/$pid/ns/user)" ]; then\n'
        '  exec nsenter --target "$pid" --net /bin/sh -c "$*"\nfi\n'
        'exec nsenter --target "$pid" --user --net --preserve-credentials /bin/sh -c "$*"'
    )

    def build(self) -> UserNetwork:
        """Start the holder and wait (bounded) for its one line; on any failure, stop it and
        raise :class:`NetworkError` with its error."""

        netem_args, tbf_args = shaping(self.spec)
        # its own stack: no address here can meet the machine's or another network's
        self.subnet = pick_subnet([])
        addresses = [f"{self.address(i)}/{self.subnet.prefixlen}" for i in range(self.n_hosts)]
        spec = {"addresses": addresses, "netem": netem_args, "tbf": tbf_args}
        spec["tmp"] = [str(host_tmp(name)) for name in self.hosts]  # removed by the holder when it ends
        cmd = ["unshare", "--user", "--map-root-user", "--net", sys.executable, "-m", "lab_utils.cluster.usernet"]
        try:
            line = _start_holder(self, [*cmd, json.dumps(spec)])
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                raise _holder_failed(self.holder, line, "the user-namespace network did not start") from None
            self.pids = [int(pid) for pid in data["hosts"]]
            if data.get("no_netem"):
                self._no_netem()
        except BaseException:
            self.destroy()
            raise
        return self

    def counters(self) -> dict[int, dict[str, int]]:
        if self.destroyed or self.holder is None:
            return self.final_counters
        raw = run_command([*self._enter(self.holder.pid), "ip", "-s", "-j", "link", "show"]).stdout
        return port_counters(raw)

    def destroy(self) -> list[str]:
        """Close the holder's pipe and wait for it (bounded; then SIGKILL). Returns the
        hosts still held by a process afterwards (a task that survived SIGKILL)."""
        if self.destroyed:
            return []
        if self.holder is not None and self.pids:
            try:
                self.final_counters = self.counters()
            except NetworkError:
                pass
        self.destroyed = True
        if self.holder is not None:
            _end_holder(self.holder)
        for name in self.hosts:  # what its hosts' processes left in their temporary folders
            if host_tmp(name).is_dir():
                shutil.rmtree(host_tmp(name))
        return _held(self.pids, self.hosts)


class PrivateNetwork(BaseNetwork):
    """A network of one's own for a cluster on local hosts: one network namespace with only
    loopback in it, where every task of the job runs and talks over ``localhost`` as before.
    Its servers (TensorFlow's gRPC, Gloo, Open MPI) listen on every interface *of that
    namespace*, which has no interface but its own loopback: nothing else on the machine or
    the network can reach them (TensorFlow's SECURITY.md: a server "accepts connections from
    anywhere" and runs the graphs it is sent).

    Held by one process (``cat``, started under ``unshare --net``; without CAP_SYS_ADMIN under
    ``unshare --user --map-current-user --keep-caps --net``, so that the tasks keep the
    student's own uid inside, or ``--map-root-user`` where util-linux is older than 2.38)
    that ends when its standard input closes: on :meth:`destroy`, or when this process
    dies; tasks join it with ``nsenter``."""

    kind = "private"

    def __init__(self, userns: bool, as_root: bool = False):
        super().__init__(EmulatedHosts(1, bandwidth=None), 1)
        self.userns = userns
        # the student's own uid inside (unshare --map-current-user --keep-caps: util-linux 2.38+),
        # else uid 0 inside (Open MPI's run-as-root switches then apply)
        self.inside_uid0 = userns and as_root
        self.holder: subprocess.Popen | None = None
        self.holder_started: float | None = None
        self.final_loopback: tuple[str, tuple[int, int]] | None = None

    @property
    def record(self) -> dict:
        return {
            "kind": self.kind,
            "hub": None,
            "hosts": self.hosts,
            "subnet": None,
            "holder": self.holder.pid if self.holder else None,
            "holder_started": self.holder_started,
        }

    def address(self, i: int) -> None:  # the tasks keep talking over localhost
        return None

    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        enter = ["--user", "--net", "--preserve-credentials"] if self.userns else ["--net"]
        return ["nsenter", "--target", str(self.holder.pid), *enter, *cmd]

    def write_ssh(self, folder: str | os.PathLike) -> Path:
        raise NotImplementedError("a private network has one host: nothing to reach through ssh")

    def build(self) -> PrivateNetwork:

        mapping = ["--map-root-user"] if self.inside_uid0 else ["--map-current-user", "--keep-caps"]
        unshare = ["unshare", *(["--user", *mapping] if self.userns else []), "--net"]
        try:
            line = _start_holder(self, [*unshare, "sh", "-c", "ip link set lo up && echo ready && exec cat >/dev/null"])
            if line != "ready":
                raise _holder_failed(self.holder, line, f"no private network: `{' '.join(unshare)}` failed")
        except BaseException:
            self.destroy()
            raise
        return self

    def counters(self) -> dict[int, dict[str, int]]:
        return {}

    def loopback(self) -> tuple[str, tuple[int, int]] | None:
        """``(counter key, (bytes_recv, bytes_sent))`` of this network's loopback, which carries
        all its tasks' traffic (the metrics' ``lo`` row); after :meth:`destroy`, the counts read
        just before it, under the same key, so that a sample taken after the job ended still
        counts the bytes moved since the one before."""
        if self.destroyed or self.holder is None:
            return self.final_loopback
        counts = loopback_of(self.holder.pid)
        if counts is None or self.destroyed:  # it went while this read: the counts destroy() read are the last
            return self.final_loopback
        return f"lo@{self.holder.pid}", counts

    def destroy(self) -> list[str]:
        if self.destroyed:
            return []
        self.final_loopback = self.loopback()  # before the holder ends: its counters end with it
        self.destroyed = True
        if self.holder is not None:
            _end_holder(self.holder)
        for name in self.hosts:
            if host_tmp(name).is_dir():
                shutil.rmtree(host_tmp(name))
        return []


def _start_holder(net: BaseNetwork, cmd: list[str]) -> str:
    """Start ``cmd`` as ``net``'s holder (its standard input the pipe that keeps it alive)
    and return its first line, read within :data:`COMMAND_TIMEOUT` s."""
    import psutil

    net.holder = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # a notebook's Interrupt is not for it
    )
    net.holder_started = psutil.Process(net.holder.pid).create_time()
    return _read_line(net.holder, COMMAND_TIMEOUT)


def _holder_failed(holder: subprocess.Popen, line: str, what: str) -> NetworkError:
    """The error of a holder that did not say it was ready (stopped first: its stderr is whole)."""
    holder.kill()
    holder.wait()
    err = holder.stderr.read().decode(errors="replace").strip()
    return NetworkError(f"{what}: {err or line or 'no output'}")


def _end_holder(holder: subprocess.Popen) -> None:
    """Close a holder's pipe and wait for it (bounded; then SIGKILL)."""
    if holder.stdin and not holder.stdin.closed:
        holder.stdin.close()
    try:
        holder.wait(timeout=COMMAND_TIMEOUT)
    except subprocess.TimeoutExpired:
        holder.kill()
        holder.wait()
    for stream in (holder.stdout, holder.stderr):
        if stream:
            stream.close()


def private_network() -> PrivateNetwork:
    """An unbuilt :class:`PrivateNetwork`, the way this process may make one (:func:`private_how`);
    :class:`NetworkError` with the reason where it may not."""
    kind, reason = private_how()
    if kind is None:
        raise NetworkError(f"no private network here: {reason}")
    return PrivateNetwork(userns=kind != "netns", as_root=kind == "userns-root")


def _read_line(proc: subprocess.Popen, timeout: float) -> str:
    """One line of ``proc``'s stdout within ``timeout`` s ('' when it exits first)."""
    import selectors
    import time

    buf = b""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                proc.kill()
                proc.wait()
                raise NetworkError(f"the user-namespace network was not built within {timeout:g} s")
            if not sel.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
    return buf.decode(errors="replace").strip()


def _held(pids: Sequence[int], names: Sequence[str]) -> list[str]:
    """Names of the user-namespace hosts whose holding process has not ended within
    :data:`COMMAND_TIMEOUT` s of its holder (it ends at EOF on its pipe)."""
    import psutil

    procs = {}
    for pid, name in zip(pids, names, strict=True):
        try:
            procs[psutil.Process(pid)] = name
        except psutil.NoSuchProcess:
            continue
    alive = _wait_ended(list(procs), COMMAND_TIMEOUT)
    return [f"{procs[p]} (pid {p.pid})" for p in alive]


def _wait_ended(procs: list, timeout: float) -> list:
    """The processes of ``procs`` (psutil, not our children) still running after ``timeout``
    s, by :meth:`~lab_utils.cluster.process.Recorded.wait_exit`: a zombie has ended (its
    namespaces went with its exit; an orphan's reaping is the machine's init's, which may
    lag or never come), and a reused pid is not the process."""
    deadline = time.monotonic() + timeout
    return [
        p
        for p in procs
        if not Recorded(str(p.pid), p.pid, p.pid, p.create_time()).wait_exit(max(0.0, deadline - time.monotonic()))
    ]


def remove_held(record: dict) -> list[str]:
    """A dead kernel's user-namespace network: its holder ends by itself when the kernel's
    pipe closes; stop it here if it is still there (pid and start time checked)."""
    import psutil

    for name in record.get("hosts", []):
        if NAMESPACE_NAME.match(name) and host_tmp(name).is_dir():
            shutil.rmtree(host_tmp(name))
    pid, started = record.get("holder"), record.get("holder_started")
    if not pid:
        return []
    try:
        proc = psutil.Process(int(pid))
        if started is not None and abs(proc.create_time() - float(started)) > 0.01:
            return []  # the pid was reused
        proc.kill()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
    # A holder whose kernel is alive (reap(include_live=True)) stays a zombie until that
    # kernel reaps it: psutil's wait() took the whole timeout, then called it a survivor.
    if _wait_ended([proc], COMMAND_TIMEOUT):
        return [f"{record.get('hub') or 'private network'} (holder pid {pid})"]
    return []
