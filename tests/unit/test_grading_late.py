"""Late hand-ins and the LMS export: a lab's due time in grading/settings.yml against the
arrival time beside the submission (timestamp.txt, from the hand-in service's clock); the
settings refuse a due time without a zone; Canvas's and Moodle's gradebook CSVs have a column
per lab, the points possible, empty cells for what was not handed in, and the late labs."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from lab_utils.grading import lms
from lab_utils.grading.late import handed_in_at, late_flag, parse_due
from lab_utils.grading.settings import load_settings

DUE = parse_due("2026-12-04T23:59:00+01:00")


def _submission(tmp_path, stamp: str | None):
    folder = tmp_path / "alice" / "02_ps_async"
    folder.mkdir(parents=True)
    if stamp is not None:
        (folder / "timestamp.txt").write_text(stamp)
    return folder


@pytest.mark.parametrize(
    "stamp, detail",
    [
        ("2026-12-05 01:12:00.000000 UTC", "handed in 2 h 13 min after the due time (2026-12-04 23:59 +01:00)"),
        ("2026-12-07 00:00:00 UTC", "handed in 2 d 1 h 1 min after the due time (2026-12-04 23:59 +01:00)"),
        ("2026-12-04 22:59:30.5 UTC", "handed in 30 s after the due time (2026-12-04 23:59 +01:00)"),
    ],
)
def test_a_hand_in_after_the_due_time_is_flagged_with_how_late(tmp_path, stamp, detail):
    flag = late_flag(_submission(tmp_path, stamp), DUE)
    assert flag["kind"] == "late" and flag["detail"] == detail and flag["late_s"] > 0


@pytest.mark.parametrize("stamp", ["2026-12-04 22:59:00.000000 UTC", None, "not a time"])
def test_on_time_no_timestamp_or_no_due_time_is_not_late(tmp_path, stamp):
    folder = _submission(tmp_path, stamp)
    assert late_flag(folder, DUE) is None
    assert late_flag(folder, None) is None


def test_nbgraders_own_timestamps_read_as_utc(tmp_path):
    folder = _submission(tmp_path, "2026-12-05 00:00:00.000000")  # naive: nbgrader writes UTC
    assert handed_in_at(folder) == datetime(2026, 12, 5, tzinfo=UTC)


def test_settings_take_a_due_time_with_a_zone_only(tmp_path):
    good = tmp_path / "good.yml"
    good.write_text("labs:\n  02_ps_async:\n    due: 2026-12-04T23:59:00+01:00\n")
    assert load_settings(good)["labs"]["02_ps_async"]["due"] == "2026-12-04T23:59:00+01:00"
    assert load_settings(good)["defaults"]["due"] is None
    bad = tmp_path / "bad.yml"
    bad.write_text("labs:\n  02_ps_async:\n    due: '2026-12-04 23:59'\n")
    with pytest.raises(ValueError, match=r"labs.02_ps_async: due needs a time zone"):
        load_settings(bad)
    bad.write_text("labs:\n  02_ps_async:\n    due: friday\n")
    with pytest.raises(ValueError, match="due must be ISO 8601"):
        load_settings(bad)


def test_lms_csvs_have_a_column_per_lab_points_possible_and_the_late_labs(tmp_path):
    book = [
        {"student_id": "alice", "lab": "01_single_node", "score": 18.5, "max_score": 20.0, "status": "submitted"},
        {"student_id": "alice", "lab": "02_ps_async", "score": 25.0, "max_score": 30.0, "status": "submitted"},
        {"student_id": "bob", "lab": "01_single_node", "score": 20.0, "max_score": 20.0, "status": "submitted"},
        {"student_id": "bob", "lab": "02_ps_async", "score": "", "max_score": 30.0, "status": "missing"},
    ]
    record = tmp_path / "results" / "alice" / "02_ps_async.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"flags": [{"kind": "late", "detail": "handed in 5 min after ..."}]}))
    canvas = lms.rows("canvas", book, tmp_path)
    assert canvas[0] == [
        "Student",
        "ID",
        "SIS User ID",
        "SIS Login ID",
        "Section",
        "01_single_node",
        "02_ps_async",
        "Late",
    ]
    assert canvas[1] == ["Points Possible", "", "", "", "", "20", "30", ""]
    assert canvas[2] == ["", "", "", "alice", "", "18.5", "25", "02_ps_async"]
    assert canvas[3] == ["", "", "", "bob", "", "20", "", ""]  # not handed in: empty, not 0
    moodle = lms.rows("moodle", book, tmp_path)
    assert moodle[0] == ["username", "01_single_node (max 20)", "02_ps_async (max 30)", "late"]
    assert moodle[1:] == [["alice", "18.5", "25", "02_ps_async"], ["bob", "20", "", ""]]
    with pytest.raises(ValueError, match="lms must be one of"):
        lms.rows("blackboard", book, tmp_path)
