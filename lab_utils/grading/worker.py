"""Grade ONE submission inside its sandbox: ``python -m lab_utils.grading.worker SPEC.json``.

The batch (:mod:`lab_utils.grading.batch`) writes the spec and starts this in a
:class:`~lab_utils.grading.sandbox.Sandbox`. The worker

1. copies the batch's generated course for the lab (its own gradebook) and adds the
   one submission (plain files only: a link or a device in its folder is refused);
2. when isolated: brings up loopback, makes the sandbox's disk, and writes the kernel's
   view (:mod:`lab_utils.grading.view`): the kernel's launcher shows it only what it needs
   (the Python environment, ``lab_utils`` without the autograder, the lab's reference
   scripts and dataset files, read-only, and its disk), nothing else of the machine;
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
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from lab_utils import config
from lab_utils.grading import nbapi, quotes
from lab_utils.grading.accounting import account, changed_cells, restore_deleted
from lab_utils.grading.safefiles import copy_plain, refused_flags
from lab_utils.grading.sandbox import run_checked
from lab_utils.grading.tracebacks import hide_hidden_tracebacks
from lab_utils.grading.view import view_spec, write_spec

__all__ = ["main", "grade"]


def _isolate(spec: dict, box: Path) -> Path:
    """Network and disk of an isolated sandbox; returns the disk. Everything the submission may
    write (the notebook's folder, the kernel's home, its /tmp and /var/tmp, /dev/shm and
    /run/lock) is on one tmpfs of ``disk_mb`` in this mount namespace: it goes with the
    sandbox, and nothing of it is shared with another sandbox or the machine."""
    if spec["network"] == "loopback":
        run_checked("ip", "link", "set", "lo", "up")
    disk = box / "disk"
    disk.mkdir()
    run_checked("mount", "-t", "tmpfs", "-o", f"size={int(spec['settings']['disk_mb'])}m,mode=0711", "tmpfs", str(disk))
    for name, mode, owner in (("home", 0o700, spec["uid"]), ("work", 0o700, spec["uid"]), ("tmp", 0o1777, 0),
                              ("shm", 0o1777, 0), ("lock", 0o1777, 0)):  # fmt: skip
        (disk / name).mkdir()
        os.chown(disk / name, owner, owner)
        (disk / name).chmod(mode)
    return disk


def _kernelspec(box: Path, view: Path | None) -> Path:
    """The sandbox's kernel: its launcher (:mod:`lab_utils.grading.kernel`), which runs the
    kernel as the sandbox's uid in its ``view``, or (no view: not root) as the grader with its
    environment scrubbed."""
    spec_dir = box / "jupyter" / "kernels" / "lab-sandbox"
    spec_dir.mkdir(parents=True)
    how = ["--view", str(view)] if view is not None else ["--environment-only"]
    argv = [sys.executable, "-m", "lab_utils.grading.kernel", *how]
    (spec_dir / "kernel.json").write_text(
        json.dumps({"argv": [*argv, "-f", "{connection_file}"], "display_name": "sandbox", "language": "python"})
    )
    return box / "jupyter"


def _course(spec: dict, box: Path) -> tuple[Path, list[dict]]:
    """A private copy of the batch's generated course for this lab, plus the submission's plain
    files (a link or a special file in its folder is neither followed nor copied: flagged)."""
    root = box / "course"
    shutil.copytree(spec["template"], root)
    root.chmod(0o711)
    dest = root / "submitted" / spec["student"] / spec["lab"]
    refused = copy_plain(spec["submission"], dest)
    for d in (root / "source", root / "submitted"):
        d.chmod(0o700)
    (root / "gradebook.db").chmod(0o600)  # it holds the hidden tests' source; the kernel's uid must not read it
    return root, refused_flags(refused)


def _config(spec: dict, box: Path, record: Path):
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
    c.SandboxExecute.timing_json = json.dumps(s["timing"])
    c.SandboxExecute.timing_lock = str(spec.get("timing_lock") or "")
    c.SandboxExecute.trusted = _trusted()
    if spec.get("isolated"):
        c.SandboxExecute.disk_dir = str(box / "disk")
        c.SandboxExecute.disk_mb = float(s["disk_mb"])
        c.SandboxExecute.kernel_uid = int(spec["uid"])
    for name in ("go_fd", "note_fd"):  # the batch's gate: the kernel starts on its go
        setattr(c.SandboxExecute, name, int(spec.get("gate", {}).get(name, -1)))
    c.SandboxExecute.kernel_name = "lab-sandbox"  # the sandbox's launcher (_kernelspec), in every mode
    return c


def _trusted() -> list[str]:
    """The folders whose code a kernel runs as its own (Python's, the environment's, lab_utils'):
    a function of lab_utils or of IPython whose code comes from elsewhere was replaced."""
    import lab_utils

    return sorted({os.path.join(p, "") for p in (sys.base_prefix, sys.prefix, os.path.dirname(lab_utils.__file__))})


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
    root, refused = _course(spec, box)
    secret = json.loads(Path(spec["secret_lines"]).read_text())  # what nothing kept may quote (root only)
    os.environ.update(_kernel_env(spec, box, root / "autograded" / student / lab))
    record = box / "execution.json"
    t = lap("prepare", t0)
    api = nbapi.course_api(root, extra=_config(spec, box, record))
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
    flags = refused + restored + executed.get("flags", [])
    flags += _execution_flags(executed, record, spec["settings"]["file_mb"])
    flags += _scrub(graded, secret, _own_lines(submitted))
    if spec.get("isolated"):
        flags += _shared_left(box / "disk")
    t = lap("account", t)
    nbapi.check(api.generate_feedback(lab, student, force=True), f"generate_feedback {student}/{lab}")
    nb = nbformat.read(graded, as_version=4)
    quotes.strip_hidden_tests(nb)  # the copy kept shows the tests as the release does
    _rewrite(nb, graded)
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


#: what Open MPI's shared-memory transport leaves in /dev/shm when one of its jobs is killed
_MPI_SEGMENTS = ("vader_segment.", "sm_segment.", "psm_shm.", "ompi.")


def _shared_left(disk: Path, sysvipc: Path = Path("/proc/sysvipc")) -> list[dict]:
    """What the notebook left in its sandbox's /dev/shm, /run/lock and System V IPC (private to the
    sandbox: gone with it; flagged, since it is how two notebooks graded at once would talk)."""
    left = [f"/dev/shm/{p.name}" for p in sorted((disk / "shm").iterdir()) if not p.name.startswith(_MPI_SEGMENTS)]
    left += [f"/run/lock/{p.name}" for p in sorted((disk / "lock").iterdir())]
    for table, what in (("shm", "shared memory segment"), ("sem", "semaphore set"), ("msg", "message queue")):
        try:
            rows = (sysvipc / table).read_text().splitlines()[1:]
        except OSError:
            continue
        left += [f"System V {what} {row.split()[1]}" for row in rows if len(row.split()) > 1]
    if not left:
        return []
    shown = ", ".join(left[:6]) + (f" and {len(left) - 6} more" if len(left) > 6 else "")
    return [{"kind": "shared memory left", "detail": f"{shown} (removed with the sandbox)"}]


def _own_lines(submitted: Path) -> set[str]:
    """The stripped lines of the submission's own cells: its code, which it may print."""
    try:
        nb = nbformat.read(submitted, as_version=4)
    except (OSError, ValueError):
        return set()
    return {line.strip() for c in nb.cells for line in c.get("source", "").splitlines()}


def _scrub(graded: Path, secret: dict[str, str], own: set[str]) -> list[dict]:
    """The graded notebook with no hidden-test line in its tracebacks and no output that quotes a
    hidden test, a solution or a secret of the grader's (:mod:`lab_utils.grading.quotes`); the flags."""
    nb = nbformat.read(graded, as_version=4)
    for cell in nb.cells:
        hide_hidden_tracebacks(cell)
    flags = quotes.scrub(nb, secret, quotes.secret_values(), own)
    _rewrite(nb, graded)
    return flags


def _rewrite(nb, path: Path) -> None:
    """Write ``nb`` over ``path``, which nbgrader leaves read-only (a new file put in its place,
    with its mode: without root, the grader cannot write into the old one)."""
    mode = path.stat().st_mode & 0o777
    tmp = path.with_name(f".{path.name}.rewrite")
    nbformat.write(nb, tmp)
    tmp.chmod(mode)
    os.replace(tmp, path)


def _kernel_env(spec: dict, box: Path, cwd: Path) -> dict[str, str]:
    """What this worker adds to its environment for the kernel: the variables the kernel gets,
    and, when isolated, the sandbox's kernelspec (``JUPYTER_PATH``), whose launcher shows the
    kernel only its view (:mod:`lab_utils.grading.view`) with the notebook's folder ``cwd``."""
    # No dataset cache in the sandbox: its home is on the disk_mb tmpfs, whose room is the
    # submission's, and an entry written there would be memory the grading pays for once more.
    # The throughput tests' timing is the grader's (over the kernel's stdin).
    kernel = {"LABS_CACHE_DIR": "off", config.GRADING_DRIVEN: "1"}
    if not spec.get("isolated"):  # the kernel runs as this user, and sees what it sees, but no secret of its
        if spec.get("reference_dir"):
            kernel[config.GRADING_REFERENCE_DIR] = spec["reference_dir"]
        return {**kernel, "JUPYTER_PATH": _jupyter_path(_kernelspec(box, None))}
    disk = _isolate(spec, box)
    keras = spec.get("keras_home")
    view = view_spec(
        box,
        uid=spec["uid"],
        disk=disk,
        cwd=cwd,
        package=Path(spec["kernel_package"]),
        references=[(lab, Path(path)) for lab, path in spec.get("references", [])],
        keras_home=Path(keras) if keras else None,
        env=kernel,
    )
    path = write_spec(view, box / "view.json")
    return {**kernel, "JUPYTER_PATH": _jupyter_path(_kernelspec(box, path))}


def _jupyter_path(first: Path) -> str:
    """``JUPYTER_PATH`` with ``first`` (the sandbox's kernelspec) before what it held: nbconvert
    finds its templates there too (a Hub's server may point it at the environment's share/)."""
    return os.pathsep.join([str(first), *[p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]])


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
