"""lab_utils: the one package every lab notebook imports.

Small modules and subpackages, one job each (import what you need; nothing here
imports TensorFlow). Generic layers first; they never import ``training`` or ``grading``:

- ``config``: every ``LABS_*`` environment variable, read in one place
- ``resources``: cores and memory this session may really use (cgroups, JupyterHub)
- ``doctor``: is this environment able to run the labs?  ``lab_utils.doctor()``
- ``data``: MNIST and friends, offline fallbacks, sharding for N workers (``data_files``: the
  files themselves, downloaded and read; ``data_cache``: decoded once per user)
- ``cluster``: start, watch and stop TF parameter-server clusters and MPI/Horovod jobs
- ``report``: events (ready, step, result) written by training scripts
- ``metrics``: dstat-like CPU, memory, network and GPU samples per role
- ``models``: graph-mode model and loss builders shared by labs 1-3
- ``display``: notebook or headless? the one-line progress
- ``plots``: every figure
- ``options``: a group of settings declared once as a dataclass and taken as keyword
  arguments (the launchers' ``JobOptions``, the runs' ``RunOptions``)
- ``training``: lab-specific training code, a package per technique (``training.ps``:
  parameter-server training, Labs 2-3), each with a task side and a notebook side
- ``hub``: a class on JupyterHub: ``hand_in()`` and ``feedback()`` for students, the hand-in
  service, collecting and returning for the instructor, a spawner with the class's limits
- ``grading``: helpers used by nbgrader test cells (clamped partial credit, ratios) and the
  course operations (release, autograde, feedback, reference scripts)
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_SUBMODULES = {
    "config",
    "resources",
    "doctor",
    "data",
    "cluster",
    "report",
    "metrics",
    "display",
    "plots",
    "grading",
    "hub",
    "run_labs",
    "models",
    "training",
}


def __getattr__(name):
    # Lazy: `import lab_utils` stays cheap; `lab_utils.doctor()` works in a notebook.
    if name == "doctor":
        return importlib.import_module("lab_utils.doctor").doctor
    if name in _SUBMODULES:
        return importlib.import_module(f"lab_utils.{name}")
    raise AttributeError(f"module 'lab_utils' has no attribute {name!r}")
