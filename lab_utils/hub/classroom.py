"""A class on one machine, set up from a roster, as root; private by default.

    sudo .venv/bin/python -P -m lab_utils.hub setup --roster ~/roster.csv

``roster.csv`` has a header and one line per person: ``user,role`` (``student``, ``instructor``,
or ``ta``: a teaching assistant, who collects and grades as an instructor does). Run again
after the roster changes: every step leaves what is already right as it is. It:

- makes each missing account (``useradd``), and closes every roster home to its owner (0700);
  instructors and TAs join the instructors' group (``labs-instructors``), and students leave it;
- makes the hand-in service's account (``labs-handin``) and its store, mode 700;
- lays out this repository for the class: students run its ``.venv`` and import its
  ``lab_utils`` and read nothing else of it. Every other entry (``grading/``, ``.git``,
  ``tests/``, ...) is the instructors' group's, closed to others, its folders setgid so that what
  an instructor or the grader writes there stays the group's (the grading commands keep the group's write bit).
  What root runs from it (``deploy/``, ``grading/nbgrader_config.py``) stays root's: the group
  reads it and no one else writes it;
- writes the class's folder (``/etc/labs``): ``class.env`` (what the Hub's configuration reads),
  ``roster.csv``, ``due.yml`` (one due time per lab, read by the hand-in service and the grader;
  instructors may edit it, everyone may read it), ``jupyter-student/`` (the students' servers
  load no nbgrader tool), and ``labs-hub.service`` (a systemd unit);
- writes the public student repository (``/srv/labs-student``, what the class's nbgitpuller link
  pulls; everyone reads it, the instructors' group publishes to it: ``make student-repo``) and
  marks it and the course safe for git (``/etc/gitconfig``), so every student may pull it and
  every instructor publish.

Then ``sudo .venv/bin/jupyterhub -f deploy/single-machine/jupyterhub_config.py`` starts the
class (``deploy/README.md``, "A class on one machine").
"""

from __future__ import annotations

import csv
import grp
import json
import os
import pwd
import re
import shlex
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..grading.layout import REPO_ROOT

__all__ = ["Class", "Roster", "read_roster", "load_class", "private_tmp", "setup"]

CLASS_DIR = Path("/etc/labs")
GROUP = "labs-instructors"
HANDIN_USER = "labs-handin"
STORE = Path("/srv/handin")
STUDENT_REPO = Path("/srv/labs-student")
#: root's alone: the Hub's database and cookie secret, and the grading service's own course
STATE = Path("/var/lib/labs")
#: what students may read of the repository: what runs the labs
PUBLIC = (".venv", "lab_utils")
#: what root runs from the repository besides PUBLIC: the Hub's configuration and nbgrader's
#: (the grading service loads it). Root's, and only readable by the instructors' group: a TA who
#: could edit them would run code as root
ROOT_RUNS = ("deploy", "grading/nbgrader_config.py")
#: the first uid of an ordinary user (login.defs' UID_MIN): below it, system accounts the setup never touches
FIRST_UID = 1000
_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_ROLES = {"student": "student", "instructor": "instructor", "ta": "instructor"}


@dataclass
class Roster:
    students: list[str] = field(default_factory=list)
    instructors: list[str] = field(default_factory=list)  # TAs too

    @property
    def everyone(self) -> list[str]:
        return [*self.instructors, *self.students]


def read_roster(path: str | os.PathLike) -> Roster:
    """The roster at ``path``; ValueError naming the line for a bad name, role or repeat."""
    roster, seen = Roster(), set()
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["user", "role"]:
        raise ValueError(f"{path}: the first line must be the header `user,role`")
    for n, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        name, role = (row + [""])[0].strip(), (row + ["", ""])[1].strip().lower()
        if not _NAME.match(name):
            raise ValueError(f"{path}:{n}: {name!r} is no Unix user name (lowercase letters, digits, _ and -)")
        if role not in _ROLES:
            raise ValueError(f"{path}:{n}: role {role!r}: one of student, instructor, ta")
        if name in seen:
            raise ValueError(f"{path}:{n}: {name} is on the roster twice")
        seen.add(name)
        (roster.instructors if _ROLES[role] == "instructor" else roster.students).append(name)
    if not roster.instructors:
        raise ValueError(f"{path}: no instructor on the roster (someone must collect and grade)")
    return roster


@dataclass
class Class:
    """What the Hub's configuration reads of a class set up here (:func:`load_class`)."""

    folder: Path
    roster: Roster
    env: dict[str, str]


def load_class(folder: str | os.PathLike | None = None) -> Class | None:
    """The class set up in ``folder`` (``$LABS_CLASS_DIR``, else /etc/labs); None when none is."""
    folder = Path(folder or os.environ.get("LABS_CLASS_DIR") or CLASS_DIR)
    if not (folder / "class.env").is_file():
        return None
    env = {}
    for line in (folder / "class.env").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            env[key.strip()] = shlex.split(value)[0] if value.strip() else ""
    return Class(folder, read_roster(folder / "roster.csv"), env)


def private_tmp(home: str | os.PathLike, uid: int, gid: int) -> str:
    """``home/.tmp``, mode 700 and the user's: a server's own TMPDIR (the Hub makes it, as root,
    before the server starts). Never through a link the user put there: RuntimeError then."""
    tmp = os.path.join(home, ".tmp")
    try:
        os.mkdir(tmp, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise RuntimeError(f"{tmp} is not a folder ({exc.strerror}): remove it, then start the server again") from None
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return tmp


# ---------------------------------------------------------------------------------- steps
def _run(*args: str) -> None:
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")


def _say(what: str) -> None:
    print(f"setup: {what}", flush=True)


def _group(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        _run("groupadd", name)
        _say(f"made the group {name}")
        return grp.getgrnam(name).gr_gid


def _uid(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def _system_user(name: str) -> pwd.struct_passwd:
    """A service's account: no home, no login."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        _run("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name)
        _say(f"made the service account {name}")
        return pwd.getpwnam(name)


def _user(name: str, home_base: Path | None) -> pwd.struct_passwd:
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        args = ["useradd", "--create-home", "--shell", "/bin/bash", "--user-group"]
        if home_base is not None:
            args += ["--home-dir", str(home_base / name)]
        _run(*args, name)
        pw = pwd.getpwnam(name)
        _say(f"made the account {name} (home {pw.pw_dir}); set its password with: passwd {name}")
    home = Path(pw.pw_dir)
    if home.is_dir() and stat.S_IMODE(home.stat().st_mode) & 0o077:
        home.chmod(0o700)
        _say(f"closed {home} to everyone but {name} (mode 700)")
    return pw


def _membership(user: str, group: str, member: bool) -> None:
    members = set(grp.getgrnam(group).gr_mem)
    if member and user not in members:
        _run("gpasswd", "--add", user, group)
        _say(f"{user} joined {group}")
    elif not member and user in members:
        _run("gpasswd", "--delete", user, group)
        _say(f"{user} left {group}")


def _reachable(path: Path) -> str | None:
    """Why another user cannot reach ``path`` (a folder on its way they may not enter), or None."""
    for folder in [*reversed(path.parents)][1:] + ([path] if path.is_dir() else []):
        if not stat.S_IMODE(folder.stat().st_mode) & 0o001:
            return f"{folder} is closed to other users (mode {stat.S_IMODE(folder.stat().st_mode):o})"
    return None


_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _set_fd(fd: int, mode_of, uid: int, gid: int) -> None:
    st = os.fstat(fd)
    if (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid):
        os.fchown(fd, uid, gid)
    mode, folder = stat.S_IMODE(st.st_mode), stat.S_ISDIR(st.st_mode)
    want = mode_of(mode, folder or bool(mode & 0o100), folder)
    if want != mode:
        os.fchmod(fd, want)


def _set_tree(path: Path, mode_of, uid: int = -1, gid: int = -1, skip: tuple[Path, ...] = ()) -> None:
    """``path`` and everything under it, but ``skip``: owned by ``uid`` and ``gid`` (-1: as it
    is), each mode ``mode_of(mode, executable, folder)`` (a folder counts as executable). Each
    entry is opened without following a link and changed through its descriptor: the tree is
    the instructors' group's to write while this runs as root, and a folder swapped for a link
    mid-walk is never followed out of it (links are left alone)."""
    skipped = {os.path.normpath(p) for p in skip}
    try:
        top = os.open(path, _OPEN)
    except OSError:
        return  # missing, or a link: nothing of it is changed
    try:
        _set_fd(top, mode_of, uid, gid)
        if not stat.S_ISDIR(os.fstat(top).st_mode):
            return
        for rel, dirs, names, dir_fd in os.fwalk(".", dir_fd=top):
            dirs[:] = [d for d in dirs if os.path.normpath(os.path.join(path, rel, d)) not in skipped]
            for name in dirs + names:
                if os.path.normpath(os.path.join(path, rel, name)) in skipped:
                    continue
                try:
                    fd = os.open(name, _OPEN, dir_fd=dir_fd)
                except OSError:
                    continue  # a link (or a socket): left as it is
                try:
                    _set_fd(fd, mode_of, uid, gid)
                finally:
                    os.close(fd)
    finally:
        os.close(top)


def _close(path: Path, gid: int, skip: tuple[Path, ...] = ()) -> None:
    """``path`` and all under it (but ``skip``): the instructors' group's (read and write),
    nobody else's; folders setgid, so what is made in them later stays the group's."""
    _set_tree(path, lambda m, x, d: ((m & ~0o6000) | 0o060 | 0o010 * x | 0o2000 * d) & ~0o007, gid=gid, skip=skip)


def _open_to_read(path: Path) -> None:
    """``path`` and all under it root's, readable (and folders enterable) by everyone, written
    by root alone: what students run, and what root runs too (the Hub imports ``lab_utils``)."""
    _set_tree(path, lambda m, x, d: (m | 0o044 | 0o011 * x) & ~0o6022, uid=0)


def _root_only(path: Path, gid: int) -> None:
    """``path`` and all under it root's, readable by the group ``gid``, written by root alone."""
    _set_tree(path, lambda m, x, d: 0o750 if x else 0o640, uid=0, gid=gid)


def _share(path: Path, gid: int) -> None:
    """``path`` and all under it readable by everyone and written by the instructors' group
    (folders setgid): the public student repository, which any instructor publishes to."""
    _set_tree(path, lambda m, x, d: (m & ~0o6000) | 0o064 | 0o011 * x | 0o2070 * d, gid=gid)


def lay_out(repo: Path, gid: int, python: Path) -> None:
    """The repository as a class needs it: :data:`PUBLIC` readable by all, the rest the
    instructors' group's alone (``python``: what students' servers run, checked reachable)."""
    why = _reachable(repo)
    if why:
        raise ValueError(f"students cannot reach the course at {repo}: {why}. Clone it where they can (/srv, /opt)")
    real = Path(os.path.realpath(python))
    why = (
        _reachable(Path(python).absolute().parent)
        or _reachable(real.parent)
        or (None if real.stat().st_mode & 0o001 else f"{real} is not executable by others")
    )
    if why:
        raise ValueError(
            f"students cannot run {python} ({real}): {why}. Make the course's environment from a Python "
            "every user can run (the system's python3.12, or one installed under /opt), or give --python"
        )
    root_runs = tuple(repo / rel for rel in ROOT_RUNS)
    for entry in sorted(repo.iterdir()):
        if entry.name in PUBLIC:
            _open_to_read(entry)
        elif entry not in root_runs:
            _close(entry, gid, skip=root_runs)  # never group-writable, not even for a moment
    for path in root_runs:
        _root_only(path, gid)
    # root's, sticky: an instructor renames no entry of root's (lab_utils, which the Hub and the
    # grading service import; grading/; deploy/) to put one of theirs in its place
    for path in (repo, repo / "grading"):
        if path.is_dir() and not path.is_symlink():
            os.chown(path, 0, gid, follow_symlinks=False)
    os.chmod(repo, 0o3771)  # others may enter (to reach .venv and lab_utils), not list
    if (repo / "grading").is_dir() and not (repo / "grading").is_symlink():
        os.chmod(repo / "grading", 0o3770)
    _say(
        f"laid out {repo}: {', '.join(PUBLIC)} readable by all; {', '.join(ROOT_RUNS)} root's (the group reads them); "
        f"everything else {grp.getgrgid(gid).gr_name}'s alone"
    )


def _write(path: Path, text: str, mode: int, gid: int | None = None, keep: bool = False) -> None:
    if keep and path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    if gid is not None:
        os.chown(tmp, -1, gid)
    os.replace(tmp, path)
    _say(f"wrote {path}")


def _due_file(repo: Path) -> str:
    schedule = repo / "grading" / "course.yml"
    if schedule.is_file() and not schedule.is_symlink():  # the term's schedule: the class's copy of it
        return schedule.read_text()
    labs = sorted(p.name for p in (repo / "grading" / "source").iterdir() if p.is_dir())
    lines = [
        "# One due time per lab (ISO 8601 with a zone, or null: open without one). The hand-in service",
        "# reads this again when it changes (no restart), and the grader reads it too",
        "# (due_file in grading/settings.yml). A lab not listed is closed for hand-in.",
        *(f"{lab}: null" for lab in labs),
    ]
    return "\n".join(lines) + "\n"


def _link_due_file(settings: Path, due: Path) -> None:
    """``due_file:`` in the course's settings set to the class's file (the instructors' group's
    file: opened without following a link; a ``due_file:`` that names another file, such as the
    repository's ``course.yml``, is changed to name the class's copy, which the hand-in service
    reads too)."""
    try:
        fd = os.open(
            settings, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o660
        )
    except OSError as exc:
        raise RuntimeError(f"{settings}: {exc.strerror} (a plain file of the course, not a link)") from None
    with os.fdopen(fd, "r+") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise RuntimeError(f"{settings} is not a plain file")
        text = f.read()
        line = re.search(r"^due_file:(.*)$", text, re.M)
        if line and line.group(1).split("#")[0].strip() == str(due):
            return
        if line:  # one place for the due times: the class's file
            text = (
                text[: line.start()]
                + f"due_file: {due}  # the class's copy (python -m lab_utils.hub setup)"
                + text[line.end() :]
            )
            f.seek(0)
            f.truncate()
            f.write(text)
            _say(f"{settings}: due_file: {due}")
            return
        f.write(
            f"\n# the class's due file, read by the hand-in service too (python -m lab_utils.hub setup)\ndue_file: {due}\n"
        )
    _say(f"{settings}: due_file: {due}")


def _grader_course(repo: Path, state: Path) -> Path:
    """The grading service's own course, root's alone (``state/grading``): it grades there, on
    copies of the course's notebooks and settings it makes at each grading, and loads the
    nbgrader configuration copied here now, never one the instructors' group could change."""
    state.mkdir(parents=True, exist_ok=True)
    os.chown(state, 0, 0)
    state.chmod(0o700)
    work = state / "grading"
    work.mkdir(exist_ok=True)
    os.chown(work, 0, 0)
    work.chmod(0o700)
    from ..grading.safefiles import read_plain

    config = read_plain(repo / "grading" / "nbgrader_config.py", 2**20)
    if not isinstance(config, bytes):
        raise RuntimeError(f"{repo / 'grading' / 'nbgrader_config.py'} is not a plain file")
    _write(work / "nbgrader_config.py", config.decode(), 0o600)
    return work


STUDENT_JUPYTER = {
    # nbgrader's instructor tools and its exchange: students hand in through the hand-in service
    "jupyter_server_config.d/labs-student.json": {
        "ServerApp": {
            "jpserver_extensions": {
                "nbgrader.server_extensions.formgrader": False,
                "nbgrader.server_extensions.validate_assignment": False,
                "nbgrader.server_extensions.assignment_list": False,
                "nbgrader.server_extensions.course_list": False,
            }
        }
    },
    "labconfig/page_config.json": {"disabledExtensions": {"@jupyter/nbgrader": True}},
}


def _unit(repo: Path, python: Path, folder: Path) -> str:
    return f"""# The class's Hub as a systemd service: sudo ln -s {folder}/labs-hub.service /etc/systemd/system/
# then: sudo systemctl daemon-reload && sudo systemctl enable --now labs-hub
[Unit]
Description=JupyterHub for the distributed-training labs
After=network.target

[Service]
WorkingDirectory={folder}
Environment=LABS_CLASS_DIR={folder}
Environment=PATH={python.parent}:/usr/local/bin:/usr/bin:/bin
ExecStart={python.parent}/jupyterhub -f {repo}/deploy/single-machine/jupyterhub_config.py
KillSignal=SIGTERM
TimeoutStopSec=20
Restart=on-failure

[Install]
WantedBy=multi-user.target
"""


def setup(
    roster_file: str | os.PathLike,
    *,
    repo: Path = REPO_ROOT,
    folder: Path = CLASS_DIR,
    python: Path | None = None,
    group: str = GROUP,
    handin_user: str = HANDIN_USER,
    store: Path = STORE,
    student_repo: Path = STUDENT_REPO,
    home_base: Path | None = None,
    gitconfig: Path = Path("/etc/gitconfig"),
    state: Path = STATE,
) -> Class:
    """Set up the class (module docstring); returns what the Hub will read of it."""
    st = os.stat(roster_file)
    if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid(), int(os.environ.get("SUDO_UID", "0"))):
        raise ValueError(
            f"{roster_file} may be changed by others (mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}): "
            "the roster says who is an instructor; keep it where only you write (not in the course)"
        )
    roster = read_roster(roster_file)
    system = [n for n in roster.everyone if (uid := _uid(n)) is not None and uid < FIRST_UID]
    if system:
        raise ValueError(
            f"{roster_file}: {', '.join(system)} are system accounts (uid below {FIRST_UID}): a class's "
            "people are ordinary users, whose homes the setup closes"
        )
    repo, folder = Path(repo).resolve(), Path(folder)
    python = Path(python) if python else repo / ".venv" / "bin" / "python"
    gid = _group(group)
    for name in roster.everyone:
        _user(name, home_base)
        _membership(name, group, name in roster.instructors)
    handin = _system_user(handin_user) if handin_user else None
    store.mkdir(parents=True, exist_ok=True, mode=0o700)
    if handin is not None:
        os.chown(store, handin.pw_uid, handin.pw_gid)
    store.chmod(0o700)
    _student_repo(student_repo, repo, gid, gitconfig)
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o755)
    due = folder / ("course.yml" if (repo / "grading" / "course.yml").is_file() else "due.yml")
    _write(due, _due_file(repo), 0o664, gid, keep=True)
    _link_due_file(repo / "grading" / "settings.yml", due)
    lay_out(repo, gid, python)  # after what it writes into the repository
    grader = _grader_course(repo, Path(state))
    env = {
        "LABS_CLASS_DIR": str(folder),
        "LABS_INSTRUCTORS": ",".join(roster.instructors),
        "LABS_INSTRUCTORS_GROUP": group,
        "LABS_HANDIN_STORE": str(store),
        "LABS_HANDIN_USER": handin_user,
        "LABS_HANDIN_PYTHON": str(python),
        "LABS_SERVER_PYTHON": str(python),
        "LABS_DUE_FILE": str(due),
        "LABS_GRADER_COURSE": str(repo / "grading"),
        "LABS_GRADER_WORK": str(grader),
        "LABS_STATE_DIR": str(state),
        "LABS_STUDENT_REPO": str(student_repo),
        "LABS_STUDENT_JUPYTER": str(folder / "jupyter-student"),
    }
    header = "# The class, as `python -m lab_utils.hub setup` set it up; the Hub's configuration reads it.\n"
    _write(folder / "class.env", header + "".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()), 0o644)
    _write(folder / "roster.csv", Path(roster_file).read_text(), 0o640, gid)
    for rel, conf in STUDENT_JUPYTER.items():
        _write(folder / "jupyter-student" / rel, json.dumps(conf, indent=1) + "\n", 0o644)
    _write(folder / "labs-hub.service", _unit(repo, python, folder), 0o644)
    _say(
        f"done: {len(roster.students)} student(s), {len(roster.instructors)} instructor(s). Start the Hub with\n"
        f"  sudo {python.parent}/jupyterhub -f {repo}/deploy/single-machine/jupyterhub_config.py"
    )
    return Class(folder, roster, env)


def _student_repo(student_repo: Path, repo: Path, gid: int, gitconfig: Path) -> None:
    """The public student repository: written the first time (its parent is root's: no
    instructor removes it), then the instructors' group's to publish to; root runs no git in it
    again (a repository the group writes: its hooks, filters, monitor)."""
    from ..grading import student_repo as public

    if not student_repo.exists():
        _say(public.write(student_repo, repo, message="the class's labs (python -m lab_utils.hub setup)"))
        _run("git", "-C", str(student_repo), "config", "core.sharedRepository", "group")
    else:
        _say(f"{student_repo} is there: instructors publish to it (make student-repo DEST={student_repo})")
    _share(student_repo, gid)
    _safe_directory(gitconfig, student_repo)
    _safe_directory(gitconfig, repo)  # root's: instructors commit and publish from it


def _safe_directory(gitconfig: Path, path: Path) -> None:
    """git refuses a repository another user owns ("dubious ownership"): nbgitpuller pulls the
    student repository as each student, and instructors publish from the course (both root's):
    mark it safe, for every user."""
    got = subprocess.run(
        ["git", "config", "--file", str(gitconfig), "--get-all", "safe.directory"], capture_output=True, text=True
    )
    for where in (path, path / ".git"):  # a clone reads the repository through its .git
        if str(where) not in got.stdout.split("\n"):
            _run("git", "config", "--file", str(gitconfig), "--add", "safe.directory", str(where))
            _say(f"{gitconfig}: safe.directory {where}")


def add_parser(sub) -> None:
    """``python -m lab_utils.hub setup``'s arguments."""
    p = sub.add_parser("setup", help="the class's machine, as root: users, the course's layout, the class's files")
    p.add_argument("--roster", required=True, help="CSV: user,role (student, instructor or ta), a line each")
    p.add_argument("--class-dir", default=str(CLASS_DIR), help=f"the class's folder ({CLASS_DIR})")
    p.add_argument("--python", help="the interpreter students' servers run (default: this repository's .venv)")
    p.add_argument("--group", default=GROUP, help=f"the instructors' group ({GROUP})")
    p.add_argument("--store", default=str(STORE), help=f"the hand-in store ({STORE})")
    p.add_argument("--student-repo", default=str(STUDENT_REPO), help=f"the public student repository ({STUDENT_REPO})")


def main(args) -> int:
    try:
        setup(
            args.roster,
            folder=Path(args.class_dir),
            python=Path(args.python) if args.python else None,
            group=args.group,
            store=Path(args.store),
            student_repo=Path(args.student_repo),
        )
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"setup: {exc}", file=sys.stderr)
        return 1
    return 0
