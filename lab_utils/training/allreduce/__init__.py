"""Ring all-reduce and Horovod (Lab 4).

- ``task`` (task side): the data order every method shares, the models, the loop that
  ``train_hvd.py`` calls, and the references without Horovod (one big-batch process,
  ``MultiWorkerMirroredStrategy``). ``python -m lab_utils.training.allreduce`` runs it
  (``__main__``);
- ``settings`` (a pure helper, no TensorFlow; ``task`` re-exports it): the command line
  and its check (the weights files are :mod:`lab_utils.training.weights`, shared with Labs 5-6);
- ``ring_check`` (task side, under ``mpirun``): a student's ``ring_allreduce`` checked
  against MPI's ``Allreduce`` and timed;
- ``runs`` (kernel side): ring checks, bandwidth sweeps, Horovod / one-process / MWMS
  runs, weight comparisons, the timeline summary.

The package's names are ``allreduce.task``'s (what ``train_hvd.py`` calls).
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "task")
