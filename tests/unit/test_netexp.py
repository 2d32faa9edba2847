"""netexp's arguments are checked by its task's own parser before anything launches
(Labs 4 and 6 pass NETWORK_SIZE / SCALING_SIZE through to ``mb`` and ``compute_s``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lab_utils.training import netexp, netexp_task


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(mode="tree", workers=2), "mode must be one of"),
        (dict(mode="ps", workers=2, mb=0), "need --mb > 0"),
        (dict(mode="ps", workers=2, mb=float("nan")), "need --mb > 0"),
        (dict(mode="allreduce", workers=2, compute_s=-0.25), "--compute-s >= 0"),
        (dict(mode="allreduce", workers=2, steps=0), "--steps >= 1"),
    ],
)
def test_run_refuses_bad_sizes_before_launching(kwargs, match, monkeypatch):
    monkeypatch.setattr(netexp, "MPIJob", None)  # nothing may launch
    with pytest.raises(ValueError, match=match):
        netexp.run(hosts="local", **kwargs)


def test_the_task_parses_without_mpi():
    a = netexp_task.check_args(["--mode", "ps", "--mb", "0.75", "--compute-s", "0.25"])
    assert (a.mode, a.mb, a.compute_s, a.steps) == ("ps", 0.75, 0.25, 5)
    # a notebook's kernel imports the task to check arguments: that must not start MPI in it
    code = "import sys; from lab_utils.training import netexp; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out
