"""What the students read names only what they have: every file and ``lab_utils`` module the
student-facing text mentions is in the student repository (``make student-repo``), and each lab
cites the reading list's entries it reproduces (issue 52)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from lab_utils.grading import student_repo

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted(p.name for p in (ROOT / "labs").iterdir() if (p / f"{p.name}.ipynb").exists())
#: a path into the course's folders, as text names one (`bench/x.py`, grading/settings.yml, ../READING.md)
PATH = re.compile(
    r"(?<![\w/.-])((?:\.\./)*(?:bench|grading|tests|deploy|lab_utils|labs|scripts|binder|requirements|shared)/[\w./-]*\w"
    r"|\.\./[\w.-]+\.(?:md|py|ipynb|yml|json|txt))"
)
MODULE = re.compile(r"(?<![\w/.])(lab_utils(?:\.\w+)+)")


def student_texts(root: Path = ROOT) -> dict[str, tuple[str, str]]:
    """Each text a student reads: {name: (its folder in the repository, the text)}."""
    texts = {}
    for lab in LABS:
        nb = json.loads((root / "labs" / lab / f"{lab}.ipynb").read_text())
        texts[f"labs/{lab}/{lab}.ipynb"] = (f"labs/{lab}", "\n".join("".join(c["source"]) for c in nb["cells"]))
    for name, folder in (
        ("labs/README.md", "labs"),
        ("labs/READING.md", "labs"),
        ("deploy/student-repo/README.md", ""),
    ):
        texts[name] = (folder, (root / name).read_text())
    return texts


def dangling(text: str, folder: str, exported: set[str]) -> list[str]:
    """The paths and modules ``text`` (read in ``folder``) names that ``exported`` lacks."""
    folders = {str(p) for f in exported for p in Path(f).parents}
    out = []
    for found in PATH.finditer(text):
        name = found[1]
        resolved = os.path.normpath(os.path.join(folder, name)) if name.startswith("..") else name
        if resolved not in exported and resolved not in folders:
            out.append(name)
    for found in MODULE.finditer(text):
        parts = found[1].split(".")
        if not any(
            "/".join(parts[:i]) + ".py" in exported or "/".join(parts[:i]) + "/__init__.py" in exported
            for i in range(len(parts), 1, -1)
        ):
            out.append(found[1])
    return out


@pytest.fixture(scope="module")
def exported() -> set[str]:
    return set(student_repo.files(ROOT))


def test_no_student_text_names_a_file_the_student_repository_lacks(exported):
    problems = {name: dangling(text, folder, exported) for name, (folder, text) in student_texts().items()}
    assert {k: v for k, v in problems.items() if v} == {}


def test_the_check_finds_what_issue_52_named(exported):
    text = (
        "`bench/bench_sync_hang_loop.py` runs 20 runs; limits in `grading/settings.yml`; see ../../shared/seeds/x.txt;"
        " `lab_utils.no_such_module` and `lab_utils.data.load_mnist`; [list](../READING.md)"
    )
    assert dangling(text, "labs/03_ps_sync", exported) == [
        "bench/bench_sync_hang_loop.py",
        "grading/settings.yml",
        "../../shared/seeds/x.txt",
        "lab_utils.no_such_module",
    ]


READING = re.compile(r"^- \*\*\[([^\]]+)\]\*\*", re.M)
CITED = re.compile(r"\*\*Reading\*\* \(\[`READING\.md`\]\(\.\./READING\.md\)[^)]*\): ((?:\[[^\]]+\](?:, )?)+)\.")


def test_each_lab_cites_the_reading_list_entries_it_uses():
    entries = READING.findall((ROOT / "labs" / "READING.md").read_text())
    assert {"CS 744", "SNU-1", "SNU-2", "Thesis", "Slides"} <= set(entries)
    assert {"1-bit SGD", "SSP", "Parallax", "Horovod", "Large minibatch"} <= set(entries)
    used = set()
    for lab in LABS:
        first = "".join(json.loads((ROOT / "labs" / lab / f"{lab}.ipynb").read_text())["cells"][0]["source"])
        cited = CITED.search(" ".join(first.split()))
        assert cited, f"{lab}: the first cell has no **Reading** line linking ../READING.md"
        names = re.findall(r"\[([^\]]+)\]", cited[1])
        assert set(names) <= set(entries), f"{lab} cites {sorted(set(names) - set(entries))}, not in READING.md"
        used |= set(names)
    assert used == set(entries), f"READING.md entries no lab cites: {sorted(set(entries) - used)}"
