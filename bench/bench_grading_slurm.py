"""Grade N correct submissions of a lab as a Slurm job array on 1 node, then on K nodes; JSON out.

    python bench/bench_grading_slurm.py [--lab 02] [--n 8] [--nodes 4] [--out bench-grading-slurm.json]

Each run starts a real Slurm cluster on this machine (tests/support/slurm.py: a controller
and one slurmd per node, each node an emulated host of 2 CPUs) and runs the instructor's
``autograde --slurm`` on its head node. Reports per run: the wall time, the seconds per
submission, the CPU the machine spent (busy cores) and the scores; and the ratio of the
seconds per submission, 1 node over K nodes.

Needs root, ``ip netns``, slurm-wlm and munge (``make setup`` installs them). The emulated
nodes share this machine's cores: on 2 cores, K nodes cannot grade more than 2 cores' worth
at once, so the ratio measures what grading K at once gains where a notebook leaves its
cores idle (its cluster starting, the worker's start, nbgrader's bookkeeping), not what K
real machines would.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bench_grading import _busy_s, _course  # noqa: E402  (n correct submissions, the CPU)
from json_out import emit  # noqa: E402
from support import slurm  # noqa: E402

from lab_utils.grading import layout  # noqa: E402


def _grade(lab: str, n: int, nodes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-grading-slurm-") as tmp:
        root, subs = _course(Path(tmp), lab, n)
        cluster = slurm.SlurmCluster(Path(tmp) / "slurm", nodes=nodes, cpus=2).start()
        try:
            cmd = [sys.executable, "-m", "lab_utils.grading", "--root", str(root), "autograde", str(subs), "--slurm"]
            t0, cpu0 = time.monotonic(), _busy_s()
            done = cluster.run(cmd, cwd=REPO, env={"PYTHONPATH": str(REPO)}, timeout=4 * 3600)
            wall, busy = time.monotonic() - t0, _busy_s() - cpu0
        finally:
            left = cluster.stop()
        results = [json.loads(p.read_text()) for p in (root / "results").glob("*/*.json")]
    graded = [r for r in results if r["status"] == "graded"]
    return {
        "nodes": nodes,
        "cpus_per_node": 2,
        "exit": done.returncode,
        "wall_s": round(wall, 1),
        "graded": len(graded),
        "per_submission_s": round(wall / max(1, len(graded)), 2),
        "scores": sorted({r["score"] for r in graded}),
        "flags": sorted({f["kind"] for r in results for f in r["flags"]}),
        "mean_element_sandbox_s": round(sum(r["provenance"]["wall_s"] for r in graded) / max(1, len(graded)), 2),
        "busy_cores": round(busy / wall, 2),
        "left": left,
        "log_tail": done.stdout.splitlines()[-4:] + done.stderr.splitlines()[-4:],
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lab", default="02")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args(argv)
    missing = slurm.missing()
    if missing:  # `make bench` runs every bench: this one says why it measured nothing
        print(json.dumps({"skipped": f"no Slurm cluster here: {missing}"}))
        return
    (lab,) = layout.select_labs([args.lab])
    out = {"lab": lab, "n": args.n, "machine_cores": psutil.cpu_count(), "runs": []}
    for nodes in (1, args.nodes):
        out["runs"].append(_grade(lab, args.n, nodes))
        print(f"{nodes} node(s): {out['runs'][-1]}", file=sys.stderr, flush=True)
    one, many = out["runs"]
    # seconds per submission on 1 node over K nodes, measured in this run
    out["per_submission_ratio"] = round(one["per_submission_s"] / many["per_submission_s"], 2)
    emit(out, args.out)


if __name__ == "__main__":
    main()
