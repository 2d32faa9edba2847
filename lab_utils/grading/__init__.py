"""Grading: helpers for nbgrader test cells, and the course operations.

In test cells (introduced in Lab 1)::

    from lab_utils.grading import credit, ratio_credit, is_grading

The package, one job per module:

- ``cells``: ``is_grading``, ``credit``, ``ratio_credit`` (what test cells call);
- ``throughput``: ``compare``, the hidden throughput tests' fair, unforgeable timing;
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

Importing this package is cheap: nbgrader, nbformat and yaml are imported by the
functions that need them.
"""

from __future__ import annotations

from lab_utils.grading import throughput  # its clock is taken here, in the labs' locked setup cells
from lab_utils.grading.cells import DEFAULT_BANDS, credit, is_grading, ratio_credit
from lab_utils.grading.course import autograde, check_release, feedback, release
from lab_utils.grading.leaks import Leak, check_student_environment, find_leaks, student_files
from lab_utils.grading.nbapi import export_grades
from lab_utils.grading.scripts import extract_references, find_lab_script, reference_script

__all__ = [
    "DEFAULT_BANDS",
    "credit",
    "ratio_credit",
    "is_grading",
    "throughput",
    "release",
    "check_release",
    "autograde",
    "export_grades",
    "feedback",
    "reference_script",
    "extract_references",
    "find_lab_script",
    "Leak",
    "find_leaks",
    "student_files",
    "check_student_environment",
]
