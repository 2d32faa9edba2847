"""Can this environment run every lab?  ``python -m lab_utils doctor`` or ``lab_utils.doctor()``.

Each row says OK, WARN or FAIL with a one-line fix. The command exits non-zero when any
row FAILs. In a notebook, ``lab_utils.doctor()`` shows the same rows as an HTML table.

Every check is a small function that takes what it reads (environment, file-system
root, command runner) as arguments, so the unit tests can drive the FAIL paths.
"""

from __future__ import annotations

import html
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from lab_utils import resources

OK, WARN, FAIL = "OK", "WARN", "FAIL"
#: the course's stacks, as scripts/stacks.sh names them (a unit test keeps the two equal): the
#: Python each is built for, its TensorFlow, and whether its processes need TF_USE_LEGACY_KERAS=1
#: (TF 2.16+ ship Keras 3, which Horovod's DistributedGradientTape cannot use: horovod#4290)
STACKS = {
    "2.21": {"python": "3.12", "tensorflow": "2.21.0", "legacy_keras": True},
    "2.15": {"python": "3.11", "tensorflow": "2.15.1", "legacy_keras": False},
}
DEFAULT_STACK = "2.21"
TF_VERSION = STACKS[DEFAULT_STACK]["tensorflow"]
GiB = 1024**3
# One TensorFlow process costs about 0.4 GB; 1 PS + 2 workers plus the kernel about 2 GB.
MEM_FAIL_BYTES = int(1.5 * GiB)
MEM_WARN_BYTES = int(3.0 * GiB)
DISK_FAIL_BYTES = 512 * 1024**2
DISK_WARN_BYTES = 2 * GiB


@dataclass
class Check:
    name: str
    status: str
    value: str
    fix: str = ""


Runner = Callable[[list[str]], "subprocess.CompletedProcess[str]"]


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


def stack_of(version_info=sys.version_info) -> str | None:
    """The course's stack built for this Python, or None when none is."""
    minor = f"{version_info[0]}.{version_info[1]}"
    return next((name for name, stack in STACKS.items() if stack["python"] == minor), None)


def _make(target: str, stack: str) -> str:
    return f"`make {target}`" if stack == DEFAULT_STACK else f"`make {target} STACK={stack}`"


def check_python(version_info=sys.version_info) -> Check:
    v = f"{version_info[0]}.{version_info[1]}.{version_info[2]} ({sys.executable})"
    stack = stack_of(version_info)
    if stack is not None:
        return Check("Python", OK, f"{v}: the {stack} stack (TensorFlow {STACKS[stack]['tensorflow']})")
    ways = "; ".join(f"Python {s['python']}: {_make('setup', name)}" for name, s in STACKS.items())
    return Check(
        "Python",
        FAIL,
        v,
        f"no stack of the course runs on Python {version_info[0]}.{version_info[1]} ({ways}). "
        "`make setup` finds or downloads the Python it needs; or `conda env create -f environment.yml`",
    )


def check_legacy_keras(env=None, version_info=sys.version_info) -> Check | None:
    """A stack on TF 2.16+ needs TF_USE_LEGACY_KERAS=1 in every process (its venv's .pth sets it)."""
    env = os.environ if env is None else env
    stack = stack_of(version_info)
    if stack is None or not STACKS[stack]["legacy_keras"]:
        return None
    if env.get("TF_USE_LEGACY_KERAS") == "1":
        return Check("Keras", OK, "tf-keras (Keras 2): TF_USE_LEGACY_KERAS=1")
    return Check(
        "Keras",
        FAIL,
        f"TF_USE_LEGACY_KERAS={env.get('TF_USE_LEGACY_KERAS', '(unset)')}: Keras 3, which Horovod cannot use",
        f"run the labs from the venv {_make('setup', stack)} made (its Python sets TF_USE_LEGACY_KERAS=1), "
        "or export TF_USE_LEGACY_KERAS=1",
    )


def check_tensorflow(importer=importlib.import_module, version_info=sys.version_info) -> list[Check]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    stack = stack_of(version_info) or DEFAULT_STACK
    want = STACKS[stack]["tensorflow"]
    from lab_utils.models import TF_IMPORT_NOISE, native_stderr_without  # as check_horovod's import

    try:
        with native_stderr_without(TF_IMPORT_NOISE):  # TF 2.16+'s notices at import (TF_CPP_MIN_LOG_LEVEL aside)
            tf = importer("tensorflow")
    except ImportError as exc:
        return [Check("TensorFlow", FAIL, f"not importable: {exc}", f"run {_make('setup', stack)} (installs {want})")]
    version = getattr(tf, "__version__", "?")
    rows = []
    if version == want:
        rows.append(Check("TensorFlow", OK, version))
    else:
        rows.append(
            Check(
                "TensorFlow",
                WARN,
                version,
                f"the {stack} stack is pinned to {want} (Horovod 0.28.1 is built against it): "
                f"reinstall with {_make('setup', stack)}",
            )
        )
    devices = [f"{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in tf.config.list_physical_devices()]
    gpus = [d for d in devices if d.startswith("GPU")]
    rows.append(
        Check(
            "TF devices",
            OK,
            ", ".join(devices) or "none",
            "" if gpus else "CPU only: labs 1-4 run fine; lab 5 (AlexNet) falls back to logical CPU devices",
        )
    )
    return rows


def check_horovod(importer=importlib.import_module) -> Check:
    from lab_utils.cluster.hvdbuild import HOROVOD_VERSION  # in a function, as check_network's netem

    try:
        hvd = importer("horovod")
        hvd_tf = importer("horovod.tensorflow")
    except ImportError as exc:
        return Check(
            "Horovod",
            FAIL,
            f"not importable: {exc}",
            f"run `make setup` (builds horovod=={HOROVOD_VERSION} with TensorFlow, Gloo and MPI; log in .venv/horovod-build.log)",
        )
    version = getattr(hvd, "__version__", "?")
    controllers = [n for n, f in (("MPI", "mpi_built"), ("Gloo", "gloo_built")) if getattr(hvd_tf, f)()]
    ops = [n for n, f in (("NCCL", "nccl_built"), ("MPI", "mpi_built"), ("Gloo", "gloo_built")) if getattr(hvd_tf, f)()]
    value = f"{version}; frameworks: TensorFlow; controllers: {', '.join(controllers) or 'none'}; tensor ops: {', '.join(ops) or 'none'}"
    missing = {"MPI", "Gloo"} - set(controllers)
    if missing:
        return Check(
            "Horovod",
            WARN if controllers else FAIL,
            value,
            f"rebuild with {' and '.join(sorted(missing))}: `rm .venv/.labs-setup-stamp && make setup`",
        )
    if version != HOROVOD_VERSION:
        return Check("Horovod", WARN, value, f"the labs are tested with {HOROVOD_VERSION}")
    return Check("Horovod", OK, value)


def check_mpirun(which=shutil.which, run: Runner = _run) -> Check:
    path = which("mpirun")
    if not path:
        return Check(
            "mpirun",
            FAIL,
            "not found",
            "install Open MPI: `apt-get install openmpi-bin libopenmpi-dev` "
            "(or `conda install -c conda-forge openmpi`)",
        )
    try:
        proc = run([path, "--version"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("mpirun", FAIL, f"{path}: {exc}", "reinstall Open MPI")
    first = (proc.stdout or proc.stderr).strip().splitlines()
    version = first[0] if first else "?"
    fix = "running as root: lab_utils passes --allow-run-as-root for you" if os.geteuid() == 0 else ""
    return Check("mpirun", OK if proc.returncode == 0 else WARN, f"{version} ({path})", fix)


def check_mpi4py(run: Runner = _run, python: str = sys.executable) -> Check:
    # In a subprocess: importing mpi4py.MPI may initialise MPI, which must not happen in the kernel.
    code = (
        "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI; "
        "print(mpi4py.__version__); print(MPI.Get_library_version().strip().splitlines()[0])"
    )
    try:
        proc = run([python, "-c", code])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("mpi4py", FAIL, str(exc), "run `make setup`")
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return Check("mpi4py", FAIL, last, "run `make setup` (mpi4py builds against the Open MPI found on PATH)")
    lines = proc.stdout.strip().splitlines()
    return Check("mpi4py", OK, f"{lines[0]}; {lines[1] if len(lines) > 1 else '?'}")


def check_cpu(env=None, root="/") -> Check:
    env = os.environ if env is None else env
    cg = resources.cgroup_limits(root)
    usable = resources.usable_cores(env, root)
    parts = [
        f"usable {usable}",
        f"os.cpu_count {os.cpu_count()}",
        f"affinity {len(os.sched_getaffinity(0))}",
        f"cgroup v{cg.version} quota {cg.cpu_quota_cores if cg.cpu_quota_cores else 'none'}",
    ]
    if env.get("CPU_LIMIT"):
        parts.append(f"CPU_LIMIT {env['CPU_LIMIT']}")
    if usable < 2:
        return Check(
            "CPU",
            WARN,
            ", ".join(parts),
            "1 usable core: clusters still run but slowly; keep to 1 PS + 1 worker or np=2",
        )
    return Check("CPU", OK, ", ".join(parts))


def check_memory(env=None, root="/") -> Check:
    env = os.environ if env is None else env
    limit = resources.memory_limit_bytes(env, root)
    avail = resources.available_memory_bytes(env, root)
    cg = resources.cgroup_limits(root).memory_bytes
    value = (
        f"limit {limit / GiB:.1f} GiB, available {avail / GiB:.1f} GiB, "
        f"cgroup {'none' if cg is None else f'{cg / GiB:.1f} GiB'}"
        + (f", MEM_LIMIT {int(float(env['MEM_LIMIT'])) / GiB:.1f} GiB" if env.get("MEM_LIMIT") else "")
    )
    if limit < MEM_FAIL_BYTES or avail < MEM_FAIL_BYTES // 2:
        return Check(
            "Memory",
            FAIL,
            value,
            "a TensorFlow process needs about 0.4 GiB; ask for at least 2 GiB "
            "(JupyterHub: c.Spawner.mem_limit) or close other kernels",
        )
    if limit < MEM_WARN_BYTES:
        return Check("Memory", WARN, value, "Binder-sized: lab_utils.cluster scales clusters down to what fits")
    return Check("Memory", OK, value)


def check_gpus(tf_gpu_count: int | None, nvml=None) -> Check:
    """GPUs through NVML (the driver) and what TensorFlow sees."""
    names: list[str] = []
    nvml_note = "no NVML (no NVIDIA driver)"
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            nvml = None
    if nvml is not None:
        try:
            nvml.nvmlInit()
            try:
                count = nvml.nvmlDeviceGetCount()
                for i in range(count):
                    name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(i))
                    names.append(name.decode() if isinstance(name, bytes) else str(name))
                nvml_note = f"NVML: {count} GPU(s)" + (f" ({', '.join(names)})" if names else "")
            finally:
                nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            nvml_note = f"no NVML ({exc})"
    tf_note = "TF: unknown" if tf_gpu_count is None else f"TF: {tf_gpu_count} GPU(s)"
    value = f"{nvml_note}; {tf_note}"
    if names and not tf_gpu_count:
        return Check("GPUs", WARN, value, "GPUs present but TensorFlow is CPU-only: `make setup GPU=1`")
    if not names and not tf_gpu_count:
        return Check("GPUs", OK, value, "none: GPU cells use logical CPU devices; GPU-only tests are skipped")
    return Check("GPUs", OK, value)


def check_disk(path: str | os.PathLike = ".") -> Check:
    free = shutil.disk_usage(path).free
    value = f"{free / GiB:.1f} GiB free at {Path(path).resolve()}"
    if free < DISK_FAIL_BYTES:
        return Check("Disk", FAIL, value, "free some space: logs, TensorBoard runs and datasets need ~1 GiB")
    if free < DISK_WARN_BYTES:
        return Check("Disk", WARN, value, "low: `make clean` removes run logs and outputs")
    return Check("Disk", OK, value)


def check_network(how: Callable[[], str | None] | None = None, reason: Callable[[], str | None] | None = None) -> Check:
    """Emulated hosts (Labs 2, 4 and 6's network lessons): named namespaces with
    CAP_NET_ADMIN, a user namespace of the job's own without, or loopback only, and why."""
    from lab_utils.cluster import netem

    kind = (how or netem.how)()
    if kind == "netns":
        return Check("Emulated network", OK, "network namespaces (CAP_NET_ADMIN)")
    if kind == "userns":
        return Check("Emulated network", OK, "a user namespace per job (no root needed)")
    why = (reason or netem.unavailable_reason)() or "unknown"
    return Check(
        "Emulated network",
        WARN,
        f"loopback only: {why}",
        "without emulated hosts the network lessons run on loopback, where the network costs nothing",
    )


def check_host(env=None) -> Check:
    env = os.environ if env is None else env
    kind = resources.host_kind(env)
    notes = {
        "binder": "Binder: 1-2 CPUs, 2 GB; labs run with scaled-down clusters",
        "jupyterhub": "JupyterHub: clusters are per user, limits from CPU_LIMIT / MEM_LIMIT",
        "ci": "CI: notebooks run headless with papermill",
        "local": "",
    }
    return Check("Host", OK, f"{kind} ({platform.platform()})", notes[kind])


def run_checks(env=None, root="/") -> list[Check]:
    rows = [check_python()]
    tf_rows = check_tensorflow()
    rows += tf_rows
    keras = check_legacy_keras()
    if keras is not None:
        rows.append(keras)
    tf_gpus = None
    if tf_rows[0].status != FAIL:
        import tensorflow as tf

        tf_gpus = len(tf.config.list_physical_devices("GPU"))
        rows.append(check_horovod())
    else:
        rows.append(Check("Horovod", FAIL, "skipped: TensorFlow missing", "run `make setup`"))
    rows += [
        check_mpirun(),
        check_mpi4py(),
        check_cpu(env, root),
        check_memory(env, root),
        check_gpus(tf_gpus),
        check_disk(Path(__file__).resolve().parent.parent),
        check_network(),
        check_host(env),
    ]
    return rows


class Report:
    """The doctor's rows; shows as an HTML table in a notebook."""

    def __init__(self, rows: Iterable[Check]):
        self.rows = list(rows)

    @property
    def ok(self) -> bool:
        return all(r.status != FAIL for r in self.rows)

    def text(self) -> str:
        width = max(len(r.name) for r in self.rows)
        lines = []
        for r in self.rows:
            lines.append(f"{r.status:<4}  {r.name:<{width}}  {r.value}")
            if r.fix:
                lines.append(f"{'':<4}  {'':<{width}}  -> {r.fix}")
        verdict = "all checks passed" if self.ok else "some checks FAILED: fix them before running the labs"
        return "\n".join(lines + ["", verdict])

    __str__ = text

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        colour = {OK: "#1a7f37", WARN: "#9a6700", FAIL: "#cf222e"}
        body = "".join(
            f"<tr><td style='color:{colour[r.status]};font-weight:bold'>{r.status}</td>"
            f"<td>{html.escape(r.name)}</td><td style='text-align:left'>{html.escape(r.value)}</td>"
            f"<td style='text-align:left'>{html.escape(r.fix)}</td></tr>"
            for r in self.rows
        )
        return (
            "<table><thead><tr><th>status</th><th>check</th><th>value</th><th>fix / note</th></tr></thead>"
            f"<tbody>{body}</tbody></table>"
        )

    def to_json(self) -> str:
        return json.dumps([asdict(r) for r in self.rows], indent=1)


def doctor(env=None, root="/") -> Report:
    """Check this environment; in a notebook the result shows as a table."""
    return Report(run_checks(env, root))


def main(json_output: bool = False) -> int:
    report = doctor()
    print(report.to_json() if json_output else report.text())
    return 0 if report.ok else 1
