"""Emulated hosts without building anything: specs, parameters, subnets, commands."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from lab_utils.cluster import TFCluster, netem, userns
from lab_utils.training.runs import RanksRun


@pytest.mark.parametrize(
    ("text", "bits"), [("100mbit", 100_000_000), ("1gbit", 10**9), ("2.5Mbit", 2_500_000), ("64kbit", 64_000)]
)
def test_rate_bits(text, bits):
    assert netem.rate_bits(text) == bits


@pytest.mark.parametrize("text", ["100", "100mb", "fast", "0mbit", "-1gbit", ""])
def test_rate_bits_refuses(text):
    with pytest.raises(ValueError, match="bandwidth must look like"):
        netem.rate_bits(text)


def test_seconds():
    assert netem.seconds("0.5ms", "latency") == pytest.approx(0.0005)
    assert netem.seconds("20us", "latency") == pytest.approx(2e-5)
    with pytest.raises(ValueError, match="latency must look like"):
        netem.seconds("5", "latency")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(n=0), "integer >= 1"),
        (dict(n=True), "integer >= 1"),
        (dict(bandwidth="lots"), "bandwidth"),
        (dict(latency="1 hour"), "latency"),
        (dict(jitter="1ms"), "jitter needs a latency"),
        (dict(loss=100), "percentage"),
    ],
)
def test_emulated_refuses_bad_specs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        netem.emulated(**kwargs)


def test_parse_hosts():
    assert netem.parse_hosts(None) is None
    assert netem.parse_hosts("local") is None
    assert netem.parse_hosts("emulated") == netem.EmulatedHosts()
    spec = netem.parse_hosts("emulated:bandwidth=100mbit,latency=0.5ms,n=3,loss=0.1")
    assert spec == netem.EmulatedHosts(3, "100mbit", "0.5ms", None, 0.1)
    assert netem.parse_hosts("emulated:bandwidth=none").bandwidth is None
    assert netem.parse_hosts("emulated:100mbit") == netem.EmulatedHosts(bandwidth="100mbit")
    assert netem.parse_hosts("emulated:1gbit,n=2") == netem.EmulatedHosts(2, "1gbit")
    assert "100mbit links, 0.5ms latency" in str(spec)
    for bad in ("hostfile", "emulated:speed=1gbit", "emulated:bandwidth", "emulated:100mb"):
        with pytest.raises(ValueError, match="hosts must be|unknown emulated-hosts option"):
            netem.parse_hosts(bad)


def test_pick_subnet_avoids_what_is_used():
    used = [ipaddress.ip_network("10.200.0.0/16"), ipaddress.ip_network("10.201.5.0/24")]
    draws = iter([0, 256 + 5])  # the first /24 of the pool, then 10.201.5.0/24
    first = netem.pick_subnet(used, draw=lambda n: next(draws))
    assert first == ipaddress.ip_network("10.201.0.0/24")  # 10.200.* skipped
    second = netem.pick_subnet(used, draw=lambda n: next(draws))
    assert second == ipaddress.ip_network("10.201.6.0/24")  # its neighbour: 10.201.5.0/24 is taken
    assert all(first.subnet_of(netem.POOL) for first in (first, second))


def test_pick_subnet_full_pool():
    with pytest.raises(netem.NetworkError, match="no free /24"):
        netem.pick_subnet([netem.POOL], draw=lambda n: 0)


def test_network_command_and_addresses(tmp_path):
    net = netem.Network(netem.emulated(), 3, lock_dir=tmp_path)
    net.subnet = ipaddress.ip_network("10.203.7.0/24")
    assert [net.address(i) for i in range(3)] == ["10.203.7.1", "10.203.7.2", "10.203.7.3"]
    assert net.command(2, ["python", "x.py"]) == ["ip", "netns", "exec", net.hosts[2], "python", "x.py"]
    assert all(netem.NAMESPACE_NAME.match(n) for n in [net.hub, *net.hosts])


def test_remove_touches_only_its_own_names(monkeypatch):
    """A state file is data: remove() deletes nothing that this module did not name."""
    calls = []
    monkeypatch.setattr(netem, "namespaces", lambda: ["labnet-0123abcd-h0"])
    monkeypatch.setattr(netem, "run_command", lambda cmd, check=True: calls.append(cmd))
    assert netem.remove({"hub": "default", "hosts": ["eth0", "labnet-0123abcd-h0", "../x"]}) == [
        "labnet-0123abcd-h0"  # still listed by the stub: reported as left
    ]
    assert calls == [["ip", "netns", "del", "labnet-0123abcd-h0"]] * 5  # tried again while still listed


def test_tfcluster_takes_emulated_hosts():
    script = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_task.py")
    c = TFCluster(ps=1, workers=2, script=script, hosts="emulated:bandwidth=100mbit")
    assert c.emulate == netem.EmulatedHosts(None, "100mbit") and c.hosts == [None] * 3
    c = TFCluster(ps=1, workers=2, script=script, hosts=netem.emulated(2))
    assert c.emulate.n == 2


def test_mpijob_takes_emulated_hosts():
    from lab_utils.cluster import MPIJob

    script = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_mpi_task.py")
    job = MPIJob(np=2, script=script, launcher="mpirun", hosts="emulated:n=2")
    assert job.emulate == netem.EmulatedHosts(n=2) and job.hostfile is None and job.hosts is None
    assert job._local_ranks() == 2  # every rank runs on this machine: the memory check counts them


def test_netexp_speedups_are_over_each_mode_s_own_smallest_run(monkeypatch):
    from lab_utils.training.netexp import runs as netexp

    rates = {("ps", 1): 50.0, ("ps", 4): 100.0, ("allreduce", 1): 60.0, ("allreduce", 4): 180.0}
    monkeypatch.setattr(
        netexp,
        "run_netexp",
        lambda mode, w, **kw: RanksRun(
            label=mode,
            row={"mode": mode, "workers": w, "examples_per_s": rates[(mode, w)], "step_s": 1.0, "network": "test"},
        ),
    )
    table = netexp.experiment(workers=(1, 4)).set_index(["mode", "workers"])
    assert table.loc[("ps", 4), "speedup"] == 2.0 and table.loc[("allreduce", 4), "speedup"] == 3.0
    assert table.loc[("ps", 4), "ideal"] == 4.0
    monkeypatch.undo()
    with pytest.raises(ValueError, match="mode must be one of"):
        netexp.run_netexp("gossip", 2)
    with pytest.raises(ValueError, match="workers must be an integer"):
        netexp.run_netexp("ps", 0)


# ---- real hosts: hostfile and Slurm (what can be checked without the machines)
def test_read_hostfile_forms_and_errors(tmp_path):
    from lab_utils.cluster import hosts

    f = tmp_path / "nodes.txt"
    f.write_text("# the class's nodes\nn1 slots=2\n\nn2:3   # Horovod's form\nn3\n")
    assert hosts.read_hostfile(f) == ["n1", "n1", "n2", "n2", "n2", "n3"]
    assert hosts.place(hosts.read_hostfile(f), 8) == ["n1", "n1", "n2", "n2", "n2", "n3", "n1", "n1"]
    f.write_text("n1 slots=two\n")
    with pytest.raises(ValueError, match="line 1"):
        hosts.read_hostfile(f)
    f.write_text("# nothing\n")
    with pytest.raises(ValueError, match="names no host"):
        hosts.read_hostfile(f)
    with pytest.raises(ValueError, match="cannot read the hostfile"):
        hosts.read_hostfile(tmp_path / "missing.txt")


def test_slurm_hosts_from_the_allocation():
    from lab_utils.cluster import hosts

    calls = []

    def scontrol(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "c01\nc02\nc03\n", "")

    assert hosts.slurm_hosts({"SLURM_JOB_NODELIST": "c[01-03]"}, run=scontrol) == ["c01", "c02", "c03"]
    assert calls == [["scontrol", "show", "hostnames", "c[01-03]"]]
    with pytest.raises(ValueError, match="salloc"):
        hosts.slurm_hosts({})


def test_tfcluster_on_a_hostfile_and_on_slurm(tmp_path, monkeypatch):
    from lab_utils.cluster import hosts

    script = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_task.py")
    f = tmp_path / "nodes.txt"
    f.write_text("n1\nn2\n")
    c = TFCluster(ps=1, workers=2, script=script, hosts=f"hostfile:{f}")
    assert c.hosts == ["n1", "n2", "n1"] and c.remote_via == "ssh"
    monkeypatch.setattr(hosts, "slurm_hosts", lambda: ["c01", "c02"])
    c = TFCluster(ps=1, workers=3, script=script, hosts="slurm")
    assert c.hosts == ["c01", "c02", "c01", "c02"] and c.remote_via == "srun"
    c.run_dir = tmp_path
    task = c.plan()[1]
    cmd = c.task_command(task, {})
    assert cmd[:5] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=c02", "--overlap"]
    assert cmd[-1] == script


def test_mpijob_on_a_hostfile_and_on_slurm(tmp_path, monkeypatch):
    from lab_utils.cluster import MPIJob, hosts

    script = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_mpi_task.py")
    f = tmp_path / "nodes.txt"
    f.write_text("n1 slots=2\n")
    job = MPIJob(np=2, script=script, launcher="mpirun", hosts=f"hostfile:{f}")
    assert job.hostfile == f and "--hostfile" in job.command()[0]
    monkeypatch.setattr(hosts, "slurm_hosts", lambda: ["c01", "c02"])
    job = MPIJob(np=2, script=script, launcher="mpirun", hosts="slurm")
    assert job.hosts == ["c01:1", "c02:1"]


def test_spec_or_local_says_once_why_hosts_are_local(monkeypatch, capsys):
    monkeypatch.setattr(netem, "unavailable_reason", lambda: "creating network namespaces needs root")
    assert netem.spec_or_local("emulated:100mbit") is None
    assert netem.spec_or_local("local") is None
    assert capsys.readouterr().out.count("hosts are not emulated (creating network namespaces needs root)") == 1
    monkeypatch.setattr(netem, "unavailable_reason", lambda: None)
    assert netem.spec_or_local("emulated:100mbit") == netem.EmulatedHosts(bandwidth="100mbit")


def test_mb_per_step_from_the_link_counters(monkeypatch):
    net = netem.Network(netem.emulated(), 2)
    monkeypatch.setattr(net, "counters", lambda: {0: {"sent": 3e6, "received": 1e6}, 1: {"sent": 0, "received": 2e6}})
    assert net.mb_per_step(4) == {0: 1.0, 1: 0.5}
    assert net.mb_per_step(2, {0: {"sent": 3_000_000, "received": 1_000_000}}) == {0: 2.0}  # counts read once


def test_host_per_rank_refuses_a_host_count():
    assert netem.host_per_rank("emulated:100mbit") == netem.EmulatedHosts(bandwidth="100mbit")
    assert netem.host_per_rank("local") is None
    with pytest.raises(ValueError, match="one emulated host per rank here, leave n unset"):
        netem.host_per_rank("emulated:100mbit,n=2")


def test_capabilities_are_read_from_the_status_file():
    root = "Name:\tx\nCapEff:\t000001ffffffffff\n"
    dropped = "Name:\tx\nCapEff:\t0000000000000000\n"
    assert netem.has_capability(netem.CAP_NET_ADMIN, netem.capabilities(root))
    assert netem.has_capability(netem.CAP_SYS_ADMIN, netem.capabilities(root))
    assert not netem.has_capability(netem.CAP_NET_ADMIN, netem.capabilities(dropped))
    only_net = f"CapEff:\t{1 << netem.CAP_NET_ADMIN:016x}\n"
    assert netem.has_capability(netem.CAP_NET_ADMIN, netem.capabilities(only_net))
    assert not netem.has_capability(netem.CAP_SYS_ADMIN, netem.capabilities(only_net))


@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({"user/max_user_namespaces": "0"}, "sysctl -w user.max_user_namespaces="),
        ({"kernel/unprivileged_userns_clone": "0"}, "sysctl -w kernel.unprivileged_userns_clone=1"),
        ({"kernel/apparmor_restrict_unprivileged_userns": "1"}, "apparmor_restrict_unprivileged_userns=0"),
        ({"user/max_user_namespaces": "100"}, "seccomp"),
    ],
)
def test_a_refused_user_namespace_names_its_cause_and_setting(tmp_path, files, says):
    for name, value in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    reason = netem.userns_refusal("unshare: unshare failed: Operation not permitted", tmp_path)
    assert says in reason, reason


def test_the_network_kind_follows_what_this_process_may_do(monkeypatch):
    monkeypatch.setattr(netem, "how", lambda: "userns")
    net = netem.network(netem.emulated(), 2)
    assert isinstance(net, userns.UserNetwork) and net.kind == "userns"
    net.pids = [101, 102]
    assert net.command(1, ["python", "x.py"]) == [
        *["nsenter", "--target", "102", "--user", "--net", "--preserve-credentials"],
        *["python", "x.py"],
    ]
    monkeypatch.setattr(netem, "how", lambda: "netns")
    assert type(netem.network(netem.emulated(), 2)) is netem.Network
    monkeypatch.setattr(netem, "how", lambda: None)
    monkeypatch.setattr(netem, "unavailable_reason", lambda: "no way")
    with pytest.raises(netem.NetworkError, match="no way"):
        netem.network(netem.emulated(), 2)


def test_shaping_asks_netem_only_for_latency_or_loss():
    netem_args, tbf = netem.shaping(netem.emulated(bandwidth="100mbit"))
    assert netem_args is None and tbf[:3] == ["tbf", "rate", "100000000bit"]
    netem_args, tbf = netem.shaping(netem.emulated(bandwidth="100mbit", latency="1ms", loss=0.5))
    assert netem_args == ["netem", "delay", "1ms", "loss", "0.5%", "rate", "100000000bit"] and tbf
    assert netem.shaping(netem.emulated(bandwidth=None)) == (None, None)


def test_where_no_links_can_be_made_netexp_shows_the_shipped_reference_labelled(monkeypatch, capsys):
    """Loopback is never presented as a network: the student's table stays loopback's, and a
    reference run on emulated links (lab_utils.reference_runs) is printed and drawn beside it."""
    import matplotlib

    matplotlib.use("Agg")
    from lab_utils import reference_runs
    from lab_utils.training.netexp import runs as netexp

    monkeypatch.setattr(netem, "unavailable_reason", lambda: "user namespaces are off here (sysctl -w ...)")
    rates = {("ps", 1): 50.0, ("ps", 4): 190.0, ("allreduce", 1): 60.0, ("allreduce", 4): 230.0}

    seen = []

    def fake(mode, w, hosts=None, **kw):
        seen.append(hosts)
        row = {"mode": mode, "workers": w, "examples_per_s": rates[(mode, w)], "step_s": 1.0, "network": "loopback"}
        return RanksRun(label=mode, row=row)

    monkeypatch.setattr(netexp, "run_netexp", fake)
    table = netexp.experiment(workers=(1, 4), hosts="emulated:100mbit")
    out = capsys.readouterr().out
    assert seen == [None] * 4  # the runs themselves are on loopback
    assert out.count("hosts are not emulated (user namespaces are off here") == 1
    ref = table.attrs["reference"]
    assert ref.attrs["label"].startswith("reference run: emulated 100 Mbit/s links") and ref["emulated"].all()
    at4 = ref[ref["workers"] == 4].set_index("mode")["speedup"]
    assert (
        f"PS reaches {at4['ps']:.2f}x and the ring {at4['allreduce']:.2f}x" in out
        and "Your runs above are on loopback" in out
    )
    assert at4["allreduce"] > at4["ps"]  # what the shipped run shows: the lesson's contrast
    assert list(table["speedup"]) == [1.0, 3.8, 1.0, 230.0 / 60.0]  # the student's own figures, untouched
    labels = [line.get_label() for line in netexp.plot(table).axes[0].get_lines()]
    assert "ps (yours: loopback)" in labels and "allreduce (reference: emulated links)" in labels
    assert reference_runs.load(netexp.REFERENCE)["made_with"].startswith("python bench/bench_network.py")
    with pytest.raises(ValueError, match="known: .*netexp_100mbit"):
        reference_runs.load("nothing")
    monkeypatch.setattr(netem, "unavailable_reason", lambda: None)  # emulated: no reference needed
    assert "reference" not in netexp.experiment(workers=(1, 4), hosts="emulated:100mbit").attrs


@pytest.mark.parametrize(
    ("name", "says"), [("compression_100mbit", "step time in ms: none "), ("hybrid_100mbit", "hybrid ")]
)
def test_lab6_shows_a_labelled_reference_only_where_links_were_asked_for_and_not_made(capsys, name, says):
    from lab_utils import reference_runs

    assert reference_runs.beside(name, "emulated:100mbit", emulated=True) is None  # the student's own links
    assert reference_runs.beside(name, "local", emulated=False) is None  # loopback was what was asked for
    assert capsys.readouterr().out == ""
    ref = reference_runs.beside(name, "emulated:100mbit", emulated=False)
    out = capsys.readouterr().out
    assert out.startswith("Your runs above are on loopback. reference run: emulated 100 Mbit/s links") and says in out
    assert ref["emulated"].all() and ref.attrs["made_with"].startswith("python bench/bench_communication.py")
    if name == "compression_100mbit":  # what the shipped run shows: the lesson's ordering
        ms = ref.set_index("method")["step_ms"]
        assert ms["none"] > ms["fp16"] > max(ms["onebit"], ms["topk"])
    else:
        s = ref.set_index("mode")["step_s"]
        assert s["hybrid"] < min(s["ps"], s["allreduce"])
