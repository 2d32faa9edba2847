"""What a class on one machine costs at rest: each student's idle server, and the Hub beside them;
JSON out (deploy/README.md, "A class on one machine", quotes it).

    sudo .venv/bin/python bench/bench_hub_capacity.py [--students 4] [--out deploy/bench_hub_capacity.json]

The Hub is ``deploy/single-machine/jupyterhub_config.py`` as the tests start it (tests/support/hub.py:
real Unix users, configurable-http-proxy, the hand-in and grading services, the idle culler).
Every student's server is started, then each is measured as a container's limit counts it: its
LimitedSpawner cgroup's working set (usage less the inactive file cache), after a kernel has
been started and has imported ``lab_utils`` (a student who opened a lab). Reported: each server's
working set (min, median, max), the Hub's own processes (the Hub, the proxy, the services: their
resident memory), and the machine's cores and memory. What a lab's run adds on top is
bench/bench_lab_memory.py's (the table in deploy/README.md). Needs root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from json_out import emit  # noqa: E402
from support import hub as local_hub  # noqa: E402

from lab_utils.grading.sandbox import own_cgroup_v1  # noqa: E402

GB = 1e9


def _working_set(folder: Path) -> int:
    usage = int((folder / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (folder / "memory.stat").read_text().splitlines())
    return max(0, usage - int(stat.get("total_inactive_file", 0)))


def _servers() -> dict[str, int]:
    """Each student's server cgroup (LimitedSpawner's ``labhub-*``) and its working set."""
    return {p.name: _working_set(p) for p in sorted(own_cgroup_v1("memory").glob("labhub-*"))}


def run(students: int) -> dict:
    hub = local_hub.start(students=students)
    if isinstance(hub, str):
        raise SystemExit(f"bench_hub_capacity: {hub}")
    try:
        names = hub.students
        hub.start_servers(names)
        for name in names:  # a student who opened a lab: a kernel, lab_utils imported
            hub.run_code(name, "import lab_utils, lab_utils.hub, numpy, pandas, matplotlib", timeout=300)
        servers = _servers()
        if len(servers) != students:
            raise SystemExit(f"bench_hub_capacity: {len(servers)} server cgroups for {students} students")
        hub_procs = [psutil.Process(hub.proc.pid), *psutil.Process(hub.proc.pid).children(recursive=True)]
        own = sum(p.memory_info().rss for p in hub_procs if p.is_running())
        sets = sorted(servers.values())
        return {
            "students": students,
            "server_working_set_gb": {
                "min": round(sets[0] / GB, 2),
                "median": round(statistics.median(sets) / GB, 2),
                "max": round(sets[-1] / GB, 2),
            },
            "hub_and_services_rss_gb": round(own / GB, 2),
            "hub_processes": len(hub_procs),
            "cores": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / GB, 1),
        }
    finally:
        left = hub.close()
        if left:
            print(f"bench_hub_capacity: left behind: {left}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--students", type=int, default=4)
    ap.add_argument("--out", help="write the JSON here too")
    args = ap.parse_args(argv)
    emit(run(args.students), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
