"""Lab-specific training code: one module per technique.

- ``loop``: the pieces every technique reuses: this worker's shard of the data,
  the step loop (``report.step`` events, evaluations kept out of training time)
  and the timed result dict.
- ``ps``: the task side of parameter-server training (Labs 2 and 3): settings,
  command line, graph hand-off, start barrier, the synchronous shutdown protocol.
- ``ps_runs``: the notebook side of Labs 2 and 3: launch a PS cluster, turn what
  it reported into the CS 744 tables and figures, inspect a student's graph.

Labs 4-6 add theirs here (``allreduce``, ``towers``, ``compression``). The
generic layers (cluster, metrics, data, report, plots, ...) never import this
package. Importing a module here does not import TensorFlow.
"""
