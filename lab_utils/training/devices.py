"""Which devices a process trains on, and what numbers to expect there (Lab 5).

:func:`configure` must run in a fresh process, before TensorFlow touches a device
(``lab_utils.training.towers`` calls it first thing). It picks a *tier*:

* ``gpu``: as many real GPUs as asked for, memory growth on (TensorFlow otherwise
  grabs all of a GPU's memory at start), or each capped at ``memory_limit_mb``;
* ``logical-gpu``: fewer GPUs than asked for: GPU 0 split into N logical GPUs, each
  with ``memory_limit_mb`` (default: an equal share of its memory);
* ``logical-cpu``: no GPU (or ``kind="cpu"``): the CPU split into N logical CPU
  devices with ``tf.config.set_logical_device_configuration``. They share the cores
  and TensorFlow's thread pools, so N towers cannot compute N times faster: this
  tier shows the *mechanics* (splitting, averaging, synchronising) on any laptop or
  Binder, not the speedup. ``memory_limit_mb`` is then watched by
  :func:`watch_memory`: a process that outgrows it ends with an out-of-memory
  result, as a batch too large for a GPU does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass

import psutil

from lab_utils import checks

__all__ = ["KINDS", "Tier", "configure", "expectation", "nvidia_gpus", "watch_memory"]

KINDS = ("auto", "gpu", "cpu")
#: Logical GPUs of one physical GPU get this share of its memory when no limit is given.
GPU_SHARE = 0.9
#: Memory a logical GPU gets when the physical GPU's size cannot be read (MB).
FALLBACK_GPU_MB = 4096


@dataclass(frozen=True)
class Tier:
    """Where a process trains: ``kind`` (gpu, logical-gpu, logical-cpu), the logical
    ``devices`` it uses, the ``variable_device`` (the parameter device of Lab 5's
    towers), what the hardware is, and the memory limit per device (MB, or None)."""

    kind: str
    devices: tuple[str, ...]
    variable_device: str
    hardware: str
    memory_limit_mb: int | None = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = list(self.devices)
        return d

    def describe(self) -> str:
        cap = f", {self.memory_limit_mb:,} MB each" if self.memory_limit_mb else ""
        return (
            f"{self.kind}: {len(self.devices)} device(s) on {self.hardware}{cap}; variables on {self.variable_device}"
        )


def expectation(kind: str, n: int, cores: int | None = None) -> str:
    """What numbers to expect from ``n`` devices of tier ``kind`` (printed by the notebook)."""
    if kind == "gpu":
        return (
            f"{n} real GPU(s): AlexNet's step is compute-bound at batch >= 64 per GPU, so expect close to "
            f"{n}x the examples/s of one GPU, less the all-reduce of 61 M parameters (NCCL) per step."
        )
    if kind == "logical-gpu":
        return (
            f"{n} logical GPUs share ONE physical GPU's compute and memory: expect about 1x (no speedup); "
            "memory per device is 1/N, so large batches run out of memory sooner."
        )
    cores = cores or os.cpu_count() or 1
    return (
        f"{n} logical CPU devices share {cores} core(s) and one set of thread pools: towers run side by side "
        f"but cannot add compute, so expect at most about {min(n, cores)}x and usually close to 1x. These runs "
        "show the mechanics and their overhead; the speedup needs real devices."
    )


def nvidia_gpus() -> list[str]:
    """``nvidia-smi -L``'s GPU lines, without loading CUDA or TensorFlow here (empty: no GPU)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in out.stdout.splitlines() if line.startswith("GPU ")] if out.returncode == 0 else []


def _gpu_memory_mb(index: int = 0) -> int | None:
    """The physical GPU's memory via NVML (None when NVML is not there)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total // 2**20)
    except pynvml.NVMLError:
        return None


def _gpu_tier(tf, gpus: list, n: int, memory_limit_mb: int | None) -> Tier:
    config = tf.config
    name = config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    if n <= len(gpus):
        used = gpus[:n]
        config.set_visible_devices(used, "GPU")
        for g in used:
            if memory_limit_mb:
                config.set_logical_device_configuration(g, [config.LogicalDeviceConfiguration(memory_limit_mb)])
            else:
                config.experimental.set_memory_growth(g, True)
        kind, hardware = "gpu", f"{n} x {name}"
    else:
        total = _gpu_memory_mb(0)
        memory_limit_mb = memory_limit_mb or (int(total * GPU_SHARE / n) if total else FALLBACK_GPU_MB)
        config.set_visible_devices(gpus[:1], "GPU")
        config.set_logical_device_configuration(gpus[0], [config.LogicalDeviceConfiguration(memory_limit_mb)] * n)
        kind, hardware = "logical-gpu", f"1 x {name}"
    devices = tuple(d.name for d in config.list_logical_devices("GPU"))
    variable_device = config.list_logical_devices("CPU")[0].name
    return Tier(kind, devices, variable_device, hardware, memory_limit_mb)


def watch_memory(limit_mb: int, on_exceed: Callable[[int, int], None], interval: float = 0.02) -> Callable[[], None]:
    """Call ``on_exceed(rss, cap)`` once, from a daemon thread, when this process's RSS grows
    more than ``limit_mb`` above what it is now: the memory of a logical CPU device.

    TensorFlow cannot cap CPU memory (``memory_limit`` is for GPUs only), and an
    ``RLIMIT_DATA`` cap crashes its thread pools instead of failing one allocation, so
    the process watches itself; ``on_exceed`` reports and ends it, as a full GPU would.
    Returns ``stop()``, which ends the watch (before an evaluation that is not training)."""
    proc = psutil.Process()
    cap = proc.memory_info().rss + int(limit_mb) * 2**20
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(interval):
            rss = proc.memory_info().rss
            if rss > cap:
                on_exceed(rss, cap)
                return

    threading.Thread(target=watch, name="lab-memory-watch", daemon=True).start()
    return stop.set


def configure(n: int, kind: str = "auto", memory_limit_mb: int | None = None) -> Tier:
    """Set up ``n`` devices of the best tier ``kind`` allows ("auto": GPUs when there are
    any, else the CPU) and return the :class:`Tier`. Call once, before TensorFlow has
    created a device (RuntimeError otherwise: restart the process)."""
    checks.count("devices", n)
    if kind not in KINDS:
        raise ValueError(f"unknown device kind {kind!r}; choose one of {KINDS}")
    if memory_limit_mb is not None and memory_limit_mb < 1:
        raise ValueError(f"memory_limit_mb must be >= 1 (or None), got {memory_limit_mb}")
    from lab_utils.models import import_tensorflow

    tf = import_tensorflow()
    gpus = tf.config.list_physical_devices("GPU")
    if kind == "gpu" and not gpus:
        raise RuntimeError("kind='gpu' but TensorFlow sees no GPU (tensorflow-cpu installed, or no CUDA driver)")
    if gpus and kind != "cpu":
        return _gpu_tier(tf, gpus, n, memory_limit_mb)
    if gpus:
        tf.config.set_visible_devices([], "GPU")
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(cpus[0], [tf.config.LogicalDeviceConfiguration()] * n)
    devices = tuple(d.name for d in tf.config.list_logical_devices("CPU"))
    from lab_utils.resources import usable_cores

    hardware = f"the CPU ({usable_cores()} usable core(s))"
    return Tier("logical-cpu", devices, devices[0], hardware, memory_limit_mb)
