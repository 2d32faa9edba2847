"""Students' servers on a class set up by ``python -m lab_utils.hub setup`` load none of
nbgrader's tools (its instructor menus, its formgrader, its exchange): Jupyter's own readers of
its configuration, given the students' configuration folder first, as the Hub gives it."""

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
