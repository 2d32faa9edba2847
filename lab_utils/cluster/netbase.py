"""What every network of a job's hosts shares, below the ways of building one.

:mod:`.netem` builds emulated hosts from named network namespaces (``ip netns``) and picks
the way this process may build them (:func:`~lab_utils.cluster.netem.network`);
:mod:`.userns` builds the same network inside a user namespace that one process holds,
and a cluster's private network. Both take from here, and nothing here knows either:

- :class:`EmulatedHosts`, what a job asks for (:func:`~lab_utils.cluster.netem.emulated`
  makes one), and the units it is written in (:func:`rate_bits`, :func:`seconds`);
- the names of the namespaces (``labnet-<id>-hub``, ``labnet-<id>-h<i>``), the address
  pool and :func:`pick_subnet`, the links' qdiscs (:func:`shaping`);
- what this process may do (:func:`capabilities`, :func:`has_capability`, and
  :func:`userns_refusal`, why a user namespace is refused) and the one way of running
  ``ip`` / ``tc`` (:func:`run_command`, raising :class:`NetworkError`);
- :class:`BaseNetwork`, what a built network offers a job: its hosts, their addresses,
  the ssh stand-in that enters them, its notes and per-step bytes.

Notebooks and the training layer import these names from :mod:`lab_utils.cluster.netem`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: Every namespace a network creates is named ``labnet-<id>-hub`` or ``labnet-<id>-h<i>``.
PREFIX = "labnet-"
NAMESPACE_NAME = re.compile(r"^labnet-([0-9a-f]{8})-(hub|h\d+)$")
#: The private range emulated subnets are drawn from (one /24 per network).
POOL = ipaddress.ip_network("10.200.0.0/13")
RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)$", re.IGNORECASE)
_TIME = re.compile(r"^(\d+(?:\.\d+)?)\s*(us|ms|s)$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
COMMAND_TIMEOUT = 20.0


class NetworkError(RuntimeError):
    """An ``ip``/``tc`` command failed: the command and its stderr are in the message."""


def rate_bits(text: str) -> int:
    """``"100mbit"`` -> 100_000_000 bits per second (tc's units: bit, kbit, mbit, gbit)."""
    m = RATE.match(str(text).strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"bandwidth must look like '100mbit' or '1gbit' (bit, kbit, mbit, gbit), got {text!r}")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2).lower()])


def seconds(text: str, what: str) -> float:
    """``"0.5ms"`` -> 0.0005 (tc's units: us, ms, s)."""
    m = _TIME.match(str(text).strip())
    if not m:
        raise ValueError(f"{what} must look like '0.5ms' or '20us' (us, ms, s), got {text!r}")
    return float(m.group(1)) * _TIME_UNITS[m.group(2).lower()]


@dataclass(frozen=True)
class EmulatedHosts:
    """What :func:`emulated` asks for; the network is built when a job starts."""

    n: int | None = None
    bandwidth: str | None = "1gbit"
    latency: str | None = None
    jitter: str | None = None
    loss: float | None = None

    def __post_init__(self):
        if self.n is not None and (isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1):
            raise ValueError(
                f"the number of emulated hosts must be an integer >= 1 (or None: one per task), got {self.n!r}"
            )
        if self.bandwidth is not None:
            rate_bits(self.bandwidth)
        for label in ("latency", "jitter"):
            if getattr(self, label) is not None:
                seconds(getattr(self, label), label)
        if self.jitter is not None and self.latency is None:
            raise ValueError("jitter needs a latency (netem varies the delay around it)")
        if self.loss is not None and not (isinstance(self.loss, (int, float)) and 0 <= self.loss < 100):
            raise ValueError(f"loss is a percentage in [0, 100), got {self.loss!r}")

    def describe(self) -> str:
        parts = [f"{self.bandwidth or 'unshaped'} links"]
        if self.latency:
            parts.append(f"{self.latency} latency" + (f" ± {self.jitter}" if self.jitter else ""))
        if self.loss:
            parts.append(f"{self.loss:g} % loss")
        return ", ".join(parts)

    def __str__(self) -> str:
        return f"emulated({self.n or 'one per task'} hosts, {self.describe()})"


# ---- what this process may do, and the one way of running ip and tc
def run_command(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise NetworkError(f"`{' '.join(cmd)}` did not finish within {COMMAND_TIMEOUT:g} s") from exc
    if check and done.returncode != 0:
        raise NetworkError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done


CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21


def capabilities(status: str | None = None) -> int:
    """This process's effective capability set (``CapEff`` of /proc/self/status) as bits."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return 0
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)$", status, re.M)
    return int(m.group(1), 16) if m else 0


def has_capability(bit: int, caps: int | None = None) -> bool:
    return bool((capabilities() if caps is None else caps) >> bit & 1)


def userns_refusal(stderr: str = "", proc_sys: str | os.PathLike = "/proc/sys") -> str:
    """Why this machine refuses an unprivileged user namespace, and the setting that allows
    it (read from ``proc_sys``; ``stderr`` is unshare's own message)."""
    sysctl = Path(proc_sys)

    def value(name: str) -> str | None:
        try:
            return (sysctl / name).read_text().strip()
        except OSError:
            return None

    if value("user/max_user_namespaces") == "0":
        return "user namespaces are off here (user.max_user_namespaces = 0; `sysctl -w user.max_user_namespaces=15000` allows them)"
    if value("kernel/unprivileged_userns_clone") == "0":
        return "unprivileged user namespaces are off here (`sysctl -w kernel.unprivileged_userns_clone=1` allows them)"
    if value("kernel/apparmor_restrict_unprivileged_userns") == "1":
        return (
            "AppArmor restricts unprivileged user namespaces here (Ubuntu 23.10+: "
            "`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`, or an AppArmor profile with `userns,`)"
        )
    why = stderr.strip().splitlines()[-1] if stderr.strip() else "refused"
    return (
        f"this container may not create user namespaces ({why}; Docker's default seccomp profile "
        "refuses them: run with a profile that allows unshare(CLONE_NEWUSER), as Kubernetes' "
        "default Unconfined one does; see deploy/README.md)"
    )


# ---- addresses and shaping
def pick_subnet(used: Sequence[ipaddress.IPv4Network], draw=secrets.randbelow) -> ipaddress.IPv4Network:
    """A random /24 of :data:`POOL` that overlaps none of ``used``."""
    subnets = list(POOL.subnets(new_prefix=24))
    start = draw(len(subnets))
    for k in range(len(subnets)):
        cand = subnets[(start + k) % len(subnets)]
        if not any(cand.overlaps(u) for u in used):
            return cand
    raise NetworkError(f"no free /24 left in {POOL} for an emulated network")


def _tbf(rate: int) -> list[str]:
    burst = max(rate // 8 // 100, 64 * 1024)  # 10 ms of traffic, at least one GSO segment
    return ["tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", "100ms"]


NO_NETEM = "this kernel has no netem qdisc: latency, jitter and loss are not emulated (bandwidth is)"


def shaping(spec: EmulatedHosts) -> tuple[list[str] | None, list[str] | None]:
    """The qdisc for each end of a link: (``netem`` args where latency or loss is asked
    for, else None; ``tbf`` args for the bandwidth alone, else None)."""
    rate = rate_bits(spec.bandwidth) if spec.bandwidth else None
    netem_args = None
    if spec.latency is not None or spec.loss:
        netem_args = ["netem"]
        if spec.latency:
            netem_args += ["delay", spec.latency] + ([spec.jitter, "distribution", "normal"] if spec.jitter else [])
        if spec.loss:
            netem_args += ["loss", f"{spec.loss}%"]
        if rate:
            netem_args += ["rate", f"{rate}bit"]
    return netem_args, (_tbf(rate) if rate else None)


# ---- the byte counters of a network namespace
def parse_net_dev(lines: list[str]) -> dict[str, tuple[int, int]]:
    """``{interface: (bytes_recv, bytes_sent)}`` from /proc/<pid>/net/dev's data lines."""
    out = {}
    for line in lines:
        nic, _, rest = line.partition(":")
        fields = rest.split()
        if len(fields) >= 9:
            out[nic.strip()] = (int(fields[0]), int(fields[8]))
    return out


def loopback_of(pid: int, proc_root: str = "/proc") -> tuple[int, int] | None:
    """``(bytes_recv, bytes_sent)`` of ``lo`` in ``pid``'s network namespace (a cluster's
    private network), None when it cannot be read."""
    try:
        with open(f"{proc_root}/{pid}/net/dev", encoding="ascii") as fh:
            return parse_net_dev(fh.readlines()[2:]).get("lo")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


# ---- what a built network offers a job
class BaseNetwork:
    """A network of a job's hosts, however it is built (:class:`~lab_utils.cluster.netem.Network`:
    named namespaces; :class:`~lab_utils.cluster.userns.UserNetwork`: inside a user namespace;
    :class:`~lab_utils.cluster.userns.PrivateNetwork`: one host with only loopback). A job
    calls :meth:`build`, then :meth:`command` per task, :meth:`counters` or
    :meth:`mb_per_step`, and :meth:`destroy`; ``record`` (JSON-able) is what its state file
    keeps, for ``reap`` to remove what a dead kernel left."""

    kind: str  # "netns", "userns" or "private": how it was built, and how a record is removed
    #: whether tasks run as uid 0 of a user namespace (the student outside it): Open MPI's
    #: run-as-root switches apply there
    inside_uid0 = False

    def __init__(self, spec: EmulatedHosts, n_hosts: int, lock_dir: str | os.PathLike | None = None):
        self.spec, self.n_hosts = spec, n_hosts
        self.id = secrets.token_hex(4)
        self.hub = f"{PREFIX}{self.id}-hub"
        self.hosts = [f"{PREFIX}{self.id}-h{i}" for i in range(n_hosts)]
        # One lock for the whole machine (namespaces are): every user's networks draw from one pool.
        self.lock_path = Path(lock_dir or ("/run/lock" if os.access("/run/lock", os.W_OK) else "/tmp")) / "labnet.lock"
        self.subnet: ipaddress.IPv4Network | None = None
        self.notes: list[str] = []
        self.destroyed = False
        self.final_counters: dict[int, dict[str, int]] = {}

    @property
    def record(self) -> dict:
        return {"hub": self.hub, "hosts": self.hosts, "subnet": str(self.subnet) if self.subnet else None}

    def address(self, i: int) -> str:
        return str(self.subnet.network_address + 1 + i)

    def build(self) -> BaseNetwork:
        """Create the network; on any failure, remove what was created and raise :class:`NetworkError`."""
        raise NotImplementedError

    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on host ``i`` (the same process: the prefix execs it)."""
        raise NotImplementedError

    def counters(self) -> dict[int, dict[str, int]]:
        """Bytes each host has sent and received so far; after :meth:`destroy`, the last counts read."""
        raise NotImplementedError

    def destroy(self) -> list[str]:
        """Remove the network. Returns what could not be removed (held by a process that
        survived SIGKILL)."""
        raise NotImplementedError

    def write_ssh(self, folder: str | os.PathLike) -> Path:
        """Write ``folder/ssh``: a stand-in for ssh that runs ``ssh [options] HOST command``
        in HOST's namespace (HOST: an emulated address). mpirun takes it as its remote-shell
        agent, and horovodrun finds it first on PATH: their own multi-host machinery
        then starts ranks on the emulated hosts."""
        cases = "".join(f"  {self.address(i)}) {self._ssh_case(i)} ;;\n" for i in range(self.n_hosts))
        path = Path(folder) / "ssh"
        path.parent.mkdir(parents=True, exist_ok=True)
        text = _SSH.format(
            cases=cases, subnet=self.subnet, tmp=shlex.quote(tempfile.gettempdir()), enter=self._ssh_enter
        )
        path.write_text(text)
        path.chmod(0o755)
        return path

    def _ssh_case(self, i: int) -> str:
        """The ssh stand-in's shell assignments that name host ``i`` for :attr:`_ssh_enter`."""
        raise NotImplementedError

    #: the ssh stand-in's line that runs ``/bin/sh -c "$*"`` on the host its case named
    _ssh_enter: str

    def _no_netem(self) -> None:
        if NO_NETEM not in self.notes:
            self.notes.append(NO_NETEM)

    def mb_per_step(self, steps: int, counts: dict[int, dict[str, int]] | None = None) -> dict[int, float]:
        """Each host's MB (sent + received, 10^6 bytes) per step over ``steps`` steps, from
        ``counts`` (:meth:`counters`' figures, when the caller reads them for more) or read now."""
        counts = self.counters() if counts is None else counts
        return {i: (c["sent"] + c["received"]) / steps / 1e6 for i, c in counts.items()}

    def __repr__(self) -> str:
        return f"<Network {self.id}: {self.n_hosts} hosts on {self.subnet}, {self.spec.describe()}>"


def port_counters(raw: str) -> dict[int, dict[str, int]]:
    out = {}
    for entry in json.loads(raw or "[]"):
        name = entry.get("ifname", "")
        if re.fullmatch(r"v\d+", name):
            stats = entry.get("stats64", {})
            out[int(name[1:])] = {
                "sent": int(stats.get("rx", {}).get("bytes", 0)),
                "received": int(stats.get("tx", {}).get("bytes", 0)),
            }
    return out


_SSH = """#!/bin/sh
# ssh for emulated hosts (lab_utils.cluster.netem, subnet {subnet}):
# "ssh [options] [user@]HOST [options] [command...]" runs the command in HOST's network
# namespace (options, before or after HOST as OpenSSH allows, are ignored).
host=
while [ $# -gt 0 ]; do
  case "$1" in
    -o|-p|-i|-l|-F|-E|-J|-b|-c|-m) shift 2 ;;
    -*) shift ;;
    *) [ -n "$host" ] && break; host=${{1#*@}}; shift ;;
  esac
done
case "$host" in
{cases}  *) echo "ssh (emulated hosts): $host is not an emulated host of this network" >&2; exit 255 ;;
esac
[ $# -gt 0 ] || {{ echo "ssh (emulated hosts): no command for $host" >&2; exit 255; }}
# Each host its own temporary folder, as a real host has: Open MPI's daemons share this
# machine's hostname, and in one /tmp they raced on their session directory (1 job in 15).
mkdir -p -m 700 {tmp}/"$ns" && export TMPDIR={tmp}/"$ns" || exit 255
{enter}
"""


def host_tmp(name: str) -> Path:
    """An emulated host's own temporary folder (its processes' ``TMPDIR``), removed with it."""
    return Path(tempfile.gettempdir()) / name
