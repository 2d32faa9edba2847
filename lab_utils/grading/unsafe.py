"""Grading without a sandbox is refused unless the instructor says, in so many words, that they
trust the submissions: ``--unsafe-no-sandbox`` (``make autograde UNSAFE_NO_SANDBOX=1``).

Without root and cgroups (a Hub server, a laptop, a Slurm node that runs jobs as the user) the
batch can only give each kernel a process group and a scrubbed environment. The kernel then runs
as the grader's own user: it reads and writes what that user can, reaches the network, and sees
that user's processes. :func:`exposure` says what that is, here, by name; :func:`require_sandbox`
refuses with it.
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path

from lab_utils.grading.kernel import SECRET
from lab_utils.grading.sandbox import cgroup_support

__all__ = ["NoSandbox", "exposure", "require_sandbox", "FLAG"]

FLAG = "--unsafe-no-sandbox"


class NoSandbox(RuntimeError):
    """Grading would run submissions as the grader's own user, and was not told to."""


def exposure(root: Path) -> list[str]:
    """What a submission graded without a sandbox reaches here, one line each."""
    import lab_utils

    user = getpass.getuser()
    package = Path(lab_utils.__file__).resolve().parent
    lines = [
        f"it runs as {user} (uid {os.getuid()}), with {user}'s files: it can read {root}/source "
        f"(every solution and hidden test) and the gradebook, and rewrite results and grades",
        f"it reaches the network as {user} does, and {user}'s other processes",
        f"it can read {Path.home()}",
    ]
    if os.access(package, os.W_OK):
        lines.append(f"it can change the grader's own code: {package} is writable by {user}")
    secrets = sorted(k for k in os.environ if SECRET.search(k) or k.startswith("JUPYTERHUB_"))
    if secrets:
        lines.append(
            "this shell holds credentials (the kernel's environment is scrubbed of them, but they stay "
            f"reachable as {user}'s, e.g. in /proc): {', '.join(secrets)}"
        )
    return lines


def require_sandbox(root: Path, isolate: bool | None, unsafe: bool) -> str | None:
    """None when submissions will run isolated; else the warning to print when ``unsafe``, and
    :class:`NoSandbox` when not."""
    if isolate is not False and cgroup_support():
        return None
    what = "\n".join(f"  - {line}" for line in exposure(Path(root)))
    if not unsafe:
        raise NoSandbox(
            "autograde: no sandbox here (it needs root and cgroups: "
            + ("turned off" if isolate is False else "this user is not root, or cgroups are missing")
            + "), so each submission would run as you:\n"
            + what
            + "\nGrade where the sandbox works: from a Hub server, ask the class's grading service "
            "(python -m lab_utils.hub grade LAB; deploy/README.md, 'Handing in'); elsewhere as root "
            "(sudo make autograde ...), on a grading node or with SLURM=1; or, for submissions you trust, "
            f"pass {FLAG} (make autograde UNSAFE_NO_SANDBOX=1)."
        )
    return f"autograde: {FLAG}: no sandbox; each submission runs as you:\n{what}"
