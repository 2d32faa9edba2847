"""MPI and Horovod jobs: ``mpirun`` / ``horovodrun`` running ``np`` copies of a script.

::

    with MPIJob(np=2, script="train_hvd.py", launcher="horovodrun", controller="gloo") as job:
        job.wait()
        print(job.logs(1))              # rank 1's own output, untagged

The launcher is one task whose children are the ranks; each rank writes its
``lab_utils.report`` events to ``ranks/rank-<r>.jsonl``. As root the Open MPI
run-as-root switches are added for you.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from lab_utils import _guard, checks, config, report, resources
from lab_utils.cluster import hosts as hostlib
from lab_utils.cluster import hvdbuild, netem
from lab_utils.cluster.job import Job, JobOptions
from lab_utils.cluster.process import Task, check_fit
from lab_utils.options import keyword_options

_CONTROLLERS = ("mpi", "gloo")
_CONTROLLER_NAMES = {"mpi": "MPI", "gloo": "Gloo"}
# mpirun --tag-output: "[job,rank]<stdout>:"; horovodrun: "[rank]<stdout>:" (capture: the rank).
#: Open MPI on emulated hosts: the launcher starts every host's daemon itself and each
#: daemon talks to it directly. With the default tree spawn and radix routing, daemons
#: relay through each other, and under load a relay was not yet known: mpirun exited 213
#: ("ORTE does not know how to route a message to the specified daemon") twice in ~40 runs.
EMULATED_MCA = {"plm_rsh_no_tree_spawn": "1", "routed": "direct"}
#: Where a job gets no private network: Open MPI's daemons and TCP transport talk over
#: loopback only, IPv4 only (measured: its listening sockets still bind every address).
LOOPBACK_MCA = {"oob_tcp_if_include": "lo", "btl_tcp_if_include": "lo", "btl_tcp_disable_family": "6"}
_RANK_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>:")


def split_rank_output(text: str) -> dict[int, str]:
    """Each rank's own output, untagged, from a launcher log that interleaves ranks.

    mpirun tags every *read* from a rank's pipe, not every line: ``print()`` under
    ``python -u`` writes the text and the newline separately, so two ranks' pieces
    can share one line (``[1,1]<stdout>:rank 1[1,0]<stdout>:rank 0``). Every line
    of a piece is tagged, so a piece runs from its tag to its first newline or to
    the next tag; anything else is the launcher's own (untagged) output."""
    out: dict[int, list[str]] = {}
    parts = _RANK_TAG.split(text)  # [untagged, rank, piece, rank, piece, ...]
    for i in range(1, len(parts), 2):
        piece = parts[i + 1]
        cut = piece.find("\n")
        out.setdefault(int(parts[i]), []).append(piece if cut < 0 else piece[: cut + 1])
    return {r: "".join(pieces) for r, pieces in sorted(out.items())}


def remove_dead_session_dirs(tmp: Path | None = None) -> list[Path]:
    """Remove this user's Open MPI session folders (``ompi.<host>.<uid>/pid.<mpirun's pid>``
    in the temporary directory) whose ``mpirun`` is gone: one that ends normally removes its
    own, one that was killed (a job stopped at its timeout, a Ctrl-C) left it there for
    good, and a student's ``/tmp`` collected one per stopped job. Returns those removed."""
    removed = []
    for top in Path(tmp or tempfile.gettempdir()).glob("ompi.*"):
        try:
            if top.is_symlink() or not top.is_dir() or top.stat().st_uid != os.geteuid():
                continue
            runs = list(top.glob("pid.*"))
        except OSError:  # another user's, or gone meanwhile
            continue
        for run in runs:
            pid = run.name.removeprefix("pid.")
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                _guard.remove(run)
                removed.append(run)
    return removed


#: Open MPI's shared-memory transport's files in /dev/shm: ``vader_segment.<host>.<job>.<rank>``
VADER = "vader_segment."


def _mapped_segments(proc: Path) -> set[str]:
    """The Open MPI segments some process maps (the ones whose /proc/<pid>/maps this user may read)."""
    mapped = set()
    for maps in proc.glob("[0-9]*/maps"):
        try:
            text = maps.read_text(errors="replace")
        except OSError:  # another user's process, or gone meanwhile
            continue
        mapped.update(line.split(None, 5)[-1] for line in text.splitlines() if VADER in line)
    return mapped


def remove_dead_shm_segments(shm: Path = Path("/dev/shm"), proc: Path = Path("/proc")) -> list[Path]:
    """Remove this user's Open MPI shared-memory segments that no live process maps (a rank
    maps its segment from its start to its end): a job that ends normally removes its own, one
    that was killed leaves them in ``/dev/shm``, memory the machine keeps until it reboots. A
    segment must be unmapped at two looks in a row (a rank of a job starting now maps its own
    microseconds after it makes it). Returns those removed."""
    try:
        mine = [
            p for p in shm.glob(VADER + "*") if not p.is_symlink() and p.is_file() and p.stat().st_uid == os.geteuid()
        ]
    except OSError:
        return []
    unmapped = [p for p in mine if str(p) not in _mapped_segments(proc)] if mine else []
    if not unmapped:
        return []
    still = _mapped_segments(proc)
    removed = []
    for path in unmapped:
        if str(path) in still:
            continue
        try:
            path.unlink()
        except OSError:  # removed meanwhile
            continue
        removed.append(path)
    return removed


class MPIJob(Job):
    """``mpirun`` or ``horovodrun`` running ``np`` copies of a script.

    ``controller``: ``"mpi"`` or ``"gloo"`` (horovodrun only; mpirun is MPI).
    ``hosts``: a list like ``["n1:2", "n2:2"]``, a hostfile path or
    ``"hostfile:PATH"`` (``-H`` / ``--hostfile``), ``"slurm"`` (the allocation's
    nodes, one slot each); local by default. :func:`~lab_utils.cluster.netem.emulated` (or
    ``"emulated:bandwidth=100mbit"``) places the ranks round-robin on emulated hosts:
    the launcher runs on host 0 and starts the others' ranks with its own multi-host
    machinery, through an ssh that enters a host's namespace (local with a note
    without root). As root the Open MPI run-as-root
    switches are added; ``--oversubscribe`` when ``np`` exceeds usable cores.
    Each rank's ``lab_utils.report`` events go to ``rank-<r>.jsonl``; the job
    counts as started once the launcher runs; :meth:`wait` is what matters.
    Before anything launches, :meth:`start` checks that the memory fits and, for
    horovodrun, that Horovod was built with the controller (else ``ValueError``
    saying how to rebuild it).
    """

    kind = "mpi"

    @keyword_options(JobOptions, ready_timeout=60.0)
    def __init__(
        self,
        np: int = 2,
        script: str | os.PathLike = "train_hvd.py",
        args: Mapping[str, Any] | Sequence[str] | None = None,
        *,
        launcher: str = "horovodrun",
        controller: str | None = None,
        hosts: Sequence[str] | str | os.PathLike | netem.EmulatedHosts | None = None,
        launcher_args: Sequence[str] = (),
        memory_per_rank: int | None = None,
        check_resources: bool = True,
        options: JobOptions,
    ):
        checks.count("np", np)
        if launcher not in hostlib.LAUNCHERS:
            raise ValueError(f"unknown launcher {launcher!r}; allowed: {', '.join(hostlib.LAUNCHERS)}")
        if controller is None:
            controller = "mpi" if launcher == "mpirun" else "gloo"
        if controller not in _CONTROLLERS:
            raise ValueError(f"unknown controller {controller!r}; allowed: {', '.join(_CONTROLLERS)}")
        if launcher == "mpirun" and controller != "mpi":
            raise ValueError(
                "launcher='mpirun' always uses the MPI controller; for Gloo use launcher='horovodrun', controller='gloo'"
            )
        exe = self._launcher_path(launcher)
        if exe is None:
            raise ValueError(f"launcher {launcher!r} not found next to {sys.executable} or on PATH")
        hostfile, emulate = None, None
        kind = hosts.partition(":")[0].strip().lower() if isinstance(hosts, str) else None
        if isinstance(hosts, netem.EmulatedHosts) or kind in ("emulated", "local", ""):
            emulate, hosts = netem.as_spec(hosts), None
        elif kind == "hostfile" and ":" in hosts:  # a bare path named "hostfile" stays a path
            hosts = hosts.partition(":")[2]  # checked as a hostfile below
        elif kind == "slurm" and ":" not in hosts:
            nodes = hostlib.slurm_hosts()
            hosts = [f"{h}:{nodes.count(h)}" for h in dict.fromkeys(nodes)]
        if hosts is not None and not isinstance(hosts, (list, tuple)):
            hostfile = Path(hosts)
            if not hostfile.is_file():
                raise ValueError(f"hosts must be a list like ['n1:2', 'n2:2'] or an existing hostfile, got {hosts!r}")
            hosts = None
        if memory_per_rank is not None and memory_per_rank <= 0:
            raise ValueError(f"memory_per_rank must be a positive number of bytes, got {memory_per_rank!r}")
        super().__init__(script, args, options)
        self.np, self.launcher, self.controller = np, launcher, controller
        self.launcher_exe, self.hosts, self.hostfile = exe, list(hosts) if hosts else None, hostfile
        self.launcher_args = list(launcher_args)
        self.emulate = emulate
        self.memory_per_rank = memory_per_rank
        self.check_resources = check_resources
        self._rank_pids: dict[str, int] | None = None
        self._built: str | None = None  # controllers Horovod was built with, once probed (hvdbuild.BUILT)
        self._stream_partial: dict[int, str] = {}  # streaming: a rank's line still waiting for its end

    @staticmethod
    def _launcher_path(launcher: str) -> str | None:
        local = Path(sys.executable).parent / launcher
        if local.exists():
            return str(local)
        return shutil.which(launcher)

    def _local_ranks(self) -> int:
        if self.emulate is not None or (not self.hosts and not self.hostfile):
            return self.np
        if self.hosts:
            n = 0
            for h in self.hosts:
                name, _, slots = str(h).partition(":")
                if hostlib.is_local(name):
                    n += int(slots or 1)
            return min(n, self.np)
        return 0  # hostfile: the ranks run where it says

    def _check_resources(self) -> None:
        self._check_build()
        local = self._local_ranks()
        if not self.check_resources or local == 0:
            return
        # One launcher-side guard for the whole job: the ranks are counted without guards.
        # A plain horovodrun imports TensorFlow to probe the build (measured: 450 MB, like a
        # rank): count it too. Through hvdrun it does not (34 MB).
        launcher = 1 if self.launcher == "horovodrun" and self._horovodrun()[-1] != hvdbuild.HVDRUN else 0
        check_fit(
            local + launcher,
            f"np={self.np}" + (" and horovodrun" if launcher else ""),
            self.memory_per_rank,
            guard=False,
            hint=lambda fit: f"try np={fit - launcher}" if fit > launcher else None,
        )

    def _check_build(self) -> None:
        """horovodrun: the installed Horovod must have the requested controller (probed once
        per process, without importing TensorFlow here; see :mod:`.hvdbuild`)."""
        if self.launcher != "horovodrun":
            return
        build = hvdbuild.horovod_build()
        if build.get(self.controller):
            self._built = ",".join(c for c in _CONTROLLERS if build.get(c))
            return
        have = [c for c in _CONTROLLERS if build.get(c)]
        instead = f"use controller={have[0]!r}, or " if have else ""
        raise ValueError(
            f"controller={self.controller!r} needs Horovod built with {_CONTROLLER_NAMES[self.controller]}, "
            f"but the installed Horovod has {hvdbuild.describe(build)}; "
            f"{instead}rebuild it: {hvdbuild.build_command()}"
        )

    def command(self) -> tuple[list[str], dict]:
        """The launcher command line and the extra environment (used by start; shown for teaching)."""
        cores = resources.usable_cores()
        # uid 0, or uid 0 inside the user namespace of emulated hosts built without root
        # (the student outside it): Open MPI refuses both without its run-as-root switches
        root = os.getuid() == 0 or getattr(self.network, "inside_uid0", False)
        extra = {}
        local = self._local_ranks()
        placed = self._emulated_hosts()
        if self.launcher == "mpirun":
            cmd = [self.launcher_exe, "-np", str(self.np), "--tag-output"]
            if root:
                cmd.append("--allow-run-as-root")
            if local > cores:
                cmd.append("--oversubscribe")
            if placed:
                cmd += ["-H", ",".join(placed), "--mca", "plm_rsh_agent", str(self._ssh)]
                cmd += ["--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0"]
                cmd += [arg for k, v in EMULATED_MCA.items() for arg in ("--mca", k, v)]
            elif self.hosts:
                cmd += ["-H", ",".join(self.hosts)]
            elif self.hostfile:
                cmd += ["--hostfile", str(self.hostfile)]
            elif self._exposed:  # no private network: Open MPI's own sockets on loopback only
                cmd += [arg for k, v in LOOPBACK_MCA.items() for arg in ("--mca", k, v)]
            exported = (
                config.REPORT_DIR,
                config.RUN_DIR,
                config.JOB,
                "PYTHONUNBUFFERED",
                "TF_CPP_MIN_LOG_LEVEL",
                "PYTHONPATH",
            )
            for var in (*exported, *self.extra_env):
                cmd += ["-x", var]
        else:
            # horovodrun's own launcher, told the build that _check_build found: else it forks a
            # child that imports TensorFlow to ask again, every job (2.5 s of CPU, 450 MB)
            launch = self._horovodrun()
            cmd = [*launch, "-np", str(self.np), "--gloo" if self.controller == "gloo" else "--mpi"]
            if self._built is not None and launch[-1] == hvdbuild.HVDRUN:
                extra[hvdbuild.BUILT] = self._built
            if placed:  # horovodrun (and the mpirun it runs) find the emulated ssh first on PATH
                cmd += ["-H", ",".join(placed), "--network-interface", "eth0"]  # not lo: its own on each host
                extra["PATH"] = os.pathsep.join([str(self._ssh.parent), os.environ.get("PATH", "")])
                extra.update({f"OMPI_MCA_{k}": v for k, v in EMULATED_MCA.items()})
            elif self.hosts:
                cmd += ["-H", ",".join(self.hosts)]
            elif self.hostfile:
                cmd += ["--hostfile", str(self.hostfile)]
            else:
                cmd += ["-H", f"localhost:{self.np}"]
                if self._exposed:  # no private network: Gloo's and Open MPI's sockets on loopback
                    cmd += ["--network-interface", "lo"]
                    extra.update({f"OMPI_MCA_{k}": v for k, v in LOOPBACK_MCA.items()})
            if root:
                extra.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            if local > cores and self.controller == "mpi":
                extra["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
        if local > cores:
            self._note(f"np={self.np} ranks on {cores} usable core(s): oversubscribed, ranks take turns on the CPU")
        cmd = [*cmd, *self.launcher_args, *self._python()]
        if self.network is not None:  # the launcher runs on (emulated) host 0, beside its ranks
            cmd = self.network.command(0, cmd)
            # with host 0's own temporary folder, as its daemons have theirs (the ssh stand-in):
            # Open MPI's session directory is named by uid, and uid 0 inside a student's user
            # namespace would meet root's (or another student's) /tmp/ompi.<host>.0
            # (made at start, not here: the network's destroy removes it, and a command shown
            # after the run must not make it again)
            extra["TMPDIR"] = str(netem.host_tmp(self.network.hosts[0]))
        return cmd, extra

    def _finish_stop(self, survivors: Sequence) -> None:
        super()._finish_stop(survivors)
        try:
            remove_dead_session_dirs()
        except OSError as exc:  # stopping the job went well: say it, do not fail it
            self.notes.append(f"could not remove a dead job's Open MPI session folder: {exc}")
        remove_dead_shm_segments()

    def _horovodrun(self) -> list[str]:
        """``horovodrun``, as :mod:`.hvdrun` (the same launcher, minus its build probe) when
        this interpreter is the one that runs the ``horovodrun`` found."""
        if Path(self.launcher_exe).parent == Path(sys.executable).parent:
            return [sys.executable, "-m", hvdbuild.HVDRUN]
        return [self.launcher_exe]

    def _all_local(self) -> bool:
        return not self.hosts and not self.hostfile

    @property
    def _exposed(self) -> bool:
        """Started on this machine without a private network (:meth:`_unprotected`)."""
        return self.network is None and self._all_local() and not self._stopped

    def _unprotected(self, reason: str) -> None:
        self._note(
            f"no private network for this job ({reason}): its ranks are told to talk over loopback, but Open "
            "MPI's and horovodrun's servers still listen on every interface of this machine while it runs"
        )

    def _emulated_hosts(self) -> list[str]:
        """``["10.x.y.1:2", ...]``: each emulated host's address and its ranks (round-robin)."""
        if not self.emulated:
            return []
        slots = [self.placement.count(i) for i in range(self.network.n_hosts)]
        return [f"{self.network.address(i)}:{k}" for i, k in enumerate(slots) if k]

    def _start_and_wait_ready(self) -> None:
        self.attempts = 1
        self._rank_pids = None
        self._stream_partial = {}
        report_dir = self.run_dir / "ranks"
        report_dir.mkdir(exist_ok=True)
        self.tasks = [Task(self.launcher, self.run_dir / f"{self.launcher}.log")]
        self._build_network(self.np)
        if self.emulated and self.controller == "gloo":
            raise ValueError(
                "Horovod's Gloo controller does not run on emulated hosts (its ranks try to reach each "
                "other on loopback and fail): use controller='mpi' there"
            )
        if self.emulated:
            self._ssh = self.network.write_ssh(self.run_dir / "bin")
            self.tasks[0].host = self.network.address(0)
        cmd, extra = self.command()
        if self.network is not None:
            Path(extra["TMPDIR"]).mkdir(mode=0o700, exist_ok=True)
        env = self._base_env()
        env.update(extra)
        if self._local_ranks() == self.np:  # every rank on this machine (or its emulated hosts)
            env.update(resources.thread_env(env))
        env[config.REPORT_DIR] = str(report_dir)
        env.pop(config.REPORT_FILE, None)
        env.pop(config.TASK, None)
        self._launch(self.tasks[0], cmd, env, orphan_removes=[extra["TMPDIR"]] if self.network is not None else [])
        task = self.tasks[0]
        if task.poll() is not None and task.exit_code != 0:
            raise self._fail(task, f"exited with code {task.exit_code} at start")
        task.state = "running"

    def _main_tasks(self) -> list[Task]:
        return self.tasks

    def task_pids(self) -> dict[str, int]:
        """``{"rank:<r>": pid}`` once every rank has written an event (its first event
        carries its pid) and each of those pids is a process under this job's launcher;
        until then ``{launcher: pid}`` (the launcher's whole tree: every rank and
        mpirun itself). Remote ranks cannot be sampled from here: launcher only."""
        launcher = self.tasks[0] if self.tasks else None
        if launcher is None or not launcher.pid or launcher.exit_code is not None:
            return {}
        if self._rank_pids is None and not self.hosts and not self.hostfile:
            self._rank_pids = self._find_rank_pids(launcher.pid)
        return dict(self._rank_pids) if self._rank_pids else {launcher.name: launcher.pid}

    def _find_rank_pids(self, launcher_pid: int) -> dict[str, int] | None:
        found = {}
        for name, path in self._event_files():
            first = next(iter(report.iter_events(path)), None)
            if first and isinstance(first.get("pid"), int):
                found[name] = first["pid"]
        if len(found) < self.np:
            return None  # not every rank has reported yet: ask again at the next sample
        try:
            under = {p.pid for p in psutil.Process(launcher_pid).children(recursive=True)}
        except psutil.Error:
            return None  # the launcher is ending: the job is over, nothing to split
        # Pids not under the launcher: reused or remote ranks; sample the launcher's tree instead.
        return found if set(found.values()) <= under else {}

    def _check(self) -> tuple[Task | None, bool]:
        t = self.tasks[0]
        t.poll()
        if t.state == "failed":
            return t, False
        return None, t.exit_code == 0

    def _event_files(self) -> list[tuple[str, Path]]:
        if self.run_dir is None:
            return []
        files = sorted((self.run_dir / "ranks").glob("rank-*.jsonl"), key=lambda p: int(p.stem.split("-")[1]))
        return [(f"rank:{p.stem.split('-')[1]}", p) for p in files]

    def stream_lines(self, task: Task, line: str) -> list[str]:
        """``[rank:r] text`` per rank line. A launcher line can end one rank's line and hold
        the start of another's (see :func:`split_rank_output`): a rank's line is printed
        once the piece that ends it arrives, whichever launcher line brings it."""
        parts = _RANK_TAG.split(line)
        out = [f"[{task.name}] {parts[0]}"] if parts[0].strip() else []
        for i in range(1, len(parts), 2):
            rank = int(parts[i])
            text = self._stream_partial.pop(rank, "") + parts[i + 1]
            if i + 2 < len(parts):  # another piece follows on this line: no newline yet
                self._stream_partial[rank] = text
            else:
                out.append(f"[rank:{rank}] {text}")
        return out

    def logs(self, rank: int | None = None, tail: int | None = None) -> str:
        """The launcher's log (every rank's output, tagged ``[1,r]<stdout>:`` by mpirun,
        ``[r]<stdout>:`` by horovodrun); ``logs(1)``: rank 1's own output, untagged
        (see :func:`split_rank_output`)."""
        path = self.tasks[0].log_path if self.tasks else None
        if path is None:
            return ""
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        if rank is not None:
            text = split_rank_output(text).get(rank, "")
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return text
