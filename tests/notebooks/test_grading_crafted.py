"""An instructor's worst week, the live part: a grading batch stopped by Ctrl-C or SIGTERM
stops at once, keeps what it graded and leaves nothing running; the same command grades only
the rest, and a submission handed in again is graded again; the README's make commands round-trip
a class.

Lab 1's crafted class (every kind of spoilt, forged and hostile submission, in parallel sandboxes)
is graded by the grading validation (bench/bench_validation.py): each submission's score and
flags, and what grading it must leave behind (tests/support/class_checks.py: flags that say what
happened, nothing read, quoted or left running, the decoy untouched, every result kept), checked
by tests/unit/test_validation.py within the hash of what they depend on. The suite graded the same
class again for them (5 minutes: issue 57); Lab 2's half-done submission and four of Lab 1's
class are graded on Slurm nodes by tests/process/test_slurm.py."""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import psutil
import pytest
from support import class_checks, crafted

from lab_utils.config import SANDBOX
from lab_utils.grading.sandbox import leftover_cgroups

# a hang guard: the batches here grade blank releases, a few at a time
pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
LAB = crafted.CLASS_LAB


def _sandboxes_of(pid: int) -> list[str]:
    """Processes and cgroups of the grading batch ``pid``'s sandboxes (named ``labgrade-<slot>-<pid>``)."""
    found = [str(p) for p in leftover_cgroups(pid)]
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.environ().get(SANDBOX, "").endswith(f"-{pid}"):
                found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_ctrl_c_stops_the_batch_at_once_and_the_same_command_resumes(tmp_path):
    """An instructor's Ctrl-C: the batch stops at once (not after the whole class), keeps what
    is graded, leaves nothing running, and the same command grades only the rest.

    The batch starts with SIGINT *ignored*, every time: what a non-interactive shell does to
    a background job (``make test &``, a CI harness without job control). Python keeps an
    inherited SIG_IGN, so the interrupt was lost on such a machine and the whole class was
    graded (exit 0); the CLI now installs its handler itself."""
    import signal
    import subprocess

    root, subs = crafted.course(tmp_path, [LAB])
    students = [f"s{i}" for i in range(3)]  # one graded, one executing, one prepared at the first line
    for s in students:
        crafted.write("blank", LAB, subs, student=s, root=root)
    cmd = [sys.executable, "-m", "lab_utils.grading", "--root", str(root), "autograde", str(subs), "--jobs", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # fmt: skip
    lines = []
    for line in proc.stdout:  # the first result line: one graded, the next one executing, one prepared
        lines.append(line)
        if line.startswith(f"[1/{len(students)} "):
            break
    assert lines and lines[-1].startswith(f"[1/{len(students)} "), "".join(lines)
    proc.send_signal(signal.SIGINT)
    try:  # a hang guard, not a speed limit
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the batch did not stop within 120 s of Ctrl-C: " + "".join(lines) + proc.communicate()[0])
    assert proc.returncode == 130, "".join(lines) + out
    assert "autograde interrupted: finished results are kept" in out and "Traceback" not in out, out
    assert _sandboxes_of(proc.pid) == []
    kept = {p.stem.split(".")[0]: p for p in (root / "results").glob("*/*.json")}
    done = {p.parent.name for p in kept.values()}
    assert 1 <= len(done) < len(students), done  # what was graded is kept; the rest is not marked done
    first = {s: json.loads((root / "results" / s / f"{LAB}.json").read_text()) for s in done}
    assert all(r["status"] == "graded" for r in first.values()), first
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"autograde: {len(students) - len(done)} to grade, {len(done)} unchanged" in again.stdout, again.stdout
    for s in students:
        r = json.loads((root / "results" / s / f"{LAB}.json").read_text())
        assert r["status"] == "graded" and r["score"] == 0.0, r
        if s in done:
            assert r["provenance"]["graded_at"] == first[s]["provenance"]["graded_at"]  # not graded twice
    # one handed in again (now an unreadable file): that one is graded again, the others are not
    graded = {s: json.loads((root / "results" / s / f"{LAB}.json").read_text()) for s in students}
    (subs / students[0] / LAB / f"{LAB}.ipynb").write_text("{ not a notebook")
    third = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"autograde: 1 to grade, {len(students) - 1} unchanged" in third.stdout, third.stdout
    for s in students:
        r = json.loads((root / "results" / s / f"{LAB}.json").read_text())
        again_graded = r["provenance"]["graded_at"] != graded[s]["provenance"]["graded_at"]
        assert again_graded == (s == students[0]), (s, r["provenance"]["graded_at"])
    changed = json.loads((root / "results" / students[0] / f"{LAB}.json").read_text())
    assert "unreadable notebook" in {f["kind"] for f in changed["flags"]}, changed["flags"]


def test_sigterm_stops_the_batch_as_ctrl_c_does_and_leaves_no_sandbox(tmp_path):
    """kill, Slurm's scancel (SIGTERM, then SIGKILL 30 s later), a service manager: the batch
    stops as on Ctrl-C (exit 143), its running sandbox killed and removed, its work folder gone.
    Before, SIGTERM ended the batch at once, and its worker graded on, orphaned."""
    import signal
    import subprocess
    import tempfile
    import time

    root, subs = crafted.course(tmp_path, [LAB])
    crafted.write("blank", LAB, subs, student="s0", root=root)
    cmd = [sys.executable, "-m", "lab_utils.grading", "--root", str(root), "autograde", str(subs), "--jobs", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    deadline = time.monotonic() + 300  # a hang guard: the templates come first
    while not _sandboxes_of(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for the sandbox's first process, under a deadline
    running = _sandboxes_of(proc.pid)
    proc.send_signal(signal.SIGTERM)
    try:  # a hang guard, not a speed limit
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("the batch did not stop within 120 s of SIGTERM: " + proc.communicate()[0])
    assert running, out  # it was grading when the signal came
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert "autograde interrupted: finished results are kept" in out and "Traceback" not in out, out
    assert _sandboxes_of(proc.pid) == []
    assert list(Path(tempfile.gettempdir()).glob(f"labgrade-{proc.pid}-*")) == []


def test_the_instructors_make_commands_round_trip_a_class(tmp_path):
    """The README's instructor commands, as typed: make release, autograde, grades, feedback
    (on a course of their own: COURSE=, never the repository's gradebook)."""
    import subprocess

    due = "labs:\n  01_single_node:\n    cpus: 1.0\n    due: 2026-11-01T23:59:00+01:00\n"
    root, subs = crafted.course(tmp_path, [LAB], settings=due)
    crafted.write("blank", LAB, subs, student="ada", root=root)
    # handed in 2 h 1 min late, as the hand-in service's collect stamps it (lab_utils.hub)
    (subs / "ada" / LAB / "timestamp.txt").write_text("2026-11-02 01:00:00.000000 UTC")
    make = ["make", "-s", "-C", str(REPO), f"COURSE={root}"]

    def run(*target):
        proc = subprocess.run([*make, *target], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (target, proc.stdout[-2000:], proc.stderr[-2000:])
        return proc.stdout

    assert "released" in run("release") and (tmp_path / "labs" / LAB / f"{LAB}.ipynb").is_file()
    assert "ada/01_single_node: 0/" in run("autograde", f"SUBMISSIONS={subs}")
    run("grades")
    assert "ada,01_single_node,0.0" in (root / "grades.csv").read_text()
    late = "late: handed in 2 h 1 min after the due time (2026-11-01 23:59 +01:00)"
    assert late in (root / "results" / "grades.csv").read_text()
    run("grades", "LMS=canvas")
    canvas = list(csv.reader((root / "canvas.csv").open()))
    head, col = canvas[0], canvas[0].index(LAB)
    assert head[:5] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"] and head[-1] == "Late"
    assert canvas[1][0] == "Points Possible" and float(canvas[1][col]) > 0
    ada = dict(zip(head, canvas[2], strict=True))
    assert ada["SIS Login ID"] == "ada" and ada[LAB] == "0" and ada["Late"] == LAB
    assert all(ada[lab] == "" for lab in head[5:-1] if lab != LAB)  # not handed in: empty, not 0
    assert "feedback" in run("feedback") and list((root / "feedback" / "ada" / LAB).glob("*.html"))
    assert class_checks.left_running(os.getpid()) == []
