"""Grade a class on a Slurm cluster: a job array per lab, one element per submission.

::

    python -m lab_utils.grading autograde SUBMISSIONS --slurm [--sbatch-arg=--partition=labs]
    make autograde SUBMISSIONS=folder SLURM=1

Run it where ``sbatch`` works (a login node, or a JupyterLab inside the cluster), with the
repository, the course and the submissions on the cluster's shared file system.

- **The driver** (this process) does what the local batch does before and after grading:
  the gradebook knows every lab, the references are extracted, and what is unchanged since
  its last grading is skipped (:func:`lab_utils.grading.batch.autograde`'s resume). It then
  writes ``grading/slurm/<batch>/<lab>/list.json`` and submits ``sbatch --array`` for each
  lab: an element asks for the lab's ``cpus`` as whole cores (``--cpus-per-task``, Slurm's
  cores are not shared) and its memory, and may not run past the lab's time limits.
- **An element** (``python -m lab_utils.grading.slurm element LAB_DIR INDEX``) grades its
  submission on its node exactly as the local batch does (the same
  :class:`~lab_utils.grading.sandbox.Sandbox`, worker and limits) and *stages* the result
  in ``<lab>/out/<student>/``: the worker's gradebook, the autograded files, the feedback
  pages, and ``result.json`` last.
- **The driver merges** each staged result as it appears (one writer for the gradebook, as
  in the local batch), prints the progress per lab (done / running / queued / failed), and
  ends when every element has ended.

What is not graded is never scored 0:

- an element cancelled (``scancel``, Ctrl-C of the driver) writes nothing, and the same
  command grades it next time, and nothing that was done;
- an element whose node failed (``NODE_FAIL``), or that failed or ran out of time, gets an
  ``infrastructure error`` result that says so (the summary lists it, the next run grades it);
- a result staged but not merged (the driver was killed) is merged by the next run.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

from lab_utils import resources
from lab_utils.grading import batch as local
from lab_utils.grading import layout, locks, nbapi, results
from lab_utils.grading.settings import grading_settings
from lab_utils.grading.unsafe import NoSandbox, require_sandbox

__all__ = ["autograde", "element", "sbatch_command", "STATES_ENDED"]

#: squeue states of an element that will not run again
STATES_ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "NODE_FAIL",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
}
#: squeue states counted as queued
_QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "RESV_DEL_HOLD", "SUSPENDED"}
#: MB an element needs besides its notebook's ``memory_mb`` (the worker, nbgrader, the driver's Python)
ELEMENT_MB = 1024
#: seconds between two looks at the queue and the staged results
POLL_S = 2.0
#: seconds the driver waits for its cancelled arrays to end (Slurm's KillWait and more)
CANCEL_S = 120
REPO = layout.REPO_ROOT
#: one timed run at a time on a node, whichever element it is of: the elements that share a
#: node share its memory bandwidth and caches (and here, emulated nodes share the machine); in
#: the grader's own lock folder (lab_utils.grading.locks), which no student or other user can hold
NODE_TIMING_LOCK = "node-timing.lock"


# -- the driver --------------------------------------------------------------------------
def time_limit_s(settings: dict) -> int:
    """The most an element may run: the worker's start, the notebook's own limits, its
    feedback (the local batch's bounds, :data:`~lab_utils.grading.batch.PREPARE_S` ...)."""
    notebook = settings["notebook_timeout"] + settings["cell_timeout"] + 2 * settings["interrupt_grace"] + 300
    return local.PREPARE_S + notebook + local.FINISH_S


def sbatch_command(
    lab_dir: Path, n: int, settings: dict, extra: list[str] | tuple[str, ...] = (), max_running: int | None = None
) -> list[str]:
    """``sbatch`` of a lab's array: ``n`` elements, each on one node with the lab's cores
    (rounded up) and memory, not requeued (the driver regrades what a dead node lost);
    at most ``max_running`` at once (Slurm's ``--array=0-N%M``) when given."""
    lab = lab_dir.name
    throttle = f"%{max_running}" if max_running else ""
    return [
        "sbatch",
        "--parsable",
        f"--array=0-{n - 1}{throttle}",
        f"--job-name=labgrade-{lab}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={max(1, math.ceil(float(settings['cpus']) - 1e-9))}",
        f"--mem={int(settings['memory_mb']) + ELEMENT_MB}M",
        f"--time={math.ceil(time_limit_s(settings) / 60)}",
        "--no-requeue",
        f"--output={lab_dir / 'logs' / '%a.log'}",
        f"--chdir={REPO}",
        *extra,
        "--wrap",
        f"exec {sys.executable} -m lab_utils.grading.slurm element {lab_dir} $SLURM_ARRAY_TASK_ID",
    ]


def _run(cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as exc:
        raise RuntimeError(f"{cmd[0]} is not on PATH: --slurm needs the Slurm client commands (a login node)") from exc


def _submit(cmd: list[str]) -> str:
    done = _run(cmd)
    if done.returncode != 0:
        raise RuntimeError(f"sbatch refused the grading array: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip().split(";")[0]


def element_states(job_ids: list[str]) -> dict[tuple[str, int], tuple[str, str]]:
    """``(job id, index) -> (state, node or reason)`` of every element squeue still knows
    (ended ones too, for ``MinJobAge``); ``(job id, None)``: the array's elements squeue
    shows as one record without their indices (pending, or cancelled while pending)."""
    if not job_ids:
        return {}
    done = _run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(job_ids), "-o", "%F %K %T %N %r"])
    if done.returncode != 0:
        if "Invalid job id" in done.stderr:
            return {}
        raise RuntimeError(f"squeue failed: {done.stderr.strip()}")
    states = {}
    for line in done.stdout.splitlines():
        parts = line.split(None, 4)
        if len(parts) >= 3:
            # the elements not yet split out of a pending array: one record, its %K a range or N/A
            for index in array_indices(parts[1]) or [None]:
                states[(parts[0], index)] = (parts[2], (parts[3:] or [""])[0])
    return states


def array_indices(text: str) -> list[int]:
    """squeue's ``%K`` of an array record: ``3``, or the elements still pending as one
    record (``2-4``, ``[2-4,7]``, ``5-9%2`` with its throttle)."""
    indices: list[int] = []
    for part in text.strip("[]").split("%")[0].split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()):
            indices += range(int(first), int(last or first) + 1)
    return indices


def _ended_as(state: str) -> str:
    return "cancelled" if state == "CANCELLED" else "failed"


class _Lab:
    """One lab's array: its folder, its entries and what became of each."""

    def __init__(self, lab: str, folder: Path, entries: list[dict]):
        self.lab, self.folder, self.entries = lab, folder, entries
        self.job: str | None = None
        self.merged: set[int] = set()
        self.ended: dict[int, tuple[str, str]] = {}  # index -> (state, detail) of an element without a result

    def staged(self, index: int) -> Path:
        return self.folder / "out" / self.entries[index]["student"] / "result.json"


def _merge(root: Path, submissions: Path, staged: Path, db: tuple[str, str]) -> dict:
    """Install a staged result into the course (gradebook, autograded/, feedback/) and
    results/; its stage is removed once merged."""
    result = json.loads(staged.read_text())
    if result["status"] == "graded":
        results.install(root, db[0], db[1], submissions, result)
    results.write_json(results.results_dir(root) / result["student"] / f"{result['lab']}.json", result)
    shutil.rmtree(staged.parent, ignore_errors=True)
    return result


def merge_leftovers(root: Path, submissions: Path, db: tuple[str, str]) -> list[dict]:
    """Results an earlier run's elements staged but its driver never merged (it was killed):
    merged now, where they were graded from the same submission folder."""
    merged = []
    for staged in sorted((root / "slurm").glob("*/*/out/*/result.json")):
        result = json.loads(staged.read_text())
        if Path(result.get("submissions", "")) == submissions:
            merged.append(_merge(root, submissions, staged, db))
    return merged


def _not_graded(entry: dict, lab: str, state: str, detail: str, log: Path) -> dict:
    """What an element that ended without a result leaves: ``cancelled`` (not written: the
    same command grades it next time), else an infrastructure error that names why (never
    a 0)."""
    if state == "CANCELLED":
        why = "its Slurm job was cancelled before its result: the same command grades it"
        return results.not_graded(entry["student"], lab, why, status="cancelled")
    why = {
        "NODE_FAIL": f"its node {detail or ''} failed while it was graded (Slurm NODE_FAIL)",
        "TIMEOUT": "its Slurm job ran past its time limit",
        "OUT_OF_MEMORY": "its Slurm job ran out of memory",
    }.get(state, f"its Slurm job ended {state} without a result")
    return results.not_graded(entry["student"], lab, why, log, flags=[{"kind": "regrade", "detail": why}])


class _Driver:
    def __init__(self, root: Path, submissions: Path, out, poll_s: float, unsafe_no_sandbox: bool = False):
        self.root, self.submissions, self.out, self.poll_s = root, submissions, out, poll_s
        self.unsafe_no_sandbox = unsafe_no_sandbox
        coursedir = nbapi.course_api(root).coursedir
        self.db = (coursedir.db_url, coursedir.course_id)
        self.labs: list[_Lab] = []
        self.results: list[dict] = []
        self.last_progress = ""
        self.t0 = time.monotonic()
        self.wake = threading.Event()

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def submit(self, batch_dir: Path, todo: list, settings_file, extra, max_running: int | None) -> None:
        by_lab: dict[str, list[dict]] = {}
        for student, lab, hashes in todo:
            by_lab.setdefault(lab, []).append({"student": student, "hashes": hashes})
        # the workers' templates, made once for the whole class (on the shared file system)
        batch_dir.mkdir(parents=True)
        templates, lines_file = local.make_templates(self.root, sorted(by_lab), batch_dir / "template")
        for lab, entries in sorted(by_lab.items()):
            folder = batch_dir / lab
            (folder / "logs").mkdir(parents=True)
            (folder / "out").mkdir()
            spec = {
                "root": str(self.root),
                "submissions": str(self.submissions),
                "settings_file": str(settings_file) if settings_file else None,
                "lab": lab,
                "template": str(templates[lab]),
                "secret_lines": str(lines_file),
                "entries": entries,
                "unsafe_no_sandbox": self.unsafe_no_sandbox,
            }
            results.write_json(folder / "list.json", spec)
            one = _Lab(lab, folder, entries)
            settings = grading_settings(lab, settings_file)
            one.job = _submit(sbatch_command(folder, len(entries), settings, extra, max_running))
            self.labs.append(one)
            self.say(f"autograde --slurm: {lab}: {len(entries)} submission(s) as job array {one.job}")

    def step(self) -> bool:
        """Merge what was staged, note what ended without a result, print the progress;
        True while an element may still run."""
        states = element_states([lab.job for lab in self.labs if lab.job])
        pending = False
        progress = []
        for lab in self.labs:
            count: Counter = Counter()
            for i, entry in enumerate(lab.entries):
                if i in lab.merged or i in lab.ended:
                    count["done" if i in lab.merged else _ended_as(lab.ended[i][0])] += 1
                    continue
                if lab.staged(i).is_file():
                    result = _merge(self.root, self.submissions, lab.staged(i), self.db)
                    lab.merged.add(i)
                    self.results.append(result)
                    count["done"] += 1
                    self.say(
                        f"[{len(self.results)} {time.monotonic() - self.t0:.0f} s] {entry['student']}/{lab.lab}: "
                        f"{results.line(result)}"
                    )
                    continue
                state, detail = states.get((lab.job, i)) or states.get((lab.job, None)) or ("", "")
                if state in STATES_ENDED or (not state and lab.job and not self._known(states, lab.job)):
                    if lab.staged(i).is_file():  # staged between the two looks
                        pending = True
                        continue
                    lab.ended[i] = (state or "UNKNOWN", detail)
                    self._ended(lab, i, state or "UNKNOWN", detail)
                    count[_ended_as(state)] += 1
                    continue
                pending = True
                count["queued" if state in _QUEUED or not state else "running"] += 1
            cancelled = f", {count['cancelled']} cancelled" if count["cancelled"] else ""
            progress.append(
                f"{lab.lab}: {count['done']} done, {count['running']} running, {count['queued']} queued, "
                f"{count['failed']} failed{cancelled}"
            )
        line = "; ".join(progress)
        if line != self.last_progress:
            self.last_progress = line
            self.say(f"autograde --slurm [{time.monotonic() - self.t0:.0f} s] {line}")
        return pending

    @staticmethod
    def _known(states: dict, job: str) -> bool:
        return any(j == job for j, _ in states)

    def _ended(self, lab: _Lab, i: int, state: str, detail: str) -> None:
        entry = lab.entries[i]
        result = _not_graded(entry, lab.lab, state, detail, lab.folder / "logs" / f"{i}.log")
        if result["status"] != "cancelled":
            results.write_json(results.results_dir(self.root) / entry["student"] / f"{lab.lab}.json", result)
        self.results.append(result)
        self.say(f"{entry['student']}/{lab.lab}: {results.line(result)}")

    def wait(self, timeout: float | None = None) -> bool:
        """Until every element has ended (True), or ``timeout`` s (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.step():
            if deadline is not None and time.monotonic() > deadline:
                return False
            self.wake.wait(self.poll_s)  # the queue is polled: Slurm has no event to wait on
        return True

    def cancel(self) -> None:
        jobs = [lab.job for lab in self.labs if lab.job]
        if jobs:
            _run(["scancel", *jobs])

    def stop(self) -> bool:
        """Cancel the arrays and wait for their elements to end (what they staged meanwhile
        is merged; the rest is graded next time). True once every element has ended."""
        try:
            self.cancel()
            if self.wait(timeout=CANCEL_S):
                return True
            self.say(f"autograde --slurm: elements still ran {CANCEL_S} s after scancel; their results merge next time")
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            self.say(f"autograde --slurm: could not cancel its arrays ({exc}): scancel --name=labgrade-<lab>")
        return False


def autograde(
    submissions: Path | str,
    labs=None,
    root: Path | str = layout.GRADING_ROOT,
    *,
    resume: bool = True,
    settings_file: Path | str | None = None,
    sbatch_args: list[str] | tuple[str, ...] = (),
    max_running: int | None = None,
    out=sys.stdout,
    poll_s: float = POLL_S,
    unsafe_no_sandbox: bool = False,
) -> list[dict]:
    """Grade ``submissions/<student>/<lab>/`` as Slurm job arrays (one per lab); returns every
    result, as :func:`lab_utils.grading.batch.autograde` does. ``sbatch_args`` go to every
    ``sbatch`` (``--partition=...``, ``--account=...``); ``max_running`` caps the elements of
    an array that run at once (a shared cluster's courtesy). An element on a node where the
    sandbox cannot work refuses to grade unless ``unsafe_no_sandbox``
    (:mod:`lab_utils.grading.unsafe`)."""
    if max_running is not None and max_running < 1:
        raise ValueError(f"max_running must be at least 1, got {max_running}")
    root, submissions = Path(root).resolve(), Path(submissions).resolve()
    if settings_file is None and (root / "settings.yml").is_file():
        settings_file = root / "settings.yml"
    if not submissions.is_dir():
        raise ValueError(f"submissions folder {submissions} does not exist")
    wanted = set(layout.select_labs(labs, root))
    pairs = [(s, lab) for s, lab in local.submission_pairs(submissions) if lab in wanted]
    if not pairs:
        raise ValueError(f"no submissions for {sorted(wanted)} in {submissions} (expected <student>/<lab>/<lab>.ipynb)")
    local.prepare_labs(root, sorted({lab for _, lab in pairs}))
    driver = _Driver(root, submissions, out, poll_s, unsafe_no_sandbox)
    leftovers = merge_leftovers(root, submissions, driver.db)
    if leftovers:
        driver.say(f"autograde --slurm: merged {len(leftovers)} result(s) an earlier run's elements had staged")
    graded, todo = local.unchanged_and_todo(root, submissions, pairs, settings_file, resume)
    driver.say(f"autograde --slurm: {len(todo)} to grade, {len(graded)} unchanged since their last grading")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    batch_dir = root / "slurm" / f"{stamp}-{secrets.token_hex(3)}"
    ended = True
    try:
        if todo:
            driver.submit(batch_dir, todo, settings_file, list(sbatch_args), max_running)
            driver.wait()
    except BaseException as exc:  # Ctrl-C, or sbatch or squeue failing: no array is left running
        ended = driver.stop()
        if isinstance(exc, KeyboardInterrupt):
            driver.say(
                "autograde --slurm interrupted: its arrays are cancelled; merged results are kept; "
                "run the same command again to resume"
            )
        raise
    finally:
        # the batch's folder (templates, lists, logs) once every element has ended and all is merged
        if ended and batch_dir.is_dir() and not any(batch_dir.glob("*/out/*/result.json")):
            shutil.rmtree(batch_dir, ignore_errors=True)
    graded += driver.results
    results.summary(graded, driver.say)
    results.write_csv(graded, results.results_dir(root) / "grades.csv")
    return graded


# -- an element --------------------------------------------------------------------------
class _StagingBatch(local.Batch):
    """The local batch's grading, on a node: a result is staged for the driver, not installed."""

    def __init__(self, stage: Path, *args, **kw):
        super().__init__(*args, **kw)
        self.stage = stage

    def deliver(self, result: dict) -> None:
        if result["status"] != "graded" and self.executing.stopped:
            return  # cancelled: graded next time
        stage = self.stage
        shutil.rmtree(stage, ignore_errors=True)
        stage.mkdir(parents=True)
        if result["status"] == "graded":
            shutil.copy2(result["db"], stage / "gradebook.db")
            kept = result.get("autograded_files") or [f"{result['lab']}.ipynb"]
            results.copy_files(Path(result["autograded"]), kept, stage / "autograded")
            feedback = Path(result["feedback"])
            pages = sorted(p.name for p in feedback.glob("*.html")) if feedback.is_dir() else []
            results.copy_files(feedback, pages, stage / "feedback")
            result.update(db=str(stage / "gradebook.db"), autograded=str(stage / "autograded"))
            result["feedback"] = str(stage / "feedback")
        result["submissions"] = str(self.submissions)
        result["provenance"]["slurm"] = {
            "job": f"{os.environ.get('SLURM_ARRAY_JOB_ID', '?')}_{os.environ.get('SLURM_ARRAY_TASK_ID', '?')}",
            "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename,
        }
        results.write_json(stage / "result.json", result)  # last: the driver merges once it is there


def element(lab_dir: Path | str, index: int, out=sys.stdout) -> int:
    """Grade entry ``index`` of ``lab_dir/list.json`` on this node and stage its result."""
    lab_dir = Path(lab_dir)
    spec = json.loads((lab_dir / "list.json").read_text())
    entry = spec["entries"][index]
    lab, student = spec["lab"], entry["student"]
    try:
        warning = require_sandbox(Path(spec["root"]), None, bool(spec.get("unsafe_no_sandbox")))
    except NoSandbox as exc:
        print(f"element {index}: {student}/{lab} on {os.uname().nodename}: {exc}", file=out, flush=True)
        return 2
    if warning:
        print(warning, file=out, flush=True)
    cores = int(os.environ.get("SLURM_CPUS_PER_TASK") or resources.usable_cores())
    # a scancel (SIGTERM) while the batch makes its folder would leave it behind: held until
    # the try below, which removes it whatever happens
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    graded = _StagingBatch(
        lab_dir / "out" / student,
        Path(spec["root"]),
        Path(spec["submissions"]),
        max(1, cores),
        None,
        spec["settings_file"],
        out,
        True,
        1,
        timing_lock=locks.lock_dir() / NODE_TIMING_LOCK,
    )
    graded.templates, graded.lines_file = {lab: Path(spec["template"])}, Path(spec["secret_lines"])
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)  # a scancel that came meanwhile lands here
        print(f"element {index}: {student}/{lab} on {os.uname().nodename}, {cores} core(s)", file=out, flush=True)
        result = pool.submit(graded.grade, student, lab, entry["hashes"]).result()
        print(f"element {index}: {student}/{lab}: {results.line(result)}", file=out, flush=True)
    except KeyboardInterrupt:
        graded.stop()
        print(f"element {index}: {student}/{lab}: stopped (cancelled)", file=out, flush=True)
        return 130
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        graded.cleanup()
    return 0


_STOPS = {signal.SIGTERM, signal.SIGINT}


def _terminated(signum, frame):  # scancel's SIGTERM: stop the sandbox, stage nothing
    raise KeyboardInterrupt


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "element" or not argv[2].isdigit():
        print("usage: python -m lab_utils.grading.slurm element LAB_DIR INDEX", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _terminated)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return element(argv[1], int(argv[2]))


if __name__ == "__main__":
    sys.exit(main())
