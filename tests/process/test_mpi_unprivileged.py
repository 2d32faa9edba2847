"""Lab 4's MPI path as an unprivileged user (CI runs as root, where Open MPI needs its
run-as-root switches): the ring check under mpirun and Horovod training under
horovodrun with Gloo and with MPI must add none of them, run every rank and leave
nothing behind. (tests/process/test_mpi_jobs.py does the same for bare MPIJobs.)

Two ways to drop root, each its own test so a skip says which one this machine lacks:
the real user ``nobody`` (``setpriv``), through an interpreter it can reach that sees
this environment (tests/support/unprivileged.py; nothing chmod'ed for the test); and an
unprivileged user namespace, where the job sees uid 65534 but keeps the files."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from support import unprivileged
from support.procs import kill_listed

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "tests" / "fixtures"
USER = "nobody"
SNIPPET = """
import json, os, sys
from pathlib import Path
from lab_utils.training.allreduce import runs as allreduce_runs
ring, hvd = sys.argv[1], sys.argv[2]
out = {"euid": os.geteuid()}
checks = allreduce_runs.check_ring(ring, np=2, sizes=[0, 5, 1000], dtypes=["int64", "float32"])
out["ring_ok"] = bool(checks["ok"].all()) and len(checks) == 6
out["hvd"] = {}
for controller in ("gloo", "mpi"):
    run = allreduce_runs.run_hvd(hvd, 2, args={"steps": 10, "batch_size": 20}, controller=controller)
    out["hvd"][controller] = {"ranks": sorted(run.results), "accuracy": run.accuracy, "run_dir": run.run_dir}
out["commands"] = [p.read_text().splitlines()[0] for p in sorted(Path(os.environ["LABS_RUN_ROOT"]).glob("*/*run.log"))]
print(json.dumps(out), flush=True)
"""


def _scripts() -> list[str]:
    """The instructor's Lab 4 scripts, extracted here (the unprivileged user cannot write them)."""
    if not (shutil.which("mpirun") and importlib.util.find_spec("mpi4py") and importlib.util.find_spec("horovod")):
        pytest.skip("Lab 4's MPI path needs mpirun, mpi4py and Horovod")
    from lab_utils.grading import reference_script

    return [str(reference_script("04_allreduce", "ring.py")), str(reference_script("04_allreduce", "train_hvd.py"))]


@pytest.fixture
def home():
    """A HOME (the run root goes inside) in /tmp: pytest's own tmp dirs are root's, mode 0700."""
    path = Path(tempfile.mkdtemp(prefix="labs-unprivileged-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _child_env(home: Path, user: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_") and k != "LABS_RUN_ROOT"}
    env.update(HOME=str(home), USER=user, LOGNAME=user, LABS_RUN_ROOT=str(home / "runs"))
    return env


def _mentions(proc: psutil.Process, home: str) -> bool:
    try:
        if home in " ".join(proc.cmdline()) or proc.cwd().startswith(home):
            return True
        return any(home in v for k, v in proc.environ().items() if k.startswith("LABS_"))
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return False


def _leftovers(home: Path, uid: int | None, deadline: float) -> list[str]:
    """Processes that the child started (they mention its HOME) still alive at the deadline."""
    left: list[str] = []
    while True:
        left = []
        for proc in psutil.process_iter():
            try:
                if uid is not None and proc.uids().real != uid:
                    continue
                if proc.status() != psutil.STATUS_ZOMBIE and _mentions(proc, str(home)):
                    left.append(f"{proc.pid}: {' '.join(proc.cmdline())[:160]}")
            except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _run_jobs(
    prefix: list[str], home: Path, user: str, uid: int | None, how: str, python: str = sys.executable
) -> None:
    scripts = _scripts()
    env = _child_env(home, user)
    env["PATH"] = os.pathsep.join([str(Path(python).parent), env.get("PATH", "")])
    probe = subprocess.run(
        [*prefix, python, "-c", "import os, lab_utils.cluster; assert os.geteuid() != 0"],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"as {how}, this Python cannot start: {(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    out = subprocess.run(
        [*prefix, python, "-c", SNIPPET, *scripts],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=300,
    )
    try:
        assert out.returncode == 0, f"as {how}: {out.stdout[-2000:]}{out.stderr[-3000:]}"
        info = json.loads(out.stdout.strip().splitlines()[-1])
        assert info["euid"] != 0 and info["ring_ok"], info
        for controller, run in info["hvd"].items():
            assert run["ranks"] == ["rank:0", "rank:1"] and run["accuracy"] > 0.3, (controller, run)
            assert run["run_dir"].startswith(str(home / "runs"))  # that user's run root
        launchers = sorted(c.split(":")[0] for c in info["commands"])
        assert launchers == ["# horovodrun", "# horovodrun", "# mpirun"], info["commands"]
        assert not any("--allow-run-as-root" in c for c in info["commands"]), info["commands"]
    finally:
        left = _leftovers(home, uid, time.monotonic() + 15)
        kill_listed(left)
    assert left == [], f"as {how}: left running: {left}"


def test_mpi_jobs_as_nobody(home):
    """As the real user nobody, through an interpreter it can reach (the environment is
    not chmod'ed: tests/support/unprivileged.py)."""
    made = unprivileged.make(USER)
    if isinstance(made, str):
        pytest.skip(made)
    try:
        os.chown(home, made.uid, pwd.getpwnam(USER).pw_gid)
        _run_jobs(made.prefix, home, USER, made.uid, USER, python=made.python)
    finally:
        made.cleanup()


def test_mpi_jobs_in_a_user_namespace(home):
    if os.getuid() != 0:
        pytest.skip("not root: the other MPI process tests already run unprivileged")
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare is not installed: no user namespace")
    _run_jobs([unshare, "--user"], home, USER, None, "a user namespace (uid 65534)")
