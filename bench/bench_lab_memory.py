"""Peak memory of each lab, run as a student runs it: the numbers behind a class's per-user
memory limit (deploy/README.md, deploy/jupyterhub/values.yaml). JSON out.

    python bench/bench_lab_memory.py [--labs 01,02] [--full] [--out memory.json]
    python bench/bench_lab_memory.py --full --stand-ins --cpus 1 --limit-mb 2048   # Binder's limits
    python bench/bench_lab_memory.py --full --stand-ins --keep-notebooks out/reference-notebooks
        # then: make slides FIGURES_FROM=out/reference-notebooks TIER="..." (the decks' figures)


Each lab runs headless with papermill (``python -m lab_utils.run_labs``: the CI parameters,
or with ``--full`` the notebook's own defaults, a student's full run) inside a cgroup of its
own (:class:`lab_utils.grading.sandbox.Sandbox`), and the cgroup's high-water mark is
reported: the kernel, every cluster task it started and the page cache they touched, all
together, which is what a container's memory limit counts (the datasets' cache,
:mod:`lab_utils.data_cache`, starts empty: the run pays for its first decoding, and for the
cached pages it maps). Needs root (cgroups); the
limit set here (``--limit-mb``) is by default only a safety net far above what a lab needs;
with Binder's (``--limit-mb 2048 --cpus 1``) a lab that does not fit ends with its exit code
and log tail. ``--stand-ins`` runs on full-size data without the internet: the deterministic
MNIST and CIFAR-10 stand-ins (``python -m lab_utils stand-ins``) through ``LABS_DATA_DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from json_out import emit

from lab_utils import standins
from lab_utils.grading import layout
from lab_utils.grading.sandbox import Sandbox, cgroup_support

MB = 2**20
STAND_INS = Path(__file__).resolve().parents[1] / "out" / "stand-ins"


def measure(lab: str, full: bool, limit_mb: int, timeout_s: float, cpus: float = 2, keep: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        argv = [sys.executable, "-m", "lab_utils.run_labs", "--labs", lab[:2], "--out", tmp, "--no-progress"]
        box = Sandbox(f"mem{lab[:2]}", memory_mb=limit_mb, cpus=cpus, max_processes=4096, network="host", isolate=True)
        t0 = time.monotonic()
        try:
            # A dataset cache of the run's own, empty: the lab decodes its data and writes the cache
            # as a student's first run does, and the cgroup is charged for those pages.
            env = {**os.environ, "LABS_CACHE_DIR": str(Path(tmp) / "data-cache")}
            box.start(argv + (["--full"] if full else []), log=Path(tmp) / "run.log", env=env)
            with _Sampler(box) as sampled:
                rc = box.wait(timeout=timeout_s)
            peak = box.peak_memory_bytes()
            box.sweep(settle_s=5)
            tail = (Path(tmp) / "run.log").read_text(errors="replace").splitlines()[-5:]
            scaled = _scaled_down(Path(tmp) / f"{lab}.ipynb")
            recorded = _recorded(Path(tmp) / "summary.json")
            if keep is not None:  # the lecture decks' figures: a whole run's only, never an earlier one's
                keep.mkdir(parents=True, exist_ok=True)
                (keep / f"{lab}.ipynb").unlink(missing_ok=True)
                if rc == 0 and (Path(tmp) / f"{lab}.ipynb").is_file():
                    shutil.copy2(Path(tmp) / f"{lab}.ipynb", keep / f"{lab}.ipynb")
        finally:
            box.close()
    return {
        "params": "full" if full else "ci",
        "limits": {"memory_mb": limit_mb, "cpus": cpus},
        "data": "stand-ins" if standins.is_stand_in(os.environ.get("LABS_DATA_DIR")) else "the labs' own sources",
        "exit": rc,
        "wall_s": round(time.monotonic() - t0, 1),
        "peak_mb": None if peak is None else round(peak / MB),
        # the high-water mark counts every page of page cache the run touched until the kernel
        # needed it back (at a tight limit, the limit itself): these say what had to stay
        "peak_working_set_mb": round(sampled.working_set / MB),
        "peak_private_mb": round(sampled.private / MB),
        "scaled_down": scaled,
        # what the notebook record()ed: its headline figures and the readings of its questions
        # (bench/expected_results.py turns these into grading/expected_results.md)
        "recorded": recorded,
        **({"log_tail": tail} if rc != 0 else {}),
    }


def _recorded(summary: Path) -> dict:
    """The figures the lab's notebook passed to :func:`lab_utils.notebook.record` ({} if none)."""
    if not summary.is_file():
        return {}
    rows = json.loads(summary.read_text())
    row = rows[0] if rows else {}
    return {k: v for k, v in row.items() if k not in ("lab", "mode", "status", "error", "notebook")}


class _Sampler:
    """The sandbox's working set and private memory, sampled every ``interval`` s in a thread
    while the lab runs; their peaks are kept."""

    def __init__(self, box: Sandbox, interval: float = 0.5):
        self.box, self.interval = box, interval
        self.working_set = self.private = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-memory-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            now = self.box.working_set_bytes()
            if now is not None:
                self.working_set, self.private = max(self.working_set, now[0]), max(self.private, now[1])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _scaled_down(notebook: Path) -> list[str]:
    """The lines in which the run's notebook said it ran a smaller cluster than asked for
    (``[lab_utils] 4 workers do not fit here (...): using 2``); [] when none was."""
    if not notebook.is_file():
        return []
    nb = json.loads(notebook.read_text())
    return sorted(
        {
            line.strip()
            for cell in nb["cells"]
            for out in cell.get("outputs", [])
            if out.get("output_type") == "stream"
            for line in "".join(out.get("text", "")).splitlines()
            if line.startswith("[lab_utils]") and "do not fit" in line
        }
    )


def _stop(signum, _frame):
    """SIGTERM (``kill``, a CI job's cancel) ends the bench like Ctrl-C: through ``finally``,
    so the sandbox of the lab being measured is closed with everything in it, not left running."""
    raise SystemExit(128 + signum)


def main(argv=None) -> int:
    signal.signal(signal.SIGTERM, _stop)
    parser = argparse.ArgumentParser()
    parser.add_argument("--labs", default="", help="comma-separated labs (default: all)")
    parser.add_argument("--full", action="store_true", help="the notebooks' own defaults (a student's full run)")
    parser.add_argument("--limit-mb", type=int, default=12288, help="the cgroup's limit: a safety net only")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per lab")
    parser.add_argument("--cpus", type=float, default=2, help="the cgroup's CPU quota (Binder: 1)")
    parser.add_argument(
        "--stand-ins", action="store_true", help="full-size data offline: MNIST and CIFAR-10 stand-ins in LABS_DATA_DIR"
    )
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument(
        "--keep-notebooks",
        type=Path,
        default=None,
        help="keep each lab's executed notebook here (the lecture decks take their figures from them: make slides)",
    )
    args = parser.parse_args(argv)
    if cgroup_support() is None:
        print("bench_lab_memory: needs root and cgroups (memory, pids, cpu) to measure a lab's peak", file=sys.stderr)
        return 2
    out = {"labs": {}}
    if args.stand_ins:  # outside /tmp, which the sandbox replaces; written once, kept in out/
        if not standins.is_stand_in(STAND_INS):
            standins.write(STAND_INS)
        os.environ["LABS_DATA_DIR"] = str(STAND_INS)  # the sandbox's run inherits it
    for lab in layout.select_labs([x for x in args.labs.split(",") if x]):
        out["labs"][lab] = measure(lab, args.full, args.limit_mb, args.timeout, args.cpus, args.keep_notebooks)
        print(f"{lab}: {out['labs'][lab]}", file=sys.stderr, flush=True)
    emit(out, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
