"""Build a Lab 2/3 script's graph in this process and print where everything went.

    python -m lab_utils.training.ps.describe SCRIPT --mode async|sync [--workers N] [--ps P] [--index I] [--args JSON]

The subprocess behind :func:`lab_utils.training.ps.runs.inspect_graph`: it imports
``SCRIPT``, calls its ``build_graph(task, settings)`` for ``worker:<I>`` of a
``P`` PS + ``N`` worker cluster (addresses are names only: no server is started,
nothing connects) and prints one JSON line describing the variables, the ops,
their devices and the session hooks. A script that fails exits non-zero with its
traceback on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from lab_utils.training.student import load_student

PROG = "python -m lab_utils.training.ps.describe"


def _load_script(path: str):
    try:
        return load_student(path, cell=False)
    except (FileNotFoundError, ImportError) as exc:
        sys.exit(f"{exc} (expected a .py file with build_graph(task, settings))")


def _hook_fields(hook) -> dict:
    opt = getattr(hook, "_sync_optimizer", None)
    return {
        "type": type(hook).__name__,
        "is_chief": getattr(hook, "_is_chief", None),
        "num_tokens": getattr(hook, "_num_tokens", None),
        "replicas_to_aggregate": getattr(opt, "_replicas_to_aggregate", None),
        "total_num_replicas": getattr(opt, "_total_num_replicas", None),
    }


def describe(build_graph, task, settings) -> dict:
    """Build ``build_graph(task, settings)`` in a fresh graph and describe its placement."""
    from lab_utils.models import import_tensorflow

    tf = import_tensorflow()
    with tf.Graph().as_default() as graph:
        g = build_graph(task, settings)
        return {
            "variables": [{"name": v.op.name, "device": v.device} for v in tf.compat.v1.global_variables()],
            "ops": [
                {"name": op.name, "type": op.type, "device": op.device, "inputs": [i.op.name for i in op.inputs]}
                for op in graph.get_operations()
            ],
            "loss_device": g.loss.device,
            "global_step_device": g.global_step.device,
            "x": [g.x.dtype.name, g.x.shape.as_list()],
            "y": [g.y.dtype.name, g.y.shape.as_list()],
            "hooks": [_hook_fields(hook) for hook in g.hooks or []],
        }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("script")
    p.add_argument("--mode", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--ps", type=int, default=1)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--args", default="{}")
    a = p.parse_args(argv)
    from lab_utils.cluster import TaskConfig
    from lab_utils.training import loop
    from lab_utils.training.ps import task as ps

    module = _load_script(a.script)
    extra = json.loads(a.args)
    settings = ps.check_settings(a.mode, extra.pop("batch_size", 60), a.workers, **extra)
    # Names only: no server is started and nothing connects to these addresses.
    cluster = {
        "ps": [f"ps{i}.invalid:1" for i in range(a.ps)],
        "worker": [f"worker{i}.invalid:1" for i in range(a.workers)],
    }
    out = describe(module.build_graph, TaskConfig(cluster, "worker", a.index), settings)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    loop.quick_exit(0)  # skip TensorFlow's teardown (it logs about graph objects no session ever ran)


if __name__ == "__main__":
    sys.exit(main())
