"""Start the graded notebook's IPython kernel as an unprivileged user of its own.

The grading worker (root, inside the sandbox) registers this as the kernel::

    python -m lab_utils.grading.kernel --uid 61001 --home /tmp/labgrade-x/home -f {connection_file}

It copies the connection file (which jupyter_client writes readable by root only)
into the new user's home, hands the notebook's folder to that user, drops every
privilege, and execs ``ipykernel_launcher``. Student code then cannot read the
grader's course (gradebook with the hidden tests, instructor notebooks), cannot
signal the grader or another submission, and cannot leave the sandbox's cgroup.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), uid, gid, follow_symlinks=False)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.grading.kernel")
    parser.add_argument("--uid", type=int, required=True)
    parser.add_argument("--home", required=True)
    parser.add_argument("-f", dest="connection_file", required=True)
    args = parser.parse_args(argv)
    if args.uid <= 0:
        raise SystemExit(f"refusing to run the kernel as uid {args.uid}")
    home = Path(args.home)
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    connection = home / "kernel-connection.json"
    connection.write_text(Path(args.connection_file).read_text())
    connection.chmod(0o600)
    _chown_tree(home, args.uid, args.uid)
    _chown_tree(Path.cwd(), args.uid, args.uid)  # the notebook's folder: %%writefile, runs/
    os.environ.update(HOME=str(home), TMPDIR=str(home / "tmp"), USER="labgrade", LOGNAME="labgrade")
    os.environ.pop("LABS_RUN_ROOT", None)
    os.setgroups([])
    os.setgid(args.uid)
    os.setuid(args.uid)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", str(connection)])


if __name__ == "__main__":
    main()
