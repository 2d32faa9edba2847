"""Stand-in notebook kernels (``tests/fixtures/cluster_kernel.py``) run side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

KERNEL = str(Path(__file__).resolve().parents[1] / "fixtures" / "cluster_kernel.py")


def run_at_once(n: int, *args: str, timeout: float = 300) -> list[dict]:
    """Start ``n`` stand-in kernels at once with ``--wait`` and ``args``, each in a process of
    its own; once all have ended, each one's last line (its JSON report). An AssertionError,
    with that kernel's output, where one exits non-zero."""
    kernels = [
        subprocess.Popen([sys.executable, KERNEL, "--wait", *args], stdout=subprocess.PIPE, text=True) for _ in range(n)
    ]
    reports = []
    for k in kernels:
        out, _ = k.communicate(timeout=timeout)
        assert k.returncode == 0, out
        reports.append(json.loads(out.strip().splitlines()[-1]))
    return reports
