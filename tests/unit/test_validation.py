"""The published grading validation (issue 53): ``grading/VALIDATION.md``, rendered from
``grading/validation.json`` by ``bench/bench_validation.py``, covers every crafted kind of the
tests and every mutant of the mutation check, on every lab; its expectations are the plan's as it
is now and every verdict, recomputed from the figures, is as expected; it was made by an isolated
grader, with what the verdicts depend on as it is now (a change to the grader, a lab's source or
grading settings, a crafted kind or a mutant means running the bench again)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from support import class_checks, crafted

from lab_utils.grading import layout, walkthrough

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("labs_bench_validation", ROOT / "bench" / "bench_validation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data(bench):
    return json.loads(bench.JSON.read_text())


def test_validation_md_is_rendered_from_its_json(bench, data):
    assert bench.MARKDOWN.read_text() == bench.render(data), "python bench/bench_validation.py --render"


def test_it_covers_every_lab_and_every_crafted_kind(data):
    assert list(data["labs"]) == layout.source_labs()
    kinds = {k for rows in data["labs"].values() for r in rows.values() for k in r["kinds"].split("+")}
    assert set(crafted.KINDS) - kinds == set(), "crafted kinds the validation never graded: run the bench"
    for lab, rows in data["labs"].items():
        plan = crafted.validation_class(lab, crafted.test_points(lab))
        assert set(rows) == set(plan), f"{lab}: the validation class changed since the bench ran"
        assert {rows[s]["kinds"] for s in rows} == {kinds for kinds, _, _ in plan.values()}, lab
        assert rows.get("release", {}).get("kinds") == "blank" and "correct" in rows, lab


#: what the graded known-good notebook of a lab must print about the scripts it compares with: the
#: instructor's, from grading/reference/ (the sandbox's read-only view of it), never a student's
#: or a stale copy
REFERENCE_LINES = {
    "03_ps_sync": r"^async runs use /\S*/reference/02_ps_async/train_async\.py$",
    "04_allreduce": r"^sync PS runs use /\S*/reference/03_ps_sync/train_sync\.py$",
}


def test_every_labs_graded_solution_is_quiet_shows_its_figures_and_its_feedback_quotes_no_hidden_test(data):
    """What the suite checked by grading each lab's solution itself, recorded by the bench from
    the graded known-good notebook (tests/support/graded.py): the suite grades none (issue 52's
    suite time), the validation grades every one."""
    from lab_utils.grading.execute import CapOutputBytes

    cap = CapOutputBytes.max_bytes.default_value
    assert list(data.get("notebooks", {})) == layout.source_labs(), "python bench/bench_validation.py"
    for lab, facts in data["notebooks"].items():
        assert facts["noisy_cells"] == [], (lab, facts["noisy_cells"])
        assert facts["tensorflow_imported"], lab
        assert facts["figures"] >= 1 and facts["figures_missing"] == [], (lab, facts)
        # an honest cell stays far from the grader's output cap (a cut is flagged 'huge output cut')
        assert facts["largest_output_bytes"] < cap / 3, (lab, facts["largest_output_bytes"])
        assert facts["feedback_pages"] >= 1 and facts["feedback_shows_visible_tests"], (lab, facts)
        assert not facts["feedback_quotes_hidden_tests"], lab
        if lab in REFERENCE_LINES:
            assert any(re.match(REFERENCE_LINES[lab], x) for x in facts["reference_lines"]), (lab, facts)


@pytest.mark.parametrize("check", list(class_checks.CHECKS))
def test_grading_lab1s_crafted_class_left_what_it_must(data, check):
    """What the suite checked by grading Lab 1's crafted class itself (5 minutes: issue 57),
    checked by the bench right after it grades the same class (tests/support/class_checks.py),
    within the inputs' hash: flags that say what happened, nothing read, quoted or left running,
    the decoy as it was, every result kept."""
    checks = data.get("class_checks", {}).get(crafted.CLASS_LAB)
    assert checks is not None and set(checks) == set(class_checks.CHECKS), "python bench/bench_validation.py"
    assert checks[check] == "", f"{check}: {checks[check]}"


def test_it_covers_every_mutant(data):
    check = walkthrough.load_mutation_check()
    for lab in check.LABS:
        want = {(m.solution, m.name) for m in lab.mutants}
        got = {(r["exercise"], r["mistake"]) for r in data["mutants"].get(lab.name, [])}
        assert want == got, f"{lab.name}: mutants missing {want - got}, or gone {got - want}: run the bench"


def test_every_expectation_is_the_plans_and_every_verdict_holds(data):
    """Recomputed here, not read: the expected tests lost and flags from the crafted plan as it is
    now, the expected score from the lab's points, and the verdict from the recorded figures."""
    bad = []
    for lab, rows in data["labs"].items():
        points = crafted.test_points(lab)
        for student, (_kinds, lost, flags) in crafted.validation_class(lab, points).items():
            r = rows[student]
            want = {
                "expected_lost": sorted(lost),
                "expected_flags": sorted(flags),
                "expected_score": sum(points.values()) - sum(points[g] for g in lost),
            }
            recorded = {k: r[k] for k in want}
            if recorded != want:
                bad.append(f"{lab} {student}: recorded {recorded}, the plan now {want}")
            holds = (
                r["status"] == "graded"
                and r["score"] == r["expected_score"]
                and r["lost"] == r["expected_lost"]
                and r["flags"] == r["expected_flags"]
            )
            if not (holds and r["as_expected"]):
                bad.append(f"{lab} {student}: {r}")
    bad += [f"{lab} {m}" for lab, ms in data["mutants"].items() for m in ms if not (m["as_expected"] and m["caught"])]
    assert bad == []


def test_it_was_made_by_an_isolated_grader_with_the_inputs_as_they_are(bench, data):
    assert set(data["made"]) == set(data["labs"])
    for lab, made in data["made"].items():
        assert made["isolated"] and made["date"] and made["machine"] and made["commit"], (lab, made)
        assert made["inputs"] == bench.inputs_hash(lab=lab), (
            f"{lab}: the grader, a lab's source or settings, a crafted kind or a mutant changed since "
            "grading/VALIDATION.md was made: python bench/bench_validation.py (as root)"
        )


def test_the_inputs_hash_sees_lab_utils_the_lock_and_each_labs_own_source_and_not_the_slides(bench, tmp_path):
    """A change to the grader, to what a graded notebook runs (the training code) or to the lock
    dates every lab's validation, one to a lab's source that lab's; one to the lecture decks' code none."""
    import shutil

    for name in bench._input_files():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    (tmp_path / "lab_utils/grading/slides.py").write_text("# lecture material\n")
    before = bench.inputs_hash(tmp_path)
    assert bench.inputs_hash(tmp_path) == before
    (tmp_path / "lab_utils/grading/slides.py").write_text("# lecture material, changed\n")
    assert bench.inputs_hash(tmp_path) == before
    for package in bench.DRAFT_PACKAGES:
        draft = tmp_path / package / "new.py"  # a draft lab's code: no graded lab runs it
        draft.parent.mkdir(parents=True, exist_ok=True)
        draft.write_text("# the draft, changed\n")
        assert bench.inputs_hash(tmp_path) == before
    modelpar = tmp_path / "lab_utils/training/modelpar/zero.py"  # Lab 7's code, since it joined: every lab
    modelpar.write_text(modelpar.read_text() + "\n# changed\n")
    assert bench.inputs_hash(tmp_path) != before
    before = bench.inputs_hash(tmp_path)
    per_lab = {lab: bench.inputs_hash(tmp_path, lab=lab) for lab in ("01_single_node", "06_communication")}
    source = tmp_path / "grading/source/06_communication/06_communication.ipynb"
    source.write_text(source.read_text() + "\n")
    assert bench.inputs_hash(tmp_path) != before  # one lab's source: that lab's rows are dated, not the others'
    assert bench.inputs_hash(tmp_path, lab="06_communication") != per_lab["06_communication"]
    assert bench.inputs_hash(tmp_path, lab="01_single_node") == per_lab["01_single_node"]
    params = tmp_path / "labs/params.yml"  # one lab's parameters: that lab's rows, not the others'
    params.write_text(params.read_text().replace("COMPRESSION_STEPS:", "COMPRESSION_STEPS: 7\n    X_UNUSED:", 1))
    assert bench.inputs_hash(tmp_path, lab="06_communication") != per_lab["06_communication"]
    assert bench.inputs_hash(tmp_path, lab="01_single_node") == per_lab["01_single_node"]
    assert bench.inputs_hash(tmp_path) != before
    for shared in ("lab_utils/grading/batch.py", "lab_utils/training/ps/task.py", "requirements/constraints.txt"):
        path = tmp_path / shared  # the grader, what a graded notebook runs, the lock: every lab
        path.write_text(path.read_text() + "\n# changed\n")
        assert bench.inputs_hash(tmp_path) != before, shared
        assert bench.inputs_hash(tmp_path, lab="01_single_node") != per_lab["01_single_node"], shared
        per_lab["01_single_node"] = bench.inputs_hash(tmp_path, lab="01_single_node")


def test_a_draft_labs_package_is_no_graded_labs_import(bench):
    """Its code is out of the inputs (a change to it dates no lab) only while no graded lab, and
    nothing else in lab_utils, imports it."""
    import re as regex

    for package in bench.DRAFT_PACKAGES:
        dotted = package.rstrip("/").replace("/", ".")
        users = [
            str(f.relative_to(ROOT))
            for base in ("lab_utils", "grading/source")
            for f in (ROOT / base).rglob("*")
            if f.suffix in (".py", ".ipynb")
            and not str(f.relative_to(ROOT)).startswith(package)
            and regex.search(rf"\b{regex.escape(dotted)}\b|\bimport {dotted.rsplit('.', 1)[1]}\b", f.read_text())
        ]
        assert users == [], f"{package} is used by {users}: take it out of DRAFT_PACKAGES"
        assert (ROOT / package).is_dir(), package
