"""Every ``LABS_*`` environment variable, declared and read in one place.

Modules never call ``os.environ.get("LABS_...")`` themselves: they call the
accessor here, so a variable's name, meaning and default are written once.
The ``LAB_*`` variables that the grading worker sets for a sandbox and that
code inside it reads (``LAB_SANDBOX``, ``LAB_GRADING_TIMING``,
``LAB_GRADING_DRIVEN``, ``LAB_GRADING_REFERENCE_DIR``) are declared here too,
under their own prefix (the names a running grading batch and its sandboxes
share), and setter and reader both name them by the constants below.
Each accessor takes an optional ``env`` mapping (tests pass a dict) and falls
back to ``os.environ``. The variables the launcher *sets* for its tasks
(``LABS_TASK``, ``LABS_REPORT_FILE``, ``LABS_REPORT_DIR``, ``LABS_RUN_DIR``) are
named by the constants below, so setter and reader cannot drift apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple


class Var(NamedTuple):
    name: str
    default: str | None
    doc: str


VARIABLES = {
    v.name: v
    for v in (
        Var("LABS_OFFLINE", None, "1: load_mnist() uses the offline sample, never the network"),
        Var(
            "LABS_DATA_DIR",
            None,
            "a folder holding mnist.npz (and cifar-10-batches-py/ for Lab 5): used before any download",
        ),
        Var("LABS_DOWNLOAD_TIMEOUT", "10", "seconds load_mnist() waits for the download"),
        Var(
            "LABS_CACHE_DIR",
            None,
            "where decoded datasets are kept as read-only memory-mapped files that every process shares "
            "(default $XDG_CACHE_HOME/lab_utils or ~/.cache/lab_utils); off: each process decodes its own copy",
        ),
        Var("LABS_RUN_ROOT", None, "where cluster run directories go (default ~/.lab_runs)"),
        Var("LABS_RUN_DIR", None, "set by the launcher: this task's run directory"),
        Var("LABS_TASK", None, "set by the launcher: this task's name, e.g. worker:1"),
        Var("LABS_REPORT_FILE", None, "set by the launcher: this task's events file"),
        Var("LABS_REPORT_DIR", None, "set by the launcher for MPI jobs: one rank-<r>.jsonl per rank"),
        Var("LABS_JOB", None, "set by the launcher: the job a process belongs to (finds strays after an interrupt)"),
        Var("LABS_RESULTS_FILE", None, "set by run_labs: where a notebook's record() goes"),
        Var("LABS_HEADLESS", None, "1: nobody watches (static figures), 0: a person does (live widgets)"),
        Var(
            "LABS_TRACE",
            None,
            "0: tasks record no timeline spans (bench/bench_timeline.py measures what recording costs); default on",
        ),
        Var(
            "LABS_STRAGGLER",
            None,
            "task=seconds[,task=seconds] (e.g. rank:1=0.2 or worker:1=50ms): those tasks of every run kind sleep "
            "that long at the start of each timed step, a 'straggler delay' on the timeline (what the critical "
            "path and the waits by cause must find); Labs 2-3's PS runs also take --straggler",
        ),
        Var(
            "LABS_HANDIN_URL",
            None,
            "the class's hand-in service, e.g. http://127.0.0.1:8000/services/handin/ (set by the Hub's spawner): "
            "where lab_utils.hub.hand_in() sends a notebook",
        ),
        Var(
            "LABS_ALLOW_EXPOSED",
            None,
            "1: start TF clusters even where no private network can be made and their servers are reachable "
            "from this machine's network (TFCluster(exposed_ok=True) does the same for one cluster)",
        ),
        Var("LAB_SANDBOX", None, "set by the grading sandbox: its name, on every process it starts (finds them all)"),
        Var(
            "LAB_GRADING_TIMING",
            None,
            'set by the grading worker: the lab\'s timing settings as JSON {"rounds", "max_rounds", "noise"} '
            "(grading/settings.yml) for the throughput tests",
        ),
        Var(
            "LAB_GRADING_DRIVEN",
            None,
            "set by the grading worker: 1 when the grader times the throughput tests itself, asking the kernel "
            "for each timed job over its stdin (lab_utils.grading.throughput)",
        ),
        Var(
            "LAB_GRADING_REFERENCE_DIR",
            None,
            "set by the grading worker: the sandbox's read-only view of the lab's reference scripts "
            "(what reference_script() returns there)",
        ),
    )
}

RUN_DIR, TASK, REPORT_FILE, REPORT_DIR, JOB = (
    "LABS_RUN_DIR",
    "LABS_TASK",
    "LABS_REPORT_FILE",
    "LABS_REPORT_DIR",
    "LABS_JOB",
)
RESULTS_FILE, HEADLESS, ALLOW_EXPOSED = "LABS_RESULTS_FILE", "LABS_HEADLESS", "LABS_ALLOW_EXPOSED"
TRACE, STRAGGLER = "LABS_TRACE", "LABS_STRAGGLER"
HANDIN_URL, OFFLINE = "LABS_HANDIN_URL", "LABS_OFFLINE"
SANDBOX, GRADING_TIMING, GRADING_DRIVEN, GRADING_REFERENCE_DIR = (
    "LAB_SANDBOX",
    "LAB_GRADING_TIMING",
    "LAB_GRADING_DRIVEN",
    "LAB_GRADING_REFERENCE_DIR",
)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def get(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's value (stripped), its declared default when unset or empty."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not a lab_utils variable; known: {', '.join(VARIABLES)}")
    env = os.environ if env is None else env
    value = (env.get(name) or "").strip()
    return value or VARIABLES[name].default


def flag(name: str, env: Mapping[str, str] | None = None) -> bool | None:
    """True / False for a yes/no variable, None when it is unset."""
    value = get(name, env)
    if value is None:
        return None
    low = value.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={value!r}: use 1 or 0 (also true/false, yes/no, on/off)")


def number(name: str, env: Mapping[str, str] | None = None) -> float | None:
    value = get(name, env)
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a number") from None
