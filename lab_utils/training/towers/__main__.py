"""``python -m lab_utils.training.towers``: see :func:`lab_utils.training.towers.task.main`."""

import sys

from lab_utils.training.towers.task import main

sys.exit(main())
