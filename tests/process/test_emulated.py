"""Emulated hosts for real: namespaces, shaped links, clusters on them, and nothing left.

Runs the way this process may build them (``netem.how()``): named namespaces with
CAP_NET_ADMIN (CI as root), a user namespace of the job's own without
(tests/process/test_unprivileged.py runs this module again as a real unprivileged user);
skipped with the reason where neither can be made, except the fallback test, which runs
everywhere. Every test counts the named namespaces, the machine's own links and this
process's children before and after."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import kernels

from lab_utils.cluster import MPIJob, TFCluster, netem, reap

FIX = Path(__file__).resolve().parents[1] / "fixtures"
FAKE = str(FIX / "cluster_task.py")
TF = str(FIX / "cluster_tf_task.py")
KERNEL = str(FIX / "cluster_kernel.py")
SMALL = 50 * 1024**2
needs_netns = pytest.mark.skipif(
    netem.unavailable_reason() is not None, reason=f"no emulated hosts here: {netem.unavailable_reason()}"
)


def _exists(net: netem.Network) -> bool:
    """Whether ``net``'s namespaces are there: by name (netns), or held by its processes (userns)."""
    if net.kind == "netns":
        return {net.hub, *net.hosts} <= set(netem.namespaces())
    return all(os.path.exists(f"/proc/{pid}/ns/net") for pid in [net.holder.pid, *net.pids])


def own_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


@pytest.fixture
def nothing_left():
    """Namespaces, the machine's links and this process's children, before == after."""
    if netem.unavailable_reason() is not None:
        yield
        return
    before = (_named(), own_links())
    yield
    kids = psutil.Process().children(recursive=True)
    assert kids == [], f"left running: {[k.cmdline() for k in kids]}"
    assert (_named(), own_links()) == before


def _named() -> set[str]:
    """The named emulated namespaces: the ones this process may make (CAP_NET_ADMIN). A user
    namespace's are held by processes (the children checked above); the named ones listed
    then are another user's, which come and go as they please."""
    return set(netem.namespaces()) if netem.how() == "netns" else set()


def test_without_root_the_cluster_runs_on_local_hosts(monkeypatch, capsys, nothing_left):
    monkeypatch.setattr(netem, "unavailable_reason", lambda: "creating network namespaces needs root")
    with TFCluster(ps=1, workers=2, script=FAKE, hosts=netem.emulated(), memory_per_task=SMALL) as c:
        results = c.wait()
    assert set(results) == {"worker:0", "worker:1"} and not c.emulated
    assert all(t.host is None for t in c.tasks)
    out = capsys.readouterr().out
    assert out.count("hosts are not emulated (creating network namespaces needs root)") == 1


@needs_netns
def test_links_are_shaped_both_ways(nothing_left):
    """20 Mbit/s links: 4 MB from host 0 to host 1 cannot go faster (a slow machine only
    makes it slower, so the bound cannot flake), and each port counts what crossed it."""
    net = netem.network(netem.emulated(bandwidth="20mbit"), 2).build()
    size = 4 * 10**6
    try:
        server = subprocess.Popen(
            net.command(1, [sys.executable, "-c", _SINK.format(addr=net.address(1))]), stdout=subprocess.PIPE, text=True
        )
        assert server.stdout.readline().strip() == "listening"
        started = time.monotonic()
        subprocess.run(
            net.command(0, [sys.executable, "-c", _SOURCE.format(addr=net.address(1), size=size)]),
            check=True,
            timeout=60,
        )
        received = int(server.communicate(timeout=60)[0])
        elapsed = time.monotonic() - started
        counters = net.counters()
    finally:
        assert net.destroy() == []
    assert received == size
    assert size * 8 / elapsed < 20e6 * 1.1, f"{size * 8 / elapsed / 1e6:.1f} Mbit/s over a 20 Mbit/s link"
    assert counters[0]["sent"] >= size and counters[1]["received"] >= size
    assert counters[1]["sent"] < size / 10  # only ACKs came back
    # A silent switch: what a host receives, the other sent (less what a queue dropped);
    # nothing of the links' own (IPv6 announcements, IGMP) arrives while they are read.
    assert counters[1]["received"] <= counters[0]["sent"] and counters[0]["received"] <= counters[1]["sent"]
    assert net.counters() == counters  # after destroy: the last counts read


_SINK = """
import socket
s = socket.socket(); s.bind(("{addr}", 5001)); s.listen(); print("listening", flush=True)
c, _ = s.accept(); n = 0
while chunk := c.recv(1 << 16):
    n += len(chunk)
print(n)
"""
_SOURCE = """
import socket
s = socket.create_connection(("{addr}", 5001), timeout=30)
s.sendall(b"x" * {size}); s.close()
"""


@needs_netns
def test_tf_cluster_on_emulated_hosts(nothing_left):
    """A real TF PS cluster, one task per emulated host: each binds its own address, and
    the PS's port counts the variable updates the workers send it."""
    with TFCluster(ps=1, workers=2, script=TF, args={"steps": 30}, hosts="emulated:bandwidth=100mbit") as c:
        subnet = c.network.subnet
        results = c.wait()
    assert {r["counter"] for r in results.values()} == {30.0}
    assert [t.host for t in c.tasks] == [str(subnet.network_address + i) for i in (1, 2, 3)]
    assert not any(subnet.overlaps(n) for n in _machine_networks())
    bytes_ = c.network.counters()
    assert bytes_[0]["received"] > bytes_[1]["received"] > 0  # the PS hears from both workers


def _machine_networks():
    import ipaddress

    for line in subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout.splitlines():
        yield ipaddress.ip_network(line.split()[3], strict=False)


@needs_netns
def test_twenty_emulated_clusters_in_a_row(nothing_left):
    subnets = []
    for _ in range(20):
        with TFCluster(ps=1, workers=2, script=FAKE, hosts=netem.emulated(2), memory_per_task=SMALL) as c:
            assert _exists(c.network)
            subnets.append(c.network.subnet)
            c.wait()
        assert c.network.destroyed
    assert len(subnets) == 20


@needs_netns
def test_four_emulated_clusters_at_once(nothing_left):
    infos = kernels.run_at_once(4, "--hosts", "emulated:n=3", "--args", json.dumps({"steps": 40}))
    subnets = {i["network"]["subnet"] for i in infos}
    assert len(subnets) == 4, f"address clash: {subnets}"
    for info in infos:
        assert set(info["results"]) == {"worker:0", "worker:1"}


@needs_netns
def test_killed_kernel_leaves_no_process_and_reap_removes_its_hosts(run_root, nothing_left):
    kernel = subprocess.Popen(
        [sys.executable, KERNEL, "--hosts", "emulated", "--args", json.dumps({"steps": 10**6, "step-time": 0.05})],
        stdout=subprocess.PIPE,
        text=True,
    )
    info = json.loads(kernel.stdout.readline())
    procs = psutil.Process(kernel.pid).children(recursive=True)
    assert len(procs) >= 6  # 3 guards + 3 tasks
    record = info["network"]
    if record.get("kind") == "userns":  # held by the kernel's child: it ends with the kernel's pipe
        assert any(p.pid == record["holder"] for p in procs)
    else:
        assert set(record["hosts"]) | {record["hub"]} <= set(netem.namespaces())
    kernel.kill()
    kernel.wait()
    gone, alive = psutil.wait_procs(procs, timeout=10)
    assert alive == [], "the guards stop every task (and the network's holder ends) without reap"
    assert reap() == [info["run_dir"]]
    assert not set(record["hosts"]) & set(netem.namespaces())
    state = json.loads(Path(info["run_dir"], "state.json").read_text())
    assert state["network_removed"] is True and state["network"] == record
    assert reap() == []


@needs_netns
def test_a_port_taken_on_an_emulated_host_is_only_that_host_s(nothing_left):
    """Ports are per namespace: the one a task gets is free there whatever this machine's
    own loopback uses (no clash with another user's cluster on the same port)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        net = netem.network(netem.emulated(bandwidth=None), 1).build()
        try:
            code = (
                f"import socket; s = socket.socket(); s.bind(('{net.address(0)}', {port})); "
                f"t = socket.socket(); t.bind(('127.0.0.1', {port})); print('ok')"
            )
            out = subprocess.run(net.command(0, [sys.executable, "-c", code]), capture_output=True, text=True)
        finally:
            assert net.destroy() == []
    assert out.stdout.strip() == "ok", out.stderr
    assert os.path.exists("/proc/self/ns/net")


@needs_netns
@pytest.mark.parametrize(
    ("launcher", "script"), [("mpirun", "cluster_mpi_task.py"), ("horovodrun", "cluster_hvd_task.py")]
)
def test_mpi_job_on_emulated_hosts(launcher, script, nothing_left):
    """The launcher runs on host 0 and starts the other host's rank through its own
    remote-shell machinery (the emulated ssh): the allreduce crosses the link."""
    job = MPIJob(
        np=2, script=str(FIX / script), launcher=launcher, controller="mpi", hosts=netem.emulated(), progress=False
    )
    with job:
        results = job.wait(timeout=180)
        cmd = job.command()[0]
    assert {r["total"] for r in results.values()} == {3}
    on_host_0 = job.network.command(0, [])
    assert cmd[: len(on_host_0)] == on_host_0
    assert f"{job.network.address(1)}:1" in " ".join(cmd)
    bytes_ = job.network.counters()
    assert bytes_[1]["sent"] > 0 and bytes_[1]["received"] > 0


@needs_netns
def test_gloo_on_emulated_hosts_is_refused_before_anything_runs(nothing_left):
    job = MPIJob(np=2, script=str(FIX / "cluster_hvd_task.py"), controller="gloo", hosts="emulated", progress=False)
    with pytest.raises(ValueError, match="use controller='mpi'"):
        job.start()
    assert job.network.destroyed and not job.running


@needs_netns
def test_metrics_count_each_emulated_task_s_own_bytes(nothing_left):
    """On emulated hosts the dstat-like table has per-task network columns: each task's
    bytes are its host's, and the PS hears from both workers."""
    from lab_utils.metrics import Monitor

    # Enough steps that each worker's traffic spans several samples (1000 steps: about 0.7 s
    # here). A worker's bytes after its last sample are not seen (its namespace's counters
    # go with it); 60 steps took 50-80 ms, and CI once saw a worker's whole burst fall
    # between two 0.25 s samples: 0 bytes.
    with TFCluster(ps=1, workers=2, script=TF, args={"steps": 1000}, hosts=netem.emulated(), progress=False) as c:
        with Monitor(cluster=c, interval=0.1) as mon:
            c.wait()
        links = c.network.counters()
    s = mon.summary()
    assert s.loc["total", "network_scope"].startswith("task"), s.to_string()
    for i, task in enumerate(("ps:0", "worker:0", "worker:1")):
        measured = s.loc[task, "Network R"] + s.loc[task, "Network W"]
        assert 0 < measured <= (links[i]["sent"] + links[i]["received"]) * 1.05, (task, measured, links[i])
    assert s.loc["ps:0", "Network R"] > s.loc["worker:0", "Network R"] * 0.5


@needs_netns
def test_a_stopped_emulated_cluster_starts_again_on_a_new_network(nothing_left):
    c = TFCluster(ps=1, workers=2, script=FAKE, hosts=netem.emulated(), memory_per_task=SMALL, progress=False)
    first = c.start().network
    c.wait()
    second = c.start().network
    c.wait()
    assert first.destroyed and second.destroyed and first.id != second.id
    assert [t.host for t in c.tasks] == [second.address(i) for i in range(3)]


@needs_netns
def test_lab2_training_runs_on_emulated_hosts_through_run_ps(nothing_left):
    """Lab 2's ``HOSTS`` parameter: ``run_ps`` hands it to the cluster, each task gets
    its own host, the run trains to the end, and its dstat table is per task."""
    from lab_utils.grading import reference_script
    from lab_utils.training.ps import runs as ps_runs

    script = reference_script("02_ps_async", "train_async.py")
    run = ps_runs.run_ps(
        script,
        workers=2,
        args={"steps": 60, "batch_size": 50, "eval_every": 30},
        hosts="emulated:bandwidth=100mbit",
        interval=0.25,
        progress=False,
    )
    assert set(run.results) == {"worker:0", "worker:1"} and run.final_global_step >= 60
    state = json.loads((Path(run.run_dir) / "state.json").read_text())
    addresses = {t["name"]: t["host"] for t in state["tasks"]}
    assert len(set(addresses.values())) == 3 and all(a.startswith("10.") for a in addresses.values()), addresses
    table = run.dstat_table()
    assert table.attrs["network_scope"].startswith("task"), table.attrs
    assert table.loc["ps:0", "Total Read (MB)"] > 0 and table.loc["worker:1", "Total Write (MB)"] > 0, table
