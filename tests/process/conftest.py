"""The process tests: each starts real processes (TensorFlow clusters, MPI jobs, servers).

Every test here carries the ``process`` mark (given by folder, in ``tests/conftest.py``) and
runs with a run root of its own (``run_root``): the launchers' run folders go to the test's
temporary directory, so a test that reaps or counts what a run left sees only its own. The
leak checks (``tests/conftest.py``) apply to every test of the suite.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def run_root(tmp_path, monkeypatch):
    """``$LABS_RUN_ROOT`` for this test: ``<tmp_path>/runs``, returned."""
    root = tmp_path / "runs"
    monkeypatch.setenv("LABS_RUN_ROOT", str(root))
    return root
