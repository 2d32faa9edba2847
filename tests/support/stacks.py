"""scripts/stacks.sh as the tests read it: the settings of each of the course's stacks."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: what stacks.sh sets for a stack
NAMES = ("STACK", "STACK_PYTHON", "TF_VERSION", "TF_KERAS_VERSION", "LEGACY_KERAS", "STACK_VENV", "STACK_LOCK")
NAMES += ("HOROVOD_PATCH", "HOROVOD_VERSION")


def stack(name: str | None) -> dict[str, str]:
    """stacks.sh's settings for stack ``name`` (None: the default, no STACK given)."""
    show = "; ".join(f'echo "{n}=${n}"' for n in NAMES)
    env = {"PATH": "/usr/bin:/bin", **({} if name is None else {"STACK": name})}
    proc = subprocess.run(
        ["bash", "-c", f'. "{ROOT}/scripts/stacks.sh" && {show}'], env=env, capture_output=True, text=True, timeout=30
    )
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines())
