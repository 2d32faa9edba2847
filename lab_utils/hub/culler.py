"""jupyterhub-idle-culler as the class's Hub runs it (``python -m lab_utils.hub.culler --timeout=3600``):
the same culler, stopped at once by SIGINT or SIGTERM, however the Hub was started (a Hub run as
a shell's background job starts its services with SIGINT ignored, and would wait for each)."""

from __future__ import annotations

import signal
import sys


def _stop(signum, frame):
    print(f"idle culler: stopped ({signal.Signals(signum).name})", file=sys.stderr, flush=True)
    sys.exit(0)


def main() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stop)
    from jupyterhub_idle_culler import main as cull

    cull()


if __name__ == "__main__":
    main()
