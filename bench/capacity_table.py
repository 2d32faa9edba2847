"""A grading capacity plan from bench_grading.py's JSON: hours per lab for a class, on one
node and on K Slurm nodes; markdown out (the table in grading/README.md).

    python bench/capacity_table.py grading.json [more.json ...] [--students 300] [--cores 2,16,32] [--nodes 1,4]

The model, per lab:
- a submission graded alone takes ``plain`` seconds (bench_grading's ``plain``: one sandbox
  after another, each with its lab's cores to itself: what one Slurm element does);
- a node of C cores grades ``m = C // ceil(cpus)`` at once (Slurm gives each element its
  lab's cores; a node of fewer cores than a lab needs still grades one at a time);
- at once they run at the efficiency measured here with ``parallel`` where this machine
  could run more than one (Lab 1: two on 2 cores; ``plain / (m * parallel)``), else 1;
- K nodes divide the class between them (Slurm's array fills every free node).

So hours = students x plain / (m x efficiency x K) / 3600. What it leaves out: the queue's
wait, a node's start, and a driver merging about 0.1 s a result (300 results: half a minute).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def rows(bench: dict, students: int, cores: list[int], nodes: list[int]) -> list[list[str]]:
    out = []
    for lab, m in sorted(bench["labs"].items()):
        per = m["per_submission_s"]
        need = max(1, math.ceil(float(m["cpus"]) - 1e-9))
        here = max(1, bench["cores"] // need)
        efficiency = min(1.0, per["plain"] / (here * per["parallel"])) if here > 1 and "parallel" in per else 1.0
        cells = [lab, f"{m['cpus']:g}", f"{per['plain']:.0f} s", f"{per.get('parallel', per['plain']):.0f} s"]
        for c in cores:
            at_once = max(1, c // need)
            eff = efficiency if at_once > 1 else 1.0
            for k in nodes:
                hours = students * per["plain"] / (at_once * eff * k) / 3600
                cells.append(f"{hours:.1f} h" if hours >= 0.1 else f"{hours * 60:.0f} min")
        out.append(cells)
    return out


def table(bench: dict, students: int, cores: list[int], nodes: list[int]) -> str:
    head = ["lab", "cpus", "alone", f"on {bench['cores']} cores"] + [
        f"{students} on {k} x {c} cores" for c in cores for k in nodes
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(bench, students, cores, nodes)]
    return "\n".join(lines)


def merged(paths: list[str]) -> dict:
    """One bench dict from several runs (labs measured in separate runs of the same machine)."""
    out: dict = {"labs": {}}
    for path in paths:
        part = json.loads(Path(path).read_text())
        out["cores"] = part["cores"]
        out["labs"].update(part["labs"])
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("json", nargs="+", help="bench_grading.py outputs (with plain and parallel)")
    parser.add_argument("--students", type=int, default=300)
    parser.add_argument("--cores", default="2,16,32", help="cores of a node, comma-separated")
    parser.add_argument("--nodes", default="1,4", help="nodes, comma-separated")
    args = parser.parse_args(argv)
    to_ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    print(table(merged(args.json), args.students, to_ints(args.cores), to_ints(args.nodes)))


if __name__ == "__main__":
    main()
