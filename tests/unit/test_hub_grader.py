"""The grading service without a Hub (the real one, grading a hostile hand-in from an
instructor's server: tests/process/test_hub.py): only an instructor starts a grading, one at
a time; its progress is followed; its results come back as plain files under the folder asked
for, and the batch it runs holds no Hub variable or token."""

from __future__ import annotations

import os
import threading

import pytest
from support.fakehub import FakeHubAuth, serving

from lab_utils.hub import client, grader
from lab_utils.hub.service import GRADE_SCOPE, Refusals


@pytest.fixture
def course(tmp_path):
    root = tmp_path / "course" / "grading"
    (root / "source" / "01_single_node").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text("")
    return root


@pytest.fixture
def served(course):
    """A Grader whose grading writes what a batch writes (and a link, which must not come back)."""
    gate, entered = threading.Event(), threading.Event()

    class Fake(grader.Grader):
        def _grade(self, job):
            job.say("collecting 01_single_node")
            entered.set()
            assert gate.wait(30)
            for kind, name in (
                ("results", "alice/01_single_node.json"),
                ("feedback", "alice/01_single_node/01_single_node.html"),
            ):
                path = self.course / kind / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"{kind} of alice")
            (self.course / "results" / "grades.csv").write_text("student,lab,score\\nalice,01_single_node,7\\n")
            (self.course / "results" / "alice" / "01_single_node-link").symlink_to("/etc/passwd")
            job.say("graded 1")

    made = Fake(course, "http://127.0.0.1:1/services/handin/", "service-token")
    users = {
        "t-prof": {"kind": "user", "name": "prof", "scopes": [GRADE_SCOPE]},
        "t-alice": {"kind": "user", "name": "alice", "scopes": []},
    }
    app = grader.make_app(made, FakeHubAuth(users), refusals=Refusals(delay=0))  # refusals answered at once
    with serving(app, "/services/grader/", **grader.SERVER_OPTIONS) as url:
        yield url, gate, entered
        gate.set()


def test_an_instructor_grades_follows_and_gets_the_results_layout(served, tmp_path, capsys):
    url, gate, entered = served
    with pytest.raises(client.HandInRefused, match="403.*only an instructor"):
        client.grade("01_single_node", tmp_path / "x", url=url, token="t-alice", poll_s=0.05)
    with pytest.raises(client.HandInRefused, match="404.*no lab 07_nope"):
        client.grade("07_nope", tmp_path / "x", url=url, token="t-prof", poll_s=0.05)
    done = {}
    worker = threading.Thread(
        target=lambda: done.setdefault(
            "dest", client.grade("01_single_node", tmp_path / "out", url=url, token="t-prof", poll_s=0.05)
        )
    )
    worker.start()
    try:
        assert entered.wait(30)
        with pytest.raises(client.HandInRefused, match="409.*being graded"):  # one grading at a time
            client.grade("01_single_node", tmp_path / "y", url=url, token="t-prof", poll_s=0.05)
    finally:
        gate.set()
        worker.join(60)
    dest = done["dest"]
    assert (dest / "results" / "alice" / "01_single_node.json").read_text() == "results of alice"
    assert (dest / "feedback" / "alice" / "01_single_node" / "01_single_node.html").is_file()
    assert "alice,01_single_node,7" in (dest / "results" / "grades.csv").read_text()
    assert not (dest / "results" / "alice" / "01_single_node-link").exists()  # no link leaves the service
    out = capsys.readouterr().out
    assert "collecting 01_single_node" in out and "graded 1" in out


def test_the_batch_runs_without_any_hub_variable_or_token():
    env = grader.grading_env(
        {
            "PATH": "/bin",
            "JUPYTERHUB_API_TOKEN": "s",
            "JUPYTERHUB_SERVICE_URL": "u",
            "JPY_API_TOKEN": "t",
            "GITHUB_TOKEN": "g",
            "LABS_OFFLINE": "1",
        }  # fmt: skip
    )
    assert env == {"PATH": "/bin", "LABS_OFFLINE": "1"}


def test_results_are_extracted_as_plain_files_under_the_folder_only(tmp_path):
    """Whatever a results archive holds, what lands is files and folders under the folder asked for."""
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind in (("results/a.json", tarfile.REGTYPE), ("../escaped", tarfile.REGTYPE),
                           ("/abs", tarfile.REGTYPE), ("results/link", tarfile.SYMTYPE)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.type, info.size = kind, 0 if kind != tarfile.REGTYPE else 2
            info.linkname = "/etc/passwd" if kind == tarfile.SYMTYPE else ""
            tar.addfile(info, io.BytesIO(b"{}") if kind == tarfile.REGTYPE else None)
    dest = tmp_path / "in" / "out"
    dest.mkdir(parents=True)
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r:gz") as tar:
        client._extract_plain(tar, dest)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "in",
        "in/out",
        "in/out/results",
        "in/out/results/a.json",
    ]


def test_a_body_sent_to_the_grading_service_is_refused_unread(served):
    """No route takes one: 60 MB announced, a few bytes sent, the answer comes and the connection closes."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(served[0])
    with socket.create_connection((url.hostname, url.port), timeout=20) as sock:
        head = f"POST {url.path}api/grade/01_single_node HTTP/1.1\r\nHost: x\r\nContent-Length: {60 * 2**20}\r\n\r\n"
        sock.sendall(head.encode() + b"x" * 1024)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]


@pytest.fixture
def recording_python(tmp_path, monkeypatch):
    """(a "python" that records each step's working directory and arguments, the record): the
    hand-in service's collect gives one hand-in, alice's."""
    record = tmp_path / "steps.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$PWD $*" >> {record}\n')
    fake.chmod(0o755)

    def collect(lab, dest, url, token):
        (dest / "alice" / lab).mkdir(parents=True)
        return ["alice"]

    monkeypatch.setattr(grader.client, "collect", collect)
    return fake, record


def test_the_batch_runs_outside_the_course_with_python_p_and_leaves_no_folder(course, recording_python):
    """The course is its instructors' group's to write: `python -m` would import a module a TA
    put in its working directory, as root. Each step runs with -P, in a folder of the service's
    own (the hand-ins), removed after."""
    fake, record = recording_python
    made = grader.Grader(course, "http://127.0.0.1:1/services/handin/", "service-token", python=str(fake))
    job = grader.Job("01_single_node", "prof")
    made._grade(job)
    steps = record.read_text().splitlines()
    assert len(steps) == 5 and all(line.split()[1:3] == ["-P", "-m"] for line in steps), steps
    where = {line.split()[0] for line in steps}
    assert len(where) == 1 and not any(w.startswith(str(course.parent)) for w in where), where
    assert not os.path.exists(where.pop())  # removed after


def test_on_a_class_s_machine_it_grades_in_its_own_course_on_plain_copies(course, tmp_path, recording_python):
    """The course is its instructors' group's to write; the service grades in a course of its own
    (``--work``), on copies of the course's notebooks and settings it makes at each grading:
    no link is followed, and the late flags come from the class's due file, whatever the
    settings name."""
    (course / "source" / "01_single_node" / "01_single_node.ipynb").write_text("{}")
    (course / "source" / "01_single_node" / "secret").symlink_to("/etc/shadow")
    (course / "settings.yml").write_text("defaults:\n  cell_timeout: 30\ndue_file: /etc/shadow\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "nbgrader_config.py").write_text("c = get_config()\n")
    (work / "source" / "02_gone").mkdir(parents=True)  # a lab the course no longer has
    fake, record = recording_python
    due = tmp_path / "due.yml"
    made = grader.Grader(course, "http://x/services/handin/", "t", python=str(fake), work=work, due_file=due)
    made._grade(grader.Job("01_single_node", "prof"))
    assert sorted(p.name for p in (work / "source").rglob("*")) == ["01_single_node", "01_single_node.ipynb"]
    assert (work / "settings.yml").read_text() == f"defaults:\n  cell_timeout: 30\ndue_file: {due}\n"
    assert all(f"--root {work}" in line for line in record.read_text().splitlines())
    with pytest.raises(ValueError, match="no nbgrader_config.py"):
        grader.Grader(course, "http://x/", "t", work=tmp_path / "empty")
