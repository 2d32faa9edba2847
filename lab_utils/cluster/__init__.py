"""Start, watch and stop TensorFlow parameter-server clusters and MPI/Horovod jobs.

Labs 2-6 launch several processes from a notebook; this package makes that one
call and makes leaks impossible::

    from lab_utils.cluster import TFCluster, MPIJob

    with TFCluster(ps=1, workers=2, script="train_async.py", args={"steps": 300}) as cluster:
        cluster.wait()                 # one status line; raises ClusterError on failure
    with MPIJob(np=2, script="train_hvd.py", launcher="horovodrun", controller="gloo") as job:
        job.wait()

One module per job:

- ``process``: one launched process (``Task``), the one kill-tree (``terminate``),
  the one resource-fit rule (``tasks_that_fit``, ``check_fit``; ``fit_count`` and
  ``nothing_fits`` for the labs' own memory models), ``ClusterError``
- ``sizing``: how many ranks of any kind fit this session (``fit_ranks``, ``fit_sweep``) by
  the course's memory model of a TensorFlow task (``task_memory``, ``cluster_memory``)
- ``rundir``: run directories (``new_run_dir``), ``state.json``, ``reap`` and ``prune_runs``
- ``hosts``: how a command starts on a host (local, ssh), free ports
- ``netem``: emulated hosts (a network namespace per host, shaped links, per-host
  bytes) built and removed with the job; local with a note where they cannot be built
- ``userns``: the same hosts without root (a user namespace held by one process,
  ``usernet``), and every local cluster's private network
- ``netbase``: what those share (the hosts' spec, names, subnets, shaping, the base
  network class), below both
- ``job``: the life cycle every job shares (start, wait, stop, logs, repr) and its
  settings, ``JobOptions`` (``TFCluster`` and ``MPIJob`` take them as keyword arguments)
- ``tf``: ``TFCluster`` (PS + workers, or ``ps=0``: workers only, for collective
  training, or ``chief=1``: a coordinator for TF2's ``ParameterServerStrategy``) and the
  task side (``task_config``, ``start_server``)
- ``mpi``: ``MPIJob``, launcher command lines, per-rank logs
- ``hvdbuild``: which controllers the installed Horovod was built with (probed in
  a child process, so the kernel never loads TensorFlow for it)

Nothing here imports TensorFlow (only ``start_server`` does, inside the task),
installs a signal handler in the kernel, uses a fixed port, or writes to the
kernel's stderr.
"""

from lab_utils.cluster.hvdbuild import horovod_build
from lab_utils.cluster.job import JobOptions, format_args
from lab_utils.cluster.mpi import MPIJob, split_rank_output
from lab_utils.cluster.netbase import EmulatedHosts
from lab_utils.cluster.netem import emulated
from lab_utils.cluster.process import (
    GUARD_MEMORY_BYTES,
    TF_TASK_MEMORY_BYTES,
    ClusterError,
    ResourceError,
    Task,
    fit_count,
    nothing_fits,
    tasks_that_fit,
)
from lab_utils.cluster.rundir import KEEP_RUNS, new_run_dir, prune_runs, reap, run_root
from lab_utils.cluster.sizing import RANKS_PER_CORE, cluster_memory, fit_ranks, fit_sweep, task_memory
from lab_utils.cluster.tf import BIND_FAILED_EXIT, TaskConfig, TFCluster, start_server, task_config

__all__ = [
    "TFCluster",
    "MPIJob",
    "emulated",
    "EmulatedHosts",
    "JobOptions",
    "format_args",
    "horovod_build",
    "ClusterError",
    "ResourceError",
    "Task",
    "TaskConfig",
    "task_config",
    "start_server",
    "reap",
    "prune_runs",
    "run_root",
    "new_run_dir",
    "split_rank_output",
    "tasks_that_fit",
    "fit_ranks",
    "fit_sweep",
    "task_memory",
    "cluster_memory",
    "RANKS_PER_CORE",
    "fit_count",
    "nothing_fits",
    "TF_TASK_MEMORY_BYTES",
    "GUARD_MEMORY_BYTES",
    "BIND_FAILED_EXIT",
    "KEEP_RUNS",
]
