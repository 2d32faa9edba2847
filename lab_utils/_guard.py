"""Parent-death guard: ``python -m lab_utils._guard --parent PID [--grace S] [--orphan-removes PATH] -- cmd ...``

The launcher (:mod:`lab_utils.cluster`) starts every task through this small
middleman, in the spirit of Horovod's ``safe_shell_exec``:

- the guard is the leader of a new session and process group (the launcher
  starts it with ``start_new_session=True``); the command runs in that group;
- it marks itself a *child subreaper*, so grandchildren that lose their parent
  (mpirun's ranks, Horovod's workers) are re-parented to the guard and stay
  visible to it;
- it watches the parent (the notebook kernel) through a pidfd, the command
  through another pidfd and SIGTERM/SIGINT/SIGHUP through a wake-up pipe; when
  the parent dies (even by SIGKILL) or it is told to stop, it terminates the
  whole tree: SIGTERM, ``grace`` seconds, SIGKILL;
- when the command ends by itself, stray descendants are stopped the same way
  and the guard ends the way the command did (same exit code, or same signal);
- ``--orphan-removes PATH`` (repeatable): files or folders only the parent would have
  removed (a server's log, an emulated host's TMPDIR), removed by the guard once the tree
  is gone, when the parent died.

It imports nothing heavy (no TensorFlow, no NumPy): a few milliseconds of start-up.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _set_subreaper() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: orphans go to init, the group kill still works
        pass


def descendants() -> list[int]:
    """PIDs of every live descendant of this process (from /proc, no psutil needed)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) < 2 or fields[0] == b"Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    out, todo = [], [os.getpid()]
    while todo:
        for kid in children.get(todo.pop(), []):
            out.append(kid)
            todo.append(kid)
    return out


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(sig: int, pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def terminate_tree(grace: float) -> None:
    """SIGTERM every descendant, wait up to ``grace`` s, then SIGKILL what is left."""
    pids = descendants()
    if not pids:
        return
    _signal_all(signal.SIGTERM, pids)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap_zombies()
        pids = descendants()
        if not pids:
            return
        time.sleep(0.02)  # probing under a deadline
    for _ in range(3):  # orphans may be re-parented to us while we kill
        pids = descendants()
        if not pids:
            break
        _signal_all(signal.SIGKILL, pids)
        time.sleep(0.02)
        _reap_zombies()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return -1
    except (OSError, AttributeError):  # old kernel / no pidfd: fall back to polling
        return None


def run(parent: int, grace: float, cmd: list[str], orphan_removes: tuple[str, ...] = ()) -> int:
    _set_subreaper()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    for sig in _STOP_SIGNALS:
        signal.signal(sig, lambda *_: None)  # wakes the poll below through the pipe

    parent_fd = _pidfd(parent)
    if parent_fd == -1 or os.getppid() != parent:
        return 125  # the parent died before we started: run nothing
    try:
        child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"lab_utils._guard: cannot start {cmd[0]!r}: {exc}", flush=True)
        return 127
    child_fd = _pidfd(child.pid)

    poller = select.poll()
    for fd in (parent_fd, child_fd, wake_r):
        if fd is not None and fd >= 0:
            poller.register(fd, select.POLLIN)
    fallback = parent_fd is None or child_fd is None
    stop = orphaned = False
    while True:
        ready = {fd for fd, _ in poller.poll(100 if fallback else None)}
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
            stop = True
        if child.poll() is not None:
            break
        if parent_fd in ready or (parent_fd is None and os.getppid() != parent):
            stop = orphaned = True
        if stop:
            break
    if stop:
        terminate_tree(grace)
    code = child.wait()
    terminate_tree(grace)  # strays the command left behind
    for path in orphan_removes if orphaned else ():
        remove(path)
    if code < 0:
        signal.set_wakeup_fd(-1)
        try:
            signal.signal(-code, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL/SIGSTOP: no handler to reset
            pass
        os.kill(os.getpid(), -code)  # end the way the command ended
        return 128 - code
    return code


def _gone_is_fine(function, name, exc_info) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def remove(path: str | os.PathLike) -> None:
    """Remove a file or a folder tree; what is already gone (another cleanup first) is fine."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, onerror=_gone_is_fine)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parent, grace, orphan_removes = os.getppid(), 3.0, []
    if "--" not in argv:
        print(
            "usage: python -m lab_utils._guard --parent PID [--grace S] [--orphan-removes PATH] -- cmd ...", flush=True
        )
        return 2
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1 :]
    i = 0
    while i < len(opts):
        if opts[i] == "--parent":
            parent = int(opts[i + 1])
        elif opts[i] == "--grace":
            grace = float(opts[i + 1])
        elif opts[i] == "--orphan-removes":
            orphan_removes.append(opts[i + 1])
        else:
            print(f"lab_utils._guard: unknown option {opts[i]!r}", flush=True)
            return 2
        i += 2
    if not cmd:
        print("lab_utils._guard: no command after --", flush=True)
        return 2
    return run(parent, grace, cmd, tuple(orphan_removes))


if __name__ == "__main__":
    sys.exit(main())
