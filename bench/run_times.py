"""How long each lab runs, and how much memory it takes, on each tier: one source, the tables rendered from it.

    python bench/run_times.py update pod.json binder.json [--data grading/run_times.json]
    python bench/run_times.py render [--check]

``update`` takes outputs of ``bench/bench_lab_memory.py --full`` (a student's full run of each lab
under a tier's limits) and writes their labs' wall time and peak working set (and the cgroup's
high-water mark, page cache included) into
``grading/run_times.json``: a tier of 2 CPUs or more is the laptop or Hub pod, of less than 2
Binder's. Labs a file does not hold keep what they had. ``render`` writes the tables that quote
those figures, between their markers, in ``labs/README.md`` (the students' course map) and
``deploy/README.md`` (the instructors' sizing table); with ``--check`` it only says whether they are
current (exit 1 if not: ``tests/unit/test_run_times.py`` runs it). The notebooks' own "Running the
whole notebook takes about ..." are claims in ``grading/claims.yml``, checked against the same runs
by ``bench/expected_results.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "grading" / "run_times.json"
TIERS = {"pod": "a 2-core laptop or a Hub pod (2 CPUs, 2.7 GB)", "binder": "Binder (1 CPU, 2 GB)"}
#: Where each table goes: file -> its marker's name
TARGETS = {ROOT / "labs" / "README.md": "run-times", ROOT / "deploy" / "README.md": "memory-and-time"}


def tier_of(entry: dict) -> str:
    """``pod`` for a run under 2 CPUs or more, ``binder`` under fewer."""
    cpus = (entry.get("limits") or {}).get("cpus")
    if cpus is None:
        raise ValueError("a bench entry without limits.cpus: not an output of bench_lab_memory.py")
    return "pod" if float(cpus) >= 2 else "binder"


def update(data: dict, bench: dict, today: str | None = None) -> dict:
    """``data`` with the full runs of ``bench`` (a ``bench_lab_memory.py`` output) written in."""
    today = today or dt.date.today().isoformat()
    for lab, entry in (bench.get("labs") or {}).items():
        if entry.get("params") != "full":
            raise ValueError(f"{lab}: a run at the CI parameters ({entry.get('params')!r}), not a student's full run")
        if entry.get("exit") != 0:
            raise ValueError(f"{lab}: the run failed (exit {entry.get('exit')}): its time is not the lab's")
        row = data.setdefault("labs", {}).setdefault(lab, {})
        tier = row.setdefault(tier_of(entry), {})
        # the working set is what a container's limit kills on (the kubelet's count, and the
        # tables' figure); the cgroup's high-water mark also counts page cache, and at a tight
        # limit is the limit itself (Lab 5 on Binder: 2,048 of 2,048 MiB, 1,759 of them needed)
        tier.update(
            wall_s=entry["wall_s"],
            working_set_mb=entry.get("peak_working_set_mb"),
            peak_mb=entry.get("peak_mb"),
            measured=today,
        )
        tier["scaled_down"] = bool(entry.get("scaled_down"))
    return data


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _lab(name: str) -> str:
    return str(int(name[:2]))


def students_table(data: dict) -> str:
    """The course map's table: each lab's run time per tier."""
    lines = ["| lab | " + " | ".join(TIERS.values()) + " |", "|---|" + "---|" * len(TIERS)]
    for lab, row in sorted(data["labs"].items()):
        cells = []
        for tier in TIERS:
            t = row.get(tier)
            cells.append(
                "–" if not t else _minutes(t["wall_s"]) + (" (smaller clusters)" if t.get("scaled_down") else "")
            )
        lines.append(f"| {_lab(lab)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def instructors_table(data: dict) -> str:
    """The sizing table: the peak working set (GB = 10^9 bytes) and time per tier, and the largest cluster."""
    lines = [
        "| lab | " + " | ".join(TIERS.values()) + " | largest cluster of the default run |",
        "|---|" + "---|" * (len(TIERS) + 1),
    ]
    for lab, row in sorted(data["labs"].items()):
        cells = []
        for tier in TIERS:
            t = row.get(tier)
            if not t:
                cells.append("–")
                continue
            gb = "" if t.get("working_set_mb") is None else f"{t['working_set_mb'] * 2**20 / 1e9:.2f} GB, "
            note = f" ({t['note']})" if t.get("note") else (" (smaller clusters)" if t.get("scaled_down") else "")
            cells.append(f"{gb}{_minutes(t['wall_s'])}{note}")
        lines.append(f"| {_lab(lab)} | " + " | ".join(cells) + f" | {row.get('largest_cluster', '–')} |")
    dates = sorted({t["measured"] for row in data["labs"].values() for k, t in row.items() if k in TIERS})
    lines += ["", f"Measured {dates[0]} to {dates[-1]}." if len(dates) > 1 else f"Measured {dates[0]}."]
    return "\n".join(lines)


def _block(name: str) -> re.Pattern:
    return re.compile(
        rf"(<!-- {name}: generated from the course's run-time data; edit that, not this -->\n)(.*?)(<!-- /{name} -->)",
        re.S,
    )


def render(data: dict, text: str, name: str) -> str:
    """``text`` with its ``name`` block replaced by the table (ValueError if it has no such block)."""
    table = students_table(data) if name == "run-times" else instructors_table(data)
    pattern = _block(name)
    if not pattern.search(text):
        raise ValueError(f"no <!-- {name}: ... --> block to render into")
    return pattern.sub(lambda m: m[1] + table + "\n" + m[3], text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA), help="the run-time data (default: grading/run_times.json)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("update", help="write bench_lab_memory.py --full outputs into the data")
    up.add_argument("bench", nargs="+")
    show = sub.add_parser("render", help="write the READMEs' tables from the data")
    show.add_argument("--check", action="store_true", help="only say whether they are current (exit 1 if not)")
    args = parser.parse_args(argv)
    path = Path(args.data)
    data = json.loads(path.read_text())
    if args.command == "update":
        try:
            for bench in args.bench:
                data = update(data, json.loads(Path(bench).read_text()))
        except (OSError, ValueError, KeyError) as exc:
            print(f"run_times: {exc}", file=sys.stderr)
            return 2
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"run_times: {path} updated; now: python bench/run_times.py render")
        return 0
    stale = []
    for target, name in TARGETS.items():
        text = target.read_text()
        new = render(data, text, name)
        if new != text:
            stale.append(str(target.relative_to(ROOT)))
            if not args.check:
                target.write_text(new)
    if args.check and stale:
        print(f"run_times: {', '.join(stale)} not current: python bench/run_times.py render", file=sys.stderr)
        return 1
    print("run_times: " + ("rendered " + ", ".join(stale) if stale else "every table is current"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
