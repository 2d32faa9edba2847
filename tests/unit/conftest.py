"""Fixtures shared by the unit tests."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def refuse_processes(monkeypatch, tmp_path):
    """Any ``subprocess.Popen`` fails the test; run directories go to a temporary root.
    A test that must start one process restores ``subprocess.Popen`` itself."""

    def refuse(*a, **k):
        raise AssertionError(f"a process was started: {a!r}")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setenv("LABS_RUN_ROOT", str(tmp_path / "runs"))


@pytest.fixture(autouse=True)
def no_spans_carried_over():
    """Spans a test records in this process without reporting a step (Lab 7's pipeline
    stages, timed in-process) would go out with the next test's first step: each test
    starts and ends with none pending."""
    from lab_utils import report

    report._spans.clear()
    yield
    report._spans.clear()
