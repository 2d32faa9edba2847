"""``python -m lab_utils.training.ps.hand SCRIPT [--updates N]``: one task of Lab 2's cluster by hand."""

import sys

from lab_utils.training.ps.hand import task

sys.exit(task.launch())
