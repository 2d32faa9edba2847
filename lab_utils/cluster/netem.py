"""Emulated hosts: one network namespace per host, real links between them, on one machine.

On one machine every task talks over loopback, where the network costs nothing.
:func:`emulated` places a cluster's tasks on hosts that each have their own network stack::

    TFCluster(ps=1, workers=4, ..., hosts=emulated(bandwidth="100mbit"))

- a *hub* namespace holds a bridge (the switch); each host is a namespace with one
  ``eth0``, a veth whose other end is a port of that bridge;
- each host's link is shaped in both directions with ``tc`` (token bucket, ``tbf``:
  bandwidth; ``netem``: latency, jitter and loss, where the kernel has it);
- the addresses come from one private /24 (``10.200.0.0/13``), checked against this
  machine's own addresses and routes and against every other emulated network, under
  a lock; nothing is created in the machine's own namespace, so no traffic can leave;
- a task starts as ``ip netns exec <host> <command>`` (the same process: ``ip`` execs
  the command), so the process life cycle, guards and reaping are unchanged;
- the bytes each host sent and received are its bridge port's counters
  (:meth:`Network.counters`): real per-host network bytes.

Two ways to build it, chosen from what this process may do (its capabilities, never its
uid; :func:`how`):

- ``"netns"`` (CAP_NET_ADMIN and CAP_SYS_ADMIN: root, a privileged container): named
  namespaces (``ip netns add``). Namespaces, veths, the bridge and the qdiscs are
  resources: the job records them in its ``state.json`` before creating them, removes
  them on stop, and ``python -m lab_utils reap`` removes those of a dead kernel.
- ``"userns"`` (any user, where unprivileged user namespaces are allowed: a JupyterHub
  pod, Binder, a laptop): :class:`UserNetwork`. The same hub, bridge, veths and shaping
  inside a user namespace the job owns, held by one process
  (:mod:`lab_utils.cluster.usernet`); tasks join their host with ``nsenter``. Its
  namespaces vanish with their last process: when the job stops, or its kernel dies.

Where neither is possible, the same call runs on local hosts and says so in one line
naming the cause and the setting that allows it (:func:`unavailable_reason`); it never
fails half-built.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: Every namespace this module creates is named ``labnet-<id>-hub`` or ``labnet-<id>-h<i>``.
PREFIX = "labnet-"
_NAME = re.compile(r"^labnet-([0-9a-f]{8})-(hub|h\d+)$")
#: The private range emulated subnets are drawn from (one /24 per network).
POOL = ipaddress.ip_network("10.200.0.0/13")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)$", re.IGNORECASE)
_TIME = re.compile(r"^(\d+(?:\.\d+)?)\s*(us|ms|s)$", re.IGNORECASE)
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_TIMEOUT = 20.0


class NetworkError(RuntimeError):
    """An ``ip``/``tc`` command failed: the command and its stderr are in the message."""


def rate_bits(text: str) -> int:
    """``"100mbit"`` -> 100_000_000 bits per second (tc's units: bit, kbit, mbit, gbit)."""
    m = _RATE.match(str(text).strip())
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


def emulated(
    n: int | None = None,
    bandwidth: str | None = "1gbit",
    latency: str | None = None,
    jitter: str | None = None,
    loss: float | None = None,
) -> EmulatedHosts:
    """Hosts for a job: ``n`` network namespaces (None: one per task) joined by a switch,
    each link shaped to ``bandwidth`` each way (``None``: unshaped), with ``latency`` ±
    ``jitter`` and ``loss`` % where the kernel has ``netem``. Tasks are placed round-robin."""
    return EmulatedHosts(n, bandwidth, latency, jitter, loss)


def parse_hosts(text: str | None) -> EmulatedHosts | None:
    """A notebook parameter: ``"local"``/``""``/None -> None (local), ``"emulated"`` or
    ``"emulated:bandwidth=100mbit,latency=0.5ms,n=4"`` -> :class:`EmulatedHosts`. A bare
    rate is the bandwidth: ``"emulated:100mbit"`` (papermill reads a parameter line with
    one ``=`` only, so notebooks use this form)."""
    if text is None or str(text).strip().lower() in ("", "local", "localhost"):
        return None
    kind, _, opts = str(text).strip().partition(":")
    if kind.lower() != "emulated":
        raise ValueError(
            "hosts must be 'local', 'emulated[:100mbit]', 'emulated[:bandwidth=100mbit,latency=0.5ms,...]', 'hostfile:PATH', "
            f"'slurm' or a list of host names, got {text!r}"
        )
    kwargs: dict = {}
    for item in filter(None, (o.strip() for o in opts.split(","))):
        key, eq, value = item.partition("=")
        if not eq and _RATE.match(item):
            key, eq, value = "bandwidth", "=", item
        if not eq or key not in ("n", "bandwidth", "latency", "jitter", "loss"):
            raise ValueError(
                f"unknown emulated-hosts option {item!r} (n, bandwidth, latency, jitter, loss) in {text!r}"
            )
        kwargs[key] = int(value) if key == "n" else float(value) if key == "loss" else value
        if key == "bandwidth" and value.lower() in ("none", "unshaped"):
            kwargs[key] = None
    return EmulatedHosts(**kwargs)


def as_spec(hosts: str | EmulatedHosts | None) -> EmulatedHosts | None:
    """An :class:`EmulatedHosts` as given, or parsed from its string (:func:`parse_hosts`)."""
    return parse_hosts(hosts) if isinstance(hosts, str) else hosts


def host_per_rank(hosts: str | EmulatedHosts | None) -> EmulatedHosts | None:
    """:func:`as_spec` for a job that puts each rank on a host of its own (``n`` must be unset)."""
    spec = as_spec(hosts)
    if spec is not None and spec.n is not None:
        raise ValueError(f"hosts: one emulated host per rank here, leave n unset (got {spec})")
    return spec


def not_emulated(reason: str) -> str:
    """The one line a job (or an experiment) prints when it falls back to local hosts."""
    return (
        f"hosts are not emulated ({reason}): every task runs on this machine and talks over "
        "loopback, where the network costs nothing"
    )


def spec_or_local(hosts: str | EmulatedHosts | None) -> EmulatedHosts | None:
    """For an experiment of many runs: the emulated-hosts spec of ``hosts``, or None (local
    hosts) with the one fallback line printed here, once, where they cannot be built."""
    spec = as_spec(hosts)
    if spec is not None and unavailable_reason() is not None:
        print(not_emulated(unavailable_reason()), flush=True)
        return None
    return spec


# ---- what this machine allows
def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise NetworkError(f"`{' '.join(cmd)}` did not finish within {_TIMEOUT:g} s") from exc
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


#: The probe a user namespace must pass: a bridge, a veth pair, and tbf on it.
_USERNS_PROBE = (
    "ip link add b0 type bridge && ip link add p0 type veth peer name p1 && "
    "tc qdisc add dev p0 root tbf rate 100mbit burst 65536 latency 100ms"
)


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


@lru_cache(maxsize=1)
def _how() -> tuple[str | None, str | None]:
    if not os.uname().sysname == "Linux":
        return None, "network namespaces are Linux only"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return None, f"`{tool}` (iproute2) is not installed"
    caps = capabilities()
    root_reason = "creating named network namespaces needs CAP_NET_ADMIN and CAP_SYS_ADMIN"
    if has_capability(CAP_NET_ADMIN, caps) and has_capability(CAP_SYS_ADMIN, caps):
        probe = f"{PREFIX}{secrets.token_hex(4)}-hub"
        try:
            _run(["ip", "netns", "add", probe])
        except NetworkError as exc:
            root_reason = f"`ip netns add` is not allowed here ({exc})"
        else:
            _delete_named(probe)
            return "netns", None
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return None, f"{root_reason}, and `{tool}` (util-linux) is not installed for a user namespace"
    try:
        done = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--net", "sh", "-c", _USERNS_PROBE],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None, f"a user namespace probe did not finish within {_TIMEOUT:g} s"
    if done.returncode == 0:
        return "userns", None
    if "unshare" in done.stderr:
        return None, userns_refusal(done.stderr)
    return None, f"a user namespace allows no bridge, veth or tbf here ({done.stderr.strip()})"


def _delete_named(name: str, tries: int = 5) -> bool:
    """``ip netns del name``, again while it is still listed (measured: with four processes
    probing at once, one delete in a few hundred failed and left the probe behind)."""
    for _ in range(tries):
        _run(["ip", "netns", "del", name], check=False)
        if name not in namespaces():
            return True
    return False


def how() -> str | None:
    """``"netns"`` (named namespaces: CAP_NET_ADMIN and CAP_SYS_ADMIN), ``"userns"`` (inside
    a user namespace of the job's own: any user, where the kernel allows them) or None."""
    return _how()[0]


def unavailable_reason() -> str | None:
    """None when this process can build emulated hosts (either way), else why not: one
    phrase that names the cause and, for a refused user namespace, the setting."""
    return _how()[1]


@lru_cache(maxsize=1)
def has_netem() -> bool:
    """Whether the kernel offers the ``netem`` qdisc (latency, jitter, loss); probed once
    on a veth pair in a throw-away namespace."""
    ns = f"{PREFIX}{secrets.token_hex(4)}-hub"
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        return (
            _run(["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"], check=False).returncode
            == 0
        )
    except NetworkError:
        return False
    finally:
        _delete_named(ns)


def namespaces() -> list[str]:
    """Every network namespace this module's naming scheme matches (any owner)."""
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if _NAME.match(n)]


# ---- addresses
def _used_networks() -> list[ipaddress.IPv4Network]:
    """This machine's own IPv4 addresses and routes, and every emulated network's subnet."""
    used = []
    for ns in [None, *(n for n in namespaces() if not n.endswith("-hub"))]:
        prefix = ["-n", ns] if ns else []
        for what in ("addr", "route"):
            raw = _run(["ip", "-j", *prefix, "-4", what, "show"], check=False).stdout or "[]"
            for entry in json.loads(raw):
                if what == "addr":
                    for a in entry.get("addr_info", []):
                        used.append(ipaddress.ip_network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False))
                elif entry.get("dst") and entry["dst"] != "default":
                    used.append(ipaddress.ip_network(entry["dst"], strict=False))
    return used


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


class Network:
    """A built emulated network of named namespaces (``ip netns``; :func:`how` ``"netns"``).
    ``record`` (JSON-able) is what a state file keeps. :func:`network` picks this class or
    :class:`UserNetwork`."""

    kind = "netns"
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

    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on emulated host ``i``: ``ip netns exec`` execs it (same pid)."""
        return ["ip", "netns", "exec", self.hosts[i], *cmd]

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
        return f"ns={self.hosts[i]}"

    #: the ssh stand-in's line that runs ``/bin/sh -c "$*"`` in host ``$ns``
    _ssh_enter = 'exec ip netns exec "$ns" /bin/sh -c "$*"'

    def build(self) -> Network:
        """Create the hub, the hosts, their links and shaping; on any failure, remove
        what was created and raise :class:`NetworkError`."""
        try:
            with open(self.lock_path, "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self.subnet = pick_subnet(_used_networks())
                self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def _create(self) -> None:
        ip = lambda *a: _run(["ip", *a])  # noqa: E731
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            ip("netns", "add", ns)
            ip("-n", self.hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", self.hub, "link", "set", f"v{i}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.address(i)}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            self._shape(ns, "eth0")  # what the host sends
            self._shape(self.hub, f"v{i}")  # what it receives

    def _shape(self, ns: str, dev: str) -> None:
        netem_args, tbf_args = shaping(self.spec)
        if netem_args and has_netem():
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *netem_args])
            return
        if netem_args:
            self._no_netem()
        if tbf_args:
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *tbf_args])

    def _no_netem(self) -> None:
        if NO_NETEM not in self.notes:
            self.notes.append(NO_NETEM)

    def counters(self) -> dict[int, dict[str, int]]:
        """Bytes each host has sent and received so far (its bridge port's counters,
        seen from the switch: what the port receives, the host sent). After
        :meth:`destroy`, the last counts it read."""
        if self.destroyed:
            return self.final_counters
        raw = _run(["ip", "-n", self.hub, "-s", "-j", "link", "show"]).stdout
        return _port_counters(raw)

    def mb_per_step(self, steps: int) -> dict[int, float]:
        """Each host's MB (sent + received, 10^6 bytes) per step over ``steps`` steps."""
        return {i: (c["sent"] + c["received"]) / steps / 1e6 for i, c in self.counters().items()}

    def destroy(self) -> list[str]:
        """Remove every namespace (the veths and qdiscs go with them). Returns what could
        not be removed (a namespace still held by a process that survived SIGKILL)."""
        if self.destroyed:
            return []
        if self.subnet is not None:
            try:
                self.final_counters = self.counters()
            except NetworkError:  # half-built: no hub yet
                pass
        self.destroyed = True
        return remove(self.record)

    def __repr__(self) -> str:
        return f"<Network {self.id}: {self.n_hosts} hosts on {self.subnet}, {self.spec.describe()}>"


def _port_counters(raw: str) -> dict[int, dict[str, int]]:
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


def network(spec: EmulatedHosts, n_hosts: int) -> Network:
    """An unbuilt network of ``n_hosts`` hosts, the way this process may build one
    (:func:`how`); raises :class:`NetworkError` with the reason where it may not."""
    kind = how()
    if kind == "netns":
        return Network(spec, n_hosts)
    if kind == "userns":
        from lab_utils.cluster.userns import UserNetwork

        return UserNetwork(spec, n_hosts)
    raise NetworkError(f"no emulated hosts here: {unavailable_reason()}")


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


def remove(record: dict) -> list[str]:
    """Delete the namespaces a state file records (hosts first, then the hub); missing
    ones are fine. Returns those still present afterwards."""
    if record.get("kind") in ("userns", "private"):
        from lab_utils.cluster.userns import remove_held

        return remove_held(record)
    names = [*record.get("hosts", []), record.get("hub")]
    names = [n for n in names if n and _NAME.match(n)]
    if not names:
        return []
    present = set(namespaces())
    for name in names:
        if name in present:
            _delete_named(name)
        if host_tmp(name).is_dir():  # what a host's processes left there
            shutil.rmtree(host_tmp(name))
    left = set(namespaces())
    return [n for n in names if n in left]
