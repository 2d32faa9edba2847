"""The grading validation: the grader run on known-good, known-bad and deliberately wrong
submissions (negative controls) of every lab, each with the score and flags it must get.

    python bench/bench_validation.py                   # every lab: grading/validation.json, VALIDATION.md
    python bench/bench_validation.py --render          # VALIDATION.md again from validation.json

What it grades, in one course with the instructor's grading settings (``grading/settings.yml``;
Lab 1 with its crafted class's),
in parallel sandboxes as ``make autograde`` does (as root: isolated), with secrets in the
grader's environment as the crafted-class test has them:

- each lab's **known-good** submission (the release with the instructor's solutions), and its
  **release** as handed out (nothing solved);
- the **crafted classes** of the tests (``tests/support/crafted.py``, :func:`validation_class`):
  Lab 1's, which meets every kind; on Labs 2-7 a broken file, the vandal, the forgers, half done,
  and the solution carrying every attack a complete submission can;
- every **mutant** of the mutation check (``tests/unit/test_mutants.py``: the instructor's
  solution with one typical mistake), run against its exercise's visible checks as a student
  runs them: each must be caught, with a message that names the mistake.

``grading/validation.json`` keeps the expected and actual score and flags of each, and per lab the
date, the machine, the commit and a hash of what its verdicts depend on (:data:`VERDICT_INPUTS`:
``lab_utils`` (the grader, and the training code, cluster and plots a graded notebook runs), the
lab's own source, its parameters, the grading settings, the lock, the crafted kinds, the mutants;
:func:`inputs_hash`), and the facts of each lab's graded known-good notebook (quiet, its figures,
its outputs' size, its feedback quoting no hidden test: ``tests/support/graded.py``; the suite
grades no lab's solution itself), and what grading Lab 1's crafted class left behind, checked
right after it is graded (``tests/support/class_checks.py``: flags that say what happened, nothing
read, quoted or left running, the decoy as it was, every result kept; the suite grades no crafted
class itself); ``grading/VALIDATION.md`` is rendered from it. ``tests/unit/test_validation.py`` fails
while a crafted kind or a mutant is missing from it, when a verdict is not "as expected" (recomputed
from the plan as it is now), or when an input changed since it was made. ``--labs`` grades those
labs again and keeps the others' rows with their own provenance. Needs root (an isolated grader:
without one the sandbox's limits go unchecked). Exit status 1 when a verdict is not as expected
(the files are written all the same).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from support import class_checks, crafted, graded  # noqa: E402

from lab_utils.grading import layout  # noqa: E402

JSON = REPO / "grading" / "validation.json"
MARKDOWN = REPO / "grading" / "VALIDATION.md"
#: the packages of the labs in grading/drafts/, by draft: out of the inputs until their lab joins
#: (none now: Lab 7's lab_utils/training/modelpar/ joined with its lab)
DRAFT_PACKAGES: tuple[str, ...] = ()
#: what the verdicts depend on: the grader, the labs' sources (their hidden tests) and grading
#: settings, the crafted submissions and the mutants. A change to any of them dates the validation.
VERDICT_INPUTS = (
    # the grader, and everything a graded notebook runs (the training code, the cluster, the
    # plots): a change there can change a score, a flag or a notebook's facts
    "lab_utils",
    "grading/source",
    "grading/settings.yml",
    "grading/nbgrader_config.py",
    "labs/params.yml",
    "requirements/constraints.txt",  # the lock: TensorFlow's, nbgrader's versions
    "tests/support/graded.py",
    "tests/support/crafted.py",
    "tests/support/hostile.py",
    "tests/support/class_checks.py",
    "tests/unit/test_mutants.py",
)
#: inputs that hold one entry per lab: a lab's hash takes its own entry only (Lab 6's CI parameters
#: are not Lab 1's input)
PER_LAB_FILES = ("labs/params.yml",)
#: in the grading package for its command line, but lecture material, not the grader; and the code
#: of a lab still in grading/drafts/ (no graded lab imports it: tests/unit/test_validation.py)
NOT_THE_GRADER = (
    "lab_utils/grading/slides.py",
    "lab_utils/grading/templates/slides/",
    *DRAFT_PACKAGES,
)
#: per-lab settings beside the instructor's: Lab 1's crafted class's (a short cell timeout for its
#: endless loop, a small disk for its filler). (Lab 5's half-done submission hangs a cell for the
#: instructor's whole cell timeout: a shorter one for the lab cut its known-good cells short on a
#: busy machine.)
OVERRIDES = {crafted.CLASS_LAB: crafted.CLASS_SETTINGS}
#: the known-good submission of every lab's validation class
KNOWN_GOOD = "correct"


def _input_files(root: Path = REPO) -> list[str]:
    """The verdict inputs' files: git's tracked ones (an editor's swap file is not an input), or
    every file where this is no git checkout."""
    run = subprocess.run(
        ["git", "-C", str(root), "ls-files", "-z", "--", *VERDICT_INPUTS], capture_output=True, text=True
    )
    if run.returncode == 0 and run.stdout:
        files = run.stdout.strip("\0").split("\0")
    else:
        files = [
            str(p.relative_to(root))
            for base in VERDICT_INPUTS
            for p in ([root / base] if (root / base).is_file() else sorted((root / base).rglob("*")))
            if p.is_file() and "__pycache__" not in p.parts
        ]
    return sorted(f for f in files if not f.startswith(NOT_THE_GRADER))


def _another_labs(name: str, lab: str) -> bool:
    parts = name.split("/")
    return parts[:2] == ["grading", "source"] and len(parts) > 3 and parts[2] != lab


def inputs_hash(root: Path = REPO, lab: str | None = None) -> str:
    """SHA-256 of the verdict inputs as they are in the working tree (paths and bytes). With
    ``lab``, of that lab's: the other labs' sources, and their entries of :data:`PER_LAB_FILES`,
    are left out, so a change to one lab's source or parameters dates only its rows (lab_utils,
    the settings, the lock, the crafted kinds and the mutants date every lab's)."""
    digest = hashlib.sha256()
    for name in _input_files(root):
        if lab is not None and _another_labs(name, lab):
            continue
        path = root / name
        data = path.read_bytes() if path.is_file() else b"(deleted)"
        if lab is not None and name in PER_LAB_FILES and path.is_file():
            data = _labs_entry(data, lab)
        digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def _labs_entry(data: bytes, lab: str) -> bytes:
    """``lab``'s entry of a per-lab YAML file (:data:`PER_LAB_FILES`), canonical: its other
    labs' entries are not this lab's input."""
    entry = (yaml.safe_load(data) or {}).get(lab)
    return b"entry:" + json.dumps(entry, sort_keys=True, default=str).encode()


def _settings() -> str:
    cfg = yaml.safe_load((REPO / "grading" / "settings.yml").read_text())
    cfg.pop("due_file", None)  # no schedule in this course: nothing is late
    for lab, over in OVERRIDES.items():
        cfg.setdefault("labs", {}).setdefault(lab, {}).update(over)
    return yaml.safe_dump(cfg, sort_keys=False)


def _flag_kinds(result: dict) -> set[str]:
    return {f["kind"] for f in result.get("flags", [])}


def verdict(result: dict, points: dict[str, float], lost: list[str], flags: tuple[str, ...]) -> dict:
    """One submission's row: expected and actual score and flags, and whether they agree (timing
    noise, which never costs points, is not a flag; the grader is an isolated one: :func:`main`)."""
    want = set(flags)
    got = _flag_kinds(result) - crafted.NOISE_FLAGS
    expected_score = sum(points.values()) - sum(points[g] for g in lost)
    cells = {c["grade_id"]: c for c in result.get("cells", [])}
    score = sum(c["score"] for c in cells.values()) if result.get("status") == "graded" else None
    lost_now = sorted(g for g, c in cells.items() if c["status"] != "passed")
    ok = result.get("status") == "graded" and score == expected_score and lost_now == sorted(lost) and got == want
    return {
        "status": result.get("status"),
        "expected_score": expected_score,
        "score": score,
        "max_score": sum(points.values()),
        "expected_lost": sorted(lost),
        "lost": lost_now,
        "expected_flags": sorted(want),
        "flags": sorted(got),
        "noise": sorted(_flag_kinds(result) & crafted.NOISE_FLAGS),
        "as_expected": ok,
        **({"reason": result.get("reason")} if result.get("status") != "graded" else {}),
    }


def grade(labs: list[str], jobs: int, progress=print) -> tuple[dict, dict, dict]:
    """Grade every lab's validation class: ``{lab: {student: row}}``, the facts of each lab's
    graded known-good notebook (:func:`_facts`) by lab, and what grading Lab 1's crafted class left
    behind (``tests/support/class_checks.py``: ``{lab: {check: "" or why not}}``)."""
    from lab_utils.grading import batch

    rows: dict[str, dict] = {}
    checked: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(
        prefix="validation-", dir=REPO / "out" if (REPO / "out").is_dir() else None
    ) as tmp:
        root, subs = crafted.course(Path(tmp), labs, _settings())
        decoy = crafted.decoy()
        plans = {}
        try:
            for lab in labs:
                points = crafted.test_points(lab, root)
                plans[lab] = (points, crafted.validation_class(lab, points))
                for student, (kinds, _, _) in plans[lab][1].items():
                    crafted.write(kinds, lab, subs, student=student, root=root, decoy=decoy)
            before = crafted.fillers(root)
            saved = {k: os.environ.get(k) for k in crafted.SECRETS}
            os.environ.update(crafted.SECRETS)
            try:
                results = batch.autograde(subs, labs, root, jobs=jobs)
            finally:
                for k, v in saved.items():
                    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
            if crafted.CLASS_LAB in labs:  # before the decoy goes: the restart attack aimed at it
                checked[crafted.CLASS_LAB] = _class_checks(root, subs, results, before, decoy, plans)
        finally:
            crafted.remove_decoy(decoy)
        notebooks = {lab: _facts(root, lab) for lab in labs}
        by = {(r["lab"], r["student"]): r for r in results}
        for lab in labs:
            points, plan = plans[lab]
            rows[lab] = {}
            for student, (kinds, lost, flags) in plan.items():
                result = by.get((lab, student), {"status": "missing"})
                rows[lab][student] = {"kinds": kinds, **verdict(result, points, lost, flags)}
                progress(
                    f"{lab} {student}: {'as expected' if rows[lab][student]['as_expected'] else 'NOT AS EXPECTED'}"
                )
    return rows, notebooks, checked


def _class_checks(root: Path, subs: Path, results: list[dict], before: set, decoy: Path, plans: dict) -> dict:
    """What grading Lab 1's crafted class left behind (``tests/support/class_checks.py``)."""
    lab = crafted.CLASS_LAB
    blank = next(s for s, (kinds, _, _) in plans[lab][1].items() if kinds == "blank")
    by_student = {r["student"]: r for r in results if r["lab"] == lab}
    mine = class_checks.Graded(root, subs, by_student, before, decoy, class_checks.batch_pid(), blank)
    return class_checks.run(mine)


def _facts(root: Path, lab: str) -> dict:
    """The known-good submission's graded notebook and feedback (``tests/support/graded.py``)."""
    feedback = sorted((root / "feedback" / KNOWN_GOOD / lab).glob("*.html"))
    return graded.notebook_facts(
        root / "autograded" / KNOWN_GOOD / lab / f"{lab}.ipynb",
        REPO / "grading" / "source" / lab / f"{lab}.ipynb",
        "".join(f.read_text() for f in feedback) if feedback else "",
    ) | {"feedback_pages": len(feedback)}


def mutants(labs: list[str], progress=print) -> dict:
    """Every mutant of the mutation check against its exercise's visible checks: ``{lab: [row]}``."""
    from lab_utils.grading import walkthrough

    check = walkthrough.load_mutation_check()
    out: dict[str, list] = {}
    for lab in check.LABS:
        if lab.name not in labs:
            continue
        out[lab.name] = []
        for mutant in lab.mutants:
            message = walkthrough._message(check, lab, mutant)
            caught = not message.startswith("(not caught")
            named = bool(re.search(mutant.words, message)) if caught else False
            out[lab.name].append(
                {
                    "exercise": mutant.solution,
                    "mistake": mutant.name,
                    "caught": caught,
                    "message": message[:300],
                    "as_expected": caught and named,
                }
            )
        progress(f"{lab.name}: {sum(r['as_expected'] for r in out[lab.name])} of {len(out[lab.name])} mutants caught")
    return out


def _machine() -> str:
    import psutil

    from lab_utils import resources

    cores = resources.usable_cores()
    mem = psutil.virtual_memory().total / 2**30
    return f"{platform.machine()}, {cores} CPUs, {mem:.0f} GiB, Python {platform.python_version()}; isolated sandboxes"


def _commit() -> str:
    def git(*args):
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = git("status", "--porcelain", "--", "lab_utils", "grading/source", "tests/support")
    return head + (" (with uncommitted changes to the grader, its sources or the crafted kinds)" if dirty else "")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _provenance(made: dict) -> str:
    """Which labs were graded at which commit with which inputs, grouped."""
    groups: dict[str, list] = {}
    for lab, m in made.items():
        groups.setdefault(m["commit"], []).append(f"{lab} {m['inputs'][:12]}")
    return "; ".join(f"at {commit}: {', '.join(labs)}" for commit, labs in groups.items())


def render(data: dict) -> str:
    rows = [r for lab in data["labs"].values() for r in lab.values()]
    muts = [m for lab in data["mutants"].values() for m in lab]
    good = sum(r["as_expected"] for r in rows) + sum(m["as_expected"] for m in muts)
    lines = [
        "# Grading validation",
        "",
        "The grader run on known-good, known-bad and deliberately wrong submissions (negative controls) of",
        "every lab, with the score and flags each must get. Made by `python bench/bench_validation.py`",
        "(it explains what it grades, and how); rendered from `grading/validation.json`.",
        "`tests/unit/test_validation.py` fails while a crafted kind or a mutant is missing here, when a",
        "verdict is not as expected, or when what the verdicts depend on (`lab_utils`: the grader and what a lab",
        "runs; the labs' sources, parameters and grading settings; the lock; the crafted kinds; the mutants)",
        "changed since it was made. It also records each lab's graded known-good notebook: quiet, its figures,",
        "its outputs' size, and a feedback page that quotes no hidden test; and what grading Lab 1's crafted",
        "class left behind (`tests/support/class_checks.py`).",
        "",
        f"- **Made:** {', '.join(sorted({m['date'] for m in data['made'].values()}))}",
        f"- **Machine:** {', '.join(sorted({m['machine'] for m in data['made'].values()}))}",
        "- **Commit and verdict inputs** (`inputs`: the hash of `lab_utils`, the labs' sources, parameters and "
        "settings, the lock, the crafted kinds and the mutants): " + _provenance(data["made"]),
        f"- **Verdicts:** {good} of {len(rows) + len(muts)} as expected "
        f"({len(rows)} graded submissions, {len(muts)} mutants)",
        "",
        'A score is the autograded points; "flags" are the grader\'s flag kinds (timing noise, which never',
        "costs points, is listed apart). A kind joined with `+` is one submission spoilt in several cells.",
    ]
    for lab, students in data["labs"].items():
        lines += [
            "",
            f"## {lab}",
            "",
            "| submission | kinds | expected score | score | expected flags | flags | verdict |",
            "|---|---|---:|---:|---|---|---|",
        ]
        for student, r in students.items():
            flags = ", ".join(r["flags"]) or "none"
            if r["noise"]:
                flags += f" (noise: {', '.join(r['noise'])})"
            score = "–" if r["score"] is None else f"{r['score']:g} / {r['max_score']:g}"
            lines.append(
                f"| {student} | `{_cell(r['kinds'])}` | {r['expected_score']:g} | {score} | "
                f"{_cell(', '.join(r['expected_flags']) or 'none')} | {_cell(flags)} | "
                f"{'as expected' if r['as_expected'] else '**NOT AS EXPECTED**'} |"
            )
        checks = data.get("class_checks", {}).get(lab)
        if checks:
            lines += ["", "What grading the class left behind (`tests/support/class_checks.py`):", ""]
            lines += [
                f"- {name}: {'held' if not why else '**did not hold**: ' + _cell(why[:300])}"
                for name, why in checks.items()
            ]
        facts = data.get("notebooks", {}).get(lab)
        if facts:
            noisy = "quiet" if not facts["noisy_cells"] else f"**{len(facts['noisy_cells'])} noisy cell(s)**"
            lines += [
                "",
                f"The known-good submission's graded notebook: {noisy}, "
                f"{facts['figures'] - len(facts['figures_missing'])} of {facts['figures']} announced figures shown, "
                f"its largest cell's outputs {facts['largest_output_bytes'] / 1024:.0f} KiB; its feedback "
                + ("**quotes a hidden test**." if facts["feedback_quotes_hidden_tests"] else "quotes no hidden test."),
            ]
        if data["mutants"].get(lab):
            lines += [
                "",
                f"Mutants of {lab} (`tests/unit/test_mutants.py`), run against their exercise's visible checks:",
                "",
                "| exercise | mistake | caught | what the visible check says | verdict |",
                "|---|---|---|---|---|",
            ]
            for m in data["mutants"][lab]:
                lines.append(
                    f"| `{m['exercise']}` | {_cell(m['mistake'])} | {'yes' if m['caught'] else 'no'} | "
                    f"{_cell(m['message'][:160])} | {'as expected' if m['as_expected'] else '**NOT AS EXPECTED**'} |"
                )
    return "\n".join(lines) + "\n"


def merge(old: dict, graded: dict, notebooks: dict, mutated: dict, made: dict, checked: dict | None = None) -> dict:
    """``old`` with these labs' rows, mutants and provenance in their place, in the labs' order:
    each lab keeps the provenance of the run that made its rows."""
    order = layout.source_labs()

    def pick(key: str, new: dict) -> dict:
        both = {**old.get(key, {}), **new}
        return {lab: both[lab] for lab in order if lab in both}

    return {
        "made": pick("made", made),
        "labs": pick("labs", graded),
        "notebooks": pick("notebooks", notebooks),
        "mutants": pick("mutants", mutated),
        "class_checks": pick("class_checks", checked or {}),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", default="", help="comma-separated labs (default: all; the files keep the others)")
    parser.add_argument("--jobs", type=int, default=len(os.sched_getaffinity(0)), help="submissions at once")
    parser.add_argument("--render", action="store_true", help="only render VALIDATION.md from validation.json")
    args = parser.parse_args(argv)
    from lab_utils.grading.__main__ import stop_on_sigterm

    stop_on_sigterm()  # a killed validation removes its sandboxes, as the CLI does
    if args.render:
        MARKDOWN.write_text(render(json.loads(JSON.read_text())))
        print(f"wrote {MARKDOWN}")
        return 0
    labs = layout.select_labs([x for x in args.labs.split(",") if x])
    from lab_utils.grading.sandbox import cgroup_support

    if cgroup_support() is None:  # without it the limits, the private disk and IPC go unchecked
        print(
            "bench_validation: needs root and cgroups: the published validation is an isolated grader's",
            file=sys.stderr,
        )
        return 2
    t0 = time.monotonic()
    made = {"date": datetime.date.today().isoformat(), "machine": _machine(), "isolated": True}
    made["commit"] = _commit()
    made_for = {lab: made | {"inputs": inputs_hash(lab=lab)} for lab in labs}  # what is graded: as the run starts
    graded, notebooks, checked = grade(labs, args.jobs)
    mutated = mutants(labs)
    if any(inputs_hash(lab=lab) != m["inputs"] for lab, m in made_for.items()):
        print(
            "bench_validation: the grader, a lab's source or a crafted kind changed during the run: run it again",
            file=sys.stderr,
        )
        return 2
    for m in made_for.values():
        m["wall_s"] = round(time.monotonic() - t0, 1)
    old = json.loads(JSON.read_text()) if JSON.is_file() and args.labs else {"labs": {}, "mutants": {}, "made": {}}
    data = merge(old, graded, notebooks, mutated, made_for, checked)
    JSON.write_text(json.dumps(data, indent=1) + "\n")
    MARKDOWN.write_text(render(data))
    bad = (
        [f"{lab} {s}" for lab, rows in data["labs"].items() for s, r in rows.items() if not r["as_expected"]]
        + [
            f"{lab} {m['exercise']}: {m['mistake']}"
            for lab, ms in data["mutants"].items()
            for m in ms
            if not m["as_expected"]
        ]
        + [f"{lab}: {name}" for lab, checks in data["class_checks"].items() for name, why in checks.items() if why]
    )
    print(
        f"wrote {JSON} and {MARKDOWN}"
        + (f"; NOT AS EXPECTED: {', '.join(bad)}" if bad else "; every verdict as expected")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
