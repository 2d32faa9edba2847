"""What grading Lab 1's crafted class must leave behind, beyond each submission's score and flags:
checked by the grading validation right after it grades the class (bench/bench_validation.py),
recorded in grading/validation.json, and read by tests/unit/test_validation.py.

Each check is a function of the graded course (:class:`Graded`) that raises :class:`Failed` with
what it found. :func:`run` runs them all: ``{check: ""}`` when it held, else why not. The checks are
the crafted-class tests that the suite ran on a class of its own, graded again for them (5
minutes of the suite: issue 57's review); the validation grades the same class, with the same
settings, in the same isolated sandboxes, and its inputs' hash (lab_utils, the labs' sources and
settings, the crafted kinds and these checks) dates the record when any of them changes.
"""

from __future__ import annotations

import csv
import html
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import psutil

from support import crafted

LAB = crafted.CLASS_LAB
#: the student who handed in each kind
WHO = {kind: student for student, kinds in crafted.CLASS.items() for kind in kinds.split("+")}


class Failed(Exception):
    """A check that did not hold: what it found."""


def need(holds: bool, why: object) -> None:
    if not holds:
        raise Failed(str(why)[:2000])


@dataclass
class Graded:
    """Lab 1's crafted class as graded: the course (``root``), the submissions as handed in
    (``subs``), the results by student, the disk filler's files before grading (``before``),
    the root-owned file the attacks aim at (``decoy``), the grading batch's process id (its
    sandboxes are named after it) and the student who handed in the blank release."""

    root: Path
    subs: Path
    results: dict[str, dict]
    before: set[Path]
    decoy: Path
    batch_pid: int
    blank: str

    def isolated(self, student: str) -> bool:
        return self.results[student]["provenance"]["sandbox"].startswith("isolated")

    def outputs(self, student: str) -> str:
        nb = nbformat.read(self.root / "autograded" / student / LAB / f"{LAB}.ipynb", as_version=4)
        return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))

    def kept_text(self, student: str) -> str:
        """Everything the course keeps of ``student``'s grading of this lab that a person may read:
        the autograded notebook and its files, the feedback, the result. Of this lab only: where the
        course grades every lab (the validation's), the student's other labs hold their own
        solutions, rightly, and they are not what this class's attacks could have printed."""
        files = [
            *(self.root / "autograded" / student / LAB).rglob("*"),
            *(self.root / "feedback" / student / LAB).rglob("*"),
            *(self.root / "results" / student).glob(f"{LAB}.*"),
        ]
        return "\n".join(html.unescape(f.read_text(errors="replace")) for f in sorted(files) if f.is_file())


def left_running(pid: int) -> list[str]:
    """Processes of the grading batch ``pid``'s sandboxes (their LAB_SANDBOX marker names it)."""
    from lab_utils.config import SANDBOX

    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            marker = p.environ().get(SANDBOX, "")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if marker.endswith(f"-{pid}"):
            found.append(f"{p.pid}: {' '.join(p.info['cmdline'] or [])[:120]}")
    return found


def flag_lines(result: dict) -> list[str]:
    from lab_utils.grading.results import flag_lines as lines

    return lines(result["flags"])


def flags_name_what_happened(g: Graded) -> None:
    """Each flag says what the submission did, where, and with which limit."""
    results = g.results
    detail = {kind: " ".join(f["detail"] for f in results[who]["flags"]) for kind, who in WHO.items()}
    need("sleep 100000" in detail["leaks"] and "listening on port" in detail["leaks"], detail["leaks"])
    # hundreds of processes, one line: "leaked process killed ×N: sleep 3600 ×N"
    bombs = [line for line in flag_lines(results[WHO["bomb"]]) if line.startswith("leaked process killed")]
    need(len(bombs) == 1 and re.fullmatch(r"leaked process killed ×\d{3}: sleep 3600 ×\d{3}", bombs[0]), bombs)
    if g.isolated(WHO["bomb"]):
        need("process limit 512 reached in cell" in detail["bomb"] and "refused" in detail["bomb"], detail["bomb"])
        need("disk limit 64 MB reached in cell" in detail["disk"], detail["disk"])
    need("kernel died in cell" in detail["exits"] and "re-run" in detail["exits"], detail["exits"])
    # 40 s, stretched where this machine gives the lab less than its 1.0 core (a quota of 0.8: 50 s)
    timeout = results["loop"]["provenance"]["time_limits_stretched"] * crafted.CLASS_SETTINGS["cell_timeout"]
    expected = f"{math.ceil(timeout - 1e-9)} s cell timeout"
    need("(q2_readings)" in detail["loop"] and expected in detail["loop"], (expected, detail["loop"]))
    # the memory limit by name, with the cell and the limit: the cgroup's OOM kill (root), or
    # MemoryError under RLIMIT_AS (the process-group sandbox)
    need("bytes over the limit per cell" in detail["hostile"], detail["hostile"])
    need("graded in its place" in detail["broken"], detail["broken"])
    need("the 4096 MB memory limit" in detail["memory"] and "cell " in detail["memory"], detail["memory"])
    if g.isolated("memory"):
        need("killed the kernel in cell" in detail["memory"] and " MB)" in detail["memory"], detail["memory"])
    loop = {c["grade_id"]: c for c in results["loop"]["cells"]}
    for gid in ("test_fastest_to_target", "test_time_from_rates"):  # the functions never defined
        need(loop[gid]["status"] == "error" and "NameError" in loop[gid]["reason"], loop[gid])


def student_code_reads_nothing(g: Graded) -> None:
    """The snooping cells find no test, gradebook or other submission, and show no solution."""
    from lab_utils.grading import scripts

    snoop = WHO["snoop"]
    need(g.isolated(snoop), "not an isolated sandbox: the kernel ran as the grader's own user")
    printed = [line for line in g.outputs(snoop).splitlines() if line.startswith("SNOOPED:")]
    need(printed == ["SNOOPED: []"], printed)
    # it printed the reference scripts the sandbox shows: none (Lab 1's tests run none), so nothing kept shows one
    own = (g.subs / snoop / LAB / f"{LAB}.ipynb").read_text()  # its own solutions are in its feedback, rightly
    solution = [line for line in scripts.solution_lines(g.root) if json.dumps(line)[1:-1] not in own]
    need(bool(solution), "no solution line to look for")
    need(not [line for line in solution if line in g.outputs(snoop)], "a solution line in its outputs")
    feedback = html.unescape(next((g.root / "feedback" / snoop / LAB).glob("*.html")).read_text())
    need(not [line for line in solution if line in feedback], "a solution line in its feedback")


def nothing_kept_quotes_a_secret(g: Graded) -> None:
    """After the whole class (the attacks printed every hidden test they caught, every .git they
    found and the kernel's environment), no file kept of any student shows a hidden-test line, a
    solution line of any lab (but the student's own), a line of a .git, or a secret of the grader's."""
    from lab_utils.grading.quotes import course_secrets

    secret = course_secrets(g.root)
    for student in g.results:
        kept = g.kept_text(student)
        handed = g.subs / student / LAB / f"{LAB}.ipynb"
        own_text = handed.read_text(errors="replace") if handed.is_file() else ""
        own = {x.strip() for x in own_text.splitlines()}
        quoted = [
            line for line in secret if line in kept and line not in own and json.dumps(line)[1:-1] not in own_text
        ]
        need(quoted == [], (student, quoted[:5]))
        need(not any(value in kept for value in crafted.SECRETS.values()), f"{student}: a secret's value kept")
        need(not any(name in kept for name in crafted.SECRETS), f"{student}: a secret's name kept")
        need("ref: refs/heads/" not in kept and "[core]" not in kept, f"{student}: a .git's lines kept")
    found = "GIT: found 0 checkouts: []" in g.outputs(WHO["git"])
    need(found or not g.isolated(WHO["git"]), "the git attack found a checkout")


def decoy_untouched(g: Graded) -> None:
    """The connection file made a link to a root-only file, then the kernel killed: root restarts
    it without writing through the link; the link in the submission's folder is not followed."""
    need(g.decoy.read_text() == crafted.DECOY_TEXT, "the decoy's text changed")
    need(g.decoy.stat().st_mode & 0o7777 == 0o640, oct(g.decoy.stat().st_mode))
    need("kernel died" in {f["kind"] for f in g.results[WHO["restart"]]["flags"]}, g.results[WHO["restart"]]["flags"])
    for folder in ("submitted", "autograded", "feedback"):
        for f in (g.root / folder / WHO["symlink"]).rglob("*"):
            need(not f.is_symlink(), f"{f} is a link")
            need(not f.is_file() or crafted.DECOY_TEXT not in f.read_text(errors="replace"), f"{f} shows the decoy")


def forged_flags_and_no_formula(g: Graded) -> None:
    """A flag the submission printed does not count, and no cell of a CSV is a formula."""
    from lab_utils import grading

    kinds = {f["kind"] for f in g.results[WHO["flag"]]["flags"]}
    need("forged flag" in kinds and not any(k.startswith("=") or "HYPERLINK" in k for k in kinds), kinds)
    for path in (g.root / "results" / "grades.csv", grading.export_grades(None, g.root)):
        for row in csv.reader(path.open()):
            need(not any(cell.startswith(("=", "+", "-", "@")) for cell in row), (path.name, row))


def one_throughput_band_twice(g: Graded) -> None:
    """The correct submission, and the same solutions with their first visible test cell emptied
    (and more): timed twice, in the same band, two measurements."""

    def timing(student):
        line = next(x for x in g.outputs(student).splitlines() if x.startswith("[grading-timing] "))
        cell = next(c for c in g.results[student]["cells"] if c["grade_id"] == "test_throughput")
        return json.loads(line.removeprefix("[grading-timing] ")), cell["score"]

    (first, score1), (second, score2) = timing("correct"), timing(WHO["tampered"])
    need(first["band"] == second["band"] == 0 and score1 == score2, (first, second))
    need(first["student_s"] != second["student_s"], "one measurement copied")


def nothing_left_and_every_result_kept(g: Graded) -> None:
    """Nothing of the batch runs on, its cgroups are gone, the course holds every student's graded
    notebook, feedback and result, the flood is capped, the filler's files went with its sandbox,
    and the grades (the class's, then the course gradebook) hold every student."""
    from lab_utils import grading
    from lab_utils.grading.sandbox import leftover_cgroups

    need(left_running(g.batch_pid) == [], left_running(g.batch_pid))
    need(leftover_cgroups(g.batch_pid) == [], leftover_cgroups(g.batch_pid))
    for student in g.results:
        need((g.root / "autograded" / student / LAB / f"{LAB}.ipynb").is_file(), f"{student}: no graded notebook")
        need(list((g.root / "feedback" / student / LAB).glob("*.html")), f"{student}: no feedback")
        prov = json.loads((g.root / "results" / student / f"{LAB}.json").read_text())["provenance"]
        need(len(prov["submission_sha256"]) == 64 and prov["host"] and "nbgrader" in prov["versions"], prov)
    # whatever a submission printed, the course keeps at most a capped notebook of it
    hostile = WHO["hostile"]
    flood = sum(
        f.stat().st_size for d in ("autograded", "feedback") for f in (g.root / d / hostile).rglob("*") if f.is_file()
    )
    need(flood < 10 * 2**20, f"{flood} bytes kept of the flood")
    # what the disk filler wrote went with its sandbox: its autograded folder holds its notebook
    # alone, and none of its files is left in the course, the temporary folders or the home
    kept = sorted(p.name for p in (g.root / "autograded" / WHO["disk"] / LAB).iterdir())
    need(kept == [f"{LAB}.ipynb"], kept)
    need(crafted.fillers(g.root) - g.before == set(), crafted.fillers(g.root) - g.before)
    csv_text = (g.root / "results" / "grades.csv").read_text()
    points = crafted.test_points(LAB, g.root)
    full = sum(points.values())
    need(f"{WHO['leaks']},{LAB},graded,{full}" in csv_text and "leaked process killed" in csv_text, csv_text[:2000])
    scores = grading.export_grades(None, g.root).read_text()  # merged into the course gradebook
    forged = full - points["test_throughput"]
    need(f"forged,{LAB},{forged}" in scores and f"{g.blank},{LAB},0.0" in scores, scores[:2000])


CHECKS: dict[str, Callable[[Graded], None]] = {
    "flags name what happened": flags_name_what_happened,
    "student code reads no test, no gradebook, no other submission": student_code_reads_nothing,
    "nothing kept quotes a hidden test, a solution, a .git or a secret": nothing_kept_quotes_a_secret,
    "the restart attack leaves the root-owned decoy as it was": decoy_untouched,
    "forged flags do not count, and no CSV cell is a formula": forged_flags_and_no_formula,
    "two gradings of one correct submission give the same throughput band": one_throughput_band_twice,
    "nothing is left running, and the course holds every result": nothing_left_and_every_result_kept,
}


def run(graded: Graded) -> dict[str, str]:
    """Every check of :data:`CHECKS` on ``graded``: ``{check: ""}`` when it held, else what it found
    (an error of the check itself is a failure too, named)."""
    out = {}
    for name, check in CHECKS.items():
        try:
            check(graded)
            out[name] = ""
        except Failed as exc:
            out[name] = str(exc) or "failed"
        except Exception as exc:  # noqa: BLE001 (a check that cannot run has not held: recorded, never swallowed)
            out[name] = f"{type(exc).__name__}: {exc}"[:2000]
    return out


def batch_pid() -> int:
    """The grading batch's process id: this process's (batch.autograde runs in it)."""
    return os.getpid()
