"""Parameter-server training (Labs 2, 3, and 6's SSP runs), on TensorFlow's own runtime.
How it works, and why each timeout is what it is: ``README.md`` beside this file.

Task side (runs in each launched task):
- ``task``: the start barrier, the session, the step loop and the synchronous shutdown
  protocol; what ``train_async.py`` / ``train_sync.py`` / ``train_ssp.py`` call;
- ``graph``: ``PSGraph`` (what the student's ``build_graph`` returns), Lab 3's
  ``GradientCounter``, the start barrier's queues, the ``phase`` events;
- ``clocks``: SSP's clock vector on the PS (Lab 6's ``mode="ssp"``);
- ``settings``: the parsed command line and its checks; ``defaults``: the same loop with
  TensorFlow's default timeouts (Lab 3, Part 5);
- ``describe``: prints what a student's ``build_graph`` built; ``yardstick``: the self-check's job.

Kernel side (the notebook): ``runs`` (launch a PS cluster, the CS 744 tables and
figures), ``cluster_runs`` (the cluster ``runs`` launches, sized to this machine),
``demo_runs`` (Lab 3's failure demos).

Two variants, each a package of its own with its ``task``, ``flags`` and ``runs``:
- ``hand``: Lab 2, Part 1's two tasks that build their own ``TF_CONFIG``;
- ``strategy``: Lab 2's TF2 aside with ``tf.distribute``'s ``ParameterServerStrategy``.

``from lab_utils.training import ps`` then ``ps.train_worker``: the package's names are
``ps.task``'s, imported when first used.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "task")
