"""make run (lab_utils.run_labs): summary, failure naming lab and cell, exit code, kernel."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from lab_utils import run_labs


def _lab(source_dir: Path, name: str, cells: list[str]) -> None:
    nb = new_notebook(
        cells=[new_code_cell(src) for src in cells],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nb.cells[0].metadata["tags"] = ["parameters"]
    (source_dir / name).mkdir(parents=True)
    nbformat.write(nb, source_dir / name / f"{name}.ipynb")


def test_failing_lab_is_named_and_fails_the_run(tmp_path, monkeypatch, capsys):
    src = tmp_path / "source"
    _lab(
        src,
        "01_ok",
        [
            "X = 1",
            "import sys\nfrom lab_utils.notebook import record\n"
            "record(accuracy=0.5 + X / 10, examples_per_sec=100.0, python=sys.executable)",
        ],
    )
    _lab(src, "02_bad", ["X = 1", "y = X + 1", "raise ValueError('boom')"])
    params = tmp_path / "params.yml"
    params.write_text("01_ok:\n  ci: {X: 2}\n  full: {X: 3}\n02_bad:\n  ci: {}\n")
    monkeypatch.setattr(run_labs, "SOURCE_DIR", src)
    monkeypatch.setattr(run_labs, "PARAMS_FILE", params)
    out = tmp_path / "out"
    code = run_labs.main(["--out", str(out), "--no-progress"])
    assert code == 1
    rows = {r["lab"]: r for r in json.loads((out / "summary.json").read_text())}
    assert rows["01_ok"]["status"] == "ok" and rows["01_ok"]["accuracy"] == pytest.approx(0.7)  # CI value X=2
    assert rows["01_ok"]["python"] == sys.executable  # papermill's python3 kernel is this interpreter
    assert rows["02_bad"]["status"] == "failed"
    assert (
        "02_bad" in rows["02_bad"]["error"]
        and "cell 3" in rows["02_bad"]["error"]
        and "boom" in rows["02_bad"]["error"]
    )
    assert "02_bad failed in cell" in (out / "summary.md").read_text()
    assert (out / "02_bad.ipynb").is_file()
    assert run_labs.main(["--labs", "01", "--full", "--out", str(out), "--no-progress"]) == 0
    assert json.loads((out / "summary.json").read_text())[0]["accuracy"] == pytest.approx(0.8)
    assert run_labs.main(["--labs", "07", "--out", str(out)]) == 2
