"""What lab_utils.metrics reads from a real GPU: utilisation, memory, and the GPU memory it
attributes to a task's processes (``task_gpu_mem``), with a GPU load of known size running.

The load is a child process that allocates ``--gib`` GiB on GPU 0 and multiplies matrices for
``--seconds``. It uses TensorFlow when TensorFlow sees a GPU (the labs' stack), else PyTorch or
CuPy, whichever is installed (a GPU machine without the labs' stack still checks the sampler).
The sampler (:class:`lab_utils.metrics.sampler.Sampler`, the one the labs' monitor runs) samples
at 10 Hz meanwhile. Prints one JSON object:

- ``gpus``: ``nvidia-smi -L``'s lines as :func:`lab_utils.training.devices.nvidia_gpus` reads them;
- ``nvml``: whether the probe found the GPU, and why not;
- ``gpu_util_max``/``gpu_util_mean`` while the load ran, and the same before it (idle);
- ``task_gpu_mem_max``: what the sampler attributed to the load's process tree, against
  ``allocated_bytes`` (what the load asked for; the framework's context adds some hundreds of MB);
  0 means NVML listed no pid of the task (a container whose pids NVML cannot see, for one);
- ``sample_ms``: the sampler's mean wall time per sample (host + task + GPU).

Exit status 1 when a GPU is listed but the sampler saw no utilisation or no memory of the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lab_utils.metrics.sampler import Sampler  # noqa: E402
from lab_utils.training.devices import nvidia_gpus  # noqa: E402

LOAD = r"""
import sys, time
gib, seconds = float(sys.argv[1]), float(sys.argv[2])
n = 4096
def tf_load():
    import tensorflow as tf
    if not tf.config.list_physical_devices("GPU"):
        raise ImportError("TensorFlow sees no GPU")
    with tf.device("/GPU:0"):
        hold = tf.zeros([int(gib * 2**30 // 4)], tf.float32)
        a = tf.random.normal([n, n]); b = tf.random.normal([n, n])
        def step():
            return float(tf.reduce_sum(tf.matmul(a, b))[()])
        return "tensorflow", hold, step
def torch_load():
    import torch
    if not torch.cuda.is_available():
        raise ImportError("PyTorch sees no GPU")
    hold = torch.zeros(int(gib * 2**30 // 4), device="cuda")
    a = torch.randn(n, n, device="cuda"); b = torch.randn(n, n, device="cuda")
    def step():
        return float((a @ b).sum())
    return "torch", hold, step
def cupy_load():
    import cupy
    hold = cupy.zeros(int(gib * 2**30 // 4), cupy.float32)
    a = cupy.random.standard_normal((n, n), cupy.float32); b = cupy.random.standard_normal((n, n), cupy.float32)
    def step():
        return float((a @ b).sum())
    return "cupy", hold, step
errors = []
for load in (tf_load, torch_load, cupy_load):
    try:
        name, hold, step = load()
        break
    except Exception as exc:
        errors.append(f"{load.__name__}: {type(exc).__name__}: {exc}")
else:
    sys.exit("no GPU framework could allocate: " + "; ".join(errors))
step()
print(name, flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(20):
        step()
print("done", flush=True)
"""


def _sample(sampler: Sampler, seconds: float, hz: float = 10.0) -> tuple[list, list[float]]:
    rows, costs = [], []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        _, r = sampler.sample()
        costs.append(time.perf_counter() - t0)
        rows += r
        time.sleep(max(0.0, 1 / hz - costs[-1]))  # a sampling period, not a wait for readiness
    return rows, costs


def _values(rows: list, metric: str) -> list[float]:
    return [r[4] for r in rows if r[3] == metric]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0, help="GPU memory the load allocates (GiB)")
    ap.add_argument("--seconds", type=float, default=20.0, help="how long the load multiplies matrices")
    args = ap.parse_args()
    out: dict = {"gpus": nvidia_gpus(), "allocated_bytes": int(args.gib * 2**30)}
    idle = Sampler({}, host=False)
    out["nvml"] = {"available": idle.gpu.available, "reason": idle.gpu.reason, "devices": len(idle.gpu.handles)}
    if not idle.gpu.available:
        print(json.dumps(out, indent=1))
        return 0 if not out["gpus"] else 1
    rows, _ = _sample(idle, 2.0)
    out["idle_gpu_util_max"] = max(_values(rows, "gpu_util"), default=None)

    child = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(args.gib), str(args.seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out["framework"] = child.stdout.readline().strip()  # printed once the memory is held
        if not out["framework"]:
            child.wait(timeout=60)
            out["error"] = f"the load exited {child.returncode} before it held any memory"
            print(json.dumps(out, indent=1))
            return 1
        sampler = Sampler({"worker:0": child.pid}, host=True)
        rows, costs = _sample(sampler, max(2.0, args.seconds - 2.0))
    finally:
        child.kill()
        child.wait(timeout=60)
    util = _values(rows, "gpu_util")
    task_mem = _values(rows, "task_gpu_mem")
    out.update(
        gpu_util_max=max(util, default=None),
        gpu_util_mean=round(statistics.fmean(util), 1) if util else None,
        gpu_mem_used_max=max(_values(rows, "gpu_mem_used"), default=None),
        task_gpu_mem_max=max(task_mem, default=0),
        task_cpu_percent_mean=round(statistics.fmean(_values(rows, "cpu_percent") or [0]), 1),
        samples=len(costs),
        sample_ms=round(1000 * statistics.fmean(costs[1:]), 2) if len(costs) > 1 else None,
        pid_namespace=os.readlink("/proc/self/ns/pid"),
    )
    print(json.dumps(out, indent=1))
    ok = (out["gpu_util_max"] or 0) > 0 and out["task_gpu_mem_max"] >= out["allocated_bytes"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
