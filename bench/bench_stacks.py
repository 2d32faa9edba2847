"""Every lab's CI run on both of the course's stacks in one invocation (issue 56): the old one
(Python 3.11, TensorFlow 2.15.1, ``.venv-2.15``; ``make setup STACK=2.15`` builds it) and the
default (Python 3.12, TensorFlow 2.21.0 with tf-keras, ``.venv``).

For each lab: its status and wall time on each stack, and each number its run records
(``<lab>.results.json``: accuracies, step times, speedups, byte ratios, the weights' differences)
side by side with the relative difference. A number counts as moved when it differs by more than
its tolerance: 0.01 absolute for an accuracy, 1e-5 absolute for a difference of weights, 20 % for
any other measurement (a time, a rate, bytes, a share: the issue's bound), exact for the rest
(counts, batch sizes, labels). One run a stack: a measurement that moves as much between two runs
of the same stack (a straggler's staleness, an asynchronous run's accuracy) needs repeated runs
before it says anything about the stack.
Also each notebook's lines on stderr that a student would see (TensorFlow's start-up messages).

And the claims of the labs' text (``grading/claims.yml``, as ``bench/expected_results.py`` judges
them on its CI tier: 2 CPUs, the CI parameters) on each stack's runs, side by side.

Then the figures the course quotes from its benches, each stack's run after the other's: a
cluster's start-up (``bench_cluster_startup.py``: 1 PS + 2 workers ready, and the ``import
tensorflow`` it is bounded by), the hand ring's and MPI's bus bandwidth at 64 MB and Horovod's
64 MB all-reduce with each controller (``bench_allreduce.py``), and Horovod's training step on
2 ranks with Gloo and MPI beside one process's (the same global batch). Each within 20 %. The
stacks take turns (``--rounds``, 2.15 then 2.21, again), and each figure is its stack's best
round's: the most GB/s, the least seconds (a machine busier for one stack's run than the
other's moved the hand ring's bus bandwidth by 44 % with one run each).

    python bench/bench_stacks.py [--labs 01,04] [--no-labs] [--no-figures] [--rounds 2] [--out FILE]
    python bench/bench_stacks.py --compare DIR_2.15 DIR_2.21     # two run_labs --out folders

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from expected_results import load_claims, verdict
from json_out import emit

REPO = Path(__file__).resolve().parents[1]
STACKS = {"2.15": REPO / ".venv-2.15", "2.21": REPO / ".venv"}
TIME_TOLERANCE = 0.20
ACCURACY_TOLERANCE = 0.01
WEIGHTS_TOLERANCE = 1e-5


def tolerance(key: str, value: object) -> tuple[str, float] | None:
    """How a recorded number may move between the stacks: ("abs"|"rel", bound), None for exact
    (a count, a batch size, a label)."""
    if "accuracy" in key:
        return ("abs", ACCURACY_TOLERANCE)
    if "diff" in key:
        return ("abs", WEIGHTS_TOLERANCE)
    if isinstance(value, float):  # a measurement: a time, a rate, bytes, a share, a ratio
        return ("rel", TIME_TOLERANCE)
    return None


def compare_numbers(old: dict, new: dict) -> dict:
    rows, moved = {}, []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        row = {"2.15": a, "2.21": b}
        if isinstance(a, bool) or isinstance(b, bool) or not all(isinstance(v, int | float) for v in (a, b)):
            same = a == b
        else:
            row["relative"] = (b - a) / abs(a) if a else (0.0 if b == a else math.inf)
            kind = tolerance(key, a)
            if kind is None:
                same = a == b
            elif kind[0] == "abs":
                same = abs(b - a) <= kind[1]
            else:
                same = abs(row["relative"]) <= kind[1]
        rows[key] = row
        if not same:
            moved.append(key)
    return {"numbers": rows, "moved": moved}


def stderr_lines(notebook: Path) -> list[str]:
    """The lines a student sees on stderr in the executed notebook."""
    nb = json.loads(notebook.read_text())
    return [
        line
        for cell in nb["cells"]
        if cell["cell_type"] == "code"
        for out in cell.get("outputs", [])
        if out.get("name") == "stderr"
        for line in "".join(out.get("text", "")).splitlines()
        if line.strip()
    ]


#: a summary row's fields that are not numbers of the lab
NOT_NUMBERS = ("lab", "mode", "status", "wall_time_s", "error", "notebook")


def recorded(folder: Path, row: dict) -> dict:
    """What a lab's run records: its summary row's figures and its ``<lab>.results.json``."""
    numbers = {k: v for k, v in row.items() if k not in NOT_NUMBERS}
    results = folder / f"{row['lab']}.results.json"
    return numbers | (json.loads(results.read_text()) if results.is_file() else {})


def compare(dirs: dict[str, Path]) -> dict:
    summaries = {name: json.loads((d / "summary.json").read_text()) for name, d in dirs.items()}
    rows = {name: {r["lab"]: r for r in s} for name, s in summaries.items()}  # run_labs' summary: one row a lab
    labs = {}
    for lab in sorted(set(rows["2.15"]) & set(rows["2.21"])):
        one = {name: rows[name][lab] for name in dirs}
        entry = {
            "status": {name: r.get("status") for name, r in one.items()},
            "wall_s": {name: r["wall_time_s"] for name, r in one.items()},
        }
        entry.update(compare_numbers(*(recorded(dirs[name], one[name]) for name in ("2.15", "2.21"))))
        entry["stderr_lines"] = {
            name: len(stderr_lines(d / f"{lab}.ipynb")) if (d / f"{lab}.ipynb").is_file() else None
            for name, d in dirs.items()
        }
        labs[lab] = entry
    claims, failing = claim_verdicts(dirs, rows)
    return {
        "claims": claims,
        "claims_failing": failing,
        "labs": labs,
        "moved": {lab: e["moved"] for lab, e in labs.items() if e.get("moved")},
        "all_ok": all(set(e["status"].values()) == {"ok"} for e in labs.values()),
        "tolerances": {
            "accuracy_abs": ACCURACY_TOLERANCE,
            "time_rel": TIME_TOLERANCE,
            "weights_abs": WEIGHTS_TOLERANCE,
        },
    }


def claim_verdicts(dirs: dict[str, Path], rows: dict[str, dict]) -> tuple[dict, dict]:
    """Each claim of the labs' text on the labs both stacks ran, judged as bench/expected_results.py
    judges its CI tier (2 CPUs, the CI parameters): ``({"<lab>: <claim>": {stack: verdict}},
    {stack: [the claims that fail]})``."""
    labs = set.intersection(*(set(rows[name]) for name in dirs))
    entries = {  # one tier entry a stack and lab, its figures read once
        (name, lab): {
            "limits": {"cpus": os.cpu_count(), "memory_mb": None},
            "params": "ci",
            "data": "the labs' own sources",
            "wall_s": rows[name][lab]["wall_time_s"],
            "recorded": recorded(dirs[name], rows[name][lab]),
        }
        for name in dirs
        for lab in labs
    }
    verdicts, failing = {}, {name: [] for name in dirs}
    for claim in (c for c in load_claims() if c.lab in labs):
        key = f"{claim.lab}: {claim.claim}"
        verdicts[key] = {}
        for name in dirs:
            words, failed = verdict(claim, entries[name, claim.lab])
            verdicts[key][name] = words
            if failed:
                failing[name].append(key)
    return verdicts, failing


def _env(stack: str) -> dict:
    """A stack's processes' environment: its name (for doctor and setup), never a download."""
    return dict(os.environ, STACK=stack, LABS_OFFLINE="1")


def run(stack: str, venv: Path, out: Path, labs: str) -> None:
    python = venv / "bin" / "python"
    env = _env(stack)
    cmd = [str(python), "-m", "lab_utils.run_labs", "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd + (["--labs", labs] if labs else []), cwd=REPO, env=env, capture_output=True, text=True)
    if not (out / "summary.json").is_file():
        sys.exit(
            f"bench_stacks: the {stack} stack's run wrote no summary (exit {proc.returncode}):\n{proc.stderr[-2000:]}"
        )


def bench_json(venv: Path, stack: str, script: str, *args: str) -> dict:
    """One bench of bench/ run by ``venv``'s Python: its JSON."""
    cmd = [str(venv / "bin" / "python"), str(REPO / "bench" / script), *args]
    proc = subprocess.run(cmd, cwd=REPO, env=_env(stack), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"bench_stacks: {script} on the {stack} stack exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def figures(venv: Path, stack: str) -> dict:
    """The bench figures the course quotes, on one stack (seconds, GB/s, ratios)."""
    start = bench_json(venv, stack, "bench_cluster_startup.py", "--repeat", "3", "--imports", "2")
    ring = bench_json(venv, stack, "bench_allreduce.py", "--sweeps", "2", "--hvd-repeats", "5", "--steps", "200",
                      "--rounds", "2")  # fmt: skip
    big = ring["busbw"][-1]
    out = {
        "cluster_start_to_all_ready_s": start["start_to_all_ready_median_s"],
        "import_tensorflow_cpu_s": statistics.median(start["import_tensorflow_cpu_s"]),
        "cluster_start_ratio_to_bound": start["ratio_to_bound"],
        "ring_busbw_64MB_GBps": big["ring_busbw_GBps"],
        "mpi_busbw_64MB_GBps": big["mpi_busbw_GBps"],
        "ring_over_mpi_64MB": ring["ring_over_mpi_at_64MB"],
    }
    for controller, res in ring["hvd_allreduce_64MB"].items():
        out[f"hvd_{controller}_allreduce_64MB_s"] = res["seconds"]
    for name, runs in ring["training"]["runs"].items():  # a step of the global batch, the best round's
        best = max(runs, key=lambda r: r["examples_per_sec"])
        out[f"{name}_step_s"] = round(best["global_batch"] / best["examples_per_sec"], 5)
    return out


def best_of(rounds: list[dict]) -> dict:
    """One stack's figures over its rounds, each its best: the most GB/s, the least of the rest
    (seconds, a start-up's ratio to its bound); the ring's ratio to MPI is the kept bandwidths'."""
    out = {key: (max if key.endswith("_GBps") else min)(r[key] for r in rounds) for key in rounds[0]}
    out["ring_over_mpi_64MB"] = round(out["ring_busbw_64MB_GBps"] / out["mpi_busbw_64MB_GBps"], 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", default="", help="comma-separated, e.g. 01,04 (default: all)")
    parser.add_argument("--compare", nargs=2, metavar=("DIR_2_15", "DIR_2_21"), help="compare two runs, run nothing")
    parser.add_argument("--keep", help="keep each stack's run_labs folder under this folder (default: removed)")
    parser.add_argument("--out", help="also write the JSON here")
    parser.add_argument("--no-labs", action="store_true", help="only the bench figures")
    parser.add_argument("--no-figures", action="store_true", help="only the labs' CI runs")
    parser.add_argument("--rounds", type=int, default=2, help="the figures' rounds, the stacks in turn (best kept)")
    opts = parser.parse_args()
    if opts.compare:
        emit(compare(dict(zip(("2.15", "2.21"), map(Path, opts.compare), strict=True))), opts.out)
        return
    missing = [f"{venv.name} (make setup STACK={name})" for name, venv in STACKS.items() if not venv.is_dir()]
    if missing:  # make bench runs every bench: this one says what it needs and does not fail the rest
        emit({"skipped": f"needs both stacks' venvs; missing: {', '.join(missing)}"}, opts.out)
        return
    out = {}
    if not opts.no_figures:
        if opts.rounds < 1:
            parser.error(f"--rounds must be at least 1, got {opts.rounds}")
        rounds: dict[str, list[dict]] = {name: [] for name in STACKS}
        for _ in range(opts.rounds):  # in turn: a slower spell of the machine hits both stacks
            for name, venv in STACKS.items():
                rounds[name].append(figures(venv, name))
        out["figures"] = compare_numbers(*(best_of(rounds[name]) for name in ("2.15", "2.21")))
        out["figures"]["rounds"] = opts.rounds
    if not opts.no_labs:
        with tempfile.TemporaryDirectory(prefix="bench-stacks-") as tmp:
            dirs = {name: Path(opts.keep or tmp) / name for name in STACKS}
            for name, venv in STACKS.items():
                run(name, venv, dirs[name], opts.labs)
            out.update(compare(dirs))
    emit(out, opts.out)


if __name__ == "__main__":
    main()
