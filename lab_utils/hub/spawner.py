"""A JupyterHub spawner for a class on one machine: each student's server runs as that
student's Unix user (JupyterHub's ``LocalProcessSpawner``) inside a cgroup of its own with the
class's memory, CPU and process limits, which nothing it starts can leave. The Littlest
JupyterHub does the same with systemd units; this one uses the course's own cgroup code
(:class:`lab_utils.grading.sandbox.Sandbox`), so it needs no systemd.

::

    c.JupyterHub.spawner_class = "lab_utils.hub.spawner.LimitedSpawner"
    c.Spawner.mem_limit = "2G"         # the class's limits, as on Zero to JupyterHub
    c.Spawner.cpu_limit = 1.0
    c.LimitedSpawner.max_processes = 512

The Hub must run as root to start servers as other users and make cgroups (as JupyterHub's
own LocalProcessSpawner needs). Without cgroups it says so once and starts servers unlimited.
When a server stops, everything left in its cgroup is killed and the cgroup removed, also when
the Hub restarted in between (the cgroup is in the spawner's state). Each user's cgroup is named
from their name and a hash of it, so no two users share one.
"""

from __future__ import annotations

import os
import re
from hashlib import sha256

import psutil
from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Integer

from ..grading.sandbox import Sandbox

__all__ = ["LimitedSpawner", "sandbox_name"]


def sandbox_name(user: str) -> str:
    """A user's cgroup name: readable, and unique (``a b`` and ``a_20b`` are two users)."""
    readable = re.sub(r"[^A-Za-z0-9_.-]", "_", user)[:24]
    return f"{readable}-{sha256(user.encode()).hexdigest()[:10]}"


class LimitedSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` with a cgroup per server (``mem_limit``, ``cpu_limit``, ``max_processes``)."""

    max_processes = Integer(512, config=True, help="tasks (processes and threads) a student's server may hold at once")

    _box: Sandbox | None = None

    def _limits(self) -> dict:
        memory = self.mem_limit or psutil.virtual_memory().total
        return {
            "memory_mb": memory / 2**20,
            "cpus": self.cpu_limit or float(os.cpu_count() or 1),
            "max_processes": self.max_processes,
        }

    def make_preexec_fn(self, name):
        become_user = super().make_preexec_fn(name)
        box = self._box

        def preexec():  # in the child, before exec: into the cgroup (as root), then the user
            if box is not None:
                box.enter()
            become_user()

        return preexec

    async def start(self):
        self._close_box()
        self._box = Sandbox(sandbox_name(self.user.name), prefix="labhub", **self._limits())
        if not self._box.isolated:
            self.log.warning(
                "%s: no cgroups here (not root?): the server runs without memory or process limits", self.user.name
            )
        try:
            return await super().start()
        except BaseException:
            self._close_box()
            raise

    def get_state(self):
        state = super().get_state()
        if self._box is not None and self._box.isolated:
            state["sandbox"] = self._box.state()
        return state

    def load_state(self, state):  # a restarted Hub: the running server's cgroup, to remove at its end
        super().load_state(state)
        if state.get("sandbox") and self._box is None:
            self._box = Sandbox.adopt(state["sandbox"], prefix="labhub")

    async def poll(self):
        status = await super().poll()
        if status is not None:  # the server ended by itself (or was killed): what it left goes too
            self._close_box()
        return status

    async def stop(self, now=False):
        try:
            await super().stop(now=now)
        finally:
            self._close_box()

    def _close_box(self):
        if self._box is not None:
            box, self._box = self._box, None
            box.close()  # kills what the server left (kernels, clusters), removes the cgroup
