"""The servers of a class set up by ``python -m lab_utils.hub setup``: students' load none of
nbgrader's tools (its instructor menus, its formgrader, its exchange), by Jupyter's own readers of
its configuration, given the students' configuration folder first, as the Hub gives it; and each
server's private TMPDIR is made by the Hub without following a link a student planted."""

from __future__ import annotations

import json

from lab_utils.hub.classroom import STUDENT_JUPYTER


def test_students_jupyter_loads_no_nbgrader_extension(tmp_path, monkeypatch):
    from jupyter_core.paths import jupyter_config_path
    from jupyter_server.extension.config import ExtensionConfigManager
    from jupyterlab_server.config import get_page_config

    def enabled():
        servers = ExtensionConfigManager(read_config_path=jupyter_config_path()).get_jpserver_extensions()
        lab = get_page_config([], None).get("disabledExtensions", {})
        disabled = {k for k, off in lab.items() if off} if isinstance(lab, dict) else set(lab)
        return {k for k, on in servers.items() if "nbgrader" in k and on}, "@jupyter/nbgrader" not in disabled

    servers, lab = enabled()
    assert servers and lab  # this environment has nbgrader's tools (the instructors' servers use them)
    for rel, conf in STUDENT_JUPYTER.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(json.dumps(conf))
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", str(tmp_path))
    assert enabled() == (set(), False)


def test_a_servers_private_tmp_is_never_made_through_a_link_the_student_planted(tmp_path):
    """The Hub makes ``~/.tmp`` as root: a student who made it a link to a folder of root's
    must not get that folder chowned to them."""
    import os
    import stat

    import pytest

    from lab_utils.hub.classroom import private_tmp

    home, victim = tmp_path / "home", tmp_path / "etc"
    home.mkdir()
    victim.mkdir(mode=0o755)
    made = private_tmp(home, os.getuid(), os.getgid())
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o700
    os.rmdir(made)
    (home / ".tmp").symlink_to(victim)
    before = victim.stat()
    with pytest.raises(RuntimeError, match="is not a folder"):
        private_tmp(home, 65534, 65534)
    after = victim.stat()
    assert (after.st_uid, after.st_gid, after.st_mode) == (before.st_uid, before.st_gid, before.st_mode)
