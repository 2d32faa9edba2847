"""Grade a class: every student x lab in a sandbox of its own, in parallel, resumable.

::

    python -m lab_utils.grading autograde SUBMISSIONS [--labs 01,02] [--jobs 2] [--regrade]
    make autograde SUBMISSIONS=folder            # SUBMISSIONS/<student>/<lab>/<lab>.ipynb

Each submission is graded by :mod:`lab_utils.grading.worker` in a
:class:`~lab_utils.grading.sandbox.Sandbox` with the lab's limits from
``grading/settings.yml``, in a private course of its own. Notebooks execute on
``jobs`` cores at once, each taking its lab's ``cpus`` setting (a lab whose cluster needs
two cores runs alone on two); the next sandboxes prepare meanwhile and start their kernels on their
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

import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from datetime import UTC, datetime
from pathlib import Path

import psutil

from lab_utils import resources
from lab_utils.grading import layout, locks, nbapi, quotes, results, scripts
from lab_utils.grading.gate import EXECUTED, READY, Admission, Gate, Turns
from lab_utils.grading.late import late_flag, parse_due
from lab_utils.grading.sandbox import Sandbox, SandboxError, cgroup_support, remove_orphaned_cgroups
from lab_utils.grading.settings import grading_settings
from lab_utils.grading.unsafe import require_sandbox
from lab_utils.grading.view import kernel_package, references_needed

__all__ = ["autograde", "submission_pairs", "usable_cores", "KERNEL_UID_BASE"]

#: Kernels of sandbox slot i run as uid KERNEL_UID_BASE + i (root only; no passwd entry needed).
KERNEL_UID_BASE = 61000
#: slots on one machine, whatever grades there (batches of two instructors, Slurm array elements)
MAX_SLOTS = 512


class SlotClaims:
    """Sandbox slots claimed machine-wide: each slot's kernel runs as its own uid, so two
    batches on one machine (two instructors, two elements of a Slurm array on one node) must
    never share a slot, or one's kernel could signal the other's. A claim is a held
    ``flock`` on ``<lock_dir>/slot-<k>.lock``, in the grader's own lock folder
    (:func:`lab_utils.grading.locks.lock_dir`: nobody else can make or hold these files): the
    kernel drops it when the claimer dies, so a killed batch frees its slots without cleanup."""

    def __init__(self, n: int, lock_dir: str | os.PathLike | None = None):
        base = Path(lock_dir) if lock_dir else locks.lock_dir()
        self.fds: list[int] = []
        self.slots: list[int] = []
        for k in range(MAX_SLOTS):
            if len(self.slots) == n:
                break
            fd = locks.open_lock(base / f"slot-{k}.lock")
            if not locks.acquire(fd, 0):  # another batch's
                os.close(fd)
                continue
            self.fds.append(fd)
            self.slots.append(k)
        if len(self.slots) < n:
            self.release()
            raise RuntimeError(f"no {n} free grading slots on this machine ({MAX_SLOTS} at most are graded at once)")

    def release(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def _folders(parent: Path) -> list[Path]:
    """The real folders of ``parent`` (a link to a folder is not one: never followed)."""
    return sorted(p for p in parent.iterdir() if not p.name.startswith(".") and p.is_dir() and not p.is_symlink())


def submission_pairs(folder: Path):
    """(student, lab) for each ``folder/<student>/<lab>/`` that is a real folder."""
    for student in _folders(folder):
        for lab in _folders(student):
            yield student.name, lab.name


def linked_folders(folder: Path) -> list[str]:
    """``<student>`` and ``<student>/<lab>`` entries of ``folder`` that are links: not graded."""
    found = [p for p in folder.iterdir() if p.is_symlink()]
    for student in _folders(folder):
        found += [p for p in student.iterdir() if p.is_symlink()]
    return sorted(str(p.relative_to(folder)) for p in found)


def usable_cores() -> int:
    """Whole cores this process may use: its CPU affinity, a cgroup quota above it (a Slurm
    job, a pod, ``make test-slow``) and ``CPU_LIMIT`` (:func:`lab_utils.resources.usable_cores`)."""
    return resources.usable_cores()


def stretched(settings: dict, cores: float) -> tuple[dict, float]:
    """``settings`` with their time limits for the CPU a notebook really gets here, and the
    factor: a lab's ``cell_timeout`` and ``notebook_timeout`` are set for its ``cpus``; a
    grader that gives it fewer ``cores`` (:meth:`Batch.share`: a smaller machine, a quota
    above the grader, more jobs than cores) stretches them in proportion, so that a correct
    submission is never timed out by the grader's own machine (0.8 cores for a 2-core lab:
    2.5 times the limits)."""
    factor = max(1.0, float(settings["cpus"]) / max(float(cores), 0.05))
    if factor == 1.0:
        return settings, 1.0
    longer = {key: int(math.ceil(settings[key] * factor)) for key in ("cell_timeout", "notebook_timeout")}
    return {**settings, **longer}, factor


#: seconds a worker may take to get ready (its start, private course, mounts, nbgrader's bookkeeping)
PREPARE_S = 300
#: seconds a worker may take after its notebook (accounting, feedback)
FINISH_S = 600


#: the copy of lab_utils that kernels import (lab_utils.grading.view), beside the templates
KERNEL_PACKAGE = "kernel-lab_utils"


def make_templates(root: Path, labs: list[str], folder: Path) -> tuple[dict[str, Path], Path]:
    """In ``folder`` (made, root only): one generated course per lab (config, source, release,
    a gradebook that knows only the assignment) that every worker copies instead of
    generating its own, the hidden-test and solution lines that nothing kept may quote
    (:func:`lab_utils.grading.quotes.course_secrets`), and the kernels' copy of ``lab_utils`` (:data:`KERNEL_PACKAGE`). Returns
    ``({lab: template}, the lines' file)``."""
    folder.mkdir(mode=0o700)
    lines_file = folder / "secret-lines.json"
    lines_file.write_text(json.dumps(quotes.course_secrets(root)))
    kernel_package(folder / KERNEL_PACKAGE)
    templates = {}
    for lab in labs:
        tpl = folder / lab
        tpl.mkdir()
        shutil.copy2(root / "nbgrader_config.py", tpl / "nbgrader_config.py")
        shutil.copytree(root / "source" / lab, tpl / "source" / lab)
        nbapi.check(nbapi.course_api(tpl).generate_assignment(lab, force=True, create=True), f"template {lab}")
        templates[lab] = tpl
    return templates, lines_file


class _Stopped(Exception):
    """The batch was interrupted before this submission's turn."""


class Batch:
    """Notebooks execute on ``jobs`` cores at once, each taking its lab's ``cpus``. As many
    sandboxes again as there are cores prepare meanwhile and
    wait for their turn at the gate (:mod:`lab_utils.grading.gate`), and finished ones
    write their feedback and are merged while the next notebooks run: what grading costs
    besides executing notebooks hides behind them."""

    def __init__(
        self, root: Path, submissions: Path, jobs: int, isolate: bool | None, settings_file, out, pipeline, n,
        timing_lock: Path | None = None,
    ):  # fmt: skip
        self.root, self.submissions, self.jobs, self.isolate = root, submissions, jobs, isolate
        self.settings_file, self.out, self.pipeline = settings_file, out, pipeline
        self.cpu = resources.cpu_cores()  # what a notebook can get here: its time limits follow (stretched)
        self.lock = threading.Lock()
        self.active: set[Sandbox] = set()
        self.stopped = False  # set under `lock`, with which a sandbox's worker starts: none starts after stop()
        self.executing = Turns(jobs)  # cores for executing notebooks: each takes its lab's `cpus`
        # pipeline: sandboxes preparing or executing, one ready ahead of each executing one (and
        # others finishing); without: a sandbox holds its turn from its start to its end
        self.admitted = Turns(2 * jobs if pipeline else jobs)
        self.threads = max(1, min(4 * jobs if pipeline else jobs, n))  # n: submissions to grade
        self.claims = SlotClaims(self.threads)
        self.slots = list(self.claims.slots)
        self.work = Path(tempfile.mkdtemp(prefix=f"labgrade-{os.getpid()}-"))  # whose: a dead batch's is found
        self.work.chmod(0o711)
        # one timed run at a time among this batch's sandboxes (or, given, among every grader
        # sharing the lock: a Slurm node's elements)
        # (the worker takes it on its kernel's behalf: no kernel sees it)
        self.timing_lock = Path(timing_lock) if timing_lock else self.work / "timing.lock"
        os.close(locks.open_lock(self.timing_lock))
        coursedir = nbapi.course_api(root).coursedir
        self.course_id, self.db_url = coursedir.course_id, coursedir.db_url
        self.provenance = results.provenance()
        # what a grading killed before its cleanup left on this machine
        removed, failed = remove_orphaned_workdirs(self.work.parent)
        if isolate is not False:
            more, failed_too = remove_orphaned_cgroups()
            removed, failed = removed + more, failed + failed_too
        if removed:
            self.say(f"removed the sandboxes of a grading that died here: {', '.join(removed)}")
        for line in failed:
            self.say(f"warning: a dead grading's sandbox would not go: {line}")

    def make_templates(self, labs: list[str]) -> None:
        """The workers' templates (:func:`make_templates`), in this batch's folder."""
        self.templates, self.lines_file = make_templates(self.root, labs, self.work / "template")

    def say(self, line: str) -> None:
        with self.lock:
            print(line, file=self.out, flush=True)

    def share(self, settings: dict) -> float:
        """The cores a notebook of this lab gets here, at most: its execution turns' part of the
        CPU this process may use (``jobs`` turns share it) and never more than its ``cpus``."""
        return min(float(settings["cpus"]), self.cores(settings) * self.cpu / self.jobs)

    def cores(self, settings: dict) -> int:
        """Execution turns a notebook of this lab takes: its ``cpus`` setting, rounded up
        (at most the batch's): a lab whose cluster needs two cores runs alone on two."""
        return min(self.jobs, max(1, math.ceil(float(settings["cpus"]) - 1e-9)))

    def grade(self, student: str, lab: str, hashes: dict) -> dict:
        admission = Admission(self.admitted)
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
            disk_mb=settings["disk_mb"],
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
        keras = Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")
        source = layout.source_notebook(lab, self.root)
        return {
            "student": student,
            "lab": lab,
            "submission": str(self.submissions / student / lab),
            "template": str(self.templates[lab]),
            "kernel_package": str(self.templates[lab].parent / KERNEL_PACKAGE),
            "secret_lines": str(self.lines_file),
            "box": str(box_dir),
            "result": str(box_dir / "result.json"),
            "settings": settings,
            "isolated": box.isolated,
            "network": settings["network"],
            "uid": KERNEL_UID_BASE + slot if box.isolated else None,
            "reference_dir": str(self.root / scripts.REFERENCE_DIR),
            # the reference scripts its tests run, the only ones its kernel sees
            "references": [
                [ref_lab, str(scripts.reference_script(ref_lab, name, self.root))]
                for ref_lab, name in references_needed(source)
            ],
            # the files its notebook writes (%%writefile): the only ones kept beside it
            "keep": sorted(scripts.writefile_scripts(source)),
            "keras_home": str(keras) if keras.is_dir() else None,
            "timing_lock": str(self.timing_lock),
        }

    def _run(self, box: Sandbox, box_dir: Path, gate: Gate, settings: dict, admission: Admission) -> str | None:
        """Prepare, wait for a turn, execute, finish: None, or what went wrong."""
        argv = [sys.executable, "-m", "lab_utils.grading.worker", str(box_dir / "spec.json")]
        try:
            # under the lock stop() takes to list the running sandboxes: a stop that came while
            # this one was being made finds it started (and kills it) or keeps it from starting.
            # Before, a worker started just after the stop prepared on, and the batch waited for it
            with self.lock:
                if self.stopped:
                    raise _Stopped(box.name)
                box.start(argv, log=box_dir / "worker.log", cwd=box_dir, pass_fds=gate.worker_fds)
            gate.started()
            ready = gate.wait_for(READY, PREPARE_S)
            if ready is None:
                box.kill()
                return f"the grading worker was not ready within {PREPARE_S} s"
            cores = self.cores(settings)
            if ready and self.executing.take(cores):
                # the notebook's own budget, a cell past it, interrupts, restarts: then it is ours
                limit = settings["notebook_timeout"] + settings["cell_timeout"] + 2 * settings["interrupt_grace"] + 300
                try:
                    done = gate.wait_for(EXECUTED, limit) if gate.go() else False
                finally:
                    self.executing.give(cores)
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

    def _grade(self, student: str, lab: str, hashes: dict, slot: int, admission: Admission) -> dict:
        settings = grading_settings(lab, self.settings_file)  # as the instructor set them: hashed, kept
        limits, factor = stretched(settings, self.share(settings))  # as this machine runs them
        t0 = time.monotonic()
        box, box_dir = self._open(slot, settings)
        with self.lock:
            self.active.add(box)
        gate = Gate()
        try:
            spec = {**self._spec(student, lab, slot, box, box_dir, limits), "gate": gate.worker_spec()}
            (box_dir / "spec.json").write_text(json.dumps(spec, indent=1))
            failure = self._run(box, box_dir, gate, limits, admission)
            peak = box.peak_memory_bytes()
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
            result = results.not_graded(
                student, lab, failure or "the grading worker wrote no result", box_dir / "worker.log"
            )
        late = late_flag(self.submissions / student / lab, parse_due(settings["due"]))
        if late:
            result["flags"].append(late)
        for p in leaked:
            where = f", listening on port(s) {', '.join(map(str, p['listening']))}" if p["listening"] else ""
            what = f"{p['cmdline']}{where}"  # what a process bomb's hundreds of flags have in common
            result["flags"].append({"kind": "leaked process killed", "detail": f"pid {p['pid']} {what}", "group": what})
        result["provenance"] = {
            **self.provenance,
            **hashes,
            "sandbox": box.mode,
            "settings": settings,
            "time_limits_stretched": round(factor, 3),  # by the cores this machine gave the lab (stretched)
            "peak_memory_mb": None if peak is None else round(peak / 2**20),  # the notebook and all it started
            "graded_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(time.monotonic() - t0, 3),
        }
        with self.lock:
            self.deliver(result)
        shutil.rmtree(box_dir, ignore_errors=True)
        return result

    def deliver(self, result: dict) -> None:
        """Put a result where it belongs, under the batch's lock: a graded one into the course
        (gradebook, autograded/, feedback/), and its JSON into results/. An interrupted one is
        not written: it is graded next time. (A Slurm array element stages it instead:
        :mod:`lab_utils.grading.slurm`.)"""
        if result["status"] == "graded":
            results.install(self.root, self.db_url, self.course_id, self.submissions, result)
        if result["status"] == "graded" or not self.executing.stopped:
            results.write_json(results.results_dir(self.root) / result["student"] / f"{result['lab']}.json", result)

    def stop(self) -> None:
        """No new turns; every running sandbox killed (its worker's pipes then read as closed)."""
        self.admitted.stop()
        self.executing.stop()
        with self.lock:
            self.stopped = True
            boxes = list(self.active)
        for box in boxes:
            box.kill()

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)
        self.claims.release()


def remove_orphaned_workdirs(tmp: Path) -> tuple[list[str], list[str]]:
    """Remove this user's batch folders in ``tmp`` (``labgrade-<pid>-*``) whose batch ``pid``
    is gone: a grader killed before its cleanup (SIGKILL, the OOM killer, a Slurm node that
    failed) leaves its templates and sandboxes' folders there. Returns the names removed and,
    for any that would not go, why."""
    removed, failed = [], []
    for d in sorted(tmp.glob("labgrade-*-*")):
        pid = d.name.split("-")[1]
        try:
            if not pid.isdigit() or int(pid) == os.getpid() or psutil.pid_exists(int(pid)):
                continue
            if not d.is_dir() or d.is_symlink() or d.lstat().st_uid != os.getuid():
                continue
        except OSError:  # gone meanwhile (its owner's cleanup): nothing to do
            continue
        errors = _rmtree(d)
        if errors:
            failed.append(f"{d}: {errors[0]}")
        else:
            removed.append(d.name)
    return removed, failed


def _rmtree(folder: Path) -> list[str]:
    """Remove ``folder``; what would not go, each with why."""
    errors: list[str] = []
    shutil.rmtree(folder, onerror=lambda _f, path, exc: errors.append(f"{path}: {exc[1]}"))
    return errors


def prepare_labs(root: Path, labs: list[str]) -> None:
    """The course's gradebook knows every lab, and its reference scripts are extracted."""
    from nbgrader.api import Gradebook, MissingEntry

    api = nbapi.course_api(root)
    for lab in labs:
        with Gradebook(api.coursedir.db_url) as gb:
            try:
                gb.find_assignment(lab)
            except MissingEntry:
                nbapi.check(api.generate_assignment(lab, force=True, create=True), f"generate_assignment {lab}")
    scripts.extract_references(None, root)  # every lab's: Lab 3 runs Lab 2's script, and so on


def unchanged_and_todo(root: Path, submissions: Path, pairs, settings_file, resume: bool) -> tuple[list, list]:
    """``(graded, todo)``: the results kept from an earlier grading of the same submission,
    course and settings (when ``resume``), and the ``(student, lab, hashes)`` left to grade."""
    graded, todo = [], []
    for student, lab in pairs:
        hashes = {
            **results.hashes(root, submissions / student / lab, lab, grading_settings(lab, settings_file)),
        }
        previous = results.results_dir(root) / student / f"{lab}.json"
        if resume and previous.is_file():
            old = json.loads(previous.read_text())
            prov = old.get("provenance", {})
            if old.get("status") == "graded" and all(prov.get(k) == v for k, v in hashes.items()):
                graded.append(old)
                continue
        todo.append((student, lab, hashes))
    return graded, todo


def _announce(batch: Batch, todo: list, unchanged: int, settings_file, isolate, pipeline: bool) -> None:
    """Say what the batch will do: how many to grade, on how many cores, in which sandbox,
    and which labs' time limits are stretched because a notebook gets fewer cores than asked."""
    box_mode = (
        "isolated (cgroup, namespaces, unprivileged kernel)"
        if isolate is not False and cgroup_support()
        else "process group only (not root: no cgroup, no network or mount namespace)"
    )
    cores = {lab: batch.cores(grading_settings(lab, settings_file)) for lab in sorted({lab for _, lab, _ in todo})}
    batch.say(
        f"autograde: {len(todo)} to grade, {unchanged} unchanged since their last grading; "
        f"notebooks on {batch.jobs} core(s) at a time ({', '.join(f'{lab} takes {n}' for lab, n in cores.items())})"
        f"{', the next ones prepared meanwhile' if pipeline else ''}; sandbox: {box_mode}"
    )
    for lab in cores:
        asked = grading_settings(lab, settings_file)
        share = batch.share(asked)
        longer, factor = stretched(asked, share)
        if factor > 1:
            batch.say(
                f"autograde: {lab} asks for {asked['cpus']:g} core(s), a notebook gets {share:.2g} here: "
                f"its time limits are {factor:.2g}x longer (a cell {longer['cell_timeout']} s, "
                f"the notebook {longer['notebook_timeout']} s)"
            )


def autograde(
    submissions: Path | str,
    labs=None,
    root: Path | str = layout.GRADING_ROOT,
    *,
    jobs: int | None = None,
    resume: bool = True,
    isolate: bool | None = None,
    settings_file: Path | str | None = None,
    out=sys.stdout,
    pipeline: bool = True,
    unsafe_no_sandbox: bool = False,
) -> list[dict]:
    """Grade ``submissions/<student>/<lab>/`` for ``labs`` (all by default); returns
    every result (graded now, or earlier and unchanged when ``resume``). ``jobs``
    notebooks execute at once (default: one per usable core); with ``pipeline`` the
    next sandbox prepares, and finished ones write their feedback, meanwhile. Without a sandbox
    (not root, no cgroups) it refuses (:class:`~lab_utils.grading.unsafe.NoSandbox`) unless
    ``unsafe_no_sandbox``."""
    root, submissions = Path(root).resolve(), Path(submissions).resolve()
    warning = require_sandbox(root, isolate, unsafe_no_sandbox)
    if warning:
        print(warning, file=out, flush=True)
    if settings_file is None and (root / "settings.yml").is_file():
        settings_file = root / "settings.yml"  # the course's own settings (grading/settings.yml in this repository)
    if not submissions.is_dir():
        raise ValueError(f"submissions folder {submissions} does not exist")
    wanted = set(layout.select_labs(labs, root))
    pairs = [(s, lab) for s, lab in submission_pairs(submissions) if lab in wanted]
    if not pairs:
        raise ValueError(f"no submissions for {sorted(wanted)} in {submissions} (expected <student>/<lab>/<lab>.ipynb)")
    jobs = max(1, int(jobs or usable_cores()))
    prepare_labs(root, sorted({lab for _, lab in pairs}))
    graded, todo = unchanged_and_todo(root, submissions, pairs, settings_file, resume)
    batch = Batch(root, submissions, jobs, isolate, settings_file, out, pipeline, len(todo))
    try:
        batch.make_templates(sorted({lab for _, lab, _ in todo}))
    except BaseException:
        batch.cleanup()
        raise
    _announce(batch, todo, len(graded), settings_file, isolate, pipeline)
    for name in linked_folders(submissions):
        batch.say(f"autograde: {name} is a link, not a folder: not graded (copy the submission itself there)")
    t0 = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=batch.threads)
    try:
        futures = {pool.submit(batch.grade, s, lab, h): (s, lab) for s, lab, h in todo}
        for n, fut in enumerate(as_completed(futures), 1):
            student, lab = futures[fut]
            result = fut.result()
            graded.append(result)
            batch.say(f"[{n}/{len(todo)} {time.monotonic() - t0:.0f} s] {student}/{lab}: {results.line(result)}")
    except (KeyboardInterrupt, SandboxError):
        batch.stop()  # before the pool's shutdown, which waits for its threads
        batch.say("autograde interrupted: finished results are kept; run the same command again to resume")
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        batch.cleanup()
    results.summary(graded, batch.say)
    results.write_csv(graded, results.results_dir(root) / "grades.csv")
    return graded
