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
