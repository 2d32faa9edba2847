"""One way to wait in a test: poll a condition under a deadline, never ``sleep()`` and hope."""

from __future__ import annotations

import time


def poll_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """``predicate()``'s first true value, polled every ``interval`` s; after ``timeout`` s an
    AssertionError that says what was awaited."""
    deadline = time.monotonic() + timeout
    while True:
        if value := predicate():
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)  # polling a log, a page or the process table under a deadline
