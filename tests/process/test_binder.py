"""binder/postBuild, run the way repo2docker runs it: in a fresh environment that already
holds the locked stack (repo2docker's pip step), from the repository's root, `set -e`. The
repository is the class's public one (``make student-repo``): what a Binder link points at,
with no solution in it."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_postbuild_installs_lab_utils_and_horovod(tmp_path):
    from lab_utils.grading import student_repo

    repo = tmp_path / "repo"
    student_repo.write(repo)
    assert not (repo / "grading").exists()
    env_dir = tmp_path / "env"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    site = next((env_dir / "lib").glob("python3.*/site-packages"))
    # the locked stack that repo2docker installs from binder/requirements.txt before postBuild:
    # this test environment's, reached through a .pth instead of copied (TensorFlow is 1.6 GB)
    (site / "locked_stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # and setuptools' distutils shim, which a .pth'd folder's own .pth files do not get (Python 3.12
    # has no distutils; Horovod's runner imports it): repo2docker's environment has setuptools itself
    shim = Path(sysconfig.get_paths()["purelib"]) / "distutils-precedence.pth"
    if shim.is_file():
        (site / shim.name).write_text(shim.read_text())
    python = env_dir / "bin" / "python"
    path = f"{env_dir / 'bin'}:{Path(sys.executable).parent}:/usr/bin:/bin"
    proc = subprocess.run(
        ["bash", str(repo / "binder" / "postBuild")],
        cwd=repo,
        env={"PATH": path, "HOME": str(Path.home()), "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "horovod OK: TensorFlow, MPI and Gloo" in proc.stdout
    where = subprocess.run(
        [
            str(python),
            "-c",
            "import os, lab_utils, horovod.tensorflow; print(lab_utils.__file__, os.environ.get('TF_USE_LEGACY_KERAS'))",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    from lab_utils import doctor

    keras = "1" if doctor.STACKS[doctor.DEFAULT_STACK]["legacy_keras"] else "None"  # the stack's Keras in every process
    assert where.stdout.split() == [
        str(repo / "lab_utils" / "__init__.py"),
        keras,
    ]  # installed from the repository, editable
    overrides = env_dir / "share/jupyter/lab/settings/overrides.json"  # Markdown opens rendered: the course map
    assert overrides.read_text() == (ROOT / "scripts/jupyterlab-overrides.json").read_text()
    server = subprocess.run(  # the server's own view of its configuration: it opens on the course map
        [
            str(python),
            "-c",
            "from jupyter_server.serverapp import ServerApp; a = ServerApp(); a.load_config_file(); "
            "print(a.default_url)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert server.stdout.strip() == "/lab/tree/labs/README.md", server.stderr[-2000:]
    assert (repo / "labs" / "README.md").is_file()  # the course map is in the public repository
