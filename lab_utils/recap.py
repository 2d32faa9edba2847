"""The "What you measured" table that ends each lab, from the lab's own runs in one call.

Each lab's last code cell is one line of this kind::

    recap.lab4(data, bandwidth=busbw, horovod=hvd_runs, ...).record(target_accuracy=TARGET_ACCURACY, ranks=N)

:func:`lab1` to :func:`lab7` read what the lab's runs answer (their ``accuracy``,
``examples_per_sec``, ``step_time``, tables) and turn it into rows of a :class:`Recap`: a
two-column table (quantity, value) that a notebook shows as it is, and the headline figures that
:meth:`Recap.record` hands to :func:`lab_utils.notebook.record` for ``make run``'s summary.
The rows' wording is the labs' text: their questions quote it. Nothing here imports TensorFlow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

__all__ = ["Recap", "lab1", "lab2", "lab3", "lab4", "lab5", "lab6", "lab7"]


class Recap:
    """A lab's recap: :attr:`table` (its rows, ``quantity`` and ``value``) and :attr:`metrics`
    (its headline figures). Shown in a notebook as the table, without its index."""

    def __init__(self, rows: Iterable[tuple[str, str]], metrics: Mapping[str, Any]):
        self.table = pd.DataFrame(list(rows), columns=["quantity", "value"])
        self.metrics = dict(metrics)

    def record(self, **more) -> Recap:
        """Record :attr:`metrics` and ``more`` (the lab's own settings: its target, its worker
        count) for ``make run``'s summary (:func:`lab_utils.notebook.record`); the recap itself,
        so that a cell ends with it and shows it."""
        from lab_utils.notebook import record

        record(**self.metrics, **more)
        return self

    def _repr_html_(self) -> str:
        return self.table.style.hide(axis="index").to_html()

    def __repr__(self) -> str:
        return self.table.to_string(index=False)


def _headline(run, data_source: str, **more) -> dict[str, Any]:
    """What every lab records of its main run: its test accuracy and examples/s, and where its data
    came from; ``more``: the lab's own figures."""
    return dict(accuracy=run.accuracy, examples_per_sec=run.examples_per_sec, data_source=data_source, **more)


def _each(values: Iterable[float], form: str, sep: str = ", ") -> str:
    return sep.join(format(v, form) for v in values)


def _seconds(values: Iterable[float]) -> str:
    return ", ".join(f"{v:.2f} s" for v in values)


def _pairs(keys: Iterable, values: Iterable, form: str = "") -> str:
    return " / ".join(f"{k} {format(v, form)}" for k, v in zip(keys, values, strict=True))


def _at_most(table: pd.DataFrame, column: str = "speedup") -> str:
    """The speedup at the most workers, per method: ``2.10 / 1.40`` (methods in sorted order)."""
    return " / ".join(f"{g.sort_values('workers')[column].iloc[-1]:.2f}" for _, g in table.groupby("method"))


def lab1(
    data, *, accuracy: float, examples_per_sec: float, sweep: pd.DataFrame, epochs: int, batch_size: int, target: float
) -> Recap:
    """Lab 1: the main run (``epochs`` at ``batch_size``) and the batch-size ``sweep``'s
    throughput and time to ``target`` test accuracy."""
    best = sweep.loc[sweep["examples_per_sec"].idxmax()]
    to_target = ", ".join(
        f"batch {int(b)}: " + ("not reached" if pd.isna(t) else f"{t:.2f} s")
        for b, t in zip(sweep["batch_size"], sweep["time_to_accuracy_s"], strict=True)
    )
    rows = [
        ("data", data.describe()),
        (f"test accuracy after {epochs} epochs (batch {batch_size})", f"{accuracy:.4f}"),
        (f"throughput at batch {batch_size} (warm-up excluded)", f"{examples_per_sec:,.0f} examples/s"),
        (
            "highest throughput in the sweep",
            f"{best['examples_per_sec']:,.0f} examples/s at batch {int(best['batch_size'])}",
        ),
        (f"training time to {target:.0%} test accuracy", to_target),
    ]
    return Recap(rows, dict(accuracy=accuracy, examples_per_sec=examples_per_sec, data_source=data.source))


def lab2(data, *, runs: Mapping[str, Any], main, straggler=None, tf2) -> Recap:
    """Lab 2: each asynchronous run (``runs``; ``main``: the one the summary records), the
    straggler run's steps and staleness per worker (when it ran), and TF2's
    ``ParameterServerStrategy`` run."""
    rows = [("data", data.describe())]
    for r in runs.values():
        rows.append(
            (
                f"{r.label}: test accuracy / final global step / wall time",
                f"{r.accuracy:.4f} / {r.final_global_step} / {r.wall_time:.1f} s",
            )
        )
        rows.append((f"{r.label}: execution time per worker", _seconds(r.workers_table()["exec time (s)"])))
    if straggler is not None:
        st = straggler.workers_table()
        rows.append(("straggler run: local steps per worker", ", ".join(str(v) for v in st["local steps"])))
        rows.append(("straggler run: mean staleness per worker", _each(st["staleness mean"], ".2f")))
    rows.append(
        (
            "TF2 ParameterServerStrategy: test accuracy / steps per worker",
            f"{tf2.accuracy:.4f} / {tf2.worker_steps}",
        )
    )
    return Recap(rows, _headline(main, data.source, workers=main.workers, final_global_step=main.final_global_step))


def lab3(
    data,
    *,
    async_run,
    sync_run,
    table3: pd.DataFrame,
    table4: pd.DataFrame,
    backup_runs: Iterable = (),
    epochs: int,
    sync_steps: int,
) -> Recap:
    """Lab 3: the asynchronous (``epochs``) and synchronous (``sync_steps`` global steps) runs,
    the gradients each sync update took, Tables 3 and 4 (the batch-size sweeps of both modes:
    :func:`lab_utils.training.ps.runs.sweep_table`'s batch size, execution and loop seconds) and
    the backup-worker runs' wall times."""

    def table(sweep: pd.DataFrame) -> str:
        return ", ".join(f"B={b}: {e:.2f} / {t:.2f}" for b, e, t in sweep.itertuples(index=False))

    chief = sync_run.results["worker:0"]
    rows = [
        ("data", data.describe()),
        (
            f"test accuracy, async {epochs} epochs / sync {sync_steps} global steps",
            f"{async_run.accuracy:.4f} / {sync_run.accuracy:.4f}",
        ),
        ("execution time per worker, async", _seconds(async_run.workers_table()["exec time (s)"])),
        ("execution time per worker, sync", _seconds(sync_run.workers_table()["exec time (s)"])),
        (
            "gradients per sync update (min..max)",
            f"{chief['gradients_per_update_min']}..{chief['gradients_per_update_max']}",
        ),
        ("Table 3 (async, exec / loop s)", table(table3)),
        ("Table 4 (sync, exec / loop s)", table(table4)),
        *((f"{r.label}: wall time", f"{r.wall_time:.1f} s") for r in backup_runs),
    ]
    metrics = _headline(
        sync_run, data.source, async_accuracy=async_run.accuracy, final_global_step=sync_run.final_global_step
    )
    return Recap(rows, metrics)


def lab4(
    data,
    *,
    bandwidth: pd.DataFrame,
    horovod: Mapping[str, Any],
    fp16,
    cnn,
    equal: pd.DataFrame,
    scaling: pd.DataFrame,
    network: pd.DataFrame,
    network_workers: int,
    by_model: pd.DataFrame,
) -> Recap:
    """Lab 4: the ring against MPI's all-reduce at the largest message (``bandwidth``), the
    Horovod runs (``horovod`` by controller, ``fp16``, ``cnn``), the four methods' weights
    (``equal``), the speedups at the most workers (``scaling``; ``network``: on emulated links
    at ``network_workers``) and per model (``by_model``)."""
    big = bandwidth.loc[bandwidth.index.max()]
    at = network[network["workers"] == network_workers]
    reference = " (not measured here: the shipped reference run)" if "reference" in by_model.attrs else ""
    rows = [
        ("data", data.describe()),
        (
            "ring vs MPI Allreduce, largest message",
            f"{big.get('hand ring (GB/s)', float('nan')):.2f} vs "
            f"{big['MPI Allreduce (GB/s)']:.2f} GB/s (memcpy {big['memcpy (GB/s)']:.2f})",
        ),
        (
            "Horovod test accuracy, gloo / mpi / fp16 / CNN",
            f"{horovod['gloo'].accuracy:.4f} / {horovod['mpi'].accuracy:.4f} / {fp16.accuracy:.4f} / {cnn.accuracy:.4f}",
        ),
        (
            "Horovod examples/s, gloo / mpi",
            f"{horovod['gloo'].examples_per_sec:,.0f} / {horovod['mpi'].examples_per_sec:,.0f}",
        ),
        ("largest weight difference of the four equivalent runs", f"{equal['max rel diff'].max():.1e} (relative)"),
        ("speedup at the most workers, horovod / sync PS", _at_most(scaling)),
        (
            f"{network['network'].iloc[0]}: speedup at {network_workers} workers, all-reduce / PS",
            " / ".join(f"{at[at['mode'] == m]['speedup'].iloc[0]:.2f}" for m in ("allreduce", "ps")),
        ),
        (
            f"per model at {by_model.attrs['workers']} workers: PS / ring speedup, ring over PS{reference}",
            "; ".join(
                f"{m} {r['PS speedup']:.2f} / {r['ring speedup']:.2f}, {r['ring / PS examples/s']:.1f}x"
                for m, r in by_model.iterrows()
            ),
        ),
    ]
    metrics = _headline(
        horovod["gloo"],
        data.source,
        accuracy_min=min(r.accuracy for r in horovod.values()),
        max_weight_rel_diff=float(equal["max rel diff"].max()),
    )
    return Recap(rows, metrics)


def lab5(
    *,
    data: str,
    data_source: str,
    tier: str,
    table: pd.DataFrame,
    equal: pd.DataFrame,
    mequal: pd.DataFrame,
    learn,
    learn_steps: int,
    oom_run,
    scaling: pd.DataFrame,
) -> Recap:
    """Lab 5: the towers' and MirroredStrategy's weights against one device's (``equal``,
    ``mequal``), the MirroredStrategy run that learns (``learn``, ``learn_steps``), one device's
    throughput and peak memory by batch size (``table``), the out-of-memory run, and the
    speedups at the most devices (``scaling``). ``data``: what the lab's data cell said of the
    images; ``tier``: where its devices come from."""
    one = table[(table["devices"] == 1) & (table["status"] == "ok")]
    largest = float(max(equal["max rel diff"].max(), mequal["max rel diff"].max()))
    rows = [
        ("data, tier", f"{data}; {tier}"),
        (
            "towers and MirroredStrategy vs one device (max rel weight diff)",
            f"{equal['max rel diff'].max():.1e} / {mequal['max rel diff'].max():.1e}",
        ),
        (
            f"MirroredStrategy after {learn_steps} steps: loss, test accuracy",
            f"{learn.result['loss_first']:.3f} -> {learn.result['loss']:.3f}, {learn.accuracy:.3f}",
        ),
        ("one device: examples/s from the smallest to the largest batch", _each(one["Examples/s"], ",.0f", " -> ")),
        (
            "one device: peak memory from the smallest to the largest batch",
            " -> ".join(f"{v / 2**20:,.0f} MB" for v in one["Peak Mem (B)"]),
        ),
        ("out of memory", oom_run.result.get("error", "(it fitted)")),
        (
            "speedup at the most devices, per method",
            "; ".join(f"{m}: {g.sort_values('workers')['speedup'].iloc[-1]:.2f}" for m, g in scaling.groupby("method")),
        ),
    ]
    return Recap(rows, _headline(learn, data_source, tier=tier, max_weight_rel_diff=largest))


def lab6(
    data,
    *,
    compression: Mapping[str, Any],
    ssp: pd.DataFrame,
    hybrid: pd.DataFrame,
    check: pd.DataFrame,
    curves: pd.DataFrame,
) -> Recap:
    """Lab 6: the compression runs (``compression`` by method: ``none`` and the fastest), the
    SSP bounds' wall times and staleness (``ssp``), Parallax's hybrid at the most workers
    (``hybrid``), and the scaling model's error on the measurements (``check``) and its
    efficiency at 1,024 workers (``curves``)."""
    none, best = compression["none"], min(compression.values(), key=lambda r: r.step_time)
    most = hybrid[hybrid["workers"] == hybrid["workers"].max()].set_index("mode")["examples_per_s"]
    error = float(check["rel_error"].abs().max())
    at_1024 = curves[curves["workers"] == 1024].groupby("model")["efficiency"].first()
    rows = [
        ("data", data.describe()),
        ("compression network", none.network),
        (
            "ms per step: none / fastest (method)",
            f"{none.step_time * 1e3:.1f} / {best.step_time * 1e3:.1f} ({best.compression})",
        ),
        ("bytes per rank and step: none / fastest", f"{none.wire_bytes_per_step:,} / {best.wire_bytes_per_step:,}"),
        ("test accuracy per method", _pairs(compression, (r.accuracy for r in compression.values()), ".3f")),
        ("SSP wall time per bound (s)", _pairs(ssp["s"], ssp["wall time (s)"], ".1f")),
        ("SSP max staleness per bound", _pairs(ssp["s"], ssp["staleness max"])),
        (f"Parallax examples/s at {hybrid['workers'].max()} workers", _pairs(most.index, most, ",.0f")),
        ("scaling model, largest error in measured throughput", f"{error:.1%}"),
        (
            "predicted efficiency at 1,024 workers, PS / ring / tree",
            " / ".join(f"{at_1024[m]:.3f}" for m in ("ps", "ring", "tree")),
        ),
    ]
    metrics = _headline(none, data.source, scaling_max_rel_error=error)
    return Recap(rows, metrics)


def lab7(*, zero: Mapping[int, Any], weights: pd.DataFrame, tensor: pd.DataFrame, pipeline: pd.DataFrame,
         choice: pd.DataFrame) -> Recap:  # fmt: skip
    """Lab 7: Part B's runs by stage (``zero``: 0 plain data parallelism, 1 and 2 sharded) and
    their weights against plain data parallelism's (``weights``), Part C's check of the split
    block (``tensor``), Part D's bubbles (``pipeline``: measured and ``predicted``) and Part E's
    step times against the model (``choice``)."""
    stages = sorted(zero)
    plain = zero[0]
    bubble = pipeline.assign(off=(pipeline["bubble (mean of stages)"] / pipeline["predicted"] - 1).abs())
    per_param = {s: zero[s].state_bytes() / zero[s].params for s in stages}
    rows = [
        ("Part B: model", f"{plain.params:,} parameters, {plain.ranks} ranks"),
        (
            "Part B: optimizer state per rank, bytes per parameter: " + " / ".join(f"stage {s}" for s in stages),
            " / ".join(f"{per_param[s]:.1f}" for s in stages),
        ),
        (
            "Part B: memory a rank holds between steps (MB): " + " / ".join(f"stage {s}" for s in stages),
            " / ".join(f"{max(zero[s].result['rss_steps_bytes']) / 2**20:.1f}" for s in stages),
        ),
        ("Part B: largest weight difference from plain data parallelism", f"{weights['max |difference|'].max():.1e}"),
        (
            "Part B: test accuracy per stage",
            _pairs((f"stage {s}" for s in stages), (zero[s].accuracy for s in stages), ".3f"),
        ),
        ("Part C: split block against the whole, largest relative error", f"{tensor['max rel error'].max():.1e}"),
        (
            "Part D: bubble measured / predicted, per stages x micro-batches",
            ", ".join(
                f"{r['stages']:.0f}x{r['micro-batches']:.0f}: {r['bubble (mean of stages)']:.2f} / {r['predicted']:.2f}"
                for _, r in pipeline.iterrows()
            ),
        ),
        ("Part D: bubble, largest relative gap to the prediction", f"{bubble['off'].max():.1%}"),
        ("Part E: step time measured / predicted", _pairs(choice["strategy"], choice["measured / predicted"], ".2f")),
    ]
    metrics = dict(
        accuracy=plain.accuracy,
        examples_per_sec=plain.examples_per_sec,
        data_source=plain.result.get("data_source"),
        bubble_max_rel_gap=float(bubble["off"].max()),
        state_bytes_per_param_stage0=per_param.get(0),
        state_bytes_per_param_stage1=per_param.get(1),
        state_bytes_per_param_stage2=per_param.get(2),
    )
    return Recap(rows, metrics)
