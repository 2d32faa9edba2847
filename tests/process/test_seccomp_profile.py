"""The student pods' seccomp profile (deploy/jupyterhub/seccomp/labs-userns.json), loaded into
the kernel by its own runner with libseccomp, on a real unprivileged user: a student's emulated
network starts under it (two hosts in user and network namespaces, bytes across the link), the
calls it refuses are refused (eBPF, the new mount API, kernel keyrings, netfilter netlink
sockets), and without the namespace calls it adds the network cannot start (what a runtime's
default profile does to the lessons)."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "deploy" / "jupyterhub" / "seccomp" / "labs_seccomp.py"
PROFILE = TOOL.with_name("labs-userns.json")

pytestmark = pytest.mark.skipif(
    not __import__("ctypes.util").util.find_library("seccomp"),
    reason="libseccomp is not installed (Debian's libseccomp2): the profile cannot be loaded here",
)
_spec = importlib.util.spec_from_file_location("labs_seccomp", TOOL)
seccomp_profile = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seccomp_profile)

NETWORK = textwrap.dedent(
    """
    import subprocess, sys
    from lab_utils.cluster import netem
    print("HOW", netem.how(), netem.unavailable_reason())
    net = netem.network(netem.emulated(bandwidth="100mbit"), 2).build()
    try:
        sink = "import socket; s = socket.socket(); s.bind(('{a}', 5001)); s.listen(); print('up', flush=True); c, _ = s.accept(); print(len(c.recv(100)))"
        server = subprocess.Popen(net.command(1, [sys.executable, "-c", sink.format(a=net.address(1))]), stdout=subprocess.PIPE, text=True)
        assert server.stdout.readline().strip() == "up"
        send = "import socket; socket.create_connection(('{a}', 5001), timeout=30).sendall(b'x' * 42)"
        subprocess.run(net.command(0, [sys.executable, "-c", send.format(a=net.address(1))]), check=True, timeout=60)
        print("RECEIVED", server.communicate(timeout=60)[0].strip())
    finally:
        print("LEFT", net.destroy())
    """
)
REFUSED = textwrap.dedent(
    """
    import ctypes, socket
    libc = ctypes.CDLL(None, use_errno=True)
    def call(number, *args):
        ctypes.set_errno(0)
        return libc.syscall(number, *args), ctypes.get_errno()
    print("bpf", *call(321, 0, 0, 0))                # x86-64 numbers
    print("fsopen", *call(430, b"tmpfs", 0))
    print("keyctl", *call(250, 0, 0, 0, 0, 0))
    for proto, name in ((12, "netfilter"), (0, "route")):
        try:
            socket.socket(16, socket.SOCK_RAW, proto).close()
            print(name, "opened")
        except OSError as exc:
            print(name, "refused", exc.errno)
    """
)


def _under(user, profile: Path, argv: list[str], timeout: float = 300):
    return user.run([user.python, str(TOOL), "run", str(profile), "--", *argv], timeout=timeout, cwd=REPO)


def test_the_committed_profile_is_what_the_tool_writes_here():
    committed = json.loads(PROFILE.read_text())
    assert committed == seccomp_profile.build(seccomp_profile.known_syscalls()), (
        "run: python deploy/jupyterhub/seccomp/labs_seccomp.py write deploy/jupyterhub/seccomp/labs-userns.json"
    )
    allowed = set(committed["syscalls"][0]["names"])
    assert {"unshare", "setns", "clone", "clone3", "read", "execve", "process_vm_readv"} <= allowed
    assert not allowed & set(seccomp_profile.DENIED) and "socket" not in allowed  # socket: by its arguments


def test_a_students_network_starts_under_the_profile_and_calls_outside_it_are_refused(user):
    if sys.platform != "linux" or __import__("platform").machine() != "x86_64":
        pytest.skip("the refused calls are probed by their x86-64 numbers")
    out = _under(user, PROFILE, [user.python, "-c", NETWORK])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    if lines.get("HOW", "").startswith("None") and "sysctl" in lines["HOW"]:
        pytest.skip(f"this kernel refuses user namespaces to {user.user}: {lines['HOW']}")
    assert lines["HOW"] == "userns None" and lines["RECEIVED"] == "42" and lines["LEFT"] == "[]", out.stdout
    out = _under(user, PROFILE, [user.python, "-c", REFUSED], timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:5] == [
        "bpf -1 1",
        "fsopen -1 1",
        "keyctl -1 1",
        "netfilter refused 1",
        "route opened",
    ]


def test_without_the_namespace_calls_the_network_cannot_start(user):
    """What Docker's and containerd's defaults do to the lessons: the same profile less
    ``unshare`` refuses a new user namespace (so the test above can fail)."""
    strict = json.loads(PROFILE.read_text())
    strict["syscalls"][0]["names"].remove("unshare")
    path = user.home / "no-unshare.json"  # where that user can read it
    path.write_text(json.dumps(strict))
    path.chmod(0o644)
    out = _under(user, path, ["unshare", "--user", "--map-root-user", "--net", "true"], timeout=60)
    assert out.returncode != 0 and "Operation not permitted" in out.stderr, (out.returncode, out.stderr)
    ok = _under(user, PROFILE, ["unshare", "--user", "--map-root-user", "--net", "true"], timeout=60)
    assert ok.returncode == 0, ok.stderr
