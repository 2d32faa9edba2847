"""The process tests: each starts real processes (TensorFlow clusters, MPI jobs, servers).

Every test here carries the ``process`` mark (given by folder, in ``tests/conftest.py``) and
runs with a run root of its own (``run_root``): the launchers' run folders go to the test's
temporary directory, so a test that reaps or counts what a run left sees only its own. The
leak checks (``tests/conftest.py``) apply to every test of the suite.
"""

from __future__ import annotations

import pytest
from support import unprivileged


@pytest.fixture(autouse=True)
def run_root(tmp_path, monkeypatch):
    """``$LABS_RUN_ROOT`` for this test: ``<tmp_path>/runs``, returned."""
    root = tmp_path / "runs"
    monkeypatch.setenv("LABS_RUN_ROOT", str(root))
    return root


@pytest.fixture(scope="module")
def user():
    """A real unprivileged user with an interpreter it can run (tests/support/unprivileged.py),
    removed after the module; the module is skipped, with the reason, where there is none."""
    made = unprivileged.make()
    if isinstance(made, str):
        pytest.skip(made)
    yield made
    made.cleanup()
