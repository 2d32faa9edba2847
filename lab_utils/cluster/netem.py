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
  (:meth:`Network.counters`): real per-host network bytes, and only the tasks' own (the
  links are silent: no IPv6 address to announce, no multicast snooping on the bridge).

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

What both ways share (:class:`EmulatedHosts`, the namespaces' names, subnets, shaping,
capabilities, the :class:`~lab_utils.cluster.netbase.BaseNetwork` a job holds) lives in
:mod:`lab_utils.cluster.netbase`, below both; its public names are importable from here.
"""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence
from functools import lru_cache

from lab_utils.cluster.netbase import (
    CAP_NET_ADMIN,
    CAP_SYS_ADMIN,
    COMMAND_TIMEOUT,
    NAMESPACE_NAME,
    NO_NETEM,
    POOL,
    PREFIX,
    RATE,
    BaseNetwork,
    EmulatedHosts,
    NetworkError,
    capabilities,
    has_capability,
    host_tmp,
    pick_subnet,
    port_counters,
    rate_bits,
    run_command,
    seconds,
    shaping,
    userns_refusal,
)
from lab_utils.cluster.userns import UserNetwork, remove_held

__all__ = [  # what the labs, the training layer and the tests take from here; the rest is netbase's
    "EmulatedHosts",
    "NetworkError",
    "Network",
    "BaseNetwork",
    "emulated",
    "parse_hosts",
    "as_spec",
    "host_per_rank",
    "not_emulated",
    "spec_or_local",
    "how",
    "unavailable_reason",
    "has_netem",
    "namespaces",
    "network",
    "remove",
    "host_tmp",
    "rate_bits",
    "seconds",
    "shaping",
    "pick_subnet",
    "capabilities",
    "has_capability",
    "userns_refusal",
    "CAP_NET_ADMIN",
    "CAP_SYS_ADMIN",
    "NO_NETEM",
    "POOL",
    "PREFIX",
]


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
        if not eq and RATE.match(item):
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
#: The probe a user namespace must pass: a bridge, a veth pair, and tbf on it.
_USERNS_PROBE = (
    "ip link add b0 type bridge && ip link add p0 type veth peer name p1 && "
    "tc qdisc add dev p0 root tbf rate 100mbit burst 65536 latency 100ms"
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
            run_command(["ip", "netns", "add", probe])
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
            timeout=COMMAND_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return None, f"a user namespace probe did not finish within {COMMAND_TIMEOUT:g} s"
    if done.returncode == 0:
        return "userns", None
    if "unshare" in done.stderr:
        return None, userns_refusal(done.stderr)
    return None, f"a user namespace allows no bridge, veth or tbf here ({done.stderr.strip()})"


def _delete_named(name: str, tries: int = 5) -> bool:
    """``ip netns del name``, again while it is still listed (measured: with four processes
    probing at once, one delete in a few hundred failed and left the probe behind)."""
    for _ in range(tries):
        run_command(["ip", "netns", "del", name], check=False)
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
        run_command(["ip", "netns", "add", ns])
        run_command(["ip", "-n", ns, "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        return (
            run_command(
                ["tc", "-n", ns, "qdisc", "add", "dev", "p0", "root", "netem", "delay", "1ms"], check=False
            ).returncode
            == 0
        )
    except NetworkError:
        return False
    finally:
        _delete_named(ns)


def namespaces() -> list[str]:
    """Every network namespace this module's naming scheme matches (any owner)."""
    out = run_command(["ip", "netns", "list"], check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if NAMESPACE_NAME.match(n)]


# ---- addresses
def _used_networks() -> list[ipaddress.IPv4Network]:
    """This machine's own IPv4 addresses and routes, and every emulated network's subnet."""
    used = []
    for ns in [None, *(n for n in namespaces() if not n.endswith("-hub"))]:
        prefix = ["-n", ns] if ns else []
        for what in ("addr", "route"):
            raw = run_command(["ip", "-j", *prefix, "-4", what, "show"], check=False).stdout or "[]"
            for entry in json.loads(raw):
                if what == "addr":
                    for a in entry.get("addr_info", []):
                        used.append(ipaddress.ip_network(f"{a['local']}/{a.get('prefixlen', 32)}", strict=False))
                elif entry.get("dst") and entry["dst"] != "default":
                    used.append(ipaddress.ip_network(entry["dst"], strict=False))
    return used


class Network(BaseNetwork):
    """A built emulated network of named namespaces (``ip netns``; :func:`how` ``"netns"``).
    ``record`` (JSON-able) is what a state file keeps. :func:`network` picks this class or
    :class:`~lab_utils.cluster.userns.UserNetwork`."""

    kind = "netns"

    def command(self, i: int, cmd: Sequence[str]) -> list[str]:
        """``cmd`` run on emulated host ``i``: ``ip netns exec`` execs it (same pid)."""
        return ["ip", "netns", "exec", self.hosts[i], *cmd]

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
        ip = lambda *a: run_command(["ip", *a])  # noqa: E731
        # Silent links: a link-local IPv6 address (DAD, router solicitation, MLD reports) and
        # the bridge's multicast snooping (IGMP) would send a few hundred bytes over the
        # first seconds, counted as the tasks' traffic and arriving while they are read.
        # The tasks speak IPv4; loopback keeps ::1.
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
        ip("-n", self.hub, "link", "set", "br0", "addrgenmode", "none")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i, ns in enumerate(self.hosts):
            ip("netns", "add", ns)
            ip("-n", self.hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", self.hub, "link", "set", f"v{i}", "master", "br0", "addrgenmode", "none", "up")
            ip("-n", ns, "addr", "add", f"{self.address(i)}/{self.subnet.prefixlen}", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "addrgenmode", "none", "up")
            ip("-n", ns, "link", "set", "lo", "up")
            self._shape(ns, "eth0")  # what the host sends
            self._shape(self.hub, f"v{i}")  # what it receives

    def _shape(self, ns: str, dev: str) -> None:
        netem_args, tbf_args = shaping(self.spec)
        if netem_args and has_netem():
            run_command(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *netem_args])
            return
        if netem_args:
            self._no_netem()
        if tbf_args:
            run_command(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *tbf_args])

    def counters(self) -> dict[int, dict[str, int]]:
        """Bytes each host has sent and received so far (its bridge port's counters,
        seen from the switch: what the port receives, the host sent). After
        :meth:`destroy`, the last counts it read."""
        if self.destroyed:
            return self.final_counters
        raw = run_command(["ip", "-n", self.hub, "-s", "-j", "link", "show"]).stdout
        return port_counters(raw)

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


def network(spec: EmulatedHosts, n_hosts: int) -> BaseNetwork:
    """An unbuilt network of ``n_hosts`` hosts, the way this process may build one
    (:func:`how`); raises :class:`NetworkError` with the reason where it may not."""
    kind = how()
    if kind == "netns":
        return Network(spec, n_hosts)
    if kind == "userns":
        return UserNetwork(spec, n_hosts)
    raise NetworkError(f"no emulated hosts here: {unavailable_reason()}")


def remove(record: dict) -> list[str]:
    """Delete the namespaces a state file records (hosts first, then the hub); missing
    ones are fine. Returns those still present afterwards."""
    if record.get("kind") in ("userns", "private"):
        return remove_held(record)
    names = [*record.get("hosts", []), record.get("hub")]
    names = [n for n in names if n and NAMESPACE_NAME.match(n)]
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
