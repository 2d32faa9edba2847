"""The hand-in service: a JupyterHub service that takes each student's notebook and gives back
their feedback, knowing who is who from the Hub's token, never from a file's owner.

Why a service and not nbgrader's exchange: on Zero to JupyterHub every student's server runs as
uid 1000, so a shared exchange volume cannot keep one student from reading or overwriting
another's submission, and the ``timestamp.txt`` a student's own server writes can be forged.
Here a student's server holds no part of the store: it sends the notebook with its own Hub
token (``$JUPYTERHUB_API_TOKEN``), the service asks the Hub whose token it is, stamps the
arrival with its own clock, and keeps it under that name (:mod:`lab_utils.hub.store`).

Run by JupyterHub (``c.JupyterHub.services``; ``deploy/README.md`` has the configuration)::

    python -m lab_utils.hub.service --store /srv/handin --lab 01_single_node --lab 02_ps_async=2026-12-01T23:59+01:00

API, under the service's prefix (``/services/handin/``), every call with ``Authorization: token T``:

=======================================  ====================  =========================================
``GET  api/labs``                        any user              open labs and due times; who you are
``POST api/hand-ins/<lab>``              the student           body: the notebook; answers the receipt
``GET  api/hand-ins/<lab>``              the student           their own receipts
``GET  api/feedback/<lab>``              the student           their own returned pages
``GET  api/collect/<lab>``               instructor            each student's last receipt (with ``key``)
``GET  api/collect/<lab>/<key>``         instructor            that notebook (``X-Handin-Receipt``)
``PUT  api/feedback/<lab>/<key>/<f>``    instructor            return page ``f`` to that student
=======================================  ====================  =========================================

``<key>`` is a student's folder name (``collect`` writes each hand-in under it, and nbgrader's
feedback keeps it), URL-quoted once and decoded once.

At a deadline, with a class that may hold someone hostile: every request is authenticated from
its headers, before any byte of its body is read (401/403, and the connection is closed); a body
streams to the store's disk, never into memory, within :data:`~lab_utils.hub.store.MAX_NOTEBOOK_BYTES`
(413 from ``Content-Length``, before it is read) and a time limit; one notebook is parsed at a
time, within an element budget; each student may hand in :data:`RATE` times a minute (429); a
full disk is a 507 that says so. A request refused before its body is read is answered after
:data:`REFUSAL_DELAY_S`, so a client that sends again and again is slowed to one a second.
Disk work runs off the event loop, so one slow request holds up no other.

A user needs ``access:services!service=<name>`` (the class's ``user`` role and the servers'
``server_token_scopes``); an instructor also ``custom:handin:grade``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import signal
import sys
import time
from collections import defaultdict, deque
from datetime import datetime
from urllib.parse import urlparse

from tornado import ioloop, web

from ..grading.late import DueFile, parse_due
from .store import MAX_FEEDBACK_BYTES, MAX_NOTEBOOK_BYTES, HandInError, Store, valid_key

__all__ = ["GRADE_SCOPE", "RATE", "Refusals", "make_app", "parse_lab", "token_owner", "main"]

#: The custom scope that makes a Hub user an instructor of the hand-in service.
GRADE_SCOPE = "custom:handin:grade"
#: Hand-ins a student may send a minute (honest students send one or two at a deadline).
RATE = 6
#: Seconds a body may take to arrive (20 MB at 1 Mbit/s takes 160 s).
BODY_TIMEOUT_S = 300.0
#: What the server reads of a connection at most, and how long an idle one stays open.
SERVER_OPTIONS = {"max_buffer_size": 2**20, "idle_connection_timeout": 60, "body_timeout": BODY_TIMEOUT_S}
#: Seconds a request refused before its body is read waits for its answer (reading nothing of
#: it meanwhile): a client refused for who it is, or for what it asks, gets one answer a second
#: on a connection, however fast it sends again. At most :data:`HELD_MOST` wait at once; the
#: rest are answered at once. (A held connection costs the service the 64 kB it read with its
#: headers, and the kernel a socket's buffers, about 200 kB: 25 MB for all of them.)
REFUSAL_DELAY_S = 1.0
HELD_MOST = 128
log = logging.getLogger("lab_utils.hub.service")


def parse_lab(spec: str) -> tuple[str, datetime | None]:
    """``02_ps_async`` or ``02_ps_async=2026-12-01T23:59+01:00`` (ISO 8601 with a zone)."""
    lab, _, due = spec.partition("=")
    try:
        return lab, parse_due(due or None)  # the grader's own reading of a due time
    except ValueError as exc:
        raise ValueError(f"--lab {spec}: {exc}") from None


async def token_owner(request, auth) -> dict | None:
    """The Hub's model of whoever holds the request's token (None: the Hub knows no such token);
    401 without one. Read from the headers alone."""
    kind, _, token = request.headers.get("Authorization", "").partition(" ")
    if kind.lower() not in ("token", "bearer") or not token.strip():
        raise web.HTTPError(401, reason="send your Hub token: Authorization: token $JUPYTERHUB_API_TOKEN")
    return await auth.user_for_token(token.strip(), sync=False)


class Refusals:
    """Refusals that wait :data:`REFUSAL_DELAY_S` before they are answered, :data:`HELD_MOST` at
    most at once. Without the wait, an anonymous client that sends body after body is refused at
    the speed of a round trip, and each refusal costs the Hub's proxy a connection to the
    service, a reset (the body it was still forwarding) and an error page from the Hub: ten such
    clients took more of a 2-core machine than 100 students handing in (bench/bench_handin.py)."""

    def __init__(self, delay: float = REFUSAL_DELAY_S, most: int = HELD_MOST):
        self.delay, self.most, self.held = delay, most, 0
        self.sleep = asyncio.sleep

    async def hold(self) -> None:
        if self.delay <= 0 or self.held >= self.most:
            return
        self.held += 1
        try:
            await self.sleep(self.delay)
        finally:
            self.held -= 1


def stop_on_signals(first=None) -> None:
    """SIGINT and SIGTERM stop the event loop, and so this service (after ``first()``, when
    given). A Hub started as a shell's background job (``jupyterhub &``) starts its services
    with SIGINT ignored, its stop signal: without this, each would hold the Hub's stop for its
    30 s interrupt timeout."""
    loop = asyncio.get_event_loop()

    def stop():
        try:
            if first is not None:
                first()
        finally:
            loop.stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop)


def more_files() -> None:
    """Raise this process's open-file limit to its hard limit: each connection is one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class _Shared:
    """What every request of one service shares: the store, the Hub, one parse at a time, and
    each student's recent hand-ins (the rate limit)."""

    def __init__(self, store: Store, auth, name: str, rate: int, refusals: Refusals):
        self.store, self.auth, self.name, self.rate, self.refusals = store, auth, name, rate, refusals
        self.parsing = asyncio.Semaphore(1)  # a notebook's parse is what takes memory
        self.recent: dict[str, deque] = defaultdict(deque)

    def admit(self, user: str) -> None:
        """HandInError 429 when ``user`` has sent :attr:`rate` hand-ins in the last minute."""
        now, seen = time.monotonic(), self.recent[user]
        while seen and now - seen[0] > 60:
            seen.popleft()
        if len(seen) >= self.rate:
            wait = int(60 - (now - seen[0])) + 1
            raise HandInError(f"{len(seen)} hand-ins in the last minute: wait {wait} s, then hand in again", 429)
        seen.append(now)


@web.stream_request_body
class _Handler(web.RequestHandler):
    """Every request: who sent it, from the Hub (401/403 before any of its body is read), and
    no body unless the route takes one (:meth:`body_limit`)."""

    def initialize(self, shared: _Shared):
        self.shared, self.store = shared, shared.store

    def check_xsrf_cookie(self):  # token-authenticated API only: no cookies are read
        return None

    async def prepare(self):
        self.request.connection.set_max_body_size(0)  # until the route says otherwise
        try:
            await self._admit()
        except web.HTTPError:
            await self.shared.refusals.hold()
            raise

    async def _admit(self):
        model = await token_owner(self.request, self.shared.auth)
        kind = (model or {}).get("kind", "user")
        if not model or kind not in ("user", "service"):
            raise web.HTTPError(403, reason="the Hub does not know this token as a user's")
        if kind == "service" and not self.shared.auth.check_scopes(GRADE_SCOPE, model):
            raise web.HTTPError(403, reason="a service may only collect and return (the grading service)")
        service = self.shared.name
        if not self.shared.auth.check_scopes(f"access:services!service={service}", model):
            raise web.HTTPError(
                403,
                reason=f"this token may not use the {service} service: the Hub must grant "
                f"access:services!service={service} (the user role and server_token_scopes)",
            )
        self.user, self.instructor = model["name"], bool(self.shared.auth.check_scopes(GRADE_SCOPE, model))
        if kind == "service":  # the grading service collects; it is no student
            self.user, self.student = f"service:{model['name']}", False
        else:
            self.student = True
        limit = self.body_limit(*self.path_args)
        length = self.request.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise web.HTTPError(
                413, reason=f"the body is {int(length) / 2**20:.1f} MB, above the {limit / 2**20:.0f} MB this takes"
            )
        self.request.connection.set_max_body_size(limit)

    def body_limit(self, *args) -> int:
        """Bytes this request may send, once its sender is known (0: none)."""
        return 0

    def data_received(self, chunk: bytes):
        raise web.HTTPError(400, reason="this request takes no body")

    def require_student(self):
        if not self.student:
            raise web.HTTPError(403, reason=f"{self.user} is a service: it hands nothing in and has no feedback")

    def require_instructor(self):
        if not self.instructor:
            raise web.HTTPError(403, reason=f"{self.user} is not an instructor of this course ({GRADE_SCOPE})")

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        why = getattr(exc, "log_message", None) or self._reason
        if status_code >= 400 and status_code != 401:
            log.warning(
                "%s %s by %s: %s %s",
                self.request.method,
                self.request.path,
                getattr(self, "user", "?"),
                status_code,
                why.splitlines()[0][:200],
            )
        self.finish({"error": why, "status": status_code})

    async def answer(self, call):
        """Run a store call off the event loop; its refusals become HTTP errors with its message."""
        try:
            return await asyncio.get_running_loop().run_in_executor(None, call)
        except HandInError as exc:
            raise web.HTTPError(exc.status, reason=str(exc).splitlines()[0][:300], log_message=str(exc)) from None


class Labs(_Handler):
    def get(self):
        due = {lab: (t.isoformat() if t else None) for lab, t in sorted(self.store.due.items())}
        self.finish({"user": self.user, "instructor": self.instructor, "labs": due})


class HandIns(_Handler):
    body = None

    def body_limit(self, lab):
        self.require_student()
        if self.request.method != "POST":
            return 0
        try:
            self.store._lab(lab)
            self.shared.admit(self.user)
            self.store.room_for(int(self.request.headers.get("Content-Length") or 0))
        except HandInError as exc:
            raise web.HTTPError(exc.status, reason=str(exc)) from None
        log.info("receiving: %s %s (%s bytes)", self.user, lab, self.request.headers.get("Content-Length", "?"))
        self.body = self.store.incoming(MAX_NOTEBOOK_BYTES)
        return MAX_NOTEBOOK_BYTES

    def data_received(self, chunk):
        try:
            self.body.write(chunk)
        except HandInError as exc:
            raise web.HTTPError(exc.status, reason=str(exc)) from None

    async def post(self, lab):
        async with self.shared.parsing:  # one parse at a time: what bounds the memory
            await self.answer(lambda: self.store.check_body(self.body))
        receipt = await self.answer(lambda: self.store.keep_body(self.user, lab, self.body))
        log.info("hand-in: %s %s %s%s", receipt.student, lab, receipt.stamp, " (late)" if receipt.late else "")
        self.set_status(201)
        self.finish(receipt.to_json())

    async def get(self, lab):
        receipts = await self.answer(lambda: self.store.hand_ins(self.user, lab))
        self.finish({"hand_ins": [r.to_json() for r in receipts]})

    def on_finish(self):
        if self.body is not None:
            self.body.discard()

    def on_connection_close(self):
        self.on_finish()
        super().on_connection_close()


class Feedback(_Handler):
    async def get(self, lab):
        self.require_student()
        pages = await self.answer(lambda: self.store.feedback(self.user, lab))
        self.finish({"files": {name: data.decode("utf-8", "replace") for name, data in pages.items()}})


class Collect(_Handler):
    async def get(self, lab, key=None):
        self.require_instructor()
        if key is None:
            index = await self.answer(lambda: self.store.index(lab))
            self.finish({"hand_ins": [r.to_json() for r in index]})
            return
        found = await self.answer(lambda: self.store.latest_of(valid_key(key), lab))
        if found is None:
            raise web.HTTPError(404, reason=f"{key} has not handed in {lab}")
        receipt, data = found
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("X-Handin-Receipt", json.dumps(receipt.to_json()))
        self.finish(data)


class ReturnFeedback(_Handler):
    def body_limit(self, *args):
        self.require_instructor()
        self.chunks = []
        return MAX_FEEDBACK_BYTES

    def data_received(self, chunk):
        self.chunks.append(chunk)

    async def put(self, lab, key, name):
        data = b"".join(self.chunks)
        await self.answer(lambda: self.store.put_feedback_of(valid_key(key), lab, name, data))
        self.set_status(204)
        self.finish()


def make_app(
    store: Store,
    auth,
    prefix: str = "/services/handin/",
    name: str = "handin",
    rate: int = RATE,
    refusals: Refusals | None = None,
) -> web.Application:
    """The service's tornado application (``auth``: a :class:`jupyterhub.services.auth.HubAuth`).
    Serve it with :data:`SERVER_OPTIONS` (``app.listen(port, host, **SERVER_OPTIONS)``)."""
    p = prefix.rstrip("/") + "/api"
    kw = {"shared": _Shared(store, auth, name, rate, refusals or Refusals())}
    lab, who = r"([0-9]{2}_[a-z0-9_]+)", r"([^/]+)"
    return web.Application(
        [
            (rf"{p}/labs", Labs, kw),
            (rf"{p}/hand-ins/{lab}", HandIns, kw),
            (rf"{p}/feedback/{lab}", Feedback, kw),
            (rf"{p}/collect/{lab}", Collect, kw),
            (rf"{p}/collect/{lab}/{who}", Collect, kw),
            (rf"{p}/feedback/{lab}/{who}/{who}", ReturnFeedback, kw),
        ],
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab_utils.hub.service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="folder of hand-ins and feedback (made mode 700)")
    ap.add_argument("--lab", action="append", default=[], help="a lab open for hand-in: NAME or NAME=DUE (ISO 8601)")
    ap.add_argument(
        "--due-file",
        help="the class's due file (lab: due time, one a line), instead of --lab: read again when it "
        "changes, and read by the grader too (due_file in grading/settings.yml)",
    )
    ap.add_argument(
        "--keep",
        type=int,
        default=5,
        help="hand-ins kept per student and lab (default 5), besides the last on-time and the first late one",
    )
    ap.add_argument("--quota-mb", type=float, default=200, help="MB each student's kept hand-ins may hold (200)")
    ap.add_argument("--min-free-mb", type=float, default=256, help="MB of disk no hand-in may take (256)")
    ap.add_argument("--rate", type=int, default=RATE, help=f"hand-ins a student may send a minute ({RATE})")
    return ap


def make_store(args: argparse.Namespace) -> Store:
    """The store the service's command line describes (ValueError for a bad one): its labs and due
    times from ``--due-file`` (the term's schedule, read again when it changes) or ``--lab``."""
    if args.due_file and args.lab:
        raise ValueError("give --lab or --due-file, not both: the due times come from one place")
    return Store(
        args.store,
        DueFile(args.due_file) if args.due_file else dict(parse_lab(spec) for spec in args.lab),
        keep=args.keep,
        quota=int(args.quota_mb * 2**20),
        min_free=int(args.min_free_mb * 2**20),
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s handin] %(message)s")
    try:
        store = make_store(args)
    except ValueError as exc:
        print(f"handin: {exc}", file=sys.stderr)
        return 2
    from jupyterhub.services.auth import HubAuth  # the Hub's environment has it; students' need not

    url = os.environ.get("JUPYTERHUB_SERVICE_URL")
    if not url:
        print("handin: JUPYTERHUB_SERVICE_URL is unset: run me as a JupyterHub service", file=sys.stderr)
        return 2
    where = urlparse(url)
    name = os.environ.get("JUPYTERHUB_SERVICE_NAME", "handin")
    prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", f"/services/{name}/")
    app = make_app(store, HubAuth(cache_max_age=60), prefix, name, args.rate)
    more_files()
    app.listen(where.port, where.hostname, **SERVER_OPTIONS)
    stop_on_signals()
    log.info("serving %s at %s: labs %s, store %s", prefix, url, ", ".join(sorted(store.due)) or "none", store.root)
    ioloop.IOLoop.current().start()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
