"""A machine that refuses user namespaces, for real: the test runs Lab 4 Part D's experiment
inside a user namespace whose ``user.max_user_namespaces`` is 0, so no emulated hosts can be
made there (named namespaces need the machine's /run/netns; a new user namespace is refused).
The experiment runs to the end on loopback, prints the one-line cause with the setting that
allows it, and shows the shipped reference run on emulated links, labelled; its own table
never claims a network."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap

import pytest

CODE = textwrap.dedent(
    """
    import json
    from lab_utils.cluster import netem
    from lab_utils.training import netexp
    t = netexp.experiment(workers=(1, 2), hosts="emulated:100mbit", steps=1, mb=0.1, compute_s=0.1)
    print("RESULT " + json.dumps({"how": netem.how(), "emulated": bool(t["emulated"].any()),
                                  "reference": "reference" in t.attrs, "rows": len(t)}))
    """
)


def test_with_user_namespaces_refused_part_d_runs_on_loopback_beside_the_labelled_reference(tmp_path):
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "--user", "--map-root-user", "true"], capture_output=True)
    if unshare is None or probe.returncode != 0:
        pytest.skip("no user namespace here to refuse others inside")
    refuse = "echo 0 > /proc/sys/user/max_user_namespaces && exec " + shlex.join([sys.executable, "-c", CODE])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABS_", "OMPI_"))}
    env.update(LABS_RUN_ROOT=str(tmp_path / "runs"))
    out = subprocess.run(
        [unshare, "--user", "--map-root-user", "sh", "-c", refuse],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert result == {"how": None, "emulated": False, "reference": True, "rows": 4}, result
    assert out.stdout.count("hosts are not emulated (user namespaces are off here (user.max_user_namespaces = 0") == 1
    assert "Your runs above are on loopback. reference run: emulated 100 Mbit/s links" in out.stdout, out.stdout
