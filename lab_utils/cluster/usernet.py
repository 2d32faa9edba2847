"""The holder of an emulated network built without root (:class:`~lab_utils.cluster.userns.UserNetwork`).

    unshare --user --map-root-user --net python -m lab_utils.cluster.usernet SPEC_JSON

Started by the job in a new user namespace (it is uid 0 there, and the student outside)
and a new network namespace: the *hub*. It builds what the root path builds with
``ip netns``: a bridge ``br0`` here, and for each host a network namespace held by a
``cat`` of its own (``unshare --net``), joined to the bridge by a veth (``eth0`` inside,
``v<i>`` on the bridge), addressed and shaped in both directions with ``tc``.

It prints one JSON line, ``{"hosts": [pid, ...], "no_netem": bool}`` (a process inside
each host's namespace, for ``nsenter``), then waits for its standard input to close. The
job holds the other end: when the job stops, or its kernel dies even by SIGKILL, the pipe
closes, this process closes each ``cat``'s input, reaps it and ends, and the namespaces
vanish with their last process. Nothing is created outside the namespaces, nothing to clean.

SPEC_JSON: ``{"addresses": ["10.x.y.1/24", ...], "netem": [tc args] | null,
"tbf": [tc args] | null}``: ``netem`` is tried first where given (latency, loss), ``tbf``
where netem is missing or not asked for. A failure prints the command and its error on
stderr and exits 1.
"""

from __future__ import annotations

import json
import subprocess
import sys

from lab_utils import _guard

_TIMEOUT = 20.0


def _run(*cmd: str, check: bool = True) -> bool:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"`{' '.join(cmd)}` did not finish within {_TIMEOUT:g} s") from None
    if check and done.returncode != 0:
        raise SystemExit(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.returncode == 0


def _host() -> subprocess.Popen:
    """A new network namespace, held by a process that ends when this one's pipe closes."""
    proc = subprocess.Popen(
        ["unshare", "--net", "sh", "-c", "echo ready; exec cat >/dev/null"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if proc.stdout.readline().strip() != "ready":
        proc.wait(timeout=_TIMEOUT)
        raise SystemExit(f"`unshare --net` failed (exit {proc.returncode}): {proc.stderr.read().strip()}")
    return proc


def _shape(enter: list[str], dev: str, spec: dict) -> bool:
    """Shape ``dev`` (in the namespace ``enter`` leads to); False when netem was asked for
    and the kernel lacks it (tbf then shapes the bandwidth alone)."""
    if spec.get("netem") and _run(*enter, "tc", "qdisc", "add", "dev", dev, "root", *spec["netem"], check=False):
        return True
    if spec.get("tbf"):
        _run(*enter, "tc", "qdisc", "add", "dev", dev, "root", *spec["tbf"])
    return not spec.get("netem")


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    hosts: list[subprocess.Popen] = []
    netem_ok = True
    _run("ip", "link", "set", "lo", "up")
    # silent links (see netem.Network._create): no IPv6 addresses, no multicast snooping
    _run("ip", "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
    _run("ip", "link", "set", "br0", "addrgenmode", "none")
    _run("ip", "link", "set", "br0", "up")
    for i, address in enumerate(spec["addresses"]):
        proc = _host()
        hosts.append(proc)
        enter = ["nsenter", "--target", str(proc.pid), "--net"]
        _run("ip", "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", str(proc.pid))
        _run("ip", "link", "set", f"v{i}", "master", "br0", "addrgenmode", "none", "up")
        _run(*enter, "ip", "addr", "add", address, "dev", "eth0")
        _run(*enter, "ip", "link", "set", "eth0", "addrgenmode", "none", "up")
        _run(*enter, "ip", "link", "set", "lo", "up")
        netem_ok &= _shape(enter, "eth0", spec)  # what the host sends
        netem_ok &= _shape([], f"v{i}", spec)  # what it receives
    print(json.dumps({"hosts": [p.pid for p in hosts], "no_netem": not netem_ok}), flush=True)
    sys.stdin.buffer.read()  # until the job closes the pipe (or dies)
    # End the hosts' processes and reap them here: left to end at this process's exit, they
    # would be reparented to the machine's init, whose reaping may lag (1.6 s here) or never
    # come (a notebook server as a container's pid 1), and the job waits for them to be gone.
    for proc in hosts:
        proc.stdin.close()
    for proc in hosts:
        try:
            proc.wait(timeout=_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for folder in spec.get("tmp", []):  # the hosts' TMPDIRs: a SIGKILLed kernel removes nothing
        _guard.remove(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
