"""MPIJob refuses bad input before anything launches: np, a missing launcher, memory,
and a Horovod built without the requested controller (the build probe mocked)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab_utils import resources
from lab_utils.cluster import MPIJob, ResourceError, hvdbuild

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SCRIPT = str(FIX / "cluster_task.py")
GB = 1024**3
REAL_POPEN = subprocess.Popen
REAL_PROBE = hvdbuild.horovod_build  # cached per process: cleared around every test
BOTH = {"mpi": True, "gloo": True, "nccl": False, "tensorflow": True, "via": "mock"}
CHECK_BUILD = """Horovod v0.28.1:

Available Frameworks:
    [X] TensorFlow
    [ ] PyTorch
    [ ] MXNet

Available Controllers:
    [ ] MPI
    [X] Gloo

Available Tensor Operations:
    [ ] NCCL
    [ ] DDL
    [ ] CCL
    [X] MPI
    [X] Gloo
"""


@pytest.fixture(autouse=True)
def no_processes(refuse_processes, monkeypatch):
    """Nothing in this file may start a process (the one real probe test restores Popen)."""
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: 64 * GB)
    REAL_PROBE.cache_clear()
    yield
    REAL_PROBE.cache_clear()


def built_with(monkeypatch, **controllers) -> list[int]:
    """Mock the build probe; returns a list that counts the calls."""
    calls = []

    def probe():
        calls.append(1)
        return {**BOTH, **controllers}

    monkeypatch.setattr(hvdbuild, "horovod_build", probe)
    return calls


@pytest.mark.parametrize("controller,missing", [("mpi", "MPI"), ("gloo", "Gloo")])
def test_missing_controller_refused_before_launch(monkeypatch, controller, missing):
    calls = built_with(monkeypatch, **{controller: False})
    job = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller=controller, progress=False)
    assert calls == []  # constructing stays cheap: the probe runs at start()
    with pytest.raises(ValueError) as info:
        job.start()
    msg = str(info.value)
    assert f"controller={controller!r} needs Horovod built with {missing}" in msg
    assert f"{missing}: no" in msg  # what the build has
    assert "build-horovod.sh" in msg and f"HOROVOD_WITH_{missing.upper()}=1" in msg and "pip uninstall" in msg
    other = "gloo" if controller == "mpi" else "mpi"
    assert f"use controller={other!r}" in msg
    assert job.run_dir is None and job.tasks == [] and not job.running  # nothing launched


def test_no_controller_at_all_gives_only_the_rebuild(monkeypatch):
    built_with(monkeypatch, mpi=False, gloo=False)
    job = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller="gloo", progress=False)
    with pytest.raises(ValueError, match="MPI: no, Gloo: no") as info:
        job.start()
    assert "use controller" not in str(info.value) and "rebuild it:" in str(info.value)


@pytest.mark.parametrize("controller", ["mpi", "gloo"])
def test_controller_present_goes_on_to_launch(monkeypatch, controller):
    calls = built_with(monkeypatch)
    job = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller=controller, progress=False)
    with pytest.raises(AssertionError, match="a process was started"):
        job.start()  # past every check: the launch itself is refused by this file's fixture
    assert calls == [1] and not job.running


def test_mpirun_never_probes_horovod(monkeypatch):
    def probe():
        raise AssertionError("mpirun must not probe Horovod")

    monkeypatch.setattr(hvdbuild, "horovod_build", probe)
    job = MPIJob(np=2, script=SCRIPT, launcher="mpirun", progress=False)
    with pytest.raises(AssertionError, match="a process was started"):
        job.start()


@pytest.mark.parametrize("np", [0, -1, True, 2.0, "2", None])
def test_bad_np(np):
    with pytest.raises(ValueError, match=rf"np must be an integer >= 1, got {np!r}"):
        MPIJob(np=np, script=SCRIPT, launcher="mpirun")


def test_missing_launcher(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))  # nothing next to it
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    with pytest.raises(ValueError, match=r"launcher 'horovodrun' not found next to .* or on PATH"):
        MPIJob(np=2, script=SCRIPT, launcher="horovodrun")


@pytest.mark.parametrize(
    "launcher,elsewhere,what,fits",
    [
        ("mpirun", False, "np=8", 3),
        ("horovodrun", False, "np=8", 3),  # through hvdrun: no TensorFlow in the launcher
        ("horovodrun", True, "np=8 and horovodrun", 2),
    ],
)
def test_np_over_the_memory_guard_refused_before_launch(monkeypatch, launcher, elsewhere, what, fits):
    """A horovodrun of another interpreter imports TensorFlow itself to probe its build: it
    counts as one more task. This interpreter's runs as hvdrun, which does not."""
    built_with(monkeypatch)
    if elsewhere:
        monkeypatch.setattr(MPIJob, "_launcher_path", staticmethod(lambda name: f"/opt/other/bin/{name}"))
    monkeypatch.setattr(resources, "available_memory_bytes", lambda: int(1.0 * GB))
    job = MPIJob(np=8, script=SCRIPT, launcher=launcher, progress=False)
    with pytest.raises(ResourceError) as info:
        job.start()
    msg = str(info.value)  # 288 MB per TensorFlow process: 3 fit in 1 GB
    assert f"{what} needs about" in msg and "1.0 GB available" in msg and f"try np={fits}" in msg
    assert job.run_dir is None and job.tasks == []


def test_parse_check_build_reads_the_controllers_section():
    # MPI is listed twice: not a controller here, but a tensor operation
    assert hvdbuild.parse_check_build(CHECK_BUILD) == {"mpi": False, "gloo": True, "nccl": False, "tensorflow": True}
    with pytest.raises(ValueError, match="Available Controllers"):
        hvdbuild.parse_check_build("Traceback (most recent call last):\n  ImportError: no horovod")


def _fake_run(answers):
    """subprocess.run stand-in: the ctypes child first, then horovodrun --check-build."""

    def run(cmd, **kwargs):
        kind = "check-build" if cmd[-1] == "--check-build" else "ctypes"
        answer = answers[kind]
        if isinstance(answer, BaseException):
            raise answer
        return subprocess.CompletedProcess(cmd, answer[0], stdout=answer[1], stderr=answer[2])

    return run


def test_probe_falls_back_to_check_build_when_ctypes_fails(monkeypatch):
    answers = {
        "ctypes": (1, "", "OSError: libtensorflow_framework.so.2: cannot open shared object file"),
        "check-build": (0, CHECK_BUILD, ""),
    }
    monkeypatch.setattr(subprocess, "run", _fake_run(answers))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")  # also without Horovod
    build = hvdbuild.horovod_build()
    assert build == {"mpi": False, "gloo": True, "nccl": False, "tensorflow": True, "via": "horovodrun --check-build"}


def test_probe_says_how_to_build_when_nothing_answers(monkeypatch):
    answers = {
        "ctypes": OSError("exec format error"),
        "check-build": subprocess.TimeoutExpired("horovodrun", 120),
    }
    monkeypatch.setattr(subprocess, "run", _fake_run(answers))
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    with pytest.raises(hvdbuild.HorovodBuildError) as info:
        hvdbuild.horovod_build()
    msg = str(info.value)
    assert "Horovod is not installed or cannot be loaded" in msg and "build it:" in msg
    assert "HOROVOD_WITH_MPI=1" in msg and "HOROVOD_WITH_GLOO=1" in msg


@pytest.mark.horovod
def test_real_probe_takes_the_fast_path_and_keeps_tensorflow_out(monkeypatch):
    """The real probe on this machine, in a fresh interpreter (a stand-in kernel)."""
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("TensorFlow is not installed")
    monkeypatch.setattr(subprocess, "Popen", REAL_POPEN)
    code = (
        "import json, sys; from lab_utils.cluster import hvdbuild; "
        "b = hvdbuild.horovod_build(); "
        "print(json.dumps({'build': b, 'modules': [m for m in ('tensorflow', 'horovod') "
        "if m in sys.modules]}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["build"]["gloo"] is True and info["build"]["mpi"] is True, info
    assert info["build"]["via"] == "ctypes", info  # the fast path, not the 15 s fallback
    assert info["modules"] == [], info
    assert out.stderr == "", out.stderr  # a kernel's stderr shows in the cell


def test_horovodrun_runs_as_hvdrun_told_the_build_it_was_checked_against(monkeypatch):
    """horovodrun's own build probe (a child importing TensorFlow, every job) is answered from
    the build MPIJob checked: the launcher is hvdrun, and the answer is passed only once checked."""
    from lab_utils.cluster import hvdrun

    built_with(monkeypatch, mpi=False)
    job = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller="gloo", progress=False)
    cmd, extra = job.command()
    assert cmd[:3] == [sys.executable, "-m", "lab_utils.cluster.hvdrun"] and hvdrun.BUILT not in extra
    job._check_build()
    _, extra = job.command()
    assert extra[hvdrun.BUILT] == "gloo"
    monkeypatch.setattr(MPIJob, "_launcher_path", staticmethod(lambda name: f"/opt/other/bin/{name}"))
    other = MPIJob(np=2, script=SCRIPT, launcher="horovodrun", controller="gloo", progress=False)
    other._check_build()
    cmd, extra = other.command()
    assert cmd[0] == "/opt/other/bin/horovodrun" and hvdrun.BUILT not in extra


def test_hvdrun_answers_the_launcher_s_build_checks():
    from horovod.common import util
    from horovod.runner import launch

    from lab_utils.cluster import hvdrun

    try:
        hvdrun.answer_build_checks("mpi")
        assert launch.mpi_built(verbose=True) is True and launch.gloo_built() is False
        with pytest.raises(ValueError, match="Gloo support has not been built"):
            launch.run_controller(True, lambda: None, False, None, False, None, None)
    finally:
        launch.gloo_built, launch.mpi_built = util.gloo_built, util.mpi_built


def test_a_killed_mpirun_s_session_folder_is_removed_a_live_one_kept(tmp_path):
    from lab_utils.cluster.mpi import remove_dead_session_dirs

    top = tmp_path / f"ompi.somehost.{os.geteuid()}"
    dead, alive = top / "pid.999999999", top / f"pid.{os.getpid()}"
    for run in (dead, alive):
        (run / "1").mkdir(parents=True)
        (run / "contact.txt").write_text("x")
    (tmp_path / "ompi.other").write_text("not a folder")
    assert remove_dead_session_dirs(tmp_path) == [dead]
    assert not dead.exists() and (alive / "contact.txt").is_file()


def test_a_killed_jobs_shared_memory_segments_are_removed_a_mapped_one_kept(tmp_path):
    """What a killed job's ranks leave in /dev/shm (memory the machine keeps until it reboots)."""
    from lab_utils.cluster.mpi import remove_dead_shm_segments

    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    dead, mapped = (shm / f"vader_segment.host.1a2b0001.{r}" for r in range(2))
    for path in (dead, mapped, shm / "someone-elses-file"):
        path.write_text("x")
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "maps").write_text(f"7f00-7f10 rw-s 00000000 00:19 12 {mapped}\n")
    assert remove_dead_shm_segments(shm, proc) == [dead]
    assert sorted(p.name for p in shm.iterdir()) == sorted([mapped.name, "someone-elses-file"])
