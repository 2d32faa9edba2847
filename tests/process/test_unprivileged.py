"""Emulated hosts as the students run them: a real unprivileged user (root's CI drops to
``nobody``; tests/support/unprivileged.py), no capability, no sudo.

That user builds emulated hosts and each cluster's private network in a user namespace of
the job's own (``netem.how() == "userns"``), and the tests of tests/process/test_emulated.py
(shaped links, TF and MPI clusters on them, 20 in a row, 4 at once, a SIGKILLed kernel,
reap) and tests/process/test_private_network.py (nothing of a local TF cluster, MPI or
Horovod job listens in the machine's namespace; a killed kernel leaves nothing) run again as
that user, none skipped, leaving nothing of that user's running."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from pathlib import Path

import psutil
import pytest
from support import unprivileged
from support.procs import alive as procs_alive
from support.procs import kill_listed

REPO = Path(__file__).resolve().parents[2]
# (Lab 4 Part D's figures as a student are bench_network's, run as nobody: see the README)
AGAIN = ["tests/process/test_emulated.py", "tests/process/test_private_network.py"]


def _left(user: unprivileged.Unprivileged) -> list[str]:
    """That user's processes still alive (a bounded wait: the last ones may be ending)."""
    deadline = time.monotonic() + 15
    while True:
        left = []
        for p in psutil.process_iter(["pid", "uids", "cmdline"]):
            if p.info["uids"] and p.info["uids"].real == user.uid and procs_alive(p):
                left.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:160]}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)  # polling the process table under a deadline


def test_the_user_builds_emulated_hosts_in_a_user_namespace(user):
    code = "from lab_utils.cluster import netem; print(netem.how()); print(netem.unavailable_reason())"
    out = user.run([user.python, "-c", code], timeout=60)
    assert out.returncode == 0, out.stderr
    how, reason = out.stdout.splitlines()
    if how == "None" and "sysctl" in reason:  # a kernel set to refuse them: the one line says which setting
        pytest.skip(f"as {user.user}: {reason}")
    assert (how, reason) == ("userns", "None"), out.stdout


@pytest.mark.timeout(900)  # about 2 minutes on 2 cores: a hang guard with room for a machine 2.5x slower
def test_emulated_hosts_tests_pass_as_that_user_none_skipped(user):
    junit = user.home / "junit.xml"
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={user.home / 'pytest'}"]
    out = user.run([user.python, *args, f"--junitxml={junit}", *AGAIN], timeout=850, cwd=REPO)
    try:
        assert out.returncode == 0, out.stdout[-5000:] + out.stderr[-2000:]
        cases = list(ET.parse(junit).getroot().iter("testcase"))
        skipped = [c.get("name") for c in cases if c.find("skipped") is not None]
        assert len(cases) >= 20 and skipped == [], (len(cases), skipped)
    finally:
        left = _left(user)
        kill_listed(left)
    assert left == [], f"left running as {user.user}: {left}"


def test_another_user_cannot_reach_a_student_s_cluster(user):
    """The student's PS and workers (a cluster left running by its kernel) are in their
    private network: this process, another user (root, who sees every socket of the
    machine's namespace), finds none of their ports listening and cannot connect to them."""
    import json
    import socket
    import subprocess

    kernel = subprocess.Popen(
        [*user.prefix, user.python, str(REPO / "tests" / "fixtures" / "cluster_kernel.py"), "--args",
         json.dumps({"steps": 10**6, "step-time": 0.05})],
        stdout=subprocess.PIPE, text=True, env=user.env(LABS_RUN_ROOT=str(user.home / "runs")), cwd=user.home,
    )  # fmt: skip
    try:
        info = json.loads(kernel.stdout.readline())
        assert info["network"]["kind"] == "private", info
        ports = set(info["ports"].values())
        listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
        shown = {int(line.split()[3].rsplit(":", 1)[1]) for line in listening.splitlines() if line.strip()}
        refused = []
        for port in sorted(ports):
            with socket.socket() as s:
                s.settimeout(5)
                refused.append(s.connect_ex(("127.0.0.1", port)) != 0)
    finally:
        kernel.kill()  # the guards stop its tasks; the network ends with the kernel's pipe
        kernel.wait()
    assert len(ports) == 3 and not ports & shown, (ports, sorted(shown))
    assert all(refused), refused
    assert _left(user) == []


def test_a_copy_of_this_interpreter_runs_as_that_user_where_its_own_home_is_closed():
    """Where no Python of this version is reachable by other users (pyenv's 3.12 under root's
    700 home: the default stack on CI), the tests' user runs a copy: its standard library linked,
    its interpreter's RUNPATH pointed at its own lib/ (ssl, sqlite3, ctypes: the C modules load)."""
    import os
    import pwd
    import shutil
    import subprocess
    import sys
    import tempfile

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the copy as another user")
    pw = pwd.getpwnam(unprivileged.USER)
    base = Path(tempfile.mkdtemp(prefix="labs-python-copy-"))
    try:
        base.chmod(0o755)
        python = unprivileged.reachable_copy(base / "python")
        assert python is not None, sys.base_prefix
        assert unprivileged.point_runpath_at_origin(Path(python)) in (None, "$ORIGIN/../lib")  # rewritten already
        as_user = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups"]
        code = "import sys, ssl, sqlite3, ctypes, json, venv; print(sys.version_info[:2] == {!r}, sys.prefix)"
        out = subprocess.run(
            [*as_user, python, "-I", "-c", code.format(tuple(sys.version_info[:2]))],
            capture_output=True, text=True, timeout=60, cwd="/",
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", str(base / "python")], out.stdout
        with pytest.raises(ValueError, match="not a 64-bit"):
            unprivileged.point_runpath_at_origin(Path(__file__))
    finally:
        shutil.rmtree(base)
