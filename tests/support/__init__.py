"""The test suite's helpers, imported by tests as ``from support import crafted`` (``tests/``
is on pytest's ``pythonpath``): ``procs`` (process-table checks that a process ending
mid-check cannot break), ``kernels`` (stand-in notebook kernels run side by side), ``poll``
(one ``poll_for`` under a deadline), ``crafted`` (crafted submissions and temporary
courses), ``fakeclock`` (jobs that take exactly the seconds given),
``unprivileged`` (a real non-root user with an
interpreter it can reach), ``hub`` (a real JupyterHub for a class), ``make_lab`` (``make
lab`` started and stopped like a student's terminal).

``tests/fixtures/`` keeps what tests launch or read as files: task scripts, cgroup trees.
"""
