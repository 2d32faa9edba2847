"""AlexNet on several devices (Lab 5): towers by hand, ``MirroredStrategy``, one device.

- ``task`` (task side): ``python -m lab_utils.training.towers --method M --devices N``
  trains on the devices :mod:`lab_utils.training.devices` configured (``__main__``);
- ``settings`` (pure helper, no TensorFlow; ``task`` re-exports it): the command line,
  which ``runs`` also uses to check a run's arguments before it launches;
- ``runs`` (kernel side): one process per device count, the resource and scaling tables.

The package's names are ``towers.task``'s (``loss_fn`` for the student's ``towers.py``).
"""

from lab_utils.training._exports import front

__getattr__, __dir__ = front(__name__, "task")
