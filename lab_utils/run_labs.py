"""Batch runs of the lab notebooks with papermill (``make run``).

    python -m lab_utils.run_labs [--labs 01,03] [--full] [--out out/run]

Executes the instructor sources ``grading/source/<lab>/<lab>.ipynb`` with the
CI parameters from ``labs/params.yml`` (``--full``: the full parameters),
writes the executed notebooks to ``--out`` (each runs with ``--out/<lab>/`` as its
working directory, so its logs stay out of the source tree) and a summary (``summary.json`` and
``summary.md``: lab, wall time, accuracy, throughput, status). Exit code 1 when
any lab fails; the message names the lab and the failing cell.

How figures reach the summary: a notebook calls :func:`lab_utils.notebook.record` (e.g.
``record(accuracy=0.91, examples_per_sec=5300.0)``) in its "what you measured"
section. ``record`` writes to ``$LABS_RESULTS_FILE`` (set here for each lab)
and does nothing otherwise, so students never see a side effect.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from lab_utils import config
from lab_utils.grading.layout import PARAMS_FILE, SOURCE_DIR, load_params, resolve_labs

__all__ = ["run_lab", "run_labs", "summary_markdown", "main"]


def run_lab(
    lab: str,
    out_dir: Path,
    full: bool = False,
    params_file: Path | None = None,
    source_dir: Path | None = None,
    progress: bool = True,
) -> dict:
    """Execute one lab with papermill; returns its summary row (never raises
    for a failing notebook: the row's ``status`` says ``failed`` and why)."""
    import papermill as pm

    params_file = Path(params_file or PARAMS_FILE)
    source_dir = Path(source_dir or SOURCE_DIR)
    settings = load_params(params_file).get(lab) or {}
    parameters = dict(settings.get("full" if full else "ci") or {})
    notebook = source_dir / lab / f"{lab}.ipynb"
    out_dir.mkdir(parents=True, exist_ok=True)
    output = out_dir / f"{lab}.ipynb"
    results_file = out_dir / f"{lab}.results.json"
    results_file.unlink(missing_ok=True)
    row = {
        "lab": lab,
        "mode": "full" if full else "ci",
        "status": "ok",
        "wall_time_s": None,
        "accuracy": None,
        "examples_per_sec": None,
        "error": None,
        "notebook": str(output),
    }
    env_before = {k: os.environ.get(k) for k in (config.RESULTS_FILE, config.HEADLESS)}
    os.environ[config.RESULTS_FILE] = str(results_file.resolve())  # inherited by the papermill kernel
    os.environ[config.HEADLESS] = "1"
    # The notebook runs in out/<lab>/ (a copy of the lab's other files), so TensorBoard logs
    # and scripts it writes never land in the source tree.
    workdir = out_dir / lab
    if notebook.parent.is_dir():
        shutil.copytree(
            notebook.parent,
            workdir,
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("*.ipynb", "runs", ".ipynb_checkpoints", "__pycache__"),
        )
    workdir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        pm.execute_notebook(
            str(notebook),
            str(output),
            parameters=parameters,
            kernel_name="python3",
            cwd=str(workdir),
            progress_bar=progress,
            execution_timeout=int(settings.get("cell_timeout", 1800)),
        )
    except pm.PapermillExecutionError as exc:
        row["status"] = "failed"
        first_line = next((ln.strip() for ln in (exc.source or "").splitlines() if ln.strip()), "")
        row["error"] = (
            f"lab {lab} failed in cell {exc.cell_index + 1} of {output.name} "
            f"(execution count {exc.exec_count}, `{first_line[:60]}`): {exc.ename}: {exc.evalue}"
        )
    except (OSError, RuntimeError, ValueError) as exc:  # missing notebook, kernel died, timeout
        row["status"] = "failed"
        row["error"] = f"lab {lab} could not run: {exc.__class__.__name__}: {exc}"
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    row["wall_time_s"] = round(time.perf_counter() - start, 1)
    if results_file.is_file():
        metrics = json.loads(results_file.read_text())
        row.update({k: v for k, v in metrics.items() if k not in ("lab", "status", "error")})
    return row


def summary_markdown(rows: list[dict]) -> str:
    """The summary table of ``make run`` (``summary.md``), failures listed below it."""

    def fmt(v, spec):
        return "" if v is None else format(v, spec)

    lines = ["| lab | mode | status | wall time (s) | accuracy | examples/s |", "|---|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['lab']} | {r['mode']} | {r['status']} | {fmt(r['wall_time_s'], '.1f')} | "
            f"{fmt(r.get('accuracy'), '.4f')} | {fmt(r.get('examples_per_sec'), ',.0f')} |"
        )
    errors = [r["error"] for r in rows if r.get("error")]
    if errors:
        lines += ["", "Failures:", ""] + [f"- {e}" for e in errors]
    return "\n".join(lines) + "\n"


def run_labs(
    labs: list[str] | None = None,
    full: bool = False,
    out: Path | str = "out/run",
    params_file: Path | None = None,
    source_dir: Path | None = None,
    progress: bool = True,
) -> list[dict]:
    """Run the labs in order and write ``summary.json`` and ``summary.md`` in ``out``."""
    out = Path(out)
    params_file = Path(params_file or PARAMS_FILE)
    source_dir = Path(source_dir or SOURCE_DIR)
    known = sorted(p.name for p in source_dir.iterdir() if (p / f"{p.name}.ipynb").is_file())
    chosen = resolve_labs(labs or [], known)
    rows = []
    for i, lab in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {lab} ({'full' if full else 'CI'} parameters)", flush=True)
        row = run_lab(lab, out, full, params_file, source_dir, progress)
        rows.append(row)
        print(
            f"[{i}/{len(chosen)}] {lab}: {row['status']} in {row['wall_time_s']} s"
            + (f" - {row['error']}" if row["error"] else ""),
            flush=True,
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(rows, indent=2))
    (out / "summary.md").write_text(summary_markdown(rows))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab_utils.run_labs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--labs", default=os.environ.get("LABS", ""), help="comma-separated, e.g. 01,03 (default: all)")
    parser.add_argument(
        "--full",
        action="store_true",
        default=os.environ.get("FULL", "") not in ("", "0"),
        help="use the full (student) parameters instead of the CI ones",
    )
    parser.add_argument("--out", default="out/run", help="folder for executed notebooks and the summary")
    parser.add_argument("--no-progress", action="store_true", help="no per-cell progress bar")
    args = parser.parse_args(argv)
    labs = [s.strip() for s in args.labs.split(",") if s.strip()]
    try:
        rows = run_labs(labs, args.full, args.out, progress=not args.no_progress)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print()
    print(summary_markdown(rows), end="")
    print(f"summary: {Path(args.out) / 'summary.json'}")
    failed = [r for r in rows if r["status"] != "ok"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
