"""Who is watching, and how to show a line of progress to them.

One answer to two questions every long-running helper asks:

* :func:`in_notebook`: is this code running inside a Jupyter kernel (so a
  display handle can be updated in place)?
* :func:`is_headless`: is *nobody* watching (papermill, nbgrader, nbconvert,
  plain Python, a terminal IPython)? Then a widget would never be seen, so draw
  a static figure instead. ``LABS_HEADLESS=0/1`` forces the answer.

:class:`StatusLine` is the one-line progress that ``TFCluster.wait()`` and
``MPIJob.wait()`` show: a display handle updated in place in a notebook, ``\\r``
in a terminal, one line per change otherwise. Always stdout (stderr in a graded
cell scores it 0), never a widget.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from lab_utils import config

_HEADLESS_WORDS = ("papermill", "nbgrader", "nbconvert", "nbclient", "pytest", "run_labs")
_FRONTEND_WORDS = (
    "jupyter-lab",
    "jupyterlab",
    "jupyter-notebook",
    "jupyter_server",
    "jupyter-server",
    "singleuser",
    "voila",
    "vscode",
    "code-server",
)


def _kernel_shell():
    """The IPython shell if this process is a Jupyter kernel, else None."""
    if "ipykernel" not in sys.modules and "IPython" not in sys.modules:
        return None
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def in_notebook() -> bool:
    """True inside a Jupyter kernel (whether or not a person watches it)."""
    return _kernel_shell() is not None


def is_headless(env: Mapping[str, str] | None = None) -> bool:
    """True when nobody can see a live widget: papermill, nbgrader, nbconvert, plain
    Python, terminal IPython. ``LABS_HEADLESS=0/1`` forces the answer."""
    env = os.environ if env is None else env
    forced = config.flag(config.HEADLESS, env)
    if forced is not None:
        return forced
    if env.get("NBGRADER_EXECUTION") or any(k.startswith("PAPERMILL") for k in env):
        return True
    if _kernel_shell() is None:
        return True
    return launched_headless(psutil.Process())


def launched_headless(proc: psutil.Process, depth: int = 4) -> bool:
    """Look at the kernel's ancestors: a papermill/nbgrader/nbconvert runner means
    headless, a Jupyter server or an editor means a frontend; unknown means headless
    (a static figure is always seen; a widget without a frontend never is)."""
    for _ in range(depth):
        try:
            proc = proc.parent()
            if proc is None:
                break
            cmd = _program(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            break
        if any(word in cmd for word in _HEADLESS_WORDS):
            return True
        if any(word in cmd for word in _FRONTEND_WORDS):
            return False
    return True


def _program(argv: list[str]) -> str:
    """What a process runs, as ``launched_headless`` matches it: the base names of its
    interpreter, script or ``-m`` module and subcommand, joined by "-" ("python-jupyter-lab"),
    never its other arguments (a folder named after pytest is no test runner)."""
    words = [Path(a).name for a in argv[:4] if a == "-m" or not a.startswith("-")][:3]
    return "-".join(words).lower()


class _Text:
    """A display object whose text/plain form is the line itself."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


class StatusLine:
    """One status line, refreshed at most every ``every`` seconds.

    ``render()`` returns the current line. In a notebook the line is a display
    handle updated in place; in a terminal it is rewritten with ``\\r``; otherwise
    (a log file, papermill) a new line is printed only when the part before the
    first ``" | "`` changes, and once at the end."""

    def __init__(self, render: Callable[[], str], every: float = 0.5):
        self.render, self.every = render, every
        self.last: str | None = None
        self.handle = None
        self.notebook = in_notebook()
        self.tty = False
        if not self.notebook:
            try:
                self.tty = sys.stdout.isatty()
            except (AttributeError, ValueError):
                self.tty = False
        self._next = 0.0

    def update(self, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now < self._next:
            return
        self._next = now + self.every
        line = self.render()
        if self.notebook:
            from IPython.display import display

            if self.handle is None:
                self.handle = display(_Text(line), display_id=True)
            else:
                self.handle.update(_Text(line))
        elif self.tty:
            sys.stdout.write("\r" + line.ljust(79) + ("\n" if final else ""))
            sys.stdout.flush()
        elif final or line.split(" | ")[0] != (self.last or "").split(" | ")[0]:
            print(line, flush=True)
        self.last = line
