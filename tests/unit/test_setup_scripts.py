"""Bad input to the two commands a newcomer runs: clear message, non-zero exit, nothing half-built."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake_python(bindir: Path, name: str, version: str):
    p = bindir / name
    p.write_text(f"#!/bin/sh\nexec /bin/sh -c 'exit 1'  # pretends to be Python {version}\n")
    p.chmod(0o755)


def test_setup_without_python311_explains_and_builds_nothing(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("python3.11", "python3"):
        _fake_python(bindir, name, "3.10")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "VENV": str(tmp_path / "venv"), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "Python 3.11 is needed" in proc.stderr and "pyenv" in proc.stderr and "conda" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_setup_rejects_bad_gpu_flag(tmp_path):
    env = dict(os.environ, GPU="yes", VENV=str(tmp_path / "venv"))
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "GPU must be 0 or 1" in proc.stderr


def test_bad_port_fails_before_any_setup(tmp_path):
    for port in ("abc", "80", "70000", "-1"):
        env = dict(os.environ, PORT=port, VENV=str(tmp_path / "novenv"))
        proc = subprocess.run(
            ["make", "-s", "-C", str(ROOT), "lab"], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode != 0, port
        assert f"PORT={port} is not a usable port" in proc.stderr
        assert not (tmp_path / "novenv").exists()


def test_horovod_build_without_tensorflow_is_a_clear_error(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["python3.11", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/build-horovod.sh"), str(venv / "bin/python")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "TensorFlow is not installed" in proc.stderr


def test_failed_build_leaves_no_stamp(tmp_path):
    """A setup that dies after creating the venv must not leave it looking complete."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".labs-setup-stamp").write_text("stale")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_python(bindir, "python3.11", "3.10")
    _fake_python(bindir, "python3", "3.10")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "VENV": str(venv), "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "up to date" not in proc.stdout
