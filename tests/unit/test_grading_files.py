"""What a submission controls, read by the grader (often root) without being followed elsewhere;
the grader's locks; and the outputs that may not be kept (issue 48)."""

from __future__ import annotations

import base64
import os
import stat
import threading

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from lab_utils.grading import locks, quotes, results, safefiles


# ---------------------------------------------------------------- a submission's folder
@pytest.fixture
def folder(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("root's own\n")
    sub = tmp_path / "sub"
    (sub / "runs").mkdir(parents=True)
    (sub / "lab.ipynb").write_text("{}")
    (sub / "runs" / "log.txt").write_text("ok")
    (sub / "notes.txt").symlink_to(secret)
    (sub / "runs" / "dir-link").symlink_to(tmp_path)
    os.mkfifo(sub / "pipe")
    return sub


def test_only_plain_files_are_copied_and_links_fifos_are_refused(folder, tmp_path):
    refused = safefiles.copy_plain(folder, tmp_path / "copy")
    assert sorted(p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*") if p.is_file()) == [
        "lab.ipynb", "runs/log.txt"]  # fmt: skip
    assert sorted(refused) == [("notes.txt", "a link"), ("pipe", "a special file"), ("runs/dir-link", "a link")]
    flags = safefiles.refused_flags(refused)
    assert {f["kind"] for f in flags} == {"symlink refused", "file refused"}
    with pytest.raises(OSError):
        safefiles.plain_files(folder / "notes.txt")  # a folder that is a link is no folder


def test_a_folder_hash_reads_no_link_and_changes_with_what_it_holds(folder):
    first = safefiles.hash_plain(folder)  # the FIFO did not block it, the link was not read
    (folder / "runs" / "log.txt").write_text("changed")
    assert safefiles.hash_plain(folder) != first


def test_read_plain_refuses_a_link_and_caps_what_it_reads(folder):
    assert safefiles.read_plain(folder / "notes.txt", 100) is None
    assert safefiles.read_plain(folder / "pipe", 100) is None
    assert safefiles.read_plain(folder / "runs" / "log.txt", 100) == b"ok"
    assert safefiles.read_plain(folder / "runs" / "log.txt", 1) == 2  # too big: its size


def test_a_handed_in_time_that_is_a_link_is_not_evidence(folder, tmp_path):
    from lab_utils.grading.late import handed_in_at

    when = tmp_path / "when.txt"
    when.write_text("2026-11-02 01:00:00 UTC")
    (folder / "timestamp.txt").symlink_to(when)
    assert handed_in_at(folder) is None
    (folder / "timestamp.txt").unlink()
    (folder / "timestamp.txt").write_text("2026-11-02 01:00:00 UTC")
    assert handed_in_at(folder).year == 2026


def test_no_csv_cell_a_spreadsheet_would_run():
    assert results.spreadsheet_safe('=HYPERLINK("x")') == '\'=HYPERLINK("x")'
    assert [results.spreadsheet_safe(x) for x in ("-1", "+a", "@b", "\tc", "ok", 3)] == ["'-1", "'+a", "'@b", "'\tc",
                                                                                          "ok", 3]  # fmt: skip


# ---------------------------------------------------------------- locks
def test_the_lock_folder_and_files_are_the_graders_alone(tmp_path, monkeypatch):
    target = tmp_path / "elsewhere"
    target.write_text("x")
    (tmp_path / "link.lock").symlink_to(target)
    with pytest.raises(locks.LockError):
        locks.open_lock(tmp_path / "link.lock")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(locks.LockError):
        locks._private(shared)
    folder = locks.lock_dir()
    st = folder.stat()
    assert st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def test_a_lock_held_elsewhere_is_waited_for_only_until_the_deadline(tmp_path):
    path = tmp_path / "timing.lock"
    holder = locks.open_lock(path)
    assert locks.acquire(holder, 0)
    other = locks.open_lock(path)
    assert not locks.acquire(other, 0.3)  # held: False once the deadline passed, never a hang
    released = threading.Timer(0.2, os.close, [holder])
    released.start()
    assert locks.acquire(other, 10)
    os.close(other)


# ---------------------------------------------------------------- what is kept
@pytest.fixture
def course(tmp_path):
    """A course of one lab with a hidden test, a solution cell and a reference script."""
    nb = new_notebook(
        cells=[
            new_code_cell("### BEGIN SOLUTION\nanswer = compute_the_secret_answer(41, 42)\n### END SOLUTION\n"),
            new_code_cell(
                "%%writefile train.py\n### BEGIN SOLUTION\nloss = reference_loss_of_the_course(x, y)\n"
                "### END SOLUTION\n"
            ),  # fmt: skip
            new_code_cell(
                "assert f(1) == 2\n### BEGIN HIDDEN TESTS\nassert f(17) == 34 and g(5) == 'a hidden one'\n"
                "### END HIDDEN TESTS\n"
            ),  # fmt: skip
            new_markdown_cell("### BEGIN SOLUTION\nThe written answer's rubric, worth two points.\n### END SOLUTION\n"),
        ]
    )
    (tmp_path / "source" / "01_x").mkdir(parents=True)
    nbformat.write(nb, tmp_path / "source" / "01_x" / "01_x.ipynb")
    return tmp_path


def test_the_courses_secrets_are_its_hidden_tests_and_its_solutions(course):
    found = quotes.course_secrets(course)
    assert found == {
        "answer = compute_the_secret_answer(41, 42)": "quoted solution",
        "loss = reference_loss_of_the_course(x, y)": "quoted reference",
        "assert f(17) == 34 and g(5) == 'a hidden one'": "quoted hidden tests",
        "The written answer's rubric, worth two points.": "quoted solution",
    }


def _graded(*texts):
    cells = []
    for text in texts:
        cell = new_code_cell("print(x)")
        cell.outputs = [new_output("stream", name="stdout", text=text)]
        cells.append(cell)
    return new_notebook(cells=cells)


@pytest.mark.parametrize(
    "shown",
    [
        "assert f(17) == 34 and g(5) == 'a hidden one'\n",  # printed as it is
        repr(["x = 1\nassert f(17) == 34 and g(5) == 'a hidden one'\n"]),  # print(In): escaped
        base64.b64encode(b"assert f(17) == 34 and g(5) == 'a hidden one'").decode(),  # encoded
        "key ab\n" + b"assert f(17) == 34 and g(5) == 'a hidden one'".hex(),  # as hex
    ],
)
def test_an_output_that_quotes_a_hidden_test_in_any_form_is_not_kept(course, shown):
    nb = _graded("fine\n", shown)
    flags = quotes.scrub(nb, quotes.course_secrets(course))
    assert flags == [{"kind": "quoted hidden tests", "detail": "cell 1: not kept, not in feedback"}]
    assert nb.cells[0].outputs[0]["text"] == "fine\n"
    assert nb.cells[1].outputs[0]["text"] == quotes.NOTICE.format(what="the hidden tests")


def test_a_student_may_print_their_own_code_but_never_a_hidden_test_or_a_secret(course):
    secret = quotes.course_secrets(course)
    own = {"answer = compute_the_secret_answer(41, 42)", "assert f(17) == 34 and g(5) == 'a hidden one'"}
    nb = _graded("answer = compute_the_secret_answer(41, 42)\n", "assert f(17) == 34 and g(5) == 'a hidden one'\n",
                 "token tok-12345678\n")  # fmt: skip
    flags = quotes.scrub(nb, secret, ["tok-12345678"], own)
    assert [f["kind"] for f in flags] == ["quoted hidden tests", "quoted secret"]
    assert nb.cells[0].outputs[0]["text"].startswith("answer =")
    assert quotes.secret_values({"API_TOKEN": "tok-12345678", "HOME": "/home/someone", "KEY": "short"}) == [
        "tok-12345678"
    ]


def test_what_a_notebook_left_in_its_sandboxs_shared_memory_is_flagged(tmp_path):
    from lab_utils.grading.worker import _shared_left

    disk = tmp_path / "disk"
    for name in ("shm", "lock"):
        (disk / name).mkdir(parents=True)
    ipc = tmp_path / "sysvipc"
    ipc.mkdir()
    header = "       key      shmid perms   size  cpid\n"
    (ipc / "shm").write_text(header)
    (ipc / "sem").write_text(header)
    (disk / "shm" / "vader_segment.host.1.0").write_text("")  # a killed MPI job's: Open MPI's own
    assert _shared_left(disk, ipc) == []
    (disk / "shm" / "note").write_text("x")
    (disk / "lock" / "held").write_text("")
    (ipc / "shm").write_text(header + "         0         7   600   4096  123\n")
    (flag,) = _shared_left(disk, ipc)
    assert flag["kind"] == "shared memory left"
    assert "/dev/shm/note, /run/lock/held, System V shared memory segment 7" in flag["detail"]
