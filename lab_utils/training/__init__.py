"""Lab-specific training code: one module per technique.

- ``loop``: the pieces every technique reuses: this worker's shard of the data,
  the step loop (``report.step`` events, evaluations kept out of training time)
  and the timed result dict.
- ``ps``: the task side of parameter-server training (Labs 2 and 3): settings,
  command line, graph hand-off, start barrier, the synchronous shutdown protocol.
- ``ps_runs``: the notebook side of Labs 2 and 3: launch a PS cluster, turn what
  it reported into the CS 744 tables and figures, inspect a student's graph.
- ``ps_hand`` (+ ``ps_hand_runs``): Lab 2, Part 1: a 1 PS + 1 worker cluster whose
  tasks build their own TF_CONFIG with the student's functions, from the CS 744 flags.
- ``ps_strategy`` (+ ``ps_strategy_runs``): Lab 2's TF2 aside: the same training with
  ``ParameterServerStrategy`` and a ``ClusterCoordinator`` on a chief task.

- ``ring``: Lab 4, Part A, the task side under ``mpirun``: a student's
  ``ring_allreduce`` checked against MPI's ``Allreduce`` (bytes sent counted) and
  timed against it and a ``memcpy``.
- ``allreduce``: Lab 4's task side for data-parallel training: settings, the data
  order every method shares, models, the loop that ``train_hvd.py`` calls, and the
  references without Horovod (one big-batch process, MultiWorkerMirroredStrategy).
- ``allreduce_runs``: Lab 4 from the notebook: ring checks, bandwidth sweeps,
  Horovod / one-process / MWMS runs, weight comparisons, the timeline summary,
  scaling tables.

- ``netexp`` (+ ``netexp_task``): Lab 4, Part D: PS against ring all-reduce on
  emulated links.
- ``devices``, ``towers``, ``towers_runs``: Lab 5 (AlexNet on several devices).
- Lab 6: ``compression`` (+ ``compression_task``, ``compression_runs``): the
  students' 1-bit and top-k compressors with error feedback, exchanged with Horovod;
  ``ssp`` (+ ``ssp_runs``): stale-synchronous parallel on the Lab 2-3 PS; ``hybrid``
  (+ ``hybrid_task``): Parallax's sparse-through-PS, dense-through-all-reduce. The
  scaling model is :mod:`lab_utils.simulate` (no processes, so not here).

The generic layers (cluster, metrics, data, report, plots, ...) never import this
package. Importing a module here does not import TensorFlow.
"""
