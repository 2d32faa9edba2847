"""``python -m lab_utils.hub``: the instructor's side of the hand-in service (and a student's, in a terminal).

python -m lab_utils.hub grade 02_ps_async                    # the grading service grades it, as root
python -m lab_utils.hub collect 02_ps_async submitted/       # last hand-in of each student
python -m lab_utils.hub return 02_ps_async grading/feedback  # each student's feedback pages
python -m lab_utils.hub hand-in labs/02_ps_async/02_ps_async.ipynb
python -m lab_utils.hub feedback 02_ps_async
python -m lab_utils.hub whoami
sudo python -P -m lab_utils.hub setup --roster ~/roster.csv  # the class's machine (lab_utils.hub.classroom)
sudo python -P -m lab_utils.hub backup --store /srv/handin --course /var/lib/labs/grading /var/backups/labs
sudo python -P -m lab_utils.hub restore ARCHIVE --store /srv/handin --course /var/lib/labs/grading [--replace]
"""

from __future__ import annotations

import argparse
import json
import sys

from . import client


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m lab_utils.hub", description="the class's hand-in service, from a Hub server"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("collect", help="instructor: each student's last hand-in of LAB into DEST/<student>/<lab>/")
    p.add_argument("lab")
    p.add_argument("dest")
    p = sub.add_parser(
        "grade", help="instructor: the class's grading service grades LAB in its sandbox; results into DEST"
    )
    p.add_argument("lab")
    p.add_argument("dest", nargs="?", default=None, help="default: grading-LAB")
    p = sub.add_parser("return", help="instructor: the pages under FEEDBACK/<student>/<lab>/ to each student")
    p.add_argument("lab")
    p.add_argument("feedback")
    p = sub.add_parser("hand-in", help="hand in a notebook (as saved)")
    p.add_argument("notebook")
    p = sub.add_parser("feedback", help="your feedback for LAB, into ~/feedback/LAB")
    p.add_argument("lab")
    sub.add_parser("whoami", help="who the service takes you for, and the open labs")
    for name, what in (("backup", "the hand-in store and the gradebook into DEST/labs-<time>.tar.gz"),
                       ("restore", "a backup into the store and the course")):  # fmt: skip
        p = sub.add_parser(name, help=f"the class's machine: {what}")
        p.add_argument("dest" if name == "backup" else "archive")
        p.add_argument("--store", required=True, help="the hand-in store (LABS_HANDIN_STORE)")
        p.add_argument("--course", required=True, help="the grading course (the repository's grading/)")
        if name == "restore":
            p.add_argument("--replace", action="store_true", help="over a store that holds hand-ins (kept beside)")
    from . import classroom

    classroom.add_parser(sub)
    args = ap.parse_args(argv)
    if args.cmd == "setup":
        return classroom.main(args)
    try:
        if args.cmd in ("backup", "restore"):
            from . import backup

            if args.cmd == "backup":
                backup.backup(args.store, args.course, args.dest)
            else:
                backup.restore(args.archive, args.store, args.course, replace=args.replace)
        elif args.cmd == "grade":
            client.grade(args.lab, args.dest)
        elif args.cmd == "collect":
            client.collect(args.lab, args.dest)
        elif args.cmd == "return":
            client.return_feedback(args.lab, args.feedback)
        elif args.cmd == "hand-in":
            client.hand_in(args.notebook)
        elif args.cmd == "feedback":
            client.feedback(args.lab)
        else:
            print(json.dumps(client.whoami(), indent=1))
    except (client.HandInRefused, RuntimeError) as exc:  # backup.BackupError is a RuntimeError
        print(f"hub: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
