"""nbgrader configuration for the course. Course root = this folder (grading/).

Instructor sources (solutions + hidden tests): grading/source/<lab>/<lab>.ipynb.
The student release is generated into grading/release/<lab>/ and copied to
labs/<lab>/ by `python -m lab_utils.grading release` (make release).
Course state (gradebook.db, submitted/, autograded/, feedback/) and the reference
scripts extracted from the sources (reference/) are git-ignored.
"""

from pathlib import Path

from lab_utils.grading.layout import cell_timeout

c = get_config()  # noqa: F821 (provided by nbgrader)

HERE = Path(__file__).resolve().parent

c.CourseDirectory.root = str(HERE)
c.CourseDirectory.course_id = "distributed-dl-labs"
c.CourseDirectory.source_directory = "source"
c.CourseDirectory.release_directory = "release"
# A course laid out for a class's instructors' group (python -m lab_utils.hub setup makes its
# folders setgid): what nbgrader writes (releases, feedback), any instructor of the group may redo
c.CourseDirectory.groupshared = bool(HERE.stat().st_mode & 0o2000)
# Run-time leftovers must never be released or collected.
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "feedback",
    "runs",
    "*.results.json",
    "train_*.py",
    "ring.py",
    "towers.py",
    "compressors.py",
    "two_tasks.py",
    "sync_ending.py",
    "collectives.py",  # Lab 7's four
    "zero.py",
    "tensor.py",
    "pipeline.py",
    "*.npz",
]  # written by %%writefile from solution cells, and weights files the runs write

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Per-cell timeout. nbgrader's default is 30 s; `ExecutePreprocessor.timeout` is
# ignored, `Execute.timeout` is the one that counts. `python -m lab_utils.grading autograde`
# grades each submission in a sandbox with its lab's limits from grading/settings.yml
# (lab_utils.grading.worker); plain `nbgrader` CLI runs get the largest cell timeout there.
c.Execute.timeout = cell_timeout(settings_file=HERE / "settings.yml")

# Feedback shows each test cell's score and output, but not the source of its hidden
# tests: once students have read them they can be gamed (by the next cohort too).
# Nor do error tracebacks, which quote the lines around the failing one (HideHiddenTracebacks).
# Instructors who prefer to show them: drop ClearTestCellHiddenTests and HideHiddenTracebacks from this list.
from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor  # noqa: E402
from nbgrader.preprocessors import GetGrades  # noqa: E402

from lab_utils.grading.tracebacks import ClearTestCellHiddenTests, HideHiddenTracebacks  # noqa: E402

# (An output that quotes a hidden test or a solution never gets here: the grading worker
# removes it from the graded notebook first, lab_utils.grading.quotes.)
c.GenerateFeedback.preprocessors = [
    GetGrades,
    HideHiddenTracebacks,
    ClearTestCellHiddenTests,  # nbgrader's ClearHiddenTests, on test cells only (a student's text is theirs)
    CSSHTMLHeaderPreprocessor,
]
