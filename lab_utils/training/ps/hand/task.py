"""A cluster started by hand, as in CS 744 (Lab 2, Part 1): the task side.

The CS 744 students started every task of their cluster themselves, one terminal per
machine, with four flags::

    python two_tasks.py --ps_hosts=node0:2222 --worker_hosts=node1:2222 --job_name=ps --task_index=0
    python two_tasks.py --ps_hosts=node0:2222 --worker_hosts=node1:2222 --job_name=worker --task_index=0

and each task turned them into the *cluster spec* and its own place in it before starting
its ``tf.distribute.Server``. Lab 2's ``two_tasks.py`` does the same with the student's
two functions::

    cluster_spec(ps_hosts, worker_hosts) -> {"ps": [...], "worker": [...]}
    tf_config(cluster, job, index)       -> {"cluster": ..., "task": {"type": ..., "index": ...}}

    if __name__ == "__main__":
        ps_hand.main(cluster_spec, tf_config, start_server)

:func:`main` reads the four flags, calls the two functions, checks what they return (a
mistake ends the task with one line naming it and saying what was expected, exit code
2, before any server starts), puts the TF_CONFIG in this task's environment and calls the
script's ``start_server()``, which starts this task's server from it. Then ``ps:0`` serves
until the launcher stops it, and ``worker:0`` proves that the two servers talk: through a
session on its own server it places a counter on ``/job:ps/task:0``, adds 1 to it
``--updates`` times, and reads it back in a *second* session (the variable lives on the
PS, not in the session). Its result (the values, the value read back, every task's
TF_CONFIG) comes back to the notebook through :mod:`lab_utils.report`.

Who types the command? :func:`lab_utils.training.ps.hand.runs.run_two_tasks` starts
``python -m lab_utils.training.ps.hand two_tasks.py`` for each task of a
:class:`~lab_utils.cluster.TFCluster` (free ports, a private network, logs, a deadline).
That entry point (:func:`launch`) plays the student at the terminal: it turns the
addresses the launcher picked into the four flags, *removes* the launcher's TF_CONFIG
from the environment (the student's ``tf_config`` makes the only one) and runs the
script as ``__main__``.

Importing this module does not import TensorFlow; the student's ``start_server`` and the
worker's updates do, in the task.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from lab_utils import report
from lab_utils.training.ps.hand.flags import JOBS, UPDATES, hosts, make_parser, parse_flags

__all__ = [
    "UPDATES",
    "OP_TIMEOUT_SECS",
    "BAD_FUNCTION_EXIT",
    "TwoTasksError",
    "make_parser",
    "parse_flags",
    "hosts",
    "check_cluster",
    "check_tf_config",
    "count_on_ps",
    "main",
    "launch",
]

#: Deadline of each of the worker's session calls (a PS that never answers becomes an error).
OP_TIMEOUT_SECS = 60.0
#: Exit code of a task whose ``cluster_spec``/``tf_config``/``start_server`` returned a wrong value.
BAD_FUNCTION_EXIT = 2


class TwoTasksError(ValueError):
    """What a student's function returned is not what this task needs (the message says why)."""


# ----------------------------------------------------------------------------- the checks


def _jobs(names) -> str:
    return ", ".join(repr(n) for n in names) or "none"


def check_cluster(cluster: Any, flags: argparse.Namespace) -> dict:
    """``cluster`` (what ``cluster_spec(flags.ps_hosts, flags.worker_hosts)`` returned) as
    this task needs it: a dict with jobs ``"ps"`` and ``"worker"``, each a list of the
    ``host:port`` strings its flag names, in order. Raises :class:`TwoTasksError` saying
    what is wrong."""
    call = f"cluster_spec({flags.ps_hosts!r}, {flags.worker_hosts!r})"
    if not isinstance(cluster, Mapping):
        raise TwoTasksError(f"{call} returned {type(cluster).__name__} {cluster!r}: expected a dict of jobs")
    missing = [job for job in JOBS if job not in cluster]
    if missing:
        raise TwoTasksError(
            f"{call} returned jobs {_jobs(cluster)}: the cluster needs the jobs 'ps' and 'worker' (the "
            f"--job_name values), {_jobs(missing)} missing"
        )
    extra = [job for job in cluster if job not in JOBS]
    if extra:
        raise TwoTasksError(
            f"{call} returned the jobs {_jobs(extra)} that no task was started as; only 'ps' and 'worker'"
        )
    for job in JOBS:
        given, named = cluster[job], hosts(getattr(flags, f"{job}_hosts"))
        if isinstance(given, str) or not isinstance(given, Sequence):
            raise TwoTasksError(
                f"{call}[{job!r}] is {type(given).__name__} {given!r}: expected a list of 'host:port' strings, "
                "one per task"
            )
        if list(given) != named:
            raise TwoTasksError(f"{call}[{job!r}] is {list(given)!r}: expected the --{job}_hosts addresses {named!r}")
    return {job: list(cluster[job]) for job in cluster}


def check_tf_config(config: Any, cluster: dict, flags: argparse.Namespace) -> dict:
    """``config`` (what ``tf_config(cluster, job, index)`` returned) as TensorFlow reads
    TF_CONFIG: ``{"cluster": <cluster>, "task": {"type": <job>, "index": <int>}}`` naming
    this very task, and JSON-serialisable. Raises :class:`TwoTasksError` saying what is wrong."""
    me = f"{flags.job_name}:{flags.task_index}"
    call = f"tf_config(cluster, {flags.job_name!r}, {flags.task_index})"
    if not isinstance(config, Mapping) or set(config) != {"cluster", "task"}:
        keys = sorted(map(str, config)) if isinstance(config, Mapping) else type(config).__name__
        raise TwoTasksError(f"{call} returned {keys}: TF_CONFIG is a dict with exactly the keys 'cluster' and 'task'")
    if config["cluster"] != cluster:
        raise TwoTasksError(f"{call}['cluster'] is {config['cluster']!r}: expected the cluster it was given")
    task = config["task"]
    if not isinstance(task, Mapping) or set(task) != {"type", "index"}:
        raise TwoTasksError(f"{call}['task'] is {task!r}: expected a dict with the keys 'type' and 'index'")
    job, index = task["type"], task["index"]
    if job not in cluster:
        raise TwoTasksError(
            f"{call}['task']['type'] is {job!r}, which is not a job of the cluster (its jobs: {_jobs(cluster)})"
        )
    if isinstance(index, bool) or not isinstance(index, int):
        raise TwoTasksError(f"{call}['task']['index'] is {type(index).__name__} {index!r}: expected an int")
    if not 0 <= index < len(cluster[job]):
        raise TwoTasksError(
            f"{call}['task'] names task {job}:{index}, which is out of range: job {job!r} has "
            f"{len(cluster[job])} task(s), indices 0..{len(cluster[job]) - 1}"
        )
    if f"{job}:{index}" != me:
        raise TwoTasksError(
            f"{call}['task'] names {job}:{index}, but this task was started as {me} "
            f"(--job_name={flags.job_name} --task_index={flags.task_index})"
        )
    try:
        json.dumps(config)
    except (TypeError, ValueError) as exc:
        raise TwoTasksError(f"{call} cannot be written as JSON (TF_CONFIG is JSON text): {exc}") from None
    return dict(config)


def _check_server(server: Any, flags: argparse.Namespace):
    """What ``start_server()`` returned: a ``tf.distribute.Server`` of this very task."""
    import tensorflow as tf

    me = f"{flags.job_name}:{flags.task_index}"
    if not isinstance(server, tf.distribute.Server):
        raise TwoTasksError(f"start_server() returned {type(server).__name__}: expected a tf.distribute.Server")
    started = f"{server.server_def.job_name}:{server.server_def.task_index}"
    if started != me:
        raise TwoTasksError(f"start_server() started the server of {started}, but this task is {me}")
    return server


# ----------------------------------------------------------------------------- the worker's proof


def count_on_ps(server, index: int, updates: int = UPDATES, timeout: float = OP_TIMEOUT_SECS) -> dict:
    """Worker ``index``: a counter on ``/job:ps/task:0``, incremented ``updates`` times
    through a session on this task's ``server``, then read back in a new session. Every
    call has a deadline of ``timeout`` s (a PS that never answers is an error, not a hang).
    Returns ``{"values", "read_back", "device"}``."""
    from lab_utils.models import import_tensorflow

    tf = import_tensorflow()
    v1 = tf.compat.v1
    config = v1.ConfigProto(
        device_filters=["/job:ps", f"/job:worker/task:{index}"], operation_timeout_in_ms=int(timeout * 1000)
    )
    options = v1.RunOptions(timeout_in_ms=int(timeout * 1000))
    with tf.Graph().as_default():
        with v1.device("/job:ps/task:0"):
            counter = v1.get_variable("counter", [], tf.float32, v1.zeros_initializer(), use_resource=True)
        increment = counter.assign_add(1.0)
        with v1.Session(server.target, config=config) as sess:
            sess.run(counter.initializer, options=options)
            values = [float(sess.run(increment, options=options)) for _ in range(updates)]
        with v1.Session(server.target, config=config) as sess:  # a new session: the value stayed on ps:0
            read_back = float(sess.run(counter, options=options))
        return {"values": values, "read_back": read_back, "device": counter.device}


# ----------------------------------------------------------------------------- the task


class _Called:
    """Whether the script called :func:`main` (checked by :func:`launch`)."""

    main = False


def _fail(task: str, message: str) -> NoReturn:
    """End this task: the reason in its log and as a ``problem`` event (the notebook's error)."""
    report.event("problem", message=message)
    print(f"lab_utils.training.ps.hand: {task}: {message}", flush=True)
    raise SystemExit(BAD_FUNCTION_EXIT)


def _call(task: str, what: str, fn: Callable, *args):
    """``fn(*args)``, a student's function; an exception ends the task, naming the function."""
    try:
        return fn(*args)
    except NotImplementedError:
        traceback.print_exc()
        _fail(task, f"{what} is not written yet (it raises NotImplementedError): write it where it says YOUR CODE HERE")
    except Exception as exc:  # the student's code: any error is reported, with its traceback
        traceback.print_exc()
        _fail(task, f"{what} raised {type(exc).__name__}" + (f": {exc}" if str(exc) else ""))


def main(
    cluster_spec: Callable[[str, str], dict],
    tf_config: Callable[[dict, str, int], dict],
    start_server: Callable[[], Any],
    argv: Sequence[str] | None = None,
) -> int:
    """One task of the hand-started cluster (see the module docstring): the flags, the
    student's ``cluster_spec`` and ``tf_config`` (checked), ``TF_CONFIG`` set, the
    student's ``start_server()``, then serve (``ps``) or :func:`count_on_ps` (``worker``).
    Returns 0 for the worker; the PS serves until it is stopped."""
    _Called.main = True
    flags = parse_flags(argv)
    task = f"{flags.job_name}:{flags.task_index}"
    cluster = _call(task, "cluster_spec", cluster_spec, flags.ps_hosts, flags.worker_hosts)
    try:
        cluster = check_cluster(cluster, flags)
        config = _call(task, "tf_config", tf_config, cluster, flags.job_name, flags.task_index)
        config = check_tf_config(config, cluster, flags)
    except TwoTasksError as exc:
        _fail(task, str(exc))
    os.environ["TF_CONFIG"] = json.dumps(config)
    print(f"{task}: TF_CONFIG={os.environ['TF_CONFIG']}", flush=True)
    server = _call(task, "start_server()", start_server)
    try:
        server = _check_server(server, flags)
    except TwoTasksError as exc:
        _fail(task, str(exc))
    address = cluster[flags.job_name][flags.task_index]
    report.event("tf_config", config=config)
    report.ready(address=address, port=int(address.rsplit(":", 1)[1]), target=server.target)
    if flags.job_name == "ps":
        server.join()  # hold the variables until the launcher stops this task
        return 0
    report.result(**count_on_ps(server, flags.task_index, flags.updates), cluster=cluster, tf_config=config)
    return 0


# ----------------------------------------------------------------------------- the launcher's entry


def launch(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """``python -m lab_utils.training.ps.hand SCRIPT [--updates N]``, in a task of a
    :class:`~lab_utils.cluster.TFCluster`: the launcher's TF_CONFIG becomes the CS 744
    flags, is removed from the environment, and SCRIPT runs as ``__main__`` with them."""
    from lab_utils.cluster import task_config

    p = argparse.ArgumentParser(prog="python -m lab_utils.training.ps.hand")
    p.add_argument("script", help="the script both tasks run (two_tasks.py)")
    p.add_argument("--updates", type=int, default=UPDATES)
    a = p.parse_args(argv)
    task = task_config(env)
    _Called.main = False
    cluster = task.cluster
    flags = [
        f"--ps_hosts={','.join(cluster.get('ps', []))}",
        f"--worker_hosts={','.join(cluster.get('worker', []))}",
        f"--job_name={task.job}",
        f"--task_index={task.index}",
        f"--updates={a.updates}",
    ]
    os.environ.pop("TF_CONFIG", None)  # the student's tf_config makes this task's only one
    print(f"$ python {os.path.basename(a.script)} {' '.join(flags)}", flush=True)
    sys.argv = [a.script, *flags]
    runpy.run_path(a.script, run_name="__main__")
    if not _Called.main:
        _fail(task.task, f"{a.script} ended without calling ps_hand.main(cluster_spec, tf_config, start_server)")
    return 0
