"""Start the graded notebook's IPython kernel as an unprivileged user of its own.

The grading worker (root, inside the sandbox) registers this as the kernel::

    python -m lab_utils.grading.kernel --uid 61001 --home /tmp/labgrade-x/disk/home \
        [--tmp /tmp/labgrade-x/disk/tmp --keep /tmp/labgrade-x ...] -f {connection_file}

It copies the connection file (which jupyter_client writes readable by root only)
into the new user's home, hands the notebook's folder to that user, drops every
privilege, and execs ``ipykernel_launcher``. Student code then cannot read the
grader's course (gradebook with the hidden tests, instructor notebooks), cannot
signal the grader or another submission, and cannot leave the sandbox's cgroup.
With ``--tmp``, in a mount namespace of its own, ``/tmp`` and ``/var/tmp`` are that
folder (on the sandbox's size-limited tmpfs), with each ``--keep`` path (the sandbox and
the batch's timing lock, themselves in the machine's /tmp) still at its own path: what the kernel writes anywhere it may
write counts against the disk limit, and never reaches the machine's disk.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def _mount(libc, source: str | None, target: str, flags: int) -> None:
    if libc.mount(source.encode() if source else None, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def private_tmp(tmp: Path, keep: list[Path]) -> None:
    """This process's own mount namespace, where /tmp and /var/tmp are ``tmp`` and each
    folder or file of ``keep`` is still reachable at its path (bound again inside the new
    /tmp when it was under it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    _mount(libc, None, "/", MS_REC | MS_PRIVATE)
    tmp_fd = os.open(tmp, os.O_PATH | os.O_DIRECTORY)
    keep_fds = {path: os.open(path, os.O_PATH) for path in keep}
    try:
        for target in ("/var/tmp", "/tmp"):
            if not os.path.isdir(target):
                continue
            _mount(libc, f"/proc/self/fd/{tmp_fd}", target, MS_BIND)
            for path, fd in keep_fds.items():
                if not path.is_relative_to(target):
                    continue
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.makedirs(path, mode=0o711, exist_ok=True)
                else:  # a file: an empty one to mount it on
                    os.makedirs(path.parent, mode=0o711, exist_ok=True)
                    path.touch()
                _mount(libc, f"/proc/self/fd/{fd}", str(path), MS_BIND | MS_REC)
    finally:
        os.close(tmp_fd)
        for fd in keep_fds.values():
            os.close(fd)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.grading.kernel")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("--tmp", help="the kernel's /tmp, /var/tmp and TMPDIR (needs root: a mount namespace)")
    parser.add_argument(
        "--keep", action="append", default=[], help="with --tmp: a folder or file under /tmp that stays reachable"
    )
    parser.add_argument("-f", dest="connection_file", required=True)
    args = parser.parse_args(argv)
    if args.uid <= 0:
        raise SystemExit(f"refusing to run the kernel as uid {args.uid}")
    home = Path(args.home)
    tmp = Path(args.tmp) if args.tmp else home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    settings = Path(args.connection_file).read_text()  # before /tmp changes: it may be there
    if args.tmp:
        cwd = os.getcwd()
        private_tmp(tmp, [Path(k).resolve() for k in args.keep])
        os.chdir(cwd)  # the same path, now through the folder kept reachable
        tmp = Path("/tmp")
    connection = home / "kernel-connection.json"
    connection.write_text(settings)
    connection.chmod(0o600)
    _chown_tree(home, args.uid, args.uid)
    _chown_tree(Path.cwd(), args.uid, args.uid)  # the notebook's folder: %%writefile, runs/
    os.environ.update(HOME=str(home), TMPDIR=str(tmp), USER="labgrade", LOGNAME="labgrade")
    os.environ.pop("LABS_RUN_ROOT", None)
    os.setgroups([])
    os.setgid(args.uid)
    os.setuid(args.uid)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection)])


if __name__ == "__main__":
    main()
