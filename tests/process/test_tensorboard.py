"""Lab 1's live TensorBoard: a free port, served, reused, stopped; gone with a SIGKILLed kernel."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest

from lab_utils.cluster.tensorboard import TensorBoard, tensorboard


def _servers_for(logdir) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "tensorboard.main" in cmd and str(logdir) in cmd:
            found.append(p)
    return found


def _gone(logdir, deadline_s: float = 20) -> bool:
    deadline = time.monotonic() + deadline_s
    while _servers_for(logdir) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the process table under a deadline
    return not _servers_for(logdir)


def test_serves_on_a_free_port_is_reused_and_stops(tmp_path):
    server = tensorboard(tmp_path)
    try:
        assert server.running and server.port and server.port != 6006
        with urllib.request.urlopen(server.url, timeout=30) as resp:
            assert resp.status == 200
        assert tensorboard(tmp_path) is server  # one server per folder and kernel
    finally:
        server.stop()
    assert not server.running and _gone(tmp_path)


def test_a_missing_folder_is_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="no log folder"):
        TensorBoard(tmp_path / "nope").start()


def test_the_server_dies_with_a_sigkilled_kernel(tmp_path):
    kernel = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from lab_utils.cluster.tensorboard import tensorboard; "
            f"print(tensorboard({str(tmp_path)!r}).port, flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        port = int(kernel.stdout.readline())
        assert port > 0 and _servers_for(tmp_path)
        os.kill(kernel.pid, signal.SIGKILL)  # no atexit, no cleanup: only the guard is left to act
        kernel.wait(timeout=10)
        assert _gone(tmp_path), "TensorBoard outlived its kernel"
    finally:
        if kernel.poll() is None:
            os.killpg(kernel.pid, signal.SIGKILL)
