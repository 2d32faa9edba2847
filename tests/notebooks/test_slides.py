"""The lecture decks work in a lecture room with no internet (issue 53): ``make slides`` builds one
deck per lab, and headless Chromium, every request off this machine refused, renders every slide
of each with no failed request and no script error; a screenshot of a figure slide per deck is
checked for content. Screenshots are kept in ``out/browser/slides/`` (git-ignored).

Skipped, saying why, without Chromium or Playwright; without npm the build says how to get it
(the decks load reveal.js from the npm package ``make setup`` installs into .tools/slides)."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest

from lab_utils.grading import layout, slides

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "out" / "browser" / "slides"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if not slides.installed():  # tests never download: make setup (or make slides) installs them where npm is
        pytest.skip("the decks' npm packages are not in .tools/slides: `make slides` installs them (it needs npm)")
    out = tmp_path_factory.mktemp("slides")
    return out, slides.build(out, progress=lambda line: None)


@pytest.fixture
def browser():
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: make setup installs Debian's when it runs as root with apt-get")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (requirements/dev.in) is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"] if _root() else [])
        try:
            yield b
        finally:
            b.close()


def _root() -> bool:
    import os

    return os.geteuid() == 0


def test_make_slides_builds_one_deck_per_lab_and_loads_nothing_from_a_cdn(built):
    out, decks = built
    assert sorted(p.name for p in decks) == sorted(f"{lab}.slides.html" for lab in layout.source_labs())
    for deck in decks:
        text = deck.read_text()
        for attr in ("src", "href"):
            assert f'{attr}="http' not in text and f"{attr}='http" not in text, deck.name
        assert "lib/reveal.js/dist/reveal.js" in text and (out / "lib/reveal.js/dist/reveal.js").is_file()
    assert all(p.name in (out / "index.html").read_text() for p in decks)


def _non_blank(png: bytes) -> float:
    """The share of the screenshot's pixels that are not its most common colour."""
    from PIL import Image

    im = Image.open(io.BytesIO(png)).convert("RGB")
    colours = im.getcolors(im.width * im.height)
    return 1 - max(colours)[0] / (im.width * im.height)


def _watch(page) -> tuple[list, list, list]:
    """Refuse every request that leaves this machine; collect those, failed requests and errors.
    (Playwright passes a handler as many arguments as it takes: no defaults here.)"""
    refused, failed, errors = [], [], []

    def offline(route):
        if route.request.url.startswith(("file://", "data:")):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    def console(message):
        if message.type == "error":
            errors.append(message.text)

    page.route("**/*", offline)
    page.on("requestfailed", lambda request: failed.append(f"{request.url}: {request.failure}"))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", console)
    return refused, failed, errors


def test_every_slide_of_every_deck_renders_offline(built, browser):
    out, decks = built
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for deck in decks:
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        page = context.new_page()
        refused, failed, errors = _watch(page)
        try:
            page.goto(deck.as_uri(), wait_until="domcontentloaded")
            page.wait_for_function("window.Reveal && window.Reveal.isReady()", timeout=30_000)
            slides_ = page.evaluate(
                "() => Reveal.getSlides().map(s => { const i = Reveal.getIndices(s); return [i.h, i.v || 0]; })"
            )
            assert len(slides_) >= 6, f"{deck.name}: {len(slides_)} slides"
            figure_shot = None
            for h, v in slides_:
                page.evaluate(f"Reveal.slide({h}, {v})")
                page.wait_for_function(
                    f"(() => {{ const i = Reveal.getIndices(); return i.h === {h} && (i.v || 0) === {v}; }})()"
                )
                shown = page.evaluate(
                    """() => { const s = Reveal.getCurrentSlide();
                        const imgs = [...s.querySelectorAll('img')];
                        return {text: s.innerText.trim().length, imgs: imgs.length,
                                broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length}; }"""
                )
                assert shown["text"] > 0 or shown["imgs"] > 0, f"{deck.name}: slide {h}.{v} is empty"
                assert shown["broken"] == 0, f"{deck.name}: slide {h}.{v} has an image that did not load"
                if shown["imgs"] and figure_shot is None:
                    page.wait_for_timeout(800)  # the slide transition, for the screenshot only
                    figure_shot = page.screenshot()
                    (ARTIFACTS / f"{deck.stem}.png").write_bytes(figure_shot)
            assert figure_shot is not None, f"{deck.name}: no slide shows a figure"
            assert _non_blank(figure_shot) > 0.05, f"{deck.name}: the figure slide's screenshot is blank"
        finally:
            context.close()
        assert refused == [], f"{deck.name} asked the network for {refused}"
        assert failed == [] and errors == [], f"{deck.name}: failed requests {failed}, errors {errors}"
