"""The labs and the grading on a real Slurm cluster of 3 nodes.

The cluster (:mod:`support.slurm`) is a real ``slurmctld`` and one real ``slurmd`` per
node, each node an emulated host. A driver on the head node, inside ``salloc -N 3``, starts
a Lab 2 cluster (``TFCluster(hosts="slurm")``: a task per node through ``srun``) and a
Horovod job (``MPIJob(hosts="slurm")``: ``mpirun`` starts its daemons through Slurm), as a
notebook in a JupyterLab started under ``salloc`` would. The instructor's ``autograde
--slurm`` grades the crafted classes as job arrays, with the scores and flags they must get;
a ``scancel`` and a node's death in the middle lose nothing and score nothing 0.

Needs root, ``ip netns``, ``slurm-wlm`` and ``munge`` (``make setup`` installs them as
root); skipped with the reason otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support import crafted, slurm
from support.poll import poll_for

from lab_utils import grading
from lab_utils.grading.sandbox import cgroup_support, own_cgroup_v1

REPO = Path(__file__).resolve().parents[2]
FIX = REPO / "tests" / "fixtures"
_missing = slurm.missing()
pytestmark = pytest.mark.skipif(_missing is not None, reason=f"no Slurm cluster here: {_missing}")


@pytest.fixture
def cluster(tmp_path):
    """A started 3-node Slurm cluster; afterwards, nothing of it is left."""
    c = slurm.SlurmCluster(tmp_path / "slurm", nodes=3).start()
    try:
        yield c
    finally:
        left = c.stop()
        assert left == [], left
        assert not (tmp_path / "slurm" / "munge.key").exists()


DRIVER = """
import json, os, sys
from lab_utils.cluster import MPIJob, TFCluster
tf_script, mpi_script, launcher = sys.argv[1:4]
with TFCluster(ps=1, workers=2, script=tf_script, args={"steps": 30}, hosts="slurm", progress=False, timeout=180) as c:
    results = c.wait()
tf = {"results": results, "hosts": {t.name: t.host for t in c.tasks}}
with MPIJob(np=3, script=mpi_script, hosts="slurm", launcher=launcher, progress=False, timeout=180) as job:
    mpi = job.wait()
print(json.dumps({"tf": tf, "mpi": mpi, "job": os.environ["SLURM_JOB_ID"]}))
"""


def netns_of(c: slurm.SlurmCluster) -> dict[str, str]:
    """``net:[inode]`` (what a task reads from /proc/self/ns/net) -> node name."""
    return {f"net:[{os.stat('/run/netns/' + c.net.hosts[i]).st_ino}]": n for i, n in enumerate(c.names)}


def test_lab2_cluster_and_horovod_job_across_slurm_nodes(cluster, tmp_path):
    mpi_script = FIX / "cluster_hvd_task.py"  # Horovod over MPI: mpirun's daemons start through srun
    env = {"LABS_RUN_ROOT": str(tmp_path / "runs"), "PYTHONPATH": str(REPO)}
    done = cluster.run(
        [
            "salloc",
            "-N",
            "3",
            "--",
            sys.executable,
            "-c",
            DRIVER,
            str(FIX / "cluster_tf_task.py"),
            str(mpi_script),
            "mpirun",
        ],
        env=env,
        cwd=REPO,
        timeout=400,
    )
    assert done.returncode == 0, f"{done.stderr[-3000:]}\n{cluster.logs_tail()}"
    out = json.loads(done.stdout.strip().splitlines()[-1])
    # round-robin on the allocation's nodes: the PS on n1, the workers on n2 and n3
    assert out["tf"]["hosts"] == {"ps:0": "n1", "worker:0": "n2", "worker:1": "n3"}
    assert [r["counter"] for r in out["tf"]["results"].values()] == [30.0, 30.0], out["tf"]
    # one rank per node, each in its node's namespace, and the allreduce went across them
    where = netns_of(cluster)
    ranks = sorted((r["rank"], r["size"], r["total"], where.get(r["netns"])) for r in out["mpi"].values())
    assert [r[:3] for r in ranks] == [(0, 3, 6), (1, 3, 6), (2, 3, 6)], out["mpi"]
    assert sorted(r[3] for r in ranks) == ["n1", "n2", "n3"], (ranks, where)
    # the allocation ended with the driver: no job, and nothing left on any node
    assert cluster.jobs() == []
    assert cluster.leftovers() == {}


# -- grading on Slurm --------------------------------------------------------------------
LAB1, LAB2 = crafted.CLASS_LAB, "02_ps_async"
#: Lab 1's crafted students whose grading depends on what the node and the element's own
#: allocation give it: the element's --time and the node's cores (the cell timeout), the
#: element's --mem (the memory limit inside it), the node's clock and cores with its timing
#: lock (the timed throughput test), and what a submission can read and leave running on a
#: node beside the shared file system. The others score what the grader's own sandbox decides
#: (its process and disk limits, a restarted kernel), the same code on a node as here, inside
#: the same cgroups "memory" meets there: the grading validation grades them
#: (bench/bench_validation.py, checked by tests/unit/test_validation.py).
ON_NODES = (
    "loop",  # the cell timeout, stretched by the node's cores, within the element's --time
    "memory",  # the node's memory limit, inside the element's own --mem
    "mixed",  # the shared template restores its test cells; what it can read and leave running there
    "forged",  # the throughput test timed on the node (its timing lock, its cores), the reference beside it
)
# ("correct" is not graded here: "forged" is the instructor's solution with a forged figure,
# timed the same way)


def autograde(cluster: slurm.SlurmCluster, root: Path, subs: Path, *extra: str, **kw):
    """The instructor's command, on the head node: ``autograde SUBS --slurm``."""
    cmd = [sys.executable, "-m", "lab_utils.grading", "--root", str(root), "autograde", str(subs), "--slurm", *extra]
    return cluster.popen(cmd, cwd=REPO, env={"PYTHONPATH": str(REPO)}, text=True, **kw)


def finished(proc, timeout: float) -> str:
    try:  # a hang guard, not a speed limit
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"autograde --slurm did not end within {timeout} s: {proc.communicate()[0]}")
    return out


def outcome(result: dict, points: dict[str, float]) -> tuple:
    """What grading decided: status, score, the test cells lost, the flags' kinds (less those only
    an isolated sandbox raises, where it was not one)."""
    cells = {c["grade_id"]: c for c in result.get("cells", [])}
    assert sorted(cells) == sorted(points), sorted(cells)  # every test cell accounted for
    flags = {f["kind"] for f in result.get("flags", [])} - crafted.NOISE_FLAGS
    if not result["provenance"]["sandbox"].startswith("isolated"):
        flags -= crafted.ISOLATED_ONLY
    lost = sorted(g for g, c in cells.items() if c["status"] != "passed")
    return result["status"], sum(c["score"] for c in cells.values()), lost, sorted(flags)


def expected(student: str, points: dict[str, float], isolated: bool) -> tuple:
    """What :func:`outcome` must be for a student of Lab 1's crafted class: crafted.CLASS_EXPECTED
    (the grading validation's plan)."""
    lost, flag = crafted.CLASS_EXPECTED[student]
    lost = list(points) if lost == "all" else lost
    flags = (set(flag) if isinstance(flag, tuple) else {flag} - {None}) - (set() if isolated else crafted.ISOLATED_ONLY)
    return "graded", sum(points.values()) - sum(points[g] for g in lost), sorted(lost), sorted(flags)


def stored(root: Path) -> dict[tuple[str, str], dict]:
    return {(p.parent.name, p.stem): json.loads(p.read_text()) for p in (root / "results").glob("*/*.json")}


def sandbox_cgroups() -> list[Path]:
    """Grading sandboxes' cgroups (``labgrade-<slot>-<pid>``) whose batch or element is dead."""
    if cgroup_support() != "v1":
        return []
    groups = [p for c in ("memory", "pids", "cpu") for p in own_cgroup_v1(c).glob("labgrade-*-*")]
    names = [(p, p.name.split("-")) for p in groups]
    return sorted(
        p for p, n in names if len(n) == 3 and n[1].isdigit() and n[2].isdigit() and not psutil.pid_exists(int(n[2]))
    )


@pytest.mark.timeout(1500)  # a hang guard: about 3 minutes on 2 cores
def test_the_crafted_classes_grade_as_job_arrays_with_their_scores_and_flags(cluster, tmp_path):
    settings = crafted.settings_yaml({"interrupt_grace": 10}, {LAB1: crafted.CLASS_SETTINGS})
    root, subs = crafted.course(tmp_path, [LAB1, LAB2], settings)
    for student in ON_NODES:  # Lab 1's class where a node could change what it gets (no attack on the grader)
        crafted.write(crafted.CLASS[student], LAB1, subs, student=student, root=root)
    crafted.write("patchy", LAB2, subs, root=root)  # Lab 2's: handed in half done, the kernel killed
    # two of Lab 1's at a time, as the local batch ran them on this machine's two cores (three,
    # beside a busy core, took the memory filler's cell past a 20 s cell timeout)
    proc = autograde(cluster, root, subs, "--max-running", "2", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = finished(proc, 1200)
    assert proc.returncode == 0, out
    got = stored(root)
    assert set(got) == {(s, LAB1) for s in ON_NODES} | {("patchy", LAB2)}, out
    points = crafted.test_points(LAB1, root)
    for student in ON_NODES:
        result = got[(student, LAB1)]
        isolated = result["provenance"]["sandbox"].startswith("isolated")
        assert outcome(result, points) == expected(student, points, isolated), (student, result.get("log_tail"))
        assert result["provenance"]["slurm"]["node"] in cluster.names[1:]
    plan, lab2 = crafted.PATCHY[LAB2], got[("patchy", LAB2)]
    assert sorted(c["grade_id"] for c in lab2["cells"] if c["status"] == "passed") == sorted(plan["passes"]), lab2
    assert {f["kind"] for f in lab2["flags"]} == {"kernel died"}, lab2["flags"]
    # merged into the one gradebook, with the progress per lab on the way
    scores = grading.export_grades(None, root).read_text()
    assert all(f"{s},{LAB1}," in scores for s in ON_NODES) and f"patchy,{LAB2}," in scores
    assert f"{LAB1}: {len(ON_NODES)} done, 0 running, 0 queued, 0 failed" in out
    assert f"{LAB2}: 1 done, 0 running, 0 queued, 0 failed" in out
    assert not list((root / "slurm").glob("*")), "the batch's folder is removed once merged"
    assert cluster.jobs() == [] and cluster.leftovers() == {} and sandbox_cgroups() == []


def blank_class(tmp_path: Path, n: int) -> tuple[Path, Path]:
    root, subs = crafted.course(tmp_path, [LAB1])
    for i in range(n):
        crafted.write("blank", LAB1, subs, student=f"s{i}", root=root)
    return root, subs


def test_scancel_in_the_middle_then_the_same_command_grades_only_the_rest(cluster, tmp_path):
    root, subs = blank_class(tmp_path, 3)
    proc = autograde(cluster, root, subs, "--max-running", "1", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    for line in proc.stdout:  # the first merged result: then the instructor cancels the array
        lines.append(line)
        if line.startswith("[1 "):
            break
    assert lines and lines[-1].startswith("[1 "), "".join(lines)
    cancel = cluster.run(["scancel", f"--name=labgrade-{LAB1}"])
    assert cancel.returncode == 0, cancel.stderr
    out = "".join(lines) + finished(proc, 300)
    assert proc.returncode == 1, out  # not everything was graded: it says so
    assert "cancelled before its result: the same command grades it" in out, out
    first = {s: r for (s, _), r in stored(root).items()}
    assert 1 <= len(first) < 3 and all(r["status"] == "graded" for r in first.values()), out
    assert cluster.jobs() == [] and cluster.leftovers() == {} and sandbox_cgroups() == []
    again = autograde(cluster, root, subs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = finished(again, 600)
    assert again.returncode == 0, out
    assert f"{3 - len(first)} to grade, {len(first)} unchanged since their last grading" in out, out
    for student, result in stored(root).items():
        assert result["status"] == "graded" and result["score"] == 0.0, result
        if student[0] in first:  # not graded twice
            assert result["provenance"]["graded_at"] == first[student[0]]["provenance"]["graded_at"]


def test_a_node_that_dies_mid_array_leaves_its_submission_flagged_for_regrade_not_zero(cluster, tmp_path):
    root, subs = blank_class(tmp_path, 3)
    proc = autograde(cluster, root, subs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

    def grading_on():  # the node of an element whose grading has begun there, and its elements
        running = [
            (line.split() + ["", "", ""])[:3]
            for line in cluster.run(["squeue", "-h", "-r", "-o", "%K %T %N"]).stdout.splitlines()
        ]
        for index, state, node in running:
            logs = list((root / "slurm").glob(f"*/{LAB1}/logs/{index}.log"))
            if state == "RUNNING" and logs and "element" in logs[0].read_text():
                return node, {f"s{i}" for i, s, n in running if n == node and s == "RUNNING"}
        return None

    node, lost = poll_for(grading_on, 120, "an element grading on its node")
    cluster.kill_node(node)  # with every element on it
    out = finished(proc, 300)
    assert proc.returncode == 1, out
    rows = grading.export_grades(None, root).read_text().splitlines()
    for student in lost:
        result = stored(root)[(student, LAB1)]
        assert result["status"] == "infrastructure error" and result["score"] is None, result
        assert f"its node {node} failed while it was graded (Slurm NODE_FAIL)" in result["reason"], result
        assert [f["kind"] for f in result["flags"]] == ["regrade"]
        assert not [row for row in rows if row.startswith(f"{student},")], rows  # never a 0 in the gradebook
    assert cluster.jobs() == [] and cluster.leftovers() == {} and sandbox_cgroups() == []
    again = autograde(cluster, root, subs, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # on the nodes left
    out = finished(again, 600)
    assert again.returncode == 0 and f"{len(lost)} to grade, {3 - len(lost)} unchanged" in out, out
    assert all(stored(root)[(student, LAB1)]["status"] == "graded" for student in lost)
