"""How the installed Horovod was built (controllers, NCCL), without importing TensorFlow.

:class:`~lab_utils.cluster.mpi.MPIJob` asks before it launches ``horovodrun``, so a
Horovod built without the requested controller fails with a clear message instead
of a launcher error after the ranks started.

The answer comes from a short-lived child process that loads TensorFlow's C++
libraries and Horovod's TensorFlow extension with :mod:`ctypes` and calls the
extension's ``horovod_mpi_built`` / ``horovod_gloo_built`` / ``horovod_nccl_built``
(measured: about 0.25 s). Never in the calling process: a notebook kernel that has
loaded those libraries with ctypes crashes (SIGSEGV) at a later ``import
tensorflow``, and they add about 200 MB and a line on stderr. When the child cannot
answer, ``horovodrun --check-build`` does (it imports TensorFlow: about 15 s).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

#: The Horovod the labs are tested with (``scripts/setup.sh`` and the constraints pin the same);
#: :mod:`lab_utils.doctor` warns about any other version.
HOROVOD_VERSION = "0.28.1"
#: Environment variable: comma-separated controllers the installed Horovod was built with
#: ("gloo,mpi"), which :mod:`.hvdrun` (the launcher module) answers horovodrun's checks from.
BUILT = "LABS_HOROVOD_BUILT"
#: The launcher's module, by name: the package never imports it, so that ``python -m`` runs
#: it without runpy's "found in sys.modules" warning in every job's log.
HVDRUN = "lab_utils.cluster.hvdrun"
#: the build script (``make setup`` runs it)
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build-horovod.sh"
PROBE_TIMEOUT = 30.0  # the ctypes child (a cold page cache reads the 600 MB TensorFlow library)
CHECK_BUILD_TIMEOUT = 120.0  # horovodrun --check-build imports TensorFlow once per framework

# Runs in a child with -I -S: nothing but ctypes and json, no site-packages.
_PROBE = """
import ctypes, json, os, sys
tf_dir, ext = sys.argv[1], sys.argv[2]
for name in ("libtensorflow_framework.so.2", "libtensorflow_cc.so.2"):
    if os.path.exists(os.path.join(tf_dir, name)):
        ctypes.CDLL(os.path.join(tf_dir, name), mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(ext)
print(json.dumps({k: bool(getattr(lib, "horovod_%s_built" % k)()) for k in ("mpi", "gloo", "nccl")}))
"""


class HorovodBuildError(RuntimeError):
    """Horovod is missing, or neither probe could tell how it was built."""


class _ProbeFailed(Exception):
    """One way of asking did not answer (the next one is tried)."""


def build_command() -> str:
    """How to (re)build Horovod with TensorFlow, Gloo and MPI in this environment."""
    py = sys.executable
    if BUILD_SCRIPT.is_file():
        how = (
            f"`{py} -m pip uninstall -y horovod && PIP_NO_CACHE_DIR=1 bash {BUILD_SCRIPT} {py}` "
            "(what `make setup` runs; it sets HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "
            "and checks `horovodrun --check-build`; no pip cache, so a wheel built without MPI is not reused)"
        )
    else:
        how = (
            f"`{py} -m pip uninstall -y horovod && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 "
            f"{py} -m pip install --no-cache-dir --no-build-isolation horovod=={HOROVOD_VERSION}`"
        )
    return f"{how}; MPI needs Open MPI and its headers first (apt-get install openmpi-bin libopenmpi-dev)"


def _package_dir(name: str) -> Path | None:
    """A top-level package's folder, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without __spec__
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _probe_library() -> dict:
    tf_dir, hvd_dir = _package_dir("tensorflow"), _package_dir("horovod")
    if hvd_dir is None:
        raise _ProbeFailed(f"no horovod package for {sys.executable}")
    if tf_dir is None:
        raise _ProbeFailed(f"no tensorflow package for {sys.executable}")
    exts = sorted((hvd_dir / "tensorflow").glob("mpi_lib*.so"))
    if not exts:
        raise _ProbeFailed(f"Horovod was built without TensorFlow (no {hvd_dir}/tensorflow/mpi_lib*.so)")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        out = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _PROBE, str(tf_dir), str(exts[0])],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env=env,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _ProbeFailed(f"loading {exts[0].name} with ctypes: {exc}") from exc
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise _ProbeFailed(f"loading {exts[0].name} with ctypes: {last}")
    try:
        built = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise _ProbeFailed(f"loading {exts[0].name} with ctypes printed {lines[-1]!r}") from exc
    return {**built, "tensorflow": True, "via": "ctypes"}


def parse_check_build(text: str) -> dict:
    """``horovodrun --check-build`` output -> ``{"tensorflow", "mpi", "gloo", "nccl"}`` booleans.

    MPI and Gloo are listed twice (controllers, then tensor operations): the
    controllers section decides them."""
    sections: dict[str, dict[str, bool]] = {}
    current = sections.setdefault("", {})
    for line in text.splitlines():
        mark = re.match(r"\s*\[([ Xx])\]\s*(\S.*?)\s*$", line)
        if mark:
            current[mark.group(2).lower()] = mark.group(1) != " "
        elif line.strip().endswith(":"):
            current = sections.setdefault(line.strip().rstrip(":").lower(), {})
    frameworks = sections.get("available frameworks", {})
    controllers = sections.get("available controllers", {})
    ops = sections.get("available tensor operations", {})
    if not controllers:
        raise ValueError(f"no 'Available Controllers' in horovodrun --check-build output: {text.strip()[-300:]!r}")
    return {
        "mpi": controllers.get("mpi", False),
        "gloo": controllers.get("gloo", False),
        "nccl": ops.get("nccl", False),
        "tensorflow": frameworks.get("tensorflow", False),
    }


def _probe_check_build() -> dict:
    local = Path(sys.executable).parent / "horovodrun"
    exe = str(local) if local.exists() else shutil.which("horovodrun")
    if exe is None:
        raise _ProbeFailed(f"no horovodrun next to {sys.executable} or on PATH")
    try:
        out = subprocess.run(
            [exe, "--check-build"],
            capture_output=True,
            text=True,
            timeout=CHECK_BUILD_TIMEOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _ProbeFailed(f"{exe} --check-build: {exc}") from exc
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise _ProbeFailed(f"{exe} --check-build failed: {last}")
    try:
        return {**parse_check_build(out.stdout), "via": "horovodrun --check-build"}
    except ValueError as exc:
        raise _ProbeFailed(str(exc)) from exc


@functools.lru_cache(maxsize=1)
def horovod_build() -> dict:
    """``{"mpi", "gloo", "nccl", "tensorflow"}``: what the installed Horovod was built
    with (booleans), and ``"via"``: which probe answered. Cached for the process;
    never imports TensorFlow or Horovod here.

    Raises :class:`HorovodBuildError` when Horovod is missing or cannot be loaded."""
    reasons = []
    for probe in (_probe_library, _probe_check_build):
        try:
            return probe()
        except _ProbeFailed as exc:
            reasons.append(str(exc))
    raise HorovodBuildError(
        f"Horovod is not installed or cannot be loaded for {sys.executable} ({'; '.join(reasons)}); "
        f"build it: {build_command()}"
    )


def describe(build: dict) -> str:
    """``"MPI: no, Gloo: yes, NCCL: no, TensorFlow: yes"`` for messages."""
    names = {"mpi": "MPI", "gloo": "Gloo", "nccl": "NCCL", "tensorflow": "TensorFlow"}
    return ", ".join(f"{label}: {'yes' if build.get(key) else 'no'}" for key, label in names.items())
