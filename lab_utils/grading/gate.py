"""The turn-taking between the grading batch and one sandbox's worker: two pipes.

The batch keeps notebooks executing on ``jobs`` cores at once (each takes its lab's
``cpus``) and lets the next sandboxes prepare meanwhile (worker start, private course,
mounts, nbgrader's bookkeeping), so that this work, and the feedback of the ones
before, hide behind running notebooks instead of adding to the batch's wall time::

    gate = Gate()
    box.start(argv, ..., pass_fds=gate.worker_fds)   # spec: gate.worker_spec()
    gate.started()
    if gate.wait_for(READY, timeout=120):            # the worker is prepared
        gate.go()                                    # its kernel may start now
        gate.wait_for(EXECUTED, timeout=limit)       # the notebook is done

How many cores execute, and how many sandboxes prepare ahead, are :class:`Turns` (a
counting semaphore, taken several at a time, that a stopping batch opens for good). The worker's side is
:class:`~lab_utils.grading.execute.SandboxExecute` (its
``go_fd`` and ``note_fd``): it says ``ready`` just before it starts the kernel, waits
for the go, and says ``executed`` once the kernel is shut down. The pipes are
never inherited by the kernel, so student code can neither skip the queue nor
say it is done.
"""

from __future__ import annotations

import os
import select
import threading
import time

__all__ = ["Gate", "Turns", "Admission", "READY", "EXECUTED", "notify", "wait_for_go"]

READY = "ready"
EXECUTED = "executed"


class Gate:
    """The batch's ends of a worker's two pipes (``note``: worker -> batch; ``go``: batch -> worker)."""

    def __init__(self):
        self._note_r, self._note_w = os.pipe()
        self._go_r, self._go_w = os.pipe()
        self._buffer = b""

    @property
    def worker_fds(self) -> tuple[int, int]:
        """(go_fd, note_fd): the ends the worker inherits (``Popen(pass_fds=...)``)."""
        return self._go_r, self._note_w

    def worker_spec(self) -> dict:
        return {"go_fd": self._go_r, "note_fd": self._note_w}

    def started(self) -> None:
        """Close the worker's ends here, once it has them: its exit then reads as end of file."""
        for attr in ("_go_r", "_note_w"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)

    def wait_for(self, word: str, timeout: float) -> bool | None:
        """True once the worker has said ``word``; False when it exited first (end of
        file); None when ``timeout`` seconds passed without either."""
        deadline = time.monotonic() + timeout
        while True:
            lines = self._buffer.split(b"\n")
            self._buffer = lines.pop()
            if word.encode() in lines:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._note_r], [], [], left)
            if not ready:
                return None
            chunk = os.read(self._note_r, 4096)
            if not chunk:
                return False
            self._buffer += chunk

    def go(self) -> bool:
        """Let the worker start its kernel; False when it is gone already."""
        try:
            os.write(self._go_w, b"g")
            return True
        except BrokenPipeError:
            return False

    def close(self) -> None:
        self.started()
        for attr in ("_note_r", "_go_w"):
            fd = getattr(self, attr)
            if fd is not None:
                os.close(fd)
                setattr(self, attr, None)


class Turns:
    """``n`` turns to take and give back, several at a time (a notebook that needs two
    cores takes two); once stopped, every taker gets False."""

    def __init__(self, n: int):
        self.total = self.free = int(n)
        self.stopped = False
        self.cond = threading.Condition()

    def take(self, k: int = 1) -> bool:
        if not 1 <= k <= self.total:
            raise ValueError(f"cannot take {k} of {self.total} turns")
        with self.cond:
            self.cond.wait_for(lambda: self.free >= k or self.stopped)
            if self.stopped:
                return False
            self.free -= k
            return True

    def give(self, k: int = 1) -> None:
        with self.cond:
            self.free += k
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class Admission:
    """One submission's hold on a :class:`Turns`, given back once (``held`` False: the batch stopped)."""

    def __init__(self, turns: Turns):
        self.turns, self.held = turns, turns.take()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.turns.give()


# ----------------------------------------------------------------- worker side
def notify(fd: int, word: str) -> None:
    """Tell the batch ``word`` (no-op without a gate, fd < 0)."""
    if fd >= 0:
        os.write(fd, word.encode() + b"\n")


def wait_for_go(fd: int) -> None:
    """Block until the batch says go (no-op without a gate); raise when the batch went away."""
    if fd >= 0 and not os.read(fd, 1):
        raise RuntimeError("the grading batch closed the gate before this notebook's turn (interrupted?)")
