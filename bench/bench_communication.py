"""Lab 6 on emulated links, one run; JSON out: Part A (compression) and Part C (Parallax's hybrid).

    python bench/bench_communication.py [--bandwidth 100mbit] [--steps 20] [--out f.json]

Part A: :func:`lab_utils.training.compression.runs.run` for each method (none, fp16, onebit,
topk; the instructor's compressors) on 2 ranks, one emulated host each: step time, the
bytes a rank sends per step by the codec's count (``wire``) and what its host's link carried
(``link``, counted by each rank in its own namespace from the warm-up's end to the last step's
end: TCP/IP and Horovod's own messages on top, not the job's start and end), and their ratio.
Each method runs twice, ``--steps`` and 4x as many, as a check of that count:
``step_bytes`` = the difference of the two runs' bytes over the difference of their steps is
what one more training step puts on the link, and ``step_over_wire`` compares it with the
codec's count; ``link_over_step`` says how far the short run's per-step count is from it. Part C: :func:`lab_utils.training.hybrid.experiment` (ps, allreduce, hybrid) on 2
workers. ``order_ok`` says whether the lesson's orderings held in this run: none slower than
fp16, fp16 slower than 1-bit and top-k; hybrid faster than PS-only and all-reduce-only.

Run it as root and as a student (no capability: the emulated hosts then live in a user
namespace of the job's own) to compare the two; ``how`` in the JSON says which it was.
Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

from json_out import emit

from lab_utils.cluster import netem
from lab_utils.grading import reference_script
from lab_utils.training import hybrid
from lab_utils.training.compression import METHODS
from lab_utils.training.compression import runs as compression_runs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bandwidth", default="100mbit")
    p.add_argument("--steps", type=int, default=20, help="compression steps per method")
    p.add_argument("--hybrid-steps", type=int, default=2)
    p.add_argument("--out", default=None, help="also write the JSON here")
    a = p.parse_args(argv)
    hosts = f"emulated:bandwidth={a.bandwidth}"
    out = {
        "uid": os.getuid(),
        "how": netem.how(),
        "why_not": netem.unavailable_reason(),
        "bandwidth": a.bandwidth,
        "compression": {},
    }
    student = reference_script("06_communication", "compressors.py")
    t0 = time.monotonic()
    long_steps = 4 * a.steps
    for method in METHODS:
        print(f"bench_communication: compression {method} ...", file=sys.stderr, flush=True)
        r = compression_runs.run_compression(method, 2, hosts=hosts, steps=a.steps, student=student, progress=False)
        r_long = compression_runs.run_compression(
            method, 2, hosts=hosts, steps=long_steps, student=student, progress=False
        )
        link = r.link_bytes_per_step
        row = {
            "emulated": r.emulated,
            "step_ms": round(r.step_time * 1e3, 2),
            "step_ms_long": round(r_long.step_time * 1e3, 2),
            "wire_bytes_per_step": r.wire_bytes_per_step,
            "link_bytes_per_step": round(link) if link is not None else None,
            "link_over_wire": round(link / r.wire_bytes_per_step, 4) if link else None,
            "accuracy": round(r.accuracy, 4),
        }
        if link is not None and r_long.link_bytes_per_step is not None:
            # each count covers its run's timed steps only
            short_total, long_total = link * a.steps, r_long.link_bytes_per_step * long_steps
            step_bytes = (long_total - short_total) / (long_steps - a.steps)
            row["step_bytes"] = round(step_bytes)
            row["step_over_wire"] = round(step_bytes / r.wire_bytes_per_step, 4)
            row["link_over_step"] = round(link / step_bytes, 4)
        out["compression"][method] = row
    c = {m: out["compression"][m]["step_ms"] for m in METHODS}
    out["compression_order_ok"] = c["none"] > c["fp16"] > max(c["onebit"], c["topk"])
    ratios = [out["compression"][m].get("step_over_wire") for m in METHODS]
    out["step_bytes_within_3pct"] = None if None in ratios else all(abs(x - 1) <= 0.03 for x in ratios)
    out["compression_wall_s"] = round(time.monotonic() - t0, 1)
    print(f"bench_communication: compression {c}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # its one line per run is progress; stdout is the JSON
        table = hybrid.experiment(workers=(2,), hosts=hosts, steps=a.hybrid_steps, warmup=1)
    rows = {r["mode"]: r for r in json.loads(table.round(4).to_json(orient="records"))}
    out["hybrid"] = rows
    steps = {m: rows[m]["step_s"] for m in rows}
    out["hybrid_order_ok"] = steps["hybrid"] < min(steps["ps"], steps["allreduce"])
    out["hybrid_wall_s"] = round(time.monotonic() - t0, 1)
    print(f"bench_communication: hybrid step_s {steps}", file=sys.stderr, flush=True)
    emit(out, a.out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
