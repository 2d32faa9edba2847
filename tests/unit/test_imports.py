"""Importing lab_utils never imports TensorFlow (2-3 s and hundreds of MB): the notebook
kernel of Labs 2-6 never needs it, and a launched task imports it only once its arguments
are checked. One test per package, each importing every module of it in a fresh process:
a module added later is covered without a test of its own."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import lab_utils

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(lab_utils.__path__, "lab_utils.") if not m.name.endswith(".__main__")
)
PACKAGES = sorted({".".join(m.split(".")[:2]) for m in MODULES})


def test_every_module_is_covered():
    assert len(MODULES) > 50 and "lab_utils.training.ps" in MODULES and "lab_utils.grading.selfcheck" in MODULES


@pytest.mark.parametrize("package", PACKAGES)
def test_importing_a_package_s_modules_does_not_import_tensorflow(package):
    modules = [m for m in MODULES if m == package or m.startswith(package + ".")]
    code = f"import importlib, sys\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
    code += "print(sorted(m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.'))[:3])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"importing {package}'s modules imported TensorFlow: {out.stdout}"


def test_importing_tensorflow_through_lab_utils_writes_nothing_to_stderr():
    """TF 2.16+ write absl's and oneDNN's notices to fd 2 at import whatever TF_CPP_MIN_LOG_LEVEL
    says; a notebook shows them, and nbgrader scores a test cell 0 for them. import_tensorflow()
    leaves none, on either stack."""
    code = "from lab_utils.models import import_tensorflow\ntf = import_tensorflow()\nprint(tf.__version__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    assert proc.stderr == ""


def test_the_native_stderr_filter_drops_the_noise_only(capfd):
    import os
    import re

    from lab_utils.models import TF_IMPORT_NOISE, native_stderr_without

    noise = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1796043912.387944   21614 port.cc:153] oneDNN custom operations are on. You may see\n"
    )
    with native_stderr_without(TF_IMPORT_NOISE):
        os.write(2, noise.encode() + b"E0000 a real error, kept\n")
        sys.stderr.write("a Python warning, kept\n")
    with pytest.raises(ValueError), native_stderr_without(re.compile("never")):
        os.write(2, b"written before the failure, kept\n")
        raise ValueError("the block failed")
    err = capfd.readouterr().err
    assert "InitializeLog" not in err and "oneDNN" not in err
    assert "E0000 a real error, kept\n" in err and "a Python warning, kept\n" in err
    assert "written before the failure, kept\n" in err
