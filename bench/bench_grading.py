"""Autograde N correct submissions of a lab three ways in one run; JSON out.

    python bench/bench_grading.py [--labs 01,02] [--n 10] [--modes plain,parallel] [--out bench-grading.json]
    python bench/bench_grading.py --labs 01,02,03,04,05,06 --n 2 --against ../other-checkout --out against.json

- ``plain``: one notebook at a time, each sandbox from its start to its end before the
  next one starts (no pipeline: what grading cost before the gate);
- ``serial``: one notebook executing at a time, the next sandbox prepared meanwhile and
  the last one finishing meanwhile (the pipeline, ``make autograde JOBS=1``);
- ``parallel``: notebooks on every core at once, each taking its lab's ``cpus`` setting,
  pipelined (``make autograde``): Lab 1 (1 CPU) two at a time on 2 cores, Lab 2 (2 CPUs)
  one at a time;
- ``oversubscribed`` (labs that take more than one core): two such notebooks at once on
  every core anyway (``--jobs`` twice the cores): what the settings spare them.

``--against PATH``: this checkout and the one at PATH (another version, e.g. the last one
released) each grade the same number of correct submissions of every lab, one sandbox at a
time (``plain``), alternately (ABBA, ``--repeats`` pairs), in this one run: the JSON gives each
one's seconds per submission and their ratio (this over that).

Reports per lab: wall time of each batch, the speedups, and the share of each batch's
wall time (times its execution turns) not spent executing notebooks: the grading
overhead (the batch's course template, sandbox start and sweep, the worker's private
course, nbgrader's sanitising, merging, feedback), with the mean time of each worker
phase. Pipelined, much of it runs while a notebook executes, so it only counts where
it delays one; the CPU it costs shows in ``busy_cores``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import fmean

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from json_out import emit  # noqa: E402
from support import crafted  # noqa: E402

from lab_utils.grading import batch, layout  # noqa: E402
from lab_utils.grading.settings import grading_settings  # noqa: E402

PHASES = ("prepare", "course", "autograde", "account", "feedback")
#: mode -> (jobs, pipeline) for a machine of ``cores`` usable cores
MODES = {
    "plain": lambda cores: (1, False),
    "serial": lambda cores: (1, True),
    "parallel": lambda cores: (cores, True),
    "oversubscribed": lambda cores: (2 * cores, True),  # labs over one core only
}


def _course(tmp: Path, lab: str, n: int) -> tuple[Path, Path]:
    root, subs = crafted.course(tmp, [lab], (REPO / "grading" / "settings.yml").read_text())
    for i in range(n):
        crafted.write("correct", lab, subs, student=f"student{i:02d}", root=root)
    return root, subs


def _busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _grade(lab: str, n: int, jobs: int, pipeline: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-grading-") as tmp:
        root, subs = _course(Path(tmp), lab, n)
        t0, cpu0 = time.monotonic(), _busy_s()
        with contextlib.redirect_stdout(io.StringIO()):
            results = batch.autograde(subs, [lab], root, jobs=jobs, resume=False, out=sys.stderr, pipeline=pipeline)
        wall, busy = time.monotonic() - t0, _busy_s() - cpu0
    graded = [r for r in results if r["status"] == "graded"]
    executing = sum(r["timings"]["execution_s"] for r in graded)
    phases = (
        {k: round(sum(r["timings"]["phases"][k] for r in graded) / len(graded), 2) for k in PHASES} if graded else {}
    )
    return {
        "jobs": jobs,
        "pipeline": pipeline,
        "wall_s": round(wall, 1),
        "graded": len(graded),
        "scores": sorted({r["score"] for r in graded}),
        "infrastructure_errors": [f"{r['student']}: {r['reason']}" for r in results if r["status"] != "graded"],
        "flags": sorted({f["kind"] for r in results for f in r["flags"]}),
        # executing: the notebook in its kernel (kernel start included), as SandboxExecute timed it
        "executing_s": round(executing, 1),
        "mean_executing_s": round(executing / max(1, len(graded)), 2),
        # overhead: the batch's wall time not spent executing a notebook, over the batch's wall time x jobs
        "overhead_share": round(1 - executing / (wall * jobs), 3),
        # inside the worker; "autograde" holds the execution and, pipelined, the wait for its turn
        "mean_phases_s": phases,
        # the machine's CPU seconds per wall second: a serial batch already near the core count
        # leaves a parallel one nothing to gain
        "busy_cores": round(busy / wall, 2),
        "mean_sandbox_s": round(sum(r["provenance"]["wall_s"] for r in graded) / max(1, len(graded)), 2),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--labs", default="01,02")
    parser.add_argument("--n", type=int, default=10)
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"which batches, comma-separated, of {', '.join(MODES)} (default: all; "
        "plain,parallel for a capacity plan: plain is what one Slurm element does)",
    )
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--against", help="another checkout: grade with both, alternately, and compare (see above)")
    parser.add_argument("--repeats", type=int, default=1, help="with --against: ABBA pairs per lab (default 1)")
    args = parser.parse_args(argv)
    if args.against:
        emit(against(Path(args.against), args.labs, args.n, args.repeats), args.out)
        return
    modes = [m for m in args.modes.split(",") if m]
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    out = {"n": args.n, "cores": batch.usable_cores(), "modes": modes, "labs": {}}
    for lab in layout.select_labs(args.labs.split(",")):
        cpus = grading_settings(lab)["cpus"]
        runs = {
            mode: _grade(lab, args.n, *MODES[mode](out["cores"]))
            for mode in modes
            if mode != "oversubscribed" or cpus > 1
        }
        one = {"cpus": cpus, **runs}  # cpus: what one of its notebooks takes (grading/settings.yml)
        # seconds of a batch's wall time per submission: what a capacity plan multiplies
        one["per_submission_s"] = {mode: round(r["wall_s"] / max(1, r["graded"]), 2) for mode, r in runs.items()}
        ratios = {
            "pipeline_gain": ("plain", "serial"),  # same jobs, with and without the pipeline
            "speedup": ("serial", "parallel"),  # parallel over serial, both pipelined
            "speedup_over_plain": ("plain", "parallel"),
            "speedup_oversubscribed": ("serial", "oversubscribed"),
        }
        for name, (slow, fast) in ratios.items():
            if slow in runs and fast in runs:
                one[name] = round(runs[slow]["wall_s"] / runs[fast]["wall_s"], 2)
        if "plain" in runs:  # the most a parallel batch could gain: the cores over what one at a time keeps busy
            one["speedup_ceiling"] = round(out["cores"] / runs["plain"]["busy_cores"], 2)
        out["labs"][lab] = one
        print(f"{lab}: {one}", file=sys.stderr, flush=True)
    emit(out, args.out)


def _plain_per_submission(checkout: Path, lab: str, n: int) -> float:
    """Seconds per submission of ``checkout``'s grading of ``n`` correct ``lab`` submissions, one
    sandbox at a time: its own bench, in a process of its own, importing its own lab_utils."""
    cmd = [
        sys.executable,
        str(checkout / "bench" / "bench_grading.py"),
        "--labs",
        lab,
        "--n",
        str(n),
        "--modes",
        "plain",
    ]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{checkout}: bench_grading.py failed: {proc.stderr[-2000:]}")
    one = json.loads(proc.stdout)["labs"][lab]
    if one["plain"]["graded"] != n:
        raise RuntimeError(f"{checkout}: {lab}: {one['plain']['infrastructure_errors']}")
    return one["per_submission_s"]["plain"]


def against(other: Path, labs: str, n: int, repeats: int) -> dict:
    """This checkout's and ``other``'s seconds per submission, lab by lab, alternating ABBA."""
    out = {"n": n, "repeats": repeats, "this": str(REPO), "against": str(other.resolve()), "labs": {}}
    for lab in layout.select_labs(labs.split(",")):
        this, that = [], []
        for _ in range(repeats):
            for who in (REPO, other, other, REPO):
                (this if who == REPO else that).append(_plain_per_submission(who, lab, n))
        out["labs"][lab] = {"this_s": this, "against_s": that, "ratio": round(fmean(this) / fmean(that), 3)}
        print(f"{lab}: {out['labs'][lab]}", file=sys.stderr, flush=True)
    return out


if __name__ == "__main__":
    main()
