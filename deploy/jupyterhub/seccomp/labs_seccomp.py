"""The student pods' seccomp profile: every system call a program in a container makes, and the
three the network lessons need besides (``unshare``, ``setns``, ``clone`` with namespace flags),
without the ones that only a kernel's administrator needs or that pod escapes went through.

    python deploy/jupyterhub/seccomp/labs_seccomp.py write deploy/jupyterhub/seccomp/labs-userns.json
    python deploy/jupyterhub/seccomp/labs_seccomp.py run PROFILE -- COMMAND...   # try it: COMMAND under PROFILE

``write`` lists every system call libseccomp knows for the architectures below, and allows each
one that is not in :data:`DENIED`; a call the profile does not name (one newer than the list) is
refused with EPERM. It is the shape of a container runtime's default profile, written from the
kernel's own table rather than copied: Docker's and containerd's defaults refuse ``unshare``,
``setns`` and namespace flags to ``clone`` without CAP_SYS_ADMIN, which a student's pod never
has, and that refusal is the one this profile lifts. It also refuses netlink sockets of the
netfilter family (nf_tables, CVE-2024-1086: the labs' networks need only ``NETLINK_ROUTE``)
and the new mount API (``fsconfig``, CVE-2022-0185): neither is needed to build the labs'
networks, and both were reached from a user namespace in pod escapes.

``run`` loads a profile (Docker's JSON format, as the kubelet reads a ``Localhost`` profile) into
the kernel with libseccomp and runs a command under it: how the test checks that a student's
emulated network starts under this profile and that a call outside it is refused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import json
import os
import sys
from pathlib import Path

#: Architectures a class's nodes run (x86-64 and arm64, with their 32-bit modes).
ARCHITECTURES = {"SCMP_ARCH_X86_64": "x86_64", "SCMP_ARCH_X86": "x86", "SCMP_ARCH_X32": "x32",
                 "SCMP_ARCH_AARCH64": "aarch64", "SCMP_ARCH_ARM": "arm"}  # fmt: skip

#: Refused, and why: what needs a kernel's administrator (a pod has no capability, so the kernel
#: would refuse most anyway: refusing them here removes the code path), and what escapes went through.
DENIED = {
    # the kernel itself
    "init_module": "modules", "finit_module": "modules", "delete_module": "modules",
    "create_module": "modules", "get_kernel_syms": "modules", "query_module": "modules",
    "kexec_load": "another kernel", "kexec_file_load": "another kernel", "reboot": "the machine",
    "swapon": "the machine", "swapoff": "the machine", "acct": "the machine", "syslog": "the kernel log",
    "settimeofday": "the clock", "stime": "the clock", "clock_settime": "the clock",
    "clock_adjtime": "the clock", "adjtimex": "the clock", "_sysctl": "the kernel's settings",
    "iopl": "hardware", "ioperm": "hardware", "vm86": "hardware", "vm86old": "hardware",
    "lookup_dcookie": "profiling", "nfsservctl": "the NFS server", "uselib": "obsolete",
    "quotactl": "quotas", "quotactl_fd": "quotas", "vhangup": "terminals",
    # attack surface a user namespace opens, which no lab needs
    "bpf": "eBPF", "perf_event_open": "performance counters", "userfaultfd": "page faults (race exploits)",
    "keyctl": "kernel keyrings", "add_key": "kernel keyrings", "request_key": "kernel keyrings",
    "open_by_handle_at": "file handles (container escapes)", "name_to_handle_at": "file handles",
    "fanotify_init": "file system monitoring", "io_uring_setup": "io_uring", "io_uring_enter": "io_uring",
    "io_uring_register": "io_uring", "mount": "mounts", "umount": "mounts", "umount2": "mounts",
    "pivot_root": "mounts", "move_mount": "mounts", "open_tree": "mounts", "fsopen": "mounts (CVE-2022-0185)",
    "fsconfig": "mounts (CVE-2022-0185)", "fsmount": "mounts", "fspick": "mounts", "mount_setattr": "mounts",
}  # fmt: skip
#: What the network lessons add to a runtime's default (allowed whatever their flags).
NAMESPACES = ("unshare", "setns", "clone", "clone3")
AF_NETLINK, NETLINK_NETFILTER = 16, 12
# libseccomp's constants (seccomp.h)
ACT_ALLOW, ACT_ERRNO = 0x7FFF0000, 0x00050000
OPS = {"SCMP_CMP_NE": 1, "SCMP_CMP_LT": 2, "SCMP_CMP_LE": 3, "SCMP_CMP_EQ": 4, "SCMP_CMP_GE": 5,
       "SCMP_CMP_GT": 6, "SCMP_CMP_MASKED_EQ": 7}  # fmt: skip


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    lib = ctypes.CDLL(name, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_arch_resolve_name.restype = ctypes.c_uint32
    lib.seccomp_arch_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_arch_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p  # a malloc'ed string
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                           ctypes.POINTER(_ArgCmp)]  # fmt: skip
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def known_syscalls(lib: ctypes.CDLL | None = None) -> set[str]:
    """Every system call name libseccomp knows for :data:`ARCHITECTURES`."""
    lib = lib or _lib()
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    names = set()
    for arch in ARCHITECTURES.values():
        token = lib.seccomp_arch_resolve_name(arch.encode())
        if not token:
            continue
        for number in range(0, 1024):
            ptr = lib.seccomp_syscall_resolve_num_arch(token, number)
            if ptr:
                names.add(ctypes.string_at(ptr).decode())
                libc.free(ptr)
    return names


def build(names: set[str]) -> dict:
    """The profile (Docker's JSON format) allowing ``names`` less :data:`DENIED`."""
    allowed = sorted((names | set(NAMESPACES)) - set(DENIED) - {"socket"})
    socket_rules = [  # any socket but a netfilter netlink one
        {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": AF_NETLINK, "op": "SCMP_CMP_NE"}]},
        {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
         "args": [{"index": 0, "value": AF_NETLINK, "op": "SCMP_CMP_EQ"},
                  {"index": 2, "value": NETLINK_NETFILTER, "op": "SCMP_CMP_NE"}]},
    ]  # fmt: skip
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": errno.EPERM,
        "architectures": list(ARCHITECTURES),
        "syscalls": [{"names": allowed, "action": "SCMP_ACT_ALLOW"}, *socket_rules],
    }


def _action(name: str, errno_ret: int | None) -> int:
    if name == "SCMP_ACT_ALLOW":
        return ACT_ALLOW
    if name == "SCMP_ACT_ERRNO":
        return ACT_ERRNO | ((errno.EPERM if errno_ret is None else errno_ret) & 0xFFFF)
    raise ValueError(f"action {name} is not one this runner loads (SCMP_ACT_ALLOW, SCMP_ACT_ERRNO)")


def load(profile: dict) -> None:
    """Put ``profile`` on this process (and so on what it execs); no way back."""
    lib = _lib()
    ctx = lib.seccomp_init(_action(profile["defaultAction"], profile.get("defaultErrnoRet")))
    if not ctx:
        raise OSError("seccomp_init failed")
    try:
        for arch in profile.get("architectures", []):
            token = lib.seccomp_arch_resolve_name(ARCHITECTURES[arch].encode())
            rc = lib.seccomp_arch_add(ctx, token) if token else 0
            if rc not in (0, -errno.EEXIST):
                raise OSError(-rc, f"seccomp_arch_add {arch}: {os.strerror(-rc)}")
        for rule in profile["syscalls"]:
            action = _action(rule["action"], rule.get("errnoRet"))
            args = rule.get("args") or []
            cmps = (_ArgCmp * max(1, len(args)))(
                *[_ArgCmp(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in args]
            )
            for name in rule["names"]:
                number = lib.seccomp_syscall_resolve_name(name.encode())
                if number < 0:
                    continue  # not a call of this kernel's architecture (e.g. vm86 on x86-64)
                rc = lib.seccomp_rule_add_array(ctx, action, number, len(args), cmps)
                if rc not in (0, -errno.EEXIST):
                    raise OSError(-rc, f"seccomp rule for {name}: {os.strerror(-rc)}")
        rc = lib.seccomp_load(ctx)
        if rc != 0:
            raise OSError(-rc, f"seccomp_load: {os.strerror(-rc)}")
    finally:
        lib.seccomp_release(ctx)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "write":
        profile = build(known_syscalls())
        Path(argv[1]).write_text(json.dumps(profile, indent=1) + "\n")
        print(f"wrote {argv[1]}: {len(profile['syscalls'][0]['names'])} calls allowed, {len(DENIED)} refused")
        return 0
    if len(argv) >= 4 and argv[0] == "run" and argv[2] == "--":
        load(json.loads(Path(argv[1]).read_text()))
        os.execvp(argv[3], argv[3:])
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
