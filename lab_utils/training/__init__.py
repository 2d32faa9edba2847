"""Lab-specific training code: one package per technique, on one shared layer.

Every technique package has two sides, and the rule that keeps them apart:

- ``task.py`` (and its task-side helpers) runs in a *launched process*: a PS or
  worker task, an MPI rank. It may import TensorFlow, Horovod and mpi4py; it never
  imports pandas, matplotlib, :mod:`lab_utils.cluster`'s launchers,
  :mod:`lab_utils.metrics`, :mod:`lab_utils.plots` or any ``runs`` module.
- ``runs.py`` (and ``*_runs.py``) runs in the *notebook kernel*: it launches the
  tasks, reads what they reported and makes the tables and figures. It never
  imports TensorFlow or Horovod.

=================  ============================================  ==========
package            what                                          labs
=================  ============================================  ==========
``ps``             parameter server: async, sync, by hand, TF2   2, 3, 6
``ssp``            stale-synchronous parallel on that PS         6
``allreduce``      ring all-reduce checks, Horovod, references   4
``netexp``         PS against ring on emulated links             4
``towers``         AlexNet on several devices                    5
``compression``    fp16, 1-bit, top-k with error feedback        6
``hybrid``         sparse through a PS, dense through all-reduce 6
=================  ============================================  ==========

Shared, written once beside them: ``loop`` (task side: the shard, the step loop,
the timed result), ``devices`` (task side: Lab 5's device tiers), ``weights`` (both sides, NumPy only: the
``.npz`` weights files of Labs 4-6 and their comparison), ``student``
(loading a student's file with a clear error), ``runs`` (kernel side: the ``Run``
base class, the run options, the every-rank check) and ``tables`` (one
``scaling_table``). The scaling model is :mod:`lab_utils.simulate` (it starts no
process). ``python -m lab_utils.training.allreduce`` and ``... .towers`` run a
package's task.

A package's attributes are its *front* module's, imported on first use: ``ps.train_worker``
is ``ps.task``'s, ``netexp.run_netexp`` is ``netexp.runs``' (see :mod:`lab_utils.training._exports`).

The generic layers (cluster, metrics, data, report, plots, ...) never import this
package. Importing a module here does not import TensorFlow.
"""
