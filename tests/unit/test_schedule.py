"""The term's schedule (grading/course.yml, lab_utils.grading.schedule): one file every date of the
course comes from. Change a due date there, and the hand-in service (as the single-machine Hub's
configuration starts it), the course map and the LMS export all take it, with no second place to
type it (issue 53)."""

from __future__ import annotations

import os
import runpy
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from lab_utils.grading import lms, schedule
from lab_utils.grading.late import DueFile

ROOT = Path(__file__).resolve().parents[2]
NB = b'{"cells": [], "nbformat": 4, "metadata": {}, "nbformat_minor": 5}'
LABS = sorted(p.name for p in (ROOT / "labs").iterdir() if p.is_dir())


def _touch(path: Path, text: str) -> None:
    """Write ``text`` as an editor would, and make the change visible however coarse the clock."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def _with_due(text: str, lab: str, when: str) -> str:
    changed = text.replace(f"  {lab}:\n", f"  {lab}:\n    due: {when}\n", 1)
    assert changed != text, lab
    return changed


def test_the_course_schedule_covers_every_lab_in_order_and_its_variants_are_shorter():
    term = schedule.load(schedule.SCHEDULE)
    assert term.labs == LABS and term.variant == "full"
    first = term.entry("01")
    assert first.release == datetime(2027, 2, 1, 9, 0, tzinfo=first.release.tzinfo)
    assert first.due.isoformat() == "2027-02-05T23:59:00+01:00" and first.due.strftime("%A") == "Friday"
    assert all(a.due < b.release for a, b in zip(term.entries, term.entries[1:], strict=False))  # one lab at a time
    assert all(e.lecture for e in term.entries)
    seven = schedule.load(schedule.SCHEDULE, "7-weeks")
    assert seven.weeks() == 7 < term.weeks() and seven.labs == LABS
    without = schedule.load(schedule.SCHEDULE, "without-lab-6")
    assert (
        without.labs == [lab for lab in LABS if lab != "06_communication"] and "06_communication" not in without.due()
    )
    data_parallel = schedule.load(schedule.SCHEDULE, "without-lab-7")  # the course before Lab 7 joined it
    assert data_parallel.labs == LABS[:-1] and data_parallel.weeks() == 11
    assert set(term.variants) == {"full", "7-weeks", "without-lab-6", "without-lab-7"}


def test_one_setting_picks_the_variant_and_a_lab_it_leaves_out_is_closed_for_hand_in(tmp_path):
    from lab_utils.hub.store import HandInError, Store

    path = tmp_path / "course.yml"
    text = schedule.SCHEDULE.read_text()
    _touch(path, text)
    store = Store(tmp_path / "store", DueFile(path))
    assert sorted(store.due) == LABS
    _touch(path, text.replace("variant: full", "variant: without-lab-6"))
    assert "06_communication" not in store.due
    with pytest.raises(HandInError, match="no lab '06_communication' is open"):
        store.hand_in("alice", "06_communication", NB)


@pytest.mark.parametrize(
    "change, error",
    [
        (("start: 2027-02-01", "start: 2027-02-03"), "is a Wednesday"),
        (("variant: full", "variant: 4-weeks"), "variant '4-weeks' is not one of"),
        (('timezone: "+01:00"', "timezone: CET"), "timezone is an offset"),
        (("due: Friday 23:59", "due: Fri"), "a day and a time"),
        (("    week: 1\n", "    week: 0\n"), "01_single_node: week and weeks are whole numbers"),
        (("    reading: CS 744\n", "    reading: CS 744\n    points: 3\n"), "unknown keys ['points']"),
        (("  02_ps_async:\n", "  02_ps_async:\n    due: 2027-02-19T23:59\n"), "02_ps_async: due needs a time zone"),
        (
            ("due: Friday 23:59", "due: Monday 08:00"),
            "01_single_node: due 2027-02-01T08:00:00+01:00 is not after its release",
        ),
        (("  without-lab-6:\n", "  without-lab-6:\n    08_fsdp: null\n"), "labs the term does not have"),
    ],
)
def test_a_bad_schedule_is_refused_naming_the_file_and_the_entry(tmp_path, change, error):
    path = tmp_path / "course.yml"
    text = schedule.SCHEDULE.read_text()
    assert change[0] in text
    path.write_text(text.replace(change[0], change[1], 1))
    with pytest.raises(ValueError, match=str(path)) as exc:
        (
            schedule.load(path, "without-lab-6")
            if "08_" in change[1]
            else DueFile(path)  # the service refuses to start on it
        )
    assert error in str(exc.value)


def test_a_bad_edit_of_the_schedule_keeps_the_last_good_due_times(tmp_path):
    path = tmp_path / "course.yml"
    text = schedule.SCHEDULE.read_text()
    _touch(path, text)
    due = DueFile(path)
    before = due.read()
    _touch(path, text.replace("start: 2027-02-01", "start: next monday"))
    assert due.read() == before and "start is the Monday of week 1" in due.problem


def _single_machine_service(monkeypatch, tmp_path, due_file: Path):
    """The hand-in service's store as deploy/single-machine/jupyterhub_config.py starts it."""
    from traitlets.config import Config

    from lab_utils.hub import service

    config = Config()
    monkeypatch.setenv("LABS_CLASS_DIR", str(tmp_path / "no-class"))
    monkeypatch.setenv("LABS_HANDIN_USER", "")
    monkeypatch.setenv("LABS_DUE_FILE", str(due_file))
    monkeypatch.setenv("LABS_HANDIN_STORE", str(tmp_path / "store"))
    runpy.run_path(str(ROOT / "deploy" / "single-machine" / "jupyterhub_config.py"), {"get_config": lambda: config})
    (handin,) = [s for s in config.JupyterHub.services if s["name"] == "handin"]
    assert handin["command"][1:3] == ["-m", "lab_utils.hub.service"]
    return service.make_store(service._parser().parse_args(handin["command"][3:]))


def test_a_due_date_changed_in_the_schedule_reaches_the_service_the_course_map_and_the_lms(monkeypatch, tmp_path):
    course = tmp_path / "course.yml"
    _touch(course, schedule.SCHEDULE.read_text())
    store = _single_machine_service(monkeypatch, tmp_path, course)
    assert store.due == schedule.load(course).due()
    new = "2027-03-01T12:00:00+01:00"
    _touch(course, _with_due(schedule.SCHEDULE.read_text(), "02_ps_async", new))
    # the hand-in service, as the Hub started it (no restart)
    assert store.due["02_ps_async"].isoformat() == new
    # the course map
    term = schedule.load(course)
    readme = schedule.render((ROOT / "labs" / "README.md").read_text(), term)
    row = next(line for line in readme.splitlines() if line.startswith("| 2–3 | 2 |"))
    assert row.endswith("| Mon 2027-02-08 | Mon 2027-03-01 12:00 (UTC+01:00) |"), row
    # the LMS export: the column names the due date, and a hand-in between the two due times is on time now
    arrived = datetime(2027, 2, 25, 12, 0)  # nbgrader's timestamps: naive UTC
    book = [
        {"student_id": "ann", "lab": "02_ps_async", "score": 20.0, "max_score": 30.0, "status": "submitted"}
        | {"timestamp": arrived},
        {"student_id": "ann", "lab": "06_communication", "score": 9.0, "max_score": 30.0, "status": "submitted"}
        | {"timestamp": datetime(2027, 4, 17, 8, 0)},
    ]
    before = lms.rows("moodle", book, tmp_path, schedule.load(schedule.SCHEDULE))
    after = lms.rows("moodle", book, tmp_path, term)
    assert before[0][1] == "02_ps_async (max 30, due 2027-02-19)" and before[1][-1] == "02_ps_async 06_communication"
    assert after[0][1] == "02_ps_async (max 30, due 2027-03-01)" and after[1][-1] == "06_communication"
    canvas = lms.rows("canvas", book, tmp_path, term)
    assert canvas[0][5:] == ["02_ps_async", "06_communication", "Late"]  # Canvas matches its assignments by name
    assert canvas[2][-1] == "06_communication"
    # a shorter term: the lab it leaves out has no column
    cut = lms.rows("canvas", book, tmp_path, schedule.load(course, "without-lab-6"))
    assert cut[0][5:] == ["02_ps_async", "Late"]
    assert arrived.replace(tzinfo=UTC) > schedule.load(schedule.SCHEDULE).entry("02").due


def test_the_course_map_shows_the_course_schedule(capsys):
    from lab_utils.grading.__main__ import main

    assert main(["schedule", "--check"]) == 0, capsys.readouterr().out
    text = (ROOT / "labs" / "README.md").read_text()
    for entry in schedule.load(schedule.SCHEDULE).entries:
        assert f"| {entry.number} | {entry.lecture}" in text


def test_the_settings_read_the_schedule_and_a_class_copy_replaces_it(tmp_path):
    """grading/settings.yml's due_file is the schedule; the class setup's copy takes its place."""
    raw = yaml.safe_load((ROOT / "grading" / "settings.yml").read_text())
    assert (ROOT / "grading" / raw["due_file"]).resolve() == schedule.SCHEDULE
    assert schedule.course_schedule(ROOT / "grading") == schedule.SCHEDULE
    root = tmp_path / "grading"
    root.mkdir()
    copy = tmp_path / "etc" / "course.yml"
    copy.parent.mkdir()
    copy.write_text(schedule.SCHEDULE.read_text())
    (root / "settings.yml").write_text(f"due_file: {copy}\n")
    assert schedule.course_schedule(root) == copy
    (root / "settings.yml").write_text("due_file: due.yml\n")
    (root / "due.yml").write_text("01_single_node: null\n")  # a due file, not a schedule
    assert schedule.course_schedule(root) == root / "course.yml"
