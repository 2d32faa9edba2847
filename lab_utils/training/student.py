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


#: builtins and clocks a task's measurements use: student code that replaces one changes them
_BUILTINS = ("isinstance", "type", "len", "abs", "sum", "min", "max", "float", "int", "getattr", "open", "__import__")
_CLOCKS = ("perf_counter", "monotonic", "time", "process_time", "perf_counter_ns", "monotonic_ns", "time_ns")


def replaced() -> list[str]:
    """What code in this process replaced of the lab's own, as the grader's integrity probe asks
    of a kernel (:mod:`lab_utils.grading.judge`): a function of a ``lab_utils`` module or of one
    of its classes whose code was not loaded from Python's, the environment's or lab_utils'
    folders, a clock of ``time`` or a builtin that is no longer Python's own. A task that runs a
    student's code calls :func:`check_untouched` before it reports what it measured."""
    import builtins
    import sys
    import time
    import types

    import lab_utils

    trusted = tuple(os.path.join(p, "") for p in (sys.base_prefix, sys.prefix, os.path.dirname(lab_utils.__file__)))
    builtin = type(len)

    def foreign(f, generated: bool = False) -> bool:
        code = getattr(f, "__code__", None)
        if code is None or code.co_filename.startswith(trusted):
            return False
        name = getattr(f, "__name__", "")  # a dataclass's own methods, which Python writes from a string
        return not (generated and code.co_filename == "<string>" and name.startswith("__") and name.endswith("__"))

    bad = [f"builtins.{n}" for n in _BUILTINS if type(vars(builtins).get(n)) not in (builtin, type)]
    bad += [f"time.{n}" for n in _CLOCKS if type(vars(time).get(n)) is not builtin]
    for name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType):
            continue
        name = getattr(getattr(module, "__spec__", None), "name", None) or name  # a task run with -m: __main__
        if not (name == "lab_utils" or name.startswith("lab_utils.")):
            continue
        for attr, f in list(vars(module).items()):
            if foreign(f):
                bad.append(f"{name}.{attr}")
            elif isinstance(f, type) and getattr(f, "__module__", "") == name:
                generated = "__dataclass_fields__" in vars(f) or "_fields" in vars(f)
                bad += [
                    f"{name}.{attr}.{m}"
                    for m, g in list(vars(f).items())
                    if foreign(getattr(g, "__func__", g), generated)
                ]
    return sorted(set(bad))


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
