"""Stale-synchronous parallel on the Lab 2-3 parameter server (Lab 6, Part B).

- ``clocks`` (task side): the per-worker clocks on the PS and the wait for one's turn,
  used by :func:`lab_utils.training.ps.task.train_worker` in ``--mode ssp``;
- ``runs`` (kernel side): run SSP with several bounds, check the bound was kept, the
  staleness tables and plots.

The package's names are ``ssp.runs``'s.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "runs")
