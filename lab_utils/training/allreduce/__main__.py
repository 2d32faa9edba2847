"""``python -m lab_utils.training.allreduce``: see :func:`lab_utils.training.allreduce.task.main`."""

import sys

from lab_utils.training.allreduce.task import main

sys.exit(main())
