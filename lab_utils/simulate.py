"""A scaling model: what a synchronous training step costs on N workers (Lab 6).

Pure functions, no processes: an alpha-beta (Hockney) cost model of one synchronous
data-parallel step, calibrated from this machine's measured runs (Labs 2-5,
:mod:`lab_utils.training.netexp`) and extrapolated to 1,024 workers::

    from lab_utils import simulate
    params = simulate.calibrate(table)                # α, β, compute from measured rows
    check = simulate.compare(table, params)            # predicted against measured
    curves = simulate.predict(("ps", "ring"), params=params)
    simulate.plot(curves, check)

The terms (:class:`Params`; seconds and bytes):

- ``alpha``: seconds per message (latency plus the software's per-message cost);
- ``beta``: seconds per byte on one link, in one direction (``8 / bits_per_s``; see
  :func:`beta_of`). Links are full duplex: a host sends and receives at once, each
  direction shaped separately (as ``tc`` shapes the emulated hosts);
- ``beta_duplex``: the extra seconds per byte when a link *does* send and receive at
  once (only ring all-reduce does). 0 on an ideal full-duplex link, ``beta`` on a
  half-duplex one. Measured on this machine's 100 Mbit emulated links, a ring runs
  1.2-1.6x slower than full duplex predicts, a PS (one direction at a time) does not.
  The links are full duplex (one host alone sends 97 Mbit/s; two raw TCP streams, one
  each way, 92 each); Open MPI is not: it keeps one TCP connection between two ranks
  and moves a ``Sendrecv``'s two directions over it largely one at a time. A 2-rank
  ring step moved 50 Mbit/s each way whatever tbf's queue (100 or 5 ms: not ACKs
  waiting behind queued data), 88 with ``OMPI_MCA_btl_tcp_links=2`` and 89 on 3 ranks,
  where each rank sends to one peer and receives from another (2026-11-29);
- ``gamma``: seconds per byte summed (the reduction's arithmetic; 0 by default, as the
  rows cannot tell it from ``beta``);
- ``compute_s``: one batch's forward and backward pass on a worker's own accelerator
  (netexp's modelled time); a fitted ``compute_s`` also holds any fixed per-step cost;
- ``cpu_s`` and ``cores``: work done on CPUs that all processes share. With ``cores``
  set (every process on one machine of that many cores, as in loopback runs), CPU work
  and communication (copies, MPI's polling) are slowed by ``max(1, processes / cores)``
  once processes outnumber cores; ``compute_s`` is not (it is not on those cores).
  ``cores=None``: each process has its own host.

Where the model is wrong on purpose: it has no switch (every link is its own, with no
oversubscription or incast losses), no stragglers (every worker's compute is the same),
no overlap of communication with the backward pass, and its ``max(1, P/C)`` CPU sharing
is a first-order guess. Past the measured 1-4 workers it is an extrapolation, not a
measurement.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real

from lab_utils import checks

#: Worker counts :func:`predict` uses by default: 1, 2, 4, ..., 1,024.
WORKERS = tuple(2**i for i in range(11))
#: The terms every step time is linear in, so that :func:`calibrate` can fit them.
LINEAR = ("compute_s", "cpu_s", "alpha", "beta", "beta_duplex", "gamma")
#: What :func:`calibrate` fits unless told otherwise.
FIT = ("compute_s", "alpha", "beta", "beta_duplex")
#: netexp's mode names for the models here.
ALIASES = {"allreduce": "ring", "all-reduce": "ring", "ring_allreduce": "ring", "tree_allreduce": "tree"}
_COMM = ("alpha", "beta", "beta_duplex", "gamma")


@dataclass(frozen=True)
class Params:
    """Everything a step time depends on besides the number of workers (see the module
    docstring for what each term means). ``grad_bytes``: the gradients (= parameters)
    each worker exchanges per step (the dense ones in :func:`hybrid_step`);
    ``sparse_bytes``: the sparse rows a worker pushes and pulls in :func:`hybrid_step`;
    ``shards``: PS shards, each on its own host; ``batch_size``: examples per worker and step."""

    alpha: float
    beta: float
    grad_bytes: float
    compute_s: float = 0.0
    batch_size: int = 64
    beta_duplex: float = 0.0
    gamma: float = 0.0
    cpu_s: float = 0.0
    cores: float | None = None
    shards: int = 1
    sparse_bytes: float = 0.0

    def __post_init__(self):
        for name in ("alpha", "beta", "grad_bytes", "compute_s", "beta_duplex", "gamma", "cpu_s", "sparse_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("batch_size", "shards"):
            checks.count(name, getattr(self, name))
        if self.cores is not None and (
            isinstance(self.cores, bool) or not isinstance(self.cores, Real) or not self.cores > 0
        ):
            raise ValueError(f"cores must be None (a host per process) or a number > 0, got {self.cores!r}")


def beta_of(bandwidth: str | float) -> float:
    """Seconds per byte of a link: ``"100mbit"`` (tc's units) or bits per second -> ``8 / bits``."""
    if isinstance(bandwidth, str):
        from lab_utils.cluster.netem import rate_bits

        bits = rate_bits(bandwidth)
    elif isinstance(bandwidth, Real) and not isinstance(bandwidth, bool) and bandwidth > 0:
        bits = float(bandwidth)
    else:
        raise ValueError(f"bandwidth must be like '100mbit' or bits per second > 0, got {bandwidth!r}")
    return 8.0 / bits


def _resolve(params: Params | None, fields: Mapping) -> Params:
    if params is None:
        return Params(**fields)
    if not isinstance(params, Params):
        raise TypeError(f"params must be a simulate.Params (or give its fields as keywords), got {params!r}")
    return dataclasses.replace(params, **fields) if fields else params


def _step(p: Params, processes: int, comm_s: float) -> float:
    """compute + (CPU work + communication), the latter slowed when processes share cores."""
    share = 1.0 if p.cores is None else max(1.0, processes / p.cores)
    return p.compute_s + (p.cpu_s + comm_s) * share


def _ps_comm(p: Params, n: int, nbytes: float, shards: int) -> float:
    """Push then pull through ``shards`` PS hosts. Each phase is bounded by the busiest
    link: a shard's carries ``n * nbytes / shards``, a worker's ``nbytes`` (all its
    shards' parts). The phase's messages are in flight at once: one ``alpha`` each."""
    busiest = max(n / shards, 1.0) * nbytes
    return 2 * (p.alpha + busiest * p.beta) + n * nbytes / shards * p.gamma


def _ring_comm(p: Params, n: int, nbytes: float) -> float:
    if n == 1:
        return 0.0
    chunk = nbytes / n
    return 2 * (n - 1) * (p.alpha + chunk * (p.beta + p.beta_duplex)) + (n - 1) * chunk * p.gamma


def ps_step(n: int, params: Params | None = None, **fields) -> float:
    """Seconds per step with one parameter server on its own host::

        compute_s + 2 (alpha + N M beta) + N M gamma

    Every worker pushes its M gradient bytes to the PS, which waits for all N, sums
    them (``N M gamma``) and sends the new M parameter bytes back to each. The PS's link
    carries N M in (push) and N M out (pull), one direction at a time, while each worker's
    link carries only M each way: the PS's link is the bottleneck and the step grows
    linearly with N (the thesis's Figure 4.3 levels off for this reason). The N messages
    of a phase are in flight together, so latency counts once per phase. ``params`` or
    its fields as keywords (``ps_step(4, alpha=1e-4, beta=8e-8, grad_bytes=3e6)``)."""
    p, n = _resolve(params, fields), checks.count("n", n)
    return _step(p, n + 1, _ps_comm(p, n, p.grad_bytes, 1))


def sharded_ps_step(n: int, params: Params | None = None, **fields) -> float:
    """Seconds per step with the parameters split evenly over ``shards`` PS hosts::

        compute_s + 2 (alpha + max(N / k, 1) M beta) + (N / k) M gamma

    Each of the k shards' links carries N M / k per direction; each worker's link still
    carries all of its M, so beyond k = N more shards stop helping. ``shards=1`` is
    :func:`ps_step`."""
    p, n = _resolve(params, fields), checks.count("n", n)
    return _step(p, n + p.shards, _ps_comm(p, n, p.grad_bytes, p.shards))


def ring_allreduce_step(n: int, params: Params | None = None, **fields) -> float:
    """Seconds per step with ring all-reduce (Patarasuk and Yuan 2009; Thakur,
    Rabenseifner and Gropp 2005)::

        compute_s + 2 (N - 1) (alpha + (M / N)(beta + beta_duplex)) + (N - 1)(M / N) gamma

    The gradients are cut into N chunks. N - 1 reduce-scatter steps then N - 1
    all-gather steps: in each, every rank sends one chunk to its right neighbour while it
    receives one from its left (both directions of its link at once, hence
    ``beta_duplex``), and in the first N - 1 it adds the chunk in. Every link carries
    2 (N - 1) / N M bytes each way whatever N: the step tends to ``2 M beta`` (bandwidth
    optimal) while the latency term grows as ``2 (N - 1) alpha``. One worker: no exchange."""
    p, n = _resolve(params, fields), checks.count("n", n)
    return _step(p, n, _ring_comm(p, n, p.grad_bytes))


def tree_allreduce_step(n: int, params: Params | None = None, **fields) -> float:
    """Seconds per step with a binomial-tree all-reduce (reduce to a root, then broadcast)::

        compute_s + 2 ceil(log2 N) (alpha + M beta) + ceil(log2 N) M gamma

    Each of the ``ceil(log2 N)`` rounds of the reduce and of the broadcast moves the
    whole M over a link: few messages (good for small M or large alpha) but M beta per
    round, so for large M the ring wins."""
    p, n = _resolve(params, fields), checks.count("n", n)
    rounds = (n - 1).bit_length()  # ceil(log2 n)
    return _step(p, n, 2 * rounds * (p.alpha + p.grad_bytes * p.beta) + rounds * p.grad_bytes * p.gamma)


def hybrid_step(n: int, params: Params | None = None, **fields) -> float:
    """Seconds per step when the dense gradients (``grad_bytes``, or ``dense_bytes=``)
    go through ring all-reduce and the sparse rows (``sparse_bytes`` per worker; an
    embedding's touched rows) through ``shards`` PS hosts, one after the other::

        compute_s + ring(dense) + sharded PS(sparse)

    (the two terms of :func:`ring_allreduce_step` and :func:`sharded_ps_step`; no PS at
    all when ``sparse_bytes`` is 0). Running the two exchanges at the same time would
    cost at least their maximum: this is the upper bound."""
    if "dense_bytes" in fields:
        dense = fields.pop("dense_bytes")
        fields = {**fields, "grad_bytes": dense}
    p, n = _resolve(params, fields), checks.count("n", n)
    comm = _ring_comm(p, n, p.grad_bytes)
    if p.sparse_bytes > 0:
        return _step(p, n + p.shards, comm + _ps_comm(p, n, p.sparse_bytes, p.shards))
    return _step(p, n, comm)


#: The models by name (netexp's "allreduce" is "ring", see :data:`ALIASES`).
MODELS: dict[str, Callable[..., float]] = {
    "ps": ps_step,
    "sharded_ps": sharded_ps_step,
    "ring": ring_allreduce_step,
    "tree": tree_allreduce_step,
    "hybrid": hybrid_step,
}


def model_name(model: str) -> str:
    """The model's name in :data:`MODELS` (``"allreduce"`` -> ``"ring"``)."""
    name = ALIASES.get(model, model) if isinstance(model, str) else model
    if name not in MODELS:
        raise ValueError(f"model must be one of {sorted(MODELS)} (or {sorted(ALIASES)}), got {model!r}")
    return name


def step_time(model: str, n: int, params: Params | None = None, **fields) -> float:
    """Seconds per step of ``model`` (a name in :data:`MODELS`) on ``n`` workers."""
    return MODELS[model_name(model)](n, params, **fields)


def throughput(step_s: float, n: int, batch_size: int) -> float:
    """Examples per second of ``n`` workers, each doing ``batch_size`` examples per step."""
    if not (isinstance(step_s, Real) and step_s > 0 and math.isfinite(step_s)):
        raise ValueError(f"step_s must be a finite number > 0, got {step_s!r}")
    return checks.count("n", n) * checks.count("batch_size", batch_size) / step_s


def efficiency(throughput_n: float, n: int, throughput_1: float) -> float:
    """Scaling efficiency: the speedup over one worker divided by ``n`` (1.0 = linear)."""
    if not (throughput_1 > 0 and throughput_n >= 0):
        raise ValueError(f"throughputs must be > 0, got {throughput_n!r} and {throughput_1!r}")
    return throughput_n / (checks.count("n", n) * throughput_1)


def predict(
    model: str | Sequence[str] = "ring", workers: Iterable[int] = WORKERS, params: Params | None = None, **fields
):
    """A pandas table, one row per model and worker count: ``step_s``, ``comm_s`` (the
    part that communication adds), ``throughput`` (examples/s), ``speedup`` over the
    same model's one worker, and ``efficiency`` (speedup / workers)."""
    import pandas as pd

    p = _resolve(params, fields)
    no_comm = dataclasses.replace(p, **{k: 0.0 for k in _COMM})
    names = [model_name(m) for m in ([model] if isinstance(model, str) else model)]
    workers = [checks.count("workers", n) for n in workers]
    if not names or not workers:
        raise ValueError(f"need at least one model and one worker count, got {names} and {workers}")
    rows = []
    for name in names:
        one = throughput(step_time(name, 1, p), 1, p.batch_size)
        for n in workers:
            step = step_time(name, n, p)
            rate = throughput(step, n, p.batch_size)
            rows.append(
                {
                    "model": name,
                    "workers": n,
                    "step_s": step,
                    "comm_s": step - step_time(name, n, no_comm),
                    "throughput": rate,
                    "speedup": rate / one,
                    "efficiency": efficiency(rate, n, one),
                }
            )
    return pd.DataFrame(rows)


def _number(row: Mapping, key: str) -> float | None:
    """``row[key]`` as a float; None where it is missing, None or NaN (a DataFrame's gap)."""
    value = row.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        return None
    return float(value)


def _rows(measurements) -> list[dict]:
    """Measured rows (netexp's dicts or a DataFrame of them) as dicts with ``model``,
    ``workers``, ``step_s`` and ``grad_bytes`` (from ``gradient_mb`` where needed)."""
    records = measurements.to_dict("records") if hasattr(measurements, "to_dict") else list(measurements)
    rows = []
    for r in records:
        missing = [k for k in ("workers", "step_s") if k not in r] + ([] if ("model" in r or "mode" in r) else ["mode"])
        if missing:
            raise ValueError(f"a measured row needs mode (or model), workers and step_s; {missing} missing in {r}")
        grad = _number(r, "grad_bytes")
        if grad is None and _number(r, "gradient_mb") is not None:
            grad = _number(r, "gradient_mb") * 1e6
        model = r["model"] if isinstance(r.get("model"), str) else r.get("mode")
        rows.append(
            {**r, "model": model_name(model), "grad_bytes": grad, "examples_per_s": _number(r, "examples_per_s")}
        )
    if not rows:
        raise ValueError("no measured rows given")
    return rows


def _nnls(a, b):
    """Non-negative least squares by trying every subset of active terms (exact for the
    few terms here; no SciPy needed). Columns are scaled to unit norm first."""
    import numpy as np

    norms = np.linalg.norm(a, axis=0)
    a = a / norms
    best, best_x = math.inf, np.zeros(a.shape[1])
    for size in range(a.shape[1] + 1):
        for idx in itertools.combinations(range(a.shape[1]), size):
            x = np.zeros(a.shape[1])
            if idx:
                x[list(idx)] = np.linalg.lstsq(a[:, idx], b, rcond=None)[0]
            resid = float(np.linalg.norm(a @ x - b))
            if (x >= 0).all() and resid < best - 1e-12:
                best, best_x = resid, x
    return best_x / norms


def calibrate(measurements, params: Params | None = None, *, fit: Sequence[str] = FIT, **fields) -> Params:
    """Fit the ``fit`` terms (default ``compute_s, alpha, beta, beta_duplex``, all >= 0)
    to measured step times, by least squares on the *relative* error of each step time.

    ``measurements``: rows with ``mode`` (or ``model``), ``workers``, ``step_s`` and
    ``gradient_mb`` (or ``grad_bytes``), as the rows of :func:`lab_utils.training.netexp.run_netexp`'s runs
    hold them, from one network (calibrate each network on its own: its alpha and beta are the
    network's). Terms not fitted come from ``params``/``fields`` (e.g. ``cores=2`` for
    loopback runs); ``grad_bytes`` defaults to the rows' most common size and
    ``batch_size`` to what the rows' throughput implies. Every step time is linear in
    these terms, so the fit is exact linear algebra. Rows that cannot tell two terms
    apart (PS rows alone cannot separate alpha from compute) raise ``ValueError``."""
    import numpy as np

    rows = _rows(measurements)
    unknown = [k for k in fit if k not in LINEAR]
    if unknown or not fit:
        raise ValueError(f"fit must name some of {LINEAR}, got {tuple(fit)}")
    sizes = [r["grad_bytes"] for r in rows if r["grad_bytes"] is not None]
    implied = [r["examples_per_s"] * r["step_s"] / r["workers"] for r in rows if r.get("examples_per_s")]
    defaults = {"alpha": 0.0, "beta": 0.0, "grad_bytes": statistics.mode(sizes) if sizes else 0.0}
    if implied:
        # examples_per_s sums each worker's batch / its own step; step_s is the slowest worker's:
        # their product is batch_size * workers at the least, and exactly so with equal workers
        defaults["batch_size"] = max(1, round(min(implied)))
    base = _resolve(params, fields) if params is not None else Params(**{**defaults, **fields})
    zero = dataclasses.replace(base, **{k: 0.0 for k in fit})
    a, b = [], []
    for r in rows:
        p0 = zero if r["grad_bytes"] is None else dataclasses.replace(zero, grad_bytes=r["grad_bytes"])
        t0 = step_time(r["model"], r["workers"], p0)
        unit = [step_time(r["model"], r["workers"], dataclasses.replace(p0, **{k: 1.0})) - t0 for k in fit]
        a.append([c / r["step_s"] for c in unit])  # each row weighted by 1 / its step time: relative errors
        b.append((r["step_s"] - t0) / r["step_s"])
    a, b = np.array(a), np.array(b)
    cols = np.linalg.norm(a, axis=0)
    scaled = a / np.where(cols > 0, cols, 1.0)
    rank = np.linalg.matrix_rank(scaled)
    if rank < len(fit):
        tied = [k for j, k in enumerate(fit) if np.linalg.matrix_rank(np.delete(scaled, j, axis=1)) == rank]
        raise ValueError(
            f"these {len(rows)} rows cannot tell {tied} apart: fit fewer terms (fit=...) and give the others "
            "in params, or add rows (PS and all-reduce, each at two or more worker counts)"
        )
    x = _nnls(a, b)
    return dataclasses.replace(base, **{k: float(v) for k, v in zip(fit, x, strict=True)})


def compare(measurements, params: Params, *, tolerance: float = 0.25):
    """Measured rows next to the model's predictions: ``predicted_step_s``,
    ``measured_throughput`` (the rows' ``examples_per_s`` where given),
    ``predicted_throughput``, ``rel_error`` (predicted / measured throughput - 1) and
    ``disagrees`` (``|rel_error| > tolerance``). The rows' other columns are kept."""
    import pandas as pd

    if not isinstance(params, Params):
        raise TypeError(f"params must be a simulate.Params, got {params!r}")
    if not tolerance > 0:
        raise ValueError(f"tolerance must be > 0, got {tolerance!r}")
    out = []
    for r in _rows(measurements):
        p = params if r["grad_bytes"] is None else dataclasses.replace(params, grad_bytes=r["grad_bytes"])
        n, step = r["workers"], step_time(r["model"], r["workers"], p)
        measured = r["examples_per_s"] or throughput(r["step_s"], n, p.batch_size)
        predicted = throughput(step, n, p.batch_size)
        rel = predicted / measured - 1
        out.append(
            {
                **r,
                "predicted_step_s": step,
                "measured_throughput": measured,
                "predicted_throughput": predicted,
                "rel_error": rel,
                "disagrees": abs(rel) > tolerance,
            }
        )
    return pd.DataFrame(out)


def _label(row: Mapping) -> str:
    network = row.get("network")
    return f"{row['model']} ({network})" if isinstance(network, str) else str(row["model"])


def plot(predicted, measured=None):
    """Throughput and efficiency against workers (log scale to the largest predicted
    count): the model's curves (:func:`predict`; a ``network`` column, if any, labels
    them), the measured points (:func:`compare`) on top in the same colours, and the
    points where the two disagree ringed in red with their error and, where the table
    has a ``note`` column, the reason. Returns the figure."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    colours: dict[str, str] = {}
    labels = predicted.apply(_label, axis=1)
    for label, part in predicted.groupby(labels, sort=False):
        (line,) = ax1.plot(part["workers"], part["throughput"], "-", label=f"{label}: model")
        colours[label] = line.get_color()
        ax2.plot(part["workers"], part["efficiency"], "-", color=colours[label], label=label)
    ax2.axhline(1.0, color="k", ls="--", lw=1)
    if measured is not None and len(measured):
        mlabels = measured.apply(_label, axis=1)
        for label, part in measured.groupby(mlabels, sort=False):
            style = {"color": colours.get(label), "mec": "k", "label": f"{label}: measured"}
            ax1.plot(part["workers"], part["measured_throughput"], "o", **style)
        for _, r in measured[measured["disagrees"]].iterrows():
            ax1.plot(r["workers"], r["measured_throughput"], "o", ms=16, mfc="none", mec="red", mew=2)
            note = r.get("note") if isinstance(r.get("note"), str) else ""
            text = f"model {r['rel_error']:+.0%}" + (f"\n{note}" if note else "")
            at = (r["workers"], r["measured_throughput"])
            ax1.annotate(text, at, xytext=(8, -14), textcoords="offset points", color="red", fontsize=8)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers")
    ax1.set_yscale("log")
    ax1.set(ylabel="examples / s", title="throughput: model and measured")
    ax2.set(ylabel="speedup / workers", title="scaling efficiency (model)")
    ax1.legend(fontsize=7)
    fig.tight_layout()
    return fig
