"""The grading service: grades a lab's hand-ins where the sandbox works (as root), for an
instructor who asks from their own server, which is not root and must never run a student's code.

An instructor's server is an ordinary user's: there, ``make autograde`` has no sandbox, and a
submission would run as the instructor, with their files and their Hub token. This service runs
beside the Hub as root (``c.JupyterHub.services``; deploy/single-machine/jupyterhub_config.py
starts it when the class has a grading course). Asked to grade a lab, it

1. collects each student's last hand-in from the hand-in service (with its own token, which
   holds ``custom:handin:grade``),
2. runs ``python -m lab_utils.grading autograde`` and ``feedback`` on its own course, each
   submission in the isolated sandbox, with an environment that holds no Hub variable. Its
   ``--course`` is the instructor repository's ``grading/``, which no student can read; on a
   class's machine the instructors' group writes it, so the service grades in ``--work``, a
   course of root's alone, on plain copies of the course's notebooks and settings made at each
   grading (never through a link), with the nbgrader configuration the class's setup put
   there. It collects into a folder of its own and runs Python with ``-P`` there: nothing an
   instructor writes is imported, loaded or run as root,
3. keeps the results for the instructor to fetch: the same layout ``make autograde``,
   ``make feedback`` and ``make grades`` write (``results/``, ``feedback/``, ``autograded/`` of
   that lab, ``grades.csv``, and the LMS exports ``canvas.csv`` and ``moodle.csv``).

From the instructor's server, one command does all three and follows the progress::

    python -m lab_utils.hub grade 02_ps_async              # into ./grading-02_ps_async/
    python -m lab_utils.hub return 02_ps_async grading-02_ps_async/feedback

API under the service's prefix, every call with ``Authorization: token T`` of a user holding
``custom:handin:grade``:

=============================  ===============================================================
``POST api/grade/<lab>``       start grading ``lab`` (409 while another grading runs)
``GET  api/jobs/<id>?since=N`` its state and its output from line N
``GET  api/results/<lab>``     a tar.gz of the lab's results, feedback, autograded notebooks
=============================  ===============================================================
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

from tornado import ioloop, web

from . import client
from .service import GRADE_SCOPE, Refusals, more_files, stop_on_signals, token_owner

__all__ = ["Grader", "SERVER_OPTIONS", "make_app", "main"]

log = logging.getLogger("lab_utils.hub.grader")
#: Seconds a grading step has to stop when the service stops (the Hub waits 10 s in all).
STOP_GRACE_S = 7.0
#: Lines of a job's output kept (the progress the instructor follows).
MAX_LINES = 5000
_LAB = r"([0-9]{2}_[a-z0-9_]+)"


def grading_env(environ: dict[str, str]) -> dict[str, str]:
    """The environment the batch runs in: this service's, less every Hub variable and token."""
    return {k: v for k, v in environ.items() if not k.startswith(("JUPYTERHUB_", "JPY_")) and "TOKEN" not in k}


#: the largest file of the course's source/ the service copies (its notebooks are a few MB)
SOURCE_FILE_MAX = 64 * 2**20


class Job:
    """One grading of one lab, in a thread: its output lines and its end."""

    def __init__(self, lab: str, who: str):
        self.id, self.lab, self.who = secrets.token_hex(6), lab, who
        self.lines: list[str] = []
        self.state = "running"
        self.started = time.time()
        self.proc: subprocess.Popen | None = None  # the step under way

    def say(self, line: str) -> None:
        self.lines.append(line.rstrip("\n"))
        if len(self.lines) > MAX_LINES:
            del self.lines[: len(self.lines) - MAX_LINES]
        log.info("%s %s: %s", self.lab, self.id, line.rstrip()[:300])

    def to_json(self, since: int = 0) -> dict:
        return {"id": self.id, "lab": self.lab, "by": self.who, "state": self.state, "lines": self.lines[since:],
                "next": len(self.lines)}  # fmt: skip


class Grader:
    """Grades on ``course`` (a course root: grading/), collecting from the hand-in service at
    ``handin_url`` with ``token``."""

    def __init__(
        self, course: Path, handin_url: str, token: str, python: str = sys.executable,
        work: Path | None = None, due_file: Path | None = None,
    ):  # fmt: skip
        self.course, self.handin_url, self.token, self.python = Path(course).resolve(), handin_url, token, python
        # where it grades: the course itself (a course of root's own), or, on a class's machine
        # where the instructors' group writes the course, a course of the service's own
        self.work = Path(work).resolve() if work else self.course
        self.due_file = Path(due_file) if due_file else None
        if not (self.course / "source").is_dir():
            raise ValueError(f"{self.course} is not a course root (no source/): give the repository's grading/")
        if not (self.work / "nbgrader_config.py").is_file():
            raise ValueError(
                f"{self.work} holds no nbgrader_config.py: set the class up (python -m lab_utils.hub setup)"
            )
        self.jobs: dict[str, Job] = {}
        self.running: Job | None = None
        self.lock = threading.Lock()

    def start(self, lab: str, who: str) -> Job:
        if not (self.course / "source" / lab).is_dir():
            raise web.HTTPError(404, reason=f"the grading course has no lab {lab}")
        with self.lock:
            if self.running is not None:
                raise web.HTTPError(409, reason=f"{self.running.lab} is being graded (job {self.running.id}); wait")
            job = self.running = Job(lab, who)
            self.jobs[job.id] = job
        threading.Thread(target=self._run, args=(job,), daemon=True, name=f"grade-{lab}").start()
        return job

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the grading under way, if any: its step is interrupted (it says what it kept, and
        removes its sandboxes), and killed if it has not ended within ``grace_s``."""
        job = self.running
        proc = job and job.proc
        if proc is None or proc.poll() is not None:
            return
        log.info("stopping the grading of %s (job %s)", job.lab, job.id)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("the grading of %s did not stop within %.0f s: killed", job.lab, grace_s)
            proc.kill()
            proc.wait()

    def _run(self, job: Job) -> None:
        try:
            self._grade(job)
            job.state = "done"
        except Exception as exc:  # noqa: BLE001 (the job's end, said to the instructor who follows it)
            job.say(f"grading failed: {type(exc).__name__}: {exc}")
            job.state = "failed"
        finally:
            with self.lock:
                self.running = None

    def _grade(self, job: Job) -> None:
        # the hand-ins, in a folder of root's alone (not in the course, which the instructors'
        # group writes: a link put there would aim what is written and removed here)
        submitted = Path(tempfile.mkdtemp(prefix=f"labs-grader-{job.lab}-"))
        try:
            self._grade_in(job, submitted)
        finally:
            shutil.rmtree(submitted, ignore_errors=True)

    def _sync(self) -> None:
        """The course's notebooks (``source/``) and settings, copied into the service's own course:
        plain files only, never read through a link, the settings parsed as data (its due file
        the class's, when the service has one). Nothing the instructors' group writes is loaded as
        configuration or run as root."""
        import yaml

        from ..grading.safefiles import copy_plain, read_plain

        fresh = self.work / ".source.new"
        if fresh.exists():
            shutil.rmtree(fresh)
        refused = copy_plain(self.course / "source", fresh, cap=SOURCE_FILE_MAX)
        if refused:
            log.warning("the course's source/ holds what is not copied: %s", refused[:5])
        if (self.work / "source").exists():
            shutil.rmtree(self.work / "source")
        os.replace(fresh, self.work / "source")
        raw = read_plain(self.course / "settings.yml", 2**20)
        settings = yaml.safe_load(raw) if isinstance(raw, bytes) else {}
        if not isinstance(settings, dict):
            raise RuntimeError(f"{self.course / 'settings.yml'} is not a mapping of settings")
        settings.pop("due_file", None)
        if self.due_file is not None:
            settings["due_file"] = str(self.due_file)
        (self.work / "settings.yml").write_text(yaml.safe_dump(settings))

    def _grade_in(self, job: Job, submitted: Path) -> None:
        lab = job.lab
        if self.work != self.course:
            job.say(f"copying the course's notebooks and settings from {self.course}")
            self._sync()
        job.say(f"collecting {lab} from the hand-in service")
        got = client.collect(lab, submitted, url=self.handin_url, token=self.token)
        job.say(f"collected {len(got)} hand-in(s)")
        if not got:
            return
        # -P, and the batch's own folder as its working directory: `-m` would put the working
        # directory first on sys.path, and the course is its instructors' group's to write (a
        # yaml.py of a TA's there would run as root)
        grading = [self.python, "-P", "-m", "lab_utils.grading", "--root", str(self.work)]
        steps = (
            ["autograde", str(submitted), "--labs", lab[:2]],
            ["feedback", "--labs", lab[:2]],
            ["export"],  # grades.csv: the gradebook
            ["export", "--lms", "canvas"],
            ["export", "--lms", "moodle"],
        )
        for step in steps:
            job.say("$ " + " ".join(["python -m lab_utils.grading", *step]))
            with subprocess.Popen(
                grading + step,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                env=grading_env(dict(os.environ)),
                cwd=submitted,
            ) as proc:
                job.proc = proc
                for line in proc.stdout:
                    job.say(line)
            job.proc = None
            if proc.returncode != 0:
                raise RuntimeError(f"{step[0]} exited {proc.returncode}")

    def results(self, lab: str) -> bytes:
        """A tar.gz of what ``make autograde`` and ``make feedback`` wrote for ``lab``."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            for kind in ("results", "feedback", "autograded"):
                base = self.work / kind
                for path in sorted(base.glob(f"*/{lab}*")) if base.is_dir() else []:
                    tar.add(path, arcname=str(path.relative_to(self.work)), filter=_plain_only)
            for name in ("results/grades.csv", "grades.csv", "canvas.csv", "moodle.csv"):
                if (self.work / name).is_file():
                    tar.add(self.work / name, arcname=name, filter=_plain_only)
        return buf.getvalue()


def _plain_only(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Files and folders only (no link leaves the service), owned by nobody in particular."""
    if not (info.isfile() or info.isdir()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o644 if info.isfile() else 0o755
    return info


class _Handler(web.RequestHandler):
    def initialize(self, grader: Grader, auth, refusals: Refusals):
        self.grader, self.auth, self.refusals = grader, auth, refusals

    def check_xsrf_cookie(self):
        return None

    async def prepare(self):
        try:
            model = await token_owner(self.request, self.auth)
            if not model or model.get("kind", "user") != "user" or not self.auth.check_scopes(GRADE_SCOPE, model):
                raise web.HTTPError(403, reason=f"only an instructor of this course grades ({GRADE_SCOPE})")
        except web.HTTPError:
            await self.refusals.hold()  # as the hand-in service: one refusal a second a connection
            raise
        self.user = model["name"]

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        self.finish({"error": getattr(exc, "log_message", None) or self._reason, "status": status_code})


class Grade(_Handler):
    def post(self, lab):
        job = self.grader.start(lab, self.user)
        self.set_status(202)
        self.finish(job.to_json())


class Jobs(_Handler):
    def get(self, job_id):
        job = self.grader.jobs.get(job_id)
        if job is None:
            raise web.HTTPError(404, reason=f"no job {job_id}")
        since = int(self.get_argument("since", "0") or 0)
        self.finish(job.to_json(max(0, since)))


class Results(_Handler):
    async def get(self, lab):
        data = await ioloop.IOLoop.current().run_in_executor(None, self.grader.results, lab)
        self.set_header("Content-Type", "application/gzip")
        self.finish(data)


#: No route takes a body: tornado refuses one from its Content-Length, before reading it and
#: before any token is checked.
SERVER_OPTIONS = {"max_body_size": 1024, "max_buffer_size": 2**20, "idle_connection_timeout": 60}


def make_app(
    grader: Grader, auth, prefix: str = "/services/grader/", refusals: Refusals | None = None
) -> web.Application:
    p = prefix.rstrip("/") + "/api"
    kw = {"grader": grader, "auth": auth, "refusals": refusals or Refusals()}
    return web.Application(
        [(rf"{p}/grade/{_LAB}", Grade, kw), (rf"{p}/jobs/([0-9a-f]+)", Jobs, kw), (rf"{p}/results/{_LAB}", Results, kw)]
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab_utils.hub.grader", description=__doc__.split("\n\n")[0])
    ap.add_argument("--course", required=True, help="the grading course: the instructor repository's grading/")
    ap.add_argument(
        "--work", help="a course of the service's own to grade in (root's alone), when others write --course"
    )
    ap.add_argument("--due-file", help="the class's due file (its late flags), in place of the settings' due_file")
    ap.add_argument(
        "--handin-url", required=True, help="the hand-in service, e.g. http://127.0.0.1:8000/services/handin/"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s grader] %(message)s")
    url, token = os.environ.get("JUPYTERHUB_SERVICE_URL"), os.environ.get("JUPYTERHUB_API_TOKEN")
    if not url or not token:
        print("grader: run me as a JupyterHub service (JUPYTERHUB_SERVICE_URL, JUPYTERHUB_API_TOKEN)", file=sys.stderr)
        return 2
    try:
        grader = Grader(Path(args.course), args.handin_url, token, work=args.work, due_file=args.due_file)
    except ValueError as exc:
        print(f"grader: {exc}", file=sys.stderr)
        return 2
    from jupyterhub.services.auth import HubAuth

    where = urlparse(url)
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/grader/")
    more_files()
    make_app(grader, HubAuth(cache_max_age=60), prefix).listen(where.port, where.hostname, **SERVER_OPTIONS)
    stop_on_signals(grader.stop)
    log.info(
        "serving %s at %s: course %s, graded in %s, hand-ins from %s",
        prefix,
        url,
        grader.course,
        grader.work,
        args.handin_url,
    )
    ioloop.IOLoop.current().start()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
