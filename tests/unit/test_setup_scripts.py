"""Bad input to the two commands a newcomer runs: clear message, non-zero exit, nothing half-built."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from support import stacks

from lab_utils import doctor

ROOT = Path(__file__).resolve().parents[2]
#: the stack of this environment (make test-stack STACK=2.15 runs these tests on 2.15), its Python
#: version, and a real interpreter of it: this one's installation
THIS_STACK = doctor.stack_of()
V = stacks.stack(THIS_STACK)["STACK_PYTHON"]
REAL = Path(sys._base_executable)


def _fake_python(bindir: Path, name: str, version: str):
    p = bindir / name
    p.write_text(f"#!/bin/sh\nexec /bin/sh -c 'exit 1'  # pretends to be Python {version}\n")
    p.chmod(0o755)


@pytest.mark.parametrize("stack", ["2.21", "2.15"])
def test_setup_without_the_stacks_python_explains_and_builds_nothing(tmp_path, stack):
    want = stacks.stack(stack)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in (f"python{want['STACK_PYTHON']}", "python3"):
        _fake_python(bindir, name, "3.10")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "VENV": str(tmp_path / "venv"), "HOME": str(tmp_path), "STACK": stack}
    env["LABS_TOOLS_DIR"] = str(tmp_path / "tools")  # no python3 can install uv there: the manual ways
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    needed = f"Python {want['STACK_PYTHON']} is needed (the {stack} stack: TensorFlow {want['TF_VERSION']}"
    assert needed in proc.stderr and f"pyenv install {want['STACK_PYTHON']}" in proc.stderr, proc.stderr
    assert "conda" in proc.stderr and f"STACK={stack}" in proc.stderr
    assert "uv could not be installed" in proc.stderr
    assert not (tmp_path / "venv").exists() and not (tmp_path / "tools" / "uv").exists()


#: a stand-in for uv: logs its arguments; `python find --system V` finds a real V only once
#: `python install V` has run (as the real one finds its managed Python)
STUB_UV = f"""#!/bin/sh
echo "$*" >> "{{log}}"
case "$*" in
  "python install {V}") touch "{{log}}.installed" ;;
  "python find --system {V}") [ -e "{{log}}.installed" ] && echo {REAL} || exit 2 ;;
  *) exit 2 ;;
esac
"""


def _other_python3(bindir: Path) -> None:
    """python3 that is not the stack's Python (it answers the version probe no) but otherwise works."""
    probe = "({}, {})".format(*V.split("."))
    p = bindir / "python3"
    p.write_text(f'#!/bin/sh\ncase "$*" in *"{probe}"*) exit 1 ;; esac\nexec {REAL} "$@"\n')
    p.chmod(0o755)


def _find_python(bindir: Path, tmp_path: Path, **env):
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), "LABS_TOOLS_DIR": str(tmp_path / "tools")} | {
        "STACK": THIS_STACK,
        **env,
    }
    return subprocess.run(
        ["bash", str(ROOT / "scripts/find-python.sh")], env=env, capture_output=True, text=True, timeout=120
    )


def test_without_the_stacks_python_setup_gets_one_with_uv_and_says_so(tmp_path):
    """Debian 12 (3.11) or 13 (3.13): the stack's 3.12 hidden from PATH (pyenv's too), uv on it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_python(bindir, f"python{V}", "3.13")
    _other_python3(bindir)
    log = tmp_path / "uv.log"
    (bindir / "uv").write_text(STUB_UV.format(log=log))
    (bindir / "uv").chmod(0o755)
    proc = _find_python(bindir, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{REAL}\n"  # stdout holds only the interpreter
    said = [line for line in proc.stderr.splitlines() if "getting one with uv" in line]
    assert len(said) == 1 and f"uv python install {V}" in said[0], proc.stderr
    assert log.read_text().splitlines() == [
        f"python find --system {V}",
        f"python install {V}",
        f"python find --system {V}",
    ]


def test_a_python_of_the_stack_given_is_used_without_uv(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "uv").write_text("#!/bin/sh\nexit 99\n")
    (bindir / "uv").chmod(0o755)
    proc = _find_python(bindir, tmp_path, PYTHON=str(REAL))
    assert proc.returncode == 0 and proc.stdout == f"{REAL}\n" and proc.stderr == "", proc.stderr


def test_a_python_pyenv_installed_is_found_where_its_shim_refuses_it(tmp_path):
    """pyenv's shim for python3.12 refuses to run when 3.11 is pyenv's global version (this
    machine, CI's): the newest 3.12.N under $PYENV_ROOT/versions is used, not a -dev or
    free-threaded build, and uv is not asked."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_python(bindir, "python3.12", "a pyenv shim that refuses")
    _fake_python(bindir, "python3", "3.11")
    (bindir / "uv").write_text("#!/bin/sh\nexit 99\n")
    (bindir / "uv").chmod(0o755)
    versions = tmp_path / "pyenv" / "versions"
    for release, works in (("3.12.2", True), ("3.12.10", True), ("3.12-dev", True), ("3.11.7", True), ("3.12.11t", True),
                           ("3.12.12", False)):  # fmt: skip
        python = versions / release / "bin" / "python3.12"
        python.parent.mkdir(parents=True)
        python.write_text(f"#!/bin/sh\nexit {0 if works else 1}\n")  # answers the version probe
        python.chmod(0o755)
    proc = _find_python(bindir, tmp_path, STACK="2.21", PYENV_ROOT=str(tmp_path / "pyenv"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{versions}/3.12.10/bin/python3.12\n"  # 3.12.12 does not run: the next newest
    assert proc.stderr == f"==> Python 3.12 found in pyenv's versions: {versions}/3.12.10/bin/python3.12\n"


def _stub_uv_wheel(folder: Path, log: Path) -> None:
    """A wheel named uv whose one script is the stand-in above: what pip installs from PyPI."""
    name = "uv-0.0.1"
    files = {
        f"{name}.data/scripts/uv": STUB_UV.format(log=log),
        f"{name}.dist-info/METADATA": "Metadata-Version: 2.1\nName: uv\nVersion: 0.0.1\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{name}.dist-info/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{name}.dist-info/RECORD,,\n"
    folder.mkdir()
    with zipfile.ZipFile(folder / f"{name}-py3-none-any.whl", "w") as whl:
        for path, text in files.items():
            info = zipfile.ZipInfo(path)
            info.external_attr = 0o100755 << 16  # a regular, executable file, as in uv's real wheel
            whl.writestr(info, text)


def test_uv_comes_from_pypi_through_any_python3(tmp_path):
    """No uv anywhere: any python3 installs it (here from a local index standing in for PyPI)
    into the tools folder, not the system, and the next run finds it there."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_python(bindir, f"python{V}", "3.13")
    _other_python3(bindir)
    log = tmp_path / "uv.log"
    _stub_uv_wheel(tmp_path / "index", log)
    pip = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "index"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    proc = _find_python(bindir, tmp_path, **pip)
    assert proc.returncode == 0, proc.stderr
    assert "installing uv from PyPI" in proc.stderr and proc.stdout == f"{REAL}\n"
    assert (tmp_path / "tools" / "uv" / "bin" / "uv").is_file()
    again = _find_python(bindir, tmp_path, **pip)
    assert again.returncode == 0 and "installing uv" not in again.stderr, again.stderr


def test_setup_rejects_bad_gpu_flag(tmp_path):
    env = dict(os.environ, GPU="yes", VENV=str(tmp_path / "venv"))
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "GPU must be 0 or 1" in proc.stderr


@pytest.mark.parametrize("name", ["2.21", "2.15"])
def test_each_stack_has_its_lock_its_venv_and_its_horovod_patch(name):
    """What stacks.sh names exists and agrees with the stack's lock: the TensorFlow, the tf-keras
    and the Horovod that setup installs are the locked ones."""
    stack = stacks.stack(name)
    lock = (ROOT / stack["STACK_LOCK"]).read_text().splitlines()
    pins = {}
    for line in lock:
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            assert name.lower().replace("_", "-") not in pins, f"{name} is locked twice"
            pins[name.lower().replace("_", "-")] = version
    assert pins["tensorflow-cpu"] == stack["TF_VERSION"]
    assert pins["horovod"] == stack["HOROVOD_VERSION"]
    assert pins.get("tf-keras", "") == stack["TF_KERAS_VERSION"]
    assert pins["numpy"].startswith("1."), "numpy 1.x on every stack: the numbers students see do not move"
    assert f"Python {stack['STACK_PYTHON']}" in "\n".join(lock[:4])  # the header says which Python
    if stack["HOROVOD_PATCH"]:
        assert (ROOT / stack["HOROVOD_PATCH"]).is_file()
    assert stack["STACK_VENV"] in (ROOT / ".gitignore").read_text().splitlines() or (
        f"{stack['STACK_VENV']}/" in (ROOT / ".gitignore").read_text().splitlines()
    )


def _shell(**extra: str) -> dict:
    """The environment of make run from a shell: not what `make test STACK=...` hands the tests
    (its VENV and STACK, and MAKEFLAGS, which carries a command line's STACK=2.15 to any make)."""
    drop = ("VENV", "STACK", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


def test_the_default_stack_is_221_and_an_unknown_one_is_refused(tmp_path):
    default = stacks.stack(None)
    assert default == stacks.stack("2.21") and (default["TF_VERSION"], default["STACK_VENV"]) == ("2.21.0", ".venv")
    assert default["STACK_PYTHON"] == "3.12" and default["STACK_LOCK"] == "requirements/constraints.txt"
    env = _shell(STACK="2.16", VENV=str(tmp_path / "venv"))
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "setup"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "STACK=2.16: no such stack" in proc.stderr and "STACK=2.15" in proc.stderr and "STACK=2.21" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_make_runs_the_215_stack_from_its_own_venv():
    shell = _shell()
    proc = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "test-fast", "STACK=2.15"],
        env=shell,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert ".venv-2.15/bin/python -m pytest" in proc.stdout
    default = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "test-fast"], env=shell, capture_output=True, text=True, timeout=60
    )
    assert ".venv/bin/python -m pytest" in default.stdout


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
    subprocess.run([str(REAL), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/build-horovod.sh"), str(venv / "bin/python")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "TensorFlow is not installed" in proc.stderr


def test_stack_keras_gives_every_process_of_an_environment_its_stacks_keras(tmp_path):
    """scripts/stack-keras.sh, as Binder, conda and the images run it on an environment setup.sh did
    not make: on 2.21 tf-keras (here this environment's, reached by a .pth) and TF_USE_LEGACY_KERAS=1
    in every process its Python starts, whatever the parent set; on 2.15 the variable unset (make
    test-stack STACK=2.15 runs it there)."""
    name = THIS_STACK  # the stack of this environment, whose packages the test reaches
    venv = tmp_path / "venv"
    subprocess.run([str(REAL), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "stack.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # pip, and the locked stack
    python = str(venv / "bin" / "python")
    env = {**_shell(STACK=name), "PIP_NO_INDEX": "1"}
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/stack-keras.sh"), python], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    legacy = stacks.stack(name)["LEGACY_KERAS"] == "1"
    assert f"Keras for the {name} stack" in proc.stdout and ("tf-keras" in proc.stdout) == legacy
    for inherited in ("0", "1"):
        child = subprocess.run(
            [python, "-c", "import os; print(os.environ.get('TF_USE_LEGACY_KERAS'))"],
            env={"PATH": "/usr/bin:/bin", "TF_USE_LEGACY_KERAS": inherited},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert child.stdout.strip() == ("1" if legacy else "None"), child.stderr


def test_failed_build_leaves_no_stamp(tmp_path):
    """A setup that dies after creating the venv must not leave it looking complete."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / ".labs-setup-stamp").write_text("stale")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _fake_python(bindir, f"python{V}", "3.10")
    _fake_python(bindir, "python3", "3.10")
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "VENV": str(venv), "HOME": str(tmp_path), "STACK": THIS_STACK}
    env["LABS_TOOLS_DIR"] = str(tmp_path / "tools")  # not the checkout's .tools/uv, which finds real Pythons
    proc = subprocess.run(["bash", str(ROOT / "scripts/setup.sh")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "up to date" not in proc.stdout


def _slow(*cmd: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "scripts/slow-test.sh"), *cmd],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_slow_test_runs_the_command_under_a_cpu_quota_and_removes_its_cgroup():
    proc = _slow("cat", "/proc/self/cgroup", CPUS="0.5")
    assert proc.returncode == 0, proc.stderr
    if "CPU quota of 0.5 cores" not in proc.stdout:  # not root: the busy loops, said so
        assert "no cgroup can be made here" in proc.stdout and "busy loops" in proc.stdout, proc.stdout
        return
    cgroup = proc.stdout.split("runs in cgroup ")[1].split()[0]  # e.g. cpu/labs-slow-123
    assert any(line.endswith("/" + cgroup.split("/")[-1]) for line in proc.stdout.splitlines()), proc.stdout
    assert not (Path("/sys/fs/cgroup") / cgroup).exists()  # removed with the command's end


def test_slow_test_busy_loops_end_with_the_command():
    proc = _slow("bash", "-c", "pgrep -f -x 'bash -c while :; do :; done' | sort", SLOW_BY="busy", BUSY="2")
    assert proc.returncode == 0 and "beside 2 busy loops" in proc.stdout, proc.stdout + proc.stderr
    loops = [int(x) for x in proc.stdout.splitlines() if x.strip().isdigit()]
    assert len(loops) >= 2
    assert not [pid for pid in loops if Path(f"/proc/{pid}").exists()], loops  # all stopped


def test_slow_test_refuses_bad_settings_and_passes_the_exit_code_on():
    assert _slow("true", CPUS="abc").returncode == 2
    assert _slow("true", SLOW_BY="sometimes").returncode == 2
    assert _slow("bash", "-c", "exit 7", SLOW_BY="busy", BUSY="0").returncode == 7
