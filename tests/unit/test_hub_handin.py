"""The hand-in store and service without a Hub: each student's hand-ins and feedback are kept
apart by the name the Hub gives their token, never by anything the request says; arrival times
are the service's and decide lateness; names and labs cannot reach outside the store; what is no
notebook is refused with a reason. (The real Hub, proxy and users: tests/process/test_hub.py.)"""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pytest

from lab_utils.hub import client
from lab_utils.hub.service import GRADE_SCOPE, make_app, parse_lab
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


class FakeHubAuth:
    """The Hub's answer for each token (HubAuth's user_for_token and check_scopes)."""

    def __init__(self, users):
        self.users = users

    async def user_for_token(self, token, sync=True):
        return self.users.get(token)

    def check_scopes(self, required, model):
        return {required} & set(model["scopes"])


@pytest.fixture
def service(store):
    """The service on a free loopback port, in a thread; yields its URL."""
    import asyncio

    access = "access:services!service=handin"
    auth = FakeHubAuth(
        {
            "t-alice": {"kind": "user", "name": "alice", "scopes": [access]},
            "t-bob": {"kind": "user", "name": "bob", "scopes": [access]},
            "t-prof": {"kind": "user", "name": "prof", "scopes": [access, GRADE_SCOPE]},
            "t-noscope": {"kind": "user", "name": "carol", "scopes": []},
        }
    )
    started, box = threading.Event(), {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = make_app(store, auth).listen(0, "127.0.0.1")
        box["port"] = next(iter(server._sockets.values())).getsockname()[1]
        box["loop"], box["server"] = loop, server
        started.set()
        loop.run_forever()
        server.stop()
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(30), "the service did not start"
    yield f"http://127.0.0.1:{box['port']}/services/handin/"
    box["loop"].call_soon_threadsafe(box["loop"].stop)
    thread.join(30)


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
