"""A real Slurm cluster on this machine, for the tests: ``slurmctld`` on a head node and
one ``slurmd`` per compute node, each an emulated host (its own network namespace, host
name and ``/etc/hosts``), authenticated by a private ``munged``.

The configuration, munge key and logs live in the folder given; the sockets, state and
spool in a short folder under ``/run`` (a socket's path has at most 108 bytes). The daemons listen on Slurm's usual ports 6817/6818 *of their own namespaces*, so nothing
is reachable from the machine's network. :meth:`SlurmCluster.stop` cancels what is still
queued or running, stops the daemons, checks that no process is left on any node, removes
the namespaces and the munge key, and returns what it could not remove.

A node's processes see the machine's file system (the shared file system of a real
cluster: the repository, the virtual environment, the run directories). The wrapper is
``nsenter --net`` (not ``ip netns exec``, which remounts ``/sys`` and hides the cgroup
hierarchy slurmd's cgroup plugin probes), then ``unshare --mount --uts`` for the host name
and a private ``/etc/hosts`` naming every node (what DNS does on a real cluster).

Needs root (named network namespaces), ``slurm-wlm`` and ``munge`` (``make setup``
installs them as root, not started); :func:`missing` says what is missing otherwise."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import textwrap
from pathlib import Path

import psutil

from lab_utils.cluster import netem
from support.poll import poll_for

#: what the fixture runs, and the Debian package each comes from
TOOLS = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "salloc": "slurm-client",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "sinfo": "slurm-client",
    "scontrol": "slurm-client",
    "munged": "munge",
    "mungekey": "munge",
    "nsenter": "util-linux",
    "unshare": "util-linux",
}
_SBIN = ("/usr/sbin", "/sbin")


def tool(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def missing() -> str | None:
    """Why a Slurm cluster cannot run here (None when it can)."""
    reason = netem.unavailable_reason()
    if reason is None and netem.how() != "netns":
        reason = "a Slurm cluster's nodes need named network namespaces (root with CAP_NET_ADMIN)"
    if reason is not None:
        return reason
    absent = [name for name in TOOLS if tool(name) is None]
    if absent:
        packages = sorted({TOOLS[name] for name in absent})
        return f"{', '.join(absent)} not installed (Debian's {', '.join(packages)}: make setup installs slurm-wlm and munge as root)"
    probe = subprocess.run([tool("unshare"), "--mount", "--uts", "true"], capture_output=True, text=True)
    if probe.returncode != 0:  # a node's own host name and /etc/hosts
        return f"unshare --mount --uts failed: {probe.stderr.strip()}"
    return None


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class SlurmCluster:
    """``nodes`` compute nodes ``n1..nN`` of ``cpus`` CPUs each, and a head node ``head``
    where ``salloc``/``sbatch`` run (a JupyterLab or the instructor's shell on a real cluster)."""

    def __init__(self, folder: str | os.PathLike, nodes: int = 3, cpus: int = 2, bandwidth: str = "1gbit"):
        self.folder = Path(folder)
        self.names = ["head", *(f"n{i}" for i in range(1, nodes + 1))]
        self.cpus = cpus
        self.net = netem.Network(netem.emulated(bandwidth=bandwidth), len(self.names))
        self.daemons: dict[str, subprocess.Popen] = {}
        self.conf = self.folder / "slurm.conf"
        self.key = self.folder / "munge.key"
        # sockets (munge's, slurmstepd's in the spool) need a short path: 108 bytes at most
        self.short = Path(tempfile.mkdtemp(prefix="labs-slurm-", dir="/run" if os.access("/run", os.W_OK) else None))
        self.socket = self.short / "munge.sock"

    # -- where a command runs
    def index(self, node: str) -> int:
        return self.names.index(node)

    def command(self, node: str, cmd: list[str]) -> list[str]:
        """``cmd`` on ``node`` (``head``, ``n1``, ...): its namespace, host name and hosts file."""
        i = self.index(node)
        enter = f'mount --bind {self.folder / "hosts"} /etc/hosts && hostname {node} && exec "$@"'
        return [
            tool("nsenter"),
            f"--net=/run/netns/{self.net.hosts[i]}",
            tool("unshare"),
            "--mount",
            "--uts",
            "sh",
            "-c",
            enter,
            "sh",
            *cmd,
        ]

    @property
    def env(self) -> dict[str, str]:
        """The environment a Slurm client needs: this cluster's configuration."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def run(self, cmd: list[str], node: str = "head", **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        kw["env"] = {**self.env, **kw.get("env", {})}
        return subprocess.run(self.command(node, cmd), **kw)

    def popen(self, cmd: list[str], node: str = "head", **kw) -> subprocess.Popen:
        kw["env"] = {**self.env, **kw.get("env", {})}
        return subprocess.Popen(self.command(node, cmd), **kw)

    # -- life cycle
    def start(self) -> SlurmCluster:
        """Build the network, write the configuration, start munged, slurmctld and the
        slurmd's; return once every node is idle. On failure, stop what started."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.net.build()
            self._write_files()
            self._start_daemons()
            poll_for(self._all_idle, 60, f"the {len(self.names) - 1} Slurm nodes to be idle ({self.logs_tail()})")
        except BaseException:
            self.stop()
            raise
        return self

    def address(self, node: str) -> str:
        return self.net.address(self.index(node))

    def _write_files(self) -> None:
        (self.folder / "hosts").write_text(
            "127.0.0.1 localhost\n" + "".join(f"{self.address(n)} {n}\n" for n in self.names)
        )
        subprocess.run([tool("mungekey"), "--create", f"--keyfile={self.key}"], check=True, capture_output=True)
        self.key.chmod(0o600)
        for sub in ("state", *(f"spool/{n}" for n in self.names[1:])):
            (self.short / sub).mkdir(parents=True, exist_ok=True)
        f, short = self.folder, self.short
        # each node may claim half the machine's memory (slurmd refuses a node that claims more than it has)
        memory = psutil.virtual_memory().total // 2**20 // 2
        nodes = "".join(
            f"NodeName={n} NodeAddr={self.address(n)} CPUs={self.cpus} RealMemory={memory} State=UNKNOWN\n"
            for n in self.names[1:]
        )
        self.conf.write_text(
            textwrap.dedent(f"""\
            ClusterName=labs
            SlurmctldHost=head({self.address("head")})
            AuthType=auth/munge
            AuthInfo=socket={self.socket}
            CredType=cred/munge
            SlurmUser=root
            SlurmdUser=root
            StateSaveLocation={short}/state
            SlurmdSpoolDir={short}/spool/%n
            SlurmctldPidFile={short}/slurmctld.pid
            SlurmdPidFile={short}/slurmd-%n.pid
            SlurmctldLogFile={f}/slurmctld.log
            SlurmdLogFile={f}/slurmd-%n.log
            MailProg=/bin/true
            ProctrackType=proctrack/linuxproc
            TaskPlugin=task/none
            JobAcctGatherType=jobacct_gather/none
            AccountingStorageType=accounting_storage/none
            JobCompType=jobcomp/none
            SelectType=select/cons_tres
            SelectTypeParameters=CR_Core
            MpiDefault=none
            ReturnToService=2
            SlurmdTimeout=30
            InactiveLimit=0
            KillWait=30
            MinJobAge=300
            """)
            + nodes
            + f"PartitionName=labs Nodes=n[1-{len(self.names) - 1}] Default=YES MaxTime=INFINITE State=UP\n"
        )

    def _start_daemons(self) -> None:
        f = self.folder
        log = lambda name: open(f / f"{name}.out", "ab")  # noqa: E731  what a daemon says before its log is open
        self.daemons["munged"] = subprocess.Popen(
            [
                tool("munged"),
                "--foreground",
                "--force",
                f"--socket={self.socket}",
                f"--key-file={self.key}",
                f"--pid-file={self.short / 'munged.pid'}",
                f"--log-file={f / 'munged.log'}",
                f"--seed-file={self.short / 'munged.seed'}",
            ],
            stdout=log("munged"),
            stderr=subprocess.STDOUT,
        )
        poll_for(lambda: self.socket.exists() or self._dead("munged"), 30, "munged's socket")
        self._dead("munged", fail=True)
        self.daemons["slurmctld"] = self.popen(
            [tool("slurmctld"), "-D", "-i"], stdout=log("slurmctld"), stderr=subprocess.STDOUT
        )
        for node in self.names[1:]:
            self.daemons[f"slurmd-{node}"] = self.popen(
                [tool("slurmd"), "-D"], node=node, stdout=log(f"slurmd-{node}"), stderr=subprocess.STDOUT
            )

    def _dead(self, name: str, fail: bool = False) -> bool:
        proc = self.daemons[name]
        if proc.poll() is None:
            return False
        if fail:
            raise AssertionError(f"{name} exited with {proc.returncode}: {self.logs_tail()}")
        return True

    def _all_idle(self) -> bool:
        for name in self.daemons:
            self._dead(name, fail=True)
        done = self.run(["sinfo", "-h", "-o", "%T %D"], timeout=30)
        return done.returncode == 0 and done.stdout.split() == ["idle", str(len(self.names) - 1)]

    def logs_tail(self, lines: int = 8) -> str:
        parts = []
        for path in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            if tail:
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts) or "no logs"

    # -- what runs
    def jobs(self) -> list[str]:
        """``squeue``'s lines: ``JOBID STATE NODES`` of every job not yet finished."""
        done = self.run(["squeue", "-h", "-o", "%i %T %N"], timeout=30)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    def node_processes(self, node: str) -> list[psutil.Process]:
        """Processes in ``node``'s network namespace other than its slurmd (what a job left)."""
        ns = os.stat(f"/run/netns/{self.net.hosts[self.index(node)]}").st_ino
        keep = {self.daemons[f"slurmd-{node}"].pid} if f"slurmd-{node}" in self.daemons else set()
        found = []
        for proc in psutil.process_iter():
            if proc.pid not in keep and _netns_inode(proc.pid) == ns:
                found.append(proc)
        # the wrapper chain of slurmd (nsenter exec'd unshare exec'd sh exec'd slurmd: one pid)
        return found

    def leftovers(self) -> dict[str, list[str]]:
        """Per compute node, the command lines still running there besides slurmd."""
        out = {}
        for node in self.names[1:]:
            procs = []
            for p in self.node_processes(node):
                try:
                    procs.append(" ".join(p.cmdline()) or p.name())
                except psutil.Error:
                    continue
            if procs:
                out[node] = procs
        return out

    def kill_node(self, node: str) -> list[int]:
        """``node`` dies, as a machine does: every process of it killed at once (its slurmd,
        its jobs' steps, their sandboxes: the sandboxes' own namespaces and cgroups with
        them), and Slurm told it is down. Returns the pids killed."""
        from lab_utils.grading.sandbox import leftover_cgroups

        tree: dict[int, psutil.Process] = {}
        scratch = Path(tempfile.gettempdir())
        lost: set[Path] = set()
        first = [psutil.Process(self.daemons[f"slurmd-{node}"].pid)]
        # until nothing is left on it: a step its slurmd started while the first ones were
        # being killed is killed too (a machine's processes all end at once)
        for _ in range(20):
            found: dict[int, psutil.Process] = {}
            for p in [*first, *self.node_processes(node)]:
                try:
                    for q in [p, *p.children(recursive=True)]:
                        found[q.pid] = q
                except psutil.NoSuchProcess:
                    continue
            first = []
            if not found:
                break
            tree.update(found)
            # the batches' folders of its elements (labgrade-<pid>-*): they go with the machine's disk
            lost.update(folder for pid in found for folder in scratch.glob(f"labgrade-{pid}-*"))
            for q in found.values():
                try:
                    q.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(list(found.values()), timeout=10)
        else:
            raise AssertionError(f"{node}: processes still start after 20 rounds of killing")
        for folder in lost:
            shutil.rmtree(folder, ignore_errors=True)
        for pid in tree:  # a dead element's sandbox cgroups (the kernel's cgroup goes with the machine)
            for group in leftover_cgroups(pid):
                for line in (group / "cgroup.procs").read_text().split():
                    try:
                        os.kill(int(line), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                poll_for(lambda g=group: not (g / "cgroup.procs").read_text().split(), 10, f"{group} to empty")
                group.rmdir()
        self.daemons[f"slurmd-{node}"].wait(timeout=10)
        done = self.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=the machine died"])
        assert done.returncode == 0, done.stderr
        return sorted(tree)

    def stop(self) -> list[str]:
        """Cancel every job, stop the daemons, remove the network and the munge key.
        Returns what is left (processes, namespaces); empty when everything went."""
        left: list[str] = []
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.run(["scancel", "--full", "--user=root"], timeout=30)
            try:
                poll_for(lambda: not self.jobs(), 30, "the cancelled jobs to end")
            except AssertionError as exc:
                left.append(str(exc))
        for name, proc in reversed(list(self.daemons.items())):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                left.append(f"{name} did not stop on SIGTERM")
                proc.kill()
                proc.wait(timeout=10)
        if self.net.subnet is not None:
            for node in self.names:
                for p in self.node_processes(node):
                    left.append(f"{node}: pid {p.pid} {p.name()}")
                    p.kill()
        left += self.net.destroy()
        self.key.unlink(missing_ok=True)
        shutil.rmtree(self.short, ignore_errors=True)
        return left
