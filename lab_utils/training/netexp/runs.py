"""The network matters: parameter server against ring all-reduce on emulated links.

The thesis in the course's reports (parameter server vs ring all-reduce) finds that a
PS's speedup levels off as workers are added while ring all-reduce stays near linear,
and that the PS's traffic grows with the number of workers. On one machine over
loopback that cannot show: the network is free. On emulated hosts
(:func:`lab_utils.cluster.emulated`) each rank has its own shaped link, so it does::

    from lab_utils.training import netexp
    table = netexp.experiment(workers=(1, 2, 4), hosts="emulated:100mbit", mb=3)
    netexp.plot(table)

Both modes run the same step (:mod:`lab_utils.training.netexp.task`): ``compute_s`` seconds of modelled
accelerator time, then ``mb`` MB of gradients through a PS on its own host, or
through Open MPI's ring all-reduce. With 3 MB over 100 Mbit/s links, a PS step moves
0.48 s of gradients per worker through the PS's one link; the ring moves 0.36 s per
rank whatever the number of workers. Next to 1 s of computation, the PS levels off
(2.2x with 4 workers, measured) and the ring stays closer to linear (2.6-2.7x). The bytes
are each host's link counters, not estimates. No root is needed (a user
namespace of the job's own); where the machine refuses those too, the runs fall back to
local hosts (one line says why) and the table says ``emulated: False``.

Model size as the variable (:func:`models`): the same runs with the step of a real model of
the thesis's Table 3.1 (:data:`MODELS`), its gradient bytes and its computation on a
reference GPU and links, both scaled by one factor onto the emulated links::

    table = netexp.models(["AlexNet", "ResNet50", "VGG16"], workers=(1, 4), hosts="emulated:100mbit")
    netexp.plot_models(table)

AlexNet sends 233 MB for 0.7 GFLOPs an image, ResNet-50 98 MB for 3.9: the first is
communication-bound, the second is not, and the PS-against-ring result follows that ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lab_utils import reference_runs
from lab_utils.cluster import netem
from lab_utils.cluster.job import format_args
from lab_utils.cluster.netem import EmulatedHosts
from lab_utils.training.netexp import task as netexp_task
from lab_utils.training.runs import LaunchOptions, RanksRun, run_ranks, sweep_modes, takes_launch_options
from lab_utils.training.runs import experiment_timelines as timelines  # noqa: F401 (the package's name)

MODES = ("ps", "allreduce")
#: shown beside loopback figures where no emulated hosts can be made (lab_utils.reference_runs)
REFERENCE = "netexp_100mbit"
#: Open MPI: choose the ring algorithm for MPI_Allreduce (coll/tuned's algorithm 4).
#: One mpi4py rank of the experiment: NumPy, its gradients and buffers.
RANK_MEMORY_BYTES = 200 * 1024**2


@takes_launch_options(timeout=300.0, progress=False)
def run_netexp(
    mode: str,
    workers: int,
    *,
    hosts: str | EmulatedHosts | None = "emulated:100mbit",
    mb: float = 3.0,
    steps: int = 5,
    warmup: int = 1,
    compute_s: float = 1.0,
    options: LaunchOptions,
) -> RanksRun:
    """One run: ``workers`` workers (plus a PS host in ``ps`` mode), one rank per
    emulated host (``hosts``: an :func:`~lab_utils.cluster.emulated` spec or its string,
    ``"local"`` for loopback). Returns a :class:`~lab_utils.training.runs.RanksRun`: its row
    holds the throughput, step time and each role's bytes per step."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    args = {"mode": mode, "mb": mb, "steps": steps, "warmup": warmup, "compute-s": compute_s}
    netexp_task.check_args(format_args(args))  # bad sizes raise ValueError here, not in the ranks' logs
    out, done, _ = run_ranks(
        "-m lab_utils.training.netexp.task",
        args,
        mode=mode,
        workers=workers,
        has_ps=mode == "ps",
        ring=mode == "allreduce",
        hosts=hosts,
        steps=warmup + steps,
        memory_per_rank=RANK_MEMORY_BYTES,
        options=options,
        name=f"netexp-{mode}-{workers}",
    )
    out.row["gradient_mb"] = done[0]["gradient_bytes"] / 1e6
    return out


def experiment(
    workers: Sequence[int] = (1, 2, 4),
    modes: Sequence[str] = MODES,
    **kwargs,
):
    """Every mode at every worker count (same step, same links); a pandas table with
    the speedup over the mode's own smallest run and the ideal (linear) one."""
    hosts = kwargs.pop("hosts", "emulated:100mbit")
    spec = netem.spec_or_local(hosts)  # the fallback line once, not per run
    runs = [(mode, w) for mode in modes for w in workers]
    table = sweep_modes(
        run_netexp,
        runs,
        lambda r: f"{r['examples_per_s']:8.1f} examples/s, {r['step_s']:.2f} s per step",
        hosts=spec,
        **kwargs,
    )
    base = table.loc[table.groupby("mode")["workers"].idxmin()].set_index("mode")
    table["speedup"] = table.apply(lambda r: r["examples_per_s"] / base.loc[r["mode"], "examples_per_s"], axis=1)
    table["ideal"] = table["workers"] / table["mode"].map(base["workers"])
    if netem.as_spec(hosts) is not None and spec is None:  # links asked for, loopback measured
        table.attrs["reference"] = ref = reference_runs.table(REFERENCE)
        most = int(ref["workers"].max())
        at = ref[ref["workers"] == most].set_index("mode")
        ps = ref[ref["mode"] == "ps"].set_index("workers")["ps_mb_per_step"]
        print(
            f"Your runs above are on loopback. {ref.attrs['label']}: at {most} "
            f"workers the PS reaches {at.loc['ps', 'speedup']:.2f}x and the ring {at.loc['allreduce', 'speedup']:.2f}x; "
            f"the PS host moves {', '.join(f'{v:.0f}' for v in ps)} MB per step for "
            f"{', '.join(str(w) for w in ps.index)} workers (plot() draws it beside yours).",
            flush=True,
        )
    return table


@dataclass(frozen=True)
class Replayed:
    """A run to replay and the same run on faster links (:func:`faster_links`): ``timeline`` of the
    first, its median step ``before``, the second's ``after`` (seconds, steps after the first),
    the links' ``bits_now`` and ``bits_then`` per second, and ``on``: whose runs they are."""

    timeline: object
    before: float
    after: float
    bits_now: float
    bits_then: float
    on: str
    workers: int = 2


def _median_step(tl) -> float:
    return float(tl.what_if()["measured step (s)"].median())  # the replay's own measure: steps after the first


def faster_links(table, hosts, *, times: float = 10.0, workers: int = 2, **kwargs) -> dict[str, Replayed]:
    """Lab 4's what-if against a second run: per mode, the ``workers``-worker run of ``table``
    (an :func:`experiment` on ``hosts``' emulated links; ``kwargs``: its ``mb``, ``compute_s``,
    ``steps``) and the same run on links ``times`` as fast, run now. Where ``table`` is on
    loopback (no emulated links here), the course's shipped runs on 100 Mbit/s and 1 Gbit/s
    links (:mod:`lab_utils.reference_runs`, ``what_if.json``), and one line says so."""
    import dataclasses

    spec = netem.as_spec(hosts)
    if spec is None or not spec.bandwidth or not bool(table["emulated"].all()):
        ref = reference_runs.load("what_if")
        print(f"Your runs are on loopback: the what-if replays the course's shipped runs ({ref['label']}).", flush=True)
        return {
            r["mode"]: Replayed(
                reference_runs.timeline(f"what_if_{r['mode']}_100mbit"),
                r["step_s_100mbit"],
                r["step_s_1gbit"],
                100e6,
                1e9,
                "the course's shipped runs",
                r["workers"],
            )
            for r in ref["runs"]
        }
    bits = netem.rate_bits(spec.bandwidth)
    then = bits * times
    fast = dataclasses.replace(spec, bandwidth=f"{then / 1e9:g}gbit" if then >= 1e9 else f"{then / 1e6:g}mbit")
    if workers not in set(table["workers"]):
        table = experiment(workers=(workers,), hosts=spec, **kwargs)
    second = experiment(workers=(workers,), hosts=fast, **kwargs)
    slow_tl, fast_tl = timelines(table, workers), timelines(second, workers)
    return {
        mode: Replayed(
            slow_tl[mode],
            _median_step(slow_tl[mode]),
            _median_step(fast_tl[mode]),
            bits,
            netem.rate_bits(fast.bandwidth),
            "your runs",
            workers,
        )
        for mode in slow_tl
    }


def beside_models(faster: dict[str, Replayed], params=None):
    """Lab 6's Part D: per mode, the second run of :func:`faster_links` (measured) beside two
    predictions of it from the first: the timeline's replay with the time on the links scaled by
    ``bits_now / bits_then``, and the alpha-beta model (``params``, a
    :class:`lab_utils.simulate.Params` calibrated on the first run's network) with its per-byte
    terms scaled the same. Where the runs are the course's shipped ones (or ``params`` is None),
    the model is calibrated on the shipped 100 Mbit/s runs (``netexp_100mbit``)."""
    import dataclasses

    import pandas as pd

    from lab_utils import simulate

    if params is None or any(r.on != "your runs" for r in faster.values()):
        params = simulate.calibrate(reference_runs.table(REFERENCE))
    rows = []
    for mode, r in faster.items():
        k = r.bits_now / r.bits_then
        fast = dataclasses.replace(params, beta=params.beta * k, beta_duplex=params.beta_duplex * k)
        model = simulate.step_time("ring" if mode == "allreduce" else "ps", r.workers, fast)
        replay = float(r.timeline.what_if({"comm": k})["predicted step (s)"].median())
        rows.append({"mode": mode, "workers": r.workers, f"{r.bits_now / 1e6:g} Mbit/s (s)": r.before,
                     f"{r.bits_then / 1e6:g} Mbit/s measured (s)": r.after, "replay (s)": replay,
                     "replay error": replay / r.after - 1, "alpha-beta (s)": model,
                     "alpha-beta error": model / r.after - 1})  # fmt: skip
    return pd.DataFrame(rows).set_index("mode")


def plot(table):
    """Speedup against workers (with the ideal line) and the PS's and a worker's
    traffic per step, in the style of the thesis's Figures 4.3-4.4."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ref = table.attrs.get("reference")
    mine = " (yours: loopback)" if ref is not None else ""
    for mode, part in table.groupby("mode"):
        ax1.plot(part["workers"], part["speedup"], "o-", label=mode + mine)
    if ref is not None:  # the shipped run on emulated links, drawn apart and named
        for mode, part in ref.groupby("mode"):
            ax1.plot(part["workers"], part["speedup"], "^:", label=f"{mode} (reference: emulated links)")
    ws = sorted(table["workers"].unique())
    ax1.plot(ws, [w / ws[0] for w in ws], "k--", lw=1, label="ideal")
    ax1.set(xlabel="workers", ylabel="speedup", title="throughput over one worker")
    ax1.legend(fontsize="small")
    traffic = ref if ref is not None else table
    if "worker_mb_per_step" in traffic and traffic["worker_mb_per_step"].notna().any():
        ps = traffic[traffic["mode"] == "ps"]
        ax2.plot(ps["workers"], ps["ps_mb_per_step"], "o-", label="PS host")
        for mode, part in traffic.groupby("mode"):
            ax2.plot(part["workers"], part["worker_mb_per_step"], "s--", label=f"{mode} worker")
        title = "traffic per host" + (" (reference: emulated links)" if ref is not None else "")
        ax2.set(xlabel="workers", ylabel="MB per step (sent + received)", title=title)
        ax2.legend(fontsize="small")
    if ref is not None:
        fig.suptitle(ref.attrs["label"], fontsize="small")
    fig.tight_layout()
    return fig


# ---- model size as the variable: the thesis's models on the same links
@dataclass(frozen=True)
class Model:
    """One of the thesis's CNNs: ``mb`` MB of float32 parameters, which is also the gradient
    a worker sends each step, and ``gflops`` for one image's forward pass."""

    name: str
    mb: float
    gflops: float


#: The thesis in the course's reading list (parameter server vs ring all-reduce), Table 3.1
#: "Models used in this experiment with their model size, accuracy and GFLOPs": the
#: ImageNet (224 x 224) versions, model size in MB and GFLOPs per image as printed there.
MODELS = {
    m.name: m
    for m in (
        Model("AlexNet", 233, 0.7),
        Model("VGG16", 528, 15.5),
        Model("VGG19", 548, 19.6),
        Model("ResNet50", 98, 3.9),
        Model("ResNet152", 230, 11.3),
    )
}
#: images per worker and step (the thesis's Table 3.2), and a training step's arithmetic in
#: forward passes (the backward pass costs about two: gradients for activations and weights)
BATCH, PASSES = 32, 3
#: The reference each model's real step is computed for: one GPU of the thesis's era
#: sustaining 1 TFLOP/s by Table 3.1's count (TensorFlow's 2017 benchmarks of one K80 on
#: Google Compute Engine, batch 32: ResNet-50 49.5 images/s, VGG16 35.4, i.e. 0.6 and 1.6
#: TFLOP/s by this count), and 10 Gbit/s links (a data-centre link; the thesis gives none).
REFERENCE_TFLOPS, REFERENCE_LINK = 1.0, "10gbit"
#: shown where a model experiment cannot have links (lab_utils.reference_runs)
MODELS_REFERENCE = "netexp_models_100mbit"


def model_step(
    model: str | Model,
    link: str = "100mbit",
    scale: float = 1.0,
    *,
    tflops: float = REFERENCE_TFLOPS,
    reference_link: str = REFERENCE_LINK,
) -> dict:
    """The step of :func:`run_netexp` that stands for one real training step of ``model`` (a name
    in :data:`MODELS`, or a :class:`Model`): on the reference, ``BATCH x PASSES x gflops /
    tflops`` seconds of computation, then ``mb`` MB of gradients over ``reference_link``.
    On the slower emulated ``link`` the bytes are cut by ``link / reference_link``, so that
    they take as long as the real ones; then both times are multiplied by ``scale``.
    Returns ``mb`` and ``compute_s`` (for :func:`run_netexp`) and the real step's ``real_compute_s``,
    ``real_send_s`` (one gradient over one link) and their ``ratio``."""
    if isinstance(model, str):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        model = MODELS[model]
    if not (scale > 0 and tflops > 0):
        raise ValueError(f"scale and tflops must be > 0, got scale={scale!r}, tflops={tflops!r}")
    compute = BATCH * PASSES * model.gflops / (tflops * 1e3)
    send = model.mb * 8e6 / netem.rate_bits(reference_link)
    cut = netem.rate_bits(link) / netem.rate_bits(reference_link)
    return {
        "mb": model.mb * cut * scale,
        "compute_s": compute * scale,
        "real_compute_s": compute,
        "real_send_s": send,
        "ratio": send / compute,
    }


def predicted(ratio: float, workers: int, base: int = 1) -> dict:
    """What the step's arithmetic predicts, in units of the computation (``ratio``: one
    gradient's time on a link over it), as :func:`summarize`'s columns: a PS step takes
    1 + 2 N ratio (every worker's gradient in, then the parameters out, through its one
    link), a ring step 1 + 2 (N - 1) / N ratio (each rank's share, every link busy at once).
    Speedups are over the mode's own ``base`` workers, as in :func:`experiment`."""

    def rate(mode: str, n: int) -> float:
        return n / (1 + (2 * n if mode == "ps" else 2 * (n - 1) / n) * ratio)

    return {
        "PS speedup": rate("ps", workers) / rate("ps", base),
        "ring speedup": rate("allreduce", workers) / rate("allreduce", base),
        "ring / PS examples/s": rate("allreduce", workers) / rate("ps", workers),
    }


def models(
    names: Sequence[str] = ("AlexNet", "ResNet50", "VGG16"),
    workers: Sequence[int] = (1, 4),
    *,
    hosts: str | EmulatedHosts | None = "emulated:100mbit",
    scale: float = 1.0,
    steps: int = 4,
    tflops: float = REFERENCE_TFLOPS,
    reference_link: str = REFERENCE_LINK,
    **kwargs,
):
    """Each model's step (:func:`model_step`) through a PS and through the ring, at the
    fewest and the most ``workers``, on the same emulated links: a table with one row per
    model (:func:`summarize`), the runs' rows in ``attrs["runs"]``. Where there are no links
    (``hosts`` local, or none can be made) nothing runs: loopback would make every model
    scale alike. One line says so and the shipped reference run is returned, labelled."""
    import pandas as pd

    ws = sorted(set(workers))
    if len(ws) < 2:
        raise ValueError(f"workers: need at least two different counts to measure a speedup, got {workers!r}")
    steps_of = {n: model_step(n, reference_link, scale, tflops=tflops, reference_link=reference_link) for n in names}
    asked = netem.as_spec(hosts)
    spec = netem.spec_or_local(asked)
    if spec is None:
        return _models_reference(names, asked is None)
    if spec.bandwidth is None:
        raise ValueError(f"model steps need shaped links (a bandwidth) to scale their bytes to, got {spec}")
    rows = []
    for name in names:
        step = model_step(name, spec.bandwidth, scale, tflops=tflops, reference_link=reference_link)
        for mode in MODES:
            for w in (ws[0], ws[-1]):
                row = run_netexp(
                    mode, w, hosts=spec, mb=step["mb"], compute_s=step["compute_s"], steps=steps, **kwargs
                ).row
                rows.append({"model": name, **row, "compute_s": step["compute_s"]})
        done = summarize(pd.DataFrame(rows[-4:]), steps_of).iloc[0]
        print(
            f"{name}: {step['mb']:.2f} MB of gradients after {step['compute_s']:.3f} s of compute; at {ws[-1]} "
            f"workers the PS {done['PS speedup']:.2f}x, the ring {done['ring speedup']:.2f}x (each over its own "
            f"{ws[0]}), the ring {done['ring / PS examples/s']:.2f}x the PS's examples/s",
            flush=True,
        )
    return summarize(pd.DataFrame(rows), steps_of)


def summarize(runs, steps_of: dict):
    """One row per model of :func:`models`' runs: its real gradient MB and GFLOP per step,
    its communication over computation on the reference (``steps_of``: :func:`model_step`
    of each model), each mode's speedup at the most workers over its fewest, the ring's
    examples/s over the PS's there, and the bytes per step the links carried then."""
    import pandas as pd

    lo, hi = int(runs["workers"].min()), int(runs["workers"].max())
    rows = []
    for name, part in runs.groupby("model", sort=False):
        at = part.set_index(["mode", "workers"])
        rate = at["examples_per_s"]
        rows.append(
            {
                "model": name,
                "gradient MB": MODELS[name].mb,
                "GFLOP per step": BATCH * PASSES * MODELS[name].gflops,
                "send / compute": steps_of[name]["ratio"],
                "PS speedup": rate[("ps", hi)] / rate[("ps", lo)],
                "ring speedup": rate[("allreduce", hi)] / rate[("allreduce", lo)],
                "ring / PS examples/s": rate[("allreduce", hi)] / rate[("ps", hi)],
                "PS host MB/step": at.get("ps_mb_per_step", pd.Series(dtype=float)).get(("ps", hi)),
                "ring rank MB/step": at.get("worker_mb_per_step", pd.Series(dtype=float)).get(("allreduce", hi)),
            }
        )
    table = pd.DataFrame(rows).set_index("model")
    table.attrs.update(workers=hi, base=lo, runs=runs.to_dict("records"))  # plain data: pandas compares attrs
    return table


def _models_reference(names: Sequence[str], asked_local: bool):
    ref = reference_runs.load(MODELS_REFERENCE)
    runs = reference_runs.table(MODELS_REFERENCE)
    runs = runs[runs["model"].isin(names)]
    why = "hosts are local" if asked_local else "no emulated links here"
    print(
        f"Model sizes need links ({why}): over loopback the network costs nothing and every model would scale "
        f"alike, so nothing ran. Shown: the {ref['label']}.",
        flush=True,
    )
    steps_of = {
        n: model_step(n, tflops=ref["tflops"], reference_link=ref["reference_link"]) for n in set(runs["model"])
    }
    table = summarize(runs, steps_of)
    table.attrs["reference"] = ref["label"]
    return table


def plot_models(table):
    """Against each model's communication over computation (log scale): PS's and ring's
    speedups at the most workers, and the ring's examples/s over the PS's there, each
    with what :func:`predicted` says between the models (dotted)."""
    import matplotlib.pyplot as plt
    import numpy as np

    hi, lo = table.attrs["workers"], table.attrs["base"]
    r = table["send / compute"]
    grid = np.geomspace(min(r.min(), 0.05) / 2, max(r.max(), 1) * 2, 100)
    curve = {col: [predicted(x, hi, lo)[col] for x in grid] for col in predicted(1.0, hi, lo)}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for col, colour in (("PS speedup", "C0"), ("ring speedup", "C1"), ("ring / PS examples/s", "C2")):
        ax = ax2 if col.startswith("ring /") else ax1
        ax.plot(grid, curve[col], ":", color=colour, lw=1)
        ax.plot(r, table[col], "o", color=colour, label=f"{col} (dotted: predicted)")
    for ax, cols in ((ax1, ["PS speedup", "ring speedup"]), (ax2, ["ring / PS examples/s"])):
        for name, x in r.items():  # each model named once, at its higher point
            y = table.loc[name, cols].max()
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize="small")
    ax1.axhline(hi / lo, color="k", ls="--", lw=1, label="ideal")
    ax2.axhline(1, color="k", ls="--", lw=1, label="as fast")
    xlabel = "one gradient on a link / one step's computation"
    ax1.set(xscale="log", xlabel=xlabel, ylabel=f"speedup, {hi} workers over {lo}", title="each over its own base")
    ax2.set(xscale="log", xlabel=xlabel, ylabel="ring / PS", title=f"head to head at {hi} workers")
    for ax in (ax1, ax2):
        ax.legend(fontsize="small")
    fig.suptitle(table.attrs.get("reference", "the model decides: communication per computation"), fontsize="small")
    fig.tight_layout()
    return fig
