# A class on one machine (The Littlest JupyterHub's shape): JupyterHub with each student a Unix
# user, their server kept to the class's limits, the hand-in service and the grading service.
# deploy/README.md, "A class on one machine", walks through a term with it; tests/process/test_hub.py
# starts a real Hub from this very file (adding only its ports, paths and a test login).
#
# `sudo .venv/bin/python -P -m lab_utils.hub setup --roster ~/roster.csv` sets the class up and writes
# /etc/labs/class.env, which this file reads ($LABS_CLASS_DIR: another folder). Each value below
# comes from the Hub's environment first, then class.env, then the default:
#   LABS_HANDIN_STORE   where hand-ins and feedback are kept (made mode 700)             /srv/handin
#   LABS_DUE_FILE       the term's schedule (the setup's copy of grading/course.yml; or a due file, lab:
#                       due time a line each): the labs open for hand-in and their due times, read again
#                       when it changes, and by the grader (due_file in grading/settings.yml). Without one:
#   LABS_HANDIN_LABS    the labs open for hand-in, NAME or NAME=DUE (ISO 8601 with a zone), spaces between
#   LABS_INSTRUCTORS    the instructors' user names, commas between (the roster's instructors and TAs)
#   LABS_HUB_URL        this Hub's address as the students' servers reach it          http://127.0.0.1:8000
#   LABS_HANDIN_PORT    the hand-in service's port, on loopback (behind the Hub's proxy)  10101
#   LABS_HANDIN_USER    the account the hand-in service runs as, which owns the store     labs-handin
#   LABS_HANDIN_PYTHON  the interpreter it runs, which that account can reach            this one
#   LABS_SERVER_PYTHON  the interpreter students' servers run                             this one
#   LABS_GRADER_COURSE  the grading course (the instructor repository's grading/): where
#                       the grading service grades, as root, what instructors ask for   (none: no service)
#   LABS_GRADER_WORK    the grading service's own course, root's alone, where it grades copies
#                       of the course's notebooks (the setup: /var/lib/labs/grading)   (the course)
#   LABS_GRADER_PORT    the grading service's port, on loopback                            10102
#   LABS_STATE_DIR      root's alone: the Hub's database and cookie secret (the setup: /var/lib/labs)
#                                                                            (the working directory)
#   LABS_STUDENT_REPO   the public student repository the class's nbgitpuller link pulls  (none)
#   LABS_STUDENT_JUPYTER  Jupyter configuration students' servers load first (no nbgrader tools)
import os
import pwd
import sys

from lab_utils.hub.classroom import load_class, private_tmp

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)
the_class = load_class()


def setting(name, default=None):
    return os.environ.get(name, (the_class.env if the_class else {}).get(name, default))


store = setting("LABS_HANDIN_STORE", "/srv/handin")
labs = setting(
    "LABS_HANDIN_LABS",
    "01_single_node 02_ps_async 03_ps_sync 04_allreduce 05_alexnet 06_communication 07_model_parallel",
)
due_file = setting("LABS_DUE_FILE")
instructors = [u for u in setting("LABS_INSTRUCTORS", "").split(",") if u]
hub_url = setting("LABS_HUB_URL", "http://127.0.0.1:8000")
port = int(setting("LABS_HANDIN_PORT", "10101"))
handin_user = setting("LABS_HANDIN_USER", "labs-handin")
handin_python = setting("LABS_HANDIN_PYTHON", sys.executable)
server_python = setting("LABS_SERVER_PYTHON", sys.executable)
student_repo = setting("LABS_STUDENT_REPO")
student_jupyter = setting("LABS_STUDENT_JUPYTER")
if handin_user:
    try:
        pwd.getpwnam(handin_user)
    except KeyError:
        raise SystemExit(
            f"the hand-in service's account {handin_user!r} does not exist: set the class up first "
            "(deploy/README.md, 'A class on one machine'): sudo .venv/bin/python -P -m lab_utils.hub setup --roster ~/roster.csv"
        ) from None

# The Hub's state where only root reads it, never in the working directory (a course folder the
# instructors' group writes: its cookie secret there would let one forge any user's login)
state_dir = setting("LABS_STATE_DIR")
if state_dir:
    c.JupyterHub.db_url = f"sqlite:///{state_dir}/jupyterhub.sqlite"
    c.JupyterHub.cookie_secret_file = f"{state_dir}/jupyterhub_cookie_secret"
    c.ConfigurableHTTPProxy.pid_file = f"{state_dir}/jupyterhub-proxy.pid"

# Students log in with their Unix accounts (PAM, JupyterHub's default): those on the roster.
if the_class:
    c.Authenticator.allowed_users = set(the_class.roster.everyone)

# Each server runs this interpreter's Jupyter, with its tools on PATH (a terminal's `python` too)
c.Spawner.cmd = [server_python, "-m", "jupyterhub.singleuser"]
c.Spawner.environment = {
    "PATH": f"{os.path.dirname(server_python)}:/usr/local/bin:/usr/bin:/bin",
    "LABS_HANDIN_URL": f"{hub_url}/services/handin/",
}
# A terminal's shell: interactive, not a login shell (Jupyter's default under a Hub), which reads
# /etc/profile and so resets PATH: a terminal's `python` would be the system's, or none
c.Spawner.args = ["--ServerApp.terminado_settings=shell_command=/bin/bash -i"]


def private_tmp_and_tools(spawner):
    """Each server a TMPDIR of its own (~/.tmp, mode 700: no /tmp shared with the class), and
    students a Jupyter without nbgrader's instructor tools."""
    pw = pwd.getpwnam(spawner.user.name)
    env = {**spawner.environment, "TMPDIR": private_tmp(pw.pw_dir, pw.pw_uid, pw.pw_gid)}
    if student_jupyter and spawner.user.name not in instructors:
        env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (student_jupyter, env.get("JUPYTER_CONFIG_PATH")) if p)
    spawner.environment = env


c.Spawner.pre_spawn_hook = private_tmp_and_tools

# Each student's server runs as their Unix user, in a cgroup of the class's limits
c.JupyterHub.spawner_class = "lab_utils.hub.spawner.LimitedSpawner"
c.Spawner.mem_limit = "2G"
c.Spawner.cpu_limit = 1.0
c.LimitedSpawner.max_processes = 512
COURSE_MAP = "lab/tree/course-labs/labs/README.md"  # where nbgitpuller puts the labs
if student_repo:  # each start pulls the class's fixes, then opens the course map
    c.Spawner.default_url = f"/git-pull?repo={student_repo}&branch=main&targetpath=course-labs&urlpath={COURSE_MAP}"
else:
    c.Spawner.default_url = "/" + COURSE_MAP

# The hand-in service: students are known by their server's Hub token, never by a file's owner.
# It runs as an account of its own, the only one (besides root) that can read the store.
c.JupyterHub.services = [
    {
        "name": "handin",
        "url": f"http://127.0.0.1:{port}",
        "command": [handin_python, "-m", "lab_utils.hub.service", "--store", store]
        + ([f"--due-file={due_file}"] if due_file else [f"--lab={lab}" for lab in labs.split()]),
        "cwd": "/",  # each service: not the Hub's working directory, which `python -m` would import from
        **({"user": handin_user} if handin_user else {}),
    }
]
c.JupyterHub.custom_scopes = {"custom:handin:grade": {"description": "collect hand-ins and return feedback"}}
c.JupyterHub.load_roles = [
    {"name": "user", "scopes": ["self", "access:services!service=handin"]},
    {"name": "instructor", "scopes": ["custom:handin:grade", "access:services!service=handin"], "users": instructors},
]
c.Spawner.server_token_scopes = [
    "users:activity!user",
    "access:servers!server",
    "access:services!service=handin",
    "custom:handin:grade",  # a server's token gets it only when its user holds it: instructors
]

# The grading service (lab_utils.hub.grader): an instructor's server is not root, so a submission
# graded there would run as the instructor, with their token. Instructors ask this service, which
# runs as root beside the Hub, to grade: `python -m lab_utils.hub grade 02_ps_async`.
grader_course = setting("LABS_GRADER_COURSE")
if grader_course:
    grader_port = int(setting("LABS_GRADER_PORT", "10102"))
    c.JupyterHub.services.append(
        {
            "name": "grader",
            "url": f"http://127.0.0.1:{grader_port}",
            "command": [
                sys.executable,
                "-m",
                "lab_utils.hub.grader",
                "--course",
                grader_course,
                "--handin-url",
                f"{hub_url}/services/handin/",
            ]  # fmt: skip
            + ([f"--work={setting('LABS_GRADER_WORK')}"] if setting("LABS_GRADER_WORK") else [])
            + ([f"--due-file={due_file}"] if due_file else []),
            "cwd": "/",
        }
    )
    c.JupyterHub.load_roles.append(  # it collects from the hand-in service with its own token
        {
            "name": "grader-service",
            "scopes": ["custom:handin:grade", "access:services!service=handin"],
            "services": ["grader"],
        }  # fmt: skip
    )

# Servers idle an hour are stopped (a kernel holds its memory for as long as it lives: Lab 1's
# TensorBoard alone holds half a gigabyte). jupyterhub-idle-culler, as a service of the Hub's.
c.JupyterHub.services.append(
    {"name": "idle-culler", "command": [sys.executable, "-m", "lab_utils.hub.culler", "--timeout=3600"], "cwd": "/"}
)
c.JupyterHub.load_roles.append(
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }  # fmt: skip
)
