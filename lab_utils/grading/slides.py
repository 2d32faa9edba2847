"""The lecture decks: one slides notebook per lab (``slides/<lab>.ipynb``), rendered to reveal.js
with Jupyter's own slides export, for a lecture room with no internet.

::

    python -m lab_utils.grading slides                   # make slides: slides/build/index.html
    python -m lab_utils.grading slides --figures-from DIR --tier "..."   # the figures from executed labs

Each deck is markdown cells with slide metadata (``slideshow.slide_type``: ``slide``,
``subslide``, ``fragment``, ``notes`` for what the instructor says), and figure cells: a code
cell whose ``metadata.labs.figure`` names a lab, one of its cells and which of that cell's
figures (``{"lab": "03_ps_sync", "cell": "1e383b67", "output": 0}``). The figures are not copied
by hand: ``--figures-from`` takes them from the labs' notebooks as a run executed them (the
reference tier's: ``bench/bench_lab_memory.py --full --stand-ins --keep-notebooks DIR``) into
``slides/figures/``, with a manifest (``figures.json``: the run, the commit, each figure's
SHA-256). A build fills every figure cell from there, and refuses a figure the manifest lacks or
whose bytes differ from it.

Nothing a deck loads comes from the network: reveal.js, require.js and jQuery are the npm
packages pinned in ``slides/package-lock.json``, installed into ``.tools/slides`` (``npm ci``, on
first use) and copied next to the decks; the figures are inside the HTML; MathJax and Mermaid,
which the stock template fetches from a CDN, are left out (the decks write no TeX).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import html
import json
import platform
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from lab_utils import resources
from lab_utils.grading import results
from lab_utils.grading.layout import REPO_ROOT

__all__ = ["BUILD", "DECKS", "FIGURES", "build", "deck_figures", "decks", "take_figures"]

#: The slides notebooks, the figures they show, and what a build writes
DECKS = REPO_ROOT / "slides"
FIGURES = DECKS / "figures"
BUILD = DECKS / "build"
#: Where ``npm ci`` installs the pinned packages (slides/package-lock.json)
TOOLS = REPO_ROOT / ".tools" / "slides"
TEMPLATE = Path(__file__).resolve().parent / "templates" / "slides"
#: what a deck loads, from the installed packages: (package file, path beside the decks)
LIBRARIES = (
    ("reveal.js/dist", "lib/reveal.js/dist"),
    ("reveal.js/plugin/notes", "lib/reveal.js/plugin/notes"),
    ("requirejs/require.js", "lib/require.js"),
    ("jquery/dist/jquery.min.js", "lib/jquery.min.js"),
)


def decks(folder: Path = DECKS) -> list[Path]:
    """The slides notebooks, in the labs' order (their names are the labs')."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def deck_figures(nb: dict) -> list[tuple[int, dict]]:
    """``(cell index, {"lab", "cell", "output"})`` of each figure cell of a deck."""
    out = []
    for i, cell in enumerate(nb["cells"]):
        ref = cell.get("metadata", {}).get("labs", {}).get("figure")
        if ref is not None:
            if not (isinstance(ref, dict) and {"lab", "cell"} <= set(ref)):
                raise ValueError(f"cell {i}: labs.figure must name a lab and a cell, got {ref!r}")
            out.append((i, {"lab": ref["lab"], "cell": ref["cell"], "output": int(ref.get("output", 0))}))
    return out


def figure_name(ref: dict) -> str:
    return f"{ref['lab']}/{ref['cell']}-{ref['output']}.png"


def _png_outputs(cell: dict) -> list[bytes]:
    return [
        base64.b64decode(out["data"]["image/png"])
        for out in cell.get("outputs", [])
        if "image/png" in out.get("data", {})
    ]


def take_figures(
    executed: Path,
    *,
    tier: str,
    folder: Path = DECKS,
    out: Path = FIGURES,
    commit: str | None = None,
    labs: Sequence[str] | None = None,
) -> dict:
    """Copy every figure the decks show from the executed lab notebooks in ``executed``
    (``<lab>.ipynb`` each) into ``out``, and write its manifest. Raises ``LookupError`` naming
    the deck, the lab's cell and the notebook when a figure is not there (a cell that drew
    fewer figures, a lab not run).

    ``labs`` (names or their prefixes, ``["07"]``): take only those labs' figures, and keep the
    others' as the manifest has them (a lab that joins the course, or changed, without running
    every lab again). Their run must be the manifest's ``tier``; the manifest records when and
    at which commit each lab taken apart was taken (``labs``)."""
    wanted: dict[str, dict] = {}
    for deck in decks(folder):
        for _, ref in deck_figures(json.loads(deck.read_text())):
            wanted.setdefault(figure_name(ref), {**ref, "deck": deck.name})
    kept: dict[str, bytes] = {}
    earlier: dict = {}
    if labs is not None:
        earlier, kept = _kept_figures(wanted, labs, tier, out)
        wanted = {name: ref for name, ref in wanted.items() if name not in kept}
    notebooks: dict[str, dict] = {}
    taken: dict[str, bytes] = {}  # every figure found before anything is replaced: a refusal keeps `out` whole
    for name, ref in sorted(wanted.items()):
        path = Path(executed) / f"{ref['lab']}.ipynb"
        if ref["lab"] not in notebooks:
            if not path.is_file():
                raise LookupError(f"{ref['deck']} shows a figure of {ref['lab']}, and {path} does not exist")
            notebooks[ref["lab"]] = json.loads(path.read_text())
        cell = next((c for c in notebooks[ref["lab"]]["cells"] if c.get("id") == ref["cell"]), None)
        pngs = _png_outputs(cell) if cell is not None else []
        if ref["output"] >= len(pngs):
            raise LookupError(
                f"{ref['deck']} shows figure {ref['output']} of {ref['lab']}'s cell {ref['cell']}; "
                f"{path} has {len(pngs)} figure(s) there{'' if cell is not None else ' (no such cell)'}"
            )
        taken[name] = pngs[ref["output"]]
    today = datetime.date.today().isoformat()
    commit = commit or (results.provenance()["lab_utils_commit"] or "unknown")[:7]
    machine = f"{platform.machine()}, {resources.usable_cores()} CPUs, Python {platform.python_version()}"
    if out.exists():
        shutil.rmtree(out)
    for name, png in {**kept, **taken}.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(png)
    figures = {name: hashlib.sha256(png).hexdigest() for name, png in sorted({**kept, **taken}.items())}
    manifest = {
        "about": "The labs' own figures the lecture decks show, taken from executed notebooks by "
        "`python -m lab_utils.grading slides --figures-from DIR`; never edited by hand.",
        "tier": tier,
        "taken": earlier.get("taken", today),
        "commit": earlier.get("commit", commit),
        "machine": earlier.get("machine", machine),
        "figures": figures,
    }
    if labs is not None:  # the labs taken apart from the rest, and when
        apart = dict(earlier.get("labs", {}))
        for lab in sorted({ref["lab"] for ref in wanted.values()}):
            apart[lab] = {"taken": today, "commit": commit, "machine": machine}
        manifest["labs"] = dict(sorted(apart.items()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _kept_figures(wanted: dict[str, dict], labs: Sequence[str], tier: str, out: Path) -> tuple[dict, dict[str, bytes]]:
    """(the manifest in ``out``, the figures of ``wanted`` not of ``labs``, as it holds them):
    what :func:`take_figures` keeps when it takes only some labs' figures again."""
    earlier = json.loads((out / "figures.json").read_text()) if (out / "figures.json").is_file() else {}
    if earlier.get("tier") != tier:
        raise ValueError(
            f"the figures in {out} were taken on {earlier.get('tier')!r}; taking some labs' again from "
            f"{tier!r} would mix two tiers in one deck set: take every lab's (no labs)"
        )
    chosen = {name for name, ref in wanted.items() if any(ref["lab"].startswith(lab) for lab in labs)}
    if not chosen:
        raise LookupError(f"no deck shows a figure of {', '.join(labs)}")
    kept = {}
    for name in sorted(set(wanted) - chosen):
        if name not in earlier["figures"] or not (out / name).is_file():
            raise LookupError(f"{name} is not in {out}: take every lab's figures (no labs)")
        kept[name] = (out / name).read_bytes()
    return earlier, kept


def load_figure(ref: dict, figures: Path = FIGURES) -> bytes:
    """A figure's PNG, checked against the manifest (``LookupError`` saying how to make it)."""
    manifest_path = figures / "figures.json"
    how = "take them from an executed run: python -m lab_utils.grading slides --figures-from DIR"
    if not manifest_path.is_file():
        raise LookupError(f"no {manifest_path}: {how}")
    manifest = json.loads(manifest_path.read_text())
    name = figure_name(ref)
    path = figures / name
    if name not in manifest["figures"] or not path.is_file():
        raise LookupError(f"figure {name} is not in {figures} (a deck changed since they were taken): {how}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != manifest["figures"][name]:
        raise LookupError(f"{path} is not the figure its manifest recorded (edited by hand?): {how}")
    return data


def installed(tools: Path = TOOLS, folder: Path = DECKS) -> bool:
    """Whether the pinned packages of ``folder``'s lock are installed whole in ``tools``."""
    marker = tools / "installed.lock"
    return marker.is_file() and marker.read_bytes() == (folder / "package-lock.json").read_bytes()


def install_libraries(tools: Path = TOOLS, folder: Path = DECKS) -> Path:
    """The pinned npm packages, installed into ``tools`` with ``npm ci`` when they are not yet
    (or the lock changed); returns their ``node_modules``."""
    lock = folder / "package-lock.json"
    modules = tools / "node_modules"
    if installed(tools, folder):
        return modules
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "the decks load reveal.js from an installed npm package, and there is no npm here: "
            "install Node.js (20 or later), then run make slides again"
        )
    tools.mkdir(parents=True, exist_ok=True)
    marker = tools / "installed.lock"  # written last: a cut-short install is never taken for a whole one
    marker.unlink(missing_ok=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy2(folder / name, tools / name)
    command = [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--silent"]
    try:
        run = subprocess.run(command, cwd=tools, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"npm ci in {tools} took over 10 minutes: is the npm registry reachable?") from None
    if run.returncode != 0:
        raise RuntimeError(f"npm ci in {tools} failed ({run.returncode}):\n{run.stderr.strip()[-2000:]}")
    shutil.copy2(lock, marker)
    return modules


def build(
    out: Path = BUILD,
    *,
    folder: Path = DECKS,
    figures: Path = FIGURES,
    labs: Iterable[str] | None = None,
    progress: Callable[[str], None] = print,
) -> list[Path]:
    """Render each deck to ``out/<lab>.slides.html`` beside the libraries it loads, and an
    ``index.html`` that lists them; returns the decks' paths."""
    import nbformat
    from nbconvert import SlidesExporter

    modules = install_libraries(folder=folder)
    labs = None if labs is None else set(labs)
    chosen = [d for d in decks(folder) if labs is None or d.stem in labs]
    if not chosen:
        raise LookupError(f"no slides notebook in {folder}" + (f" for {', '.join(labs)}" if labs else ""))
    out.mkdir(parents=True, exist_ok=True)
    for package_path, target in LIBRARIES:
        src, dst = modules / package_path, out / target
        if not src.exists():
            raise RuntimeError(f"{src} is missing from the installed packages: remove {TOOLS} and build again")
        if dst.exists():
            shutil.rmtree(dst) if dst.is_dir() else dst.unlink()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
    exporter = SlidesExporter(
        template_name="slides",
        extra_template_basedirs=[str(TEMPLATE.parent)],
        reveal_url_prefix="lib/reveal.js",
        reveal_theme="white",
        reveal_number="c/t",
        require_js_url="lib/require.js",
        jquery_url="lib/jquery.min.js",
        exclude_input=True,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    written = []
    for deck in chosen:
        nb = nbformat.read(deck, as_version=4)
        for i, ref in deck_figures(nb):
            png = base64.b64encode(load_figure(ref, figures)).decode()
            nb.cells[i].outputs = [
                nbformat.v4.new_output("display_data", data={"image/png": png, "text/plain": figure_name(ref)})
            ]
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": _title(nb, deck)}})
        path = out / f"{deck.stem}.slides.html"
        path.write_text(body)
        written.append(path)
        progress(f"wrote {path}")
    (out / "index.html").write_text(_index(sorted(out.glob("*.slides.html")), figures))  # earlier builds' too
    return written


def _title(nb, deck: Path) -> str:
    return nb.metadata.get("title") or deck.stem


def _index(paths: list[Path], figures: Path) -> str:
    manifest = json.loads((figures / "figures.json").read_text()) if (figures / "figures.json").is_file() else {}
    items = "\n".join(f'<li><a href="{html.escape(p.name)}">{html.escape(p.stem[:-7])}</a></li>' for p in paths)
    where = html.escape(
        f"{manifest.get('tier', '?')}, {manifest.get('taken', '?')}, commit {manifest.get('commit', '?')}"
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>Lecture decks</title></head>\n'
        f"<body><h1>Lecture decks</h1>\n<ul>\n{items}\n</ul>\n"
        f"<p>The figures are the labs' own, from the run: {where}. Press <kbd>s</kbd> in a deck for the "
        "speaker's notes, <kbd>Esc</kbd> for the overview.</p></body></html>\n"
    )
