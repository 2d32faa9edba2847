"""When the model does not fit (Lab 7): sharded optimizer state, tensor and pipeline parallelism, by hand.

Every part runs NumPy ranks under ``mpirun`` (mpi4py), with the student's functions
loaded from the files the notebook's ``%%writefile`` cells write:

- ``shards`` (a pure helper: NumPy only): how a vector is cut into one shard per rank
  (:func:`~lab_utils.training.modelpar.shards.shard_bounds`, MPI's ``Reduce_scatter``
  layout), the Adam update every part shares, and the bytes a rank's arrays hold;
- ``collectives`` (task side, Part A): a student's ``reduce_scatter`` and ``all_gather``
  against MPI's ``Reduce_scatter`` and ``Allgatherv``, and the two composed against
  ``Allreduce``, with the bytes each rank sent;
- ``zero`` (task side, Part B): data-parallel training of an MLP whose gradients
  TensorFlow computes, with Adam's state (stage 1), and the gradients (stage 2),
  sharded over the ranks by the student's ``zero_step``; stage 0 is plain data
  parallelism, the reference;
- ``tensor`` (task side, Part C): a Megatron MLP block split over the ranks by the
  student, checked against the whole block;
- ``pipeline`` (task side, Part D): a model cut into stages, one per rank, run with
  the student's micro-batch schedule;
- ``runs`` (kernel side): one call per experiment, and the tables;
- ``choice_runs`` (kernel side, Part E): a student's cost model with memory, the choice of
  a parallelism it makes, and the settings and step times measured from Parts B and D's runs.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "shards")
