"""What a grading kernel may see: the spec of its file system (built by :mod:`lab_utils.grading.kernel`).

::

    package = kernel_package(batch_folder / "kernel-lab_utils")   # once per batch
    spec = view_spec(box, uid=61001, disk=box / "disk", cwd=folder, package=package,
                     references=[(lab, path)], data=[keras_home], env={...})
    write_spec(spec, box / "view.json")

The kernel sees the system's programs and libraries, the Python environment, a copy of
``lab_utils`` without the autograder's own modules (:data:`KERNEL_GRADING` are the only
modules of ``lab_utils.grading`` it holds, and ``lab_utils.hub`` is left out), the lab's
reference scripts that its tests run (:func:`references_needed`, each file alone), the
dataset files, and the sandbox's disk. Nothing else: no checkout (its ``.git``, the course,
``grading/source``), no gradebook, no other sandbox, no home folder, no lock the grader
takes.
"""

from __future__ import annotations

import compileall
import json
import os
import re
import shutil
import sys
from pathlib import Path

import lab_utils

__all__ = [
    "KERNEL_GRADING",
    "REFERENCE_DIR",
    "KERAS_DIR",
    "kernel_package",
    "references_needed",
    "view_spec",
    "write_spec",
]

#: the modules of lab_utils.grading a kernel may import: what test cells and the labs call (and
#: settings.py's reader of a due time, with the file reads it uses)
KERNEL_GRADING = ("__init__.py", "cells.py", "handin.py", "late.py", "layout.py", "safefiles.py", "schedule.py",
                  "scripts.py", "selfcheck.py", "settings.py", "throughput.py")  # fmt: skip
#: where the view shows the reference scripts and the Keras dataset folder
REFERENCE_DIR = "/run/labgrade/reference"
KERAS_DIR = "/run/labgrade/keras"
_CALLS = re.compile(
    r"""reference_script\(\s*\\?["'](?P<lab1>\w+)\\?["']\s*,\s*\\?["'](?P<name1>[\w.]+)\\?["']"""
    r"""|find_lab_script\(\s*\\?["'](?P<name2>[\w.]+)\\?["']\s*,\s*lab\s*=\s*\\?["'](?P<lab2>\w+)\\?["']"""
)


def kernel_package(dest: Path) -> Path:
    """A copy of ``lab_utils`` for grading kernels at ``dest`` (made, compiled, read-only for
    them): everything the labs import, without ``hub`` and without the modules of
    ``grading`` other than :data:`KERNEL_GRADING`. Returns ``dest``."""
    src = Path(lab_utils.__file__).resolve().parent

    def skip(folder: str, names: list[str]) -> set[str]:
        here = Path(folder).resolve()
        dropped = {n for n in names if n == "__pycache__"}
        if here == src:
            dropped.add("hub")
        if here == src / "grading":
            dropped |= {n for n in names if n not in KERNEL_GRADING}
        return dropped

    shutil.copytree(src, dest, ignore=skip)
    compileall.compile_dir(str(dest), quiet=1, workers=1)
    for folder, _dirs, files in os.walk(dest):
        os.chmod(folder, 0o755)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o644)
    return dest


def references_needed(notebook: Path | str) -> list[tuple[str, str]]:
    """``(lab, script)`` of every reference script the lab's instructor notebook runs: its
    ``reference_script("lab", "name")`` and ``find_lab_script("name", lab="lab")`` calls."""
    text = Path(notebook).read_text(encoding="utf-8")
    found = set()
    for m in _CALLS.finditer(text):
        found.add((m["lab1"], m["name1"]) if m["lab1"] else (m["lab2"], m["name2"]))
    return sorted(found)


def _python_dirs() -> list[str]:
    """The Python environment's folders: the interpreter's prefix and the virtual environment's
    (one of them when the other is inside it)."""
    dirs = sorted({os.path.abspath(p) for p in (sys.base_prefix, sys.prefix)})
    return [d for d in dirs if not any(d != o and d.startswith(o + os.sep) for o in dirs)]


def view_spec(
    box: Path,
    *,
    uid: int,
    disk: Path,
    cwd: Path,
    package: Path,
    references: list[tuple[str, Path]] = (),
    keras_home: Path | None = None,
    env: dict[str, str] | None = None,
) -> dict:
    """The view of the kernel of the sandbox at ``box``: see the module doc. ``references``:
    ``(lab, file)`` of the scripts shown; ``cwd``: the notebook's folder (``disk/work`` there)."""
    readonly = [[d, d] for d in _python_dirs()]
    readonly.append([str(package), str(Path(lab_utils.__file__).resolve().parent)])
    for lab, path in references:
        readonly.append([str(path), f"{REFERENCE_DIR}/{lab}/{Path(path).name}"])
    extra = dict(env or {})
    if references:
        extra["LAB_GRADING_REFERENCE_DIR"] = REFERENCE_DIR
    if keras_home is not None and Path(keras_home).is_dir():
        readonly.append([str(keras_home), KERAS_DIR])
        extra["KERAS_HOME"] = KERAS_DIR
    home = disk / "home"
    return {
        "uid": int(uid),
        "root": str(box / "root"),
        "disk": {name: str(disk / name) for name in ("tmp", "shm", "lock")},
        "readonly": readonly,
        "writable": [[str(home), str(home)], [str(disk / "work"), str(cwd)]],
        "home": str(home),
        "cwd": str(cwd),
        "env": extra,
    }


def write_spec(spec: dict, path: Path) -> Path:
    """Write ``spec`` where only root reads it; make its new root's mount point."""
    Path(spec["root"]).mkdir(mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(spec, f, indent=1)
    return path
