"""``make student-repo``: the public repository a class sees holds what students need (the
labs, ``lab_utils``, Binder opening the course map, the lock, setup without the test tools)
and nothing of the course (no grading/, no tests, no solution, hidden test or reference
script); it refuses a leak, a foreign folder and a folder inside the instructor repository;
run again, it commits only what changed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from lab_utils.grading import leaks, student_repo

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted(p.name for p in (ROOT / "grading" / "source").iterdir() if p.is_dir())


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("public") / "course-labs"
    said = student_repo.write(dest)
    assert said.endswith("created, committed") and str(dest) in said, said
    return dest


def test_it_holds_what_students_need(published):
    tracked = set(_git(published, "ls-files").split())
    needed = {"labs/README.md", "labs/params.yml", "lab_utils/__init__.py", "lab_utils/grading/cells.py"}
    needed |= {f"labs/{lab}/{lab}.ipynb" for lab in LABS}
    needed |= {"binder/postBuild", "binder/requirements.txt", "binder/runtime.txt", "binder/apt.txt", "binder/start"}
    needed |= {"environment.yml", "requirements/constraints.txt", "requirements/base.in", "pyproject.toml"}
    needed |= {"README.md", "Makefile", "scripts/setup.sh", "scripts/lab.sh", "scripts/build-horovod.sh"}
    needed |= {"scripts/stacks.sh", "scripts/stack-keras.sh", "scripts/horovod-patches/tf2.21.patch"}
    assert needed <= tracked, sorted(needed - tracked)
    assert _git(published, "status", "--porcelain") == ""  # everything written is committed
    # every file the ways in name is there: Binder's lock, setup's scripts, the Makefile's scripts
    for line in (published / "binder" / "requirements.txt").read_text().splitlines():
        if line.startswith(("-c ", "-r ")):
            assert (published / "binder" / line.split()[1]).resolve().is_file(), line
    for text in ((published / "scripts" / "setup.sh").read_text(), (published / "Makefile").read_text()):
        for script in re.findall(r"scripts/[\w.-]+", text):
            assert (published / script).is_file(), script
    # Binder opens the course map; the README and Makefile are the students', not the instructor's
    assert "/lab/tree/labs/README.md" in (published / "binder" / "postBuild").read_text()
    assert "holds no solutions" in (published / "README.md").read_text()
    # the policy on AI assistants, where coding agents look for one, and it forbids writing the exercises
    policy = (published / "AGENTS.md").read_text()
    assert "Do not write, complete or rewrite code inside cells marked `# YOUR CODE HERE`" in policy
    assert "AGENTS.md" in (published / "README.md").read_text()
    targets = set(re.findall(r"^([a-z-]+):", (published / "Makefile").read_text(), re.M))
    assert {"setup", "lab", "doctor"} <= targets and not targets & {"release", "autograde", "test", "feedback"}


def test_it_holds_nothing_of_the_course(published):
    tracked = _git(published, "ls-files").split()
    banned = [p for p in tracked if p.startswith(("grading/", "tests/", "bench/", "deploy/", ".ci/"))]
    banned += [p for p in tracked if re.search(r"^labs/.*/(train_\w+|ring|towers)\.py$", p) or p.endswith(".npz")]
    banned += [p for p in tracked if p == "requirements/dev.in"]
    assert banned == []
    found = leaks.find_leaks([published / p for p in tracked], leaks.source_notebooks())
    assert found == [], [str(x) for x in found[:10]]


def test_run_again_it_commits_only_what_changed(published):
    assert student_repo.write(published).endswith("unchanged, nothing committed")
    assert len(_git(published, "log", "--format=%H").split()) == 1
    # a file lost downstream comes back, a stray one goes, as one more commit
    (published / "labs" / "README.md").unlink()
    (published / "labs" / "stray.txt").write_text("not the course's\n")
    _git(published, "add", "-A")
    _git(published, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "someone's edit")
    said = student_repo.write(published, message="Fix the course map")
    assert said.endswith("updated, committed"), said
    assert (published / "labs" / "README.md").is_file() and not (published / "labs" / "stray.txt").exists()
    assert _git(published, "log", "-1", "--format=%s").strip() == "Fix the course map"


def test_a_leak_is_refused_and_nothing_written(tmp_path, monkeypatch):
    files = student_repo.files()
    solution = ROOT / "grading" / "source" / LABS[0] / f"{LABS[0]}.ipynb"
    monkeypatch.setattr(student_repo, "files", lambda root=ROOT: {**files, "labs/answers.ipynb": solution})
    with pytest.raises(ValueError, match=r"refused: \d+ solution or hidden-test line"):
        student_repo.write(tmp_path / "pub")
    assert not (tmp_path / "pub").exists()


def test_a_foreign_folder_and_one_inside_the_course_are_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a student's own work\n")
    with pytest.raises(ValueError, match="not empty and was not written by student-repo"):
        student_repo.write(tmp_path / "mine")
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    with pytest.raises(ValueError, match="inside the instructor repository"):
        student_repo.write(ROOT / "out" / "public")


def test_make_student_repo_writes_the_folder_it_is_given(tmp_path):
    """The instructor's command, as deploy/README.md gives it."""
    make = ["make", "-s", "--no-print-directory", "student-repo"]
    done = subprocess.run([*make, f"DEST={tmp_path / 'course-labs'}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "created, committed" in done.stdout and (tmp_path / "course-labs" / "labs" / "README.md").is_file()
    bare = subprocess.run(make, cwd=ROOT, capture_output=True, text=True)
    assert bare.returncode == 2 and "give DEST=path" in bare.stderr


def test_a_labs_references_are_published_after_its_due_time_never_before(tmp_path):
    """``make student-repo REFERENCES=02_ps_async`` (issue 53): refused before Lab 2's due time in
    the schedule; after it, exactly Lab 2's reference scripts are published (no other lab's), the
    labs that run Lab 2's script find it, and a later update keeps them."""
    from datetime import timedelta

    from lab_utils.grading import schedule
    from lab_utils.grading.scripts import find_lab_script

    due = schedule.load(schedule.SCHEDULE).entry("02").due
    dest = tmp_path / "course-labs"
    with pytest.raises(ValueError, match=r"refused: 02_ps_async is due .* published after that, never before"):
        student_repo.write(dest, publish=["02_ps_async"], now=due - timedelta(seconds=1))
    assert not dest.exists()  # refused before anything was written
    with pytest.raises(ValueError, match="not part of the term"):
        student_repo.write(dest, publish=["09"], now=due + timedelta(days=365))
    said = student_repo.write(dest, publish=["02"], now=due + timedelta(minutes=1))
    assert "reference scripts of 02_ps_async, past their due time" in said, said
    tracked = _git(dest, "ls-files").split()
    refs = sorted(p for p in tracked if p.startswith(student_repo.REFERENCES + "/"))
    lab2 = sorted(f"{student_repo.REFERENCES}/02_ps_async/{n}" for n in ("train_async.py", "two_tasks.py"))
    assert refs == lab2, refs
    # what is published is the instructor's script, whole; nothing of another lab is
    assert (dest / lab2[0]).read_text() == (
        ROOT / "grading" / "reference" / "02_ps_async" / "train_async.py"
    ).read_text()
    others = [dest / p for p in tracked if not p.startswith(student_repo.REFERENCES + "/")]
    assert leaks.find_leaks(others, leaks.source_notebooks()) == []
    # Lab 3, run by a student with no Lab 2 script of their own, finds the published one
    here = dest / "labs" / "03_ps_sync"
    assert (
        find_lab_script("train_async.py", "02_ps_async", here=here, root=tmp_path / "no-course")
        == (dest / lab2[0]).resolve()
    )
    # an update without REFERENCES keeps what was published
    assert student_repo.write(dest, now=due + timedelta(days=1)).endswith("unchanged, nothing committed")
    assert (dest / lab2[0]).is_file()


def test_each_lab_that_runs_an_earlier_labs_script_says_how_to_go_on_with_its_reference():
    import json

    for lab in LABS:
        cells = json.loads((ROOT / "grading" / "source" / lab / f"{lab}.ipynb").read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        text = " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
        said = re.search(
            r"Stuck with a broken (.+?) script\? After .{1,20} due time your instructor publishes its reference", text
        )
        for earlier in sorted(set(re.findall(r'find_lab_script\("[\w.]+", lab="(\d\d)_\w+"\)', code))):
            assert said and f"Lab {int(earlier)}" in said.group(1), (lab, earlier)
            assert "rename yours, and this lab runs the reference" in text, lab
