"""TensorFlow parameter-server clusters: the task side (TF_CONFIG, the server) and ``TFCluster``.

Task scripts (``train_*.py``) start their server with one call::

    from lab_utils.cluster import start_server, task_config
    server = start_server()            # reads TF_CONFIG, reports "ready"
    cfg = task_config()                # cfg.cluster, cfg.job, cfg.index
    if cfg.job == "ps":
        server.join()

The notebook side::

    with TFCluster(ps=1, workers=2, script="train_async.py", args={"steps": 300}) as cluster:
        cluster.wait()                 # one status line; raises ClusterError on failure
        cluster.results()              # {"worker:0": {...}, "worker:1": {...}}
        print(cluster.logs("worker", 1))

Only :func:`start_server` imports TensorFlow, inside the task.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from lab_utils import checks, config, report, resources
from lab_utils.cluster import hosts, netem
from lab_utils.cluster.hosts import named_hosts
from lab_utils.cluster.job import Job, JobOptions, pause
from lab_utils.cluster.process import ClusterError, Task, check_fit, terminate
from lab_utils.cluster.process import tail as log_tail
from lab_utils.options import keyword_options

#: Exit code :func:`start_server` uses when the gRPC server cannot bind its port.
BIND_FAILED_EXIT = 75
_BIND_ERRORS = ("Could not start gRPC server", "Address already in use", "Failed to add port")


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


class TFCluster(Job):
    """A TensorFlow cluster: ``ps`` PS tasks + ``workers`` workers (+ a ``chief``).

    ``ps=0`` is a cluster of workers only, for collective training
    (``MultiWorkerMirroredStrategy``, Lab 4): its ``TF_CONFIG`` names no ``ps`` job.
    ``chief=1`` adds ``chief:0``, the coordinator of TF2's ``ParameterServerStrategy``
    (Lab 2's aside): the chief alone runs the training loop and ends by itself; the PS
    tasks and workers are servers that never do (a server that exits while the chief
    runs is a failure), and are stopped when the chief has exited 0.

    Each task runs ``python script <args>`` with ``TF_CONFIG`` (ports picked
    free by the parent), ``LABS_TASK``, ``LABS_REPORT_FILE``, ``LABS_RUN_DIR``.
    A task is ready when it reports ``ready`` (:func:`start_server` does) or listens on
    its port (any TF_CONFIG script's server does: TensorFlow's own tutorials run as they are).
    :meth:`wait` returns when every worker (or, with a chief, the chief) exited 0;
    the tasks that ``server.join()`` forever are then stopped: the normal end.

    ``hosts``: local by default, in a private network of the cluster's own
    (:class:`~lab_utils.cluster.userns.PrivateNetwork`: a network namespace with only
    loopback, with or without root), so that no one else can reach its servers. Where no
    namespace can be made and this machine has a network interface besides loopback, the
    cluster refuses to start, saying why, unless ``exposed_ok=True`` (or
    ``LABS_ALLOW_EXPOSED=1``): TensorFlow's servers listen on every interface and run
    whatever graph they are sent. :func:`~lab_utils.cluster.netem.emulated` (or the
    string ``"emulated:bandwidth=100mbit"``) places the tasks on emulated hosts
    (network namespaces joined by shaped links, with or without root).
    A list names one host per task, PS first then workers, then the chief (e.g.
    ``["n1", "n2", "n2"]``); remote tasks are started with ``ssh -tt`` (see
    :func:`lab_utils.cluster.hosts.ssh_command`). ``"hostfile:nodes.txt"`` places
    the tasks round-robin on a hostfile's slots (ssh); ``"slurm"`` on the nodes of
    the Slurm allocation the kernel runs in (``srun``). Remote and emulated ports cannot
    be probed from here: they are drawn at random and a failed bind restarts the
    cluster.
    """

    kind = "tf"

    @keyword_options(JobOptions, ready_timeout=120.0)
    def __init__(
        self,
        ps: int = 1,
        workers: int = 2,
        script: str | os.PathLike = "train_async.py",
        args: Mapping[str, Any] | Sequence[str] | None = None,
        *,
        hosts: Sequence[str] | str | netem.EmulatedHosts | None = None,
        ssh: Sequence[str] | str = ("ssh", "-o", "BatchMode=yes"),
        memory_per_task: int | None = None,
        check_resources: bool = True,
        start_retries: int = 3,
        exposed_ok: bool | None = None,
        chief: int = 0,
        options: JobOptions,
    ):
        ps, workers, chief = (
            checks.count(name, n, low=0) for name, n in (("ps", ps), ("workers", workers), ("chief", chief))
        )
        if workers == 0:
            raise ValueError(
                f"workers must be at least 1 (got ps={ps}, workers=0): a cluster without workers trains nothing"
            )
        if chief > 1:
            raise ValueError(f"chief must be 0 or 1 (TensorFlow has one chief task at most), got {chief}")
        checks.count("start_retries", start_retries)
        n = ps + workers + chief
        emulate, self.remote_via = None, "ssh"
        named = named_hosts(hosts, n) if isinstance(hosts, str) else None  # the parameter shadows the module
        if named is not None:
            hosts, self.remote_via = named
        elif isinstance(hosts, (str, netem.EmulatedHosts)):
            emulate, hosts = netem.as_spec(hosts), None
        if hosts is not None:
            hosts = list(hosts)
            if len(hosts) != n:
                raise ValueError(
                    f"hosts needs one entry per task (ps first, then workers{', then the chief' if chief else ''}): "
                    f"{n} expected, got {len(hosts)}"
                )
        if memory_per_task is not None and memory_per_task <= 0:
            raise ValueError(f"memory_per_task must be a positive number of bytes, got {memory_per_task!r}")
        super().__init__(script, args, options)
        self.ps, self.workers, self.chief = ps, workers, chief
        self.hosts = hosts or [None] * n
        self.emulate = emulate
        self.ssh = shlex.split(ssh) if isinstance(ssh, str) else list(ssh)
        self.memory_per_task = memory_per_task
        self.check_resources = check_resources
        self.start_retries = start_retries
        self.exposed_ok = config.flag(config.ALLOW_EXPOSED) if exposed_ok is None else bool(exposed_ok)

    # -- resources
    def _check_resources(self) -> None:
        local = sum(1 for h in self.hosts if hosts.is_local(h))
        if not self.check_resources or local == 0:
            return
        servers = self.ps + self.chief
        check_fit(
            local,
            ("1 chief + " if self.chief else "") + f"{self.ps} PS + {self.workers} workers",
            self.memory_per_task,
            guard=self.use_guard,
            hint=lambda fit: f"try workers={fit - servers}" if fit > servers else None,
        )
        cores = resources.usable_cores()
        if local > cores:
            self._note(
                f"{local} tasks share {cores} usable core(s): they take turns on the CPU, "
                "so timings are slower than on one machine per task"
            )

    def _all_local(self) -> bool:
        return all(hosts.is_local(h) for h in self.hosts)

    def _unprotected(self, reason: str) -> None:
        """No private network: TensorFlow's servers cannot be bound to loopback, so they
        would listen on every interface. Refuse where the machine has one besides loopback
        (a laptop on a campus network, a shared node), unless told otherwise."""
        exposed = hosts.network_interfaces()
        if not exposed:
            return  # loopback only here (a grading sandbox): nothing else can reach it
        risk = (
            f"no private network for this cluster ({reason}), and TensorFlow's servers listen on every "
            f"interface ({', '.join(exposed)}): anyone who reaches them can run code as you"
        )
        if not self.exposed_ok:
            raise ClusterError(
                f"{risk}. Start it anyway with TFCluster(..., exposed_ok=True) or LABS_ALLOW_EXPOSED=1 "
                "(for example on a machine of your own behind a firewall)"
            )
        self._note(f"{risk} (exposed_ok)")

    # -- spec
    def task_names(self) -> list[str]:
        names = [f"ps:{i}" for i in range(self.ps)] + [f"worker:{i}" for i in range(self.workers)]
        return names + ["chief:0"] * self.chief

    def cluster_spec(self) -> dict:
        """The ClusterSpec dict handed to tasks (after start: with the real ports)."""
        spec: dict[str, list[str]] = {"chief": [], "ps": [], "worker": []}
        for t in self.tasks:
            spec[t.role].append(f"{t.host or 'localhost'}:{t.port}")
        return {role: addresses for role, addresses in spec.items() if addresses}

    def plan(self, attempt: int = 1) -> list[Task]:
        """Lay out the tasks (names, hosts, free ports, log and events files) without
        starting anything; :meth:`start` calls it for each attempt."""
        if self.run_dir is None:
            raise RuntimeError("plan() needs a run directory: call start(), or set run_dir first")
        sub = self.run_dir / f"attempt-{attempt}" if attempt > 1 else self.run_dir
        self.tasks = []
        placed = [self.network.address(i) for i in self.placement] if self.network is not None else self.hosts
        for name, host, port in zip(self.task_names(), placed, hosts.free_ports(placed), strict=True):
            stem = name.replace(":", "-")
            self.tasks.append(Task(name, sub / f"{stem}.log", sub / f"{stem}.jsonl", host=host, port=port))
        return self.tasks

    def _task_env(self, task: Task, base: dict, spec: dict) -> dict:
        env = dict(base)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": spec, "task": {"type": task.role, "index": int(task.name.split(":")[1])}}
        )
        env[config.TASK] = task.name
        env[config.REPORT_FILE] = str(task.events_path)
        env.pop(config.REPORT_DIR, None)
        if self.network is not None or hosts.is_local(task.host):  # srun would pass them to other nodes
            env.update(resources.thread_env(env))
        return env

    def task_command(self, task: Task, env: dict) -> list[str]:
        """The command line that starts one task: python locally, inside its emulated
        host's namespace, or through ssh for a remote host."""
        cmd = self._python()
        if self.network is not None:
            return self.network.command(self.placement[self.tasks.index(task)], cmd)
        if hosts.is_local(task.host):
            return cmd
        if self.remote_via == "srun":
            return hosts.srun_command(task.host, self.cwd, cmd)
        keep = (
            "TF_CONFIG",
            config.TASK,
            config.REPORT_FILE,
            config.RUN_DIR,
            config.JOB,
            "PYTHONUNBUFFERED",
            "TF_CPP_MIN_LOG_LEVEL",
            "PYTHONPATH",
            *self.extra_env,
        )
        return hosts.ssh_command(self.ssh, task.host, self.cwd, cmd, env, keep)

    def _start_and_wait_ready(self) -> None:
        self._build_network(len(self.hosts))
        for attempt in range(1, self.start_retries + 1):
            self.attempts = attempt
            self.plan(attempt)
            spec, base = self.cluster_spec(), self._base_env()
            for t in self.tasks:
                env = self._task_env(t, base, spec)
                self._launch(t, self.task_command(t, env), env)
            bad = self._wait_ready()
            if bad is None:
                return
            if not (self._bind_failed(bad) and attempt < self.start_retries):
                raise self._fail(bad, f"exited with code {bad.exit_code} before it was ready")
            self._note(
                f"{bad.name} could not bind port {bad.port}; restarting the cluster on fresh ports "
                f"(attempt {attempt + 1} of {self.start_retries})"
            )
            outcome = terminate([t for t in self.tasks if t.running()], self.grace + 1.0)
            if outcome.interrupted:
                raise KeyboardInterrupt

    @staticmethod
    def _bind_failed(task: Task) -> bool:
        if task.exit_code == BIND_FAILED_EXIT or task.events("bind_failed"):
            return True
        return any(marker in log_tail(task.log_path, 60) for marker in _BIND_ERRORS)

    def _wait_ready(self) -> Task | None:
        """Poll events files, ports and process states until every task is ready: it
        reported ``ready`` (:func:`start_server`), or listens on its port (a script that
        knows nothing of lab_utils: ``MultiWorkerMirroredStrategy`` starts its server from
        ``TF_CONFIG``), or is a task whose end is the run's end and exited 0 (it finished
        first). Returns a task that exited otherwise, or None when all are ready."""
        deadline = time.monotonic() + self.ready_timeout
        pending = list(self.tasks)
        main = self._main_tasks()
        while pending:
            for t in list(pending):
                if t.events("ready") or t.listening():
                    t.state = "ready"
                    pending.remove(t)
                elif t.poll() is not None:
                    if t.exit_code == 0 and t in main:  # done before anyone looked: a success
                        pending.remove(t)
                        continue
                    return t
            if not pending:
                break
            if time.monotonic() > deadline:
                raise self._fail(
                    pending[0],
                    f"did not become ready within {self.ready_timeout:g} s: it neither listened on "
                    f"port {pending[0].port} nor called lab_utils.cluster.start_server()",
                )
            pause()
        self._save_state()
        return None

    def _main_tasks(self) -> list[Task]:
        """The tasks whose end is the run's end: the chief if there is one, else the workers."""
        return [t for t in self.tasks if t.role == "chief"] or [t for t in self.tasks if t.role == "worker"]

    def _check(self) -> tuple[Task | None, bool]:
        for t in self.tasks:
            t.poll()
        main = self._main_tasks()
        for t in self.tasks:
            if t.exit_code is not None and t.state == "failed":
                return t, False
            if t not in main and t.exit_code is not None and t.state != "stopped":
                # a server that ends by itself (even with 0) leaves the others hanging: a PS the
                # workers, a worker the chief that schedules steps on it
                return t, False
        return None, all(t.exit_code == 0 for t in main)

    def _event_files(self) -> list[tuple[str, Path]]:
        return [(t.name, t.events_path) for t in self.tasks]

    def task(self, role: str, index: int | None = 0) -> Task:
        """The task ``role:index``, e.g. ``task("worker", 1)`` or ``task("ps:0", None)``."""
        name = role if index is None and ":" in role else f"{role}:{index or 0}"
        for t in self.tasks:
            if t.name == name:
                return t
        raise ValueError(f"no task {name!r}; tasks are {[t.name for t in self.tasks]}")

    def logs(self, role: str = "worker", index: int | None = 0, tail: int | None = None) -> str:
        """Log (stdout + stderr) of one task, e.g. ``logs("worker", 1)`` or ``logs("ps:0")``."""
        task = self.task(role, index)
        if tail is not None:
            return log_tail(task.log_path, tail)
        try:
            return task.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
