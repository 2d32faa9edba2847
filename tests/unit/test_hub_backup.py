"""The class's backup: every hand-in (checked against its receipt) and the gradebook come back
from the archive, owned as before; a restore never deletes what it replaces."""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile

import pytest
from nbgrader.api import Gradebook

from lab_utils.hub import backup
from lab_utils.hub.__main__ import main
from lab_utils.hub.store import Store


@pytest.fixture(autouse=True)
def _alembic_on_path(monkeypatch):  # nbgrader runs it to make a gradebook
    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")


NB = json.dumps({"cells": [], "nbformat": 4, "metadata": {}, "nbformat_minor": 5})


def _class(tmp_path):
    store = Store(tmp_path / "srv" / "handin", {"01_single_node": None, "02_ps_async": None})
    for i, student in enumerate(("alice", "bob", "学生")):
        for lab in ("01_single_node", "02_ps_async"):
            store.hand_in(student, lab, NB.replace("[]", f'[{{"cell_type": "raw", "source": "{i}"}}]').encode())
    store.hand_in("alice", "01_single_node", NB.encode())  # a second hand-in: both are kept
    store.put_feedback("alice", "01_single_node", "01_single_node.html", b"<p>9/10</p>")
    course = tmp_path / "grading"
    course.mkdir()
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.add_assignment("01_single_node")
        gb.add_student("alice")
    return store, course


def _students_in(course):
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        return [s.id for s in gb.students]


def test_a_backup_restores_every_hand_in_and_the_gradebook(tmp_path, capsys):
    store, course = _class(tmp_path)
    before = backup.hand_ins_of(store.root)
    assert len(before) == 7
    assert main(["backup", "--store", str(store.root), "--course", str(course), str(tmp_path / "bk")]) == 0
    (archive,) = (tmp_path / "bk").glob("labs-*.tar.gz")
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600  # it holds every student's work
    assert "backed up 7 hand-in(s) and the gradebook" in capsys.readouterr().out
    with tarfile.open(archive) as tar:
        assert not [n for n in tar.getnames() if "incoming" in n]

    store.remove()  # the disk is lost
    (course / "gradebook.db").unlink()
    assert main(["restore", str(archive), "--store", str(store.root), "--course", str(course)]) == 0
    assert backup.hand_ins_of(store.root) == before
    assert Store(store.root, store.due).feedback("alice", "01_single_node") == {"01_single_node.html": b"<p>9/10</p>"}
    assert len(Store(store.root, store.due).hand_ins("alice", "01_single_node")) == 2
    assert _students_in(course) == ["alice"]
    assert stat.S_IMODE(store.root.stat().st_mode) == 0o700


def test_a_restore_refuses_a_store_with_hand_ins_and_keeps_what_it_replaces(tmp_path, capsys):
    store, course = _class(tmp_path)
    archive = backup.backup(store.root, course, tmp_path / "bk")
    store.hand_in("bob", "02_ps_async", NB.encode())  # after the backup
    args = ["restore", str(archive), "--store", str(store.root), "--course", str(course)]
    assert main(args) == 1
    assert "already holds hand-ins" in capsys.readouterr().err
    try:  # the store belongs to the hand-in service's account: the restored one too
        os.chown(store.root, 65534, 65534)
        owner = 65534
    except PermissionError:
        owner = os.geteuid()
    assert main([*args, "--replace"]) == 0
    (aside,) = tmp_path.glob("srv/handin.before-restore-*")
    assert len(backup.hand_ins_of(aside)) == 8 and len(backup.hand_ins_of(store.root)) == 7
    assert {p.stat().st_uid for p in [store.root, *store.root.rglob("*")]} == {owner}
    assert list(course.glob("gradebook.db.before-restore-*"))


def test_a_hand_in_that_differs_from_its_receipt_is_named(tmp_path):
    store, course = _class(tmp_path)
    (victim,) = list(store.root.glob("submitted/bob/02_ps_async/*/02_ps_async.ipynb"))
    victim.write_text("{}")
    with pytest.raises(backup.BackupError, match=f"{victim} does not match its receipt"):
        backup.backup(store.root, course, tmp_path / "bk")
    assert not list((tmp_path / "bk").glob("*")) if (tmp_path / "bk").exists() else True
