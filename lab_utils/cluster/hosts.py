"""How a command starts on a host: which hosts are this machine, free ports, ssh.

Today every lab runs on this machine (``is_local``). A task on another host is
started through ``ssh`` (:func:`ssh_command`); the multi-host issue adds
emulated hosts (network namespaces) and real nodes (MPI, Slurm) here, beside
the local case, without touching the process life cycle.
"""

from __future__ import annotations

import secrets
import shlex
import socket
from collections.abc import Mapping, Sequence

#: Launchers that start a whole MPI/Horovod job as one process (ranks are its children).
LAUNCHERS = ("mpirun", "horovodrun")
_LOCAL_NAMES = ("", "localhost", "127.0.0.1", "::1")


def is_local(host: str | None) -> bool:
    """True for None, "", localhost, 127.0.0.1, ::1 and this machine's hostname."""
    return host is None or host in _LOCAL_NAMES or host == socket.gethostname()


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
