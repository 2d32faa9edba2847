"""Lab 2, Part 1: a cluster by hand, as CS 744 wrote it (two tasks that build their own ``TF_CONFIG``).

- ``task``: what each task runs (``python -m lab_utils.training.ps.hand two_tasks.py``: the
  launcher's ``TF_CONFIG`` becomes the CS 744 flags) and the checks the student's
  ``two_tasks.py`` calls as ``ps_hand.main(...)``, ``ps_hand.check_cluster(...)``;
- ``flags``: the task's command line (a pure helper the notebook checks with too);
- ``runs``: the notebook side, :func:`~lab_utils.training.ps.hand.runs.run_two_tasks`.

``from lab_utils.training.ps import hand as ps_hand`` then ``ps_hand.main``: the names are
``task``'s, imported when first used.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "task")
