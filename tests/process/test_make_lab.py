"""`make lab`: JupyterLab answers 200 on /lab with its token, logs no error, stops on Ctrl-C."""

import os
import re
import signal
import urllib.request

from support import make_lab


def test_make_lab_serves_and_stops_on_ctrl_c(tmp_path):
    log = tmp_path / "lab.log"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), PORT="")
    proc, found = make_lab.start(log, env)
    try:
        base, port, token = found.groups()
        assert port != "0"
        with urllib.request.urlopen(f"{base}/lab?token={token}", timeout=30) as resp:
            assert resp.status == 200
            assert b"JupyterLab" in resp.read()
    finally:
        rc = make_lab.stop(proc, timeout=30)  # what Ctrl-C in the terminal sends
    # make itself re-raises SIGINT after its recipe ended (the shell shows 130); JupyterLab
    # must have shut down cleanly (checked in its log below) and nothing may be left.
    assert rc in (0, -signal.SIGINT)
    text = log.read_text(errors="replace")
    assert "Traceback" not in text
    assert not re.search(r"^\[E ", text, re.M), text
    assert "Shutting down" in text or "Interrupted" in text, text[-2000:]
