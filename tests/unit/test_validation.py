"""The published grading validation (issue 53): ``grading/VALIDATION.md``, rendered from
``grading/validation.json`` by ``bench/bench_validation.py``, covers every crafted kind of the
tests and every mutant of the mutation check, on every lab; every verdict is as expected; and it
was made with the grading code as it is now (a change to ``lab_utils/grading`` means running the
bench again)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from support import crafted

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


def test_it_covers_every_mutant(data):
    check = walkthrough.load_mutation_check()
    for lab in check.LABS:
        want = {(m.solution, m.name) for m in lab.mutants}
        got = {(r["exercise"], r["mistake"]) for r in data["mutants"].get(lab.name, [])}
        assert want == got, f"{lab.name}: mutants missing {want - got}, or gone {got - want}: run the bench"


def test_every_verdict_is_as_expected(data):
    bad = [f"{lab} {s}: {r}" for lab, rows in data["labs"].items() for s, r in rows.items() if not r["as_expected"]]
    bad += [f"{lab} {m}" for lab, ms in data["mutants"].items() for m in ms if not m["as_expected"]]
    assert bad == []


def test_it_was_made_with_the_grading_code_as_it_is(bench, data):
    assert data["grading_code"] == bench.grading_code_hash(), (
        "lab_utils/grading changed since grading/VALIDATION.md was made: python bench/bench_validation.py"
    )
    assert data["date"] and data["machine"] and data["commit"]
