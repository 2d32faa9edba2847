"""The life cycle every launched job shares: start, wait until ready, wait, stop, logs, repr.

:class:`Job` is subclassed by :class:`~lab_utils.cluster.tf.TFCluster` (one
process per task) and :class:`~lab_utils.cluster.mpi.MPIJob` (one launcher whose
children are the ranks). Cleanup is layered (models: ipyparallel's ``Cluster``,
dask's ``SpecCluster``, Horovod's ``safe_shell_exec``):

1. ``with`` / :meth:`Job.stop`: the one kill-tree (:func:`~.process.terminate`);
   ``KeyboardInterrupt`` (the notebook's Interrupt button) at any moment of
   start, wait or stop leaves nothing running and is re-raised. A process
   started by an interrupted ``Popen`` call is found by its ``LABS_JOB`` token.
2. A registry of live jobs stopped by ``atexit`` (a normal kernel shutdown).
3. Every task runs under :mod:`lab_utils._guard`, which kills the task's whole
   tree when the kernel dies, even by SIGKILL.
4. ``state.json`` in the run directory; :func:`~.rundir.reap` stops what a dead
   kernel left. A task that survives SIGKILL is recorded and reported.

Nothing here installs signal handlers or writes to the kernel's stderr.
"""

from __future__ import annotations

import atexit
import html
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from lab_utils import checks, config, report, resources
from lab_utils.cluster import netem, rundir, userns
from lab_utils.cluster.process import ClusterError, Recorded, Task, create_time, tail, terminate
from lab_utils.display import StatusLine

POLL = 0.03  # seconds between probes while waiting (a probe, not a "let it start" sleep)
_REGISTRY: weakref.WeakSet[Job] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for job in list(_REGISTRY):
        job.stop()


def pause() -> None:
    """One probe interval while polling under a deadline (not a "let it start" sleep)."""
    time.sleep(POLL)


def format_args(args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``{"steps": 100, "sync": True, "lr": 0.1}`` -> ``--steps 100 --sync --lr 0.1``."""
    if args is None:
        return []
    if isinstance(args, (str, bytes)):
        raise TypeError(f"args must be a dict or a list of strings, got the string {args!r}; use shlex.split()")
    if not isinstance(args, Mapping):
        return [str(a) for a in args]
    out = []
    for key, value in args.items():
        flag = str(key) if str(key).startswith("-") else "--" + str(key).replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


@dataclass(frozen=True)
class JobOptions:
    """The life-cycle settings every launcher (``TFCluster``, ``MPIJob``) takes as keyword arguments."""

    env: Mapping[str, str] | None = None  # more environment for every task
    run_dir: str | os.PathLike | None = None  # default: a fresh one under the run root
    ready_timeout: float = 60.0  # seconds for every task to report ready
    timeout: float | None = 900.0  # seconds for the whole run; None: no limit
    stream: bool = False  # echo the tasks' output into the notebook as it comes
    progress: bool = True  # one status line of the tasks' steps
    guard: bool = True  # a guard per task that kills its tree when the kernel dies
    grace: float = 3.0  # seconds between SIGTERM and SIGKILL when stopping
    cwd: str | os.PathLike | None = None  # the tasks' working directory (default: the kernel's)
    name: str | None = None  # the run's name (default: the script's)


class Job:
    """Common life cycle: start (wait ready), wait, stop, results, logs, repr."""

    kind = "job"

    def __init__(self, script, args, options: JobOptions):
        o = options
        if not isinstance(script, (str, os.PathLike)) or not str(script):
            raise ValueError(f"script must be a path to a Python file or a module name, got {script!r}")
        script = str(script)
        self.module = script[3:].strip() if script.startswith("-m ") else None
        self.script = None
        if self.module is None:
            path = Path(script) if Path(script).is_absolute() else Path(o.cwd or ".") / script
            if not path.is_file():
                raise ValueError(
                    f"script {script!r} not found (looked at {path.resolve()}); give the path to a train_*.py file"
                )
            self.script = str(path.resolve())
        self.args = format_args(args)
        for name in ("ready_timeout", "timeout", "grace"):
            checks.seconds(name, getattr(o, name), optional=True)
        self.extra_env = dict(o.env or {})
        self.ready_timeout, self.timeout, self.grace = o.ready_timeout, o.timeout, o.grace
        self.stream, self.use_guard, self.progress = o.stream, o.guard, o.progress
        self.cwd = str(o.cwd) if o.cwd else os.getcwd()
        self.name = o.name or (Path(self.script).stem if self.script else self.module)
        self._run_dir_arg = o.run_dir
        self.run_dir: Path | None = None
        self.tasks: list[Task] = []
        self.notes: list[str] = []
        self.timeline = None  # lab_utils.timeline.Timeline, once the job ended well (write_trace)
        self.emulate: netem.EmulatedHosts | None = None  # set by subclasses that take hosts=
        self.network: netem.BaseNetwork | None = None  # netem.Network, userns.UserNetwork or PrivateNetwork
        self.placement: list[int] = []  # task index -> emulated host index
        self.attempts = 0
        self.token = secrets.token_hex(8)  # LABS_JOB of every process this job starts
        self._started_at: float | None = None
        self._spawn_since = 0.0
        self._stopped = True
        self._state_error: str | None = None
        self._stream_stop = threading.Event()
        self._stream_thread: threading.Thread | None = None
        self._step_tails: dict[Path, tuple[report.EventTail, dict | None]] = {}

    # ---- helpers for subclasses
    def _python(self) -> list[str]:
        target = ["-m", self.module] if self.module else [self.script]
        return [sys.executable, "-u", *target, *self.args]

    def _base_env(self) -> dict:
        env = dict(os.environ)
        env.update({"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"})
        env.update(resources.allocator_env(env))
        env.update({config.RUN_DIR: str(self.run_dir), config.JOB: self.token})
        # The task must find lab_utils and the script's neighbours like the notebook does.
        paths = [self.cwd] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        env.update({k: str(v) for k, v in self.extra_env.items()})
        return env

    def _note(self, text: str) -> None:
        """Advice for the student: kept in ``.notes`` and printed on stdout (never stderr:
        a graded cell with stderr output scores 0)."""
        self.notes.append(text)
        if self.progress:
            print(f"[lab_utils.cluster] note: {text}", flush=True)

    def _make_run_dir(self) -> Path:
        if self._run_dir_arg is not None:
            base = Path(self._run_dir_arg)
            base.mkdir(parents=True, exist_ok=True)
            return base
        root = rundir.run_root()
        rundir.prune_runs(rundir.KEEP_RUNS, root)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = root / f"{self.kind}-{self.name}-{stamp}-{os.getpid()}-{secrets.token_hex(3)}"
        path.mkdir(parents=True)
        return path

    def _launch(self, task: Task, cmd: list[str], env: dict, orphan_removes: Sequence[str] = ()) -> None:
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.use_guard:
            guard = [sys.executable, "-m", "lab_utils._guard", "--parent", str(os.getpid()), "--grace", str(self.grace)]
            for path in orphan_removes:  # what only this process would remove: its guard does if it dies
                guard += ["--orphan-removes", path]
            cmd = [*guard, "--", *cmd]
        with open(task.log_path, "ab", buffering=0) as log:
            log.write(f"# {task.name}: {shlex.join(cmd)}\n".encode())
            task.popen = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                close_fds=True,
                start_new_session=True,
            )
        task.pid = task.popen.pid
        task.create_time = create_time(task.pid)
        task.state = "starting"
        self._save_state()

    def _save_state(self, status: str = "running", survivors: Sequence[str] = ()) -> None:
        """Write state.json; a failure is reported once on the notebook's output, not dropped."""
        if self.run_dir is None:
            return
        data = {
            "kind": self.kind,
            "name": self.name,
            "status": status,
            "survivors": list(survivors),
            "parent": rundir.parent_record(),
            "tasks": [t.as_state() for t in self.tasks if t.pid],
        }
        if self.network is not None:
            data["network"] = self.network.record
        try:
            rundir.write_json_atomic(self.run_dir / "state.json", data)
        except OSError as exc:
            if self._state_error is None:
                self._state_error = str(exc)
                print(
                    f"[lab_utils.cluster] warning: could not write {self.run_dir / 'state.json'} ({exc}); "
                    "if this kernel dies, `python -m lab_utils reap` cannot find this job's processes",
                    flush=True,
                )

    def _strays(self) -> list[Recorded]:
        """Children of this kernel carrying this job's token that no Task records: a
        ``Popen`` interrupted between fork and return. A fork not yet exec'd still shows
        the kernel's command line: give it a moment (bounded) to become the task."""
        me = psutil.Process()
        own_cmdline = me.cmdline()
        known = {t.pid for t in self.tasks if t.pid}
        found = []
        for child in me.children():
            try:
                if child.pid in known or child.create_time() < self._spawn_since - 1.0:
                    continue
                deadline = time.monotonic() + 2.0
                while child.cmdline() == own_cmdline and time.monotonic() < deadline:
                    pause()
                if child.environ().get(config.JOB) == self.token:
                    found.append(Recorded(f"stray:{child.pid}", child.pid, child.pid, child.create_time()))
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        return found

    def _build_network(self, n_tasks: int) -> None:
        """Place the tasks on emulated hosts (``self.emulate``), round-robin, building the
        network once per start (named namespaces, or a user namespace of the job's own:
        :func:`~lab_utils.cluster.netem.how`); where neither can be made, say in one line
        why, and that hosts stay local."""
        if self.network is not None and not self.network.destroyed:
            return
        if self.emulate is None:
            if self._all_local():
                self._build_private(n_tasks)
            return
        reason = netem.unavailable_reason()
        if reason is not None:
            self._note(netem.not_emulated(reason))
            self.emulate = None
            if self._all_local():  # still a network of its own, where one can be made
                self._build_private(n_tasks)
            return
        n_hosts = self.emulate.n or n_tasks
        self.network = netem.network(self.emulate, n_hosts)
        self._save_state()  # recorded before anything exists, so reap finds a half-built one
        self.network.build()
        for text in self.network.notes:
            self._note(text)
        self.placement = [i % n_hosts for i in range(n_tasks)]
        self._save_state()

    def _all_local(self) -> bool:
        """Whether every task runs on this machine (subclasses know their hosts)."""
        return False

    def _build_private(self, n_tasks: int) -> None:
        """Local tasks run in a network of the job's own (:class:`~lab_utils.cluster.userns.PrivateNetwork`):
        they talk over its loopback, and nothing outside can reach their servers. Where no
        namespace can be made, :meth:`_unprotected` decides (and says so)."""
        try:
            self.network = userns.private_network()
        except netem.NetworkError as exc:
            self.network = None
            self._unprotected(str(exc).removeprefix("no private network here: "))
            return
        self._save_state()  # recorded before it exists, so reap finds its holder
        self.network.build()
        self.placement = [0] * n_tasks
        self._save_state()

    def _unprotected(self, reason: str) -> None:
        """No private network (``reason``): the tasks' servers listen in this machine's
        namespace. Subclasses bind them to loopback where their framework allows it, or
        refuse; the base only says so."""
        self._note(f"no private network for this job ({reason}): its servers are reachable from this machine")

    @property
    def emulated(self) -> bool:
        """Whether the tasks run on emulated hosts (not a private network's one host)."""
        return self.network is not None and self.network.kind != "private"

    # ---- public life cycle
    def start(self) -> Job:
        """Check resources, launch every task and wait until all are ready."""
        if not self._stopped:
            return self
        self._check_resources()
        self.run_dir = self._make_run_dir()
        self._spawn_since = time.time()
        self._stopped = False
        self._started_at = time.monotonic()
        _REGISTRY.add(self)
        try:
            self._start_and_wait_ready()
        except BaseException:  # KeyboardInterrupt included: stop, then re-raise
            self.stop()
            raise
        if self.stream:
            self._start_streaming()
        return self

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM every task's process group, wait ``grace`` s (the guard's own grace,
        plus one), SIGKILL what is left. A task still alive after that is marked
        ``survived`` in the state file and named in a note."""
        if self._stopped:
            return
        grace = self.grace if grace is None else grace
        live = [t for t in self.tasks if t.running()]
        for t in live:
            t.state = "stopped"
        outcome = None
        try:
            outcome = terminate([*live, *self._strays()], grace + 1.0)
        finally:
            survivors = outcome.survivors if outcome else [t for t in live if t.running()]
            self._finish_stop(survivors)
        if outcome.interrupted:
            raise KeyboardInterrupt

    def _finish_stop(self, survivors: Sequence) -> None:
        for t in self.tasks:
            t.poll()
        for s in survivors:
            if isinstance(s, Task):
                s.state = "survived"
        self._stopped = True
        self._stop_streaming()
        names = [s.name for s in survivors]
        if self.network is not None:
            names += self.network.destroy()
        self._save_state("survived" if names else "stopped", names)
        _REGISTRY.discard(self)
        if names:  # always shown, progress or not: something is still running
            text = (
                f"{', '.join(names)} still running after SIGKILL (recorded in {self.run_dir}/state.json); "
                "`python -m lab_utils reap --all` tries again"
            )
            self.notes.append(text)
            print(f"[lab_utils.cluster] warning: {text}", flush=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        if not getattr(self, "_stopped", True):
            import warnings

            warnings.warn(
                f"{self!r} was not stopped; atexit or lab_utils.cluster.reap() will", ResourceWarning, stacklevel=1
            )

    @property
    def running(self) -> bool:
        return not self._stopped

    def task_pids(self) -> dict[str, int]:
        """``{task: pid}`` of the tasks still running (each pid is the root of the
        task's process tree: the guard, then the script; lab_utils.metrics sums trees)."""
        return {t.name: t.pid for t in self.tasks if t.pid and t.exit_code is None}

    def _fail(self, task: Task, why: str) -> ClusterError:
        self.stop()
        return ClusterError(
            f"{task.name} {why} (pid {task.pid}, exit code {task.exit_code}; log {task.log_path})",
            task=task.name,
            exit_code=task.exit_code,
            log_tail=tail(task.log_path),
        )

    def wait(self, timeout: float | None = None, progress: bool | None = None) -> dict:
        """Block until the job's main tasks end; returns :meth:`results`.

        Raises :class:`ClusterError` as soon as a task exits non-zero (the
        others are stopped) or when ``timeout`` (default: the run timeout
        counted from start) passes. Interrupt stops the job and re-raises."""
        if self._started_at is None:
            raise RuntimeError("start the job first: `with TFCluster(...) as c:` or c.start()")
        try:
            return self._wait(timeout, self.progress if progress is None else progress)
        except KeyboardInterrupt:
            self.stop()
            raise

    def _deadline(self, timeout: float | None) -> tuple[float | None, float | None]:
        if timeout is not None:
            return time.monotonic() + timeout, timeout
        if self.timeout is not None:
            return self._started_at + self.timeout, self.timeout
        return None, None

    def _wait(self, timeout: float | None, progress: bool) -> dict:
        deadline, limit = self._deadline(timeout)
        bar = StatusLine(self.status_line) if progress else None
        try:
            while True:
                failed, finished = self._check()
                if bar:
                    bar.update()
                if failed is not None:
                    raise self._fail(failed, f"exited with code {failed.exit_code}")
                if finished:
                    self.stop()
                    self.write_trace()
                    break
                if deadline is not None and time.monotonic() > deadline:
                    hung = next((t for t in self._main_tasks() if t.running()), self.tasks[0])
                    raise self._fail(
                        hung, f"was still running after the run timeout of {limit:g} s; the whole job was stopped"
                    )
                pause()
        finally:
            if bar:
                bar.update(final=True)
        return self.results()

    def write_trace(self):
        """The run's timeline (:mod:`lab_utils.timeline`), written to ``trace.json`` in the
        run folder when the job ends well; returns it (None without a run folder)."""
        if self.run_dir is None:
            return None
        from lab_utils import timeline

        tasks = [name for name, _ in self._event_files()]
        self.timeline = timeline.write_trace(self.run_dir, self.events(), tasks, label=self.name)
        return self.timeline

    def results(self) -> dict:
        """Last ``result`` event of each task / rank: ``{"worker:0": {...}}``."""
        out = {}
        for name, path in self._event_files():
            events = report.read_events(path, "result")
            if events:
                fields = {k: v for k, v in events[-1].items() if k not in ("kind", "task", "pid", "time")}
                out[events[-1].get("task", name)] = fields
        return out

    def events(self, kind: str | None = None) -> list[dict]:
        """Every event the tasks wrote so far (e.g. for lab_utils.metrics)."""
        out = []
        for _, path in self._event_files():
            out += report.read_events(path, kind)
        return sorted(out, key=lambda e: e.get("time", 0))

    # ---- streaming
    def _start_streaming(self) -> None:
        self._stream_stop.clear()
        self._stream_thread = threading.Thread(
            target=self._stream_loop, name=f"lab_utils-stream-{self.name}", daemon=True
        )
        self._stream_thread.start()

    def _stop_streaming(self) -> None:
        if self._stream_thread is not None:
            self._stream_stop.set()
            self._stream_thread.join(timeout=2)
            self._stream_thread = None

    def _stream_loop(self) -> None:
        offsets = {t.name: 0 for t in self.tasks}
        partial = {t.name: b"" for t in self.tasks}
        while True:
            stopping = self._stream_stop.is_set()
            for t in self.tasks:
                try:
                    with open(t.log_path, "rb") as fh:
                        fh.seek(offsets[t.name])
                        data = fh.read()
                except FileNotFoundError:
                    continue
                offsets[t.name] += len(data)
                lines = (partial[t.name] + data).split(b"\n")
                partial[t.name] = lines.pop()
                for line in lines:
                    if not line.startswith(b"# "):
                        for out in self.stream_lines(t, line.decode("utf-8", "replace")):
                            print(out, flush=True)
            if stopping:
                return
            self._stream_stop.wait(0.1)

    def stream_lines(self, task: Task, line: str) -> list[str]:
        """What live streaming prints for one complete line of ``task``'s log."""
        return [f"[{task.name}] {line}"]

    # ---- display
    def _rows(self) -> list[tuple]:
        return [
            (
                t.name,
                t.host or "localhost",
                t.pid or "",
                t.port or "",
                t.state,
                "" if t.exit_code is None else t.exit_code,
            )
            for t in self.tasks
        ]

    def __repr__(self) -> str:
        status = "running" if self.running else "stopped"
        lines = [f"<{type(self).__name__} {self.name!r} {status}, run_dir={self.run_dir}>"]
        for name, host, pid, port, state, code in self._rows():
            exit_text = f" exit={code}" if code != "" else ""
            lines.append(f"  {name:<10} host={host} pid={pid} port={port} {state}{exit_text}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("task", "host", "pid", "port", "state", "exit code"))
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in self._rows()
        )
        status = "running" if self.running else "stopped"
        return (
            f"<div><b>{type(self).__name__}</b> <code>{html.escape(self.name)}</code> ({status})"
            f"<table><tr>{head}</tr>{body}</table><small>{html.escape(str(self.run_dir))}</small></div>"
        )

    def status_line(self) -> str:
        counts: dict[str, int] = {}
        for t in self.tasks:
            counts[t.state] = counts.get(t.state, 0) + 1
        elapsed = time.monotonic() - self._started_at if self._started_at else 0.0
        parts = ", ".join(f"{n} {s}" for s, n in counts.items())
        steps = self._last_steps()
        return f"{self.name}: {parts}" + (f" | {steps}" if steps else "") + f" | {elapsed:.0f} s"

    def _last_steps(self) -> str:
        """Last step of each task, read incrementally (event files grow during long runs)."""
        out = []
        for name, path in self._event_files():
            reader, last = self._step_tails.get(path) or (report.EventTail(path), None)
            last = (reader.read("step") or [last])[-1]
            self._step_tails[path] = (reader, last)
            if last is not None:
                out.append(f"{last.get('task', name)} step {last.get('step')}")
        return ", ".join(out)

    # ---- to implement
    def _check_resources(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _start_and_wait_ready(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _main_tasks(self) -> list[Task]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check(self) -> tuple[Task | None, bool]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _event_files(self) -> list[tuple[str, Path]]:  # pragma: no cover - abstract
        raise NotImplementedError
