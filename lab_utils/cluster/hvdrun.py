"""``horovodrun``, told what :mod:`.hvdbuild` already found: ``python -m lab_utils.cluster.hvdrun ARGS``.

Before it launches anything, ``horovodrun`` asks whether Horovod was built with the
controller it is about to use (``horovod.common.util.gloo_built`` / ``mpi_built``). It
answers by forking a child that imports TensorFlow and Horovod's extension: about 2.5 s
of CPU and 450 MB, for every job. :class:`~lab_utils.cluster.mpi.MPIJob` has already
asked :func:`.hvdbuild.horovod_build` (once per kernel, without TensorFlow) and refused a
controller the build lacks, so it passes the answer in :data:`BUILT` and this module
runs Horovod's own launcher (``horovod.runner.launch.run_commandline``, what the
``horovodrun`` script runs) with those two questions answered from it. Everything else
is Horovod's: arguments, rendezvous, ``mpirun``, output.

Without :data:`BUILT` in the environment it is plain ``horovodrun``.
"""

from __future__ import annotations

import os
import sys

from lab_utils.cluster.hvdbuild import BUILT  # noqa: F401 (the name callers and tests use here)


def answer_build_checks(built: str) -> None:
    """Answer ``horovodrun``'s build checks from ``built`` ("gloo,mpi"), in this process."""
    from horovod.runner import launch

    have = {c.strip() for c in built.split(",") if c.strip()}
    launch.gloo_built = lambda verbose=False: "gloo" in have
    launch.mpi_built = lambda verbose=False: "mpi" in have


def main() -> int:
    from horovod.runner import launch

    built = os.environ.pop(BUILT, None)
    if built is not None:
        answer_build_checks(built)
    sys.argv[0] = "horovodrun"
    return launch.run_commandline()


if __name__ == "__main__":
    sys.exit(main())
