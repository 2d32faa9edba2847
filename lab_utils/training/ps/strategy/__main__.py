"""``python -m lab_utils.training.ps.strategy``: one task of Lab 2's ``ParameterServerStrategy`` run."""

from lab_utils.training.ps.strategy import task

raise SystemExit(task.main())
