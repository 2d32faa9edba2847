"""Start, watch and stop TensorFlow parameter-server clusters and MPI/Horovod jobs.

Labs 2-5 launch several processes from a notebook. This module makes that one
call and makes leaks impossible (models: ipyparallel's ``Cluster``, dask's
``SpecCluster``, Horovod's ``safe_shell_exec``)::

    from lab_utils.cluster import TFCluster, MPIJob

    with TFCluster(ps=1, workers=2, script="train_async.py", args={"steps": 300}) as cluster:
        cluster.wait()                 # one status line; raises ClusterError on failure
        cluster.results()              # {"worker:0": {...}, "worker:1": {...}}
        print(cluster.logs("worker", 1))

    with MPIJob(np=2, script="train_hvd.py", launcher="horovodrun", controller="gloo") as job:
        job.wait()

Task scripts (``train_*.py``) start their server with one call::

    from lab_utils.cluster import start_server, task_config
    server = start_server()            # reads TF_CONFIG, reports "ready"
    cfg = task_config()                # cfg.cluster, cfg.job, cfg.index
    if cfg.job == "ps":
        server.join()

How leaks are prevented (layered):

1. ``with`` / :meth:`stop`: SIGTERM to each task's process group, a grace
   period, then SIGKILL; ``KeyboardInterrupt`` (the notebook's Interrupt button)
   stops the cluster and is re-raised.
2. A registry of live clusters stopped by ``atexit`` (a normal kernel shutdown).
3. Every task runs under :mod:`lab_utils._guard`, a tiny session leader that
   kills the task's whole process tree when the kernel dies, even by SIGKILL.
4. A ``state.json`` per cluster in a per-user run directory; :func:`reap`
   (``python -m lab_utils reap``) stops what a dead kernel left behind.

Nothing here imports TensorFlow (only :func:`start_server` does, inside the
task) and nothing installs signal handlers in the kernel. Ports are picked free
by the parent; nothing is ever written to the kernel's stderr.
"""
from __future__ import annotations

import atexit
import html
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import psutil

from lab_utils import report
from lab_utils.resources import available_memory_bytes, usable_cores

__all__ = [
    "TFCluster",
    "MPIJob",
    "ClusterError",
    "ResourceError",
    "TaskConfig",
    "task_config",
    "start_server",
    "reap",
    "run_root",
    "TF_TASK_MEMORY_BYTES",
]

#: Resident memory of one TensorFlow 2.15 CPU task measured on the course host
#: (import ~390 MB + server and a small model); the resource guard uses it.
TF_TASK_MEMORY_BYTES = 450 * 1024**2
#: Resident memory of one lab_utils._guard middleman (measured: 12 MB).
GUARD_MEMORY_BYTES = 15 * 1024**2
#: Exit code :func:`start_server` uses when the gRPC server cannot bind its port.
BIND_FAILED_EXIT = 75
_BIND_ERRORS = ("Could not start gRPC server", "Address already in use", "Failed to add port")
_POLL = 0.03  # seconds between probes while waiting (a probe, not a "let it start" sleep)
_LAUNCHERS = ("mpirun", "horovodrun")
_CONTROLLERS = ("mpi", "gloo")
# mpirun --tag-output: "[job,rank]<stdout>:"; horovodrun: "[rank]<stdout>:" (capture: the rank).
_RANK_TAG = re.compile(r"\[(?:\d+,)?(\d+)\]<(?:stdout|stderr)>:")
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", socket.gethostname())


class ClusterError(RuntimeError):
    """A task failed, did not become ready in time, or the run timed out.

    ``task`` (e.g. ``"worker:1"``), ``exit_code`` (None if it was still running;
    negative = killed by that signal) and ``log_tail`` (last lines of its log)."""

    def __init__(self, message: str, task: str | None = None, exit_code: int | None = None, log_tail: str = ""):
        self.task, self.exit_code, self.log_tail = task, exit_code, log_tail
        text = message
        if log_tail:
            text += f"\n--- last lines of {task}'s log ---\n{log_tail}"
        super().__init__(text)


class ResourceError(ValueError):
    """The cluster would not fit in the memory this session may use."""


# --------------------------------------------------------------------------- task side


class TaskConfig(NamedTuple):
    """What TF_CONFIG says about this task."""

    cluster: dict  # {"ps": ["localhost:40001"], "worker": [...]}
    job: str  # "ps" or "worker" (or "chief")
    index: int

    @property
    def task(self) -> str:
        return f"{self.job}:{self.index}"

    @property
    def address(self) -> str:
        return self.cluster[self.job][self.index]

    @property
    def is_chief(self) -> bool:
        return self.job == "chief" or (self.job == "worker" and self.index == 0 and "chief" not in self.cluster)


def task_config(env: Mapping[str, str] | None = None) -> TaskConfig:
    """Parse ``TF_CONFIG`` (set by :class:`TFCluster`) into ``(cluster, job, index)``."""
    env = os.environ if env is None else env
    raw = env.get("TF_CONFIG")
    if not raw:
        raise RuntimeError(
            "TF_CONFIG is not set: start this script with lab_utils.cluster.TFCluster "
            "(or set TF_CONFIG by hand to run one task)"
        )
    cfg = json.loads(raw)
    try:
        cluster, job, index = cfg["cluster"], cfg["task"]["type"], int(cfg["task"]["index"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RuntimeError(f"TF_CONFIG has no cluster/task type/task index: {raw!r}") from exc
    if job not in cluster or not 0 <= index < len(cluster[job]):
        raise RuntimeError(f"TF_CONFIG task {job}:{index} is not in its cluster {cluster}")
    return TaskConfig(cluster, job, index)


def start_server(config: TaskConfig | None = None, *, protocol: str = "grpc", session_config=None, ready: bool = True):
    """Create this task's ``tf.distribute.Server`` from TF_CONFIG and report ``ready``.

    ``session_config``: an optional ``tf.compat.v1.ConfigProto`` (e.g. with
    ``device_filters``, see Lab 3's synchronous PS). If the port cannot be
    bound, a ``bind_failed`` event is written and the task exits with code
    75, so the launcher restarts the whole cluster on fresh ports."""
    import tensorflow as tf  # lazy: only task processes pay for it

    cfg = task_config() if config is None else config
    try:
        server = tf.distribute.Server(
            tf.train.ClusterSpec(cfg.cluster),
            job_name=cfg.job,
            task_index=cfg.index,
            protocol=protocol,
            config=session_config,
            start=True,
        )
    except (tf.errors.UnknownError, tf.errors.UnavailableError, tf.errors.InternalError) as exc:
        report.event("bind_failed", address=cfg.address, error=str(exc).strip()[:500])
        print(f"lab_utils.cluster: {cfg.task} could not bind {cfg.address}: {exc}", flush=True)
        raise SystemExit(BIND_FAILED_EXIT) from exc
    if ready:
        report.ready(address=cfg.address, port=int(cfg.address.rsplit(":", 1)[1]), target=server.target)
    return server


# --------------------------------------------------------------------------- run directories


def run_root(env: Mapping[str, str] | None = None) -> Path:
    """Per-user directory holding one sub-directory per cluster (logs, events, state.json).

    ``$LABS_RUN_ROOT``, else ``~/.lab_runs``, else ``<tmp>/lab_runs-<uid>``."""
    env = os.environ if env is None else env
    candidates = []
    if env.get("LABS_RUN_ROOT"):
        candidates.append(Path(env["LABS_RUN_ROOT"]))
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    candidates.append(home / ".lab_runs")
    candidates.append(Path(os.environ.get("TMPDIR", "/tmp")) / f"lab_runs-{os.getuid()}")
    for cand in candidates:
        try:
            cand.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        if os.access(cand, os.W_OK | os.X_OK):
            return cand
    raise RuntimeError(f"no writable run directory among {[str(c) for c in candidates]}; set LABS_RUN_ROOT")


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


def _same_process_alive(pid: int, create_time: float | None) -> bool:
    """True if ``pid`` runs and is the process we recorded (not a reused pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.01
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _kill_groups(entries: Sequence[Mapping[str, Any]], grace: float) -> list[int]:
    """SIGTERM the recorded process groups, wait ``grace`` s, SIGKILL the rest.

    ``entries``: dicts with ``pid``, ``create_time``, ``pgid``. Only processes
    whose create_time still matches are touched. Returns the pids signalled."""
    live = [e for e in entries if e.get("pid") and _same_process_alive(int(e["pid"]), e.get("create_time"))]
    for e in live:
        _signal_group(int(e.get("pgid") or e["pid"]), int(e["pid"]), signal.SIGTERM)
    deadline = time.monotonic() + grace
    procs = []
    for e in live:
        try:
            procs.append(psutil.Process(int(e["pid"])))
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=max(0.0, deadline - time.monotonic()))
    for p in alive:
        entry = next(e for e in live if int(e["pid"]) == p.pid)
        _signal_group(int(entry.get("pgid") or p.pid), p.pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=2.0)
    return [int(e["pid"]) for e in live]


def _signal_group(pgid: int, pid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
        return
    except ProcessLookupError:
        pass
    except PermissionError:
        pass
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap(include_live: bool = False, root: str | os.PathLike | None = None, grace: float = 3.0) -> list[str]:
    """Stop clusters whose kernel is gone (pid *and* start time checked), or all
    of them with ``include_live=True``. Returns the run directories stopped."""
    base = Path(root) if root is not None else run_root()
    stopped = []
    for state_file in sorted(base.glob("*/state.json")):
        try:
            state = json.loads(state_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if state.get("status") == "stopped":
            continue
        parent = state.get("parent", {})
        parent_alive = _same_process_alive(int(parent.get("pid", 0)), parent.get("create_time")) if parent.get("pid") else False
        if parent_alive and not include_live:
            continue
        tasks = state.get("tasks", [])
        touched = _kill_groups(tasks, grace)
        state["status"] = "stopped"
        state["stopped_by"] = "reap"
        try:
            _write_json_atomic(state_file, state)
        except OSError:
            pass
        if touched or not parent_alive:
            stopped.append(str(state_file.parent))
    return stopped


#: Run directories kept per user (logs, events, state of each cluster run); older
#: ones whose processes have all stopped are deleted when a new run starts.
KEEP_RUNS = 200


def prune_runs(keep: int = KEEP_RUNS, root: str | os.PathLike | None = None) -> list[str]:
    """Delete the oldest run directories beyond the newest ``keep``, but only those
    marked stopped whose recorded processes are all gone (a run still in use, or
    left running by a dead kernel for :func:`reap`, is never deleted). Returns the
    directories removed. Called when a cluster starts in the default run root."""
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise ValueError(f"keep must be an integer >= 0, got {keep!r}")
    base = Path(root) if root is not None else run_root()
    runs = sorted((p for p in base.iterdir() if (p / "state.json").is_file()),
                  key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for path in runs[keep:]:
        try:
            state = json.loads((path / "state.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue  # being written, or not ours to judge: keep it
        if state.get("status") != "stopped":
            continue
        if any(t.get("pid") and _same_process_alive(int(t["pid"]), t.get("create_time")) for t in state.get("tasks", [])):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed


# --------------------------------------------------------------------------- launcher side

_REGISTRY: "weakref.WeakSet[_Job]" = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for job in list(_REGISTRY):
        job.stop()


def _pause() -> None:
    """One probe interval while polling under a deadline (not a "let it start" sleep)."""
    time.sleep(_POLL)


def _free_port(host: str = "") -> int:
    """A port the OS says is free now. The task binds it a few seconds later; if
    someone else took it meanwhile the bind fails and the cluster restarts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _is_local(host: str | None) -> bool:
    return host is None or host in _LOCAL_HOSTS


def _format_args(args: Mapping[str, Any] | Sequence[str] | None) -> list[str]:
    """``{"steps": 100, "sync": True, "lr": 0.1}`` -> ``--steps 100 --sync --lr 0.1``."""
    if args is None:
        return []
    if isinstance(args, Mapping):
        out = []
        for key, value in args.items():
            flag = "--" + str(key).replace("_", "-") if not str(key).startswith("-") else str(key)
            if value is True:
                out.append(flag)
            elif value is False or value is None:
                continue
            elif isinstance(value, (list, tuple)):
                out += [flag, *map(str, value)]
            else:
                out += [flag, str(value)]
        return out
    if isinstance(args, (str, bytes)):
        raise TypeError(f"args must be a dict or a list of strings, got the string {args!r}; use shlex.split()")
    return [str(a) for a in args]


def _tail(path: Path | None, lines: int = 20) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            data = fh.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def _in_notebook() -> bool:
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def _fmt_gb(n: float) -> str:
    return f"{n / 1024**3:.1f} GB"


class Task:
    """One launched process (a TF task, or the mpirun/horovodrun launcher)."""

    def __init__(self, name: str, log_path: Path, events_path: Path | None = None, host: str | None = None, port: int | None = None):
        self.name, self.log_path, self.events_path, self.host, self.port = name, log_path, events_path, host, port
        self.popen: subprocess.Popen | None = None
        self.pid: int | None = None
        self.create_time: float | None = None
        self.state = "pending"  # pending, starting, ready, done, failed, stopped
        self.exit_code: int | None = None

    @property
    def role(self) -> str:
        return self.name.split(":")[0]

    def poll(self) -> int | None:
        if self.popen is not None and self.exit_code is None:
            code = self.popen.poll()
            if code is not None:
                self.exit_code = code
                if self.state not in ("stopped",):
                    self.state = "done" if code == 0 else "failed"
        return self.exit_code

    def running(self) -> bool:
        return self.popen is not None and self.poll() is None

    def events(self, kind: str | None = None) -> list[dict]:
        return report.read_events(self.events_path, kind) if self.events_path else []

    def as_state(self) -> dict:
        return {"name": self.name, "pid": self.pid, "pgid": self.pid, "create_time": self.create_time,
                "host": self.host, "port": self.port, "log": str(self.log_path)}

    def __repr__(self) -> str:
        code = "" if self.exit_code is None else f" exit={self.exit_code}"
        port = f" port={self.port}" if self.port else ""
        return f"<Task {self.name} pid={self.pid}{port} {self.state}{code}>"


class _Job:
    """Common life cycle: start (wait ready), wait, stop, results, logs, repr."""

    kind = "job"

    def __init__(self, script, args, *, env, run_dir, ready_timeout, timeout, stream, guard, grace, cwd, name, progress):
        if not isinstance(script, (str, os.PathLike)) or not str(script):
            raise ValueError(f"script must be a path to a Python file or a module name, got {script!r}")
        script = str(script)
        self.module = None
        if script.startswith("-m "):
            self.module = script[3:].strip()
            self.script = None
        else:
            path = Path(cwd or ".") / script if not Path(script).is_absolute() else Path(script)
            if not path.is_file():
                raise ValueError(f"script {script!r} not found (looked at {path.resolve()}); give the path to a train_*.py file")
            self.script = str(path.resolve())
        self.args = _format_args(args)
        for label, value in (("ready_timeout", ready_timeout), ("timeout", timeout), ("grace", grace)):
            if value is not None and not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"{label} must be a positive number of seconds or None, got {value!r}")
        self.extra_env = dict(env or {})
        self.ready_timeout, self.timeout, self.grace = ready_timeout, timeout, grace
        self.stream, self.use_guard, self.progress = stream, guard, progress
        self.cwd = str(cwd) if cwd else os.getcwd()
        self.name = name or (Path(self.script).stem if self.script else self.module)
        self._run_dir_arg = run_dir
        self.run_dir: Path | None = None
        self.tasks: list[Task] = []
        self.notes: list[str] = []
        self.attempts = 0
        self._started_at: float | None = None
        self._ready_at: float | None = None
        self._stopped = True
        self._stream_stop = threading.Event()
        self._stream_thread: threading.Thread | None = None
        self._step_cache: dict[Path, tuple[int, dict | None]] = {}

    # ---- helpers for subclasses
    def _python(self) -> list[str]:
        target = ["-m", self.module] if self.module else [self.script]
        return [sys.executable, "-u", *target, *self.args]

    def _base_env(self) -> dict:
        env = dict(os.environ)
        env.update({"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2", "LABS_RUN_DIR": str(self.run_dir)})
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
        stamp = time.strftime("%Y%m%d-%H%M%S")
        root = run_root()
        prune_runs(KEEP_RUNS, root)
        path = root / f"{self.kind}-{self.name}-{stamp}-{os.getpid()}-{secrets.token_hex(3)}"
        path.mkdir(parents=True)
        return path

    def _launch(self, task: Task, cmd: list[str], env: dict) -> None:
        task.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.use_guard:
            cmd = [sys.executable, "-m", "lab_utils._guard", "--parent", str(os.getpid()),
                   "--grace", str(self.grace), "--", *cmd]
        with open(task.log_path, "ab", buffering=0) as log:
            log.write(f"# {task.name}: {shlex.join(cmd)}\n".encode())
            task.popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, cwd=self.cwd, close_fds=True, start_new_session=True,
            )
        task.pid = task.popen.pid
        task.create_time = _create_time(task.pid)
        task.state = "starting"
        self._save_state()

    def _save_state(self, status: str = "running") -> None:
        if self.run_dir is None:
            return
        me = os.getpid()
        data = {
            "kind": self.kind, "name": self.name, "status": status,
            "parent": {"pid": me, "create_time": _create_time(me), "argv0": sys.argv[0] if sys.argv else ""},
            "tasks": [t.as_state() for t in self.tasks if t.pid],
        }
        try:
            _write_json_atomic(self.run_dir / "state.json", data)
        except OSError:
            pass

    # ---- public life cycle
    def start(self) -> "_Job":
        """Check resources, launch every task and wait until all are ready."""
        if not self._stopped:
            return self
        self._check_resources()
        self.run_dir = self._make_run_dir()
        self._stopped = False
        self._started_at = time.monotonic()
        _REGISTRY.add(self)
        try:
            self._start_and_wait_ready()
        except BaseException:  # KeyboardInterrupt included: stop, then re-raise
            self.stop()
            raise
        self._ready_at = time.monotonic()
        if self.stream:
            self._start_streaming()
        return self

    def stop(self, grace: float | None = None) -> None:
        """SIGTERM every task's process group, wait ``grace`` s, SIGKILL what is left."""
        if self._stopped:
            return
        grace = self.grace if grace is None else grace
        live = [t for t in self.tasks if t.running()]
        for t in live:
            t.state = "stopped"
            _signal_group(t.pid, t.pid, signal.SIGTERM)
        # The guard itself waits `grace` for the tree; give it a little more.
        deadline = time.monotonic() + grace + 1.0
        for t in live:
            try:
                t.popen.wait(timeout=max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(t.pid, t.pid, signal.SIGKILL)
        for t in live:
            try:
                t.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            t.poll()
        self._stopped = True
        self._stop_streaming()
        self._save_state("stopped")
        _REGISTRY.discard(self)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def __del__(self):
        if not getattr(self, "_stopped", True):
            import warnings

            warnings.warn(f"{self!r} was not stopped; atexit or lab_utils.cluster.reap() will", ResourceWarning, stacklevel=1)

    @property
    def running(self) -> bool:
        return not self._stopped

    def task_pids(self) -> dict[str, int]:
        """``{task: pid}`` of the tasks still running (each pid is the root of the
        task's process tree: the guard, then the script; lab_utils.metrics sums trees)."""
        return {t.name: t.pid for t in self.tasks if t.pid and t.exit_code is None}

    def _fail(self, task: Task, why: str) -> ClusterError:
        code = task.exit_code
        self.stop()
        return ClusterError(f"{task.name} {why} (pid {task.pid}, exit code {code}; log {task.log_path})",
                            task=task.name, exit_code=code, log_tail=_tail(task.log_path))

    def wait(self, timeout: float | None = None, progress: bool | None = None) -> dict:
        """Block until the job's main tasks end; returns :meth:`results`.

        Raises :class:`ClusterError` as soon as a task exits non-zero (the
        others are stopped) or when ``timeout`` (default: the run timeout
        counted from start) passes. Interrupt stops the job and re-raises."""
        try:
            return self._wait(timeout, progress)
        except KeyboardInterrupt:
            self.stop()
            raise

    def _wait(self, timeout: float | None, progress: bool | None) -> dict:
        if self._started_at is None:
            raise RuntimeError("start the job first: `with TFCluster(...) as c:` or c.start()")
        progress = self.progress if progress is None else progress
        if timeout is not None:
            deadline = time.monotonic() + timeout
        elif self.timeout is not None:
            deadline = self._started_at + self.timeout
        else:
            deadline = None
        bar = _Progress(self) if progress else None
        try:
            while True:
                failed, finished = self._check()
                if bar:
                    bar.update()
                if failed is not None:
                    raise self._fail(failed, f"exited with code {failed.exit_code}")
                if finished:
                    self.stop()
                    break
                if deadline is not None and time.monotonic() > deadline:
                    hung = next((t for t in self._main_tasks() if t.running()), self.tasks[0])
                    limit = timeout if timeout is not None else self.timeout
                    raise self._fail(hung, f"was still running after the run timeout of {limit:g} s; "
                                     "the whole job was stopped")
                _pause()
        finally:
            if bar:
                bar.update(final=True)
        return self.results()

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
        self._stream_thread = threading.Thread(target=self._stream_loop, name=f"lab_utils-stream-{self.name}", daemon=True)
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
                        for out in self._stream_format(t, line.decode("utf-8", "replace")):
                            print(out, flush=True)
            if stopping:
                return
            self._stream_stop.wait(0.1)

    def _stream_format(self, task: "Task", line: str) -> list[str]:
        """What live streaming prints for one complete line of ``task``'s log."""
        return [f"[{task.name}] {line}"]

    # ---- display
    def _rows(self) -> list[tuple]:
        return [(t.name, t.host or "localhost", t.pid or "", t.port or "", t.state,
                 "" if t.exit_code is None else t.exit_code) for t in self.tasks]

    def __repr__(self) -> str:
        status = "running" if self.running else "stopped"
        lines = [f"<{type(self).__name__} {self.name!r} {status}, run_dir={self.run_dir}>"]
        for name, host, pid, port, state, code in self._rows():
            lines.append(f"  {name:<10} host={host} pid={pid} port={port} {state}" + (f" exit={code}" if code != "" else ""))
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("task", "host", "pid", "port", "state", "exit code"))
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in self._rows())
        status = "running" if self.running else "stopped"
        return (f"<div><b>{type(self).__name__}</b> <code>{html.escape(self.name)}</code> ({status})"
                f"<table><tr>{head}</tr>{body}</table><small>{html.escape(str(self.run_dir))}</small></div>")

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
            offset, last = self._step_cache.get(path, (0, None))
            try:
                with open(path, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            for line in complete.splitlines():
                if b'"kind":"step"' in line:
                    try:
                        last = json.loads(line)
                    except json.JSONDecodeError:
                        continue
            self._step_cache[path] = (offset + len(complete), last)
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


class _Progress:
    """One status line updated in place: a display handle in a notebook, ``\\r`` in a
    terminal, a line per change otherwise. Always stdout, never a widget."""

    def __init__(self, job: _Job):
        self.job, self.last, self.handle, self.tty = job, None, None, False
        self.notebook = _in_notebook()
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
        self._next = now + 0.5
        line = self.job.status_line()
        if self.notebook:
            from IPython.display import display

            obj = _TextLine(line)
            if self.handle is None:
                self.handle = display(obj, display_id=True)
            else:
                self.handle.update(obj)
        elif self.tty:
            sys.stdout.write("\r" + line.ljust(79) + ("\n" if final else ""))
            sys.stdout.flush()
        elif final or line.split(" | ")[0] != (self.last or "").split(" | ")[0]:
            print(line, flush=True)
        self.last = line


class _TextLine:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


# --------------------------------------------------------------------------- TensorFlow PS cluster


class TFCluster(_Job):
    """A TensorFlow parameter-server cluster: ``ps`` PS tasks + ``workers`` workers.

    Each task runs ``python script <args>`` with ``TF_CONFIG`` (ports picked
    free by the parent), ``LABS_TASK``, ``LABS_REPORT_FILE``, ``LABS_RUN_DIR``.
    A task is ready when it reports ``ready`` (:func:`start_server` does).
    :meth:`wait` returns when every worker exited 0; PS tasks (which
    ``server.join()`` forever) are then stopped: the normal end.

    ``hosts``: one host per task, PS first then workers (e.g. ``["n1", "n2",
    "n2"]``); remote tasks are started with ``ssh -tt`` (key-based login, the
    same Python path and repo on every node, and the run directory on a shared
    file system such as an NFS home, since readiness and results are read from
    the tasks' events files). Remote ports cannot be probed from here: they are
    drawn at random and a failed bind restarts the cluster. Local by default.
    """

    kind = "tf"

    def __init__(
        self,
        ps: int = 1,
        workers: int = 2,
        script: str | os.PathLike = "train_async.py",
        args: Mapping[str, Any] | Sequence[str] | None = None,
        *,
        hosts: Sequence[str] | None = None,
        ssh: Sequence[str] | str = ("ssh", "-o", "BatchMode=yes"),
        env: Mapping[str, str] | None = None,
        run_dir: str | os.PathLike | None = None,
        ready_timeout: float = 120.0,
        timeout: float | None = 900.0,
        stream: bool = False,
        progress: bool = True,
        memory_per_task: int | None = None,
        check_resources: bool = True,
        start_retries: int = 3,
        guard: bool = True,
        grace: float = 3.0,
        cwd: str | os.PathLike | None = None,
        name: str | None = None,
    ):
        for label, value in (("ps", ps), ("workers", workers)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{label} must be an integer >= 0, got {value!r}")
        if workers == 0:
            raise ValueError(f"workers must be at least 1 (got ps={ps}, workers=0): a cluster without workers trains nothing")
        if ps == 0:
            raise ValueError(f"ps must be at least 1 for a parameter-server cluster (got ps=0, workers={workers}); "
                             "for data-parallel training without a PS use MPIJob")
        if not isinstance(start_retries, int) or start_retries < 1:
            raise ValueError(f"start_retries must be an integer >= 1, got {start_retries!r}")
        n = ps + workers
        if hosts is not None:
            if isinstance(hosts, str):
                raise ValueError(f"hosts must be a list with one host per task ({n}), got the string {hosts!r}")
            hosts = list(hosts)
            if len(hosts) != n:
                raise ValueError(f"hosts needs one entry per task (ps first, then workers): {n} expected, got {len(hosts)}")
        if memory_per_task is not None and memory_per_task <= 0:
            raise ValueError(f"memory_per_task must be a positive number of bytes, got {memory_per_task!r}")
        super().__init__(script, args, env=env, run_dir=run_dir, ready_timeout=ready_timeout, timeout=timeout,
                         stream=stream, guard=guard, grace=grace, cwd=cwd, name=name, progress=progress)
        self.ps, self.workers = ps, workers
        self.hosts = hosts or [None] * n
        self.ssh = shlex.split(ssh) if isinstance(ssh, str) else list(ssh)
        self.memory_per_task = TF_TASK_MEMORY_BYTES if memory_per_task is None else int(memory_per_task)
        self.check_resources = check_resources
        self.start_retries = start_retries

    # -- resources
    def _check_resources(self) -> None:
        local = sum(1 for h in self.hosts if _is_local(h))
        if not self.check_resources or local == 0:
            return
        per_task = self.memory_per_task + (GUARD_MEMORY_BYTES if self.use_guard else 0)
        need = local * per_task
        avail = available_memory_bytes()
        if need > avail:
            fit = int(avail // per_task) - self.ps
            hint = f"try workers={fit}" if fit >= 1 else "close other notebooks (Kernel > Shut Down) or run `python -m lab_utils reap`"
            raise ResourceError(
                f"{self.ps} PS + {self.workers} workers needs about {_fmt_gb(need)} "
                f"({per_task / 1024**2:.0f} MB per TensorFlow task), {_fmt_gb(avail)} available "
                f"under this session's limit; {hint}"
            )
        cores = usable_cores()
        if local > cores:
            self._note(f"{local} tasks share {cores} usable core(s): they take turns on the CPU, "
                       "so timings are slower than on one machine per task")

    # -- spec
    def task_names(self) -> list[str]:
        return [f"ps:{i}" for i in range(self.ps)] + [f"worker:{i}" for i in range(self.workers)]

    def cluster_spec(self) -> dict:
        """The ClusterSpec dict handed to tasks (after start: with the real ports)."""
        spec: dict[str, list[str]] = {"ps": [], "worker": []}
        for t in self.tasks:
            spec[t.role].append(f"{t.host or 'localhost'}:{t.port}")
        return spec

    def _new_tasks(self, attempt: int) -> None:
        self.tasks = []
        used = set()
        for name, host in zip(self.task_names(), self.hosts):
            if _is_local(host):
                port = _free_port()
                while port in used:
                    port = _free_port()
            else:  # cannot probe a remote host: a random high port, retried on bind failure
                port = 20000 + secrets.randbelow(30000)
            used.add(port)
            stem = name.replace(":", "-")
            sub = self.run_dir / f"attempt-{attempt}" if attempt > 1 else self.run_dir
            self.tasks.append(Task(name, sub / f"{stem}.log", sub / f"{stem}.jsonl", host=host, port=port))

    def _task_command(self, task: Task, env: dict) -> list[str]:
        cmd = self._python()
        if _is_local(task.host):
            return cmd
        keep = ("TF_CONFIG", "LABS_TASK", "LABS_REPORT_FILE", "LABS_RUN_DIR", "PYTHONUNBUFFERED",
                "TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH", *self.extra_env)
        exports = [f"{k}={shlex.quote(env[k])}" for k in keep if k in env]
        remote = f"cd {shlex.quote(self.cwd)} && env {' '.join(exports)} {shlex.join(cmd)}"
        return [*self.ssh, "-tt", task.host, remote]

    def _start_and_wait_ready(self) -> None:
        for attempt in range(1, self.start_retries + 1):
            self.attempts = attempt
            self._new_tasks(attempt)
            spec = self.cluster_spec()
            base = self._base_env()
            for t in self.tasks:
                env = dict(base)
                env["TF_CONFIG"] = json.dumps({"cluster": spec, "task": {"type": t.role, "index": int(t.name.split(":")[1])}})
                env["LABS_TASK"] = t.name
                env["LABS_REPORT_FILE"] = str(t.events_path)
                env.pop("LABS_REPORT_DIR", None)
                self._launch(t, self._task_command(t, env), env)
            bad = self._wait_ready()
            if bad is None:
                return
            if self._bind_failed(bad) and attempt < self.start_retries:
                self._note(f"{bad.name} could not bind port {bad.port}; restarting the cluster on fresh ports "
                           f"(attempt {attempt + 1} of {self.start_retries})")
                for t in self.tasks:
                    if t.running():
                        _signal_group(t.pid, t.pid, signal.SIGTERM)
                for t in self.tasks:
                    if t.popen is not None:
                        try:
                            t.popen.wait(timeout=self.grace + 2)
                        except subprocess.TimeoutExpired:
                            _signal_group(t.pid, t.pid, signal.SIGKILL)
                            t.popen.wait()
                continue
            raise self._fail(bad, f"exited with code {bad.exit_code} before it was ready")

    @staticmethod
    def _bind_failed(task: Task) -> bool:
        if task.exit_code == BIND_FAILED_EXIT or task.events("bind_failed"):
            return True
        tail = _tail(task.log_path, 60)
        return any(marker in tail for marker in _BIND_ERRORS)

    def _wait_ready(self) -> Task | None:
        """Poll events files and process states until every task reported ready.
        Returns a task that exited first, or None when all are ready."""
        deadline = time.monotonic() + self.ready_timeout
        pending = list(self.tasks)
        while pending:
            for t in list(pending):
                if t.events("ready"):
                    t.state = "ready"
                    pending.remove(t)
                elif t.poll() is not None:
                    return t
            if not pending:
                break
            if time.monotonic() > deadline:
                slow = pending[0]
                raise self._fail(slow, f"did not report ready within {self.ready_timeout:g} s "
                                 "(does the script call lab_utils.cluster.start_server()?)")
            _pause()
        self._save_state()
        return None

    def _main_tasks(self) -> list[Task]:
        return [t for t in self.tasks if t.role == "worker"]

    def _check(self) -> tuple[Task | None, bool]:
        for t in self.tasks:
            t.poll()
        for t in self.tasks:
            if t.exit_code is not None and t.state == "failed":
                return t, False
            if t.role == "ps" and t.exit_code is not None and t.state != "stopped":
                return t, False  # a PS that ends by itself (even with 0) leaves workers hanging
        return None, all(t.exit_code == 0 for t in self._main_tasks())

    def _event_files(self) -> list[tuple[str, Path]]:
        return [(t.name, t.events_path) for t in self.tasks]

    def _find(self, role: str, index: int | None) -> Task:
        name = role if index is None and ":" in role else f"{role}:{index or 0}"
        for t in self.tasks:
            if t.name == name:
                return t
        raise ValueError(f"no task {name!r}; tasks are {[t.name for t in self.tasks]}")

    def logs(self, role: str = "worker", index: int | None = 0, tail: int | None = None) -> str:
        """Log (stdout + stderr) of one task, e.g. ``logs("worker", 1)`` or ``logs("ps:0")``."""
        task = self._find(role, index)
        if tail is not None:
            return _tail(task.log_path, tail)
        try:
            return task.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def task(self, role: str, index: int | None = 0) -> Task:
        return self._find(role, index)


# --------------------------------------------------------------------------- MPI / Horovod


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


class MPIJob(_Job):
    """``mpirun`` or ``horovodrun`` running ``np`` copies of a script.

    ``controller``: ``"mpi"`` or ``"gloo"`` (horovodrun only; mpirun is MPI).
    ``hosts``: a list like ``["n1:2", "n2:2"]`` or a hostfile path (``-H`` /
    ``--hostfile``); local by default. As root the Open MPI run-as-root
    switches are added; ``--oversubscribe`` when ``np`` exceeds usable cores.
    Each rank's ``lab_utils.report`` events go to ``rank-<r>.jsonl``; the job
    counts as started once the launcher runs; :meth:`wait` is what matters.
    """

    kind = "mpi"

    def __init__(
        self,
        np: int = 2,
        script: str | os.PathLike = "train_hvd.py",
        args: Mapping[str, Any] | Sequence[str] | None = None,
        *,
        launcher: str = "horovodrun",
        controller: str | None = None,
        hosts: Sequence[str] | str | os.PathLike | None = None,
        launcher_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        run_dir: str | os.PathLike | None = None,
        ready_timeout: float = 60.0,
        timeout: float | None = 900.0,
        stream: bool = False,
        progress: bool = True,
        memory_per_rank: int | None = None,
        check_resources: bool = True,
        guard: bool = True,
        grace: float = 3.0,
        cwd: str | os.PathLike | None = None,
        name: str | None = None,
    ):
        if isinstance(np, bool) or not isinstance(np, int) or np < 1:
            raise ValueError(f"np must be an integer >= 1, got {np!r}")
        if launcher not in _LAUNCHERS:
            raise ValueError(f"unknown launcher {launcher!r}; allowed: {', '.join(_LAUNCHERS)}")
        if controller is None:
            controller = "mpi" if launcher == "mpirun" else "gloo"
        if controller not in _CONTROLLERS:
            raise ValueError(f"unknown controller {controller!r}; allowed: {', '.join(_CONTROLLERS)}")
        if launcher == "mpirun" and controller != "mpi":
            raise ValueError("launcher='mpirun' always uses the MPI controller; for Gloo use launcher='horovodrun', controller='gloo'")
        exe = self._launcher_path(launcher)
        if exe is None:
            raise ValueError(f"launcher {launcher!r} not found next to {sys.executable} or on PATH")
        hostfile = None
        if hosts is not None and not isinstance(hosts, (list, tuple)):
            hostfile = Path(hosts)
            if not hostfile.is_file():
                raise ValueError(f"hosts must be a list like ['n1:2', 'n2:2'] or an existing hostfile, got {hosts!r}")
            hosts = None
        if memory_per_rank is not None and memory_per_rank <= 0:
            raise ValueError(f"memory_per_rank must be a positive number of bytes, got {memory_per_rank!r}")
        super().__init__(script, args, env=env, run_dir=run_dir, ready_timeout=ready_timeout, timeout=timeout,
                         stream=stream, guard=guard, grace=grace, cwd=cwd, name=name, progress=progress)
        self.np, self.launcher, self.controller = np, launcher, controller
        self.launcher_exe, self.hosts, self.hostfile = exe, list(hosts) if hosts else None, hostfile
        self.launcher_args = list(launcher_args)
        self.memory_per_rank = TF_TASK_MEMORY_BYTES if memory_per_rank is None else int(memory_per_rank)
        self.check_resources = check_resources
        self._rank_pids: dict[str, int] | None = None
        self._stream_partial: dict[int, str] = {}  # streaming: a rank's line still waiting for its end

    @staticmethod
    def _launcher_path(launcher: str) -> str | None:
        local = Path(sys.executable).parent / launcher
        if local.exists():
            return str(local)
        return shutil.which(launcher)

    def _local_ranks(self) -> int:
        if not self.hosts and not self.hostfile:
            return self.np
        if self.hosts:
            n = 0
            for h in self.hosts:
                name, _, slots = str(h).partition(":")
                if _is_local(name):
                    n += int(slots or 1)
            return min(n, self.np)
        return 0  # hostfile: the ranks run where it says

    def _check_resources(self) -> None:
        local = self._local_ranks()
        if not self.check_resources or local == 0:
            return
        need = local * self.memory_per_rank
        avail = available_memory_bytes()
        if need > avail:
            fit = int(avail // self.memory_per_rank)
            hint = f"try np={fit}" if fit >= 1 else "close other notebooks or run `python -m lab_utils reap`"
            raise ResourceError(f"np={self.np} needs about {_fmt_gb(need)} ({self.memory_per_rank / 1024**2:.0f} MB per rank), "
                                f"{_fmt_gb(avail)} available under this session's limit; {hint}")

    def command(self) -> tuple[list[str], dict]:
        """The launcher command line and the extra environment (used by start; shown for teaching)."""
        cores = usable_cores()
        root = os.getuid() == 0
        extra = {}
        local = self._local_ranks()
        if self.launcher == "mpirun":
            cmd = [self.launcher_exe, "-np", str(self.np), "--tag-output"]
            if root:
                cmd.append("--allow-run-as-root")
            if local > cores:
                cmd.append("--oversubscribe")
            if self.hosts:
                cmd += ["-H", ",".join(self.hosts)]
            elif self.hostfile:
                cmd += ["--hostfile", str(self.hostfile)]
            for var in ("LABS_REPORT_DIR", "LABS_RUN_DIR", "PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL", "PYTHONPATH", *self.extra_env):
                cmd += ["-x", var]
        else:
            cmd = [self.launcher_exe, "-np", str(self.np), "--gloo" if self.controller == "gloo" else "--mpi"]
            if self.hosts:
                cmd += ["-H", ",".join(self.hosts)]
            elif self.hostfile:
                cmd += ["--hostfile", str(self.hostfile)]
            else:
                cmd += ["-H", f"localhost:{self.np}"]
            if root:
                extra.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            if local > cores and self.controller == "mpi":
                extra["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
        if local > cores:
            self._note(f"np={self.np} ranks on {cores} usable core(s): oversubscribed, ranks take turns on the CPU")
        return [*cmd, *self.launcher_args, *self._python()], extra

    def _start_and_wait_ready(self) -> None:
        self.attempts = 1
        self._rank_pids = None
        self._stream_partial = {}
        report_dir = self.run_dir / "ranks"
        report_dir.mkdir(exist_ok=True)
        self.tasks = [Task(self.launcher, self.run_dir / f"{self.launcher}.log")]
        cmd, extra = self.command()
        env = self._base_env()
        env.update(extra)
        env["LABS_REPORT_DIR"] = str(report_dir)
        env.pop("LABS_REPORT_FILE", None)
        env.pop("LABS_TASK", None)
        self._launch(self.tasks[0], cmd, env)
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

    def _stream_format(self, task: Task, line: str) -> list[str]:
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
