"""Command line: ``python -m lab_utils doctor|reap|stand-ins`` (more sub-commands join as labs need them)."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab_utils", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="check that this environment can run every lab")
    doc.add_argument("--json", action="store_true", help="print the rows as JSON")
    reap = sub.add_parser("reap", help="stop lab clusters left behind by dead kernels")
    reap.add_argument("--all", action="store_true", help="also stop clusters of live kernels")
    stand = sub.add_parser(
        "stand-ins", help="write deterministic full-size MNIST and CIFAR-10 stand-ins, in the real formats, into DIR"
    )
    stand.add_argument("dir", help="the folder to use as LABS_DATA_DIR")
    stand.add_argument("--datasets", default="mnist,cifar10", help="comma-separated: mnist, cifar10")
    stand.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from lab_utils.doctor import main as doctor_main

        return doctor_main(json_output=args.json)
    if args.command == "reap":
        from lab_utils.cluster import reap as reap_clusters

        stopped = reap_clusters(include_live=args.all)
        print(f"stopped {len(stopped)} leftover cluster(s)")
        return 0
    if args.command == "stand-ins":
        from lab_utils import standins

        try:
            written = standins.write(args.dir, tuple(filter(None, args.datasets.split(","))), seed=args.seed)
        except (ValueError, FileExistsError) as exc:
            print(f"stand-ins: {exc}", file=sys.stderr)
            return 2
        for path in written:
            size = sum(f.stat().st_size for f in path.rglob("*")) if path.is_dir() else path.stat().st_size
            print(f"wrote {path} ({size / 2**20:,.0f} MB)")
        print(f"use them with LABS_DATA_DIR={args.dir} (stand-ins: not the real images; see {standins.MARKER})")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
