"""The Hub's services stop when the Hub stops them, however the Hub was started: a Hub started
as a shell's background job starts its services with SIGINT (its stop signal) ignored. And the
grading service stops a grading under way rather than leave it running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lab_utils.hub import grader

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(argv: list[str], env: dict) -> subprocess.Popen:
    """``argv`` as a background job's child: SIGINT ignored, as ``jupyterhub &`` leaves it."""
    return subprocess.Popen(
        [sys.executable, *argv],
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )


def _serving(proc: subprocess.Popen, ready: str) -> list[str]:
    """Its log up to the line that says it is ready (``ready`` in it)."""
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if ready in line:
            return lines
    raise AssertionError(f"it ended before it served (exit {proc.wait()}):\n{''.join(lines)}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("which", ["handin", "grader", "culler"])
def test_a_service_started_with_sigint_ignored_stops_on_the_hubs_signal(which, sig, tmp_path):
    port = _free_port()
    env = {
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
        "JUPYTERHUB_API_TOKEN": "service-token",
        "JUPYTERHUB_API_URL": "http://127.0.0.1:1/hub/api",
    }
    ready = " serving "
    if which == "handin":
        argv = ["-m", "lab_utils.hub.service", "--store", str(tmp_path / "store"), "--lab", "01_single_node"]
    elif which == "culler":  # its first round has asked the Hub (here: nobody) for the users
        argv, ready = ["-m", "lab_utils.hub.culler", "--timeout=3600"], "Connection refused"
    else:
        (tmp_path / "course" / "source").mkdir(parents=True)
        (tmp_path / "course" / "nbgrader_config.py").write_text("")
        argv = ["-m", "lab_utils.hub.grader", "--course", str(tmp_path / "course"), "--handin-url", "http://x/"]
    proc = _start(argv, env)
    try:
        _serving(proc, ready)
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)  # the Hub's own wait is 10 s, then it kills
        rest = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    assert rc == 0 and "stopped" in rest, rest


def test_the_grading_service_interrupts_the_step_under_way_and_kills_one_that_will_not_stop(tmp_path):
    (tmp_path / "source").mkdir()
    (tmp_path / "nbgrader_config.py").write_text("")
    made = grader.Grader(tmp_path, "http://127.0.0.1:1/services/handin/", "t")
    made.stop()  # nothing under way: nothing to do
    for code, grace, ended_by in (
        (
            "import time\ntry:\n    print(1, flush=True)\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    raise SystemExit(130)",
            30,
            130,
        ),
        (
            "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint(1, flush=True)\ntime.sleep(60)",
            0.2,
            -9,
        ),
    ):
        job = made.running = grader.Job("01_single_node", "prof")
        job.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        assert job.proc.stdout.readline() == "1\n"  # its SIGINT is handled (or ignored) by now
        made.stop(grace_s=grace)
        assert job.proc.returncode == ended_by
        job.proc.stdout.close()
