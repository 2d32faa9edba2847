"""One due time per lab, from one file, read by the hand-in service and the grader alike: the
receipt's LATE, the grades' late flag and the LMS's Late column cannot disagree, and a new due
time needs no restart."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime, timedelta

import pytest

from lab_utils.grading.late import DueFile, late_flag, parse_due
from lab_utils.grading.settings import grading_settings
from lab_utils.hub.store import HandInError, Store

NB = json.dumps({"cells": [], "nbformat": 4, "metadata": {}, "nbformat_minor": 5}).encode()


def _write(path, text):
    """Write ``text`` as an editor would, and make the change visible however coarse the clock."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))


def test_the_due_file_is_read_again_when_it_changes_and_a_bad_edit_keeps_the_last_good_times(tmp_path, caplog):
    path = tmp_path / "due.yml"
    _write(path, "01_single_node: 2026-12-04T23:59:00+01:00\n02_ps_async: null\n")
    due = DueFile(path)
    assert due.read() == {"01_single_node": parse_due("2026-12-04T23:59:00+01:00"), "02_ps_async": None}
    _write(path, "01_single_node: 2026-12-05T23:59:00+01:00\n")
    assert due.read() == {"01_single_node": parse_due("2026-12-05T23:59:00+01:00")}
    with caplog.at_level(logging.ERROR):
        _write(path, "01_single_node: tomorrow\n")
        assert due.read() == {"01_single_node": parse_due("2026-12-05T23:59:00+01:00")}
    assert "01_single_node: due must be ISO 8601" in due.problem and "last good" in caplog.text
    for bad, why in (("2_lab: null\n", "lab names look like"), ("01_single_node: 2026-12-05T23:59\n", "time zone")):
        _write(path, bad)
        with pytest.raises(ValueError, match=why):
            DueFile(path)  # a service started on a bad file does not start


def test_the_receipt_and_the_grader_agree_on_late_and_a_new_due_time_needs_no_restart(tmp_path):
    now = datetime.now(UTC)
    due_path = tmp_path / "due.yml"
    _write(due_path, f"01_single_node: {(now - timedelta(hours=1)).isoformat()}\n02_ps_async: null\n")
    settings = tmp_path / "settings.yml"
    settings.write_text("due_file: due.yml\nlabs:\n  01_single_node:\n    cpus: 1.0\n")
    store = Store(tmp_path / "store", DueFile(due_path))

    late = store.hand_in("alice", "01_single_node", NB)
    assert late.late
    _write(due_path, f"01_single_node: {(now + timedelta(days=1)).isoformat()}\n02_ps_async: null\n")
    on_time = store.hand_in("bob", "01_single_node", NB)  # the same service, the new due time
    assert not on_time.late
    store.collect("01_single_node", tmp_path / "submitted")
    due = parse_due(grading_settings("01", settings)["due"])  # what the grader reads
    assert grading_settings("01", settings)["cpus"] == 1.0
    assert late_flag(tmp_path / "submitted" / "alice" / "01_single_node", due) is None  # now on time for all
    _write(due_path, f"01_single_node: {(now - timedelta(hours=1)).isoformat()}\n")
    due = parse_due(grading_settings("01", settings)["due"])
    assert late_flag(tmp_path / "submitted" / "alice" / "01_single_node", due)["kind"] == "late"
    with pytest.raises(HandInError, match="no lab '02_ps_async' is open"):  # closed: no longer in the file
        store.hand_in("alice", "02_ps_async", NB)
    assert store.keys("01_single_node") == ["alice", "bob"]


def test_a_due_time_in_the_settings_beside_the_due_file_is_refused(tmp_path):
    _write(tmp_path / "due.yml", "02_ps_async: 2026-12-11T23:59:00+01:00\n")
    settings = tmp_path / "settings.yml"
    settings.write_text("due_file: due.yml\nlabs:\n  02_ps_async:\n    due: 2026-12-12T23:59:00+01:00\n")
    with pytest.raises(ValueError, match=r"due is set in labs.02_ps_async and due_file"):
        grading_settings("02", settings)
    settings.write_text("due_file: due.yml\n")
    assert grading_settings("02", settings)["due"] == "2026-12-11T23:59:00+01:00"
