"""dstat-like terminal view: ``python -m lab_utils.metrics --interval 1 [--count N] [--task worker:0=PID] [--csv F]``.

One line per interval: host CPU (usr/sys/idl/wai), memory, network (all
interfaces, ``lo`` included) and disk; with ``--task`` also the CPU % and RSS of
each task's process tree. ``--csv`` writes the tidy samples when it stops
(``--count`` reached or Ctrl-C).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Sequence

from lab_utils.metrics.sampler import Row, Sampler, role_of, validate_interval

__all__ = ["main"]

_HEADER = (
    "----total-cpu---- ---memory--- -net/total- -dsk/total-",
    " usr  sys  idl  wai  used  avail  recv  send  read  writ",
)


def _human(n: float) -> str:
    for unit in ("", "k", "M", "G", "T"):
        if abs(n) < 1000 or unit == "T":
            return f"{n:4.0f}{unit}" if unit == "" else (f"{n:4.1f}{unit}" if abs(n) < 10 else f"{n:4.0f}{unit}")
        n /= 1024
    return f"{n:.0f}"


def _host_cells(rows: list[Row]) -> str:
    v = collections.defaultdict(float)
    for _, role, _task, metric, value in rows:
        if role == "host":
            v[metric] += value  # net: summed over interfaces (lo included)
    return (
        f"{v['cpu_usr']:4.0f} {v['cpu_sys']:4.0f} {v['cpu_idl']:4.0f} {v['cpu_wai']:4.0f} "
        f"{_human(v['mem_used']):>5} {_human(v['mem_available']):>6} {_human(v['net_recv']):>5} {_human(v['net_sent']):>5} "
        f"{_human(v['disk_read']):>5} {_human(v['disk_write']):>5}"
    )


def _task_cells(rows: list[Row], tasks: Sequence[str]) -> str:
    per = {(r[2], r[3]): r[4] for r in rows if r[1] not in ("host", "gpu")}
    return "".join(
        f" {per.get((n, 'cpu_percent'), float('nan')):5.0f}/{_human(per.get((n, 'rss'), 0)):>6}"
        if (n, "rss") in per
        else f" {'gone':>12}"
        for n in tasks
    )


def _task_arg(text: str) -> tuple[str, int]:
    name, sep, pid = text.partition("=")
    if not sep or not pid.isdigit():
        raise argparse.ArgumentTypeError(f"--task wants NAME=PID like worker:0=1234, got {text!r}")
    try:
        role_of(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return name, int(pid)


def _parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, float]:
    parser = argparse.ArgumentParser(
        prog="python -m lab_utils.metrics", description="dstat-like host metrics (and per-task CPU/RSS with --task)."
    )
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between lines (0.1-60, default 1)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many lines")
    parser.add_argument(
        "--task",
        type=_task_arg,
        action="append",
        default=[],
        metavar="NAME=PID",
        help="also show CPU %% and RSS of a task's process tree, e.g. worker:0=1234",
    )
    parser.add_argument("--csv", default=None, help="also write the tidy samples to this CSV file")
    args = parser.parse_args(argv)
    try:
        interval = validate_interval(args.interval)
    except ValueError as exc:
        parser.error(str(exc))
    if args.count is not None and args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    return args, interval


def main(argv: Sequence[str] | None = None) -> int:
    """Print a header, then one line per ``--interval`` until ``--count`` lines or Ctrl-C."""
    args, interval = _parse(argv)
    tasks = dict(args.task)
    sampler = Sampler(tasks)
    head, cols = _HEADER
    print(head + "".join(f" {n[:12]:>12}" for n in tasks), flush=True)
    print(cols + "".join(f" {'cpu%/rss':>12}" for _ in tasks), flush=True)
    all_rows: list[Row] = []
    sampler.sample()
    due, printed = time.monotonic(), 0
    try:
        while args.count is None or printed < args.count:
            due += interval
            time.sleep(max(0.0, due - time.monotonic()))  # the pace of the display, not a wait for state
            _, rows = sampler.sample()
            all_rows += rows
            print(_host_cells(rows) + _task_cells(rows, list(tasks)), flush=True)
            printed += 1
    except KeyboardInterrupt:
        pass
    if args.csv:
        import pandas as pd

        pd.DataFrame.from_records(all_rows, columns=["time", "role", "task", "metric", "value"]).to_csv(
            args.csv, index=False
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
