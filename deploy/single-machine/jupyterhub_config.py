# A class on one machine (The Littlest JupyterHub's shape, without systemd): JupyterHub with
# each student a Unix user, their server kept to the class's limits, and the hand-in service.
# deploy/README.md, "A class on one machine", walks through a term with it; tests/process/test_hub.py
# starts a real Hub from this very file (adding only its ports, paths, a test login and a test client).
#
# The class's choices, from the environment of the Hub (or edit the defaults here):
#   LABS_HANDIN_STORE   where hand-ins and feedback are kept (made mode 700, root's)   /srv/handin
#   LABS_DUE_FILE       the class's due file (lab: due time, a line each; read again when it changes,
#                       and by the grader: due_file in grading/settings.yml). Instead of:
#   LABS_HANDIN_LABS    the labs open for hand-in, NAME or NAME=DUE (ISO 8601 with a zone), spaces between
#   LABS_INSTRUCTORS    the instructors' user names, commas between (they collect and return feedback)
#   LABS_HUB_URL        this Hub's address as the students' servers reach it          http://127.0.0.1:8000
#   LABS_HANDIN_PORT    the hand-in service's port, on loopback (behind the Hub's proxy)  10101
#   LABS_HANDIN_USER    the account the hand-in service runs as, which owns the store     labs-handin
#                       (make it: deploy/README.md; empty: the Hub's own user, root: not advised)
#   LABS_HANDIN_PYTHON  the interpreter it runs, which that account can reach            this one
#   LABS_GRADER_COURSE  the grading course (the instructor repository's grading/, root's): where
#                       the grading service grades, as root, what instructors ask for   (none: no service)
#   LABS_GRADER_PORT    the grading service's port, on loopback                            10102
import os
import pwd
import sys

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)

store = os.environ.get("LABS_HANDIN_STORE", "/srv/handin")
labs = os.environ.get(
    "LABS_HANDIN_LABS", "01_single_node 02_ps_async 03_ps_sync 04_allreduce 05_alexnet 06_communication"
)
due_file = os.environ.get("LABS_DUE_FILE")
instructors = [u for u in os.environ.get("LABS_INSTRUCTORS", "").split(",") if u]
hub_url = os.environ.get("LABS_HUB_URL", "http://127.0.0.1:8000")
port = int(os.environ.get("LABS_HANDIN_PORT", "10101"))
handin_user = os.environ.get("LABS_HANDIN_USER", "labs-handin")
handin_python = os.environ.get("LABS_HANDIN_PYTHON", sys.executable)
if handin_user:
    try:
        pwd.getpwnam(handin_user)
    except KeyError:
        raise SystemExit(
            f"the hand-in service's account {handin_user!r} does not exist: make it, and its store "
            f"(deploy/README.md, 'A class on one machine'): sudo useradd --system --shell /usr/sbin/nologin "
            f"{handin_user} && sudo install -d -o {handin_user} -g {handin_user} -m 700 {store}"
        ) from None

# Students log in with their Unix accounts (PAM, JupyterHub's default). List the class:
# c.Authenticator.allowed_users = {"alice", "bob"}

# Each student's server runs as their Unix user, in a cgroup of the class's limits
c.JupyterHub.spawner_class = "lab_utils.hub.spawner.LimitedSpawner"
c.Spawner.mem_limit = "2G"
c.Spawner.cpu_limit = 1.0
c.LimitedSpawner.max_processes = 512
c.Spawner.default_url = "/lab/tree/course-labs/labs/README.md"  # the course map, where nbgitpuller puts the labs
c.Spawner.environment = {"LABS_HANDIN_URL": f"{hub_url}/services/handin/"}

# The hand-in service: students are known by their server's Hub token, never by a file's owner.
# It runs as an account of its own, the only one (besides root) that can read the store.
c.JupyterHub.services = [
    {
        "name": "handin",
        "url": f"http://127.0.0.1:{port}",
        "command": [handin_python, "-m", "lab_utils.hub.service", "--store", store]
        + ([f"--due-file={due_file}"] if due_file else [f"--lab={lab}" for lab in labs.split()]),
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
grader_course = os.environ.get("LABS_GRADER_COURSE")
if grader_course:
    grader_port = int(os.environ.get("LABS_GRADER_PORT", "10102"))
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
            ],  # fmt: skip
        }
    )
    c.JupyterHub.load_roles.append(  # it collects from the hand-in service with its own token
        {
            "name": "grader-service",
            "scopes": ["custom:handin:grade", "access:services!service=handin"],
            "services": ["grader"],
        }  # fmt: skip
    )
