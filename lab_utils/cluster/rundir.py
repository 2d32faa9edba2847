"""Run directories, state files, and the cleanup that survives a dead kernel.

Each cluster gets ``<run root>/<kind>-<name>-<stamp>-<pid>-<random>/`` holding one
log and one events file per task and ``state.json``: who started it (pid + create
time) and every task's pid, process group and create time. :func:`reap`
(``python -m lab_utils reap``) stops what a dead kernel left behind, deciding by
the recorded pids, never by the status string, and removes its emulated hosts'
namespaces; :func:`prune_runs` deletes old
runs none of whose processes is alive.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from lab_utils import checks, config
from lab_utils.cluster import netem
from lab_utils.cluster.process import Recorded, create_time, same_process_alive, terminate

#: Run directories kept per user (logs, events, state of each cluster run); older
#: ones whose processes have all stopped are deleted when a new run starts.
KEEP_RUNS = 200


def new_run_dir(kind: str) -> Path:
    """A fresh run directory ``<run root>/<kind>-<time>-<pid>-<random>`` for a run that
    launches several jobs or one job by hand (Labs 4-6)."""
    path = run_root() / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{os.urandom(3).hex()}"
    path.mkdir(parents=True)
    return path


def run_root(env: Mapping[str, str] | None = None) -> Path:
    """Per-user directory holding one sub-directory per cluster (logs, events, state.json).

    ``$LABS_RUN_ROOT``, else ``~/.lab_runs``, else ``<tmp>/lab_runs-<uid>``."""
    env = os.environ if env is None else env
    candidates = []
    if config.get("LABS_RUN_ROOT", env):
        candidates.append(Path(config.get("LABS_RUN_ROOT", env)))
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    candidates.append(home / ".lab_runs")
    candidates.append(Path(os.environ.get("TMPDIR", "/tmp")) / f"lab_runs-{os.getuid()}")
    for cand in candidates:
        try:
            cand.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError:
            continue
        if os.access(cand, os.W_OK | os.X_OK):
            return cand
    raise RuntimeError(f"no writable run directory among {[str(c) for c in candidates]}; set LABS_RUN_ROOT")


def write_json_atomic(path: Path, data: dict) -> None:
    """Write ``data`` so that a reader sees the old file or the new one, never half."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def parent_record() -> dict:
    """This process (the kernel) as a state file records it."""
    me = os.getpid()
    return {"pid": me, "create_time": create_time(me), "argv0": sys.argv[0] if sys.argv else ""}


def read_state(path: Path) -> dict | None:
    """A state file's contents, or None (with one line on stdout) when it cannot be read."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        print(f"[lab_utils.cluster] skipping {path}: {exc}", flush=True)
        return None


def recorded_tasks(state: Mapping) -> list[Recorded]:
    """The tasks a state file names (pid, group, create time)."""
    return [
        Recorded(t.get("name", "?"), int(t["pid"]), int(t.get("pgid") or t["pid"]), t.get("create_time"))
        for t in state.get("tasks", [])
        if t.get("pid")
    ]


def _parent_alive(state: Mapping) -> bool:
    parent = state.get("parent", {})
    return bool(parent.get("pid")) and same_process_alive(int(parent["pid"]), parent.get("create_time"))


def reap(include_live: bool = False, root: str | os.PathLike | None = None, grace: float = 3.0) -> list[str]:
    """Stop the processes of clusters whose kernel is gone (pid *and* start time
    checked), or of all clusters with ``include_live=True``. A run is judged by its
    recorded pids, not by its status: a task that survived an earlier stop is found
    again. Returns the run directories in which something was stopped."""
    base = Path(root) if root is not None else run_root()
    stopped = []
    for state_file in sorted(base.glob("*/state.json")):
        state = read_state(state_file)
        if state is None:
            continue
        alive = [t for t in recorded_tasks(state) if t.alive()]
        network = state.get("network") if not state.get("network_removed") else None
        if not (alive or network) or (_parent_alive(state) and not include_live):
            continue
        procs = terminate(alive, grace).survivors
        survivors = [s.name for s in procs]
        described = [f"{s.name} (pid {s.pid})" for s in procs]
        if network:  # emulated hosts: their namespaces outlive every process
            left = netem.remove(network)
            survivors += left
            described += [f"namespace {n}" for n in left]
            state["network_removed"] = not left
        state.update(status="survived" if survivors else "stopped", survivors=survivors, stopped_by="reap")
        try:
            write_json_atomic(state_file, state)
        except OSError as exc:
            print(f"[lab_utils.cluster] could not update {state_file}: {exc}", flush=True)
        if survivors:
            print(
                f"[lab_utils.cluster] still running after SIGKILL: {', '.join(described)} in {state_file.parent}",
                flush=True,
            )
        stopped.append(str(state_file.parent))
    return stopped


def prune_runs(keep: int = KEEP_RUNS, root: str | os.PathLike | None = None) -> list[str]:
    """Delete the oldest run directories beyond the newest ``keep`` whose recorded
    processes are all gone and whose kernel is gone or stopped them (a run still in
    use, or left running for :func:`reap`, is never deleted). Returns the
    directories removed. Called when a cluster starts in the default run root."""
    checks.count("keep", keep, low=0)
    base = Path(root) if root is not None else run_root()
    runs = sorted(
        (p for p in base.iterdir() if (p / "state.json").is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    removed = []
    for path in runs[keep:]:
        state = read_state(path / "state.json")
        if state is None:
            continue  # being written, or not ours to judge: keep it
        if state.get("status") != "stopped" and _parent_alive(state):
            continue
        if any(t.alive() for t in recorded_tasks(state)):
            continue
        try:
            shutil.rmtree(path)
        except OSError as exc:
            print(f"[lab_utils.cluster] could not delete the old run {path}: {exc}", flush=True)
            continue
        removed.append(str(path))
    return removed
