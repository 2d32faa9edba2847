"""Grade a class: every student x lab in a sandbox of its own, in parallel, resumable.

::

    python -m lab_utils.grading autograde SUBMISSIONS [--labs 01,02] [--jobs 2] [--regrade]
    make autograde SUBMISSIONS=folder            # SUBMISSIONS/<student>/<lab>/<lab>.ipynb

Each submission is graded by :mod:`lab_utils.grading.worker` in a
:class:`~lab_utils.grading.sandbox.Sandbox` with the lab's limits from
``grading/settings.yml``, in a private course of its own. ``jobs`` notebooks
execute at once; the next sandbox prepares meanwhile and starts its kernel on its
turn, and finished ones write their feedback while the next ones run (the
pipes in :mod:`lab_utils.grading.gate`). The batch then merges
the result into the course's gradebook (one writer, so no database contention),
copies the autograded notebook and the feedback HTML into the course, and writes
``results/<student>/<lab>.json`` with the score, every test cell's status, the
flags and the provenance. A result whose submission, tests and settings are
unchanged is not graded again: an interrupted batch resumes where it stopped.
A grading run that fails for reasons of its own (the worker crashed, ran out its
time) is reported as an infrastructure error, never scored 0.
At the end: ``results/grades.csv`` and a summary of every flag.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from lab_utils.grading import course, scripts
from lab_utils.grading.gate import EXECUTED, READY, Gate
from lab_utils.grading.sandbox import Sandbox, SandboxError, cgroup_support
from lab_utils.grading.settings import grading_settings

__all__ = ["autograde", "submission_pairs", "results_dir", "usable_cores", "write_csv", "summary", "KERNEL_UID_BASE"]

#: Kernels of sandbox slot i run as uid KERNEL_UID_BASE + i (root only; no passwd entry needed).
KERNEL_UID_BASE = 61000
_VERSIONED = ("tensorflow-cpu", "tensorflow", "horovod", "nbgrader", "numpy", "ipykernel")


def submission_pairs(folder: Path):
    """(student, lab) for each ``folder/<student>/<lab>/``."""
    for student in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        for lab in sorted(p for p in student.iterdir() if p.is_dir() and not p.name.startswith(".")):
            yield student.name, lab.name


def results_dir(root: Path | str = course.GRADING_ROOT) -> Path:
    return Path(root) / "results"


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _hash_tree(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _tests_hash(root: Path, lab: str, settings: dict) -> str:
    h = hashlib.sha256((root / "source" / lab / f"{lab}.ipynb").read_bytes())
    h.update((root / "nbgrader_config.py").read_bytes())
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()


def _versions() -> dict:
    found = {}
    for name in _VERSIONED:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def _git_commit() -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(course.REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def _merge(db_url: str, worker_db: Path, lab: str, student: str, course_id: str) -> None:
    """Copy the worker's grades and comments of ``student``/``lab`` into the course gradebook."""
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning

    with (
        warnings.catch_warnings(),
        Gradebook(f"sqlite:///{worker_db}", course_id) as src,
        Gradebook(db_url, course_id) as dst,
    ):
        # nbgrader 0.9's add_submission builds the submission's notebooks and grades
        # before adding it to the session; SQLAlchemy 2 warns, then adds them all with it
        warnings.filterwarnings("ignore", message=r"Object of type <Submitted\w+> not in session", category=SAWarning)
        graded = src.find_submission(lab, student)
        dst.update_or_create_student(student)
        dst.update_or_create_submission(lab, student, timestamp=graded.timestamp)
        for nb in graded.notebooks:
            for g in nb.grades:
                d = dst.find_grade(g.name, nb.name, lab, student)
                d.auto_score, d.manual_score, d.extra_credit = g.auto_score, g.manual_score, g.extra_credit
                d.needs_manual_grade = g.needs_manual_grade
            for cm in nb.comments:
                d = dst.find_comment(cm.name, nb.name, lab, student)
                d.auto_comment, d.manual_comment = cm.auto_comment, cm.manual_comment
            dst.find_submission_notebook(nb.name, lab, student).flagged = nb.flagged
        dst.db.commit()


def _replace_tree(src: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)


#: seconds a worker may take to get ready (its start, private course, mounts, nbgrader's bookkeeping)
PREPARE_S = 300
#: seconds a worker may take after its notebook (accounting, feedback)
FINISH_S = 600


class _Turns:
    """``n`` turns to take and give back; once stopped, every taker gets False."""

    def __init__(self, n: int):
        self.free, self.stopped = n, False
        self.cond = threading.Condition()

    def take(self) -> bool:
        with self.cond:
            self.cond.wait_for(lambda: self.free > 0 or self.stopped)
            if self.stopped:
                return False
            self.free -= 1
            return True

    def give(self) -> None:
        with self.cond:
            self.free += 1
            self.cond.notify()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()


class _Admission:
    """One submission's hold on the batch's ``admitted`` turns, given back once."""

    def __init__(self, turns: _Turns):
        self.turns, self.held = turns, turns.take()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.turns.give()


class _Stopped(Exception):
    """The batch was interrupted before this submission's turn."""


class _Batch:
    """``jobs`` notebooks execute at once. As many sandboxes again prepare meanwhile and
    wait for their turn at the gate (:mod:`lab_utils.grading.gate`), and finished ones
    write their feedback and are merged while the next notebooks run: what grading costs
    besides executing notebooks hides behind them."""

    def __init__(self, root: Path, submissions: Path, jobs: int, isolate: bool | None, settings_file, out, pipeline):
        self.root, self.submissions, self.jobs, self.isolate = root, submissions, jobs, isolate
        self.settings_file, self.out, self.pipeline = settings_file, out, pipeline
        self.lock = threading.Lock()
        self.active: set[Sandbox] = set()
        self.executing = _Turns(jobs)  # notebooks executing
        # pipeline: sandboxes preparing or executing, one ready ahead of each executing one (and
        # others finishing); without: a sandbox holds its turn from its start to its end
        self.admitted = _Turns(2 * jobs if pipeline else jobs)
        self.threads = 4 * jobs if pipeline else jobs
        self.slots = list(range(self.threads))
        self.work = Path(tempfile.mkdtemp(prefix="labgrade-"))
        self.work.chmod(0o711)
        self.timing_lock = self.work / "timing.lock"
        self.timing_lock.touch()
        self.timing_lock.chmod(0o644)
        coursedir = course.course_api(root).coursedir
        self.course_id, self.db_url = coursedir.course_id, coursedir.db_url
        self.provenance = {
            "host": platform.node(),
            "python": platform.python_version(),
            "versions": _versions(),
            "lab_utils_commit": _git_commit(),
        }

    def make_templates(self, labs: list[str]) -> None:
        """One generated course per lab (config, source, release, a gradebook that knows
        only the assignment) that every worker copies instead of generating its own, and
        the reference scripts' solution lines that feedback must not quote; root only."""
        self.templates = {}
        (self.work / "template").mkdir(mode=0o700)
        self.lines_file = self.work / "template" / "solution-lines.json"  # root only, like the templates
        self.lines_file.write_text(json.dumps(scripts.solution_lines(self.root)))
        for lab in labs:
            tpl = self.work / "template" / lab
            tpl.mkdir()
            shutil.copy2(self.root / "nbgrader_config.py", tpl / "nbgrader_config.py")
            shutil.copytree(self.root / "source" / lab, tpl / "source" / lab)
            course.check(course.course_api(tpl).generate_assignment(lab, force=True, create=True), f"template {lab}")
            self.templates[lab] = tpl

    def say(self, line: str) -> None:
        with self.lock:
            print(line, file=self.out, flush=True)

    def grade(self, student: str, lab: str, hashes: dict) -> dict:
        admission = _Admission(self.admitted)
        if not admission.held:
            raise _Stopped(f"{student}/{lab}")
        with self.lock:
            slot = self.slots.pop()
        try:
            return self._grade(student, lab, hashes, slot, admission)
        finally:
            admission.release()
            with self.lock:
                self.slots.append(slot)

    def _open(self, slot: int, settings: dict) -> tuple[Sandbox, Path]:
        box_dir = Path(tempfile.mkdtemp(prefix=f"{slot}-", dir=self.work))
        box = Sandbox(
            f"{slot}",
            memory_mb=settings["memory_mb"],
            cpus=settings["cpus"],
            max_processes=settings["max_processes"],
            network=settings["network"],
            cpu_seconds=int(settings["notebook_timeout"] * settings["cpus"]) + 600,
            isolate=self.isolate,
        )
        if box.isolated:  # this slot's kernel may traverse its box, another slot's kernel may not
            os.chown(box_dir, 0, KERNEL_UID_BASE + slot)
            box_dir.chmod(0o710)
        else:
            box_dir.chmod(0o711)
        return box, box_dir

    def _spec(self, student: str, lab: str, slot: int, box: Sandbox, box_dir: Path, settings: dict) -> dict:
        hide = [str(self.root), str(self.submissions), str(course.GRADING_ROOT), str(self.work / "template")]
        keras = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")
        return {
            "student": student,
            "lab": lab,
            "submission": str(self.submissions / student / lab),
            "template": str(self.templates[lab]),
            "solution_lines": str(self.lines_file),
            "box": str(box_dir),
            "result": str(box_dir / "result.json"),
            "settings": settings,
            "isolated": box.isolated,
            "network": settings["network"],
            "uid": KERNEL_UID_BASE + slot if box.isolated else None,
            "hide": hide if box.isolated else [],
            "reference_dir": str(self.root / scripts.REFERENCE_DIR),
            "keras_home": str(keras) if keras.is_dir() else None,
            "timing_lock": str(self.timing_lock),
        }

    def _run(self, box: Sandbox, box_dir: Path, gate: Gate, settings: dict, admission: _Admission) -> str | None:
        """Prepare, wait for a turn, execute, finish: None, or what went wrong."""
        argv = [sys.executable, "-m", "lab_utils.grading.worker", str(box_dir / "spec.json")]
        try:
            box.start(argv, log=box_dir / "worker.log", cwd=box_dir, pass_fds=gate.worker_fds)
            gate.started()
            ready = gate.wait_for(READY, PREPARE_S)
            if ready is None:
                box.kill()
                return f"the grading worker was not ready within {PREPARE_S} s"
            if ready and self.executing.take():
                # the notebook's own budget, a cell past it, interrupts, restarts: then it is ours
                limit = settings["notebook_timeout"] + settings["cell_timeout"] + 2 * settings["interrupt_grace"] + 300
                try:
                    done = gate.wait_for(EXECUTED, limit) if gate.go() else False
                finally:
                    self.executing.give()
                if done is None:
                    box.kill()
                    return f"the notebook ran past {limit} s"
        finally:
            if self.pipeline:  # the next sandbox may prepare while this one finishes
                admission.release()
        rc = box.wait(timeout=FINISH_S)
        if rc is None:
            return f"the grading worker ran past {FINISH_S} s after its notebook"
        return None if rc == 0 else f"the grading worker exited {rc}"

    def _grade(self, student: str, lab: str, hashes: dict, slot: int, admission: _Admission) -> dict:
        settings = grading_settings(lab, self.settings_file)
        t0 = time.monotonic()
        box, box_dir = self._open(slot, settings)
        with self.lock:
            self.active.add(box)
        gate = Gate()
        try:
            spec = {**self._spec(student, lab, slot, box, box_dir, settings), "gate": gate.worker_spec()}
            (box_dir / "spec.json").write_text(json.dumps(spec, indent=1))
            failure = self._run(box, box_dir, gate, settings, admission)
            leaked = box.sweep()
        finally:
            gate.close()
            box.close()
            with self.lock:
                self.active.discard(box)
        result_file = box_dir / "result.json"
        if failure is None and result_file.is_file():
            result = json.loads(result_file.read_text())
        else:
            log = box_dir / "worker.log"
            tail = log.read_text(errors="replace").splitlines()[-40:] if log.is_file() else []
            result = {
                "status": "infrastructure error",
                "student": student,
                "lab": lab,
                "reason": failure or "the grading worker wrote no result",
                "log_tail": tail,
                "score": None,
                "max_score": None,
                "cells": [],
                "flags": [],
            }
        for p in leaked:
            where = f", listening on port(s) {', '.join(map(str, p['listening']))}" if p["listening"] else ""
            result["flags"].append({"kind": "leaked process killed", "detail": f"pid {p['pid']} {p['cmdline']}{where}"})
        result["provenance"] = {
            **self.provenance,
            **hashes,
            "sandbox": box.mode,
            "settings": settings,
            "graded_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - t0, 3),
        }
        with self.lock:
            if result["status"] == "graded":
                self._install(result, student, lab)
            if result["status"] == "graded" or not self.executing.stopped:  # an interrupted one is graded next time
                _write_json(results_dir(self.root) / student / f"{lab}.json", result)
        shutil.rmtree(box_dir, ignore_errors=True)
        return result

    def _install(self, result: dict, student: str, lab: str) -> None:
        """Merge into the course: gradebook, submitted/, autograded/, feedback/ (under self.lock)."""
        _merge(self.db_url, Path(result["db"]), lab, student, self.course_id)
        _replace_tree(self.submissions / student / lab, self.root / "submitted" / student / lab)
        _replace_tree(Path(result["autograded"]), self.root / "autograded" / student / lab)
        if Path(result["feedback"]).is_dir():
            _replace_tree(Path(result["feedback"]), self.root / "feedback" / student / lab)
        for key in ("autograded", "feedback", "db"):
            result.pop(key, None)

    def stop(self) -> None:
        """No new turns; every running sandbox killed (its worker's pipes then read as closed)."""
        self.admitted.stop()
        self.executing.stop()
        with self.lock:
            boxes = list(self.active)
        for box in boxes:
            box.kill()

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def _prepare(root: Path, labs: list[str]) -> None:
    """The course's gradebook knows every lab, and its reference scripts are extracted."""
    from nbgrader.api import Gradebook, MissingEntry

    api = course.course_api(root)
    for lab in labs:
        with Gradebook(api.coursedir.db_url) as gb:
            try:
                gb.find_assignment(lab)
            except MissingEntry:
                course.check(api.generate_assignment(lab, force=True, create=True), f"generate_assignment {lab}")
    scripts.extract_references(None, root)  # every lab's: Lab 3 runs Lab 2's script, and so on


def _line(result: dict) -> str:
    if result["status"] != "graded":
        return f"{result['status'].upper()}: {result['reason']}"
    flags = f"  flags: {', '.join(sorted({f['kind'] for f in result['flags']}))}" if result["flags"] else ""
    return f"{result['score']:g}/{result['max_score']:g}{flags}"


def write_csv(results: list[dict], path: Path) -> Path:
    """One row per student x lab: score, status, flags, and the test cells that did not pass."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student_id", "lab", "status", "score", "max_score", "flags", "not_passed"])
        for r in sorted(results, key=lambda r: (r["student"], r["lab"])):
            w.writerow(
                [
                    r["student"],
                    r["lab"],
                    r["status"],
                    "" if r["score"] is None else r["score"],
                    "" if r["max_score"] is None else r["max_score"],
                    "; ".join(f"{f['kind']}: {f['detail']}" for f in r["flags"]) or "",
                    "; ".join(f"{c['grade_id']} {c['status']}" for c in r["cells"] if c["status"] != "passed"),
                ]
            )
    return path


def autograde(
    submissions: Path | str,
    labs=None,
    root: Path | str = course.GRADING_ROOT,
    *,
    jobs: int | None = None,
    resume: bool = True,
    isolate: bool | None = None,
    settings_file: Path | str | None = None,
    out=sys.stdout,
    pipeline: bool = True,
) -> list[dict]:
    """Grade ``submissions/<student>/<lab>/`` for ``labs`` (all by default); returns
    every result (graded now, or earlier and unchanged when ``resume``). ``jobs``
    notebooks execute at once (default: one per usable core); with ``pipeline`` the
    next sandbox prepares, and finished ones write their feedback, meanwhile."""
    root, submissions = Path(root).resolve(), Path(submissions).resolve()
    if settings_file is None and (root / "settings.yml").is_file():
        settings_file = root / "settings.yml"  # the course's own settings (grading/settings.yml in this repository)
    if not submissions.is_dir():
        raise ValueError(f"submissions folder {submissions} does not exist")
    wanted = set(course.resolve_labs(labs, course.source_labs(root)))
    pairs = [(s, lab) for s, lab in submission_pairs(submissions) if lab in wanted]
    if not pairs:
        raise ValueError(f"no submissions for {sorted(wanted)} in {submissions} (expected <student>/<lab>/<lab>.ipynb)")
    jobs = max(1, int(jobs or usable_cores()))
    _prepare(root, sorted({lab for _, lab in pairs}))
    results, todo = [], []
    for student, lab in pairs:
        hashes = {
            "submission_sha256": _hash_tree(submissions / student / lab),
            "tests_sha256": _tests_hash(root, lab, grading_settings(lab, settings_file)),
        }
        previous = results_dir(root) / student / f"{lab}.json"
        if resume and previous.is_file():
            old = json.loads(previous.read_text())
            prov = old.get("provenance", {})
            if old.get("status") == "graded" and all(prov.get(k) == v for k, v in hashes.items()):
                results.append(old)
                continue
        todo.append((student, lab, hashes))
    batch = _Batch(root, submissions, min(jobs, max(1, len(todo))), isolate, settings_file, out, pipeline)
    try:
        batch.make_templates(sorted({lab for _, lab, _ in todo}))
    except BaseException:
        batch.cleanup()
        raise
    box_mode = (
        "isolated (cgroup, namespaces, unprivileged kernel)"
        if isolate is not False and cgroup_support()
        else "process group only (not root: no cgroup, no network or mount namespace)"
    )
    batch.say(
        f"autograde: {len(todo)} to grade, {len(results)} unchanged since their last grading; "
        f"{batch.jobs} executing at a time{', the next one prepared meanwhile' if pipeline else ''}; "
        f"sandbox: {box_mode}"
    )
    t0 = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=batch.threads)
    try:
        futures = {pool.submit(batch.grade, s, lab, h): (s, lab) for s, lab, h in todo}
        for n, fut in enumerate(as_completed(futures), 1):
            student, lab = futures[fut]
            result = fut.result()
            results.append(result)
            batch.say(f"[{n}/{len(todo)} {time.monotonic() - t0:.0f} s] {student}/{lab}: {_line(result)}")
    except (KeyboardInterrupt, SandboxError):
        batch.stop()  # before the pool's shutdown, which waits for its threads
        batch.say("autograde interrupted: finished results are kept; run the same command again to resume")
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        batch.cleanup()
    summary(results, batch.say)
    write_csv(results, results_dir(root) / "grades.csv")
    return results


def summary(results: list[dict], say=print) -> None:
    """Print every flag, grouped by kind (what the instructor should look at)."""
    flagged = [(r, f) for r in results for f in r["flags"]]
    infra = [r for r in results if r["status"] != "graded"]
    say(
        f"graded {len(results) - len(infra)} of {len(results)}; {len(flagged)} flag(s); "
        f"{len(infra)} infrastructure error(s)"
    )
    for r in infra:
        say(f"  INFRASTRUCTURE {r['student']}/{r['lab']}: {r['reason']} (not scored; run again)")
    for kind in sorted({f["kind"] for _, f in flagged}):
        say(f"  {kind}:")
        for r, f in flagged:
            if f["kind"] == kind:
                say(f"    {r['student']}/{r['lab']}: {f['detail']}")
