"""Lazy package attributes: ``ps.train_worker`` without importing what the caller does not use.

A technique package (``ps``, ``allreduce``, ...) imports nothing when it is imported.
An attribute is a submodule (``ps.runs``) or, failing that, a name of the package's
*front* module: the one its students' own code calls (``ps.train_worker`` is
``ps.task.train_worker``; ``netexp.run_netexp`` is ``netexp.runs.run_netexp``). So a training script
never imports the kernel side, and a notebook never imports the task side by accident.
(PEP 562's module ``__getattr__``.)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable


def front(package: str, module: str) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose names are ``package.module``'s."""

    def __getattr__(name: str) -> object:
        if not name.startswith("__") and importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        target = importlib.import_module(f"{package}.{module}")
        try:
            return getattr(target, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r} (nor has {target.__name__})") from None

    def __dir__() -> list[str]:
        target = importlib.import_module(f"{package}.{module}")
        return sorted(n for n in vars(target) if not n.startswith("_"))

    return __getattr__, __dir__
