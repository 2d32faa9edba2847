"""A Hub service's tornado application on a free loopback port, in a thread, and a stand-in for
the Hub's answers about tokens: the hand-in and grading services tested without a Hub."""

from __future__ import annotations

import asyncio
import contextlib
import threading


class FakeHubAuth:
    """The Hub's answer for each token (HubAuth's ``user_for_token`` and ``check_scopes``)."""

    def __init__(self, users: dict[str, dict]):
        self.users = users

    async def user_for_token(self, token, sync=True):
        return self.users.get(token)

    def check_scopes(self, required, model):
        return {required} & set(model["scopes"])


@contextlib.contextmanager
def serving(app, prefix: str, **options):
    """``app`` served on 127.0.0.1 (a port the OS picks) in a thread of its own, with the HTTP
    server's ``options``; yields ``http://127.0.0.1:<port><prefix>``, and stops it on the way out."""
    started, box = threading.Event(), {}

    def serve():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        server = app.listen(0, "127.0.0.1", **options)
        box["port"], box["loop"] = next(iter(server._sockets.values())).getsockname()[1], loop
        started.set()
        loop.run_forever()
        server.stop()
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    if not started.wait(30):
        raise RuntimeError("the service did not start within 30 s")
    try:
        yield f"http://127.0.0.1:{box['port']}{prefix}"
    finally:
        box["loop"].call_soon_threadsafe(box["loop"].stop)
        thread.join(30)
