"""The hand-in store and service without a Hub: each student's hand-ins and feedback are kept
apart by the name the Hub gives their token, never by anything the request says; arrival times
are the service's and decide lateness; names and labs cannot reach outside the store; what is no
notebook is refused with a reason. (The real Hub, proxy and users: tests/process/test_hub.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta

import pytest
from support.fakehub import FakeHubAuth, serving

from lab_utils.hub import client
from lab_utils.hub.service import GRADE_SCOPE, REFUSAL_DELAY_S, Refusals, make_app, parse_lab
from lab_utils.hub.store import HandInError, Store, safe_name, student_of

NB = json.dumps({"cells": [{"cell_type": "code", "source": "x = 1"}], "nbformat": 4, "metadata": {}}).encode()
DUE = datetime(2026, 12, 1, 23, 59, tzinfo=UTC)


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "store", {"01_single_node": None, "02_ps_async": DUE})


def test_a_hand_in_is_kept_with_the_services_time_and_late_after_the_due_time(store):
    early = store.hand_in("alice", "02_ps_async", NB, now=DUE - timedelta(minutes=1))
    late = store.hand_in("alice", "02_ps_async", NB + b" ", now=DUE + timedelta(seconds=1))
    assert (early.late, late.late) == (False, True)
    assert [r.stamp for r in store.hand_ins("alice", "02_ps_async")] == [early.stamp, late.stamp]
    receipt, data = store.latest("alice", "02_ps_async")
    assert receipt == late and data == NB + b" "
    assert store.hand_in("bob", "01_single_node", NB).late is False  # no due time: never late
    assert oct((store.root).stat().st_mode & 0o777) == "0o700"


def test_collect_writes_the_autograde_layout_with_nbgraders_timestamp(store, tmp_path):
    store.hand_in("alice", "02_ps_async", NB, now=DUE - timedelta(hours=1))
    store.hand_in("a b/c", "02_ps_async", NB, now=DUE + timedelta(hours=1))
    got = store.collect("02_ps_async", tmp_path / "sub")
    assert sorted(r.student for r in got) == ["a b/c", "alice"]
    assert (tmp_path / "sub" / "alice" / "02_ps_async" / "02_ps_async.ipynb").read_bytes() == NB
    assert (
        tmp_path / "sub" / "alice" / "02_ps_async" / "timestamp.txt"
    ).read_text() == "2026-12-01 22:59:00.000000 UTC"
    assert (tmp_path / "sub" / "a%20b%2Fc" / "02_ps_async" / "02_ps_async.ipynb").is_file()  # one folder, not two


def test_names_and_labs_stay_inside_the_store(store):
    for name in ["..", "../bob", ".", "a/../../x", "é"]:
        folder = safe_name(name)
        assert "/" not in folder and not folder.startswith(".") and student_of(folder) == name
    with pytest.raises(HandInError, match="no lab '../x' is open"):
        store.hand_in("alice", "../x", NB)
    with pytest.raises(HandInError, match="plain .html name"):
        store.put_feedback("alice", "02_ps_async", "../../bob/x.html", b"<p>")


@pytest.mark.parametrize(
    "data, why",
    [(b"\x89PNG...", "not JSON"), (b'{"cells": 3}', "no list of cells"), (b"[]", "no list of cells")],
)
def test_what_is_no_notebook_is_refused_with_the_reason(store, data, why):
    with pytest.raises(HandInError, match=why):
        store.hand_in("alice", "01_single_node", data)
    assert store.hand_ins("alice", "01_single_node") == []


def test_due_times_need_a_zone():
    assert parse_lab("02_ps_async=2026-12-01T23:59+01:00")[1] == datetime(2026, 12, 1, 22, 59, tzinfo=UTC)
    with pytest.raises(ValueError, match="zone"):
        parse_lab("02_ps_async=2026-12-01T23:59")
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_lab("02_ps_async=tomorrow")


@pytest.fixture
def refusals():
    """The service's refusals, whose waits are counted, not slept (``waited``)."""
    held = Refusals()
    held.waited = []

    async def count(seconds):
        held.waited.append(seconds)

    held.sleep = count
    return held


@pytest.fixture
def service(store, refusals):
    """The service on a free loopback port, in a thread; yields its URL."""
    access = "access:services!service=handin"
    auth = FakeHubAuth(
        {
            "t-alice": {"kind": "user", "name": "alice", "scopes": [access]},
            "t-bob": {"kind": "user", "name": "bob", "scopes": [access]},
            "t-prof": {"kind": "user", "name": "prof", "scopes": [access, GRADE_SCOPE]},
            "t-noscope": {"kind": "user", "name": "carol", "scopes": []},
            "t-grader": {"kind": "service", "name": "grader", "scopes": [access, GRADE_SCOPE]},
            "t-other-service": {"kind": "service", "name": "announcer", "scopes": [access]},
        }
    )
    with serving(make_app(store, auth, refusals=refusals), "/services/handin/") as url:
        yield url


def test_students_hand_in_and_read_only_their_own(service, store, tmp_path):
    nb = tmp_path / "02_ps_async.ipynb"
    nb.write_bytes(NB)
    receipt = client.hand_in(nb, url=service, token="t-alice")
    assert receipt.student == "alice" and receipt.lab == "02_ps_async"
    assert store.latest("alice", "02_ps_async")[1] == NB
    # bob hands in too; nothing he sends can make it alice's
    client.hand_in(nb, url=service, token="t-bob")
    assert [r.student for r in (store.latest(s, "02_ps_async")[0] for s in store.students("02_ps_async"))] == [
        "alice",
        "bob",
    ]
    store.put_feedback("alice", "02_ps_async", "02_ps_async.html", b"<p>alice: 9/10</p>")
    assert client.feedback("02_ps_async", tmp_path / "bob-fb", url=service, token="t-bob") == []
    got = client.feedback("02_ps_async", tmp_path / "alice-fb", url=service, token="t-alice")
    assert [p.read_text() for p in got] == ["<p>alice: 9/10</p>"]


def test_only_an_instructor_collects_and_returns(service, store, tmp_path):
    nb = tmp_path / "02_ps_async.ipynb"
    nb.write_bytes(NB)
    client.hand_in(nb, url=service, token="t-alice")
    with pytest.raises(client.HandInRefused, match="403.*alice is not an instructor"):
        client.collect("02_ps_async", tmp_path / "stolen", url=service, token="t-alice")
    assert not (tmp_path / "stolen").exists()
    got = client.collect("02_ps_async", tmp_path / "sub", url=service, token="t-prof")
    assert [r.student for r in got] == ["alice"]
    assert (tmp_path / "sub" / "alice" / "02_ps_async" / "02_ps_async.ipynb").read_bytes() == NB
    fb = tmp_path / "feedback" / "alice" / "02_ps_async"
    fb.mkdir(parents=True)
    (fb / "02_ps_async.html").write_text("<p>well done</p>")
    with pytest.raises(client.HandInRefused, match="403"):
        client.return_feedback("02_ps_async", tmp_path / "feedback", url=service, token="t-bob")
    assert client.return_feedback("02_ps_async", tmp_path / "feedback", url=service, token="t-prof") == ["alice"]
    assert store.feedback("alice", "02_ps_async") == {"02_ps_async.html": b"<p>well done</p>"}


def test_the_instructors_commands_name_what_is_wrong_with_their_folders(service, tmp_path, capsys):
    from lab_utils.hub.__main__ import main

    nb = tmp_path / "02_ps_async.ipynb"
    nb.write_bytes(NB)
    client.hand_in(nb, url=service, token="t-alice")
    env = {"LABS_HANDIN_URL": service, "JUPYTERHUB_API_TOKEN": "t-prof"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        (tmp_path / "empty" / "alice" / "02_ps_async").mkdir(parents=True)  # a folder, but no page
        for folder, why in (("nowhere", "(no such folder)"), ("empty", "make feedback LABS=02")):
            assert main(["return", "02_ps_async", str(tmp_path / folder)]) == 1
            err = capsys.readouterr().err
            assert f"no feedback for 02_ps_async under {tmp_path / folder}" in err and why in err
        (tmp_path / "a-file").write_text("")
        assert main(["collect", "02_ps_async", str(tmp_path / "a-file" / "sub")]) == 1
        assert "cannot make" in capsys.readouterr().err
        assert main(["collect", "02_ps_async", str(tmp_path / "sub")]) == 0


def test_the_service_refuses_what_it_cannot_take_and_says_why(service, tmp_path):
    bad = tmp_path / "01_single_node.ipynb"
    bad.write_bytes(b"not a notebook")
    with pytest.raises(client.HandInRefused, match="400.*not a notebook file"):
        client.hand_in(bad, url=service, token="t-alice")
    with pytest.raises(client.HandInRefused, match="403.*does not know this token"):
        client.whoami(url=service, token="forged")
    with pytest.raises(client.HandInRefused, match="403.*access:services!service=handin"):
        client.whoami(url=service, token="t-noscope")
    with pytest.raises(client.HandInRefused, match="404.*no lab '07_nope' is open"):
        client.hand_in(bad, lab="07_nope", url=service, token="t-alice")
    assert client.whoami(url=service, token="t-prof")["instructor"] is True


def test_without_a_hub_the_student_is_told_there_is_no_service(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("LABS_HANDIN_URL", raising=False)
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    nb = tmp_path / "01_single_node.ipynb"
    nb.write_bytes(NB)
    assert client.hand_in(nb) is None  # said, not raised: the lab runs on
    assert "no hand-in service here (LABS_HANDIN_URL and JUPYTERHUB_API_TOKEN unset)" in capsys.readouterr().out
    with pytest.raises(client.HandInRefused, match="no hand-in service here"):
        client.feedback("01_single_node")


# ---------------------------------------------------------------- a hostile class at a deadline
def test_a_receipt_is_kept_on_disk_before_the_answer_and_read_back_never_recomputed(store, monkeypatch):
    import os

    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    receipt = store.hand_in("alice", "01_single_node", NB)
    stamp = store.root / "submitted" / "alice" / "01_single_node" / receipt.stamp
    # the notebook's bytes, its folder, the receipt and the lab's folder: all synced before the answer
    assert any(p.startswith(str(store.root / "incoming")) for p in synced)  # the body, before its rename
    assert str(stamp) in synced and str(stamp.parent) in synced
    assert json.loads((stamp / "receipt.json").read_text())["sha256"] == receipt.sha256
    (stamp / "01_single_node.ipynb").write_bytes(b"changed on disk")
    assert store.hand_ins("alice", "01_single_node") == [receipt]  # what the student was told, not a new hash
    # a notebook without its receipt (an older service's, or a crash before the answer): nothing
    # handed in is lost; it gets its receipt once; a folder without a notebook is nothing
    (stamp / "receipt.json").unlink()
    (again,) = store.hand_ins("alice", "01_single_node")
    assert (again.stamp, again.size, again.student) == (receipt.stamp, len(b"changed on disk"), "alice")
    assert (stamp / "receipt.json").is_file()
    (stamp.parent / "20260101T000000.000000Z").mkdir()
    assert store.hand_ins("alice", "01_single_node") == [again]


@pytest.mark.parametrize(
    "data, status, why",
    [
        (b"", 400, "an empty file is not a hand-in"),
        (b"  \n", 400, "an empty file is not a hand-in"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested deeper than a notebook"),
        (b'{"cells": [' + b",".join([b"{}"] * 300_000) + b"]}", 413, "JSON elements"),
    ],
)
def test_what_would_crash_or_swell_the_service_is_refused_with_a_reason(store, data, status, why):
    with pytest.raises(HandInError, match=why) as caught:
        store.hand_in("alice", "01_single_node", data)
    assert caught.value.status == status
    assert store.hand_ins("alice", "01_single_node") == [] and not list((store.root / "incoming").iterdir())


def test_a_notebook_with_many_commas_in_its_text_is_taken(store):
    text = "a, b, c: [d], {e}\n" * 60_000  # a long printed log: its marks are inside strings
    nb = json.dumps({"cells": [{"cell_type": "code", "source": "", "outputs": [{"text": text}]}]}).encode()
    assert store.hand_in("alice", "01_single_node", nb).size == len(nb)


def test_each_student_keeps_the_last_few_and_the_hand_ins_a_late_policy_needs(tmp_path):
    store = Store(tmp_path / "s", {"02_ps_async": DUE}, keep=2)
    on_time = [store.hand_in("eve", "02_ps_async", NB, now=DUE - timedelta(hours=h)) for h in (3, 2, 1)]
    late = [store.hand_in("eve", "02_ps_async", NB, now=DUE + timedelta(hours=h)) for h in (1, 2, 3, 4)]
    kept = store.hand_ins("eve", "02_ps_async")
    # the last two, the last on-time one and the first late one; the rest removed from disk
    assert kept == [on_time[-1], late[0], late[-2], late[-1]]
    assert len(list((store.root / "submitted" / "eve" / "02_ps_async").iterdir())) == 4


def test_a_student_over_their_quota_or_a_nearly_full_disk_is_told_why_and_nothing_is_kept(tmp_path, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    store = Store(tmp_path / "s", {"01_single_node": None, "02_ps_async": None}, quota=3 * len(NB))
    for lab in ("01_single_node", "02_ps_async", "02_ps_async"):
        store.hand_in("mallory", lab, NB)
    with pytest.raises(HandInError, match="would pass the") as caught:
        store.hand_in("mallory", "01_single_node", NB)
    assert caught.value.status == 413
    assert len(store.hand_in("alice", "01_single_node", NB).sha256) == 64  # others are not held up

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 100 * 2**20, 100 * 2**20))
    with pytest.raises(HandInError, match="nearly full") as caught:
        store.hand_in("alice", "02_ps_async", NB)
    assert caught.value.status == 507
    monkeypatch.undo()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("lab_utils.hub.store._write_durable", full)
    with pytest.raises(HandInError, match="no room left") as caught:
        store.hand_in("alice", "02_ps_async", NB)
    assert caught.value.status == 507
    assert store.hand_ins("alice", "02_ps_async") == [] and not list((store.root / "incoming").iterdir())
    assert not list((store.root / "submitted" / "alice" / "02_ps_async").iterdir())  # no half hand-in


def test_long_and_look_alike_names_get_folders_of_their_own(store, tmp_path):
    long_a, long_b = "学" * 30 + "甲", "学" * 30 + "乙"  # 270 bytes escaped: cut, and told apart by a hash
    names = [long_a, long_b, "eveA", "eve%41", "a b", "a%20b", "x~y"]
    keys = [safe_name(n) for n in names]
    assert len(set(keys)) == len(names)
    assert all(len(k.encode()) <= 120 and "/" not in k for k in keys)

    def nb(name):
        return json.dumps({"cells": [], "metadata": {"who": name}}).encode()

    for name in names:
        store.hand_in(name, "01_single_node", nb(name))
    assert sorted(store.students("01_single_node")) == sorted(names)
    got = {r.student: r for r in store.collect("01_single_node", tmp_path / "sub")}
    for name in names:
        path = tmp_path / "sub" / got[name].key / "01_single_node" / "01_single_node.ipynb"
        assert path.read_bytes() == nb(name)
        store.put_feedback_of(got[name].key, "01_single_node", "f.html", name.encode())
    assert all(store.feedback(n, "01_single_node") == {"f.html": n.encode()} for n in names)


def test_feedback_goes_only_to_a_student_who_handed_in(store):
    with pytest.raises(HandInError, match="has not handed in") as caught:
        store.put_feedback("nobody", "01_single_node", "f.html", b"<p>")
    assert caught.value.status == 404


def _send_head(url: str, method: str, path: str, headers: dict, first: bytes = b""):
    """A socket that sent ``method path`` with ``headers`` and the first bytes of a body; what
    the service answers before the rest comes (or b"" when it closed without a word)."""
    import socket
    from urllib.parse import urlparse

    where = urlparse(url)
    sock = socket.create_connection((where.hostname, where.port), timeout=20)
    head = f"{method} {where.path}api/{path} HTTP/1.1\r\nHost: x\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()
    )
    sock.sendall(head.encode() + b"\r\n" + first)
    return sock


def _answer(sock) -> bytes:
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    finally:
        sock.close()
    return out


def test_a_body_is_refused_before_it_is_read_without_a_token_or_above_the_limit(service, refusals):
    big = str(60 * 2**20)
    anonymous = _send_head(service, "POST", "hand-ins/01_single_node", {"Content-Length": big}, b"x" * 65536)
    reply = _answer(anonymous)  # answered, and closed, with 59.9 MB still unsent
    assert reply.startswith(b"HTTP/1.1 401") and b"send your Hub token" in reply
    stranger = _send_head(
        service,
        "PUT",
        "feedback/01_single_node/alice/f.html",
        {"Content-Length": big, "Authorization": "token t-alice"},
    )
    assert _answer(stranger).startswith(b"HTTP/1.1 403")  # a student returns no feedback, and sends no body
    student = _send_head(
        service, "POST", "hand-ins/01_single_node", {"Content-Length": big, "Authorization": "token t-alice"}, b"{"
    )
    reply = _answer(student)
    assert reply.startswith(b"HTTP/1.1 413") and b"above the 20 MB" in reply
    assert refusals.waited == [REFUSAL_DELAY_S] * 3  # each refusal waited before it was answered
    assert client.whoami(url=service, token="t-alice")["user"] == "alice"
    assert len(refusals.waited) == 3  # what is not refused does not wait


def test_refusals_wait_a_second_but_never_more_than_so_many_at_once():
    async def main():
        held = Refusals(delay=0.01, most=2)
        seen = []
        real = held.sleep

        async def watch(seconds):
            seen.append(held.held)
            await real(seconds)

        held.sleep = watch
        await asyncio.gather(*(held.hold() for _ in range(5)))
        return seen, held.held

    seen, after = asyncio.run(main())
    assert seen == [1, 2] and after == 0  # two waited; the other three were answered at once


def test_a_student_who_floods_is_slowed_and_others_are_not(service, tmp_path):
    nb = tmp_path / "01_single_node.ipynb"
    nb.write_bytes(NB)
    for _ in range(6):
        client.hand_in(nb, url=service, token="t-bob")
    with pytest.raises(client.HandInRefused, match="429.*6 hand-ins in the last minute"):
        client.hand_in(nb, url=service, token="t-bob")
    assert client.hand_in(nb, url=service, token="t-alice").student == "alice"


def test_disk_work_runs_off_the_event_loop(service, store, tmp_path, monkeypatch):
    """A hand-in held up on disk holds up no other request."""
    nb = tmp_path / "01_single_node.ipynb"
    nb.write_bytes(NB)
    entered, release = threading.Event(), threading.Event()
    real = store.keep_body

    def slow(*a, **k):
        entered.set()
        assert release.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(store, "keep_body", slow)
    done = {}
    worker = threading.Thread(target=lambda: done.setdefault("r", client.hand_in(nb, url=service, token="t-alice")))
    worker.start()
    assert entered.wait(30)
    try:
        assert client.whoami(url=service, token="t-bob")["user"] == "bob"  # answered while the hand-in waits
    finally:
        release.set()
        worker.join(60)
    assert done["r"].student == "alice"


def test_look_alike_names_are_collected_and_returned_to_the_right_student(store, tmp_path):
    """``eveA`` and ``eve%41``: each one's notebook collected, each one's feedback theirs."""
    access = "access:services!service=handin"
    users = {
        f"t-{n.encode().hex()}": {"kind": "user", "name": n, "scopes": [access]} for n in ("eveA", "eve%41", "学" * 30)
    }
    users["t-prof"] = {"kind": "user", "name": "prof", "scopes": [access, GRADE_SCOPE]}
    with serving(make_app(store, FakeHubAuth(users)), "/services/handin/") as url:
        for token, user in users.items():
            if user["name"] != "prof":
                path = tmp_path / token / "01_single_node.ipynb"
                path.parent.mkdir()
                path.write_text(json.dumps({"cells": [], "metadata": {"who": user["name"]}}))
                client.hand_in(path, url=url, token=token)
        got = client.collect("01_single_node", tmp_path / "sub", url=url, token="t-prof")
        for r in got:
            data = json.loads((tmp_path / "sub" / r.key / "01_single_node" / "01_single_node.ipynb").read_text())
            assert data["metadata"]["who"] == r.student
            page = tmp_path / "fb" / r.key / "01_single_node" / "01_single_node.html"
            page.parent.mkdir(parents=True)
            page.write_text(f"<p>for {r.student}</p>")
        assert sorted(r.student for r in got) == sorted(u["name"] for u in users.values() if u["name"] != "prof")
        client.return_feedback("01_single_node", tmp_path / "fb", url=url, token="t-prof")
        for token, user in users.items():
            if user["name"] != "prof":
                pages = client.feedback("01_single_node", tmp_path / "mine" / token, url=url, token=token)
                assert [p.read_text() for p in pages] == [f"<p>for {user['name']}</p>"]


def test_two_users_never_share_a_servers_cgroup():
    from lab_utils.hub.spawner import sandbox_name

    names = ["a b", "a_20b", "a_b", "a/b", "学" * 30, "学" * 31]
    got = [sandbox_name(n) for n in names]
    assert len(set(got)) == len(names) and all("/" not in g and len(g) < 40 for g in got)


def test_the_deploy_guide_states_the_services_own_limits():
    import inspect
    from pathlib import Path

    from lab_utils.hub import service, store

    text = " ".join((Path(__file__).parents[2] / "deploy" / "README.md").read_text().split())
    d = {k: p.default for k, p in inspect.signature(Store.__init__).parameters.items()}
    assert f"keeps their last {d['keep']} hand-ins of a lab" in text
    assert f"within {d['quota'] // 2**20} MB in all" in text and f"x {d['quota'] // 2**20} MB at worst" in text
    assert f"{service.RATE} hand-ins a minute" in text
    assert f"below {d['min_free'] // 2**20} MB (507" in text
    assert f"above {store.MAX_NOTEBOOK_BYTES // 2**20} MB (413" in text
    assert f"A refusal waits {'a second' if service.REFUSAL_DELAY_S == 1 else service.REFUSAL_DELAY_S}" in text
    assert f"{service.HELD_MOST} at most at once" in text


def test_the_grading_service_collects_and_returns_but_is_no_student(service, store, tmp_path):
    nb = tmp_path / "01_single_node.ipynb"
    nb.write_bytes(NB)
    client.hand_in(nb, url=service, token="t-alice")
    got = client.collect("01_single_node", tmp_path / "sub", url=service, token="t-grader")
    assert [r.student for r in got] == ["alice"]
    with pytest.raises(client.HandInRefused, match="403.*is a service"):
        client.hand_in(nb, url=service, token="t-grader")
    with pytest.raises(client.HandInRefused, match="403.*is a service"):
        client.feedback("01_single_node", tmp_path / "fb", url=service, token="t-grader")
    with pytest.raises(client.HandInRefused, match="403.*a service may only collect"):
        client.whoami(url=service, token="t-other-service")


def test_the_deploy_guide_quotes_the_deadline_bench():
    from pathlib import Path

    root = Path(__file__).parents[2]
    text = " ".join((root / "deploy" / "README.md").read_text().split())
    for name, attackers in (("bench_handin.json", 10), ("bench_handin_100.json", 100)):
        bench = json.loads((root / "deploy" / name).read_text())
        lat = bench["receipt_latency_s"]
        assert bench["anonymous_clients"] == attackers and bench["anonymous"]["bodies"] > 0
        assert bench["lost"] == 0 and bench["receipts"] == bench["hand_ins"] and not bench["refused"]
        assert f"{bench['receipts']} receipts, {bench['lost']} lost, none refused" in text
        assert f"peaked at {bench['service_peak_rss_mb']} MB" in text and bench["service_peak_rss_mb"] <= 256
        assert f"{lat['p50']} s at the median and {lat['p99']} s at the 99th percentile" in text


def test_the_deploy_guide_quotes_the_machines_capacity_bench():
    from pathlib import Path

    root = Path(__file__).parents[2]
    bench = json.loads((root / "deploy" / "bench_hub_capacity.json").read_text())
    text = " ".join((root / "deploy" / "README.md").read_text().split())
    ws = bench["server_working_set_gb"]
    assert 0 < ws["min"] <= ws["median"] <= ws["max"] < 2  # under the class's 2 GB a server
    assert f"a server at rest holds {ws['median']} GB of working set" in text
    assert f"its services {bench['hub_and_services_rss_gb']} GB together" in text
    assert f"this course's {bench['cores']}-core machine" in text
