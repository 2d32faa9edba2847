"""The Interrupt button at any moment of a cluster's life: nothing may keep running.

Root cause of the fresh-machine failure of the old SIGINT test: a process started
in the background by a non-interactive shell (``make test &``, a CI harness
without job control) inherits SIGINT *ignored*, and Python keeps an inherited
SIG_IGN instead of installing its KeyboardInterrupt handler. The stand-in kernel
therefore never saw the interrupt; its cluster, left waiting on a hung task, ran
on. ipykernel does not have the problem (it installs ``default_int_handler``
for every cell), so the stand-in now does the same, and every test here starts
its kernel with SIGINT ignored, as that machine did, every time rather than by
chance. One test drives a real Jupyter kernel and its Interrupt request.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures"
KERNEL = str(FIX / "cluster_kernel.py")
HANG = json.dumps({"hang_task": "worker:1"})


def _ignore_sigint() -> None:  # what a non-interactive shell does to a background job
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def ours(root: Path) -> list[psutil.Process]:
    """Every live process started for a cluster under ``root`` (their LABS_RUN_DIR says so)."""
    found = []
    for proc in psutil.process_iter():
        try:
            run_dir = proc.environ().get("LABS_RUN_DIR", "")
            if run_dir.startswith(str(root)) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def gone_within(root: Path, seconds: float) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    left = ours(root)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = ours(root)
    return left


def kernel(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, KERNEL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_ignore_sigint)  # fmt: skip


def interrupt_and_check(proc: subprocess.Popen, root: Path) -> str:
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the kernel ignored the interrupt for 30 s; stderr: {err[-2000:]}")
    left = gone_within(root, 10.0)
    for p in left:
        p.kill()
    assert left == [], f"still running after the interrupt: {[(p.pid, p.cmdline()) for p in left]}"
    assert "KeyboardInterrupt" in err and proc.returncode != 0, (proc.returncode, err[-2000:])
    return out


def test_sigint_while_waiting_stops_the_cluster_even_if_sigint_was_ignored(run_root):
    """The old fresh-machine failure, reproduced on every run: SIGINT during wait()."""
    proc = kernel("--wait", "--args", HANG)
    first = json.loads(proc.stdout.readline())
    assert len(first["tasks"]) == 3
    out = interrupt_and_check(proc, run_root)
    assert json.loads(out.strip().splitlines()[-1]) == {"interrupted": True, "running": False}


@pytest.mark.parametrize("delay", [0.0, 0.03, 0.1, 0.2, 0.35, 0.5, 0.8, 1.2])
def test_sigint_at_any_moment_of_start(run_root, delay):
    """Interrupts spread over start(): resource check, run directory, each launch, the ready wait."""
    proc = kernel("--announce", "--wait", "--args", HANG)
    assert json.loads(proc.stdout.readline()) == {"starting": True}
    time.sleep(delay)  # where in start() the interrupt lands: the point of this test, not a readiness wait
    interrupt_and_check(proc, run_root)


MPI = ["--kind", "mpi", "--script", "cluster_mpi_task.py", "--args", json.dumps(["--hang"])]


@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0])
def test_sigint_at_any_moment_of_an_mpi_job(run_root, delay):
    """mpirun's start (the launcher comes up, ranks start) and wait, interrupted."""
    proc = kernel("--announce", "--wait", *MPI)
    assert json.loads(proc.stdout.readline()) == {"starting": True}
    time.sleep(delay)  # where the interrupt lands: the point of this test, not a readiness wait
    interrupt_and_check(proc, run_root)


def test_sigint_during_stop_escalates_to_sigkill(run_root):
    """Tasks that ignore SIGTERM keep stop() in its grace period; an interrupt there kills them at once.
    (An MPIJob's stop has no such window: mpirun itself SIGKILLs ranks that ignore SIGTERM.)"""
    # a grace period far longer than interrupt_and_check's 30 s hang guard: waiting it out fails the test
    proc = kernel("--stop", "--grace", "600", "--args", json.dumps({"hang_task": "worker:1", "ignore_term": True}))
    json.loads(proc.stdout.readline())  # started; the kernel is now in stop()
    time.sleep(0.5)  # inside stop()'s grace period: where the interrupt must land
    assert proc.poll() is None, "stop() ended before the interrupt: the test would prove nothing"
    interrupt_and_check(proc, run_root)


def test_interrupt_inside_popen_leaves_no_stray(run_root, monkeypatch):
    """The narrowest window: the task's process exists but Popen never returned it, so
    no Task records it. stop() finds it by its LABS_JOB token."""
    from lab_utils.cluster import TFCluster

    real = subprocess.Popen
    calls = []

    class InterruptedPopen(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            calls.append(self.pid)
            if len(calls) == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "Popen", InterruptedPopen)
    c = TFCluster(ps=1, workers=2, script=str(FIX / "cluster_task.py"), args={"hang_task": "worker:0"},
                  memory_per_task=50 * 1024**2, progress=False)  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        c.start()
    monkeypatch.undo()
    assert [t.pid for t in c.tasks][1] is None and len(calls) == 2  # the second process was never recorded
    assert not c.running
    assert gone_within(run_root, 5.0) == []


def test_interrupt_button_of_a_real_jupyter_kernel(run_root):
    """A real ipykernel, started with SIGINT ignored, interrupted while a cluster waits."""
    jupyter_client = pytest.importorskip("jupyter_client")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited by the kernel, as on that machine
    try:
        km, kc = jupyter_client.manager.start_new_kernel(kernel_name="python3", startup_timeout=60)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        code = (
            "from lab_utils.cluster import TFCluster\n"
            f"c = TFCluster(ps=1, workers=2, script={str(FIX / 'cluster_task.py')!r}, args={{'hang_task': 'worker:1'}},"
            " memory_per_task=50 * 1024**2, progress=False)\n"
            "with c:\n    c.wait()\n"
        )
        msg_id = kc.execute(code)
        deadline = time.monotonic() + 60
        while len(ours(run_root)) < 6 and time.monotonic() < deadline:  # 3 guards + 3 tasks
            time.sleep(0.05)
        assert len(ours(run_root)) >= 6, "the cluster did not start in the kernel"
        km.interrupt_kernel()
        reply = kc.get_shell_msg(timeout=30)
        while reply["parent_header"].get("msg_id") != msg_id:
            reply = kc.get_shell_msg(timeout=30)
        assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
        assert gone_within(run_root, 10.0) == []
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
