"""Shared test plumbing: a leak check around every test that starts processes, and skips
for tests that need hardware or builds this machine may not have."""

from __future__ import annotations

import importlib.util
import os
import shutil
import time

import psutil
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("LABS_OFFLINE", "1")  # tests never download


def _gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


def pytest_collection_modifyitems(config, items):
    no_gpu = _gpu_count() == 0
    no_hvd = importlib.util.find_spec("horovod") is None
    for item in items:
        if no_gpu and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="no GPU on this machine"))
        if no_hvd and item.get_closest_marker("horovod"):
            item.add_marker(pytest.mark.skip(reason="Horovod is not installed (make setup builds it)"))


def _children() -> dict[int, str]:
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            out[child.pid] = " ".join(child.cmdline())[:200]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            out[child.pid] = "?"
    return out


@pytest.fixture(autouse=True)
def no_leaked_processes(request):
    """Tests that start processes must leave none behind (polled under a deadline)."""
    if not ({"process", "notebook"} & set(request.keywords)):
        yield
        return
    before = set(_children())
    yield
    deadline = time.monotonic() + 15
    leaked = {}
    while time.monotonic() < deadline:
        leaked = {pid: cmd for pid, cmd in _children().items() if pid not in before}
        if not leaked:
            return
        time.sleep(0.2)
    for pid in leaked:  # do not let one leak poison the rest of the session
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    pytest.fail(f"processes left running after the test: {leaked}")
