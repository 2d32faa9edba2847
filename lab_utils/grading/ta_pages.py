"""Pages for the TAs who grade the written answers: one per submission, each hand-graded answer
beside the student's *own* outputs it is about, as submitted (the grader re-runs every notebook
at the grading sizes, so the autograded copy shows the grader's runs, not the student's), and
its rubric.

::

    python -m lab_utils.grading ta-pages [--labs 02]      # make ta-pages
    # grading/ta/index.html: a line per submission, with the answers still to grade
    # grading/ta/<lab>/<student>.html: per answer, the question, the answer, the rubric, and the
    #   outputs of the parts it refers to and of "What you measured", as handed in

Which outputs an answer refers to is the instructor notebook's: the answer cell's
``metadata.labs.refers_to``, a list of section headings (``"Part 4"``: the cells from that
``## Part 4`` heading to the next ``##``) or nbgrader cell ids (``"setup"``); "What you
measured", the lab's summary of the student's numbers, always. ``make grades`` links each
submission's page from ``grades.csv`` (``ta_page``).

A submission is a student's file: nothing in it runs in the TA's browser. Only plain text
(escaped) and PNG images (checked, as data URIs) are shown; HTML, JavaScript, SVG and Markdown
are shown as their text (a styled table that has no text of its own: the text of its cells),
and the page forbids scripts and every request (its Content-Security-Policy).
"""

from __future__ import annotations

import base64
import binascii
import html
import json
import re
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path

from lab_utils.grading.layout import GRADING_ROOT

__all__ = ["page_path", "answers", "write", "MAX_NOTEBOOK_BYTES"]

#: A submitted notebook larger than this is not read (the hand-in service keeps them smaller)
MAX_NOTEBOOK_BYTES = 50 * 2**20
#: The summary section every answer's page shows
SUMMARY = "What you measured"
_PNG = b"\x89PNG\r\n\x1a\n"
#: the text/plain of an object with no text of its own (a pandas Styler): its HTML's text is shown instead
_OBJECT = re.compile(r"<[\w.]+ (object )?at 0x[0-9a-f]+>")
_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
_CSS = """
body { font-family: sans-serif; margin: 1.5em; }
.answer { display: grid; grid-template-columns: minmax(20em, 1fr) minmax(20em, 1.3fr); gap: 1.5em;
          border-top: 2px solid #888; padding-top: 1em; margin-top: 2em; }
pre { white-space: pre-wrap; background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 90%; }
.student { background: #eef6ff; }
.rubric { background: #fff8e6; }
img { max-width: 100%; border: 1px solid #ddd; }
.cell { margin-bottom: 1em; } .missing { color: #a00; }
"""


def page_path(root: Path | str, student: str, lab: str) -> Path:
    return Path(root) / "ta" / lab / f"{student}.html"


def _grade_id(cell: dict) -> str | None:
    meta = cell.get("metadata", {})
    return (meta.get("nbgrader") or {}).get("grade_id") if isinstance(meta, dict) else None


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _sections(cells: list[dict]) -> list[tuple[str, int, int]]:
    """(heading, first cell, end) of each ``## `` section."""
    starts = [
        (i, _source(c).split("\n", 1)[0][3:].strip())
        for i, c in enumerate(cells)
        if c.get("cell_type") == "markdown" and _source(c).startswith("## ")
    ]
    return [(h, i, starts[k + 1][0] if k + 1 < len(starts) else len(cells)) for k, (i, h) in enumerate(starts)]


def answers(source_notebook: dict) -> list[dict]:
    """The hand-graded answers of an instructor notebook: grade id, points, the question (the
    markdown before the answer), the rubric (the answer cell's text) and what it refers to."""
    cells = source_notebook["cells"]
    out = []
    for i, cell in enumerate(cells):
        meta = (cell.get("metadata") or {}).get("nbgrader") or {}
        if cell.get("cell_type") == "markdown" and meta.get("solution") and meta.get("grade"):
            question = _source(cells[i - 1]) if i else ""
            refers = list(((cell.get("metadata") or {}).get("labs") or {}).get("refers_to") or [])
            rubric = re.sub(r"^#+ (BEGIN|END) SOLUTION\s*", "", _source(cell), flags=re.M).strip()
            out.append(
                {"grade_id": meta["grade_id"], "points": meta.get("points"), "question": question.strip()}
                | {"rubric": rubric, "refers_to": [*refers, SUMMARY]}
            )
    return out


def _referred(cells: list[dict], refers_to: list[str]) -> list[tuple[str, list[dict]]]:
    """The code cells of ``cells`` each reference names, in order: (what, cells)."""
    sections = _sections(cells)
    found = []
    for ref in refers_to:
        by_id = [c for c in cells if _grade_id(c) == ref]
        if by_id:
            found.append((f"cell {ref}", by_id))
            continue
        for heading, start, end in sections:
            if heading == ref or heading.startswith(ref + " ") or heading.startswith(ref + " —"):
                found.append((heading, [c for c in cells[start:end] if c.get("cell_type") == "code"]))
                break
        else:
            found.append((ref, []))
    return found


def _png(data) -> str | None:
    if not isinstance(data, str) or len(data) > 20 * 2**20:
        return None
    try:
        raw = base64.b64decode(data.encode(), validate=False)
    except (binascii.Error, ValueError):
        return None
    return base64.b64encode(raw).decode() if raw.startswith(_PNG) else None


class _TextOf(HTMLParser):
    """The text of an HTML output (a styled table), rows on lines and cells tab-separated:
    what a TA reads of it, with nothing of its markup kept."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        elif tag in ("tr", "br", "p", "div", "li"):
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        elif tag in ("td", "th"):
            self.parts.append("\t")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)

    @classmethod
    def of(cls, markup: str) -> str:
        parser = cls()
        parser.feed(markup[: 2 * 2**20])
        parser.close()
        lines = ("".join(parser.parts)).splitlines()
        return "\n".join(line.rstrip("\t ").replace("\t", "  ") for line in lines if line.strip())


def _text(value) -> str:
    if isinstance(value, list):
        value = "".join(str(v) for v in value)
    return str(value)


def _outputs_html(cell: dict) -> str:
    """A code cell's outputs, as a TA may see them: text escaped, PNGs checked, nothing else live."""
    parts = []
    for out in cell.get("outputs") or []:
        if not isinstance(out, dict):
            continue
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(f"<pre>{html.escape(_text(out.get('text', '')))}</pre>")
        elif kind == "error":
            parts.append(
                f"<pre>{html.escape(_text(out.get('ename', '')))}: {html.escape(_text(out.get('evalue', '')))}</pre>"
            )
        elif kind in ("execute_result", "display_data"):
            data = out.get("data") or {}
            png = _png(data.get("image/png"))
            if png:
                parts.append(f'<img alt="a figure of the submission" src="data:image/png;base64,{png}">')
            elif "text/html" in data and _OBJECT.fullmatch(_text(data.get("text/plain", "")).strip() or "<x at 0x0>"):
                parts.append(
                    f"<pre>{html.escape(_TextOf.of(_text(data['text/html'])))}</pre>"
                )  # a styled table: its text
            elif "text/plain" in data:
                parts.append(f"<pre>{html.escape(_text(data['text/plain']))}</pre>")
            elif data:
                shown = ", ".join(sorted(html.escape(str(k)) for k in data))
                parts.append(f'<p class="missing">an output this page does not show ({shown})</p>')
    return "\n".join(parts)


def _read_submission(path: Path) -> tuple[dict | None, str | None]:
    try:
        if path.is_symlink() or not path.is_file():
            return None, "no notebook handed in"
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            return None, f"the notebook is larger than {MAX_NOTEBOOK_BYTES >> 20} MB: not read"
        nb = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        return None, f"not a readable notebook ({type(exc).__name__})"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, "not a notebook (no list of cells)"
    return {**nb, "cells": [c for c in nb["cells"] if isinstance(c, dict)]}, None


def page(lab: str, student: str, source_notebook: dict, submitted: Path) -> tuple[str, int]:
    """The HTML page of ``student``'s ``lab`` and how many answers it holds."""
    nb, problem = _read_submission(submitted)
    items = answers(source_notebook)
    cells = nb["cells"] if nb else []
    by_id = {_grade_id(c): c for c in cells if _grade_id(c)}
    body = [
        f"<h1>{html.escape(lab)}: {html.escape(student)}</h1>",
        f"<p>Each written answer beside the outputs it refers to, as <b>handed in</b> ({html.escape(str(submitted))}), "
        "not the grader's re-run. Judge the answer against these numbers.</p>",
    ]
    if problem:
        body.append(f'<p class="missing">{html.escape(problem)}</p>')
    for item in items:
        answer = by_id.get(item["grade_id"])
        said = _source(answer).strip() if answer is not None else ""
        left = [
            f"<h2>{html.escape(item['grade_id'])} ({item['points']} points)</h2>",
            f"<h3>Question</h3><pre>{html.escape(item['question'])}</pre>",
            "<h3>The student's answer</h3>",
            f'<pre class="student">{html.escape(said)}</pre>' if said else '<p class="missing">no answer</p>',
            f'<h3>Rubric</h3><pre class="rubric">{html.escape(item["rubric"])}</pre>',
        ]
        right = ["<h3>The student's outputs it refers to</h3>"]
        for what, refs in _referred(cells, item["refers_to"]):
            shown = [_outputs_html(c) for c in refs]
            shown = [s for s in shown if s]
            right.append(f"<h4>{html.escape(what)}</h4>")
            right += [f'<div class="cell">{s}</div>' for s in shown] or ['<p class="missing">no outputs handed in</p>']
        body.append(
            f'<section class="answer" id="{html.escape(item["grade_id"])}"><div>{"".join(left)}</div>'
            f"<div>{''.join(right)}</div></section>"
        )
    text = (
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        f"<title>{html.escape(lab)}: {html.escape(student)}</title><style>{_CSS}</style></head><body>"
        + "\n".join(body)
        + "</body></html>\n"
    )
    return text, len(items)


def write(root: Path | str = GRADING_ROOT, labs=None) -> list[Path]:
    """A page per submission under ``root/submitted`` (of ``labs``, default all) and the index."""
    from lab_utils.grading.layout import select_labs

    root = Path(root)
    submitted = root / "submitted"
    written, rows = [], []
    for lab in select_labs(labs, root):
        source = json.loads((root / "source" / lab / f"{lab}.ipynb").read_text())
        if not answers(source):
            continue
        students = sorted(p.name for p in submitted.iterdir() if (p / lab).is_dir()) if submitted.is_dir() else []
        for student in students:
            text, n = page(lab, student, source, submitted / student / lab / f"{lab}.ipynb")
            path = page_path(root, student, lab)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written.append(path)
            rows.append((lab, student, n, path.relative_to(root / "ta")))
    index = root / "ta" / "index.html"
    index.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(
        f'<tr><td>{html.escape(lab)}</td><td><a href="{html.escape(str(rel))}">{html.escape(student)}</a></td><td>{n}</td></tr>'
        for lab, student, n, rel in rows
    )
    index.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}"><title>Written answers</title>'
        f"<style>{_CSS}</style></head><body><h1>Written answers to grade</h1>"
        f"<p>{len(rows)} submissions, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC.</p>"
        f"<table><tr><th>lab</th><th>student</th><th>answers</th></tr>{lines}</table></body></html>\n"
    )
    return [*written, index]
