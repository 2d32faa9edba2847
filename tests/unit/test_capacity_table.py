"""The grading capacity plan (bench/capacity_table.py) from the committed measurements
(grading/bench_grading.json): every lab measured, and the hours the model says."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEASURED = REPO / "grading" / "bench_grading.json"


def _table():
    spec = importlib.util.spec_from_file_location("capacity_table", REPO / "bench" / "capacity_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_lab_is_measured_alone_and_in_parallel_with_full_marks():
    bench = json.loads(MEASURED.read_text())
    assert sorted(bench["labs"]) == [f"0{i}_" + n for i, n in enumerate(
        ["single_node", "ps_async", "ps_sync", "allreduce", "alexnet", "communication"], 1)]  # fmt: skip
    for lab, m in bench["labs"].items():
        for mode in ("plain", "parallel"):
            run = m[mode]
            assert run["graded"] >= 2 and not run["infrastructure_errors"] and not run["flags"], (lab, mode)
            assert m["per_submission_s"][mode] > 0


def test_the_plan_divides_by_the_elements_a_node_holds_and_the_nodes():
    table = _table()
    bench = {
        "cores": 2,
        "labs": {
            "01_x": {"cpus": 1.0, "per_submission_s": {"plain": 10.0, "parallel": 6.25}},  # 0.8 efficient two at once
            "02_y": {"cpus": 2.0, "per_submission_s": {"plain": 36.0, "parallel": 35.0}},
        },
    }
    one, two = table.rows(bench, students=360, cores=[2, 16], nodes=[1, 4])
    # Lab x: 360 x 10 s on 2 cores, two at once at 0.8 -> 0.625 h; on 16 cores, 16 at once -> 4.7 min
    assert one[4:] == ["0.6 h", "0.2 h", "5 min", "1 min"], one
    # Lab y takes 2 cores: one at a time on 2 cores (3.6 h), 8 at once on 16 (0.45 h), and 4 nodes 4x less (0.11 h)
    assert two[4:] == ["3.6 h", "0.9 h", "0.5 h", "0.1 h"], two
    assert "| 01_x | 1 |" in table.table(bench, 360, [2, 16], [1, 4])


def test_the_readme_quotes_the_plan_of_the_committed_measurements():
    table = _table()
    bench = table.merged([str(MEASURED)])
    readme = (REPO / "grading" / "README.md").read_text()
    for row in table.rows(bench, 300, [2, 16, 32], [1, 4]):
        lab = str(int(row[0][:2]))
        assert f"| {lab} | {' | '.join(row[4:])} |" in readme, row


def test_the_readme_quotes_the_slurm_measurement_and_its_ratio():
    bench = json.loads((REPO / "grading" / "bench_grading_slurm.json").read_text())
    readme = (REPO / "grading" / "README.md").read_text()
    one, many = bench["runs"]
    assert one["nodes"] == 1 and many["nodes"] == 4 and one["graded"] == many["graded"] == bench["n"]
    assert not one["flags"] and not many["flags"] and one["left"] == many["left"] == []
    for run in (one, many):
        assert f"| {run['wall_s']:.0f} s | {run['per_submission_s']:.1f} s |" in readme, run
    assert bench["per_submission_ratio"] == round(one["per_submission_s"] / many["per_submission_s"], 2)
    assert f"grade {bench['per_submission_ratio']:.2f}x faster per submission" in readme


def test_the_grading_guide_quotes_what_the_defences_cost_from_its_json():
    """grading/README.md's ratios (issue 48's grader against the main before it) are the JSON's."""
    data = json.loads((REPO / "grading" / "bench_grading_against.json").read_text())
    text = (REPO / "grading" / "README.md").read_text()
    row = "| now / before | " + " | ".join(f"{data['labs'][lab]['ratio']:.3f}" for lab in sorted(data["labs"])) + " |"
    assert row in text, row
    worst = max(v["ratio"] for v in data["labs"].values())
    assert f"At most {round((worst - 1) * 100)} % more" in text
