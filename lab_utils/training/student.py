"""Loading a student's file (both sides): ``towers.py``, ``ring.py``, ``compressors.py``,
``two_tasks.py``, a training script.

The file is imported afresh from its path on every call, under the name
``student_<stem>``: an edited and re-run ``%%writefile`` cell is seen (``import ring``
would keep the first version), and a traceback names the student's own file. A missing
file or a missing function is an error that says which cell to run or what to define.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import ModuleType


def load_student(path: str | os.PathLike, *, cell: bool = True) -> ModuleType:
    """The student's module at ``path``. ``ImportError`` if it is not a Python script (its
    name does not end in ``.py``); ``FileNotFoundError`` (naming the ``%%writefile`` cell
    when ``cell``) if there is none."""
    path = Path(path)
    if path.suffix != ".py":
        raise ImportError(f"{path}: not a Python script")
    if not path.is_file():
        hint = f": run the `%%writefile {path.name}` cell first" if cell else ""
        raise FileNotFoundError(f"{path} not found{hint}")
    spec = importlib.util.spec_from_file_location(f"student_{path.stem}", path.resolve())
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python script")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def student_function(path: str | os.PathLike, name: str, signature: str) -> object:
    """``name`` from the student's file at ``path``; ``ImportError`` saying the file
    defines no function ``signature`` if it is missing or not callable."""
    fn = getattr(load_student(path), name, None)
    if not callable(fn):
        raise ImportError(f"{path} defines no function {signature}")
    return fn


def replaced() -> list[str]:
    """What code in this process replaced of the lab's own (:mod:`lab_utils.integrity`, the same
    check the grader's probe makes of a kernel): a function of a ``lab_utils`` module or of one of
    its classes whose code was not loaded from Python's, the environment's or lab_utils' folders,
    a clock of ``time`` or a builtin that is no longer Python's own. A task that runs a student's
    code calls :func:`check_untouched` before it reports what it measured."""
    import sys

    import lab_utils
    from lab_utils import integrity

    return integrity.replaced(
        tuple(os.path.join(p, "") for p in (sys.base_prefix, sys.prefix, os.path.dirname(lab_utils.__file__)))
    )


def check_untouched(what: str) -> None:
    """Raise ``RuntimeError`` naming what the student's code replaced (:func:`replaced`), before a
    task reports ``what`` it measured: a figure the lab checks must not come from code that
    changed how it is measured."""
    bad = replaced()
    if bad:
        raise RuntimeError(
            f"your code replaced {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}: the lab measures {what} "
            "with its own code, and a run that changes it measures nothing. Leave lab_utils, time and the "
            "builtins as they are"
        )
