"""What a class meets, checked without Docker or a Kubernetes cluster (deploy/README.md).

- Binder follows repo2docker's conventions and installs the same lock as every other way in;
- the student image's build context, computed with Docker's own .dockerignore rules, and the
  installed ``lab_utils`` package hold no solution and no hidden test; the instructor image
  adds the course; every nbgrader plugin the images switch exists;
- the Zero to JupyterHub values fit the labs' largest default cluster by lab_utils' own rule,
  and offer the instructor image to instructors only.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import urllib.parse
import zipfile
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml

from lab_utils.grading import leaks
from lab_utils.training.ps import runs as ps_runs

ROOT = Path(__file__).resolve().parents[2]
TF_PIN = "2.21.0"  # the default stack's (scripts/stacks.sh)
DEPLOY = ROOT / "deploy"


# ---------------------------------------------------------------------- Binder and the lock
def test_binder_follows_repo2docker_conventions():
    binder = ROOT / "binder"
    # once binder/ exists repo2docker ignores the root; an environment.yml here would win over requirements.txt
    assert not (binder / "environment.yml").exists()
    assert (binder / "runtime.txt").read_text().strip() == "python-3.12"
    assert {"openmpi-bin", "libopenmpi-dev", "g++", "iproute2"} <= set((binder / "apt.txt").read_text().split())
    post = binder / "postBuild"
    text = post.read_text()
    assert os.access(post, os.X_OK) and text.startswith("#!/usr/bin/env bash")
    assert re.search(r"^set -e", text, re.M), "postBuild must stop at the first failing step"
    assert not re.search(r"\b(sudo|apt-get)\b", text), "postBuild runs as the notebook user, without root"
    assert "pip install" in text and "scripts/build-horovod.sh" in text
    assert text.index("scripts/stack-keras.sh") < text.index("scripts/build-horovod.sh"), "tf-keras before Horovod"
    start = binder / "start"
    code = [line for line in start.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert os.access(start, os.X_OK) and code[-1].strip() == 'exec "$@"'


def _requirement_names(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.add(re.split(r"[<>=!\[ ]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_every_way_in_installs_the_same_locked_stack():
    ways = {
        "make setup": ROOT / "scripts" / "setup.sh",
        "binder": ROOT / "binder" / "requirements.txt",
        "conda": ROOT / "environment.yml",
        "student image": DEPLOY / "student" / "Dockerfile",
    }
    # make setup's stack, by default: its entry in scripts/stacks.sh (setup.sh sources it)
    stacks = (ROOT / "scripts" / "stacks.sh").read_text()
    default = stacks[stacks.index("\n  2.21)") :].split(";;", 1)[0]
    for way, path in ways.items():
        text = path.read_text() + (default if way == "make setup" else "")
        assert "constraints.txt" in text and "base.in" in text, f"{way} ({path.name}) does not install the lock"
        code = "\n".join(
            line for line in text.splitlines() if not line.lstrip().startswith("#")
        )  # not how to build 2.15
        pins = set(re.findall(r"tensorflow(?:-cpu|\[and-cuda\])?==([\d.]+)", code)) | set(
            re.findall(r"TF_VERSION=([\d.]+)", code)
        )
        assert pins == {TF_PIN}, f"{way} pins TensorFlow {pins}"
        assert "dev.in" not in text or way == "make setup", f"{way} installs the test tools"
        if way in ("binder", "conda", "student image"):  # tf-keras and TF_USE_LEGACY_KERAS, where setup.sh is not run
            keras = (ROOT / "binder" / "postBuild").read_text() if way == "binder" else text
            assert "scripts/stack-keras.sh" in keras, f"{way} does not give the stack its Keras"
    for lock, make in (("constraints.txt", "make lock"), ("constraints-2.15.txt", "make lock STACK=2.15")):
        locked = {
            line.split("==")[0].lower().replace("_", "-")
            for line in (ROOT / "requirements" / lock).read_text().splitlines()
            if "==" in line
        }
        for name in ("base.in", "dev.in"):
            missing = _requirement_names(ROOT / "requirements" / name) - locked
            assert not missing, f"requirements/{name} names {missing}, which {lock} does not pin: run {make}"


#: each stack's lock, and the oldest Python of its version the course runs on (scripts/find-python.sh
#: takes it): 2.21's, pyenv's 3.12.1 (Ubuntu 24.04 ships 3.12.3); 2.15's, Debian 12's python3.11
OLDEST_PYTHON = {(3, 12): ("constraints.txt", "3.12.1"), (3, 11): ("constraints-2.15.txt", "3.11.2")}


def test_every_locked_package_installs_on_the_oldest_python_the_course_takes():
    """pip refuses a package whose Requires-Python excludes the interpreter: one such pin and
    `make setup` fails on Debian 12 (soupsieve 4.1.2 needed 3.11.5). Read from the metadata of
    what this environment installed from the lock (no index is asked)."""
    from importlib import metadata

    from packaging.specifiers import SpecifierSet

    lock, oldest = OLDEST_PYTHON[sys.version_info[:2]]  # the lock of the stack these tests run on
    checked, refused = 0, []
    for line in (ROOT / "requirements" / lock).read_text().splitlines():
        name, sep, version = line.partition("==")
        if not sep or line.startswith("#"):
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a pin this environment does not use (tensorflow[and-cuda]'s, say)
        if dist.version != version.strip():
            continue
        checked += 1
        needs = dist.metadata.get("Requires-Python")
        if needs and oldest not in SpecifierSet(needs):
            refused.append(f"{name}=={version} (Requires-Python {needs})")
    assert checked > 100, f"only {checked} locked packages found installed: is this the course's environment?"
    assert not refused, f"pip would refuse these on Python {oldest}: {refused}; bound them in requirements/base.in"


# ---------------------------------------------------------------------- the images
def _context(dockerfile: Path) -> set[str]:
    """The files ``docker build -f dockerfile .`` sends from the repository root, by Docker's
    rules for ``<Dockerfile>.dockerignore`` (docker-py's implementation)."""
    from docker.utils.build import exclude_paths

    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    paths = exclude_paths(str(ROOT), patterns, dockerfile=str(dockerfile.relative_to(ROOT)))
    return {p for p in paths if (ROOT / p).is_file()}


def _copied(dockerfile: Path) -> list[str]:
    """The sources of the Dockerfile's COPY instructions (not --from stages)."""
    sources = []
    for line in re.findall(r"^COPY (.+)$", dockerfile.read_text(), re.M):
        words = [w for w in line.split() if not w.startswith("--")]
        sources += words[:-1]
    return sources


@pytest.fixture(scope="module")
def student_context():
    pytest.importorskip("docker", reason="docker-py (requirements/dev.in) computes the build context")
    return _context(DEPLOY / "student" / "Dockerfile")


def test_the_student_image_gets_what_students_need_and_nothing_of_the_course(student_context):
    ctx = student_context
    needed = ["lab_utils/__init__.py", "requirements/constraints.txt", "requirements/base.in", "pyproject.toml"]
    needed += ["scripts/build-horovod.sh", "scripts/stacks.sh", "scripts/stack-keras.sh", "deploy/student/copy-labs.sh"]
    needed += ["scripts/horovod-patches/tf2.21.patch", "labs/README.md"]
    needed += [f"labs/{lab}/{lab}.ipynb" for lab in sorted(p.name for p in (ROOT / "grading/source").iterdir())]
    assert not [p for p in needed if p not in ctx], "the student image lacks files it needs"
    banned = [p for p in ctx if p.startswith(("grading/", "tests/", "bench/", ".git/", ".venv/"))]
    assert not banned, banned
    for src in _copied(DEPLOY / "student" / "Dockerfile"):  # every COPY finds its files in the context
        assert any(p == src.rstrip("/") or p.startswith(src.rstrip("/") + "/") for p in ctx), src
    found = leaks.find_leaks([ROOT / p for p in sorted(ctx)], leaks.source_notebooks())
    assert not found, [str(x) for x in found]


def test_the_installed_package_holds_no_solution(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = next(tmp_path.glob("lab_utils-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "unpacked")
    assert all(n.startswith(("lab_utils/", "lab_utils-")) for n in names), [n for n in names if "lab_utils" not in n]
    assert "lab_utils/grading/cells.py" in names  # the helpers test cells import ship ...
    found = leaks.find_leaks(sorted((tmp_path / "unpacked").rglob("*.py")), leaks.source_notebooks())
    assert not found, [str(x) for x in found]  # ... and no solution with them


def test_the_instructor_image_adds_the_course_but_not_its_state():
    pytest.importorskip("docker", reason="docker-py (requirements/dev.in) computes the build context")
    dockerfile = DEPLOY / "instructor" / "Dockerfile"
    ctx = _context(dockerfile)
    assert {f"grading/source/{p.name}/{p.name}.ipynb" for p in (ROOT / "grading/source").iterdir()} <= ctx
    assert "grading/nbgrader_config.py" in ctx and "grading/settings.yml" in ctx
    state = (
        "grading/gradebook.db",
        "grading/submitted/",
        "grading/autograded/",
        "grading/feedback/",
        "grading/results/",
    )
    assert not [p for p in ctx if p.startswith(state)]
    assert re.search(r"^FROM \$\{STUDENT_IMAGE\}", dockerfile.read_text(), re.M)


@pytest.mark.process
def test_the_images_switch_nbgrader_s_instructor_tools_off_and_on(tmp_path):
    """The script both images run, at user scope in a scratch config folder: its plugin
    names exist in the installed nbgrader, and Jupyter then has them off (locked), then on."""
    from jupyter_server.extension.config import ExtensionConfigManager

    script = DEPLOY / "nbgrader-instructor-tools.sh"
    for image, action in (("student", "disable"), ("instructor", "enable")):
        assert f"nbgrader-instructor-tools.sh {action}" in (DEPLOY / image / "Dockerfile").read_text()
    installed = Path(sys.prefix) / "share/jupyter/labextensions/@jupyter/nbgrader"
    known = {m for f in installed.rglob("*.js") for m in re.findall(r"nbgrader:[a-z-]+", f.read_text(errors="replace"))}
    plugins = set(re.search(r"plugins=\(([^)]+)\)", script.read_text()).group(1).split())
    assert plugins and plugins <= known, plugins - known
    env = {**os.environ, "SCOPE": "user", "JUPYTER_CONFIG_DIR": str(tmp_path)}
    env["PATH"] = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
    for action, on in (("disable", False), ("enable", True)):
        proc = subprocess.run(["bash", str(script), action], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        lab = json.loads((tmp_path / "labconfig" / "page_config.json").read_text())
        assert all(lab["disabledExtensions"][p] is not on and lab["lockedExtensions"][p] is not on for p in plugins)
        server = ExtensionConfigManager(read_config_path=[str(tmp_path)]).get_jpserver_extensions()
        assert server["nbgrader.server_extensions.formgrader"] is on, server  # what the server then loads
    bad = subprocess.run(["bash", str(script), "maybe"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr


def test_the_start_hook_copies_the_labs_once_and_never_over_a_students_work(tmp_path):
    opt = tmp_path / "opt"
    (opt / "labs" / "01_x").mkdir(parents=True)
    (opt / "labs" / "01_x" / "01_x.ipynb").write_text("release")
    (opt / "labs" / "README.md").write_text("map")
    (opt / "labs" / "params.yml").write_text("{}")
    script = (DEPLOY / "student" / "copy-labs.sh").read_text().replace("/opt/labs", str(opt))
    home = tmp_path / "home"
    home.mkdir()

    def run():
        subprocess.run(["bash", "-c", script], env={"HOME": str(home), "PATH": os.environ["PATH"]}, check=True)

    run()
    assert (home / "labs/01_x/01_x.ipynb").read_text() == "release" and (home / "labs/README.md").is_file()
    (home / "labs/01_x/01_x.ipynb").write_text("my work")
    (opt / "labs" / "02_y").mkdir()
    (opt / "labs" / "02_y" / "02_y.ipynb").write_text("new lab")
    run()
    assert (home / "labs/01_x/01_x.ipynb").read_text() == "my work"  # never overwritten
    assert (home / "labs/02_y/02_y.ipynb").read_text() == "new lab"  # a lab added later arrives
    other = tmp_path / "pulled"  # a class whose labs come with nbgitpuller: nothing is copied
    other.mkdir()
    env = {"HOME": str(other), "PATH": os.environ["PATH"], "LABS_COPY_LABS": "0"}
    subprocess.run(["bash", "-c", script], env=env, check=True)
    assert list(other.iterdir()) == []


# ---------------------------------------------------------------------- JupyterHub
@pytest.fixture(scope="module")
def values():
    return yaml.safe_load((DEPLOY / "jupyterhub" / "values.yaml").read_text())


def _k8s_bytes(quantity) -> int:
    units = {"K": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    number, unit = re.fullmatch(r"([\d.]+)([KMG]i?)?", str(quantity)).groups()
    return int(float(number) * units.get(unit, 1))


def _defaults(lab: str) -> dict:
    """The parameters cell of ``lab``'s instructor notebook: a student's full run."""
    cell = nbformat.read(ROOT / "grading/source" / lab / f"{lab}.ipynb", as_version=4).cells[1]
    found = {}
    for node in ast.parse(cell.source).body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:  # a computed default (a comprehension): not a cluster size
                continue
            found.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    return found


#: the labs that start clusters (Lab 1 trains in the kernel)
CLUSTER_LABS = ("02_ps_async", "03_ps_sync", "04_allreduce", "05_alexnet", "06_communication", "07_model_parallel")


def _lost(lab: str, available: int, cores: int) -> list[str]:
    """What ``lab``'s largest default clusters lose when ``available`` bytes are left beside
    the kernel, by the rules the lab's own runs fit their clusters by (empty: nothing)."""
    from lab_utils.cluster import GUARD_MEMORY_BYTES, ResourceError
    from lab_utils.training import hybrid
    from lab_utils.training.allreduce import runs as allreduce_runs
    from lab_utils.training.towers import runs as towers_runs

    p, lost = _defaults(lab), []
    if lab in ("02_ps_async", "03_ps_sync"):  # 1 PS + the workers
        want = max(p["WORKERS"]) if isinstance(p["WORKERS"], list) else p["WORKERS"]
        got = ps_runs.fit_workers(want, available=available, cores=cores)
        lost += [f"1 PS + {want} workers: {got} fit"] if got != want else []
        if lab == "02_ps_async":  # the TF2 aside: a chief, 1 PS and 2 workers
            from lab_utils.training.ps.strategy import runs as ps_strategy_runs

            try:
                tf2 = ps_strategy_runs.fit_strategy_workers(2, available=available)
            except ResourceError:
                tf2 = 0
            lost += [f"TF2 chief + 1 PS + 2 workers: {tf2} fit"] if tf2 != 2 else []
    elif lab == "04_allreduce":  # Part D's sweep of 1 PS + n workers; its ring runs are smaller
        got = ps_runs.fit_sweep(p["SCALING_NP"], available=available)
        lost += [f"the sweep {p['SCALING_NP']}: {got} fit"] if got != p["SCALING_NP"] else []
    elif lab == "05_alexnet":  # one towers process; Part D's Horovod ranks (+ horovodrun) and MWMS workers
        np_ = max(p["HVD_NP"])
        needs = {
            "a towers or MirroredStrategy process": towers_runs.TASK_MEMORY_BYTES + GUARD_MEMORY_BYTES,
            f"Horovod, {np_} ranks": (np_ + 1) * allreduce_runs.ALEXNET_RANK_MEMORY_BYTES["horovod"],
            f"MWMS, {np_} workers": np_ * (allreduce_runs.ALEXNET_RANK_MEMORY_BYTES["mwms"] + GUARD_MEMORY_BYTES),
        }
        lost += [f"{what} ({need / 2**20:,.0f} MB)" for what, need in needs.items() if need > available]
    elif lab == "06_communication":  # Part C's Parallax runs, every mode at every count
        try:
            got = hybrid.fit_sweep(p["HYBRID_WORKERS"], available=available)
        except ResourceError as exc:
            return [str(exc)]
        lost += [f"Parallax {p['HYBRID_WORKERS']} workers: {got} fit"] if got != p["HYBRID_WORKERS"] else []
    elif lab == "07_model_parallel":  # Part B's TensorFlow ranks; Part D's stages, a NumPy process each
        from lab_utils.training.modelpar import runs as modelpar_runs

        stages = max(p["PIPE_STAGES"])
        needs = {
            f"Part B, {p['NP']} TensorFlow ranks": p["NP"] * modelpar_runs.TF_RANK_MEMORY_BYTES,
            f"Part D, {stages} stages": stages * modelpar_runs.RANK_MEMORY_BYTES,
        }
        lost += [f"{what} ({need / 2**20:,.0f} MB)" for what, need in needs.items() if need > available]
    return lost


#: the kernel of a lab that starts clusters, beside them (bench_lab_memory: its working set was
#: 0.31-0.34 GB in Labs 2 and 5 with the data cache; it maps the data rather than holding it)
KERNEL_BYTES = 400 * 2**20


def measured_peak_gb() -> dict[str, float]:
    """A student's default run of each lab with full-size MNIST and CIFAR-10 stand-ins, in a cgroup
    of the pod's 2 CPUs and a 2,560 MiB limit (bench_lab_memory.py --full --stand-ins --cpus 2
    --limit-mb 2560): its peak working set (memory less the page cache the kernel may take back),
    in GB (10**9 bytes), as grading/run_times.json holds it and deploy/README.md's "Per-user
    limits" quotes it (bench/run_times.py)."""
    labs = json.loads((ROOT / "grading" / "run_times.json").read_text())["labs"]
    return {lab: row["pod"]["working_set_mb"] * 2**20 / 1e9 for lab, row in labs.items()}


def test_the_memory_limit_holds_every_labs_largest_default_cluster(values, monkeypatch):
    monkeypatch.setenv("LABS_OFFLINE", "0")  # a class online loads the full MNIST in every task
    memory, cpu = values["singleuser"]["memory"], values["singleuser"]["cpu"]
    limit = _k8s_bytes(memory["limit"])
    assert _k8s_bytes(memory["guarantee"]) <= limit and cpu["guarantee"] <= cpu["limit"]
    for lab in CLUSTER_LABS:
        # lab_utils' own rules, by which its runs fit clusters: nothing is scaled down
        assert _lost(lab, limit - KERNEL_BYTES, int(cpu["limit"])) == [], f"{lab} at {limit / 1e9:.2f} GB"
    peaks = measured_peak_gb()
    assert set(peaks) == {p.name for p in (ROOT / "grading/source").iterdir() if p.is_dir()}
    for lab, peak in peaks.items():  # and what the default runs were measured to hold, with room
        assert 1.2 * peak * 1e9 <= limit, (
            f"{lab}: a default run peaked at {peak:.2f} GB, the limit is {limit / 1e9:.2f} GB"
        )
    assert cpu["limit"] >= 2  # a PS and its workers need two cores to show what the labs measure


def test_the_fit_check_sees_a_limit_too_small_for_each_lab(monkeypatch):
    monkeypatch.setenv("LABS_OFFLINE", "0")
    for lab in CLUSTER_LABS:
        assert _lost(lab, 900 * 2**20, 2) != [], lab


def test_only_instructors_are_offered_the_instructor_image(values):
    hub = values["hub"]
    c = SimpleNamespace(KubeSpawner=SimpleNamespace())
    exec(compile(hub["extraConfig"]["10-instructor-profile"], "values.yaml:extraConfig", "exec"), {"c": c})  # noqa: S102
    profiles = c.KubeSpawner.profile_list

    def offered(*groups):
        user = SimpleNamespace(groups=[SimpleNamespace(name=g) for g in groups])
        return profiles(SimpleNamespace(user=user))

    assert "instructor" not in repr(offered()) and "instructor" not in repr(offered("students"))
    assert "instructor" not in repr(offered("teaching-assistants", "gpu-users"))
    teacher = offered("instructors")
    assert len(teacher) == 3 and "dl-labs-instructor" in teacher[-1]["kubespawner_override"]["image"]
    assert "instructors" in hub["config"]["JupyterHub"]["load_groups"]
    # a GPU only for those given one (GPUs are few), with the GPU image
    assert len(offered()) == 1 and len(offered("teaching-assistants")) == 1
    gpu = offered("gpu-users")[1]["kubespawner_override"]
    assert gpu["extra_resource_limits"] == {"nvidia.com/gpu": "1"} and gpu["image"].split(":")[0].endswith("-gpu")
    assert "TF_PACKAGE=tensorflow[and-cuda]==" in (DEPLOY / "student" / "Dockerfile").read_text()
    # teaching assistants open students' servers, collect and return; they hold no instructor image
    roles = {r["name"]: r for r in hub["config"]["JupyterHub"]["load_roles"]}
    ta = roles["teaching-assistant"]
    assert ta["groups"] == ["teaching-assistants"] and {"access:servers", "custom:handin:grade"} <= set(ta["scopes"])
    # the course map, in the public repository that nbgitpuller pulls into each home
    url = urllib.parse.urlsplit(values["singleuser"]["defaultUrl"])
    query = dict(urllib.parse.parse_qsl(url.query))
    assert url.path == "/git-pull" and query["branch"] == "main" and query["repo"].startswith("https://")
    assert query["urlpath"] == f"lab/tree/{query['targetpath']}/labs/README.md" and (ROOT / "labs/README.md").is_file()
    assert values["singleuser"]["extraEnv"]["LABS_COPY_LABS"] == "0"  # no second copy from the image
    assert values["cull"]["enabled"] is True and values["cull"]["timeout"] <= 3600


def test_hand_ins_go_to_the_service_and_no_volume_is_shared_between_students(values, monkeypatch):
    """The hand-in service (deploy/jupyterhub/handin.yaml) is the only pod that mounts the store;
    the Hub learns of it, every user may use it, only instructors' tokens may grade, and students'
    servers are told where it is (lab_utils.hub.hand_in)."""
    from lab_utils.hub.service import GRADE_SCOPE

    single = values["singleuser"]
    volumes = single["storage"].get("extraVolumes", [])  # the pod's own memory only: its /dev/shm
    assert [v["emptyDir"]["medium"] for v in volumes] == ["Memory"] and all(
        set(v) == {"name", "emptyDir"} for v in volumes
    )
    assert [m["mountPath"] for m in single["storage"].get("extraVolumeMounts", [])] == ["/dev/shm"]
    assert single["extraEnv"]["LABS_HANDIN_URL"] == "http://proxy-public/services/handin/"
    c = SimpleNamespace(JupyterHub=SimpleNamespace(services=[], load_roles=[]), KubeSpawner=SimpleNamespace())
    monkeypatch.setenv("HANDIN_API_TOKEN", "t0ken")
    exec(compile(values["hub"]["extraConfig"]["20-handin-service"], "values.yaml:extraConfig", "exec"), {"c": c})  # noqa: S102
    assert c.JupyterHub.services == [{"name": "handin", "url": "http://handin:8080", "api_token": "t0ken"}]
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    assert "access:services!service=handin" in roles["user"]["scopes"] and "self" in roles["user"]["scopes"]
    assert roles["handin-instructor"] == {
        "name": "handin-instructor",
        "scopes": [GRADE_SCOPE],
        "groups": ["instructors"],
    }
    assert GRADE_SCOPE in c.JupyterHub.custom_scopes and GRADE_SCOPE in c.KubeSpawner.server_token_scopes
    token_ref = values["hub"]["extraEnv"]["HANDIN_API_TOKEN"]["valueFrom"]["secretKeyRef"]
    docs = list(yaml.safe_load_all((DEPLOY / "jupyterhub" / "handin.yaml").read_text()))
    kinds = {d["kind"]: d for d in docs}
    assert set(kinds) == {"PersistentVolumeClaim", "Deployment", "Service"}
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["JUPYTERHUB_API_TOKEN"]["valueFrom"]["secretKeyRef"] == token_ref  # the one the Hub knows
    assert env["JUPYTERHUB_SERVICE_URL"]["value"].endswith(":8080") and kinds["Service"]["metadata"]["name"] == "handin"
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == kinds["PersistentVolumeClaim"]["metadata"]["name"]
    assert kinds["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteOnce"]  # this pod alone
    assert container["command"][:3] == ["python", "-m", "lab_utils.hub.service"]


def test_the_kubernetes_hand_in_service_takes_its_labs_and_due_times_from_the_schedule(tmp_path):
    """handin.yaml's service reads the term's schedule from a ConfigMap of grading/course.yml (the
    file the grader reads too): every lab of the term is open, and a due date changed in the
    schedule is the service's, with no second place to type it (issue 53)."""
    from lab_utils.grading import schedule
    from lab_utils.grading.late import DueFile
    from lab_utils.hub.store import Store

    docs = {d["kind"]: d for d in yaml.safe_load_all((DEPLOY / "jupyterhub" / "handin.yaml").read_text())}
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    (due_arg,) = container["args"]
    assert due_arg.startswith("--due-file=")
    path = Path(due_arg.split("=", 1)[1])
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    (volume,) = [v for v in pod["volumes"] if "configMap" in v]
    mount = mounts[volume["name"]]
    assert path.parent == Path(mount["mountPath"]) and "subPath" not in mount  # a subPath is never updated
    # the ConfigMap as the file's header creates it: the key course.yml, from grading/course.yml
    header = (DEPLOY / "jupyterhub" / "handin.yaml").read_text()
    made = re.search(r"kubectl create configmap (\S+) .*--from-file=(\S+)=(\S+)", header)
    assert made and made.group(1) == volume["configMap"]["name"] and made.group(2) == path.name, header[:600]
    source = ROOT / made.group(3)
    assert source == schedule.SCHEDULE
    mounted = tmp_path / "etc-labs"
    mounted.mkdir()
    (mounted / path.name).write_text(source.read_text())
    store = Store(tmp_path / "store", DueFile(mounted / path.name))
    assert sorted(store.due) == sorted(p.name for p in (ROOT / "labs").iterdir() if p.is_dir())
    assert store.due == schedule.load(source).due()
    changed = source.read_text().replace("  02_ps_async:\n", "  02_ps_async:\n    due: 2027-03-01T12:00:00+01:00\n", 1)
    assert changed != source.read_text()
    (mounted / path.name).write_text(changed)
    st = (mounted / path.name).stat()
    os.utime(mounted / path.name, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert store.due["02_ps_async"].isoformat() == "2027-03-01T12:00:00+01:00"


def test_the_values_validate_against_the_charts_schema(values):
    chart = os.environ.get("Z2JH_CHART_DIR")
    if not chart:
        pytest.skip(
            "Z2JH_CHART_DIR is not set: no unpacked jupyterhub chart to validate against (see deploy/README.md)"
        )
    import jsonschema

    chart = Path(chart)
    schema_file = next(p for p in (chart / "values.schema.json", chart / "values.schema.yaml") if p.is_file())
    schema = yaml.safe_load(schema_file.read_text())

    def merge(base, over):  # helm: maps merge, everything else is replaced
        if isinstance(base, dict) and isinstance(over, dict):
            return {**base, **{k: merge(base.get(k), v) for k, v in over.items()}}
        return over

    merged = merge(yaml.safe_load((chart / "values.yaml").read_text()), values)
    errors = [f"{list(e.path)}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(merged)]
    assert not errors, errors


def test_the_pods_seccomp_profile_is_the_shipped_one_and_its_installer_puts_it_where_the_kubelet_reads(values):
    """tests/process/test_seccomp_profile.py loads that profile and runs a student's network under it."""
    profile = values["singleuser"]["extraPodConfig"]["securityContext"]["seccompProfile"]
    assert profile == {"type": "Localhost", "localhostProfile": "labs/labs-userns.json"}
    shipped = DEPLOY / "jupyterhub" / "seccomp" / "labs-userns.json"
    assert json.loads(shipped.read_text())["defaultAction"] == "SCMP_ACT_ERRNO"
    installer = yaml.safe_load((DEPLOY / "jupyterhub" / "seccomp" / "installer.yaml").read_text())
    pod = installer["spec"]["template"]["spec"]
    host = next(v for v in pod["volumes"] if "hostPath" in v)
    assert host["hostPath"]["path"] == "/var/lib/kubelet/seccomp"
    assert f"/host/{profile['localhostProfile']}" in " ".join(pod["initContainers"][0]["command"])
    assert (
        "labs-userns.json" in (DEPLOY / "README.md").read_text() and "Unconfined" in (DEPLOY / "README.md").read_text()
    )


def test_the_pods_dev_shm_is_mounted_and_the_guide_says_how_many_ranks_it_holds(values):
    """Open MPI's segment per rank is at most 4 MiB (btl_vader_segment_size); the labs' largest
    MPI job has 4 ranks; tests/notebooks/test_labs.py runs Labs 4 and 6 in a tmpfs of this size."""
    volume = next(v for v in values["singleuser"]["storage"]["extraVolumes"] if v["name"] == "shm")
    size = _k8s_bytes(volume["emptyDir"]["sizeLimit"])
    ranks = size // (4 * 2**20)
    largest = max(int(n) for lab in ("04_allreduce", "05_alexnet", "06_communication")
                  for n in re.findall(r"np=(\d+)", (ROOT / "grading" / "source" / lab / f"{lab}.ipynb").read_text()))  # fmt: skip
    assert ranks >= 2 * largest, (ranks, largest)
    text = " ".join((DEPLOY / "README.md").read_text().split())
    assert f"/dev/shm: {size // 2**20} MiB, mounted" in text and f"holds {ranks} ranks on one pod" in text
