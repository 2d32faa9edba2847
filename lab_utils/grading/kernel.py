"""Start the graded notebook's IPython kernel as an unprivileged user, in a file system of its own.

The grading worker (root, inside the sandbox) registers this as the kernel::

    python -m lab_utils.grading.kernel --view /tmp/labgrade-x/view.json -f {connection_file}

(Without root, ``--environment-only``: the kernel runs as the grader, as it is, with only its
environment scrubbed as below: what the grader's account may read, the kernel may.)

``view.json`` (root only, written by the worker: :func:`lab_utils.grading.view.write_spec`)
says what the kernel may see. In a mount namespace of its own this launcher builds a new
root file system holding only that: the system's programs and libraries (``/usr``, ``/etc``,
``/lib``..., read-only), ``/proc``, ``/sys`` (read-only), a ``/dev`` of the harmless devices,
the Python environment and the kernel's ``lab_utils`` (read-only, each at its own path), the
lab's reference scripts and dataset files, and the sandbox's disk: the notebook's folder,
the kernel's home, ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``, all on one
size-limited tmpfs. It then ``pivot_root``s into it, so that nothing else of the machine
(another checkout's ``.git``, the course, other users' files, the grader's temporary
folders) has a path the kernel could name, drops every privilege (no setuid programs
either: ``PR_SET_NO_NEW_PRIVS``), keeps only the environment variables the labs need
(nothing named like a token, secret, key or password), and execs ``ipykernel_launcher``.

Root never follows a path the student controls: the view is built before any student
code runs in it (and anew at each restart, on a fresh tmpfs), every folder made on the
student's disk is made one component at a time without following links, mounts target
file descriptors, and the connection file is written with ``O_EXCL | O_NOFOLLOW`` into a
folder only root can write.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import re
import sys

CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_NO_NEW_PRIVS = 38
#: pivot_root's system call number (glibc has no wrapper)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "ppc64le": 203, "s390x": 217}
#: the system's top-level folders a Python, TensorFlow and Open MPI need, read-only
SYSTEM = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
#: where the launcher puts what it writes itself, in the new root's /run (root only to write)
RUN = "/run/labgrade"
CONNECTION = f"{RUN}/kernel.json"
#: environment variables the kernel keeps: these names, and these prefixes
KEEP_ENV = {"PATH", "LANG", "LANGUAGE", "TZ", "TERM", "MPLBACKEND", "KERAS_HOME", "PYTHONHASHSEED"}
KEEP_PREFIXES = ("LC_", "LABS_", "LAB_", "TF_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "NVIDIA_", "NBGRADER_",
                 "HOROVOD_", "JPY_")  # fmt: skip
#: never kept, whatever their prefix
SECRET = re.compile(r"TOKEN|SECRET|KEY|PASSW|CREDENTIAL|AUTH|COOKIE", re.I)


def kernel_env(environ: dict[str, str], extra: dict[str, str]) -> dict[str, str]:
    """The kernel's environment: the kept variables of ``environ`` (no secret-like names),
    then ``extra`` (HOME, TMPDIR, the sandbox's own variables)."""
    kept = {k: v for k, v in environ.items() if (k in KEEP_ENV or k.startswith(KEEP_PREFIXES)) and not SECRET.search(k)}
    return {**kept, **{k: v for k, v in extra.items() if not SECRET.search(k)}}


def _c(text: str | None) -> bytes | None:
    return text.encode() if text is not None else None


class _Sys:
    """The few system calls Python's os module lacks, through libc."""

    def __init__(self):
        self.libc = ctypes.CDLL(None, use_errno=True)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what}: {os.strerror(err)}")

    def unshare(self, flags: int) -> None:
        self._check(self.libc.unshare(flags), "unshare")

    def mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None):
        rc = self.libc.mount(_c(source), _c(target), _c(fstype), ctypes.c_ulong(flags), _c(data))
        self._check(rc, f"mount {source or fstype} on {target}")

    def umount2(self, target: str, flags: int) -> None:
        self._check(self.libc.umount2(target.encode(), flags), f"umount {target}")

    def pivot_root(self, new: str, old: str) -> None:
        number = SYS_PIVOT_ROOT.get(platform.machine())
        if number is None:
            raise OSError(f"pivot_root: no system call number known for {platform.machine()}")
        self._check(self.libc.syscall(number, new.encode(), old.encode()), f"pivot_root {new}")

    def no_new_privs(self) -> None:
        self._check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")


def _fd_path(fd: int) -> str:
    return f"/proc/self/fd/{fd}"


def open_dir(base_fd: int, path: str, *, make: bool, mode: int = 0o755) -> int:
    """An ``O_PATH`` descriptor of the folder ``path`` (relative), under ``base_fd``: each
    component opened (and with ``make`` created) without following a link; a component that
    is a link or not a folder raises ``OSError``."""
    fd = os.dup(base_fd)
    try:
        for part in [p for p in path.split("/") if p]:
            if part == "..":
                raise OSError(f"'..' in {path!r}")
            if make:
                try:
                    os.mkdir(part, mode, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _make_file(base_fd: int, path: str) -> int:
    """An ``O_PATH`` descriptor of an empty file at ``path`` (its folders made; no link followed)."""
    parent, _, name = path.rstrip("/").rpartition("/")
    dfd = open_dir(base_fd, parent, make=True)
    try:
        try:
            os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o644, dir_fd=dfd))
        except FileExistsError:
            pass
        return os.open(name, os.O_PATH | os.O_NOFOLLOW, dir_fd=dfd)
    finally:
        os.close(dfd)


class View:
    """The kernel's new root file system, built in ``root`` (an empty folder only root may write)."""

    def __init__(self, spec: dict, sys_: _Sys | None = None):
        self.spec, self.sys = spec, sys_ or _Sys()
        self.root = spec["root"]

    def bind(self, source: str, target: str, *, readonly: bool, recursive: bool = True) -> None:
        """Mount ``source`` (a folder or a file of the machine) at ``target`` in the view."""
        src = os.open(source, os.O_PATH | os.O_CLOEXEC)
        try:
            is_dir = os.path.isdir(_fd_path(src))
            rel = target.lstrip("/")
            tfd = open_dir(self.root_fd, rel, make=True) if is_dir else _make_file(self.root_fd, rel)
            try:
                flags = MS_BIND | (MS_REC if recursive else 0)
                self.sys.mount(_fd_path(src), _fd_path(tfd), None, flags)
            finally:
                os.close(tfd)
            if readonly:  # a bind mount's own flags change only in a remount, on its path
                tfd = (
                    open_dir(self.root_fd, rel, make=False)
                    if is_dir
                    else os.open(rel, os.O_PATH | os.O_NOFOLLOW, dir_fd=self.root_fd)
                )
                try:
                    self.sys.mount(None, _fd_path(tfd), None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
                finally:
                    os.close(tfd)
        finally:
            os.close(src)

    def _fs(self, fstype: str, target: str, flags: int, data: str | None = None) -> None:
        fd = open_dir(self.root_fd, target.lstrip("/"), make=True)
        try:
            self.sys.mount(fstype, _fd_path(fd), fstype, flags, data)
        finally:
            os.close(fd)

    def build(self) -> None:
        s = self.spec
        self.sys.mount("tmpfs", self.root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
        self.root_fd = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
        for name in SYSTEM:
            path = f"/{name}"
            if os.path.islink(path):
                os.symlink(os.readlink(path), name, dir_fd=self.root_fd)
            elif os.path.isdir(path):
                self.bind(path, path, readonly=True)
        self._dev()
        self._fs("proc", "/proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        self.bind("/sys", "/sys", readonly=True)
        self._fs("tmpfs", "/run", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        self.bind(s["disk"]["lock"], "/run/lock", readonly=False, recursive=False)
        self.bind(s["disk"]["tmp"], "/tmp", readonly=False, recursive=False)
        self.bind(s["disk"]["tmp"], "/var/tmp", readonly=False, recursive=False)
        var = open_dir(self.root_fd, "var", make=True)
        try:
            os.symlink("../run/lock", "lock", dir_fd=var)
        finally:
            os.close(var)
        for source, target in s["readonly"]:  # the Python environment, lab_utils, references, data
            self.bind(source, target, readonly=True)
        for source, target in s["writable"]:  # the kernel's home and the notebook's folder
            self.bind(source, target, readonly=False, recursive=False)

    def _dev(self) -> None:
        self._fs("tmpfs", "/dev", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755")
        for name in DEVICES:
            if os.path.exists(f"/dev/{name}"):
                self.bind(f"/dev/{name}", f"/dev/{name}", readonly=False, recursive=False)
        for name in sorted(os.listdir("/dev")):  # GPUs (the Lab 5 GPU path)
            if name.startswith("nvidia"):
                self.bind(f"/dev/{name}", f"/dev/{name}", readonly=False, recursive=False)
        dev = open_dir(self.root_fd, "dev", make=False)
        try:
            for link, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                             ("stderr", "/proc/self/fd/2")):  # fmt: skip
                os.symlink(to, link, dir_fd=dev)
        finally:
            os.close(dev)
        self.bind(self.spec["disk"]["shm"], "/dev/shm", readonly=False, recursive=False)

    def write_connection(self, settings: str, uid: int) -> str:
        """The connection file in the view's /run, owned by ``uid``, readable by it alone."""
        run = open_dir(self.root_fd, RUN.lstrip("/"), make=True, mode=0o711)
        try:
            fd = os.open("kernel.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW, 0o400, dir_fd=run)
            try:
                os.write(fd, settings.encode())
                os.fchown(fd, uid, uid)
            finally:
                os.close(fd)
        finally:
            os.close(run)
        return CONNECTION

    def enter(self) -> None:
        """``pivot_root`` into the view and detach the machine's file system from this namespace."""
        os.close(self.root_fd)
        os.chdir(self.root)
        self.sys.pivot_root(".", ".")  # the old root is stacked under the new one ...
        self.sys.umount2(".", MNT_DETACH)  # ... and detached: nothing of it has a path any more
        os.chdir("/")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.grading.kernel")
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--view", help="the view's JSON spec (written by the grading worker)")
    how.add_argument(
        "--environment-only",
        action="store_true",
        help="no view, no uid of its own (the grader is not root): only the environment scrubbed",
    )
    parser.add_argument("-f", dest="connection_file", required=True)
    args = parser.parse_args(argv)
    if args.environment_only:  # the grader's own user: what it may read, the kernel may; its secrets, not
        keep = {k: os.environ[k] for k in ("HOME", "TMPDIR", "USER", "LOGNAME") if k in os.environ}
        env = kernel_env(dict(os.environ), keep)
        os.execve(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", args.connection_file], env)
    with open(args.view) as f:
        spec = json.load(f)
    uid = int(spec["uid"])
    if uid <= 0:
        raise SystemExit(f"refusing to run the kernel as uid {uid}")
    with open(args.connection_file) as f:  # jupyter_client's, root only, in the worker's own folder
        settings = f.read()
    calls = _Sys()
    calls.unshare(CLONE_NEWNS)
    calls.mount(None, "/", None, MS_REC | MS_PRIVATE)
    view = View(spec, calls)
    view.build()
    connection = view.write_connection(settings, uid)
    view.enter()
    os.chdir(spec["cwd"])
    env = kernel_env(dict(os.environ), {**spec["env"], "HOME": spec["home"], "TMPDIR": "/tmp",
                                        "USER": "labgrade", "LOGNAME": "labgrade"})  # fmt: skip
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    calls.no_new_privs()
    os.execve(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", connection], env)


def run(argv=None) -> None:
    """:func:`main`, with a failure to start said in one line on stderr (the worker's log, which
    the batch shows for an infrastructure error): never only "Kernel died"."""
    try:
        main(argv)
    except (OSError, ValueError, KeyError) as exc:
        print(f"grading kernel: cannot start the sandbox's kernel: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    run()
