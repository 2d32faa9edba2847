"""Grading: helpers for nbgrader test cells, and the course operations.

In test cells (introduced in Lab 1)::

    from lab_utils.grading import credit, ratio_credit, is_grading, hand_in

The package, one job per module:

- ``cells``: ``is_grading``, ``credit``, ``ratio_credit`` (what test cells call);
- ``handin``: ``hand_in``, how a hidden test gives the grader plain values to judge, outside
  the kernel (``judge``: the grader's side);
- ``throughput``: ``compare``, the hidden throughput tests' fair, unforgeable timing (the
  grader's clock, the kernel only runs the jobs it is asked for);
- ``selfcheck``: ``self_check``, the students' visible estimate of that credit, against a
  yardstick that is not a solution (``jobs``, ``published``);
- ``settings``: ``grading/settings.yml`` (timeouts and limits per lab);
- ``batch``, ``gate``, ``worker``, ``sandbox``, ``execute``, ``kernel``, ``accounting``,
  ``results``: autograding a class, each submission in a sandbox of its own, pipelined
  (see ``grading/README.md``);
- ``layout``: where the course lives (``REPO_ROOT``, ``GRADING_ROOT``, ``LABS_DIR``, ...),
  ``labs/params.yml`` (``load_params``, ``lab_settings``), ``cell_timeout`` and lab names
  (``source_labs``, ``resolve_labs``, ``source_notebook``); imports neither nbgrader nor the
  modules below;
- ``nbapi``: nbgrader's API, checked (``course_api``, ``check``, ``gradebook_rows``,
  ``export_grades``);
- ``course``: the course operations ``release``, ``check_release``, ``autograde``,
  ``feedback``, on those two (``python -m lab_utils.grading ...``, see ``__main__``);
- ``scripts``: ``reference_script`` (the instructor's training script, extracted
  from the ONE copy in ``grading/source``) and ``find_lab_script`` (a student's
  script from an earlier lab);
- ``leaks``: ``find_leaks`` / ``check_student_environment``: the student
  environment (``lab_utils`` + ``labs/``) holds no solution and no hidden test.

Importing this package is cheap, and loads only what test cells call: the course operations
(and with them nbgrader, nbformat and yaml) are imported when first named.
"""

from __future__ import annotations

import importlib

from lab_utils.grading.cells import DEFAULT_BANDS, check_prediction, check_replay, credit, is_grading, ratio_credit
from lab_utils.grading.handin import hand_in
from lab_utils.grading.scripts import find_lab_script, reference_script

#: the course operations, imported when first named: a grading kernel imports only the
#: helpers its test cells call (its view of lab_utils holds no other module: view.py)
_COURSE = {
    "release": "course",
    "check_release": "course",
    "autograde": "course",
    "feedback": "course",
    "export_grades": "nbapi",
    "extract_references": "scripts",
    "Leak": "leaks",
    "find_leaks": "leaks",
    "student_files": "leaks",
    "check_student_environment": "leaks",
}

__all__ = [
    "DEFAULT_BANDS",
    "credit",
    "ratio_credit",
    "check_prediction",
    "check_replay",
    "is_grading",
    "hand_in",
    "throughput",
    "reference_script",
    "find_lab_script",
    *_COURSE,
]


def __getattr__(name):
    if name == "throughput":
        return importlib.import_module("lab_utils.grading.throughput")
    if name in _COURSE:
        return getattr(importlib.import_module(f"lab_utils.grading.{_COURSE[name]}"), name)
    raise AttributeError(f"module 'lab_utils.grading' has no attribute {name!r}")
