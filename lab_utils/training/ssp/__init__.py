"""Stale-synchronous parallel on the Lab 2-3 parameter server (Lab 6, Part B).

- ``runs`` (kernel side): run SSP with several bounds, check the bound was kept, the
  staleness tables and plots.

The task side is the parameter server's own (``mode="ssp"`` of
:func:`lab_utils.training.ps.task.train_worker`, its clocks in
:mod:`lab_utils.training.ps.clocks`): ``ssp`` imports ``ps``, never the other way.

The package's names are ``ssp.runs``'s.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "runs")
