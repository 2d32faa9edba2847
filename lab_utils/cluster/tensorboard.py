"""TensorBoard for a notebook (Lab 1, Part 3): one server per log folder, on a port the OS
picks, that dies with the kernel.

::

    from lab_utils.cluster.tensorboard import tensorboard
    server = tensorboard("runs/lab01")      # started, or the one already serving that folder
    server.port, server.url
    server.stop()                           # or just let the kernel end: the server goes with it

TensorBoard's own ``%tensorboard`` magic starts the server with a bare ``Popen`` on the
fixed port 6006: it outlives the kernel (and the Jupyter server), and two students on one
machine fight over the port. Here the server runs under the same parent-death guard as
every cluster task (:mod:`lab_utils._guard`), binds to 127.0.0.1 on a free port, and is
ready once it prints its URL; a server that fails says why, with its log's last lines.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab_utils.cluster.process import ClusterError, tail

__all__ = ["TensorBoard", "tensorboard", "stop_all"]

_URL = re.compile(r"TensorBoard \S+ at (http://[^\s/]+:(\d+)/)")
_SERVERS: dict[str, TensorBoard] = {}


class TensorBoard:
    """One TensorBoard server for ``logdir``, started by :meth:`start`."""

    def __init__(self, logdir: str | os.PathLike, *, ready_timeout: float = 90.0, grace: float = 3.0):
        self.logdir = str(Path(logdir).resolve())
        self.ready_timeout, self.grace = float(ready_timeout), float(grace)
        self.popen: subprocess.Popen | None = None
        self.port: int | None = None
        self.url: str | None = None
        self.log_path: Path | None = None

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> TensorBoard:
        if not Path(self.logdir).is_dir():
            raise ValueError(f"no log folder {self.logdir}: train first, it writes the event files there")
        fd, log = tempfile.mkstemp(prefix="tensorboard-", suffix=".log")
        self.log_path = Path(log)
        guard = [sys.executable, "-m", "lab_utils._guard", "--parent", str(os.getpid()), "--grace", str(self.grace)]
        guard += ["--orphan-removes", log]  # a SIGKILLed kernel removes nothing
        server = [sys.executable, "-m", "tensorboard.main", "--logdir", self.logdir, "--host", "127.0.0.1"]
        with os.fdopen(fd, "wb") as out:
            self.popen = subprocess.Popen(
                [*guard, "--", *server, "--port", "0"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
            )
        deadline = time.monotonic() + self.ready_timeout
        while (found := _URL.search(self.log_path.read_text(errors="replace"))) is None:
            if self.popen.poll() is not None:
                error = ClusterError(
                    f"TensorBoard exited {self.popen.returncode} before serving {self.logdir}",
                    task="tensorboard",
                    exit_code=self.popen.returncode,
                    log_tail=tail(self.log_path),
                )
                self.stop()
                raise error
            if time.monotonic() > deadline:
                error = ClusterError(
                    f"TensorBoard did not serve {self.logdir} within {self.ready_timeout:.0f} s",
                    task="tensorboard",
                    log_tail=tail(self.log_path),
                )
                self.stop()
                raise error
            time.sleep(0.1)  # polling its log for the URL line under a deadline
        self.url, self.port = found.group(1), int(found.group(2))
        return self

    def stop(self) -> None:
        """SIGTERM to the guard, which stops the server (SIGKILL after its grace), then
        remove its log (what an error needed of it is in the error's log tail)."""
        if self.popen is not None and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout=self.grace + 10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        if self.log_path is not None:
            self.log_path.unlink(missing_ok=True)
            self.log_path = None

    def __repr__(self) -> str:
        state = f"serving {self.url}" if self.running else "stopped"
        return f"<TensorBoard {self.logdir}: {state}>"


def tensorboard(logdir: str | os.PathLike, **kwargs) -> TensorBoard:
    """The server for ``logdir``: the one this kernel already runs, else a new one."""
    key = str(Path(logdir).resolve())
    server = _SERVERS.get(key)
    if server is None or not server.running:
        server = _SERVERS[key] = TensorBoard(logdir, **kwargs).start()
    return server


@atexit.register
def stop_all() -> None:
    """Stop every server this process started (the guards do it anyway if it is killed)."""
    for server in list(_SERVERS.values()):
        server.stop()
    _SERVERS.clear()
