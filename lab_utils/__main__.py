"""Command line: ``python -m lab_utils doctor`` (more sub-commands join as labs need them)."""

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
    args = parser.parse_args(argv)
    if args.command == "doctor":
        from lab_utils.doctor import main as doctor_main

        return doctor_main(json_output=args.json)
    if args.command == "reap":
        from lab_utils.cluster import reap as reap_clusters

        stopped = reap_clusters(include_live=args.all)
        print(f"stopped {len(stopped)} leftover cluster(s)")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
