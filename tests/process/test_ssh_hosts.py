"""The real-machines path (``hosts="hostfile:..."``: ssh) against real sshd's.

Two emulated hosts each run their own ``sshd`` (a private config, host key and
authorized key in the test's folder; port 22 of *their* namespace, nothing on the
machine's). A third emulated host plays the head node where JupyterLab would run:
a driver there starts a TF cluster and an MPI job from a hostfile naming the other
two, with nothing but ssh to reach them, exactly as on a class's real nodes (the
repository and the run directory are on the "shared file system": this one).

Needs root, ``ip netns`` and openssh-server (``make setup`` installs it as root);
skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from lab_utils.cluster import netem

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
_missing = (
    netem.unavailable_reason()
    or (netem.how() != "netns" and "real sshd servers need named network namespaces (CAP_NET_ADMIN)")
    or None
) or next(
    (
        f"{tool} is not installed (make setup installs openssh-server as root)"
        for tool in (SSHD, "ssh", "ssh-keygen")
        if not shutil.which(tool)
    ),
    None,
)
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"no ssh hosts here: {_missing}")


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def start_sshd(net: netem.Network, i: int, folder: Path, authorized: Path) -> subprocess.Popen:
    """sshd in the foreground on host ``i``: ready when it logs that it listens."""
    Path("/run/sshd").mkdir(exist_ok=True)  # its privilege-separation directory
    config = folder / f"sshd-{i}.conf"
    config.write_text(
        textwrap.dedent(f"""\
        ListenAddress {net.address(i)}
        Port 22
        HostKey {keygen(folder / f"host-{i}")}
        AuthorizedKeysFile {authorized}
        PermitRootLogin prohibit-password
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        UsePAM no
        StrictModes no
        PidFile {folder / f"sshd-{i}.pid"}
        """)
    )
    proc = subprocess.Popen(net.command(i, [SSHD, "-D", "-e", "-f", str(config)]), stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline()
    if "Server listening" not in line:
        proc.kill()
        raise AssertionError(f"sshd on host {i} did not start: {line}{proc.stderr.read()}")
    return proc


DRIVER = """
import json, sys
from lab_utils.cluster import MPIJob, TFCluster
ssh = sys.argv[1].split()
with TFCluster(ps=1, workers=2, script={tf!r}, args={{"steps": 30}}, hosts="hostfile:" + sys.argv[2],
               ssh=ssh, progress=False, timeout=120) as c:
    results = c.wait()
tf = {{"results": results, "hosts": {{t.name: t.host for t in c.tasks}}}}
with MPIJob(np=2, script={mpi!r}, hosts="hostfile:" + sys.argv[2], launcher="mpirun",
            launcher_args=["--mca", "plm_rsh_agent", " ".join(ssh)], progress=False, timeout=120) as job:
    mpi = job.wait()
print(json.dumps({{"tf": tf, "mpi": mpi}}))
"""


@pytest.fixture
def ssh_hosts(tmp_path):
    """(network, ssh command, hostfile): hosts 1 and 2 serve ssh, host 0 is the head node."""
    before = set(netem.namespaces())
    net = netem.Network(netem.emulated(bandwidth="1gbit"), 3).build()
    daemons = []
    try:
        key = keygen(tmp_path / "id")
        authorized = tmp_path / "authorized_keys"
        authorized.write_text(Path(f"{key}.pub").read_text())
        daemons = [start_sshd(net, i, tmp_path, authorized) for i in (1, 2)]
        ssh = f"ssh -i {key} -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
        hostfile = tmp_path / "nodes.txt"
        hostfile.write_text(f"# the class's nodes\n{net.address(1)} slots=2\n{net.address(2)} slots=1\n")
        yield net, ssh, hostfile, daemons
    finally:
        for d in daemons:
            d.terminate()
            d.wait(timeout=10)
        assert net.destroy() == []
    assert set(netem.namespaces()) == before


def sessions(daemons) -> list[psutil.Process]:
    """What still runs under the sshd's: a remote task that outlived its ssh client."""
    return [kid for d in daemons for kid in psutil.Process(d.pid).children(recursive=True)]


def test_tf_cluster_and_mpi_job_over_ssh_from_a_hostfile(ssh_hosts, tmp_path):
    net, ssh, hostfile, daemons = ssh_hosts
    driver = DRIVER.format(tf=str(FIX / "cluster_tf_task.py"), mpi=str(FIX / "cluster_mpi_task.py"))
    env = dict(os.environ, LABS_RUN_ROOT=str(tmp_path / "runs"), PYTHONPATH=str(Path.cwd()))
    done = subprocess.run(
        net.command(0, [sys.executable, "-c", driver, ssh, str(hostfile)]),
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # the hostfile's slots, round-robin: ps:0 and worker:0 on host 1 (2 slots), worker:1 on host 2
    assert out["tf"]["hosts"] == {"ps:0": net.address(1), "worker:0": net.address(1), "worker:1": net.address(2)}
    assert set(out["tf"]["results"]) == {"worker:0", "worker:1"}
    # each worker counted its 30 steps in its own variable on the PS (across the link)
    assert [r["counter"] for r in out["tf"]["results"].values()] == [30.0, 30.0], out["tf"]
    # the MPI job's ranks: host 1's two slots, started by mpirun's own ssh (the head
    # node is not in the hostfile), and their allreduce went through
    assert sorted((r["rank"], r["size"], r["total"]) for r in out["mpi"].values()) == [(0, 2, 3), (1, 2, 3)]
    # every remote task and rank ended with its ssh session: nothing left under the sshd's
    assert sessions(daemons) == [], [p.cmdline() for p in sessions(daemons)]
