"""A class on JupyterHub: handing in, feedback, and each student's server kept to its limits.

- ``store``: the hand-in store (submissions and feedback per student, arrival times, late flags)
- ``service``: the hand-in service, a JupyterHub service that knows students by their Hub token
  (``python -m lab_utils.hub.service``)
- ``client``: what a student calls in a notebook (:func:`hand_in`, :func:`feedback`) and what the
  instructor runs (``python -m lab_utils.hub grade|collect|return``)
- ``grader``: the grading service, which grades as root in the sandbox what an instructor asks for
  from their own server (``python -m lab_utils.hub.grader``)
- ``spawner``: :class:`~lab_utils.hub.spawner.LimitedSpawner`, a server per student in a cgroup
  of the class's limits, for a Hub on one machine (imports JupyterHub: the Hub's side only)

``deploy/README.md`` walks an instructor through a term with them.
"""

from __future__ import annotations

from .client import HandInRefused, collect, feedback, grade, hand_in, return_feedback, whoami

__all__ = ["HandInRefused", "collect", "feedback", "grade", "hand_in", "return_feedback", "whoami"]
