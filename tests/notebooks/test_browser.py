"""The labs as students meet them: JupyterLab from `make lab`, in a real browser (headless
Chromium driven by Playwright), every cell run through the UI.

- Lab 1 as a student hands it in (the release with the solutions filled in) and Lab 2's
  instructor notebook, both with the CI parameters: no cell shows an error or stderr, every
  figure the text promises is there, and Lab 2's live metrics view changes while its
  cluster trains;
- Lab 3's Part 4 (its setup, its script and its backup-worker runs, the CI parameters): its
  timelines draw the critical path over the bars and say what each wait was for;
- the Interrupt button stops a training cluster, and nothing is left running;
- JupyterLab stops on Ctrl-C, and nothing of it, its kernels, clusters or TensorBoard is left.

Screenshots are kept in ``out/browser/`` (git-ignored) as artefacts. Skipped, saying why,
when there is no Chromium (``make setup`` installs Debian's when it runs as root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest
from support import crafted, make_lab
from support.poll import poll_for

from lab_utils.grading import layout

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "out" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
STDERR = "application/vnd.jupyter.stderr"


def _write(nb, path: Path, params: dict) -> Path:
    """``nb`` with ``params`` injected after its parameters cell, as papermill does."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    nbformat.write(parameterize_notebook(load_notebook_node(str(path)), params), path)
    return path


INTERRUPT_SOURCE = """from lab_utils.grading import reference_script
from lab_utils.training.ps import runs as ps_runs
# a run far longer than this test waits: the Interrupt button must stop it
ps_runs.run_ps(reference_script("02_ps_async", "train_async.py"), workers=2,
               args={"epochs": 200, "eval_every": 0}, live=True)
"""


@pytest.fixture(scope="module")
def notebooks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser") / "labs"
    ci = {lab: layout.lab_settings(lab)["ci"] for lab in ("01_single_node", "02_ps_async")}
    lab1 = _write(
        crafted.correct("01_single_node"), folder / "01_single_node" / "01_single_node.ipynb", ci["01_single_node"]
    )
    source = nbformat.read(layout.source_notebook("02_ps_async"), as_version=4)
    lab2 = _write(source, folder / "02_ps_async" / "02_ps_async.ipynb", ci["02_ps_async"])
    stop = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(INTERRUPT_SOURCE)])
    stop.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    interrupt = folder / "interrupt.ipynb"
    nbformat.write(stop, interrupt)
    lab3 = nbformat.read(layout.source_notebook("03_ps_sync"), as_version=4)
    lab3.cells = [c for c in lab3.cells if _in_part4(c)]
    lab3 = _write(lab3, folder / "03_ps_sync" / "03_ps_sync.ipynb", layout.lab_settings("03_ps_sync")["ci"])
    shutil.copy2(ROOT / "labs" / "README.md", folder / "README.md")
    return folder, {"lab1": lab1, "lab2": lab2, "interrupt": interrupt, "lab3": lab3}


def _in_part4(cell) -> bool:
    """Lab 3's cells that Part 4's timelines need: parameters, setup, the script, check_updates,
    the backup-worker runs and their timelines."""
    meta = cell.get("metadata", {})
    tags, grade_id = set(meta.get("tags", [])), meta.get("nbgrader", {}).get("grade_id")
    if grade_id in ("parameters", "setup", "train_sync", "check_updates") or "timeline" in tags:
        return True
    return "long-run" in tags and "replicas_to_aggregate" in cell.source and "backup_runs" in cell.source


def _descendants(pid: int) -> list[str]:
    try:
        return [" ".join(p.cmdline())[:150] for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _stray(folder: Path) -> list[str]:
    """Processes anywhere (orphans included) started for these notebooks: kernels, cluster
    tasks, TensorBoard."""
    needles = (str(folder), "train_async.py", "tensorboard.main")
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if any(n in cmd for n in needles) and p.pid != os.getpid():  # (their paths hold "pytest-of-...")
            found.append(f"{p.pid}: {cmd[:150]}")
    return found


@pytest.fixture(scope="module")
def jupyterlab(notebooks, tmp_path_factory):
    folder, _ = notebooks
    home = tmp_path_factory.mktemp("lab-home")
    settings = home / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)
    # every cell in the page (not only those scrolled into view), so the test can read them all
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    log = home / "lab.log"
    env = dict(
        os.environ,
        NOTEBOOKS=str(folder),
        PORT="",
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(home / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"),
        LABS_OFFLINE="1",  # the kernels and their tasks use the MNIST sample: never a download
    )
    proc, found = make_lab.start(log, env)
    try:
        base, _, token = found.groups()
        yield base, token, proc
    finally:
        make_lab.stop(proc)  # Ctrl-C, as a student stops it
    text = log.read_text(errors="replace")
    assert "Traceback" not in text, text[-3000:]
    poll_for(lambda: not _stray(folder), 30, f"every kernel, task and server to exit: {_stray(folder)}")


@pytest.fixture(scope="module")
def playwright_api():
    if CHROMIUM is None:
        pytest.skip("no chromium on PATH: make setup installs Debian's when it runs as root with apt-get")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (requirements/dev.in) is not installed")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        yield pw


@pytest.fixture
def browser(playwright_api, jupyterlab):
    """A browser for one test; when it ends, its notebooks' kernels are shut down, as a
    student closing them would (Kernel > Shut Down), and the browser is closed."""
    # as root (CI) Chromium refuses to start without --no-sandbox
    b = playwright_api.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"] if os.geteuid() == 0 else [])
    try:
        yield b
    finally:
        b.close()
        _shut_down_kernels(*jupyterlab[:2])


def _api(base: str, token: str, path: str, method: str = "GET"):
    req = urllib.request.Request(f"{base}{path}", method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        body = resp.read()
    return json.loads(body) if body else None


def _shut_down_kernels(base: str, token: str) -> None:
    for kernel in _api(base, token, "/api/kernels"):
        _api(base, token, f"/api/kernels/{kernel['id']}", method="DELETE")


def _open(browser, jupyterlab, path: Path, folder: Path):
    base, token, _ = jupyterlab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(
        f"{base}/lab/tree/{path.relative_to(folder).as_posix()}?token={token}&reset"
    )  # a fresh workspace: only this document open
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=60_000)
    poll_for(lambda: _kernel_idle(page), 120, "the kernel to start")
    return page


def _kernel_idle(page) -> bool:
    return page.evaluate(
        "() => { const s = document.querySelector('.jp-Notebook-ExecutionIndicator');"
        " return !!s && s.getAttribute('data-status') === 'idle'; }"
    )


def _run_all(page, tries: int = 3) -> None:
    """Run > Run All Cells, clicked again when no cell has started 15 s later: a fresh
    clone's CI once left the interrupt notebook unrun (saved with no execution count)
    after a click JupyterLab had not taken while it settled the just-opened document."""
    for _ in range(tries):
        dialog = page.locator(".jp-Dialog")
        if dialog.count():  # a modal dialog takes every click: say what it asks
            page.screenshot(path=str(ARTIFACTS / "dialog.png"), full_page=True)
            raise AssertionError(f"a dialog is open before Run All Cells: {dialog.first.inner_text()!r}")
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile("^Run$")).click()
        page.locator('li.lm-Menu-item[data-command="runmenu:run-all"]').click()
        try:  # a queued or running cell shows [*], a finished one [n]: not the unrun [ ]
            poll_for(lambda: any(p != "[ ]:" for p in _prompts(page)), 15, "a cell to start")
            return
        except AssertionError:
            page.keyboard.press("Escape")  # close the menu if it is still open
    raise AssertionError(f"Run > Run All Cells started no cell in {tries} tries")


def _prompts(page) -> list[str]:
    return page.eval_on_selector_all(".jp-CodeCell .jp-InputArea-prompt", "els => els.map(e => e.textContent.trim())")


def _finished(page) -> bool:
    prompts = _prompts(page)
    return bool(prompts) and all(re.fullmatch(r"\[\d+\]:", p) for p in prompts) and _kernel_idle(page)


def _problems(page) -> list[str]:
    """Text of every stderr or error output on the page."""
    return page.eval_on_selector_all(f'[data-mime-type="{STDERR}"]', "els => els.map(e => e.textContent.slice(0, 300))")


def _tagged(path: Path, tag: str, but: str | None = None) -> list[int]:
    cells = nbformat.read(path, as_version=4).cells
    return [
        i for i, c in enumerate(cells) if tag in c.metadata.get("tags", []) and but not in c.metadata.get("tags", [])
    ]


def _figure_cells_without_image(page, path: Path) -> list[int]:
    tagged = _tagged(path, "figure", but="timeline")  # a timeline is interactive here: _timeline_bars()
    has_image = page.eval_on_selector_all(
        ".jp-Notebook .jp-Cell", "els => els.map(e => !!e.querySelector('.jp-OutputArea img'))"
    )
    return [i for i in tagged if i >= len(has_image) or not has_image[i]]


def _timeline_bars(page, path: Path) -> dict[int, int]:
    """Per cell tagged ``timeline``: the bars its interactive Plotly figure drew (0: none)."""
    bars = page.eval_on_selector_all(
        ".jp-Notebook .jp-Cell", "els => els.map(e => e.querySelectorAll('.js-plotly-plot .barlayer .point').length)"
    )
    return {i: bars[i] if i < len(bars) else 0 for i in _tagged(path, "timeline")}


def _run_notebook(browser, jupyterlab, notebooks, key: str, timeout: float, during=None):
    folder, paths = notebooks
    page = _open(browser, jupyterlab, paths[key], folder)
    _run_all(page)
    if during is not None:
        during(page)
    poll_for(lambda: _finished(page), timeout, f"every cell of {paths[key].name} to run")
    page.screenshot(path=str(ARTIFACTS / f"{key}.png"), full_page=True)
    return page, paths[key]


def test_the_course_map_opens_rendered(browser, jupyterlab, notebooks):
    folder, _ = notebooks
    base, token, _ = jupyterlab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(f"{base}/lab/tree/README.md?token={token}&reset")  # a fresh workspace: only this document open
    heading = page.locator(".jp-RenderedMarkdown h1").first  # a Markdown preview, not the text editor
    heading.wait_for(timeout=60_000)
    assert "Course map" in heading.inner_text()
    assert page.locator(".jp-RenderedMarkdown table a").count() >= 5  # one link per lab
    page.screenshot(path=str(ARTIFACTS / "course-map.png"))
    page.close()


def test_lab1_as_a_student_hands_it_in_runs_clean_with_its_figures(browser, jupyterlab, notebooks):
    page, path = _run_notebook(browser, jupyterlab, notebooks, "lab1", 300)
    assert _problems(page) == []
    assert _figure_cells_without_image(page, path) == []
    assert page.locator("iframe").count() >= 1  # live TensorBoard, served on a free port
    page.close()


def test_lab2_shows_its_metrics_live_while_the_cluster_trains(browser, jupyterlab, notebooks):
    frames = []

    def watch_live_view(page):
        # Monitor.live(): an ipywidgets Image drawn when the cluster starts, redrawn while it trains and
        # once more when it stops, so the first view's picture must change
        live = page.locator(".widget-image").first
        live.wait_for(timeout=240_000)
        first = live.get_attribute("src")
        live.screenshot(path=str(ARTIFACTS / "lab2-live-1.png"))
        poll_for(lambda: live.get_attribute("src") != first, 120, "the live metrics view to redraw")
        live.screenshot(path=str(ARTIFACTS / "lab2-live-2.png"))
        frames.extend([first, live.get_attribute("src")])

    page, path = _run_notebook(browser, jupyterlab, notebooks, "lab2", 600, during=watch_live_view)
    assert len(frames) == 2 and frames[0] != frames[1]
    assert _problems(page) == []
    assert _figure_cells_without_image(page, path) == []
    # the straggler's timeline, interactive: Plotly's bars drawn in the page (its JavaScript from
    # JupyterLab's jupyterlab-plotly extension: the page is offline), a bar per step and part
    timeline = page.locator(".jp-Cell .js-plotly-plot").first
    timeline.scroll_into_view_if_needed()
    timeline.screenshot(path=str(ARTIFACTS / "lab2-timeline.png"))
    bars = _timeline_bars(page, path)
    assert len(bars) == 1 and min(bars.values()) > 20, bars
    page.close()


def test_lab3_timelines_draw_the_critical_path_and_name_what_each_wait_was_for(browser, jupyterlab, notebooks):
    page, path = _run_notebook(browser, jupyterlab, notebooks, "lab3", 300)
    assert _problems(page) == []
    # each run's figure: Plotly's bars, and over them the critical path's (a trace of its own, black)
    drawn = page.eval_on_selector_all(
        ".jp-Cell .js-plotly-plot",
        """plots => plots.map(gd => ({
            path: (gd.data || []).filter(t => t.name === 'critical path').map(t => t.x.length),
            black: [...gd.querySelectorAll('.barlayer .point path')].filter(p => p.style.fill === 'rgb(17, 17, 17)').length,
            bars: gd.querySelectorAll('.barlayer .point').length}))""",
    )
    page.locator(".jp-Cell .js-plotly-plot").first.screenshot(path=str(ARTIFACTS / "lab3-critical-path.png"))
    assert len(drawn) == 2 and all(d["path"] and d["path"][0] > 0 and d["black"] > 0 for d in drawn), drawn
    assert all(d["bars"] > d["black"] > 0 for d in drawn), drawn  # the path over the timeline's own bars
    # and under the R = N run's: worker:0 waited for the straggler's injected delay, first of its causes
    text = page.locator(".jp-Cell").nth(_tagged(path, "timeline")[0]).inner_text()
    assert re.search(r"worker:0 waited [0-9.]+ s: [0-9.]+ s for worker:1: injected delay", text), text[-2000:]
    page.close()


def test_the_interrupt_button_stops_a_training_cluster(browser, jupyterlab, notebooks):
    folder, paths = notebooks
    page = _open(browser, jupyterlab, paths["interrupt"], folder)
    _run_all(page)
    kernel = poll_for(lambda: _training_kernel(), 120, "the cluster's tasks to start")
    label = page.locator(".widget-html-content", has_text="metrics running")  # the live view's own line
    poll_for(lambda: _samples(label) >= 6, 120, "the live view to show the cluster training")
    page.locator('.jp-NotebookPanel-toolbar [data-jp-item-name="interrupt"]').first.click()  # the square button
    poll_for(lambda: _finished(page), 60, "the interrupted cell to end")
    page.screenshot(path=str(ARTIFACTS / "interrupt.png"), full_page=True)
    assert "KeyboardInterrupt" in page.inner_text(".jp-OutputArea")
    poll_for(lambda: not [c for c in _descendants(kernel) if "train_async.py" in c], 30, "the cluster to stop")
    assert not [s for s in _stray(folder) if "train_async.py" in s]  # no orphan either
    page.close()


def _samples(label) -> int:
    found = re.search(r"metrics running: (\d+) samples", label.inner_text()) if label.count() else None
    return int(found.group(1)) if found else 0


def _training_kernel() -> int | None:
    """The kernel whose cluster is training (its workers wrote step events)."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        if "ipykernel_launcher" in " ".join(p.info["cmdline"] or []):
            if sum("train_async.py" in c for c in _descendants(p.pid)) >= 3:  # the PS and two workers
                return p.pid
    return None
