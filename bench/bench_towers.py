"""Lab 5: hand-made towers against MirroredStrategy, one device against two, and AlexNet-224 on a GPU, in one run.

    python bench/bench_towers.py [--width 0.5] [--batch-size 64] [--steps 20] [--rounds 3] [--gpu-steps 20]

1. Examples/s of ``towers`` (the Lab 5 solution, extracted from the instructor notebook)
   over ``mirrored`` (MirroredStrategy), both on the same 2 devices (logical CPU devices
   without a GPU) with the same batch per device. Target: at least 0.8.
2. ``single`` on 1 device against ``towers`` on 2 at the same batch per device:
   speedup and efficiency. Logical CPU devices share the usable cores and one set of
   TensorFlow thread pools, so the speedup there is bounded by the cores, not by N.
   The three configurations alternate (ABC ABC ...) ``--rounds`` times and each keeps
   its best: other load on the machine only ever slows a run down.
3. With a GPU (``nvidia-smi -L``): images/s of AlexNet-224 (``single``, one GPU, batch
   256, ``--precision mixed``) and their share of the GPU's dense bf16 peak, counting
   3 x the forward FLOPs per training image (forward, and backward for activations and
   weights); the forward multiply-adds come from the layer shapes of
   ``alexnet("224")`` (x 2 FLOPs each). Without a GPU: ``"gpu": {"skipped": ...}``.

Every ratio is between runs of this same invocation. Prints one JSON object on stdout;
progress lines on stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import time

os.environ.setdefault("LABS_OFFLINE", "1")  # benchmarks never download

from lab_utils.grading import reference_script  # noqa: E402 (after LABS_OFFLINE)
from lab_utils.models import tensorflow_version  # noqa: E402
from lab_utils.resources import usable_cores  # noqa: E402
from lab_utils.training import devices as lab_devices  # noqa: E402
from lab_utils.training.towers.runs import run_devices  # noqa: E402

STUDENT = reference_script("05_alexnet", "towers.py")
DEVICES = 2
TARGET_TOWERS_OVER_MIRRORED = 0.8
GPU_BATCH = 256
#: Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, by a part of the device name (first match wins).
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))

# Forward multiply-adds of alexnet("224"), counted from its built layers, in a process of its own
# with no GPU visible: this process must not hold a GPU (TensorFlow takes all its memory at start).
_MACS_CODE = """
import json
from lab_utils.models import alexnet, import_tensorflow
tf = import_tensorflow()
model = alexnet("224")
rows, shape = [], tf.TensorShape([1, 224, 224, 3])
for layer in model.layers:
    out = tf.TensorShape(layer.compute_output_shape(shape))
    if isinstance(layer, tf.keras.layers.Conv2D):  # each output value: k x k x c_in multiply-adds
        k1, k2, c_in, c_out = layer.kernel.shape
        rows.append([layer.name, int(out[1] * out[2] * c_out * k1 * k2 * c_in)])
    elif isinstance(layer, tf.keras.layers.Dense):
        rows.append([layer.name, int(layer.kernel.shape[0] * layer.kernel.shape[1])])
    shape = out
print(json.dumps({"params": int(model.count_params()), "macs": rows}))
"""


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    except OSError:
        return platform.processor() or "?"


def alexnet224_macs() -> dict:
    """Forward multiply-adds per image of each conv / dense layer of ``alexnet("224")``."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run([sys.executable, "-c", _MACS_CODE], capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"counting AlexNet-224's multiply-adds failed:\n{out.stderr[-2000:]}")
    found = json.loads(out.stdout.strip().splitlines()[-1])
    macs = sum(m for _, m in found["macs"])
    return {
        "params": found["params"],
        "forward_macs_per_image": macs,
        "forward_gflop_per_image": round(2 * macs / 1e9, 4),
        "train_gflop_per_image": round(3 * 2 * macs / 1e9, 4),
        "macs_by_layer": dict(found["macs"]),
    }


def peak_tflops(name: str) -> float | None:
    return next((peak for part, peak in PEAK_BF16_TFLOPS if part.lower() in name.lower()), None)


def cpu_runs(args) -> dict[str, list[dict]]:
    """towers (2 devices), mirrored (2 devices), single (1 device), alternating ``rounds`` times."""
    common = {"width": args.width, "batch_size": args.batch_size, "steps": args.steps, "dropout": 0.5, "seed": 0}
    configs = {"towers": ("towers", DEVICES), "mirrored": ("mirrored", DEVICES), "single": ("single", 1)}
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, (method, n) in configs.items():
            run = run_devices(method, n, args=common, student=STUDENT, monitor=False)
            if run.oom:
                raise RuntimeError(f"{name} ran out of memory: {run.result.get('error')}")
            runs[name].append(
                {
                    "examples_per_sec": round(run.examples_per_sec, 1),
                    "s_per_batch": round(run.step_time, 4),
                    "global_batch": run.global_batch,
                    "tier": run.tier,
                    "wall": round(run.wall_time, 2),
                }
            )
            progress(
                f"[round {r + 1}/{args.rounds}] {name:8s} on {n} device(s), global batch {run.global_batch}: "
                f"{run.examples_per_sec:,.1f} examples/s, wall {run.wall_time:.1f} s"
            )
    return runs


def gpu_part(args, gpus: list[str], flops: dict) -> dict:
    if not gpus:
        return {"skipped": "no GPU: nvidia-smi is not installed or lists none"}
    run = run_devices(
        "single",
        1,
        args={"variant": "224", "batch_size": GPU_BATCH, "steps": args.gpu_steps, "precision": "mixed"},
        monitor=False,
    )
    out = {"nvidia_smi": gpus, "method": "single", "batch_size": GPU_BATCH, "steps": args.gpu_steps}
    out.update(tier=run.tier, hardware=run.result.get("hardware"), precision=run.result.get("precision"))
    if run.oom:
        return {**out, "oom": True, "error": run.result.get("error")}
    if run.tier != "gpu":
        return {**out, "skipped": f"TensorFlow trained on {run.tier}, not a GPU (tensorflow-cpu, or no CUDA?)"}
    name = str(run.result.get("hardware", "")).split(" x ", 1)[-1]
    peak = peak_tflops(name)
    images = run.examples_per_sec
    achieved = images * flops["train_gflop_per_image"] / 1e3  # TFLOP/s
    out.update(device_name=name, images_per_sec=round(images, 1), s_per_batch=round(run.step_time, 4))
    out.update(achieved_tflops=round(achieved, 2), peak_bf16_dense_tflops=peak)
    out["share_of_peak"] = round(achieved / peak, 4) if peak else None
    out["flops_formula"] = "images/s x 3 x 2 x forward multiply-adds per image (alexnet('224') layer shapes)"
    progress(f"[gpu] {name}: {images:,.0f} images/s, {achieved:.1f} TFLOP/s of {peak or '?'}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=float, default=0.5, help="AlexNet-cifar's width for the CPU runs")
    p.add_argument("--batch-size", type=int, default=64, help="per device, every CPU run")
    p.add_argument("--steps", type=int, default=20, help="timed steps of every CPU run")
    p.add_argument("--rounds", type=int, default=3, help="alternations of the CPU runs (best kept)")
    p.add_argument("--gpu-steps", type=int, default=20, help="timed steps of the GPU run")
    args = p.parse_args(argv)
    low = {"batch_size": 1, "steps": 2, "rounds": 1, "gpu_steps": 2}
    bad = {k: getattr(args, k) for k, v in low.items() if getattr(args, k) < v}
    if bad or not 0 < args.width <= 4:
        p.error(f"too small: {bad}; minimums {low}, and 0 < --width <= 4")
    t0 = time.monotonic()
    load_start = os.getloadavg()[0]
    cores = usable_cores()
    gpus = lab_devices.nvidia_gpus()
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the JSON only
        flops = alexnet224_macs()
        progress(f"[flops] alexnet('224'): {flops['forward_gflop_per_image']} GFLOP forward per image")
        runs = cpu_runs(args)
        gpu = gpu_part(args, gpus, flops)
    best = {name: max(r["examples_per_sec"] for r in rs) for name, rs in runs.items()}
    ratio = best["towers"] / best["mirrored"]
    speedup = best["towers"] / best["single"]
    tier = runs["towers"][0]["tier"]
    out = {
        "bench": "towers",
        "config": {**vars(args), "devices": DEVICES, "student": str(STUDENT.relative_to(STUDENT.parents[2]))},
        "machine": {
            "cpu": cpu_model(),
            "usable_cores": cores,
            "os_cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "tensorflow": tensorflow_version(),
            "gpus": gpus,
        },
        "load_avg_1m": {"start": round(load_start, 2)},
        "towers_vs_mirrored": {
            "tier": tier,
            "best_examples_per_sec": {"towers": best["towers"], "mirrored": best["mirrored"]},
            "towers_over_mirrored": round(ratio, 3),
            "target": TARGET_TOWERS_OVER_MIRRORED,
            "meets_target": ratio >= TARGET_TOWERS_OVER_MIRRORED,
        },
        "scaling": {
            "tier": tier,
            "batch_per_device": args.batch_size,
            "best_examples_per_sec": {"single_1": best["single"], "towers_2": best["towers"]},
            "speedup": round(speedup, 3),
            "efficiency": round(speedup / DEVICES, 3),
            "bound": min(DEVICES, cores) if tier == "logical-cpu" else DEVICES,
            "note": (
                f"{DEVICES} logical CPU devices share this machine's {cores} usable core(s) and one set of "
                f"TensorFlow thread pools, and one device's ops already use every core: the towers cannot add "
                f"compute, so the speedup is at most min(devices, cores) = {min(DEVICES, cores)} and usually about "
                "1x. This measures the towers' overhead, not scaling; real GPUs are needed for the speedup."
                if tier == "logical-cpu"
                else f"{DEVICES} {tier} devices: see the tier's expectation (devices.expectation)."
            ),
        },
        "runs": runs,
        "alexnet224": flops,
        "gpu": gpu,
        "wall_total": round(time.monotonic() - t0, 1),
    }
    out["load_avg_1m"]["end"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
