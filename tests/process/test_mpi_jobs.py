"""Process tests for MPIJob: mpirun and horovodrun (Gloo and MPI), as root and not."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from support.procs import alive as procs_alive

from lab_utils.cluster import ClusterError, MPIJob

FIX = Path(__file__).resolve().parents[1] / "fixtures"
KERNEL = str(FIX / "cluster_kernel.py")
HAVE_MPI = shutil.which("mpirun") is not None and importlib.util.find_spec("mpi4py") is not None
HAVE_HVD = importlib.util.find_spec("horovod") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpirun or mpi4py missing")

JOBS = [
    pytest.param("mpirun", "mpi", "cluster_mpi_task.py", marks=needs_mpi, id="mpirun-mpi"),
    pytest.param("horovodrun", "gloo", "cluster_hvd_task.py", marks=pytest.mark.horovod, id="horovodrun-gloo"),
    pytest.param(
        "horovodrun", "mpi", "cluster_hvd_task.py", marks=[pytest.mark.horovod, needs_mpi], id="horovodrun-mpi"
    ),
]


def check_results(results: dict, np: int = 2) -> None:
    assert set(results) == {f"rank:{r}" for r in range(np)}, results
    assert all(r["size"] == np and r["total"] == np * (np + 1) / 2 for r in results.values())


@pytest.mark.parametrize("launcher,controller,script", JOBS)
def test_job_succeeds(launcher, controller, script, capfd):
    if os.getuid() == 0 and launcher == "mpirun":
        assert "--allow-run-as-root" in MPIJob(np=2, script=FIX / script, launcher=launcher).command()[0]
    with MPIJob(
        np=2, script=FIX / script, launcher=launcher, controller=controller, progress=False, stream=True
    ) as job:
        results = job.wait()
    out, _ = capfd.readouterr()
    for r in (0, 1):  # live streaming: each rank's whole line, with its own prefix
        assert re.search(rf"^\[rank:{r}\] rank {r}/2: total=3", out, re.M), out
    check_results(results)
    if launcher == "horovodrun":
        assert {r["controller"] for r in results.values()} == {controller}
    assert job.tasks[0].exit_code == 0
    assert "rank 1/2" in job.logs(1) and "rank 1/2" not in job.logs(0)


@pytest.mark.horovod
def test_hvdrun_is_horovodrun_answered_from_the_build_it_is_given(tmp_path):
    """hvdrun (MPIJob's horovodrun) launches like horovodrun, and its build check reads
    LABS_HOROVOD_BUILT instead of importing TensorFlow: told "mpi" only, --gloo is refused
    by Horovod's own check although this Horovod has Gloo."""
    from lab_utils.cluster import hvdrun

    cmd = [sys.executable, "-m", "lab_utils.cluster.hvdrun", "-np", "2", "--gloo", "-H", "localhost:2"]
    cmd += ["--network-interface", "lo", sys.executable, "-c", "import os; print('rank', os.environ['HOROVOD_RANK'])"]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    ok = subprocess.run(cmd, env={**env, hvdrun.BUILT: "gloo,mpi"}, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and {"rank 0", "rank 1"} <= set(re.findall(r"rank \d", ok.stdout)), ok
    refused = subprocess.run(cmd, env={**env, hvdrun.BUILT: "mpi"}, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "Gloo support has not been built" in refused.stderr, refused


def _non_root_runner(home: str, env: dict) -> tuple[list[str], dict, str]:
    """How to run a command as a non-root user: ``nobody`` when it can reach this
    interpreter; else an unprivileged user namespace (uid 65534 as Open MPI and
    Horovod see it). Skips cleanly when neither works."""
    probe = [sys.executable, "-c", "import os, lab_utils.cluster; assert os.geteuid() != 0"]
    try:
        pw = pwd.getpwnam("nobody")
    except KeyError:
        pw = None
    if pw is not None:
        os.chown(home, pw.pw_uid, pw.pw_gid)
        kw = dict(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        try:
            ok = subprocess.run(probe, env=env, cwd=home, capture_output=True, **kw).returncode == 0
        except PermissionError:  # e.g. the interpreter lives under /root (mode 0700)
            ok = False
        if ok:
            return [], kw, "nobody"
        os.chown(home, 0, 0)
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--user", *probe], env=env, cwd=home, capture_output=True).returncode == 0:
        return [unshare, "--user"], {}, "user namespace (uid 65534)"
    pytest.skip(
        "cannot run as a non-root user here: nobody cannot reach this Python and user namespaces are unavailable"
    )


@pytest.mark.parametrize("launcher,controller,script", JOBS)
def test_job_succeeds_as_non_root(launcher, controller, script):
    if os.getuid() != 0:
        pytest.skip("already not root: test_job_succeeds covers it")
    home = tempfile.mkdtemp(prefix="labs-nonroot-")
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "LABS_RUN_ROOT"))}
        env.update(HOME=home, USER="nobody", LOGNAME="nobody")
        prefix, kw, how = _non_root_runner(home, env)
        out = subprocess.run(
            [
                *prefix,
                sys.executable,
                KERNEL,
                "--kind",
                "mpi",
                "--launcher",
                launcher,
                "--controller",
                controller,
                "--script",
                script,
                "--wait",
            ],
            env=env,
            cwd=home,
            capture_output=True,
            text=True,
            timeout=240,
            **kw,
        )
        assert out.returncode == 0, f"as {how}: " + out.stdout[-2000:] + out.stderr[-2000:]
        info = json.loads(out.stdout.strip().splitlines()[-1])
        check_results(info["results"])
        assert info["run_dir"].startswith(home)  # ~/.lab_runs of that user
        assert "--allow-run-as-root" not in Path(info["run_dir"], f"{launcher}.log").read_text()
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_mpi
def test_failing_rank_raises_cluster_error():
    job = MPIJob(np=2, script=FIX / "cluster_mpi_task.py", args={"fail_rank": 1}, launcher="mpirun", progress=False)
    with pytest.raises(ClusterError) as info:
        with job:
            job.wait()
    err = info.value
    assert err.task == "mpirun" and err.exit_code not in (0, None)
    assert "failing on purpose" in err.log_tail
    assert not job.running


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []


@needs_mpi
def test_kernel_sigkill_stops_mpirun_and_its_ranks():
    kernel = subprocess.Popen(
        [
            sys.executable,
            KERNEL,
            "--kind",
            "mpi",
            "--script",
            "cluster_mpi_task.py",
            "--args",
            json.dumps({"hang": True}),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    json.loads(kernel.stdout.readline())
    me = psutil.Process(kernel.pid)
    deadline = time.monotonic() + 30
    procs = []
    while time.monotonic() < deadline:  # guard + mpirun + 2 ranks (plus helpers)
        procs = me.children(recursive=True)
        if sum("cluster_mpi_task" in " ".join(_cmdline(p)) for p in procs) >= 4:
            break
        time.sleep(0.05)
    kernel.kill()
    kernel.wait()
    end = time.monotonic() + 10
    alive = procs
    while alive and time.monotonic() < end:
        alive = [p for p in alive if procs_alive(p)]
        time.sleep(0.05)
    for p in alive:
        p.kill()
    assert alive == []
