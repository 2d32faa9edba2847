"""bench/expected_results.py: the graders' sheet from the memory bench's full runs, one column
per tier, with the readings the autograded questions ask for."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("expected_results", ROOT / "bench" / "expected_results.py")
expected_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(expected_results)


def _bench(path: Path, labs: dict) -> Path:
    path.write_text(json.dumps({"labs": labs}))
    return path


def _no_claims(tmp_path: Path) -> list[str]:
    """The sheet's figures alone (the labs' claims are tests/unit/test_claims.py's)."""
    (tmp_path / "none.yml").write_text("{}\n")
    return ["--claims", str(tmp_path / "none.yml")]


def test_one_column_per_tier_and_every_recorded_figure(tmp_path):
    pod = _bench(
        tmp_path / "pod.json",
        {
            "02_ps_async": {"wall_s": 75.2, "recorded": {"speedup": 1.31, "busy_cores_most_workers": 1.9}},
            "01_single_node": {"wall_s": 16.0, "recorded": {"fastest_to_target": 30, "data_source": "x"}},
            "06_communication": {"wall_s": 350.0, "recorded": {"onebit_byte_cut": 32.0, "wall_time_s": 349.0}},
        },
    )
    binder = _bench(
        tmp_path / "binder.json",
        {
            "02_ps_async": {
                "wall_s": 77.0,
                "recorded": {"speedup": 0.97},
                "scaled_down": ["[lab_utils] 4 workers do not fit"],
            }
        },
    )
    out = tmp_path / "sheet.md"
    args = ["--tier", f"Hub pod={pod}", "--tier", f"Binder={binder}", "--out", str(out), *_no_claims(tmp_path)]
    assert expected_results.main(args) == 0
    text = out.read_text()
    assert text.index("## 01_single_node") < text.index("## 02_ps_async") < text.index("## GPU node")
    assert "| figure | Hub pod | Binder |" in text
    assert "| examples/s, most workers / fewest | 1.31 | 0.97 |" in text
    assert "| cores kept busy, most workers | 1.9 | – |" in text  # not recorded on that tier
    assert "| Q2: batch fastest to the target | 30 | – |" in text
    assert "[lab_utils] 4 workers do not fit" in text and "data_source" not in text and "wall_time_s" not in text
    assert "| onebit cuts the bytes by (x) | 32 | – |" in text


def test_an_update_replaces_only_the_labs_measured_again(tmp_path):
    first = _bench(
        tmp_path / "first.json",
        {
            "01_single_node": {"wall_s": 16.0, "recorded": {"fastest_to_target": 30}},
            "02_ps_async": {"wall_s": 75.2, "recorded": {"speedup": 1.31}},
        },
    )
    sheet = tmp_path / "sheet.md"
    args = ["--tier", f"pod={first}", "--out", str(sheet), "--note", "First measured.", *_no_claims(tmp_path)]
    assert expected_results.main(args) == 0
    again = _bench(
        tmp_path / "again.json",
        {"02_ps_async": {"wall_s": 80.0, "recorded": {"run_bytes_predicted": 8.4e6, "run_bytes_measured_2": 9.3e6}}},
    )
    args = ["--tier", f"pod={again}", "--update", str(sheet), "--out", str(sheet), "--note", "Lab 2 again."]
    args += _no_claims(tmp_path)
    assert expected_results.main(args) == 0
    text = sheet.read_text()
    assert "| Q2: batch fastest to the target | 30 |" in text  # Lab 1 kept
    assert "examples/s, most workers" not in text  # Lab 2 replaced
    assert "| Prediction 1: bytes of the whole run, measured, 2 worker(s) | 9,300,000 |" in text
    assert text.index("First measured.") < text.index("Lab 2 again.") < text.index("## 01_single_node")
    assert text.index("## 02_ps_async") < text.index("## GPU node") and text.count("## GPU node") == 1


def test_a_file_that_is_not_a_bench_output_is_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert expected_results.main(["--tier", f"x={bad}"]) == 2
    assert "not an output of bench/bench_lab_memory.py" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        expected_results.main(["--tier", "no-equals-sign"])
