"""The expected-results sheet for graders: what each lab's figures come out as on each tier.

    python bench/expected_results.py --tier "2-core laptop=laptop.json" \\
        --tier "Hub pod (2 CPUs, 2.5 GB)=pod.json" --tier "Binder (1 CPU, 2 GB)=binder.json" \\
        [--out grading/expected_results.md] [--update grading/expected_results.md --note "..."]

``--update SHEET``: only the labs the tier files hold are measured again; their sections replace
the sheet's, the other labs' stay as they were, and ``--note`` is added under the earlier notes.

**Claims.** Every quantitative or comparative sentence of the labs that a run can confirm is a claim in
``grading/claims.yml`` (``--claims``): the cell it is in (its id, and an anchor phrase of its text), and
a predicate over the figures that lab records (``holds``), with ``when``, the tiers it is made for
(``cpus``, ``memory_mb``, ``params`` "full" or "ci", ``data``, and the figures, such as
``data_source``). Each lab's section lists its claims with a verdict per tier, and the exit status is 1
when any claim fails on a tier it is made for (the sheet is written all the same, to show which).

Each ``FILE.json`` is the output of ``bench/bench_lab_memory.py --full`` (a student's full run of
every lab under that tier's limits). Its ``recorded`` figures are what the notebooks pass to
:func:`lab_utils.notebook.record`: each lab's headline figures and the readings its autograded
questions ask for, so a grader judging a "from your own numbers" answer sees the range a
correct run gives on the student's kind of machine. Tiers without a file (a GPU node, where the
course machine has none) are described in :data:`NOT_MEASURED` and not given figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from pathlib import Path
from typing import NamedTuple

import yaml

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = ROOT / "grading" / "claims.yml"

#: What a figure means, for the sheet's first column (a figure not listed here is shown by its key).
LABELS = {
    "all_reduce_halves": "Part A: an all-reduce's bytes / a half's",
    "zero_state_mb_0": "Part B: optimizer state per rank, plain data parallelism (MB)",
    "zero_state_mb_1": "Part B: optimizer state per rank, stage 1 (MB)",
    "zero_state_mb_2": "Part B: optimizer state per rank, stage 2 (MB)",
    "zero_rss_mb_0": "Part B: held between steps per rank, plain (MB)",
    "zero_rss_mb_1": "Part B: held between steps per rank, stage 1 (MB)",
    "zero_rss_mb_2": "Part B: held between steps per rank, stage 2 (MB)",
    "zero_peak_mb_0": "Part B: peak resident per rank, plain (MB)",
    "zero_peak_mb_1": "Part B: peak resident per rank, stage 1 (MB)",
    "zero_peak_mb_2": "Part B: peak resident per rank, stage 2 (MB)",
    "zero_max_rel_diff": "Part B: largest relative weight difference from plain",
    "tp_max_rel_error": "Part C: split block against the whole, largest relative error",
    "tp_even_batch": "Prediction 3: batch where both parallelisms send the same bytes",
    "e_ring_mbit": "Part E: a ring step's rate on 100 Mbit/s links (Mbit/s)",
    "e_one_way_mbit": "Part E: one direction alone (Mbit/s)",
    "bubble_max_rel_gap": "Part D: the bubble's largest gap to (p - 1)/(m + p - 1)",
    "accuracy": "test accuracy",
    "examples_per_sec": "examples/s",
    "fastest_to_target": "Q2: batch fastest to the target",
    "highest_throughput_batch": "batch with the highest examples/s",
    "throughput_growth": "Q1: examples/s at the largest batch / at the smallest",
    "rankings_agree": "examples/s and time to the target rank the batch sizes alike",
    "largest_batch_reached": "the largest batch reached the target",
    "largest_batch_slowdown": "its time to the target / the fastest batch's",
    "largest_over_120_eps": "examples/s of the largest batch / of batch 120",
    "step_cost_120_over_10": "time of a step of 120 / of a step of 10",
    "sync_train_time_s": "sync train time, longest worker (s)",
    "async_chief_eval_share": "async chief's evaluations / its loop",
    "async_most_steps": "async worker with the most local steps",
    "speedup": "examples/s, most workers / fewest",
    "busy_cores_most_workers": "cores kept busy, most workers",
    "straggler_step_share": "straggler's share of local steps",
    "straggler_staleness_mean": "Prediction 2: straggler's staleness, measured",
    "straggler_staleness_predicted": "Prediction 2: straggler's staleness, predicted",
    "run_bytes_predicted": "Prediction 1: bytes of the whole run, predicted",
    "bytes_async_predicted": "Prediction 1: async bytes per global step, predicted",
    "bytes_async_measured": "Prediction 1: async bytes per global step, measured",
    "bytes_sync_predicted": "Prediction 1: sync bytes per global step, predicted",
    "bytes_sync_measured": "Prediction 1: sync bytes per global step, measured",
    "straggler_step_predicted_s": "Prediction 2: R = N step with the straggler (s), predicted",
    "straggler_step_measured_s": "Prediction 2: R = N step with the straggler (s), measured",
    "async_slope": "Q3: Table 3 log-log slope (1/B: -1)",
    "sync_slope": "Q3: Table 4 log-log slope (flat: 0)",
    "sync_train_time_spread_s": "sync train-time spread (s)",
    "async_train_time_spread_s": "async train-time spread (s)",
    "wait_over_reduce": "Q2: negotiation time / all-reduce time",
    "fp16_byte_ratio": "fp16 bytes / float32 bytes per step",
    "hang_still_running": "workers still running at the deadline (TensorFlow's defaults)",
    "fixed_finished": "Exercise 3: workers that exited 0 (the student's ending)",
    "async_accuracy": "test accuracy, async run",
    "workers": "workers of the main run",
    "ranks": "ranks",
    "final_global_step": "final global step",
    "max_weight_rel_diff": "Part C: largest relative weight difference",
    "scaling_max_rel_error": "Part D: the model's largest error in measured throughput",
}
#: Recorded figures the sheet leaves out: the run's wall time is the bench's own, shown once.
SKIPPED = {"data_source", "wall_time_s"}
#: Tiers the course machine cannot measure, with what changes there.
NOT_MEASURED = {
    "GPU node": (
        "Not measured here (the course machine has no GPU TensorFlow can use). What changes, from the "
        "seeds and the labs' own notes: Lab 1's examples/s rises tenfold or more and flattens later in "
        "the batch; Labs 2-3 (logistic regression on the CPU) are unchanged; in Lab 4 the all-reduce of a "
        "large model dominates and negotiation becomes small; in Lab 5 real "
        "devices add compute, so towers and MirroredStrategy scale (speedups near N on NVLink), and the "
        "out-of-memory row comes from device memory, not a logical limit; Lab 6 is unchanged (its "
        "links are emulated)."
    )
}


#: Figures named by a pattern (a method, a bound, a run size in the key): regex -> words
PATTERNS = {
    r"(\w+)_byte_cut": "{0} cuts the bytes by (x)",
    r"(\w+)_time_cut": "{0} cuts the time per step by (x)",
    r"(none|fp16|onebit|topk)_bytes_(predicted|measured)": "Prediction 1: {0} bytes per rank and step, {1}",
    r"ssp_wait_(predicted|measured)_(.+)": "Prediction 2: waits with s={1} (s), {0}",
    r"run_bytes_measured_(\d+)": "Prediction 1: bytes of the whole run, measured, {0} worker(s)",
    r"step_(ps|allreduce)_(\d+)_(predicted|measured)_s": "Prediction 1: {0} step, {1} worker(s) (s), {2}",
    r"speedup_(ps|allreduce)_(\d+)_(predicted|measured)": "Prediction 1: {0} speedup, {1} workers, {2}",
}


def _label(key: str) -> str:
    """The sheet's words for a recorded figure."""
    for pattern, words in PATTERNS.items():
        if found := re.fullmatch(pattern, key):
            return words.format(*found.groups())
    return LABELS.get(key, key)


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


# ----------------------------------------------------------------------------- claims


class Claim(NamedTuple):
    """One sentence of a lab's text that a run can confirm (an entry of ``grading/claims.yml``)."""

    lab: str
    claim: str  # what the text says, in a few words
    cell: str  # the notebook cell's id
    anchor: str  # a phrase of that cell's text that locates the sentence
    holds: str  # a predicate over the lab's recorded figures
    when: str | None = None  # the tiers the text makes it for (None: every tier)


#: What a claim's expressions may use: figures, numbers and strings, arithmetic, comparisons,
#: and/or/not, and these functions
_FUNCTIONS = {"abs": abs, "min": min, "max": max, "round": round, "len": len}
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
    ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.Compare, ast.Eq, ast.NotEq,
    ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.Name, ast.Load,
    ast.Constant, ast.Call, ast.Tuple, ast.List, ast.IfExp,
)  # fmt: skip


def expression_names(text: str) -> set[str]:
    """The figures an expression reads; ``ValueError`` for anything but a plain expression."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an expression: {text!r} ({exc.msg})") from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ValueError(f"{text!r}: {type(node).__name__} is not allowed in a claim")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS):
            raise ValueError(f"{text!r}: only {', '.join(_FUNCTIONS)} may be called")
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)}
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} - called


def load_claims(path: Path | str = CLAIMS) -> list[Claim]:
    """Every claim of ``path`` (``{lab: [{claim, cell, anchor, holds, when?}, ...]}``), checked."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    out = []
    for lab, entries in data.items():
        for i, entry in enumerate(entries or []):
            where = f"{path}: {lab}, claim {i + 1}"
            missing = {"claim", "cell", "anchor", "holds"} - set(entry)
            unknown = set(entry) - {"claim", "cell", "anchor", "holds", "when"}
            if missing or unknown:
                raise ValueError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
            claim = Claim(lab, *(str(entry[k]) for k in ("claim", "cell", "anchor", "holds")), entry.get("when"))
            for text in filter(None, (claim.holds, claim.when)):
                try:
                    expression_names(text)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None
            out.append(claim)
    return out


def tier_facts(entry: dict) -> dict:
    """What a claim's expressions can read of one lab's run on one tier: its recorded figures (``∞``
    in a name read as ``inf``), and the tier's ``cpus``, ``memory_mb``, ``params``, ``data`` and
    ``wall_s``."""
    limits = entry.get("limits") or {}
    recorded = {key.replace("∞", "inf"): value for key, value in (entry.get("recorded") or {}).items()}
    return {
        "cpus": limits.get("cpus"),
        "memory_mb": limits.get("memory_mb"),
        "params": entry.get("params"),
        "data": entry.get("data"),
        "wall_s": entry.get("wall_s"),
        **recorded,
    }


def verdict(claim: Claim, entry: dict | None) -> tuple[str, bool]:
    """``(words, failed)``: "holds", "FAILS (figures)", "not claimed here" (``when`` is false),
    "no figure X" (a failure: the lab no longer records what its text claims), or "–" (not run)."""
    if not entry:
        return "–", False
    facts = tier_facts(entry)

    def run(text: str):
        names = expression_names(text)
        absent = sorted(n for n in names if n not in facts)
        if absent:
            return None, absent
        try:  # a figure recorded as None (not a number: nothing reached) may be skipped by and/or
            return eval(compile(text, "<claim>", "eval"), {"__builtins__": {}, **_FUNCTIONS}, facts), []  # noqa: S307
        except TypeError:
            return None, sorted(n for n in names if facts[n] is None) or sorted(names)

    if claim.when:
        applies, absent = run(claim.when)
        if absent:
            return f"**no figure** {', '.join(absent)}", True
        if not applies:
            return "not claimed here", False
    result, absent = run(claim.holds)
    if absent:
        return f"**no figure** {', '.join(absent)}", True
    if result:
        return "holds", False
    shown = ", ".join(f"{n} = {_fmt(facts[n])}" for n in sorted(expression_names(claim.holds)))
    return f"**FAILS** ({shown})", True


def claims_table(claims: list[Claim], names: list[str], entries: list[dict | None]) -> list[str]:
    """The markdown lines of one lab's claims, a column per tier (:func:`failures` lists the failures)."""
    if not claims:
        return []
    lines = [
        "Claims of the lab's text (`grading/claims.yml`), on each tier:",
        "",
        "| claim | cell | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for claim in claims:
        cells = [verdict(claim, entry)[0] for entry in entries]
        lines.append(f"| {claim.claim} | `{claim.cell}` | " + " | ".join(cells) + " |")
    return lines + [""]


def load_tier(path: Path) -> dict:
    """``{lab: {"recorded": {...}, "wall_s": ..., "scaled_down": [...]}}`` of one bench file."""
    data = json.loads(path.read_text())
    labs = data.get("labs")
    if not isinstance(labs, dict) or not labs:
        raise ValueError(f"{path}: not an output of bench/bench_lab_memory.py (no 'labs')")
    return labs


def sheet(tiers: dict[str, tuple[str, dict]], note: str | None = None, claims: list[Claim] = ()) -> str:
    """The markdown sheet: one table per lab, a column per measured tier, and below it the lab's
    ``claims`` with their verdicts. ``tiers``: name -> (where its figures come from,
    :func:`load_tier`'s labs)."""
    names = list(tiers)
    labs = sorted({lab for _, t in tiers.values() for lab in t})
    out = [
        "# Expected results, per tier",
        "",
        "What a correct full run of each lab gives on each kind of machine: the figures the notebooks "
        "record, and the readings the autograded questions ask for. Use them to judge answers that "
        "quote the student's own numbers: a student's figure far outside its tier's value is worth a "
        "second look (a busy machine, a scaled-down cluster: the notebook prints a `[lab_utils]` line "
        "when it runs fewer workers than asked). Regenerate with `bench/expected_results.py` after a "
        "change to the labs.",
        "",
    ]
    for name in names:
        source, runs = tiers[name]
        data = sorted({str(entry.get("data", "?")) for entry in runs.values()})
        out.append(f"- **{name}**: `{source}`, data: {', '.join(data)}")
    out += [
        "",
        "Figures measured on the deterministic full-size stand-ins (`python -m lab_utils stand-ins`) "
        "reach lower accuracies than the real MNIST and CIFAR-10 (each lab's target follows its data: "
        "`lab_utils.data.target_accuracy`); times and ratios are what to compare.",
    ]
    if note:
        out += ["", note]
    out.append("")
    for lab in labs:
        rows: dict[str, list[str]] = {}
        for i, name in enumerate(names):
            entry = tiers[name][1].get(lab) or {}
            figures = {**(entry.get("recorded") or {})}
            figures["wall time of the full run (s)"] = entry.get("wall_s")
            if entry.get("scaled_down"):
                figures["scaled down"] = "; ".join(entry["scaled_down"])
            for key, value in figures.items():
                if key in SKIPPED:
                    continue
                rows.setdefault(_label(key), ["–"] * len(names))[i] = _fmt(value)
        out += [f"## {lab}", "", "| figure | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        out += [f"| {label} | " + " | ".join(values) + " |" for label, values in rows.items()]
        out.append("")
        mine = [c for c in claims if c.lab == lab]
        out += claims_table(mine, names, [tiers[name][1].get(lab) for name in names])
    for name, text in NOT_MEASURED.items():
        out += [f"## {name}", "", text, ""]
    return "\n".join(out)


def failures(tiers: dict[str, tuple[str, dict]], claims: list[Claim]) -> list[str]:
    """One line per claim that fails on a tier it is made for (of the labs the tiers ran)."""
    out = []
    for claim in claims:
        for name, (_, labs) in tiers.items():
            words, bad = verdict(claim, labs.get(claim.lab))
            if bad:
                out.append(f"{claim.lab}, cell {claim.cell}: {claim.claim!r} on {name}: {words}")
    return out


def _sections(text: str) -> tuple[str, dict[str, str]]:
    """(what comes before the first ``## `` section, {section name: its text})."""
    head, *parts = re.split(r"^## ", text, flags=re.M)
    return head, {part.split("\n", 1)[0].strip(): "## " + part for part in parts}


def update(old: str, new: str, note: str | None) -> str:
    """``old`` with the sections ``new`` measured (its labs) put in their place, in ``old``'s order
    (a lab ``old`` lacks goes before the unmeasured tiers), and ``note`` after ``old``'s notes."""
    head, sections = _sections(old)
    _, fresh = _sections(new)
    for name, text in fresh.items():
        if name in NOT_MEASURED:
            continue
        sections[name] = text if text.endswith("\n") else text + "\n"
    order = sorted(sections, key=lambda name: (name in NOT_MEASURED, name))
    if note:
        head = head.rstrip("\n") + "\n\n" + note + "\n\n"
    return head + "".join(sections[name] for name in order).rstrip("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", action="append", required=True, help='"NAME=bench.json", one per tier, in order')
    parser.add_argument("--out", help="write the sheet here (default: standard output)")
    parser.add_argument("--note", help="a paragraph under the tiers: when and how they were measured")
    parser.add_argument("--update", help="an existing sheet: replace only the sections of the labs measured here")
    parser.add_argument("--claims", default=str(CLAIMS), help="the labs' claims (default: grading/claims.yml)")
    args = parser.parse_args(argv)
    try:
        claims = load_claims(args.claims)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"expected_results: {exc}", file=sys.stderr)
        return 2
    tiers = {}
    for spec in args.tier:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            parser.error(f'--tier takes "NAME=FILE.json", got {spec!r}')
        try:
            tiers[name.strip()] = (Path(path).name, load_tier(Path(path)))
        except (OSError, ValueError) as exc:
            print(f"expected_results: {exc}", file=sys.stderr)
            return 2
    text = sheet(tiers, args.note, claims)
    if args.update:
        text = update(Path(args.update).read_text(), text, args.note)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    failed = failures(tiers, claims)
    for line in failed:
        print(f"expected_results: a claim of the text fails: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
