"""The TAs' pages (issue 53): each written answer beside the student's own outputs it refers to, as
handed in, and its rubric; nothing a submission holds runs in the TA's browser."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import pytest

from lab_utils.grading import ta_pages

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted(p.name for p in (ROOT / "grading" / "source").iterdir() if p.is_dir())
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 16).decode()


def _source(lab: str) -> dict:
    return json.loads((ROOT / "grading" / "source" / lab / f"{lab}.ipynb").read_text())


def _section(page: str, grade_id: str) -> str:
    found = re.search(rf'<section class="answer" id="{grade_id}">(.*?)</section>', page, re.S)
    assert found, grade_id
    return found.group(1)


def test_every_written_answer_says_what_it_refers_to_and_every_reference_is_found():
    for lab in LABS:
        nb = _source(lab)
        items = ta_pages.answers(nb)
        assert items, lab
        for item in items:
            assert item["refers_to"][-1] == ta_pages.SUMMARY and len(item["refers_to"]) >= 2, (lab, item["grade_id"])
            assert "BEGIN SOLUTION" not in item["rubric"] and item["rubric"] and item["question"]
            for what, cells in ta_pages._referred(nb["cells"], item["refers_to"]):
                assert cells and all(c["cell_type"] == "code" for c in cells), (lab, item["grade_id"], what)


@pytest.fixture
def course(tmp_path):
    """A course with Lab 2's source and one submission: the release, its Part 3 cells run (a
    workers table, a figure), the answer written, and a hostile output."""
    lab = "02_ps_async"
    root = tmp_path / "grading"
    (root / "source" / lab).mkdir(parents=True)
    shutil.copy(ROOT / "grading" / "source" / lab / f"{lab}.ipynb", root / "source" / lab)
    nb = json.loads((ROOT / "labs" / lab / f"{lab}.ipynb").read_text())
    cells = nb["cells"]
    part3 = next(i for i, c in enumerate(cells) if "".join(c["source"]).startswith("## Part 3"))
    code = [c for c in cells[part3:] if c["cell_type"] == "code"]
    code[0]["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": "worker:1  59 steps  0.776 s  MINE-4711\n"}
    ]
    code[1]["outputs"] = [
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": PNG, "text/plain": "<Figure>"}},
        {
            "output_type": "display_data",
            "metadata": {},
            "data": {"text/html": "<script>steal()</script>", "text/plain": "<img src=x onerror=steal()>"},
        },
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": base64.b64encode(b"<svg/>").decode()}},
        {  # a styled table: its text/plain names an object, its cells are in the HTML
            "output_type": "execute_result",
            "metadata": {},
            "execution_count": 3,
            "data": {
                "text/html": "<table><tr><th>speedup</th><td>1.87 STYLED</td></tr><script>steal()</script></table>",
                "text/plain": "<pandas.io.formats.style.Styler at 0x7f3a2c1b>",
            },
        },
    ]
    answer = next(c for c in cells if (c["metadata"].get("nbgrader") or {}).get("grade_id") == "q1_exec_time")
    answer["source"] = "Worker 1 was shortest in my runs <b>bold</b>"
    sub = root / "submitted" / "alice" / lab
    sub.mkdir(parents=True)
    (sub / f"{lab}.ipynb").write_text(json.dumps(nb))
    (root / "submitted" / "bob" / lab).mkdir(parents=True)
    (root / "submitted" / "bob" / lab / f"{lab}.ipynb").write_text("not json")
    return root


def test_a_page_shows_the_answer_beside_the_outputs_handed_in_and_the_rubric(course):
    written = ta_pages.write(course, ["02"])
    assert {p.name for p in written} == {"alice.html", "bob.html", "index.html"}
    page = ta_pages.page_path(course, "alice", "02_ps_async").read_text()
    q1 = _section(page, "q1_exec_time")
    assert "worker:1  59 steps  0.776 s  MINE-4711" in q1  # the student's own table, from Part 3
    assert "Worker 1 was shortest in my runs &lt;b&gt;bold&lt;/b&gt;" in q1  # the answer, as text
    assert "Grading guide" in q1 and "Worth 2" in q1  # the rubric
    assert f"data:image/png;base64,{PNG}" in q1
    # nothing of the submission runs: no script, no handler, no SVG or HTML rendered
    assert "<script" not in page and "<img src=x" not in page and "PHN2Zy8+" not in page
    assert "&lt;img src=x onerror=steal()&gt;" in q1
    assert "speedup  1.87 STYLED" in q1 and "steal()</" not in page
    assert "default-src 'none'" in page
    bob = ta_pages.page_path(course, "bob", "02_ps_async").read_text()
    assert "not a readable notebook" in bob and "no answer" in bob
    index = (course / "ta" / "index.html").read_text()
    assert 'href="02_ps_async/alice.html"' in index
