"""Lab 7, Part E: choosing a parallelism, from Lab 6's alpha-beta model with memory.

The student's ``costs(strategy, s)`` prices one training step of a model under each of
:data:`STRATEGIES`, for a :class:`Setting` ``s``: the bytes each rank holds (the weights,
the gradients and Adam's two moments, all float32; activations aside) and the seconds a
step takes. This module holds what is not the exercise:

- :class:`Setting`, checked when it is made;
- :func:`table` and :func:`choose` (the fastest strategy that fits; the simpler one on a tie,
  in the order of :data:`STRATEGIES`);
- the settings measured from the lab's own runs (:func:`zero_setting` for Part B's data
  parallelism and ZeRO on an emulated link, with the :class:`Link`'s alpha and beta fitted
  to ring steps measured on those links, :func:`fit_link`; :func:`pipeline_setting` for Part D's pipeline),
  with each run's measured step time (:func:`step_seconds`), so that a prediction is checked
  against what the same run took (:func:`against_runs`).

The model is the student's, not this module's: no formula for a strategy's cost is here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = [
    "STRATEGIES",
    "Setting",
    "Link",
    "fit_link",
    "table",
    "choose",
    "step_seconds",
    "compute_seconds",
    "zero_setting",
    "pipeline_setting",
    "against_runs",
]

#: the strategies, simplest first (a tie goes to the earlier)
STRATEGIES = ("data", "zero1", "zero2", "tensor", "pipeline")


@dataclass(frozen=True)
class Setting:
    """One model on one cluster, as Part E's cost model sees it.

    - ``params``: P, the model's parameters;
    - ``ranks``: N, the processes (one per GPU or core);
    - ``memory_bytes``: what one rank may hold for the weights, the gradients and the optimizer's
      state (``math.inf``: no limit);
    - ``alpha``, ``beta``: a message of m bytes costs ``alpha + m * beta`` seconds on a link;
    - ``compute_s``: seconds ONE process takes for the forward and backward of a step's whole
      batch (N ranks share that work, however the model is cut);
    - ``activation_bytes``: tensor parallelism: the bytes of one all-reduce of activations (the
      whole batch, one layer's output); the pipeline: the activations of the whole batch at a
      stage boundary (each micro-batch sends its share, forward, and its gradient, backward);
    - ``allreduces``: tensor parallelism's all-reduces of activations per step (two per block:
      one in the forward pass, one in the backward);
    - ``micro_batches``: m, the pipeline's micro-batches per step.
    """

    params: int
    ranks: int
    memory_bytes: float = math.inf
    alpha: float = 0.0
    beta: float = 0.0
    compute_s: float = 0.0
    activation_bytes: float = 0.0
    allreduces: int = 2
    micro_batches: int = 1

    def __post_init__(self):
        for name in ("params", "ranks", "allreduces", "micro_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.params < 1 or self.ranks < 1 or self.micro_batches < 1 or self.allreduces < 0:
            raise ValueError(
                f"params, ranks and micro_batches must be >= 1 and allreduces >= 0, got params={self.params}, "
                f"ranks={self.ranks}, micro_batches={self.micro_batches}, allreduces={self.allreduces}"
            )
        for name in ("memory_bytes", "alpha", "beta", "compute_s", "activation_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")

    def describe(self) -> str:
        mem = "no memory limit" if math.isinf(self.memory_bytes) else f"{self.memory_bytes / 2**30:.3g} GiB per rank"
        return (
            f"P = {self.params:,}, N = {self.ranks}, {mem}, alpha {self.alpha * 1e6:.0f} us, "
            f"{1 / self.beta / 1e6 * 8 if self.beta else math.inf:.4g} Mbit/s, compute {self.compute_s:.3g} s, "
            f"activations {self.activation_bytes / 2**20:.3g} MiB, m = {self.micro_batches}"
        )


def _priced(costs: Callable, strategy: str, setting: Setting) -> tuple[float, float]:
    """``costs(strategy, setting)`` as two plain finite numbers, or an error that says what came back."""
    out = costs(strategy, setting)
    try:
        held, seconds = (float(v) for v in out)
    except (TypeError, ValueError):
        raise ValueError(
            f"costs({strategy!r}, ...) must return (bytes per rank, seconds per step), got {out!r}"
        ) from None
    if not (math.isfinite(held) and math.isfinite(seconds)) or held < 0 or seconds < 0:
        raise ValueError(f"costs({strategy!r}, ...) returned {out!r}: both must be finite and >= 0")
    return held, seconds


def table(costs: Callable, setting: Setting, strategies: Iterable[str] = STRATEGIES) -> pd.DataFrame:
    """One row per strategy: the bytes a rank holds (and in GiB), whether that fits
    ``setting.memory_bytes``, and the step time, as ``costs`` prices them."""
    rows = []
    for strategy in strategies:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
        held, seconds = _priced(costs, strategy, setting)
        rows.append({"strategy": strategy, "bytes per rank": held, "GiB per rank": held / 2**30,
                     "fits": held <= setting.memory_bytes, "step (s)": seconds})  # fmt: skip
    return pd.DataFrame(rows).set_index("strategy")


def choose(costs: Callable, setting: Setting) -> str | None:
    """The fastest strategy whose ranks fit ``setting.memory_bytes`` (on a tie within 0.1 %,
    the simpler: the earlier in :data:`STRATEGIES`); None when none fits."""
    t = table(costs, setting)
    fits = t[t["fits"]]
    if fits.empty:
        return None
    best = float(fits["step (s)"].min())
    return next(s for s in fits.index if fits.loc[s, "step (s)"] <= best * 1.001 + 1e-12)


# ------------------------------------------------------------------ settings measured from runs


def _steps(run, skip_first: bool = True) -> pd.DataFrame:
    ev = run.events
    if ev is None or ev.empty or "started" not in ev:
        raise ValueError(f"{run.label}: no timed steps in its events (was it traced? LABS_TRACE=0 turns that off)")
    ev = ev.dropna(subset=["started"])
    if skip_first and (ev["step"] > 1).any():
        ev = ev[ev["step"] > 1]  # the first step also builds TensorFlow's functions and the state
    return ev


def step_seconds(run) -> float:
    """The median seconds of a step of ``run`` (a Part B or Part D run), after its first, in
    the slowest task: every task ends a step together, but for the one that waits longest."""
    ev = _steps(run)
    return float((ev["time"] - ev["started"]).groupby(ev["task"]).median().max())


def compute_seconds(run) -> float:
    """The median seconds per step that ``run``'s busiest task spent in ``compute`` spans, after
    its first step."""
    per_step: dict[tuple, float] = {}
    for e in _steps(run).to_dict("records"):
        spans = e.get("spans") if isinstance(e.get("spans"), list) else []
        key = (e["task"], e["step"])
        per_step[key] = per_step.get(key, 0.0) + sum(b - a for _, cat, a, b, *_ in spans if cat == "compute")
    if not per_step:
        raise ValueError(f"{run.label}: no compute spans in its steps")
    by_task: dict[str, list[float]] = {}
    for (task, _), seconds in per_step.items():
        by_task.setdefault(task, []).append(seconds)
    return max(float(np.median(v)) for v in by_task.values())


@dataclass(frozen=True)
class Link:
    """Lab 6's alpha and beta of a cluster's links, fitted to ring steps measured on them
    (:func:`lab_utils.training.modelpar.runs.probe_link`): ``rows`` are ``(bytes, seconds)``."""

    alpha: float
    beta: float
    where: str
    rows: tuple[tuple[int, float], ...]

    @property
    def bandwidth_bps(self) -> float:
        """The bits per second a ring step's messages moved at (both directions of a link busy)."""
        return 8.0 / self.beta if self.beta > 0 else math.inf

    def table(self) -> pd.DataFrame:
        rows = [{"bytes": m, "measured (s)": t, "alpha + m beta (s)": self.alpha + m * self.beta} for m, t in self.rows]
        return pd.DataFrame(rows).set_index("bytes")

    def describe(self) -> str:
        return (
            f"{self.where}: alpha {self.alpha * 1e6:.0f} us, beta {self.beta * 1e9:.3g} ns/B "
            f"({self.bandwidth_bps / 1e6:.4g} Mbit/s), fitted to {len(self.rows)} message sizes"
        )

    def __repr__(self) -> str:
        return f"Link({self.describe()})"


def fit_link(rows: Iterable[tuple[int, float]], where: str = "") -> Link:
    """:class:`Link` of ``(bytes, seconds)`` ring steps: alpha and beta (both >= 0) by least
    squares on each step's relative error (the small messages count as much as the large)."""
    rows = tuple((int(m), float(t)) for m, t in rows)
    if len({m for m, _ in rows}) < 2 or any(not (t > 0 and math.isfinite(t)) for _, t in rows):
        raise ValueError(f"fit_link needs steps of two sizes or more, each > 0 seconds, got {rows}")
    m = np.array([r[0] for r in rows], float)
    t = np.array([r[1] for r in rows], float)
    a = np.stack([1 / t, m / t], axis=1)  # (alpha + m beta) / t = 1
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if alpha < 0:  # latency below what the fit can see: the line through the origin
        alpha, beta = 0.0, float(np.sum(m / t) / np.sum((m / t) ** 2))
    elif beta < 0:
        alpha, beta = float(np.median(t)), 0.0
    return Link(alpha=float(alpha), beta=float(beta), where=where, rows=rows)


def zero_setting(run, link: Link | float, memory_bytes: float = math.inf) -> Setting:
    """The :class:`Setting` of a Part B run: its P and N, one process's compute (N times what a
    rank computed: each rank's batch is 1/N of the step's), and the links' alpha and beta from
    ``link``: a :class:`Link` measured on the run's links, or a nominal bandwidth in bits per
    second (alpha 0)."""
    if isinstance(link, Link):
        alpha, beta = link.alpha, link.beta
    elif isinstance(link, (int, float, np.number)) and not isinstance(link, bool) and link > 0:
        alpha, beta = 0.0, 8.0 / float(link)
    else:
        raise ValueError(f"link must be a Link (runs.probe_link) or a bandwidth in bits per second > 0, got {link!r}")
    return Setting(params=run.params, ranks=run.ranks, memory_bytes=memory_bytes, alpha=alpha,
                   beta=beta, compute_s=run.ranks * compute_seconds(run))  # fmt: skip


def pipeline_setting(run, bandwidth_bps: float | None = None, alpha: float = 0.0) -> Setting:
    """The :class:`Setting` of a Part D pipeline run: its P and N (the stages), m, the
    activations at a stage boundary (the whole batch's, float32), and one process's compute:
    N times the busiest stage's compute per step (its spans exclude its waits, so this is the
    work, not the bubble)."""
    stages, m = run.stages, run.micro_batches
    params = int(sum(w.size for w in run.weights()))
    boundary = run.args["batch_size"] * run.args.get("hidden", 0) * 4
    beta = 0.0 if bandwidth_bps is None else 8.0 / bandwidth_bps
    return Setting(params=params, ranks=stages, alpha=alpha, beta=beta, compute_s=stages * compute_seconds(run),
                   activation_bytes=float(boundary), micro_batches=m)  # fmt: skip


def against_runs(costs: Callable, cases: Iterable[tuple[str, Setting, object]]) -> pd.DataFrame:
    """``cases``: ``(strategy, setting, run)``. One row per case: the step time ``costs``
    predicts for the strategy in the setting, the run's measured one and their ratio, and the
    bytes per rank predicted."""
    rows = []
    for strategy, setting, run in cases:
        held, predicted = _priced(costs, strategy, setting)
        measured = step_seconds(run)
        rows.append({"run": run.label, "strategy": strategy, "predicted step (s)": predicted,
                     "measured step (s)": measured, "measured / predicted": measured / predicted if predicted else math.inf,
                     "predicted bytes per rank": held})  # fmt: skip
    return pd.DataFrame(rows).set_index("run")
