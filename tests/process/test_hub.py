"""A class on a real JupyterHub (tests/support/hub.py): a real Hub and proxy, three students
and an instructor who are real Unix users, each server started by LimitedSpawner as its user
in a cgroup of the class's limits, and the hand-in service. Students hand in from their
kernels; the instructor collects and returns feedback from theirs; no student can read,
overwrite or signal another's work; when the Hub stops nothing of theirs is left (processes,
users, cgroups, files)."""

from __future__ import annotations

import csv
import io
import json
import pwd
import re
import time
import warnings
from pathlib import Path

import pytest
from support import crafted
from support import hub as local_hub

from lab_utils.grading.sandbox import own_cgroup_v1

NB = {
    "cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": "x = 1"}],
    "metadata": {},
    "nbformat": 4,
    "nbformat_minor": 5,
}


def _labhub_cgroups() -> list[Path]:
    found = []
    for ctrl in ("memory", "pids", "cpu"):
        try:
            found += own_cgroup_v1(ctrl).glob("labhub-*")
        except OSError:
            continue
    return found + list(Path("/sys/fs/cgroup").glob("labhub-*"))


@pytest.fixture(scope="module")
def hub():
    before = _labhub_cgroups()
    made = local_hub.start(students=3)
    if isinstance(made, str):
        pytest.skip(made)
    try:
        made.start_servers([*made.students, *made.instructors])  # once: each test uses them
    except BaseException:
        made.close()
        raise
    yield made
    started = time.monotonic()
    left = made.close()
    assert left == [], left
    assert _labhub_cgroups() == before, "cgroups left by the students' servers"
    took = time.monotonic() - started
    if took > 15:  # 3-5 s alone, 32 s within the full suite: where it goes (a diagnosis, not a limit)
        warnings.warn(f"the Hub's teardown took {took:.0f} s: {made.close_phases}", stacklevel=1)


def _server_pid(hub, name) -> int:
    import psutil

    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        if (
            p.info["uids"]
            and p.info["uids"].real == hub.users[name].uid
            and "jupyterhub.singleuser" in " ".join(p.info["cmdline"] or [])
        ):
            return p.pid
    raise AssertionError(f"no server process of {name}: {hub.processes_of(name)}")


def _loaded(path: Path) -> dict:
    """A Hub configuration file as JupyterHub loads it, in the Hub's environment, flattened:
    {(section, trait): value}, functions by name."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(path.name, path=str(path.parent)).load_config()
    return {
        (section, trait): getattr(value, "__qualname__", value)
        for section in config
        for trait, value in config[section].items()
    }


def test_the_harness_is_the_shipped_configuration_with_ports_paths_a_login_and_timeouts(hub, monkeypatch):
    """Issue 50: the test runs the class the docs set up. Its Hub loads the shipped
    configuration, which reads the class (who may log in, the instructors, the servers' Python and
    PATH, TMPDIR, the default URL); the harness adds only its ports, its paths, a test login and
    client, timeouts and the servers' environment for the test's venv. Also checked in the running
    Hub's own environment."""
    for key, value in hub.hub_env().items():
        monkeypatch.setenv(key, value)
    shipped = _loaded(local_hub.SHIPPED)
    harness = _loaded(hub.base / "jupyterhub_config.py")
    added = {}
    for key in sorted(set(shipped) | set(harness)):
        if shipped.get(key) == harness.get(key):
            continue
        section, trait = key
        was, now = shipped.get(key), harness.get(key)
        if key == ("Spawner", "environment"):
            assert was.items() <= now.items() and set(now) - set(was) <= local_hub.HARNESS_ENV, (was, now)
        elif key in {("JupyterHub", "services"), ("JupyterHub", "load_roles")}:
            assert now[: len(was)] == was and [x["name"] for x in now[len(was) :]] == ["tester"], now
        else:
            assert trait in local_hub.HARNESS_SETTINGS.get(section, ()), f"the harness sets {section}.{trait}"
        added[key] = now
    assert shipped[("Authenticator", "allowed_users")] == {*hub.students, *hub.instructors}
    assert shipped[("Spawner", "cmd")] == [str(hub.course / ".venv" / "bin" / "python"), "-m", "jupyterhub.singleuser"]
    assert "git-pull?repo=" in shipped[("Spawner", "default_url")], shipped[("Spawner", "default_url")]
    assert ("JupyterHub", "port") in added  # the comparison sees what the harness sets
    # the running Hub's environment: the one it was started from, and where the class is and the ports
    hub_env = dict(
        line.split("=", 1) for line in Path(f"/proc/{hub.proc.pid}/environ").read_text().split("\0") if "=" in line
    )
    changed = {k for k in hub_env if hub.started_in.get(k) != hub_env[k]}
    assert changed <= local_hub.HUB_ENV, changed


def test_each_students_server_runs_as_that_user_within_the_class_limits(hub):
    """As deploy/single-machine/jupyterhub_config.py sets them: 2 GB (and 1 CPU, 512 tasks)."""
    a = hub.students[0]
    pid = _server_pid(hub, a)
    groups = Path(f"/proc/{pid}/cgroup").read_text()
    assert "labhub-" in groups, groups
    limits = [
        int((p / f).read_text())
        for p in _labhub_cgroups()
        if p.name.startswith(f"labhub-{a}-")
        for f in ("memory.limit_in_bytes", "memory.max")
        if (p / f).exists()
    ]
    assert limits == [2 * 2**30], limits  # deploy/single-machine/jupyterhub_config.py's 2G
    out = hub.run_code(a, "import os; print(os.getuid(), os.path.expanduser('~'))")
    assert out.split() == [str(hub.users[a].uid), str(hub.users[a].home)]


def test_students_servers_have_no_nbgrader_instructor_tools_and_instructors_do(hub):
    """The setup's jupyter-student/ configuration: a student's server serves no formgrader (nor
    nbgrader's other server extensions), an instructor's does."""
    import urllib.error
    import urllib.request

    def status(name: str) -> int:
        req = urllib.request.Request(
            f"{hub.url}/user/{name}/formgrader", headers={"Authorization": f"token {hub.users[name].token}"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:  # a 5xx too: the page is there
            return exc.code

    assert status(hub.students[0]) == 404
    assert status(hub.instructors[0]) != 404


def test_students_hand_in_from_their_kernels_and_see_only_their_own_feedback(hub):
    a, b, c = hub.students
    prof = hub.instructors[0]
    for name in (a, b):
        nb = {**NB, "cells": [{**NB["cells"][0], "source": f"who = {name!r}"}]}
        hub.upload(name, "01_single_node.ipynb", nb)
        out = hub.run_code(name, "from lab_utils.hub import hand_in; r = hand_in()", notebook="01_single_node.ipynb")
        assert f"Handed in 01_single_node.ipynb for 01_single_node as {name} at" in out, out
    # the instructor collects from their own kernel, grades elsewhere, and returns feedback
    code = (
        "from lab_utils.hub import collect, return_feedback\n"
        "import pathlib\n"
        "got = collect('01_single_node', 'submitted')\n"
        "for r in got:\n"
        "    f = pathlib.Path('feedback', r.key, '01_single_node'); f.mkdir(parents=True)\n"
        "    (f / '01_single_node.html').write_text(f'<p>for {r.student} only</p>')\n"
        "print(sorted(return_feedback('01_single_node', 'feedback')))\n"
    )
    out = hub.run_code(prof, code)
    assert "collected 01_single_node: 2 hand-in(s)" in out and str(sorted([a, b])) in out, out
    got = json.loads((hub.users[prof].home / "submitted" / a / "01_single_node" / "01_single_node.ipynb").read_text())
    assert "".join(got["cells"][0]["source"]) == f"who = {a!r}"
    for name in (a, b):
        out = hub.run_code(
            name, "from lab_utils.hub import feedback; [print(p.read_text()) for p in feedback('01_single_node')]"
        )
        assert f"<p>for {name} only</p>" in out and out.count("only") == 1, out
    # a student is no instructor, and has nothing to fetch before handing in
    out = hub.run_code(
        c,
        "from lab_utils.hub import feedback, collect, HandInRefused\nprint(feedback('01_single_node'))\ntry:\n    collect('01_single_node', 'x')\nexcept HandInRefused as e:\n    print(e)",
    )
    assert "No feedback for 01_single_node yet." in out and "is not an instructor" in out, out


def test_no_student_reaches_another_students_work(hub):
    a, b = hub.students[:2]
    victim_home, store = hub.users[a].home, hub.store
    victim_server = _server_pid(hub, a)
    code = f"""
import os, signal
for path in [{str(victim_home)!r}, {str(victim_home / "01_single_node.ipynb")!r}, {str(store)!r}]:
    try:
        os.listdir(path) if os.path.isdir(path) else open(path).read()
        print('READ', path)
    except (PermissionError, NotADirectoryError) as e:
        print('refused', type(e).__name__)
try:
    os.kill({victim_server}, signal.SIGTERM)
    print('SIGNALLED')
except PermissionError:
    print('refused signal')
"""
    out = hub.run_code(b, code)
    assert "READ" not in out and "SIGNALLED" not in out and out.count("refused") == 4, out
    # nor through the service: whatever b sends is b's, and b's feedback holds nothing of a's
    out = hub.run_code(b, "from lab_utils.hub import whoami; print(whoami()['user'])")
    assert out.strip() == b
    # the service runs as an account of its own, which alone owns the store (not root, no student)
    service = [p for p in hub.processes_of(hub.service_user) if "lab_utils.hub.service" in p]
    assert service and hub.store.stat().st_uid == pwd.getpwnam(hub.service_user).pw_uid, service
    assert oct(hub.store.stat().st_mode & 0o777) == "0o700"


LAB1, LAB2 = "01_single_node", "02_ps_async"
LAB2_PATH = f"course-labs/labs/{LAB2}/{LAB2}.ipynb"
#: a student's Lab 2 run, as its cells do it (papermill's smaller sizes): the parameters, the
#: setup, the student's own training script (%%writefile), then one cluster of 1 PS + 1 worker
RUN_LAB2 = f"""
import json, pathlib
cells = {{c["metadata"].get("nbgrader", {{}}).get("grade_id"): "".join(c["source"])
          for c in json.loads(pathlib.Path("{LAB2}.ipynb").read_text())["cells"]}}
exec(cells["parameters"])
WORKERS, EPOCHS, OFFLINE = [1], 1, True
exec(cells["setup"])
get_ipython().run_cell(cells["train_async"])
run = ps_runs.run_ps("train_async.py", workers=1, args=RUN_ARGS, interval=MONITOR_INTERVAL, hosts=HOSTS,
                     progress=False, label="mine")
print("LAB2", run.final_global_step, run.results["worker:0"]["target_global_steps"], f"{{run.accuracy:.3f}}")
"""


def _solve(nb: dict, lab: str) -> dict:
    """``nb`` (a notebook as the contents API gives it) with every solution cell written as the
    student would: the instructor's solution, marked as the student's own."""
    import nbformat

    source, _ = crafted.paths(lab)
    answers = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in nbformat.read(source, as_version=4).cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    for cell in nb["cells"]:
        gid = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if cell["cell_type"] == "code" and gid in answers:
            magic, body = answers[gid].partition("\n")[::2] if answers[gid].startswith("%%") else ("", answers[gid])
            cell["source"] = f"{magic}\n# my answer\n{body}" if magic else f"# my answer\n{body}"  # %% stays first
    return nb


def _contents(hub, name: str, path: str) -> dict:
    return hub.request("GET", f"/user/{name}/api/contents/{path}", token=hub.users[name].token)["content"]


#: A cell a student adds to read what the grader holds: its environment, the instructor's home,
#: the grading course and the machine's first process's environment.
PROBE = """import os
tag = "PROBE" + "-"  # the outputs say PROBE-..., the source never does
print(tag + "ENV", sorted(os.environ))
for p in {paths!r}:
    try:
        print(tag + "READ", p, os.listdir(p) if os.path.isdir(p) else open(p, "rb").read()[:300])
    except Exception as e:
        print(tag + "REFUSED", p, type(e).__name__)
"""


def _hand_in(hub, name: str, kind: str, extra: str | None = None) -> str:
    """``name`` saves Lab 1 as ``kind`` (tests/support/crafted.py), with a cell ``extra``, and
    hands it in from a kernel of their own; the receipt it printed."""
    import nbformat

    path = f"course-labs/labs/{LAB1}/{LAB1}.ipynb"
    nb = json.loads(nbformat.writes(crafted.craft(kind, LAB1)))
    if extra:
        nb["cells"].append(
            {"cell_type": "code", "metadata": {}, "source": extra, "outputs": [], "execution_count": None}
        )
    hub.upload(name, path, nb)
    out = hub.run_code(name, f"from lab_utils.hub import hand_in; hand_in({path!r})")
    assert f"Handed in {LAB1}.ipynb for {LAB1} as {name}" in out, out
    return out


def _ran(steps: list[tuple[int, str]]) -> str:
    """The terminal's output of each step, every one of which exited 0."""
    assert all(rc == 0 for rc, _ in steps), "\n----\n".join(f"rc {rc}: {out[-3000:]}" for rc, out in steps)
    return "\n".join(out for _, out in steps)


@pytest.mark.browser
def test_a_student_logs_in_opens_lab1_runs_its_first_cells_and_hands_in_through_the_ui(hub):
    """Headless Chromium, as a student, from their first login: the Hub's login page, the class's
    nbgitpuller link (the default URL) that pulls the labs and opens the course map, Lab 1 from the file browser's path, its first cells run with
    Shift+Enter, then a cell typed into it that hands it in. The service has it, as theirs."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH: make setup installs Debian's when it runs as root with apt-get")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (requirements/dev.in) is not installed")

    c = hub.students[2]
    assert not (hub.users[c].home / "course-labs").exists()  # their first visit: the link pulls the labs
    shots = Path(__file__).resolve().parents[2] / "out" / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])  # root (CI): no sandbox
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{hub.url}/hub/login")
            page.fill("#username_input", c)
            page.fill("#password_input", hub.password)
            page.click("#login_submit")
            # the default URL: the class's nbgitpuller link, which pulls the labs, then the course map
            page.wait_for_url(f"**/user/{c}/lab/**", timeout=120_000)
            # opened rendered (the course's JupyterLab overrides), with the course map's title
            page.locator(".jp-RenderedMarkdown h1", has_text="Course map").wait_for(timeout=120_000)
            page.screenshot(path=str(shots / "hub-course-map.png"))
            page.goto(f"{hub.url}/user/{c}/lab/tree/course-labs/labs/01_single_node/01_single_node.ipynb")
            page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
            page.wait_for_function(
                "() => document.querySelector('.jp-Notebook-ExecutionIndicator')?.getAttribute('data-status') === 'idle'",
                timeout=120_000,
            )
            _run_first_cells(page, hub, c)
            tracebacks = page.locator(".jp-OutputArea-output", has_text="Traceback").count()
            # the hand-in, as labs/README.md tells it: save, then a cell that hands the notebook in
            page.keyboard.press("Control+s")
            page.keyboard.press("Escape")
            page.keyboard.press("b")  # a new cell below the one the student is at
            page.keyboard.press("Enter")
            page.keyboard.type("from lab_utils.hub import hand_in\nhand_in()")
            page.keyboard.press("Control+s")
            page.keyboard.press("Shift+Enter")
            receipt = page.locator(".jp-OutputArea-output", has_text="Handed in 01_single_node.ipynb")
            receipt.wait_for(timeout=120_000)
            text = receipt.inner_text()
            page.screenshot(path=str(shots / "hub-hand-in.png"))
        except BaseException:
            page.screenshot(path=str(shots / "hub-failed.png"))
            raise
        finally:
            browser.close()
            hub.shut_down_kernels(c)  # as Kernel > Shut Down would
    assert f"for 01_single_node as {c} at" in text, text
    assert tracebacks == 0
    handed = sorted((hub.store / "submitted" / c / "01_single_node").iterdir())
    assert handed, "the service has no hand-in of theirs"
    kept = json.loads((handed[-1] / "01_single_node.ipynb").read_text())
    assert kept["cells"][0]["source"][0].startswith("# Lab 1"), kept["cells"][0]  # Lab 1, as last saved


@pytest.mark.timeout(1500)
def test_a_term_release_work_hand_in_grade_return_fix_and_a_late_hand_in(hub):
    """The whole term on the class the setup laid out (deploy/README.md, "A class on one
    machine"). Three students pull the labs from the class's public repository with its
    nbgitpuller link, solve Lab 2 and run its cluster, all three at once, each from their own
    server, importing the course's lab_utils that is all they may read of it. They hand in Lab 1:
    one solved, one untouched (and hostile), then the instructor sets the due time in the class's
    due file from a terminal of their own server, and the third hands in, partly solved and late.
    In that terminal the instructor collects (and sees `make autograde` refuse there), asks the
    grading service to grade, reads the export, and returns the feedback: the late flag agrees
    in the receipt, the results, the feedback and the LMS export. Then they fix a typo in Lab 2
    and publish it (make release, make student-repo): it reaches every student with every cell
    they wrote."""
    import threading

    import nbformat

    students, prof = hub.students, hub.instructors[0]
    home = hub.users[prof].home
    public = hub.student_repo
    for name in students:
        hub.git_pull(name, str(public), "course-labs")  # what the class's link does at each start
        solved = _solve(_contents(hub, name, LAB2_PATH), LAB2)
        hub.upload(name, LAB2_PATH, solved)
    written = sorted("".join(c["source"]) for c in solved["cells"] if "# my answer\n" in "".join(c["source"]))

    # Lab 2's cluster, three students at once
    outs: dict = {}

    def lab2(name):
        try:
            outs[name] = hub.run_code(name, RUN_LAB2, notebook=LAB2_PATH, timeout=600)
        except RuntimeError as exc:
            outs[name] = f"ERROR {exc}"

    threads = [threading.Thread(target=lab2, args=(n,)) for n in students]
    for t in threads:
        t.start()
    for t in threads:
        t.join(660)
    for name in students:
        line = next((ln for ln in outs.get(name, "").splitlines() if ln.startswith("LAB2 ")), "")
        assert line and int(line.split()[1]) >= int(line.split()[2]) > 0, (name, outs.get(name))
    lab_utils_used = hub.run_code(students[0], "import os, lab_utils; print(os.path.realpath(lab_utils.__file__))")
    assert lab_utils_used.strip().startswith(str(hub.course / "lab_utils")), lab_utils_used

    # Lab 1: two on time (solved; untouched and reading what it can), the due time, one late
    a, b, c = students
    probe = PROBE.format(paths=[str(home), str(hub.grader_course), str(hub.grader_work), "/proc/1/environ"])
    assert "(LATE)" not in _hand_in(hub, a, "correct") + _hand_in(hub, b, "blank", extra=probe)
    due = hub.class_dir / "course.yml"  # the term's schedule: Lab 1 gets a due time of its own, now
    _ran(hub.terminal(prof, [
        f'sed "s/^  {LAB1}:$/  {LAB1}:\\n    due: $(date -u +%Y-%m-%dT%H:%M:%S.%6N+00:00)/" {due} > ~/course.yml'
        f" && grep -q '^    due: ' ~/course.yml && cat ~/course.yml > {due}",
    ]))  # fmt: skip
    assert "(LATE)" in _hand_in(hub, c, "partly")

    # the instructor, in a terminal of their own server
    collected, refused = hub.terminal(prof, [
        f"python -m lab_utils.hub collect {LAB1} handins",
        f"(cd {hub.course} && make autograde SUBMISSIONS=$HOME/handins)",
    ])  # fmt: skip
    assert collected[0] == 0 and f"collected {LAB1}: 3 hand-in(s)" in collected[1] and ", 1 late" in collected[1], (
        collected
    )
    assert refused[0] != 0 and "no sandbox here" in refused[1] and "JUPYTERHUB_API_TOKEN" in refused[1], refused
    assert "/source (every solution" in refused[1], refused
    shown = _ran(hub.terminal(prof, [
        f"python -m lab_utils.hub grade {LAB1}",
        f"python -m lab_utils.hub return {LAB1} grading-{LAB1}/feedback",
    ], timeout=1200))  # fmt: skip
    assert f"returned {LAB1} feedback to 3 student(s)" in shown, shown[-3000:]
    graded = home / f"grading-{LAB1}"
    table = list(csv.reader(io.StringIO((graded / "canvas.csv").read_text())))
    assert table[0][5:] == [LAB1, "Late"], table
    auto = sum(crafted.test_points(LAB1).values())  # the rest are written answers, graded by hand
    assert float(table[1][5]) > auto, table  # Points Possible counts them
    got = {row[3]: (float(row[5]), row[6]) for row in table[2:]}
    assert got[a] == (auto, "") and got[b] == (0.0, ""), (table, shown[-3000:])  # solved; untouched
    assert 0 < got[c][0] < auto and got[c][1] == LAB1, (table, shown[-3000:])  # partly solved, and late
    late = {
        n: [f["kind"] for f in json.loads((graded / "results" / n / f"{LAB1}.json").read_text())["flags"]]
        for n in students
    }
    assert ["late" in late[n] for n in students] == [False, False, True], late

    # each student reads their own feedback, and only theirs
    for name in students:
        got = hub.run_code(
            name, f"from lab_utils.hub import feedback; [print(p.read_text()) for p in feedback({LAB1!r})]"
        )
        others = [s for s in students if s != name]
        assert name in got and not any(s in got for s in others), (name, got[:2000])
    page = f"print(open('feedback/{LAB1}/{LAB1}.html').read())"
    assert "after the due time" in hub.run_code(c, page) and "after the due time" not in hub.run_code(a, page)
    # the hostile hand-in ran in the grading service's sandbox: no token, no Hub variable, nothing
    # of the instructor's or of the course's
    probed = hub.run_code(b, page)
    assert "PROBE-ENV" in probed and probed.count("PROBE-REFUSED") == 4 and "PROBE-READ" not in probed, probed[-3000:]
    assert "JUPYTERHUB" not in probed and hub.users[prof].token not in probed and "TOKEN" not in probed

    # the instructor fixes a typo in Lab 2 and publishes it, from their terminal; every student
    # pulls; nothing is lost
    source = hub.grader_course / "source" / LAB2 / f"{LAB2}.ipynb"
    fix = (
        f"python -c \"import nbformat as n; p = '{source}'; nb = n.read(p, 4); "
        "c = next(c for c in nb.cells if c.cell_type == 'markdown'); "
        "c.source = c.source.replace(chr(10), ' (corrected)' + chr(10), 1); n.write(nb, p)\""
    )
    _ran(hub.terminal(prof, [fix, f"(cd {hub.course} && make release && make student-repo DEST={public})"]))
    nb = nbformat.read(public / "labs" / LAB2 / f"{LAB2}.ipynb", as_version=4)
    for name in students:
        hub.git_pull(name, str(public), "course-labs")
        after = _contents(hub, name, LAB2_PATH)
        sources = ["".join(c["source"]) for c in after["cells"]]
        assert any("(corrected)" in s for s in sources), f"the fix did not reach {name}"
        mine = sorted(s for s in sources if "# my answer\n" in s)
        assert mine == written and len(after["cells"]) == len(nb.cells), f"a cell {name} wrote was lost or changed"


def test_no_student_connects_to_another_students_running_cluster(hub):
    """A's cluster (a PS and a worker, in a private network of A's own user namespace) runs while B,
    from a kernel of B's own on the same machine, tries every one of its ports: all refused."""
    import threading
    import time

    fake = Path(__file__).resolve().parents[1] / "fixtures" / "cluster_task.py"
    a, b = hub.students[:2]
    home = hub.users[a].home
    code_a = f"""
import json, pathlib, time
from lab_utils.cluster import TFCluster
home = pathlib.Path.home()
args = {{"steps": 10**6, "step-time": 0.05}}
with TFCluster(ps=1, workers=1, script={str(fake)!r}, args=args, memory_per_task=50 * 2**20, progress=False) as c:
    (home / "cluster.json").write_text(json.dumps({{"kind": c.network.kind, "ports": [t.port for t in c.tasks]}}))
    deadline = time.monotonic() + 120
    while not (home / "probed").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
print("cluster ended", c.network.kind)
"""
    out_a: dict = {}

    def run_a():
        try:
            out_a["out"] = hub.run_code(a, code_a, timeout=240)
        except RuntimeError as exc:
            out_a["error"] = exc

    thread = threading.Thread(target=run_a)
    thread.start()
    try:
        deadline = time.monotonic() + 180
        while not (home / "cluster.json").exists():
            assert thread.is_alive() and time.monotonic() < deadline, out_a
            time.sleep(0.2)  # polling for A's cluster, under a deadline
        cluster = json.loads((home / "cluster.json").read_text())
        probe = f"""
import socket
for port in {cluster["ports"]!r}:
    with socket.socket() as s:
        s.settimeout(5)
        print(port, "CONNECTED" if s.connect_ex(("127.0.0.1", port)) == 0 else "refused")
"""
        out_b = hub.run_code(b, probe)
    finally:
        (home / "probed").touch()
        thread.join(240)
    assert cluster["kind"] == "private" and len(cluster["ports"]) == 2, cluster
    assert "CONNECTED" not in out_b and out_b.count("refused") == 2, out_b
    assert "error" not in out_a and "cluster ended private" in out_a["out"], out_a


def _run_first_cells(page, hub, name: str, deadline_s: float = 240) -> None:
    """Lab 1's first cells run from the UI: the title, the parameters, the imports, with
    Shift+Enter. An execution JupyterLab sends as its kernel connects may be lost (a cell
    left at [*], or the parameters never run and the imports failing on their names): when
    the kernel is idle for 3 s and the two code cells have not both run, press again, as a
    student would. (A fixed minute's wait for them cost the full suite 60 s.)"""
    prompts = "() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')].map(p => p.textContent)"
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        page.locator(".jp-Notebook .jp-Cell").first.click()
        for _ in range(3):
            page.keyboard.press("Shift+Enter")
        idle_since = None
        while time.monotonic() < deadline:
            shown = page.evaluate(prompts)
            if sum(bool(re.search(r"\[\d+\]", t)) for t in shown) >= 2 and not any("[*]" in t for t in shown):
                return
            kernels = hub.request("GET", f"/user/{name}/api/kernels", token=hub.users[name].token)
            if any(k["execution_state"] != "idle" for k in kernels):
                idle_since = None
            elif idle_since is None:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > 3:
                break  # the kernel has nothing to run: the presses were lost
            time.sleep(0.3)  # polling the page and the server's kernel state, under the deadline
    raise AssertionError(
        f"Lab 1's first cells never ran through the UI within {deadline_s:.0f} s: {page.evaluate(prompts)[:4]}"
    )
