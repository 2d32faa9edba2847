"""Lab 2's TF2 aside: the same logistic regression with ``tf.distribute``'s ``ParameterServerStrategy``.

- ``task``: what the chief, the PS and the workers run (``python -m lab_utils.training.ps.strategy``);
  read it with ``from lab_utils.training.ps.strategy import task`` then ``task??``;
- ``flags``: its command line (a pure helper the notebook checks with too);
- ``runs``: the notebook side, :func:`~lab_utils.training.ps.strategy.runs.run_ps_strategy`.

The package's names are ``task``'s, imported when first used.
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "task")
