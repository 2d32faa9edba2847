"""How well the timeline's what-if replay predicts a second run (issue 55; target: within 15 %
of the measured run's median step time, for every task), beside a model of the same change.

Each case is a pair of real runs in one invocation: the first is traced and replayed with a
change (:meth:`lab_utils.timeline.Timeline.what_if`), the second is run with that change and
measured. Per task, the median step time (steps after the first) of both; a case's error is its
worst task's.

- ``ps-bandwidth`` and ``ring-bandwidth``: Lab 6's PS and ring (netexp, 2 workers, 3 MB of
  gradients, 0.2 s of compute) at 100 Mbit/s, predicting 1 Gbit/s: communication scaled by
  0.1 (the replay's assumption: every second of a ``comm`` span is bytes on the link). The
  alpha-beta model's prediction for the same change: compute plus the bytes at 1 Gbit/s.
- ``sync-straggler``: Lab 3's synchronous PS (2 workers) with worker:1 the straggler,
  predicting the run without it.
- ``backup-workers``: the same run with R = N = 2, predicting R = N - 1 = 1 (``replicas=1``:
  each wait released by the first gradient, not the last).
- ``ssp-bound``: Lab 6's SSP with the same straggler and s = 0, predicting no bound
  (``staleness=math.inf``).

The PS cases give every worker 50 ms of modelled compute a step (a sleep, in a ``delay`` span,
like netexp's ``compute_s``: time off the CPU, as a GPU's compute is), the straggler 150 ms, at
Lab 3's batch of 60: ``straggler-removed`` is worker:1's delay scaled by 1/3.

``--bare`` runs them again without the modelled compute (the straggler 0.1 s, the others
nothing): a worker's own step is then 2-5 ms of RPCs on 2 cores, and the replay, which keeps
each piece's duration, is wrong both ways by up to 40 %, from run to run: RPCs take longer right
after a 0.1 s wait than in a loop (caches, the PS's threads waking), and without the straggler
both workers' RPCs and the PS's work share 2 cores at once where they took turns.

The model beside the PS cases is "each worker's own work, no waits": what a student would add
up from the first run's timeline.

Figures (2026-11-30, 2 cores; each case's worst task): the PS 100 Mbit/s -> 1 Gbit/s +12.7 %
(alpha-beta -4.6 %), the ring +5.1 % (alpha-beta +8.0 %); sync-straggler -1.6 %, backup-workers +0.5 %,
ssp-bound +0.6 %; with --bare +19.5, +49 and -44 %.

    python bench/bench_what_if.py [--cases ps-bandwidth,ring-bandwidth,...] [--bare]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

CASES = ("ps-bandwidth", "ring-bandwidth", "sync-straggler", "backup-workers", "ssp-bound")
TARGET = 0.15
GRADIENT_MB, COMPUTE_S = 3.0, 0.2
PS_ARGS = {"steps": 30, "eval_every": 0, "batch_size": 60}
#: (every worker's delay, the straggler's): modelled compute, or none (--bare)
REGIMES = {"modelled": (0.05, 0.15), "bare": (0.0, 0.1)}


def _per_task(replay, measured_timeline, model: dict | None = None) -> dict:
    """Per task: predicted, measured (the second run's median step), error; and the worst."""
    measured = measured_timeline.what_if()["measured step (s)"]
    tasks = {}
    for task, row in replay.iterrows():
        m = float(measured.get(task, float("nan")))
        q = float(row["predicted step (s)"])
        tasks[task] = {"before_s": float(row["measured step (s)"]), "predicted_s": q, "measured_s": m,
                       "error": q / m - 1}  # fmt: skip
        if model is not None and task in model:
            tasks[task] |= {"model_s": model[task], "model_error": model[task] / m - 1}
    worst = max(tasks.values(), key=lambda t: abs(t["error"]))
    return {
        "tasks": tasks,
        "error": worst["error"],
        "within_target": all(abs(t["error"]) <= TARGET for t in tasks.values()),
    }


def _own_work(timeline, without: tuple[str, ...] = ()) -> dict:
    """Each task's median step less its waits (and the categories ``without``): the naive model."""
    from lab_utils import critical_path

    out = {}
    for task, chain in critical_path.pieces(timeline).items():
        per: dict[int, float] = {}
        for p in chain:
            if p.index not in (None, 0) and p.cat != "wait" and p.cat not in without:
                per[p.index] = per.get(p.index, 0.0) + p.seconds
        out[task] = statistics.median(per.values()) if per else float("nan")
    return out


def _netexp(mode: str, bandwidth: str):
    from lab_utils import timeline
    from lab_utils.training.netexp import runs as netexp_runs

    run = netexp_runs.run_netexp(mode, 2, hosts=f"emulated:bandwidth={bandwidth}", mb=GRADIENT_MB, steps=6, warmup=1,
                          compute_s=COMPUTE_S, progress=False)  # fmt: skip
    if not run.trace:
        raise RuntimeError(f"netexp {mode} at {bandwidth}: no timeline (is LABS_TRACE=0 set?)")
    return timeline.load(run.trace), run.row


def bandwidth_case(mode: str) -> dict:
    slow, _ = _netexp(mode, "100mbit")
    replay = slow.what_if(scale={"comm": 0.1})
    fast, fast_row = _netexp(mode, "1gbit")
    # alpha-beta (alpha = 0): compute, then each worker's bytes per step at 1 Gbit/s, one way each
    per_step_bytes = fast_row.get("worker_mb_per_step") or GRADIENT_MB * 2
    alpha_beta = COMPUTE_S + per_step_bytes * 1e6 * 8 / 1e9
    out = _per_task(replay, fast, dict.fromkeys(replay.index, alpha_beta))
    return {"change": "100 Mbit/s -> 1 Gbit/s (comm x 0.1)", "model": "alpha-beta", **out}


def _ps(script: str, args: dict, **kw):
    from lab_utils.training.ps import runs as ps_runs

    return ps_runs.run_ps(script, workers=2, args={**PS_ARGS, **args}, progress=False, **kw).timeline()


def _straggler(regime: str) -> str:
    every, slow = REGIMES[regime]
    return f"worker:0={every},worker:1={slow}" if every else f"worker:1={slow}"


def straggler_case(regime: str) -> dict:
    from lab_utils.grading import reference_script

    script = reference_script("03_ps_sync", "train_sync.py")
    every, slow_s = REGIMES[regime]
    slow = _ps(script, {"straggler": _straggler(regime)})
    replay = slow.what_if(tasks={"worker:1": {"delay": every / slow_s}})
    fast = _ps(script, {"straggler": f"worker:0={every},worker:1={every}" if every else ""})
    causes = slow.waits_by_cause()
    top = causes[causes["task"] == "worker:0"].head(1)
    out = _per_task(
        replay, fast, {t: v - (slow_s - every if t == "worker:1" else 0) for t, v in _own_work(slow).items()}
    )
    return {"change": f"worker:1's delay {slow_s:g} s -> {every:g} s", "model": "own work, no waits", **out,
            "largest_cause_of_worker0_wait": top["cause"].iloc[0] if len(top) else None}  # fmt: skip


def backup_case(regime: str) -> dict:
    from lab_utils.grading import reference_script

    script = reference_script("03_ps_sync", "train_sync.py")
    every = _ps(script, {"straggler": _straggler(regime), "replicas_to_aggregate": 2})
    replay = every.what_if(replicas=1)
    fewer = _ps(script, {"straggler": _straggler(regime), "replicas_to_aggregate": 1})
    out = _per_task(replay, fewer, _own_work(every))
    return {"change": "R = 2 of 2 -> R = 1 of 2 (replicas=1)", "model": "own work, no waits", **out}


def ssp_case(regime: str) -> dict:
    from lab_utils.grading import reference_script
    from lab_utils.training.ssp import runs as ssp_runs

    script = reference_script("06_communication", "train_ssp.py")
    args = {**PS_ARGS, "straggler": _straggler(regime)}
    bounded = ssp_runs.run_ssp(script, 0, workers=2, args=args, progress=False).timeline()
    replay = bounded.what_if(staleness=math.inf)
    free = ssp_runs.run_ssp(script, math.inf, workers=2, args=args, progress=False).timeline()
    out = _per_task(replay, free, _own_work(bounded))
    return {"change": "s = 0 -> no bound (staleness=math.inf)", "model": "own work, no waits", **out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--bare", action="store_true", help="the PS cases again without modelled compute")
    args = parser.parse_args(argv)
    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    out: dict = {"target": TARGET, "cases": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    ps_cases = {"sync-straggler": straggler_case, "backup-workers": backup_case, "ssp-bound": ssp_case}
    for case in cases:
        for regime in (["modelled", "bare"] if args.bare else ["modelled"]) if case in ps_cases else [None]:
            name = case if regime in (None, "modelled") else f"{case} ({regime})"
            print(f"bench_what_if: {name} ...", file=sys.stderr, flush=True)
            t = time.monotonic()
            result = (
                ps_cases[case](regime) if regime else bandwidth_case("ps" if case == "ps-bandwidth" else "allreduce")
            )
            out["cases"][name] = {**result, "seconds": time.monotonic() - t}
    out["within_target"] = {k: v["within_target"] for k, v in out["cases"].items()}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
