"""An instructor's worst week: crafted submissions graded as a class, in parallel
sandboxes. Lab 1 meets every kind (those that spoil different cells of a correct
submission combined in one student's, STUDENTS). (Every lab's solution, release, vandal, forgers,
attacks and half-done submission, the kernel killed, are graded by bench/bench_validation.py, its
verdicts checked by tests/unit/test_validation.py; Lab 2's half-done one again on Slurm nodes,
tests/process/test_slurm.py.) Each gets the expected score and flag, nothing is left running,
a second run resumes without grading anything again, and Ctrl-C stops a batch at once."""

from __future__ import annotations

import csv
import html
import json
import math
import os
import re
import sys
from pathlib import Path

import nbformat
import psutil
import pytest
from support import crafted

from lab_utils import grading
from lab_utils.config import SANDBOX
from lab_utils.grading import batch, scripts
from lab_utils.grading.quotes import course_secrets
from lab_utils.grading.sandbox import leftover_cgroups

# The first test pays for the module's `graded` fixture: one lab's class graded (211 s on a day
# when an `import tensorflow` took 6.2 CPU seconds). 900 s is a hang guard over 4x that.
pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]
LAB = crafted.CLASS_LAB
MIXED, LIMITS = crafted.MIXED, crafted.LIMITS
STUDENTS = crafted.CLASS
#: the student who handed in each kind
WHO = {kind: student for student, kinds in STUDENTS.items() for kind in kinds.split("+")}
# (score lost, flag kinds expected) per student, and the flags only an isolated sandbox raises:
# tests/support/crafted.py (bench/bench_validation.py grades them too)
EXPECTED, ISOLATED_ONLY = crafted.CLASS_EXPECTED, crafted.ISOLATED_ONLY


@pytest.fixture(scope="module")
def graded(crafted_class):
    """The class graded by the local batch, once a session (tests/conftest.py)."""
    return crafted_class[:4]


_fillers = crafted.fillers


def results_flag_lines(result: dict) -> list[str]:
    from lab_utils.grading.results import flag_lines

    return flag_lines(result["flags"])


def _isolated(result: dict) -> bool:
    return result["provenance"]["sandbox"].startswith("isolated")


def _left_running() -> list[str]:
    """Processes of this test's sandboxes (their LAB_SANDBOX marker names this process)."""
    mine = f"-{os.getpid()}"
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            marker = p.environ().get(SANDBOX, "")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if marker.endswith(mine):
            found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}")
    return found


def test_every_crafted_submission_gets_its_score_and_flag(graded):
    root, _, results, _ = graded
    points = crafted.test_points(LAB, root)
    full = sum(points.values())
    assert set(STUDENTS) == set(EXPECTED)
    for kind, (lost, flag) in EXPECTED.items():  # kind: the student who handed it in
        lost = list(points) if lost == "all" else lost
        r = results[kind]
        assert r["status"] == "graded", (kind, r.get("reason"), r.get("log_tail"))
        auto = sum(c["score"] for c in r["cells"])
        assert auto == full - sum(points[g] for g in lost), (kind, r["cells"])
        kinds = {f["kind"] for f in r["flags"]} - crafted.NOISE_FLAGS
        expected = set(flag) if isinstance(flag, tuple) else {flag} - {None}
        if not _isolated(r):  # no disk or process limit without root (the filler wrote its 900 MB)
            expected -= ISOLATED_ONLY
            kinds -= {"quoted hidden tests", "quoted solution", "quoted reference"}  # it runs as the grader
        assert kinds == expected, (kind, r["flags"])
        statuses = {c["grade_id"]: c["status"] for c in r["cells"]}
        assert set(statuses) == set(points)  # every test cell accounted for
        assert all(statuses[g] != "passed" for g in lost) and all(
            s == "passed" for g, s in statuses.items() if g not in lost
        ), (kind, statuses)
    blank = results["blank"]
    assert sum(c["score"] for c in blank["cells"]) == 0 and all(c["status"] == "error" for c in blank["cells"])


def test_flags_name_what_happened(graded):
    _, _, results, _ = graded
    detail = {kind: " ".join(f["detail"] for f in results[who]["flags"]) for kind, who in WHO.items()}
    assert "sleep 100000" in detail["leaks"] and "listening on port" in detail["leaks"]
    # hundreds of processes, one line: "leaked process killed ×N: sleep 3600 ×N"
    (bomb,) = [line for line in results_flag_lines(results[WHO["bomb"]]) if line.startswith("leaked process killed")]
    assert re.fullmatch(r"leaked process killed ×\d{3}: sleep 3600 ×\d{3}", bomb), bomb
    if _isolated(results[WHO["bomb"]]):
        assert "process limit 512 reached in cell" in detail["bomb"] and "refused" in detail["bomb"], detail["bomb"]
        assert "disk limit 64 MB reached in cell" in detail["disk"], detail["disk"]
    assert "kernel died in cell" in detail["exits"] and "re-run" in detail["exits"]
    # 40 s, stretched where this machine gives the lab less than its 1.0 core (a quota of 0.8: 50 s)
    timeout = results["loop"]["provenance"]["time_limits_stretched"] * crafted.CLASS_SETTINGS["cell_timeout"]
    expected = f"{math.ceil(timeout - 1e-9)} s cell timeout"
    assert "(q2_readings)" in detail["loop"] and expected in detail["loop"], detail["loop"]
    # the memory limit by name, with the cell and the limit: the cgroup's OOM kill (root), or
    # MemoryError under RLIMIT_AS (the process-group sandbox)
    assert "bytes over the limit per cell" in detail["hostile"] and "graded in its place" in detail["broken"]
    assert "the 4096 MB memory limit" in detail["memory"] and "cell " in detail["memory"], detail["memory"]
    if results["memory"]["provenance"]["sandbox"].startswith("isolated"):
        assert "killed the kernel in cell" in detail["memory"] and " MB)" in detail["memory"], detail["memory"]
    loop = {c["grade_id"]: c for c in results["loop"]["cells"]}
    for gid in ("test_fastest_to_target", "test_time_from_rates"):  # the functions never defined
        assert loop[gid]["status"] == "error" and "NameError" in loop[gid]["reason"], loop[gid]


def _outputs(root: Path, student: str, lab: str = LAB) -> str:
    nb = nbformat.read(root / "autograded" / student / lab / f"{lab}.ipynb", as_version=4)
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_student_code_reads_no_test_no_gradebook_no_other_submission(graded):
    root, subs, results, _ = graded
    snoop = WHO["snoop"]
    if not results[snoop]["provenance"]["sandbox"].startswith("isolated"):
        pytest.skip("not root: the process-group sandbox runs the kernel as the grader's own user")
    printed = [line for line in _outputs(root, snoop).splitlines() if line.startswith("SNOOPED:")]
    assert printed == ["SNOOPED: []"], printed
    # it printed the reference scripts the sandbox shows: none (Lab 1's tests run none), so nothing kept shows one
    own = (subs / snoop / LAB / f"{LAB}.ipynb").read_text()  # its own solutions are in its feedback, rightly
    solution = [line for line in scripts.solution_lines(root) if json.dumps(line)[1:-1] not in own]
    assert solution and not [line for line in solution if line in _outputs(root, snoop)]
    feedback = html.unescape(next((root / "feedback" / snoop / LAB).glob("*.html")).read_text())
    assert not [line for line in solution if line in feedback]


def _kept_text(root: Path, student: str) -> str:
    """Everything the course keeps of ``student``'s grading that a person may read: the autograded
    notebook and its files, the feedback, the result."""
    texts = []
    for folder in (root / "autograded" / student, root / "feedback" / student, root / "results" / student):
        texts += [html.unescape(f.read_text(errors="replace")) for f in sorted(folder.rglob("*")) if f.is_file()]
    return "\n".join(texts)


def test_nothing_kept_quotes_a_hidden_test_a_solution_git_or_a_secret(graded, crafted_class):
    """After the whole class (the attacks printed every hidden test they caught, every .git they
    found and the kernel's environment), no file kept of any student shows a hidden-test line, a
    solution line of any lab (but the student's own), a line of a .git, or a secret of the grader's."""
    root, subs, results, _ = graded
    secret = course_secrets(root)
    for student in results:
        kept = _kept_text(root, student)
        handed = subs / student / LAB / f"{LAB}.ipynb"
        own = {x.strip() for x in handed.read_text(errors="replace").splitlines()} if handed.is_file() else set()
        own_text = handed.read_text(errors="replace") if handed.is_file() else ""
        quoted = [
            line
            for line, kind in secret.items()
            if line in kept and line not in own and json.dumps(line)[1:-1] not in own_text
        ]
        assert quoted == [], (student, quoted[:5])
        for value in crafted.SECRETS.values():
            assert value not in kept, student
        for name in crafted.SECRETS:
            assert name not in kept, student
        assert "ref: refs/heads/" not in kept and "[core]" not in kept, student  # what a .git holds
    assert "GIT: found 0 checkouts: []" in _outputs(root, WHO["git"]) or not _isolated(results[WHO["git"]])


def test_the_restart_attack_leaves_the_root_owned_decoy_as_it_was(crafted_class):
    """The connection file made a link to a root-only file, then the kernel killed: root restarts
    it without writing through the link; the link in the submission's folder is not followed."""
    root, _, results, _, _, _, decoy = crafted_class
    assert decoy.read_text() == crafted.DECOY_TEXT and decoy.stat().st_mode & 0o7777 == 0o640
    assert "kernel died" in {f["kind"] for f in results[WHO["restart"]]["flags"]}
    for folder in ("submitted", "autograded", "feedback"):
        for f in (root / folder / WHO["symlink"]).rglob("*"):
            assert not f.is_symlink() and (not f.is_file() or crafted.DECOY_TEXT not in f.read_text(errors="replace"))


def test_forged_flags_do_not_count_and_no_csv_cell_is_a_formula(graded):
    root, _, results, _ = graded
    kinds = {f["kind"] for f in results[WHO["flag"]]["flags"]}
    assert "forged flag" in kinds and not any(k.startswith("=") or "HYPERLINK" in k for k in kinds), kinds
    for path in (root / "results" / "grades.csv", grading.export_grades(None, root)):
        for row in csv.reader(path.open()):
            assert not any(cell.startswith(("=", "+", "-", "@")) for cell in row), row


def test_two_gradings_of_one_correct_submission_give_the_same_throughput_band(graded):
    root, _, results, _ = graded

    def timing(student):
        line = next(x for x in _outputs(root, student).splitlines() if x.startswith("[grading-timing] "))
        cell = next(c for c in results[student]["cells"] if c["grade_id"] == "test_throughput")
        return json.loads(line.removeprefix("[grading-timing] ")), cell["score"]

    # the correct submission, its first (visible) test cell emptied (and more): timed again
    (first, score1), (second, score2) = timing("correct"), timing(WHO["tampered"])
    assert first["band"] == second["band"] == 0 and score1 == score2, (first, second)
    assert first["student_s"] != second["student_s"]  # two measurements, not one result copied


def test_nothing_is_left_running_and_the_course_holds_every_result(graded):
    root, _, results, before = graded
    assert _left_running() == []
    assert leftover_cgroups(os.getpid()) == []  # its cgroups removed
    for student in results:
        assert (root / "autograded" / student / LAB / f"{LAB}.ipynb").is_file()
        assert list((root / "feedback" / student / LAB).glob("*.html"))
        prov = json.loads((root / "results" / student / f"{LAB}.json").read_text())["provenance"]
        assert len(prov["submission_sha256"]) == 64 and prov["host"] and "nbgrader" in prov["versions"]
    # whatever a submission printed, the course keeps at most a capped notebook of it
    flood = sum(
        f.stat().st_size
        for d in ("autograded", "feedback")
        for f in (root / d / WHO["hostile"]).rglob("*")
        if f.is_file()
    )
    assert flood < 10 * 2**20, flood
    # what the disk filler wrote went with its sandbox: its autograded folder holds its notebook
    # alone, and none of its files is left in the course, the temporary folders or the home
    assert sorted(p.name for p in (root / "autograded" / WHO["disk"] / LAB).iterdir()) == [f"{LAB}.ipynb"]
    assert _fillers(root) - before == set()
    csv_text = (root / "results" / "grades.csv").read_text()
    full = sum(crafted.test_points(LAB, root).values())
    assert f"{WHO['leaks']},01_single_node,graded,{full}" in csv_text and "leaked process killed" in csv_text
    scores = grading.export_grades(None, root).read_text()  # merged into the course gradebook
    forged = full - crafted.test_points(LAB, root)["test_throughput"]
    assert f"forged,01_single_node,{forged}" in scores and "blank,01_single_node,0.0" in scores


def test_a_second_run_resumes_and_a_changed_submission_is_graded_again(graded):
    root, subs, results, _ = graded
    nb = subs / "partly" / LAB / f"{LAB}.ipynb"
    crafted.write("correct", LAB, subs, student="partly", root=root)  # partly handed in again, now complete
    again = {r["student"]: r for r in batch.autograde(subs, [LAB], root, jobs=2)}
    assert nb.is_file()
    assert again["partly"]["provenance"]["graded_at"] != results["partly"]["provenance"]["graded_at"]
    assert sum(c["score"] for c in again["partly"]["cells"]) == sum(crafted.test_points(LAB, root).values())
    for student in set(results) - {"partly"}:  # unchanged: not graded again
        assert again[student]["provenance"]["graded_at"] == results[student]["provenance"]["graded_at"]


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
    assert _left_running() == []
