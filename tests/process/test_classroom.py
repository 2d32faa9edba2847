"""A class set up on one machine by ``python -m lab_utils.hub setup`` is private by default: a
student reads nothing of a classmate's, of the instructors' course (solutions, hidden tests,
.git, results, the gradebook) or of the hand-in store, and still runs the labs; an instructor
reads and writes the course with the others of the group. Each read is tried as a real user."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from lab_utils.hub import classroom
from lab_utils.hub.store import Store

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[2]


def as_user(name: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``args`` run as ``name``, with that user's groups (what a login gives them)."""
    pw = pwd.getpwnam(name)
    return subprocess.run(
        ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", "--", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "HOME": pw.pw_dir, "USER": name, **(env or {})},
    )


@pytest.fixture(scope="module")
def laid_out():
    from support import unprivileged

    made = unprivileged.make()
    if isinstance(made, str):
        pytest.skip(f"no unprivileged user to test with: {made}")
    base = Path(tempfile.mkdtemp(prefix="labs-class-"))
    base.chmod(0o755)
    tag = f"lc{os.getpid() % 100000}"
    s1, s2, prof = f"{tag}s1", f"{tag}s2", f"{tag}i1"
    group = f"{tag}g"
    try:
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(REPO), str(base / "course")], check=True)
        (base / "home").mkdir(mode=0o755)
        roster = base / "roster.csv"
        roster.write_text(f"user,role\n{prof},instructor\n{s1},student\n{s2},student\n")
        the_class = classroom.setup(
            roster,
            repo=base / "course",
            folder=base / "etc",
            python=Path(made.python),
            group=group,
            handin_user=f"{tag}h",
            store=base / "store",
            student_repo=base / "student",
            home_base=base / "home",
            gitconfig=base / "gitconfig",
            state=base / "state",
        )
        # what a term leaves behind: a student's notebook, the grader's results and gradebook,
        # returned feedback and a hand-in in the store
        s1_home = Path(pwd.getpwnam(s1).pw_dir)
        assert as_user(s1, "sh", "-c", f"echo answers > {s1_home}/02_ps_async.ipynb").returncode == 0
        for rel in ("grading/results/alice/02_ps_async.json", "grading/gradebook.db", "grading/canvas.csv"):
            r = as_user(prof, "sh", "-c", f"mkdir -p $(dirname {base}/course/{rel}) && echo x > {base}/course/{rel}")
            assert r.returncode == 0, r.stderr
        store = Store(base / "store", {"02_ps_async": None})
        store.hand_in(s1, "02_ps_async", b'{"cells": []}')
        store.put_feedback(s1, "02_ps_async", "02_ps_async.html", b"<p>9/10</p>")
        yield base, the_class, (s1, s2, prof), made
    finally:
        for name in (s1, s2, prof, f"{tag}h"):
            subprocess.run(["userdel", name], capture_output=True)
        for name in (group, s1, s2, prof, f"{tag}h"):
            subprocess.run(["groupdel", name], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
        made.cleanup()


#: what another student tries to read, each a test: where it is, from (base, a classmate, an instructor)
READS = {
    "a classmate's home": lambda base, s1, prof: Path(pwd.getpwnam(s1).pw_dir),
    "a classmate's notebook": lambda base, s1, prof: Path(pwd.getpwnam(s1).pw_dir) / "02_ps_async.ipynb",
    "an instructor's home": lambda base, s1, prof: Path(pwd.getpwnam(prof).pw_dir),
    "the solutions and hidden tests": lambda base, s1, prof: (
        base / "course/grading/source/02_ps_async/02_ps_async.ipynb"
    ),
    "grading/source": lambda base, s1, prof: base / "course/grading/source",
    ".git": lambda base, s1, prof: base / "course/.git/config",
    "the tests (crafted submissions)": lambda base, s1, prof: base / "course/tests",
    "the results": lambda base, s1, prof: base / "course/grading/results/alice/02_ps_async.json",
    "the gradebook": lambda base, s1, prof: base / "course/grading/gradebook.db",
    "the LMS export": lambda base, s1, prof: base / "course/grading/canvas.csv",
    "the hand-in store": lambda base, s1, prof: base / "store/submitted",
    "returned feedback": lambda base, s1, prof: base / "store/feedback",
    "the roster": lambda base, s1, prof: base / "etc/roster.csv",
    "the repository's listing": lambda base, s1, prof: base / "course",
}


@pytest.mark.parametrize("what", sorted(READS))
def test_a_student_reads_nothing_of_a_classmate_the_course_or_the_store(laid_out, what):
    base, _, (s1, s2, prof), _ = laid_out
    path = READS[what](base, s1, prof)
    assert path.exists(), path  # there to be read: the refusal is the layout's, not a missing file
    r = as_user(s2, "ls", "-la", str(path)) if path.is_dir() else as_user(s2, "cat", str(path))
    assert r.returncode != 0 and "Permission denied" in r.stderr, f"{s2} read {what} ({path}): {r.stdout[:200]}"


def test_a_student_still_runs_the_labs_code_and_pulls_the_class_repository(laid_out):
    base, the_class, (s1, s2, prof), made = laid_out
    course = base / "course"
    # the course's own lab_utils (this environment's editable install would find the checkout's)
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('lab_utils', '{course}/lab_utils/__init__.py',"
        f" submodule_search_locations=['{course}/lab_utils'])\n"
        "sys.modules['lab_utils'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(sys.modules['lab_utils'])\n"
        "import lab_utils.hub.client, lab_utils.training\n"
        "print(lab_utils.hub.client.__file__)\n"
    )
    r = as_user(s2, made.python, "-c", code)
    assert r.returncode == 0 and r.stdout.startswith(str(course / "lab_utils")), r.stderr
    r = as_user(s2, "cat", the_class.env["LABS_DUE_FILE"])  # the due times are no secret
    assert r.returncode == 0 and "  02_ps_async:" in r.stdout and "variant:" in r.stdout  # the term's schedule
    pull = ["git", "ls-remote", str(base / "student")]
    r = as_user(s2, *pull, env={"GIT_CONFIG_SYSTEM": str(base / "gitconfig")})
    assert r.returncode == 0 and "refs/heads/main" in r.stdout, r.stderr
    r = as_user(s2, *pull, env={"GIT_CONFIG_SYSTEM": "/dev/null"})  # what the setup's safe.directory fixes
    assert r.returncode != 0 and "dubious ownership" in r.stderr


def test_instructors_read_and_write_the_course_together_and_the_group_sticks(laid_out):
    base, _, (s1, s2, prof), _ = laid_out
    course = base / "course"
    group = grp.getgrgid(course.stat().st_gid).gr_name
    assert prof in grp.getgrnam(group).gr_mem and s1 not in grp.getgrnam(group).gr_mem
    r = as_user(prof, "sh", "-c", f"ls {course}/grading/source && touch {course}/grading/results/new.csv")
    assert r.returncode == 0, r.stderr
    made = course / "grading" / "results" / "new.csv"
    assert grp.getgrgid(made.stat().st_gid).gr_name == group  # setgid: the group's, whoever made it
    r = as_user(prof, "ls", str(Path(pwd.getpwnam(s1).pw_dir)))
    assert r.returncode != 0  # an instructor reads a student's work from the store, not their home


def test_no_instructor_changes_what_root_runs(laid_out):
    """The Hub (root) runs deploy/single-machine/jupyterhub_config.py and the grading service
    (root) loads grading/nbgrader_config.py: an instructor (a TA) reads both, and can neither
    write them, nor move them aside, nor add to deploy/."""
    base, _, (_, _, prof), _ = laid_out
    course = base / "course"
    hub_config = course / "deploy" / "single-machine" / "jupyterhub_config.py"
    nbgrader_config = course / "grading" / "nbgrader_config.py"
    for path in (hub_config, nbgrader_config):
        assert as_user(prof, "cat", str(path)).returncode == 0
        r = as_user(prof, "sh", "-c", f"echo 'import os' >> {path}")
        assert r.returncode != 0 and "Permission denied" in r.stderr, r
    for attempt in (
        f"mv {nbgrader_config} {nbgrader_config}.old",
        f"rm -f {nbgrader_config}",
        f"touch {hub_config.parent}/extra.py",
    ):
        r = as_user(prof, "sh", "-c", attempt)
        assert r.returncode != 0, attempt
    assert nbgrader_config.stat().st_uid == 0 and hub_config.stat().st_uid == 0


def test_no_instructor_replaces_what_root_imports(laid_out):
    """The Hub and the grading service (root) import lab_utils and .venv from the course: they are
    root's, no one else writes them, and the course's root is sticky, so that an instructor can
    move none of root's entries aside to put one of theirs in its place."""
    base, _, (_, _, prof), _ = laid_out
    course = base / "course"
    for attempt in (
        f"mv {course}/lab_utils {course}/lab_utils.old",
        f"mv {course}/grading {course}/grading.old",
        f"mv {course}/deploy {course}/deploy.old",
        f"echo x >> {course}/lab_utils/__init__.py",
        f"touch {course}/lab_utils/evil.py",
    ):
        r = as_user(prof, "sh", "-c", attempt)
        assert r.returncode != 0, attempt
    assert as_user(prof, "touch", f"{course}/grading/results/mine.csv").returncode == 0  # their work goes on


def test_an_instructor_publishes_to_the_student_repository_students_read_it(laid_out):
    base, _, (s1, _, prof), _ = laid_out
    public = base / "student"
    env = {"GIT_CONFIG_SYSTEM": str(base / "gitconfig")}
    r = as_user(
        prof,
        "sh",
        "-c",
        f"echo '# a note' > {public}/NOTE.md && git -C {public} add NOTE.md && "
        f"git -C {public} -c user.name=i -c user.email=i@x commit -qm note",
        env=env,
    )
    assert r.returncode == 0, r.stderr
    r = as_user(s1, "git", "clone", "-q", str(public), f"{pwd.getpwnam(s1).pw_dir}/pulled", env=env)
    assert r.returncode == 0 and (Path(pwd.getpwnam(s1).pw_dir) / "pulled" / "NOTE.md").exists(), r.stderr
    assert as_user(s1, "sh", "-c", f"touch {public}/mine").returncode != 0  # students only read it


def test_the_setup_is_idempotent_and_refuses_what_students_could_not_reach(laid_out, tmp_path, capsys):
    base, the_class, (s1, s2, prof), made = laid_out
    roster = base / "etc" / "roster.csv"
    args = dict(
        repo=base / "course",
        folder=base / "etc",
        python=Path(made.python),
        group=the_class.env["LABS_INSTRUCTORS_GROUP"],
        handin_user=the_class.env["LABS_HANDIN_USER"],
        store=base / "store",
        student_repo=base / "student",
        home_base=base / "home",
        gitconfig=base / "gitconfig",
        state=base / "state",
    )
    # what an instructor (the group) may have left for root's next run: a link into /etc in the
    # course, a hook and a file-system monitor in the student repository
    course, public = base / "course", base / "student"
    marker = tmp_path / "ran-as-root"
    target = tmp_path / "root-file"
    target.write_text("root's")
    target.chmod(0o600)
    planted = (
        f"ln -s {target} {course}/grading/results/link && "
        f"printf '#!/bin/sh\\ntouch {marker}\\n' > {public}/.git/hooks/pre-commit && "
        f"chmod +x {public}/.git/hooks/pre-commit && git -C {public} config core.fsmonitor 'touch {marker}'"
    )
    r = as_user(prof, "sh", "-c", planted, env={"GIT_CONFIG_SYSTEM": str(base / "gitconfig")})
    assert r.returncode == 0, r.stderr
    capsys.readouterr()
    classroom.setup(roster, **args)
    said = capsys.readouterr().out
    assert "made the account" not in said and "joined" not in said and "closed" not in said
    assert not marker.exists(), "root ran git in the group's repository"
    assert (target.stat().st_uid, target.stat().st_gid, target.stat().st_mode & 0o777) == (0, 0, 0o600)
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    (hidden / "python").symlink_to(made.python)
    with pytest.raises(ValueError, match=r"students cannot run .*closed to other users"):
        classroom.lay_out(base / "course", os.getgid(), hidden / "python")
    loaded = classroom.load_class(base / "etc")
    assert loaded.roster.students == [s1, s2] and loaded.roster.instructors == [prof]
    assert loaded.env == the_class.env


def test_a_system_account_on_the_roster_is_refused_before_anything_changes(tmp_path):
    (tmp_path / "r.csv").write_text("user,role\nprof,instructor\ndaemon,student\n")
    with pytest.raises(ValueError, match="daemon are system accounts"):
        classroom.setup(tmp_path / "r.csv", folder=tmp_path / "etc", store=tmp_path / "store")
    assert not (tmp_path / "etc").exists() and not (tmp_path / "store").exists()


def test_a_roster_others_may_write_is_refused_before_anything_changes(tmp_path):
    """The roster says who is an instructor: one in the course (the group's to write) would let a
    TA name anyone an instructor at the setup's next run."""
    (tmp_path / "r.csv").write_text("user,role\nprof,instructor\n")
    (tmp_path / "r.csv").chmod(0o664)
    with pytest.raises(ValueError, match="may be changed by others"):
        classroom.setup(tmp_path / "r.csv", folder=tmp_path / "etc", store=tmp_path / "store")
    assert not (tmp_path / "etc").exists() and not (tmp_path / "store").exists()


def test_nbgrader_runs_no_notebook_code_when_it_generates_a_release():
    """nbgrader's InstantiateTests would run a source notebook's code (before `# AUTOTEST`) in a
    kernel of the grader's, root's in the grading service, outside every sandbox."""
    from lab_utils.grading import nbapi

    used = [p.__name__ for p in nbapi.course_api(REPO / "grading").config.GenerateAssignment.preprocessors]
    assert "InstantiateTests" not in used and "ClearSolutions" in used and "ClearHiddenTests" in used, used


@pytest.mark.parametrize(
    "text, why",
    [
        ("name,role\nalice,student\n", "header"),
        ("user,role\nAlice,instructor\n", "no Unix user name"),
        ("user,role\nalice,professor\n", "one of student, instructor, ta"),
        ("user,role\nalice,ta\nalice,student\n", "twice"),
        ("user,role\nalice,student\n", "no instructor"),
    ],
)
def test_a_bad_roster_is_refused_naming_the_line(tmp_path, text, why):
    (tmp_path / "r.csv").write_text(text)
    with pytest.raises(ValueError, match=why):
        classroom.read_roster(tmp_path / "r.csv")
