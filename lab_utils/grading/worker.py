"""Grade ONE submission inside its sandbox: ``python -m lab_utils.grading.worker SPEC.json``.

The batch (:mod:`lab_utils.grading.batch`) writes the spec and starts this in a
:class:`~lab_utils.grading.sandbox.Sandbox`. The worker

1. when isolated: brings up loopback, hides the instructor's course and the other
   submissions behind empty mounts, and shows the kernel only what it needs (the
   reference scripts, the dataset cache), read-only;
2. copies the batch's generated course for the lab (its own gradebook) and adds the
   one submission;
3. notes every locked cell the submission changed or deleted (nbgrader restores them);
4. autogrades with :class:`~lab_utils.grading.execute.SandboxExecute`, the kernel
   running as the sandbox's own uid, once the batch gives it its turn
   (:mod:`lab_utils.grading.gate`);
5. accounts for every test cell (passed / failed / error / timed out / not run, with
   the reason), writes the feedback, and the result JSON the batch merges.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from lab_utils import config
from lab_utils.grading import nbapi
from lab_utils.grading.accounting import account, changed_cells, flags_in_outputs, restore_deleted
from lab_utils.grading.layout import REPO_ROOT
from lab_utils.grading.sandbox import run_checked
from lab_utils.grading.tracebacks import reference_quotes

__all__ = ["main", "grade"]


def _isolate(spec: dict, box: Path) -> dict:
    """Mounts and network of an isolated sandbox; returns the kernel's extra environment.
    Everything the submission may write (the notebook's folder, the kernel's home and its
    /tmp) is on one tmpfs of ``disk_mb`` in this mount namespace: it goes with the sandbox."""
    env = {}
    if spec["network"] == "loopback":
        run_checked("ip", "link", "set", "lo", "up")
    disk = box / "disk"
    disk.mkdir()
    run_checked("mount", "-t", "tmpfs", "-o", f"size={int(spec['settings']['disk_mb'])}m,mode=0711", "tmpfs", str(disk))
    for name, mode in (("home", 0o700), ("work", 0o700), ("tmp", 0o1777)):
        (disk / name).mkdir()
        os.chown(disk / name, spec["uid"], spec["uid"])
        (disk / name).chmod(mode)
    shown = box / "shown"
    for name, src in (("reference", spec.get("reference_dir")), ("keras", spec.get("keras_home"))):
        if src and Path(src).is_dir():
            (shown / name).mkdir(parents=True, exist_ok=True)
            run_checked("mount", "--bind", src, str(shown / name))
            run_checked("mount", "-o", "remount,bind,ro", str(shown / name))
    _expose([Path(sys.base_prefix), Path(sys.prefix), REPO_ROOT], box / "views")
    for path in spec.get("hide", []):
        if Path(path).is_dir():
            run_checked("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", path)
    shown.chmod(0o755)
    if (shown / "keras").is_dir():
        env["KERAS_HOME"] = str(shown / "keras")
    if (shown / "reference").is_dir():
        env[config.GRADING_REFERENCE_DIR] = str(shown / "reference")
    return env


def _expose(needed: list[Path], views: Path) -> None:
    """Make the interpreter and lab_utils reachable by the unprivileged kernel when they
    sit under a private folder (pyenv in /root): in this mount namespace only, that
    folder is replaced by a traversable view holding just the needed entries."""
    blocked: dict[Path, set[str]] = {}
    for path in needed:
        path = path.resolve()
        for parent in [*reversed(path.parents), path]:
            if parent != path and not parent.stat().st_mode & stat.S_IXOTH:
                child = path.relative_to(parent).parts[0]
                blocked.setdefault(parent, set()).add(child)
                break
    for n, (parent, children) in enumerate(sorted(blocked.items())):
        view = views / str(n)
        view.mkdir(parents=True)
        for child in sorted(children):
            (view / child).mkdir()
            run_checked("mount", "--bind", str(parent / child), str(view / child))
        view.chmod(0o711)
        views.chmod(0o711)
        run_checked("mount", "--rbind", str(view), str(parent))


def _kernelspec(box: Path, uid: int, disk: Path | None, keep: list[str]) -> Path:
    spec_dir = box / "jupyter" / "kernels" / "lab-sandbox"
    spec_dir.mkdir(parents=True)
    home = disk / "home" if disk else box / "home"
    argv = [sys.executable, "-m", "lab_utils.grading.kernel", "--uid", str(uid), "--home", str(home)]
    if disk:  # its /tmp and /var/tmp: the disk's tmp, in a mount namespace of the kernel's own
        argv += ["--tmp", str(disk / "tmp")]
        for path in [str(box), *keep]:
            argv += ["--keep", path]
    (spec_dir / "kernel.json").write_text(
        json.dumps({"argv": [*argv, "-f", "{connection_file}"], "display_name": "sandbox", "language": "python"})
    )
    return box / "jupyter"


def _course(spec: dict, box: Path) -> Path:
    """A private copy of the batch's generated course for this lab, plus the submission."""
    root = box / "course"
    shutil.copytree(spec["template"], root)
    root.chmod(0o711)
    dest = root / "submitted" / spec["student"] / spec["lab"]
    shutil.copytree(spec["submission"], dest)
    for d in (root / "source", root / "submitted"):
        d.chmod(0o700)
    (root / "gradebook.db").chmod(0o600)  # it holds the hidden tests' source; the kernel's uid must not read it
    return root


def _config(spec: dict, box: Path, record: Path, lines_file: Path):
    from nbconvert.preprocessors import ClearMetadataPreprocessor
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        IgnorePattern,
        LimitOutput,
        SaveAutoGrades,
    )
    from traitlets.config import Config

    from lab_utils.grading.execute import CapOutputBytes, SandboxExecute

    s = spec["settings"]
    c = Config()
    c.Autograde.autograde_preprocessors = [
        SandboxExecute,
        IgnorePattern,
        ClearMetadataPreprocessor,
        LimitOutput,
        CapOutputBytes,
        SaveAutoGrades,
        AssignLatePenalties,
        CheckCellMetadata,
    ]
    c.CapOutputBytes.record_file = str(record.with_name("cut.json"))
    c.SandboxExecute.timeout = int(s["cell_timeout"])
    c.SandboxExecute.notebook_timeout = int(s["notebook_timeout"])
    c.SandboxExecute.interrupt_grace = int(s["interrupt_grace"])
    c.SandboxExecute.memory_mb = float(s["memory_mb"])
    c.SandboxExecute.max_processes = int(s["max_processes"])
    c.SandboxExecute.own_cgroup = bool(spec.get("isolated"))  # else the OOM counter is the grader's, shared
    c.SandboxExecute.record_file = str(record)
    c.SandboxExecute.keep_files = list(spec.get("keep", []))
    c.SandboxExecute.file_mb = float(s["file_mb"])
    if spec.get("isolated"):
        c.SandboxExecute.disk_dir = str(box / "disk")
        c.SandboxExecute.disk_mb = float(s["disk_mb"])
    for name in ("go_fd", "note_fd"):  # the batch's gate: the kernel starts on its go
        setattr(c.SandboxExecute, name, int(spec.get("gate", {}).get(name, -1)))
    if spec.get("uid"):
        c.SandboxExecute.kernel_name = "lab-sandbox"
    c.HideReferenceQuotes.lines_file = str(lines_file)
    return c


def grade(spec: dict) -> dict:
    """Grade the submission ``spec`` describes; returns the result (also written to spec["result"])."""
    t0 = time.monotonic()
    phases: dict[str, float] = {}  # seconds per step: what grading costs besides running the notebook

    def lap(name: str, since: float) -> float:
        now = time.monotonic()
        phases[name] = round(now - since, 3)
        return now

    for fd in spec.get("gate", {}).values():  # the batch's pipes: never passed on to the kernel (student code)
        os.set_inheritable(int(fd), False)
    box = Path(spec["box"])
    # this worker's own temporary files (jupyter_client's kernel connection file, which a
    # killed worker never removes) in its box, which the batch removes whatever happened
    tempfile.tempdir = str(box)
    student, lab = spec["student"], spec["lab"]
    root = _course(spec, box)  # before _isolate hides the instructor's course and the submissions
    lines_file = box / "solution-lines.json"  # the reference scripts' solutions, kept from the kernel (0600)
    shutil.copy2(spec["solution_lines"], lines_file)
    lines_file.chmod(0o600)
    os.environ.update(_kernel_env(spec, box))
    record = box / "execution.json"
    t = lap("prepare", t0)
    api = nbapi.course_api(root, extra=_config(spec, box, record, lines_file))
    submitted = root / "submitted" / student / lab / f"{lab}.ipynb"
    released = root / "release" / lab / f"{lab}.ipynb"
    restored = _readable(submitted, released) + changed_cells(submitted, released)
    restore_deleted(submitted, released)
    t = lap("course", t)
    outcome = api.autograde(lab, student, force=True, create=True)
    t = lap("autograde", t)
    if not outcome.get("success"):
        detail = (outcome.get("error") or "") + (outcome.get("log") or "")
        raise RuntimeError(f"nbgrader autograde failed: {detail[-3000:]}")
    graded = root / "autograded" / student / lab / f"{lab}.ipynb"
    executed = json.loads(record.read_text()) if record.is_file() else {"cells": []}
    cells, score, max_score = account(root, lab, student, graded, executed)
    flags = restored + flags_in_outputs(graded)
    solution = set(json.loads(lines_file.read_text()))
    quoted = reference_quotes(nbformat.read(graded, as_version=4), solution)
    if quoted:
        where = ", ".join(f"cell {i}" for i in quoted)
        flags.append({"kind": "quoted reference", "detail": f"{where} printed the reference script (not in feedback)"})
    flags += _execution_flags(executed, record, spec["settings"]["file_mb"])
    t = lap("account", t)
    nbapi.check(api.generate_feedback(lab, student, force=True), f"generate_feedback {student}/{lab}")
    lap("feedback", t)
    result = {
        "status": "graded",
        "student": student,
        "lab": lab,
        "score": score,
        "max_score": max_score,
        "cells": cells,
        "flags": flags,
        "timings": {"worker_s": round(time.monotonic() - t0, 3), "phases": phases, **executed},
        "autograded": str(graded.parent),
        "autograded_files": [graded.name, *_kept(graded.parent, spec.get("keep", []), spec["settings"]["file_mb"])],
        "feedback": str(root / "feedback" / student / lab),
        "db": str(root / "gradebook.db"),
    }
    Path(spec["result"]).write_text(json.dumps(result, indent=1))
    return result


def _kernel_env(spec: dict, box: Path) -> dict[str, str]:
    """The variables the grading kernel gets: the sandbox's (when isolated), the reference
    scripts, the timing settings and lock, and its own kernelspec when it runs as ``uid``."""
    kernel_env = _isolate(spec, box) if spec.get("isolated") else {}
    if spec.get("reference_dir") and config.GRADING_REFERENCE_DIR not in kernel_env:
        kernel_env[config.GRADING_REFERENCE_DIR] = spec["reference_dir"]
    kernel_env[config.GRADING_TIMING] = json.dumps(spec["settings"]["timing"])
    # No dataset cache in the sandbox: its home is on the disk_mb tmpfs, whose room is the
    # submission's, and an entry written there would be memory the grading pays for once more.
    kernel_env["LABS_CACHE_DIR"] = "off"
    if spec.get("timing_lock"):
        kernel_env[config.GRADING_TIMING_LOCK] = spec["timing_lock"]
    if spec.get("uid"):
        disk = box / "disk" if spec.get("isolated") else None
        if disk is None:
            (box / "home").mkdir(mode=0o700, exist_ok=True)
        keep = [spec["timing_lock"]] if spec.get("timing_lock") else []  # every sandbox's, in the batch's folder
        kernel_env["JUPYTER_PATH"] = str(_kernelspec(box, spec["uid"], disk, keep))
    return kernel_env


def _execution_flags(executed: dict, record: Path, file_mb: float) -> list[dict]:
    """The flags the execution record raises: limits met, cells timed out or not run, outputs
    cut, files not kept."""
    flags = []
    for c in executed["cells"]:
        where = f"cell {c['index']}" + (f" ({c['grade_id']})" if c.get("grade_id") else "")
        if c.get("disk_limit_mb"):
            flags.append({"kind": "disk limit", "detail": f"disk limit {c['disk_limit_mb']:g} MB reached in {where}"})
        if c.get("process_limit"):
            detail = f"process limit {c['process_limit']} reached in {where} ({c['refused']:,} new processes refused)"
            flags.append({"kind": "process limit", "detail": detail})
        if c.get("cause") == "memory limit":
            flags.append({"kind": "memory limit", "detail": _event(c, executed)})
        elif c["status"] in ("timed out", "kernel died"):
            flags.append({"kind": c["status"], "detail": _event(c, executed)})
    cut = record.with_name("cut.json")
    for index, size in (json.loads(cut.read_text()) if cut.is_file() else {}).items():
        flags.append({"kind": "huge output cut", "detail": f"cell {index}: {size:,} bytes over the limit per cell"})
    if executed.get("disk_before"):
        flags.append({"kind": "disk limit", "detail": f"before the notebook ran: {executed['disk_before']}"})
    for name, size in executed.get("dropped_files", {}).items():
        flags.append(
            {"kind": "file not kept", "detail": f"{name}: {size:,} bytes, over the {file_mb:g} MB cap per file"}
        )
    not_run = [c for c in executed["cells"] if c["status"] == "not run"]
    if not_run:
        budget = executed["notebook_timeout"]
        detail = (
            f"notebook timeout {budget} s reached before cell {not_run[0]['index']}: {len(not_run)} cell(s) not run"
        )
        flags.append({"kind": "not run", "detail": detail})
    return flags


def _kept(folder: Path, names: list[str], file_mb: float) -> list[str]:
    """Those of ``names`` that are plain files of ``folder`` within ``file_mb``: the files of
    the autograded folder that go into the course (without root, the kernel wrote there)."""
    kept = []
    for name in names:
        f = folder / name
        if f.is_file() and not f.is_symlink() and f.stat().st_size <= file_mb * 2**20:
            kept.append(name)
    return kept


def _readable(submitted: Path, released: Path) -> list[dict]:
    """Make the sandbox's copy of a submission one nbgrader can read, and flag what was done:
    invalid UTF-8 is decoded with U+FFFD for each bad byte and graded; a file that is no
    notebook (not JSON, cut short) is replaced by the blank release, graded in its place (0
    for every test), so a broken file is a grade with its reason, never an infrastructure error."""
    data = submitted.read_bytes()
    flags = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        text = data.decode("utf-8", errors="replace")
        detail = f"invalid UTF-8 at byte {exc.start:,}: each bad byte read as U+FFFD, then graded"
        flags.append({"kind": "unreadable notebook", "detail": detail})
    try:
        nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 (nbformat raises many kinds on a broken file; each is the student's)
        shutil.copy2(released, submitted)
        reason = (str(exc).strip().splitlines() or [""])[0][:160]
        detail = f"{type(exc).__name__}: {reason}; the blank release was graded in its place"
        return [*flags, {"kind": "unreadable notebook", "detail": detail}]
    if flags:
        submitted.write_text(text, encoding="utf-8")
    return flags


def _event(cell: dict, executed: dict) -> str:
    """One flag's detail: the cell, what happened, and the limit it met."""
    where = f"cell {cell['index']}" + (f" ({cell['grade_id']})" if cell.get("grade_id") else "")
    restarted = f"restarted, {cell.get('replayed', 0)} setup cells re-run"
    if cell.get("cause") == "memory limit":
        limit = f"the {cell['limit_mb']:g} MB memory limit" if cell.get("limit_mb") else "the memory limit"
        if cell["status"] != "kernel died":
            return f"{where} raised MemoryError at {limit}"
        peak = f" (peak {cell['peak_mb']} MB)" if cell.get("peak_mb") is not None else ""
        return f"{limit} killed the kernel in {where}{peak}; {restarted}"
    if cell["status"] == "timed out":
        extra = ", ignored the interrupt: kernel restarted" if cell.get("restarted") else ", interrupted"
        return f"{where} ran past the {executed.get('cell_timeout', '?')} s cell timeout{extra}"
    return f"kernel died in {where}; {restarted}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m lab_utils.grading.worker SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    grade(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main())
