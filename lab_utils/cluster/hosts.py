"""How a command starts on a host: which hosts are this machine, free ports, ssh, srun.

Every lab runs on this machine by default (``is_local``). Emulated hosts (network
namespaces on this machine) are :mod:`lab_utils.cluster.netem`'s. Real hosts come from
a hostfile (``hosts="hostfile:nodes.txt"``, :func:`read_hostfile`) and are reached
with ``ssh`` (:func:`ssh_command`), or from the Slurm allocation the notebook runs in
(``hosts="slurm"``, :func:`slurm_hosts`) and reached with ``srun``
(:func:`srun_command`). Tasks are placed round-robin over the slots (:func:`place`).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

#: Launchers that start a whole MPI/Horovod job as one process (ranks are its children).
LAUNCHERS = ("mpirun", "horovodrun")
_LOCAL_NAMES = ("", "localhost", "127.0.0.1", "::1")


def is_local(host: str | None) -> bool:
    """True for None, "", localhost, 127.0.0.1, ::1 and this machine's hostname."""
    return host is None or host in _LOCAL_NAMES or host == socket.gethostname()


def network_interfaces() -> list[str]:
    """This network namespace's interfaces that are up, have an address and are not
    loopback (what a server listening on every interface is reachable through)."""
    import psutil

    stats = psutil.net_if_stats()
    return sorted(
        nic
        for nic, addrs in psutil.net_if_addrs().items()
        if nic in stats
        and stats[nic].isup
        and not any(a.address in ("127.0.0.1", "::1") for a in addrs)
        and any(a.family in (socket.AF_INET, socket.AF_INET6) for a in addrs)
    )


def free_port(host: str = "") -> int:
    """A port the OS says is free now. The task binds it a few seconds later; if
    someone else took it meanwhile the bind fails and the cluster restarts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_ports(hosts: Sequence[str | None]) -> list[int]:
    """One distinct port per entry: asked from the OS for local hosts; for a remote
    host (which cannot be probed from here) a random high port, retried on bind failure."""

    def pick(host: str | None) -> int:
        return free_port() if is_local(host) else 20000 + secrets.randbelow(30000)

    ports: list[int] = []
    for host in hosts:
        port = pick(host)
        while port in ports:
            port = pick(host)
        ports.append(port)
    return ports


def ssh_command(
    ssh: Sequence[str], host: str, cwd: str, cmd: Sequence[str], env: Mapping[str, str], keep: Sequence[str]
) -> list[str]:
    """``ssh -tt host 'cd cwd && env K=V ... cmd'``: the variables named in ``keep`` travel.

    Needs key-based login, the same Python path and repository on every node, and
    the run directory on a shared file system (readiness and results are read
    from the tasks' events files)."""
    exports = [f"{k}={shlex.quote(env[k])}" for k in keep if k in env]
    remote = f"cd {shlex.quote(cwd)} && env {' '.join(exports)} {shlex.join(cmd)}"
    return [*ssh, "-tt", host, remote]


_SLOTS = re.compile(r"^(?P<host>[^\s:#]+)(?::(?P<colon>\d+)|\s+slots\s*=\s*(?P<slots>\d+))?\s*(?:#.*)?$")


def read_hostfile(path: str | os.PathLike) -> list[str]:
    """A hostfile's slots, one entry per slot: ``n1 slots=2`` (Open MPI's form) or
    ``n1:2`` (Horovod's) or ``n1``; ``#`` comments and blank lines are skipped."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ValueError(f"cannot read the hostfile {path}: {exc.strerror or exc}") from exc
    slots: list[str] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        m = _SLOTS.match(text)
        if not m or int(m.group("colon") or m.group("slots") or 1) < 1:
            raise ValueError(f"{path}, line {number}: {line!r} is not 'host', 'host slots=N' or 'host:N'")
        slots += [m.group("host")] * int(m.group("colon") or m.group("slots") or 1)
    if not slots:
        raise ValueError(f"the hostfile {path} names no host")
    return slots


def slurm_hosts(
    env: Mapping[str, str] | None = None, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> list[str]:
    """The nodes of the Slurm allocation this process runs in (``SLURM_JOB_NODELIST``,
    expanded by ``scontrol show hostnames``), one slot each."""
    env = os.environ if env is None else env
    nodelist = env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise ValueError(
            "hosts='slurm' needs a Slurm allocation (SLURM_JOB_NODELIST is not set): "
            "start JupyterLab or the run inside `salloc -N 4`"
        )
    try:
        done = run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    except FileNotFoundError as exc:
        raise ValueError("hosts='slurm': scontrol is not on PATH (is this a Slurm node?)") from exc
    names = done.stdout.split()
    if done.returncode != 0 or not names:
        raise ValueError(f"scontrol show hostnames {nodelist} failed: {done.stderr.strip() or 'no hosts'}")
    return names


def place(slots: Sequence[str], n: int) -> list[str]:
    """``n`` tasks on ``slots``, round-robin (PS first, then workers, for a TF cluster)."""
    return [slots[i % len(slots)] for i in range(n)]


def srun_command(host: str, cwd: str, cmd: Sequence[str]) -> list[str]:
    """One task on one node of the allocation: ``srun`` exports this environment
    (TF_CONFIG included) and stops the step when it is signalled."""
    return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap", f"--chdir={cwd}", *cmd]


def named_hosts(text: str, n: int) -> tuple[list[str], str] | None:
    """``"hostfile:PATH"`` -> (``n`` tasks placed on its slots, ``"ssh"``); ``"slurm"`` ->
    (placed on the allocation's nodes, ``"srun"``); any other string -> None."""
    kind, _, rest = text.strip().partition(":")
    if kind.lower() == "hostfile":
        if not rest:
            raise ValueError("hosts='hostfile:PATH' needs the hostfile's path after the colon")
        return place(read_hostfile(rest), n), "ssh"
    if kind.lower() == "slurm" and not rest:
        return place(slurm_hosts(), n), "srun"
    return None
