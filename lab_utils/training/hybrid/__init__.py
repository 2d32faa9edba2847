"""Parallax's hybrid (Lab 6, Part C): sparse through a PS, dense through all-reduce.

- ``task`` (task side, under ``mpirun``): the three modes on an embedding model;
- ``settings`` (pure helper, no TensorFlow; ``task`` re-exports it): the command line,
  which ``runs`` checks a run's arguments with before it launches;
- ``runs`` (kernel side): the runs on emulated hosts, the sweep, the plot.

The package's names are ``hybrid.runs``'s.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "runs")
