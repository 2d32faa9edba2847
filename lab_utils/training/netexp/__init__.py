"""Parameter server against ring all-reduce on emulated links (Lab 4, Part D).

- ``task`` (task side, under ``mpirun``): one step pattern, PS or ring, on fake tensors;
- ``runs`` (kernel side): the runs on emulated hosts, the sweep over workers, the
  model sweep and the measured-against-predicted tables.

The package's names are ``netexp.runs``'s.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "runs")
