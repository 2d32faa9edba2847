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
``GET  api/collect/<lab>``               instructor            each student's last receipt
``GET  api/collect/<lab>/<student>``     instructor            that notebook (``X-Handin-Receipt``)
``PUT  api/feedback/<lab>/<student>/<f>``  instructor          return page ``f`` to that student
=======================================  ====================  =========================================

A user needs ``access:services!service=<name>`` (the class's ``user`` role and the servers'
``server_token_scopes``); an instructor also ``custom:handin:grade``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime
from urllib.parse import unquote, urlparse

from tornado import ioloop, web

from ..grading.late import parse_due
from .store import HandInError, Store

__all__ = ["GRADE_SCOPE", "make_app", "parse_lab", "main"]

#: The custom scope that makes a Hub user an instructor of the hand-in service.
GRADE_SCOPE = "custom:handin:grade"
log = logging.getLogger("lab_utils.hub.service")


def parse_lab(spec: str) -> tuple[str, datetime | None]:
    """``02_ps_async`` or ``02_ps_async=2026-12-01T23:59+01:00`` (ISO 8601 with a zone)."""
    lab, _, due = spec.partition("=")
    try:
        return lab, parse_due(due or None)  # the grader's own reading of a due time
    except ValueError as exc:
        raise ValueError(f"--lab {spec}: {exc}") from None


class _Handler(web.RequestHandler):
    """Every request: who sent it, from the Hub (403 without a token the Hub knows)."""

    def initialize(self, store: Store, auth, name: str):
        self.store, self.auth, self.service = store, auth, name

    def check_xsrf_cookie(self):  # token-authenticated API only: no cookies are read
        return None

    async def prepare(self):
        header = self.request.headers.get("Authorization", "")
        kind, _, token = header.partition(" ")
        if kind.lower() not in ("token", "bearer") or not token.strip():
            raise web.HTTPError(401, reason="send your Hub token: Authorization: token $JUPYTERHUB_API_TOKEN")
        model = await self.auth.user_for_token(token.strip(), sync=False)
        if not model or model.get("kind", "user") != "user":
            raise web.HTTPError(403, reason="the Hub does not know this token as a user's")
        if not self.auth.check_scopes(f"access:services!service={self.service}", model):
            raise web.HTTPError(
                403,
                reason=f"this token may not use the {self.service} service: the Hub must grant "
                f"access:services!service={self.service} (the user role and server_token_scopes)",
            )
        self.user, self.instructor = model["name"], bool(self.auth.check_scopes(GRADE_SCOPE, model))

    def require_instructor(self):
        if not self.instructor:
            raise web.HTTPError(403, reason=f"{self.user} is not an instructor of this course ({GRADE_SCOPE})")

    def write_error(self, status_code, **kwargs):
        exc = kwargs.get("exc_info", (None, None))[1]
        self.finish({"error": getattr(exc, "log_message", None) or self._reason, "status": status_code})

    def answer(self, call):
        """Run a store call; its refusals become HTTP errors with the store's message."""
        try:
            return call()
        except HandInError as exc:
            raise web.HTTPError(exc.status, reason=str(exc).splitlines()[0][:300], log_message=str(exc)) from None


class Labs(_Handler):
    def get(self):
        due = {lab: (t.isoformat() if t else None) for lab, t in sorted(self.store.due.items())}
        self.finish({"user": self.user, "instructor": self.instructor, "labs": due})


class HandIns(_Handler):
    def post(self, lab):
        receipt = self.answer(lambda: self.store.hand_in(self.user, lab, self.request.body))
        log.info("hand-in: %s %s %s%s", receipt.student, lab, receipt.stamp, " (late)" if receipt.late else "")
        self.set_status(201)
        self.finish(receipt.to_json())

    def get(self, lab):
        self.finish({"hand_ins": [r.to_json() for r in self.answer(lambda: self.store.hand_ins(self.user, lab))]})


class Feedback(_Handler):
    def get(self, lab):
        pages = self.answer(lambda: self.store.feedback(self.user, lab))
        self.finish({"files": {name: data.decode("utf-8", "replace") for name, data in pages.items()}})


class Collect(_Handler):
    def get(self, lab, student=None):
        self.require_instructor()
        if student is None:
            latest = [
                self.answer(lambda s=s: self.store.latest(s, lab))
                for s in self.answer(lambda: self.store.students(lab))
            ]
            self.finish({"hand_ins": [r.to_json() for r, _ in latest if r]})
            return
        found = self.answer(lambda: self.store.latest(unquote(student), lab))
        if found is None:
            raise web.HTTPError(404, reason=f"{unquote(student)} has not handed in {lab}")
        receipt, data = found
        self.set_header("Content-Type", "application/x-ipynb+json")
        self.set_header("X-Handin-Receipt", json.dumps(receipt.to_json()))
        self.finish(data)


class ReturnFeedback(_Handler):
    def put(self, lab, student, name):
        self.require_instructor()
        self.answer(lambda: self.store.put_feedback(unquote(student), lab, name, self.request.body))
        self.set_status(204)
        self.finish()


def make_app(store: Store, auth, prefix: str = "/services/handin/", name: str = "handin") -> web.Application:
    """The service's tornado application (``auth``: a :class:`jupyterhub.services.auth.HubAuth`)."""
    p = prefix.rstrip("/") + "/api"
    kw = {"store": store, "auth": auth, "name": name}
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
        # tornado's default body limit is 100 MB: refuse a larger upload before reading it
        max_body_size=64 * 2**20,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab_utils.hub.service", description=__doc__.split("\n\n")[0])
    ap.add_argument("--store", required=True, help="folder of hand-ins and feedback (made mode 700)")
    ap.add_argument("--lab", action="append", default=[], help="a lab open for hand-in: NAME or NAME=DUE (ISO 8601)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s handin] %(message)s")
    try:
        store = Store(args.store, dict(parse_lab(spec) for spec in args.lab))
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
    app = make_app(store, HubAuth(cache_max_age=60), prefix, name)
    app.listen(where.port, where.hostname, max_buffer_size=64 * 2**20)
    log.info("serving %s at %s: labs %s, store %s", prefix, url, ", ".join(sorted(store.due)) or "none", store.root)
    ioloop.IOLoop.current().start()
    return 0


if __name__ == "__main__":
    sys.exit(main())
