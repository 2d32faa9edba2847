"""The lecture decks' sources (issue 53): one per lab, each covering the mechanism the lab
measures, the seed result it reproduces and the questions to ask before the lab, with the
instructor's notes; their figures the labs' own, taken by the tool (never edited by hand) and
current with the decks. The decks rendered in a browser offline: tests/notebooks/test_slides.py."""

from __future__ import annotations

import base64
import json

import nbformat
import pytest

from lab_utils.grading import layout, slides

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def _decks() -> dict[str, nbformat.NotebookNode]:
    return {p.stem: nbformat.read(p, as_version=4) for p in slides.decks()}


def test_every_lab_has_a_deck():
    assert sorted(_decks()) == layout.source_labs()


@pytest.mark.parametrize("lab", layout.source_labs())
def test_each_deck_covers_the_mechanism_the_seed_and_the_questions_before_the_lab(lab):
    nb = _decks()[lab]
    nbformat.validate(nb)
    kinds = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
    assert None not in kinds, f"{lab}: cell {kinds.index(None)} has no slide metadata"
    assert kinds[0] == "slide" and "notes" in kinds, lab
    titles = [c.source.splitlines()[0].lower() for c in nb.cells if c.cell_type == "markdown" and c.source]
    assert any("mechanism" in t for t in titles), f"{lab}: no slide on the mechanism"
    assert any("seed" in t for t in titles), f"{lab}: no slide on the seed result it reproduces"
    assert any("before the lab" in t for t in titles), f"{lab}: no questions to ask before the lab"
    figures = slides.deck_figures(nb)
    assert figures and all(ref["lab"] == lab for _, ref in figures), f"{lab}: its own lab's figures"
    for i, _ in figures:
        assert nb.cells[i].cell_type == "code" and not nb.cells[i].outputs, f"{lab}: cell {i} is filled at build"


def test_every_figure_a_deck_shows_was_taken_by_the_tool_and_is_current():
    manifest = json.loads((slides.FIGURES / "figures.json").read_text())
    shown = {slides.figure_name(ref) for nb in _decks().values() for _, ref in slides.deck_figures(nb)}
    assert shown == set(manifest["figures"]), "take the figures again: make slides FIGURES_FROM=... TIER=..."
    for nb in _decks().values():
        for _, ref in slides.deck_figures(nb):
            assert slides.load_figure(ref).startswith(b"\x89PNG")
    assert manifest["tier"] and manifest["commit"] and manifest["taken"]


def _executed(folder, lab, cell_id, n_figures):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("plot()")
    cell.id = cell_id
    cell.outputs = [
        nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(PNG).decode()})
        for _ in range(n_figures)
    ]
    nb.cells = [cell]
    nbformat.write(nb, folder / f"{lab}.ipynb")


def _deck(folder, lab, cell_id, output=0):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("# figure")
    cell.metadata["labs"] = {"figure": {"lab": lab, "cell": cell_id, "output": output}}
    cell.metadata["slideshow"] = {"slide_type": "slide"}
    nb.cells = [cell]
    nbformat.write(nb, folder / f"{lab}.ipynb")


def test_figures_are_taken_from_executed_notebooks_with_their_hashes(tmp_path):
    decks, runs, out = tmp_path / "decks", tmp_path / "runs", tmp_path / "figures"
    decks.mkdir(), runs.mkdir()
    _deck(decks, "03_ps_sync", "abc12345", output=1)
    _executed(runs, "03_ps_sync", "abc12345", n_figures=2)
    manifest = slides.take_figures(runs, tier="a test", folder=decks, out=out, commit="deadbee")
    assert list(manifest["figures"]) == ["03_ps_sync/abc12345-1.png"] and manifest["commit"] == "deadbee"
    ref = {"lab": "03_ps_sync", "cell": "abc12345", "output": 1}
    assert slides.load_figure(ref, out) == PNG
    (out / "03_ps_sync" / "abc12345-1.png").write_bytes(PNG + b"edited")
    with pytest.raises(LookupError, match="not the figure its manifest recorded"):
        slides.load_figure(ref, out)


def test_one_labs_figures_are_taken_again_and_the_others_kept_as_they_were(tmp_path):
    """A lab that joins the course: its figures alone, on the tier the others were taken on."""
    decks, first, later, out = tmp_path / "decks", tmp_path / "first", tmp_path / "later", tmp_path / "figures"
    for folder in (decks, first, later):
        folder.mkdir()
    _deck(decks, "03_ps_sync", "abc12345")
    _executed(first, "03_ps_sync", "abc12345", n_figures=1)
    slides.take_figures(first, tier="pod", folder=decks, out=out, commit="aaaaaaa")
    before = (out / "03_ps_sync" / "abc12345-0.png").read_bytes()
    _deck(decks, "07_model_parallel", "def67890")
    _executed(later, "07_model_parallel", "def67890", n_figures=1)  # no Lab 3 in this run
    with pytest.raises(LookupError, match="03_ps_sync.ipynb does not exist"):
        slides.take_figures(later, tier="pod", folder=decks, out=out)
    with pytest.raises(ValueError, match="would mix two tiers"):
        slides.take_figures(later, tier="binder", folder=decks, out=out, labs=["07"])
    manifest = slides.take_figures(later, tier="pod", folder=decks, out=out, commit="bbbbbbb", labs=["07"])
    assert sorted(manifest["figures"]) == ["03_ps_sync/abc12345-0.png", "07_model_parallel/def67890-0.png"]
    assert manifest["commit"] == "aaaaaaa" and manifest["labs"]["07_model_parallel"]["commit"] == "bbbbbbb"
    assert (out / "03_ps_sync" / "abc12345-0.png").read_bytes() == before
    for lab, cell in (("03_ps_sync", "abc12345"), ("07_model_parallel", "def67890")):
        assert slides.load_figure({"lab": lab, "cell": cell, "output": 0}, out) == PNG
    with pytest.raises(LookupError, match="no deck shows a figure of 08"):
        slides.take_figures(later, tier="pod", folder=decks, out=out, labs=["08"])


def test_a_figure_the_run_did_not_draw_is_refused_naming_the_cell(tmp_path):
    decks, runs = tmp_path / "decks", tmp_path / "runs"
    decks.mkdir(), runs.mkdir()
    _deck(decks, "03_ps_sync", "abc12345", output=2)
    _executed(runs, "03_ps_sync", "abc12345", n_figures=2)
    kept = tmp_path / "figures"
    (kept / "03_ps_sync").mkdir(parents=True)
    (kept / "figures.json").write_text("{}")
    (kept / "03_ps_sync" / "abc12345-0.png").write_bytes(PNG)
    with pytest.raises(LookupError, match=r"figure 2 of 03_ps_sync's cell abc12345; .* has 2 figure\(s\) there"):
        slides.take_figures(runs, tier="t", folder=decks, out=kept)
    assert sorted(p.name for p in kept.rglob("*")) == ["03_ps_sync", "abc12345-0.png", "figures.json"], "kept whole"
    (runs / "03_ps_sync.ipynb").unlink()
    with pytest.raises(LookupError, match="03_ps_sync.ipynb does not exist"):
        slides.take_figures(runs, tier="t", folder=decks, out=tmp_path / "figures")


def test_an_install_cut_short_is_not_taken_for_a_whole_one(tmp_path, monkeypatch):
    """The marker is written after npm ci succeeded: a failed install leaves none."""
    tools = tmp_path / "tools"
    monkeypatch.setattr(slides.shutil, "which", lambda name: "/bin/false")
    monkeypatch.setattr(
        slides.subprocess, "run", lambda *a, **k: slides.subprocess.CompletedProcess(a, 1, "", "network down")
    )
    with pytest.raises(RuntimeError, match="network down"):
        slides.install_libraries(tools=tools)
    assert (tools / "package-lock.json").is_file() and not slides.installed(tools)


def test_without_npm_the_build_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(slides.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"no npm here: install Node.js"):
        slides.install_libraries(tools=tmp_path / "tools")
