"""Options declared once, taken as keyword arguments everywhere.

Several functions take the same group of settings: every launcher (``TFCluster``,
``MPIJob``) the job's life-cycle settings, every ``run_*`` of the labs how a run is
watched and bounded. The group is a frozen dataclass; :func:`keyword_options` lets a
function receive it as one ``options`` object while its callers still pass the fields as
keyword arguments, and ``help()`` and tab completion still list them.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any


def keyword_options(options_type: type, **defaults: Any) -> Callable[[Callable], Callable]:
    """Decorator for ``fn(..., options: options_type)``: callers pass the dataclass's fields as
    keyword arguments (defaults: the dataclass's, overridden by ``defaults``) and ``fn`` gets
    them as one ``options`` object. An unknown keyword is a ``TypeError`` as usual."""
    base = options_type(**defaults)
    names = tuple(f.name for f in fields(options_type))

    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.name != "options"]
        rest = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]  # **kwargs stays last
        params = [p for p in params if p not in rest] + [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=getattr(base, f.name), annotation=f.type)
            for f in fields(options_type)
        ]
        params += rest

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any):
            chosen = {name: kwargs.pop(name) for name in names if name in kwargs}
            return fn(*args, options=replace(base, **chosen), **kwargs)

        call.__signature__ = sig.replace(parameters=params)
        return call

    return wrap
