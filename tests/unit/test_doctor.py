"""lab_utils.doctor: every row, the FAIL paths, the exit code."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from support import stacks

from lab_utils import doctor as d

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "cgroup"
GiB = 1024**3


def _raise_import(name):
    raise ImportError(f"No module named '{name}'")


def test_python_version_names_the_stack_or_says_what_to_do():
    row = d.check_python((3, 11, 7))
    assert row.status == d.OK and "the 2.15 stack (TensorFlow 2.15.1)" in row.value
    row = d.check_python((3, 12, 1))
    assert row.status == d.OK and "the 2.21 stack (TensorFlow 2.21.0)" in row.value
    row = d.check_python((3, 13, 0))
    assert row.status == d.FAIL and "no stack of the course runs on Python 3.13" in row.fix
    assert "Python 3.12: `make setup`" in row.fix and "Python 3.11: `make setup STACK=2.15`" in row.fix


def test_the_doctors_stacks_are_the_ones_setup_builds():
    """lab_utils.doctor.STACKS and scripts/stacks.sh name the same stacks, Pythons and TensorFlows."""
    for name, stack in d.STACKS.items():
        made = stacks.stack(name)
        assert (made["STACK_PYTHON"], made["TF_VERSION"], made["LEGACY_KERAS"]) == (
            stack["python"],
            stack["tensorflow"],
            str(int(stack["legacy_keras"])),
        )
    assert stacks.stack(None)["STACK"] == d.DEFAULT_STACK


def test_the_221_stack_needs_legacy_keras_and_the_215_stack_does_not():
    assert d.check_legacy_keras({}, (3, 11, 7)) is None
    row = d.check_legacy_keras({}, (3, 12, 1))
    assert row.status == d.FAIL and "(unset)" in row.value and "`make setup`" in row.fix
    assert d.check_legacy_keras({"TF_USE_LEGACY_KERAS": "1"}, (3, 12, 1)).status == d.OK


def test_tensorflow_missing_fails():
    rows = d.check_tensorflow(importer=_raise_import, version_info=(3, 11, 7))
    assert rows[0].status == d.FAIL and "make setup STACK=2.15" in rows[0].fix and "2.15.1" in rows[0].fix
    rows = d.check_tensorflow(importer=_raise_import, version_info=(3, 12, 1))
    assert "`make setup`" in rows[0].fix and "2.21.0" in rows[0].fix


def test_tensorflow_wrong_version_warns():
    fake = SimpleNamespace(__version__="2.16.1", config=SimpleNamespace(list_physical_devices=lambda *a: []))
    rows = d.check_tensorflow(importer=lambda name: fake, version_info=(3, 11, 7))
    assert rows[0].status == d.WARN and rows[0].value == "2.16.1" and "pinned to 2.15.1" in rows[0].fix
    assert "STACK=2.15" in rows[0].fix
    rows = d.check_tensorflow(importer=lambda name: fake, version_info=(3, 12, 1))
    assert rows[0].status == d.WARN and "pinned to 2.21.0" in rows[0].fix and "STACK=" not in rows[0].fix


def _fake_hvd(mpi=True, gloo=True, nccl=False, version="0.28.1"):
    top = SimpleNamespace(__version__=version)
    tf = SimpleNamespace(mpi_built=lambda: mpi, gloo_built=lambda: gloo, nccl_built=lambda: nccl)
    return lambda name: top if name == "horovod" else tf


def test_horovod_rows():
    assert d.check_horovod(importer=_raise_import).status == d.FAIL
    assert d.check_horovod(importer=_fake_hvd()).status == d.OK
    gloo_only = d.check_horovod(importer=_fake_hvd(mpi=False))
    assert gloo_only.status == d.WARN and "MPI" in gloo_only.fix
    assert d.check_horovod(importer=_fake_hvd(mpi=False, gloo=False)).status == d.FAIL


def test_mpirun_missing_fails():
    row = d.check_mpirun(which=lambda name: None)
    assert row.status == d.FAIL and "openmpi" in row.fix


def test_mpi4py_broken_fails():
    def broken(cmd):
        return subprocess.CompletedProcess(cmd, 1, "", "ImportError: libmpi.so.40: cannot open")

    row = d.check_mpi4py(run=broken)
    assert row.status == d.FAIL and "libmpi" in row.value


def test_memory_rows_from_limits():
    assert d.check_memory({"MEM_LIMIT": str(GiB)}, "/").status == d.FAIL
    assert d.check_memory({}, FIX / "v2").status in (d.WARN, d.FAIL)  # 2 GiB, 1.5 in use
    assert d.check_memory({}, FIX / "v2").value.startswith("limit 2.0 GiB")


def test_cpu_warns_on_one_core():
    row = d.check_cpu({"CPU_LIMIT": "1"}, FIX / "v2_unlimited")
    assert row.status == d.WARN and "CPU_LIMIT 1" in row.value


class _NVML:
    class NVMLError(Exception):
        pass

    def __init__(self, names=None, fail=False):
        self.names, self.fail = names or [], fail

    def nvmlInit(self):
        if self.fail:
            raise self.NVMLError("NVML Shared Library Not Found")

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, handle):
        return self.names[handle]


def test_gpu_rows():
    assert d.check_gpus(0, nvml=_NVML(fail=True)).status == d.OK  # no GPU is not an error
    row = d.check_gpus(0, nvml=_NVML(names=["Tesla T4"]))
    assert row.status == d.WARN and "GPU=1" in row.fix  # GPU present, TF CPU-only
    assert d.check_gpus(1, nvml=_NVML(names=["Tesla T4"])).status == d.OK


def test_disk_fail(monkeypatch, tmp_path):
    monkeypatch.setattr(d.shutil, "disk_usage", lambda p: SimpleNamespace(free=100 * 1024**2))
    assert d.check_disk(tmp_path).status == d.FAIL


def test_host_row():
    assert "binder" in d.check_host({"BINDER_REQUEST": "x"}).value


def test_report_exit_code_and_html(monkeypatch, capsys):
    rows = [d.Check("Python", d.OK, "3.11"), d.Check("mpirun", d.FAIL, "not found", "install <openmpi>")]
    monkeypatch.setattr(d, "run_checks", lambda env=None, root="/": rows)
    assert d.main() == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "-> install <openmpi>" in out
    html = d.doctor()._repr_html_()
    assert "install &lt;openmpi&gt;" in html and html.count("<tr>") == 3


def test_real_environment_passes():
    """The environment `make setup` built passes every check (this is CI's own machine)."""
    proc = subprocess.run([sys.executable, "-m", "lab_utils", "doctor"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("Python", "TensorFlow", "Horovod", "mpirun", "mpi4py", "CPU", "Memory", "GPUs", "Disk", "Host"):
        assert f"  {name}" in proc.stdout
    assert "controllers: MPI, Gloo" in proc.stdout


def test_network_row_says_how_or_why_not():
    assert d.check_network(lambda: "netns").status == d.OK
    row = d.check_network(lambda: "userns")
    assert row.status == d.OK and "no root" in row.value
    row = d.check_network(lambda: None, lambda: "user namespaces are off here (user.max_user_namespaces = 0)")
    assert row.status == d.WARN and "max_user_namespaces" in row.value and "loopback" in row.fix


def test_every_process_of_this_venv_gets_its_stacks_keras_whatever_it_inherited():
    """The venv's .pth (scripts/stack-keras.sh): TF_USE_LEGACY_KERAS=1 on the 2.21 stack, unset on 2.15
    (where it would make TensorFlow look for tf-keras), even when the parent set the other."""
    legacy = d.STACKS[d.stack_of()]["legacy_keras"]
    inherited = {**d.os.environ, "TF_USE_LEGACY_KERAS": "0" if legacy else "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('TF_USE_LEGACY_KERAS'))"],
        env=inherited,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.stdout.strip() == ("1" if legacy else "None"), proc.stderr
