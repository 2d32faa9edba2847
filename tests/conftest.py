"""Shared test plumbing: a leak check around every test that starts processes, a check that
each module leaves nothing in the temporary directory, and skips for tests that need
hardware or builds this machine may not have."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("LABS_OFFLINE", "1")  # tests never download

#: prefix of the suite's own temporary directory (see :func:`_suite_tmpdir`)
SUITE_TMP_PREFIX = "labs-suite-"


def _suite_tmpdir() -> tuple[str, bool]:
    """The suite's own temporary directory, ``$TMPDIR/labs-suite-XXXX`` (mode 1777: the test
    students write there too), made ``TMPDIR`` for the suite and everything it starts; and
    whether this session made it.

    The check that each module leaves nothing in the temporary directory then sees only what
    the suite made, and removes only that: run beside the suite, a build or a second session
    keeps its own temporary files (a compiler's, once, were removed under it). A pytest run
    started by a test inherits the folder rather than making one inside it."""
    base = tempfile.gettempdir()
    if os.path.basename(base).startswith(SUITE_TMP_PREFIX):
        return base, False
    path = tempfile.mkdtemp(prefix=SUITE_TMP_PREFIX, dir=base)
    os.chmod(path, 0o1777)
    os.environ["TMPDIR"] = tempfile.tempdir = path
    return path, True


SUITE_TMP, _SUITE_TMP_MADE_HERE = _suite_tmpdir()
# The suite's dataset cache (lab_utils.data_cache), not the developer's ~/.cache: made now, so
# that no module's check of the temporary directory counts it as that module's leftover.
os.environ.setdefault("LABS_CACHE_DIR", os.path.join(SUITE_TMP, "data-cache"))
os.makedirs(os.environ["LABS_CACHE_DIR"], mode=0o700, exist_ok=True)


def pytest_sessionfinish(session, exitstatus):
    """Remove the suite's temporary directory when this session made it and passed. What a
    module left there has already failed that module (:func:`nothing_left_in_tmp`); what is
    left now is pytest's own ``tmp_path`` folders, kept after a failure for the developer to read."""
    if not _SUITE_TMP_MADE_HERE:
        return
    if exitstatus == 0:
        shutil.rmtree(SUITE_TMP)
    else:
        print(f"\nthe tests' temporary files are kept in {SUITE_TMP} (remove it when done)")


#: CPU seconds of one ``import tensorflow`` (2.59, bench_labs at 5ed2b8a) in the session whose
#: fresh-clone suite took 31:49 of pytest here (867 tests, 974d678, 2026-11-25): the unit that
#: makes suite times of two days comparable
IMPORT_CPU_NORMAL_S = 2.6
_speed: dict[str, float] = {}


def pytest_collection_finish(session):
    """Measure this machine's speed today, before any test runs: the CPU seconds of one
    ``import tensorflow`` (bench/bench_cluster_startup.py's unit; every cluster task pays it),
    when the session runs tests that start processes. The summary prints it beside the
    suite's time: a day this machine kind runs 2x slower shows as 2x the unit."""
    if not session.config.getoption("collectonly") and any(
        item.get_closest_marker("process") or item.get_closest_marker("notebook") for item in session.items
    ):
        spec = importlib.util.spec_from_file_location(
            "bench_cluster_startup", Path(__file__).resolve().parents[1] / "bench" / "bench_cluster_startup.py"
        )
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
        _speed["import_cpu_s"] = bench.import_cpu_seconds(dict(os.environ))
        _speed["start"] = time.monotonic()


def pytest_terminal_summary(terminalreporter):
    if "import_cpu_s" in _speed:
        unit = _speed["import_cpu_s"]
        minutes = (time.monotonic() - _speed["start"]) / 60
        terminalreporter.write_line(
            f"machine speed: an `import tensorflow` took {unit:.2f} CPU seconds before the tests "
            f"({IMPORT_CPU_NORMAL_S} on a normal day); the tests took {minutes:.1f} min, "
            f"{minutes * IMPORT_CPU_NORMAL_S / unit:.1f} min at a normal day's speed"
        )


def _gpu_count() -> int:
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()


#: the mark every test of a folder carries, given here once instead of in each file
FOLDER_MARKS = {"process": pytest.mark.process, "notebooks": pytest.mark.notebook}


@pytest.hookimpl(tryfirst=True)  # before `-m "not process"` deselects by these marks
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        folder = Path(item.path).resolve().relative_to(here).parts[0] if Path(item.path).is_relative_to(here) else ""
        if folder in FOLDER_MARKS:
            item.add_marker(FOLDER_MARKS[folder])
    no_gpu = _gpu_count() == 0
    no_hvd = importlib.util.find_spec("horovod") is None
    for item in items:
        if no_gpu and item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="no GPU on this machine"))
        if no_hvd and item.get_closest_marker("horovod"):
            item.add_marker(pytest.mark.skip(reason="Horovod is not installed (make setup builds it)"))


def _children() -> dict[int, str]:
    out = {}
    for child in psutil.Process().children(recursive=True):
        try:
            out[child.pid] = " ".join(child.cmdline())[:200]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
        except psutil.AccessDenied:
            out[child.pid] = "?"
    return out


@pytest.fixture(autouse=True)
def no_leaked_processes(request):
    """Tests that start processes must leave none behind (polled under a deadline)."""
    if not ({"process", "notebook"} & set(request.keywords)):
        yield
        return
    before = set(_children())
    yield
    deadline = time.monotonic() + 15
    leaked = {}
    while time.monotonic() < deadline:
        leaked = {pid: cmd for pid, cmd in _children().items() if pid not in before}
        if not leaked:
            return
        time.sleep(0.2)
    for pid in leaked:  # do not let one leak poison the rest of the session
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    pytest.fail(f"processes left running after the test: {leaked}")


#: what the temporary directory holds for everyone, or pytest's own folders
_SHARED_TMP = {".tensorboard-info", ".X11-unix", ".ICE-unix", ".font-unix", ".XIM-unix", ".Test-unix"}


def _tmp_entries() -> set[str]:
    """What the temporary directory holds, Open MPI's per-user session folders by what is
    in them (``ompi.<host>.<uid>/pid.<mpirun's pid>``: Open MPI may keep the folder itself)."""
    tmp, found = tempfile.gettempdir(), set()
    for name in os.listdir(tmp):
        if name in _SHARED_TMP or name.startswith("pytest-of-"):
            continue
        if name.startswith("ompi.") and os.path.isdir(os.path.join(tmp, name)):
            try:
                found.update(f"{name}/{run}" for run in os.listdir(os.path.join(tmp, name)))
            except PermissionError:  # another user's: its runs are that user's business
                pass
            continue
        found.add(name)
    return found


def _own_autograph_files() -> set[str]:
    """The ``tf.function`` sources TensorFlow wrote for THIS process (a unit test that traces
    one in-process): its atexit hook removes them when pytest ends."""
    from lab_utils.training.loop import autograph_files

    return {os.path.basename(path) for path in autograph_files()}


@pytest.fixture(scope="module", autouse=True)
def nothing_left_in_tmp(request):
    """A module's tests, and its fixtures, leave nothing in the temporary directory that a
    student's /tmp would keep (a log, an emulated host's folder, TensorFlow's generated
    files). Set up before the module's other fixtures, so torn down after them: a leak
    fails the module's last test (an error in its teardown), naming the files, which it
    then removes so that one leak does not fail every module after it."""
    before = _tmp_entries()
    yield
    deadline = time.monotonic() + 10
    while (left := _tmp_entries() - before - _own_autograph_files()) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling under a deadline: a process ending may still be removing its own
    if not left:
        return
    for name in left:
        path = Path(tempfile.gettempdir()) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    pytest.fail(f"{request.module.__name__} left these in {tempfile.gettempdir()}: {sorted(left)}")


#: the machine-wide places a process can leave something that outlives it: what no test may leave
SHARED_DIRS = (Path("/dev/shm"), Path("/run/lock"), Path("/var/lock"))
#: what is there on purpose: the emulated networks' machine-wide lock (lab_utils.cluster.netbase),
#: one file every user's networks take turns on
SHARED_ON_PURPOSE = {"labnet.lock"}


def _shared_entries() -> set[str]:
    """What /dev/shm, /run/lock and /var/lock hold, and the System V shared memory segments,
    semaphore sets and message queues of this IPC namespace (``sysv <table> <id>``)."""
    found = set()
    for folder in SHARED_DIRS:
        try:
            found.update(str(folder / name) for name in os.listdir(folder) if name not in SHARED_ON_PURPOSE)
        except OSError:
            continue
    for table in ("shm", "sem", "msg"):
        try:
            rows = Path(f"/proc/sysvipc/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        found.update(f"sysv {table} {row.split()[1]}" for row in rows if len(row.split()) > 1)
    return found


def _remove_shared(entry: str) -> None:
    if entry.startswith("sysv "):
        import ctypes

        _, table, ident = entry.split()
        libc = ctypes.CDLL(None, use_errno=True)
        if table == "sem":  # IPC_RMID is 0: semctl(id, 0, IPC_RMID), shmctl/msgctl(id, IPC_RMID, NULL)
            libc.semctl(int(ident), 0, 0)
        else:
            getattr(libc, f"{table}ctl")(int(ident), 0, None)
        return
    path = Path(entry)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def nothing_left_in_shared_memory(request):
    """A module's tests leave nothing in /dev/shm, /run/lock or /var/lock, and no System V shared
    memory, semaphore set or message queue (a killed MPI job's segments, a sandbox's files): what
    is there outlives every process, and is seen by every user of the machine. A leak fails the
    module's last test, naming what was left, which is then removed."""
    before = _shared_entries()
    yield
    deadline = time.monotonic() + 10
    while (left := _shared_entries() - before) and time.monotonic() < deadline:
        time.sleep(0.2)  # polling under a deadline: a process ending may still be removing its own
    if not left:
        return
    for entry in left:
        _remove_shared(entry)
    pytest.fail(f"{request.module.__name__} left these outside its processes: {sorted(left)}")
