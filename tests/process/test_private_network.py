"""Every local cluster in a network of its own (userns.PrivateNetwork): its tasks talk over
the loopback of a network namespace that has nothing else, so their servers (TensorFlow's
gRPC, which runs whatever graph it is sent; Gloo; Open MPI) cannot be reached from this
machine's namespace, by another user or from the network. As root it is a plain network
namespace; as any other user, a user namespace of the job's own
(tests/process/test_unprivileged.py runs this module again as one). Where neither can be
made, a TF cluster refuses to start on a machine with a network interface unless told
otherwise, and MPI jobs are told to use loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from lab_utils.cluster import ClusterError, MPIJob, TFCluster, hosts, reap, userns

pytestmark = [
    pytest.mark.skipif(userns.private_how()[0] is None, reason=f"no private network here: {userns.private_how()[1]}"),
]

FIX = Path(__file__).resolve().parents[1] / "fixtures"
FAKE = str(FIX / "cluster_task.py")
KERNEL = str(FIX / "cluster_kernel.py")
SMALL = 50 * 1024**2
OURS = os.readlink("/proc/self/ns/net")


def _listening() -> set[int]:
    """TCP ports listening in this process's (the machine's) network namespace."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}


def _task_processes(job) -> list[psutil.Process]:
    """The processes each task's guard started (the task itself, and what it started)."""
    procs = []
    for t in job.tasks:
        procs += psutil.Process(t.pid).children(recursive=True)
    return procs


@pytest.mark.parametrize("silent", [False, True], ids=["reports-ready", "only-listens"])
def test_a_local_tf_cluster_listens_nowhere_on_this_machine(silent):
    """Silent: tasks that never report ready (a plain script's servers) are found listening
    inside the cluster's namespace (as root, and as a student in a user namespace)."""
    args = {"steps": 10**6, "step-time": 0.05, "silent": silent}
    with TFCluster(ps=1, workers=2, script=FAKE, args=args, memory_per_task=SMALL, progress=False) as c:
        assert c.network.kind == "private" and all(t.host is None for t in c.tasks)
        assert [t.state for t in c.tasks] == ["ready"] * 3
        assert all(bool(t.events("ready")) != silent for t in c.tasks)
        ports = [t.port for t in c.tasks]
        inside = {os.readlink(f"/proc/{p.pid}/ns/net") for p in _task_processes(c)}
        assert len(_task_processes(c)) >= 3  # a task under each guard
        listening = _listening()
        refused = []
        for port in ports:  # what another user, or this one outside the cluster, would try
            with socket.socket() as s:
                s.settimeout(5)
                refused.append(s.connect_ex(("127.0.0.1", port)) != 0)
        holder = c.network.holder.pid
    assert len(inside) == 1 and OURS not in inside, inside  # one namespace, not this one
    assert not set(ports) & listening, (ports, sorted(listening))
    assert all(refused), list(zip(ports, refused, strict=True))
    assert c.network.destroyed and not psutil.pid_exists(holder)


@pytest.mark.parametrize(
    ("launcher", "controller", "script"),
    [
        ("mpirun", "mpi", "cluster_mpi_task.py"),
        ("horovodrun", "gloo", "cluster_hvd_task.py"),
        ("horovodrun", "mpi", "cluster_hvd_task.py"),
    ],
)
def test_mpi_and_horovod_jobs_run_every_process_in_their_own_network(launcher, controller, script):
    """Every rank (and so every socket Gloo or Open MPI opens) is in the job's namespace:
    nothing of theirs can listen in this one."""
    job = MPIJob(np=2, script=str(FIX / script), launcher=launcher, controller=controller, progress=False)
    with job:
        assert job.network.kind == "private" and not job.emulated
        cmd, inside = job.command()[0], job.network.command(0, [])
        results = job.wait(timeout=180)
    assert {r["total"] for r in results.values()} == {3}, results
    ranks_ns = {r["netns"] for r in results.values()}
    assert len(ranks_ns) == 1 and OURS not in ranks_ns, (ranks_ns, OURS)
    assert cmd[: len(inside)] == inside  # the launcher too: mpirun's and horovodrun's own servers


def test_a_killed_kernel_leaves_no_process_and_no_network(run_root):
    kernel = subprocess.Popen(
        [sys.executable, KERNEL, "--args", json.dumps({"steps": 10**6, "step-time": 0.05})],
        stdout=subprocess.PIPE,
        text=True,
    )
    info = json.loads(kernel.stdout.readline())
    procs = psutil.Process(kernel.pid).children(recursive=True)
    record = info["network"]
    assert record["kind"] == "private" and any(p.pid == record["holder"] for p in procs)
    kernel.kill()
    kernel.wait()
    _, alive = psutil.wait_procs(procs, timeout=15)
    assert alive == [], "the guards stop every task and the holder ends with the kernel's pipe"
    assert reap() == [info["run_dir"]]
    assert reap() == []


def test_where_no_namespace_can_be_made_a_tf_cluster_refuses_unless_told(monkeypatch, capsys):
    monkeypatch.setattr(userns, "private_how", lambda: (None, "user namespaces are off here (sysctl ...)"))
    monkeypatch.setattr(hosts, "network_interfaces", lambda: ["eth0"])
    monkeypatch.delenv("LABS_ALLOW_EXPOSED", raising=False)
    c = TFCluster(ps=1, workers=1, script=FAKE, memory_per_task=SMALL, progress=False)
    with pytest.raises(ClusterError, match=r"exposed_ok=True.*LABS_ALLOW_EXPOSED=1") as err:
        c.start()
    assert "user namespaces are off here" in str(err.value) and "eth0" in str(err.value)
    assert not c.running and c.tasks == []  # refused before any task started
    with TFCluster(ps=1, workers=1, script=FAKE, memory_per_task=SMALL, exposed_ok=True) as c:
        c.wait()
    assert c.network is None and any("anyone who reaches them" in n for n in c.notes)
    monkeypatch.setattr(hosts, "network_interfaces", lambda: [])  # loopback only: a grading sandbox
    with TFCluster(ps=1, workers=1, script=FAKE, memory_per_task=SMALL, progress=False) as c:
        c.wait()
    assert c.network is None


def test_where_no_namespace_can_be_made_mpi_uses_loopback(monkeypatch):
    monkeypatch.setattr(userns, "private_how", lambda: (None, "no way"))
    job = MPIJob(np=2, script=str(FIX / "cluster_mpi_task.py"), launcher="mpirun", progress=False)
    with job:
        cmd = job.command()[0]
        results = job.wait(timeout=180)
    assert {r["total"] for r in results.values()} == {3}
    assert "oob_tcp_if_include" in cmd and cmd[cmd.index("oob_tcp_if_include") + 1] == "lo"
    assert {r["netns"] for r in results.values()} == {OURS}
