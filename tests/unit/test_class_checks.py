"""tests/support/class_checks.py without a graded class: a check that does not hold is recorded
with what it found, one that cannot run is recorded with its error, and every check is there."""

from __future__ import annotations

from pathlib import Path

from support import class_checks, crafted


def graded(tmp_path: Path, decoy_text: str = crafted.DECOY_TEXT) -> class_checks.Graded:
    decoy = tmp_path / "decoy.txt"
    decoy.write_text(decoy_text)
    decoy.chmod(0o640)
    restart = {"flags": [{"kind": "kernel died", "detail": "kernel died in cell 3"}]}
    return class_checks.Graded(
        tmp_path / "course", tmp_path / "subs", {class_checks.WHO["restart"]: restart}, set(), decoy, 1, "blank"
    )


def test_a_check_that_holds_says_nothing_and_one_that_does_not_says_what_it_found(tmp_path):
    decoy_check = class_checks.CHECKS["the restart attack leaves the root-owned decoy as it was"]
    assert decoy_check(graded(tmp_path)) is None
    (tmp_path / "written").mkdir()
    got = class_checks.run(graded(tmp_path / "written", "written through the link"))
    assert got["the restart attack leaves the root-owned decoy as it was"] == "the decoy's text changed"


def test_a_check_that_cannot_run_is_recorded_as_not_holding_with_its_error(tmp_path):
    got = class_checks.run(graded(tmp_path))  # no course, no results of the other students: they cannot run
    assert set(got) == set(class_checks.CHECKS)
    failed = {name: why for name, why in got.items() if why}
    assert "flags name what happened" in failed and failed["flags name what happened"].startswith("KeyError: ")
    assert all(why for name, why in got.items() if name != "the restart attack leaves the root-owned decoy as it was")


def test_every_kind_the_checks_name_is_in_the_class():
    kinds = {k for kinds in crafted.CLASS.values() for k in kinds.split("+")}
    assert set(class_checks.WHO) == kinds
    assert {
        "leaks",
        "bomb",
        "disk",
        "exits",
        "hostile",
        "snoop",
        "git",
        "restart",
        "symlink",
        "flag",
        "tampered",
    } <= kinds


def test_what_is_kept_of_a_student_is_this_labs_grading_only(tmp_path):
    """In a course that grades every lab (the validation's), a student's other labs hold their own
    solutions in their feedback, rightly: the quoting check reads this lab's grading only."""
    g = graded(tmp_path)
    lab, other = class_checks.LAB, "02_ps_async"
    for folder, name in (("autograded", "x.ipynb"), ("feedback", "x.html")):
        for which in (lab, other):
            path = g.root / folder / "ann" / which / name
            path.parent.mkdir(parents=True)
            path.write_text(f"{folder} of {which} &amp; more")
    (g.root / "results" / "ann").mkdir(parents=True)
    for which in (lab, other):
        (g.root / "results" / "ann" / f"{which}.json").write_text(f"result of {which}")
    kept = g.kept_text("ann")
    assert kept.count(lab) == 3 and other not in kept and "& more" in kept
