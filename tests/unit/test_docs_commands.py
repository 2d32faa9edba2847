"""A newcomer follows only the README and the guides: every command they give is run by a
test or by CI, or is marked as needing what CI cannot have (Docker, a Kubernetes cluster, a
registry, conda) and is at least valid shell."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "grading/README.md", "deploy/README.md", "labs/README.md"]
NEEDS = re.compile(r"#\s*needs (Docker|a cluster|a registry|conda|the class.s machine)\b")
#: a documented command (regex, from its start) -> what runs it: "path::test function" or a CI file
RUN_BY = {
    r"make lab\b": "tests/process/test_make_lab.py::test_make_lab_serves_and_stops_on_ctrl_c",
    r"make test\b": ".ci/run",
    r"make (release|autograde|grades|feedback)\b": (
        "tests/notebooks/test_grading_crafted.py::test_the_instructors_make_commands_round_trip_a_class"
    ),
    r"bash scripts/build-horovod\.sh ": "tests/process/test_binder.py::test_postbuild_installs_lab_utils_and_horovod",
    r"bash scripts/stack-keras\.sh ": "tests/process/test_binder.py::test_postbuild_installs_lab_utils_and_horovod",
    r"make student-repo\b": "tests/unit/test_student_repo.py::test_make_student_repo_writes_the_folder_it_is_given",
    r"(taskset -c 0 )?python bench/bench_yardsticks\.py ": (
        "tests/unit/test_selfcheck.py::test_the_bench_measures_a_lab_and_publishes_only_complete_measurements"
    ),
    r"python -m lab_utils\.hub (collect|return)\b": (
        "tests/process/test_hub.py::test_students_hand_in_from_their_kernels_and_see_only_their_own_feedback"
    ),
    r"python (-P )?-m lab_utils\.hub setup\b": (
        "tests/process/test_classroom.py::test_a_student_reads_nothing_of_a_classmate_the_course_or_the_store"
    ),
    r"python (-P )?-m lab_utils\.hub (backup|restore)\b": (
        "tests/unit/test_hub_backup.py::test_a_backup_restores_every_hand_in_and_the_gradebook"
    ),
    r"python -m lab_utils\.hub grade\b": (
        "tests/process/test_hub.py::test_a_term_release_work_hand_in_grade_return_fix_and_a_late_hand_in"
    ),
}


def _commands():
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    yield doc, line.strip()


def _exists(where: str) -> bool:
    path, _, function = where.partition("::")
    return (ROOT / path).is_file() and (not function or f"def {function}(" in (ROOT / path).read_text())


def test_every_documented_command_is_run_by_a_test_or_marked_and_valid():
    commands = list(_commands())
    assert len(commands) >= 15, commands  # the README, the grading guide and the deployment guide
    for doc, line in commands:
        if NEEDS.search(line):
            proc = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
            assert proc.returncode == 0, f"{doc}: {line!r} is not valid shell: {proc.stderr}"
            continue
        runners = [where for pattern, where in RUN_BY.items() if re.match(pattern, line)]
        assert runners, f"{doc}: no test or CI step runs {line!r}; add one, or mark it '# needs ...'"
        assert all(_exists(w) for w in runners), f"{doc}: {line!r}: {runners} is gone"


def test_ci_runs_the_readmes_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()
