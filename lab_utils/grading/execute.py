"""The autograder's notebook executor: one bad cell costs its own exercise, never the notebook.

:class:`SandboxExecute` replaces nbgrader's ``Execute`` preprocessor (the grading
worker, :mod:`lab_utils.grading.worker`, configures it). Over nbgrader it adds:

- **per-cell timeout that interrupts** (nbclient's ``interrupt_on_timeout``), then
  checks the kernel answers within ``interrupt_grace`` seconds; a cell that ignores
  the interrupt gets the kernel restarted, and the notebook goes on;
- **a dead kernel is restarted** (``os._exit``, a crash, the memory limit): the
  cell gets an error saying so (the memory limit by name, with the limit and the peak,
  when the sandbox cgroup's OOM-kill counter rose during the cell), the cells above it that ran cleanly (test cells
  excepted) are run again, and the rest of the notebook is still executed; cells
  that needed state only the dead cell made fail on their own;
- **a notebook budget** (``notebook_timeout``): cells not started by then get a
  ``NotRun`` error (nbgrader would give a test cell with no output full marks);
- **a record** of every code cell (seconds, what happened) written as JSON to
  ``record_file``, from which the worker accounts for every test cell;
- **a turn** (``go_fd``, ``note_fd``: :mod:`lab_utils.grading.gate`): it tells the
  batch it is ready, starts the kernel only when the batch says go, and tells it
  when the kernel is shut down, so the batch can keep ``jobs`` notebooks executing
  while other sandboxes prepare or finish;
- **a disk limit** (``disk_dir``: the isolated sandbox's size-limited tmpfs, which
  also holds the kernel's home and ``/tmp``): the notebook's folder is run from
  there (a bind mount), a cell after which that disk is full, or whose output says
  "No space left on device", is recorded as the one that reached the limit, and
  once the kernel is shut down only the lab's own files (``keep_files``, each at most
  ``file_mb``) come back to the real folder; whatever else the submission wrote goes
  with the tmpfs.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import time
from pathlib import Path
from queue import Empty

from jupyter_core.utils import ensure_async
from nbclient.exceptions import DeadKernelError
from nbclient.util import run_sync
from nbconvert.preprocessors import Preprocessor
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import Execute
from traitlets import Bool, Float, Integer, List, Unicode

from lab_utils.grading import judge, locks
from lab_utils.grading.gate import EXECUTED, READY, notify, wait_for_go
from lab_utils.grading.safefiles import read_plain
from lab_utils.grading.sandbox import memory_events, pids_refused, run_checked
from lab_utils.grading.settings import DEFAULTS
from lab_utils.grading.throughput import Driver

__all__ = ["SandboxExecute", "CapOutputBytes", "TIMEOUT_ENAME", "DEAD_ENAME", "NOT_RUN_ENAME"]

TIMEOUT_ENAME = "CellTimeoutError"
DEAD_ENAME = "KernelDied"
NOT_RUN_ENAME = "NotRun"


def give_tree(folder: Path, uid: int) -> None:
    """Make ``uid`` the owner of ``folder`` and everything in it, through file descriptors,
    never following a link (a link itself changes owner)."""
    os.chown(folder, uid, uid, follow_symlinks=False)
    for _, dirs, files, dir_fd in os.fwalk(folder):
        for name in dirs + files:
            os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_test(cell) -> bool:
    m = _meta(cell)
    return cell.get("cell_type") == "code" and bool(m.get("grade")) and not m.get("solution")


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class CapOutputBytes(Preprocessor):
    """Cut a code cell's outputs at ``max_bytes`` (streams keep their head, rich outputs that do
    not fit go), error outputs always kept (they decide a test cell's status), and note it in
    the cell and in ``record_file`` (JSON: cell index -> bytes cut). nbgrader's ``LimitOutput``
    counts lines, so one 50 MB line went whole into the autograded notebook and its feedback."""

    enabled = Bool(True, help="nbconvert skips a preprocessor that is not enabled").tag(config=True)
    # the instructor's own cells print up to ~200 kB (two live-metrics figures in one cell, larger
    # on a slow machine, where the run samples longer): 5x that, so only a flood meets it
    max_bytes = Integer(1_000_000, help="bytes of output kept per code cell").tag(config=True)
    record_file = Unicode("", help="where to write the JSON of the cells cut").tag(config=True)

    def preprocess(self, nb, resources):
        self._cut: dict[int, int] = {}
        try:
            return super().preprocess(nb, resources)
        finally:
            if self.record_file:
                Path(self.record_file).write_text(json.dumps(self._cut))

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not cell.get("outputs"):
            return cell, resources
        budget, kept, cut = self.max_bytes, [], 0
        for out in cell.outputs:
            if out.get("output_type") == "error":  # decides a test cell's status: always kept
                kept.append(out)
                continue
            size = len(json.dumps(out, ensure_ascii=False).encode())
            if size <= budget:
                kept.append(out)
                budget -= size
            elif out.get("output_type") == "stream" and budget > 0:
                head = out.get("text", "").encode()[:budget].decode("utf-8", errors="ignore")
                cut += size - len(head.encode())
                out.text, budget = head, 0
                kept.append(out)
            else:
                cut += size
        if cut:
            note = f"\n[output cut by the grader: {cut:,} bytes over its {self.max_bytes:,}-byte limit per cell]\n"
            kept.append(NotebookNode(output_type="stream", name="stdout", text=note))
            cell.outputs = kept
            self._cut[index] = cut
        return cell, resources


class SandboxExecute(Execute):
    """nbgrader's ``Execute`` that survives timeouts, dead kernels and a spent budget."""

    notebook_timeout = Integer(0, help="seconds for the whole notebook; 0 = no limit").tag(config=True)
    interrupt_grace = Integer(20, help="seconds an interrupted kernel has to answer again").tag(config=True)
    record_file = Unicode("", help="where to write the JSON record of every code cell").tag(config=True)
    go_fd = Integer(-1, help="pipe to wait on for the batch's go before the kernel starts; -1: none").tag(config=True)
    note_fd = Integer(-1, help="pipe to tell the batch 'ready' and 'executed' on; -1: none").tag(config=True)
    memory_mb = Float(0, help="the sandbox's memory limit, named when it kills the kernel; 0: none").tag(config=True)
    max_processes = Integer(0, help="the sandbox's process limit, named when a cell meets it; 0: none").tag(config=True)
    own_cgroup = Bool(
        False, help="this worker's memory cgroup is the sandbox's own (its OOM kills are the kernel's)"
    ).tag(config=True)
    disk_dir = Unicode("", help="the sandbox's size-limited tmpfs, its work/ the notebook's folder; '': none").tag(
        config=True
    )
    disk_mb = Float(0, help="that tmpfs's size, named when a cell fills it").tag(config=True)
    keep_files = List(Unicode(), help="files of the notebook's folder kept after execution (its scripts)").tag(
        config=True
    )
    file_mb = Float(5, help="a kept file larger than this is not kept").tag(config=True)
    timing_json = Unicode("{}", help="the lab's timing settings (JSON: rounds, max_rounds, noise)").tag(config=True)
    timing_lock = Unicode("", help="the batch's timing lock, held while a test cell's jobs are timed; '': none").tag(
        config=True
    )
    trusted = List(Unicode(), help="folders whose code the kernel may run as lab_utils' and Python's own").tag(
        config=True
    )
    kernel_uid = Integer(-1, help="the kernel's uid: it owns the notebook's folder on the disk; -1: unchanged").tag(
        config=True
    )
    # A cell's output still arriving after its reply: nbclient waits iopub_timeout for it, and
    # nbgrader makes running past that an exception. A flood of output (the crafted hostile
    # cell's 50 MB) took longer than nbclient's 4 s on a slow day under load, and the exception
    # ended the whole grading of that submission ("infrastructure error"). The wait ends at the
    # cell's last message, so a long one costs nothing; past it, what arrived is kept (the cap
    # above cuts it) and the notebook goes on.
    iopub_timeout = Integer(60, help="seconds a cell's output may still arrive after its reply").tag(config=True)
    raise_on_iopub_timeout = Bool(False, help="past iopub_timeout: keep what arrived and go on").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        notify(self.note_fd, READY)
        wait_for_go(self.go_fd)
        self._records: list[dict] = []
        self._flags: list[dict] = []
        self._nonce = judge.new_nonce()
        self._testing, self._driver, self._lock_fd, self._reply_ok = False, None, None, False
        self._replaced: set[str] = set()
        self.timing = {**DEFAULTS["timing"], **json.loads(self.timing_json or "{}")}
        self._started = time.monotonic()
        self._deadline = self._started + self.notebook_timeout if self.notebook_timeout else None
        self._restarts = 0
        self._cell_timeout = int(self.timeout or 0) or 10**9
        self.error_on_timeout = {
            "ename": TIMEOUT_ENAME,
            "evalue": f"this cell ran longer than {self.timeout} s and was interrupted; "
            "the rest of the notebook was still graded",
            "traceback": [f"{TIMEOUT_ENAME}: this cell ran longer than {self.timeout} s and was interrupted"],
        }
        folder = (resources or {}).get("metadata", {}).get("path") or os.getcwd()
        self._dropped: dict[str, int] = {}
        self._disk_peak, self._disk_full = 0, False
        self._disk_before = ""
        if self.disk_dir:
            self._run_from_disk(Path(folder))
        try:
            return super().preprocess(nb, resources, km)
        finally:
            if self.disk_dir:
                self._dropped = self._keep_from_disk(Path(folder))
            self._write_record()
            notify(self.note_fd, EXECUTED)

    # ------------------------------------------------------------------ disk
    def _run_from_disk(self, folder: Path) -> None:
        """The notebook's folder, copied onto the sandbox's tmpfs and mounted over itself:
        what the notebook writes there counts against the disk limit."""
        work = Path(self.disk_dir) / "work"
        try:
            shutil.copytree(folder, work, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as exc:  # the files handed in do not fit: the notebook alone runs
            for child in list(work.iterdir()):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
            for nb in folder.glob("*.ipynb"):
                shutil.copy2(nb, work / nb.name)
            self._disk_before = f"the files handed in did not fit in {self.disk_mb:g} MB ({exc.__class__.__name__})"
        if self.kernel_uid > 0:  # before any student code runs: nothing here can be swapped under us
            give_tree(work, self.kernel_uid)
        run_checked("mount", "--bind", str(work), str(folder))

    def _keep_from_disk(self, folder: Path) -> dict[str, int]:
        """Read the lab's own files from the tmpfs (a plain file within ``file_mb``, opened without
        following a link: a process the submission left may still be changing the folder), detach
        the tmpfs from the folder (lazily: such a process may still hold it), and write them into
        the real folder. Returns ``{name: bytes}`` of those too big to keep."""
        kept, dropped, cap = {}, {}, int(self.file_mb * 2**20)
        for name in self.keep_files:
            data = read_plain(folder / name, cap)
            if isinstance(data, int):
                dropped[name] = data
            elif data is not None:
                kept[name] = data
        run_checked("umount", "-l", str(folder))
        for name, data in kept.items():
            (folder / name).write_bytes(data)
        return dropped

    def _disk_filled(self, cell) -> bool:
        """Whether ``cell`` filled the tmpfs (less than 1 MiB left after it, and not before it),
        or was told it is full; keeps the most it held after a cell (``disk_peak_mb``)."""
        st = os.statvfs(self.disk_dir)
        self._disk_peak = max(self._disk_peak, (st.f_blocks - st.f_bfree) * st.f_frsize)
        was_full, self._disk_full = self._disk_full, st.f_bavail * st.f_frsize < 2**20
        if self._disk_full and not was_full:
            return True
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else out.get("evalue", "")
            if "No space left on device" in str(text):
                return True
        return False

    # ------------------------------------------------------------------ one cell
    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type != "code" or not cell.source.strip():
            return super().preprocess_cell(cell, resources, index)
        record = {"index": index, "grade_id": _meta(cell).get("grade_id"), "status": "ran"}
        self._records.append(record)
        if not _is_test(cell):
            return self._execute(cell, resources, index, record)
        # a test cell: the kernel runs what is above its judge, silently (no history, no result
        # shown), with the grader driving its timed jobs; the grader decides the verdict
        source = cell.source
        kernel_part, judge_part = judge.split(source)
        call = judge.timed_call(kernel_part)
        self._driver = Driver(call, self.timing) if call else None
        self._reply_ok = False
        cell.source = f"# {self._nonce}: the grader runs this test cell\n{kernel_part}"
        self._testing = True
        try:
            cell, resources = self._execute(cell, resources, index, record)
        finally:
            cell.source = source
            self._testing = False
            self._release_timing()
        self._judge(cell, index, record, judge_part, call)
        return cell, self.resources

    def _execute(self, cell, resources, index, record):
        if self._deadline is not None and time.monotonic() >= self._deadline:
            cell.outputs = [
                _error(NOT_RUN_ENAME, f"not run: the notebook's time budget ({self.notebook_timeout} s) was used up")
            ]
            record.update(status="not run", seconds=0.0)
            return cell, self.resources
        if self._deadline is not None:  # a cell never runs past the notebook's budget
            self.timeout = max(1, min(self._cell_timeout, int(self._deadline - time.monotonic()) + 1))
        t0 = time.monotonic()
        memory_before = memory_events() if self.own_cgroup else None
        refused_before = pids_refused() if self.own_cgroup else None
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            record.update(status="kernel died", seconds=round(time.monotonic() - t0, 3))
            why = self._why_dead(record, memory_before, index)
            cell.outputs.append(_error(DEAD_ENAME, f"{why}; it was restarted and the setup cells above were run again"))
            record["replayed"] = self._restart(index)
            return cell, self.resources
        finally:
            self.timeout = self._cell_timeout
        record["seconds"] = round(time.monotonic() - t0, 3)
        refused = pids_refused() if refused_before is not None else None
        if refused is not None and refused > refused_before:  # forks the cgroup's pids.max refused
            record.update(process_limit=self.max_processes, refused=refused - refused_before)
        if self.disk_dir and self._disk_filled(cell):
            record.update(disk_limit_mb=self.disk_mb)
        if any(o.get("output_type") == "error" and o.get("ename") == "MemoryError" for o in cell.outputs):
            record.update(cause="memory limit", limit_mb=self.memory_mb)  # RLIMIT_AS (no cgroup), or Python's own
        if any(o.get("output_type") == "error" and o.get("ename") == TIMEOUT_ENAME for o in cell.outputs):
            record["status"] = "timed out"
            if not self._answers(self.interrupt_grace):
                record["restarted"] = True
                record["replayed"] = self._restart(index)
        return cell, self.resources

    # ------------------------------------------------------------------ verdicts
    def _judge(self, cell, index: int, record: dict, judge_part: str | None, call: dict | None) -> None:
        """The grader's verdict on test cell ``index`` (:func:`lab_utils.grading.judge.verdict`),
        then the kernel made to forget the cell's source, and checked for tampering."""
        meta = _meta(cell)
        gid, points = meta.get("grade_id", f"cell {index}"), float(meta.get("points", 0))
        values = judge.take_handin(cell)
        refused = sorted(k for k, x in (values or {}).items() if isinstance(x, dict) and x.get("$") == "refused")
        if refused:
            what = "; ".join(f"{k}: {values[k]['what']}" for k in refused[:4])
            self._flag("not a plain value", f"{gid} was handed {what}")
        forged = judge.drop_forged_lines(cell)
        if forged:
            self._flag(
                "forged flag", f"{gid} printed {len(forged)} line(s) that only the grader writes: {forged[0][:120]}"
            )
        if record["status"] != "ran":  # timed out, kernel died, not run: its error output scores it 0
            return
        timing = self._driver.outcome() if self._driver else None
        if timing is not None:
            record["timing"] = timing.timing
        v = judge.verdict(cell, reply_ok=self._reply_ok, judge=judge_part, values=values, timing=timing,
                          timed=call is not None, points=points, grade_id=gid)  # fmt: skip
        record["verdict"] = v.status
        if v.detail:
            record["judge"] = v.detail
        for f in v.flags:
            self._flag(f["kind"], f["detail"])
        self._ask(judge.cleanup_code(self._nonce))
        replaced = self._probe()
        if replaced is None:
            self._flag("tampered with grading", f"after {gid}: the kernel did not answer the grader's integrity check")
            return
        new = sorted(set(replaced) - self._replaced)
        self._replaced |= set(new)
        if new:
            self._flag("tampered with grading", f"after {gid}: replaced {', '.join(new[:8])}")
        used = sorted(
            r
            for r in replaced
            if r.startswith("lab_utils") and re.search(rf"\b{re.escape(r.rsplit('.', 1)[-1])}\b", cell.source)
        )
        if used:  # its values came through a lab_utils function the submission replaced: worth nothing
            cell.outputs = [o for o in cell.outputs if o.get("output_type") not in ("execute_result", "error")]
            cell.outputs.append(_error("TamperedWithGrading", f"this test used {used[0]}, which the notebook replaced"))
            record["tampered"] = used

    def _probe(self) -> list[str] | None:
        nonce = judge.new_nonce()
        text = self._ask(judge.probe_code(nonce, self.trusted))
        return judge.read_probe([{"output_type": "stream", "text": text}], nonce)

    def _flag(self, kind: str, detail: str) -> None:
        self._flags.append({"kind": kind, "detail": detail})

    # ------------------------------------------------------------------ a test cell's kernel
    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        """nbclient's, but a test cell is sent silently (no history, no result displayed) with
        the kernel's stdin open to the grader (its timed jobs, :meth:`_serve_stdin`)."""
        if not self._testing:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history)
        kc = self.kc
        kc.execute = functools.partial(type(kc).execute, kc, silent=True, allow_stdin=True)
        server = asyncio.ensure_future(self._serve_stdin(kc))
        try:
            return await super().async_execute_cell(cell, cell_index, execution_count, store_history=False)
        finally:
            server.cancel()
            kc.__dict__.pop("execute", None)

    execute_cell = run_sync(async_execute_cell)

    def on_cell_executed(self, **kwargs):
        self._reply_ok = kwargs["execute_reply"]["content"].get("status") == "ok"
        return super().on_cell_executed(**kwargs)

    async def _serve_stdin(self, kc) -> None:
        """Answer the kernel's questions while a test cell runs: the timed jobs of its
        comparison (:class:`lab_utils.grading.throughput.Driver`), holding the batch's timing lock
        meanwhile; anything else is answered with nothing."""
        while True:
            msg = await ensure_async(kc.stdin_channel.get_msg(timeout=None))
            if msg["header"]["msg_type"] != "input_request":
                continue
            prompt = str(msg["content"].get("prompt", ""))
            if self._driver is None:
                kc.input("")
                continue
            if self._lock_fd is None and self._driver.result is None:
                await self._take_timing()
            answer = self._driver.answer(prompt)
            if self._driver.result is not None or self._driver.protocol_error:
                self._release_timing()
            kc.input(answer)

    async def _take_timing(self) -> None:
        """The batch's timing lock, within half the cell's time: past that the comparison is timed
        anyway and flagged for a regrade (a wait for a lock never costs a student points)."""
        if not self.timing_lock:
            self._lock_fd = -1
            return
        fd = locks.open_lock(self.timing_lock)
        deadline = max(30.0, 0.5 * self._cell_timeout)
        try:
            got = await asyncio.to_thread(locks.acquire, fd, deadline)
        except asyncio.CancelledError:  # the cell ended (timed out) while it waited: the lock is not kept
            os.close(fd)
            raise
        if got:
            self._lock_fd = fd
            return
        os.close(fd)
        self._lock_fd = -1
        self._flag(
            "inconclusive timing", f"regrade: the timing lock was not free within {deadline:.0f} s; timed anyway"
        )

    def _release_timing(self) -> None:
        if self._lock_fd is not None and self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor drops its lock
        self._lock_fd = None

    def _why_dead(self, record: dict, memory_before, index: int) -> str:
        """Why the kernel died in cell ``index``, for its error and ``record`` (``cause``):
        the sandbox cgroup's OOM-kill counter went up while the cell ran, or something else."""
        after = memory_events()
        if memory_before is None or after is None or after[0] <= memory_before[0]:
            return f"the kernel died while running this cell (cell {index}: os._exit, a crash or a signal)"
        peak = None if after[1] is None else round(after[1] / 2**20)
        record.update(cause="memory limit", limit_mb=self.memory_mb, peak_mb=peak)
        at = f" at a peak of {peak} MB" if peak is not None else ""
        return f"the memory limit ({self.memory_mb:g} MB) killed the kernel while it ran this cell (cell {index}){at}"

    # ------------------------------------------------------------------ kernel
    def _run_quiet(self, source: str, timeout: float) -> bool:
        """Execute ``source`` without recording outputs; True when it replied within ``timeout``."""
        msg_id = self.kc.execute(source, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = run_sync(self.kc.shell_channel.get_msg)(timeout=left)
            except Empty:  # no reply in time
                return False
            if msg["parent_header"].get("msg_id") == msg_id:
                return True
        return False

    def _answers(self, timeout: float) -> bool:
        try:
            return self._run_quiet("pass", timeout)
        except DeadKernelError:
            return False

    def _ask(self, source: str, timeout: float = 30.0) -> str:
        """Run ``source`` silently in the kernel; what it printed ('' when it did not answer in time)."""
        msg_id = self.kc.execute(source, silent=True, store_history=False, allow_stdin=False)
        deadline, text = time.monotonic() + timeout, []
        while (left := deadline - time.monotonic()) > 0:
            try:
                msg = run_sync(self.kc.iopub_channel.get_msg)(timeout=left)
            except Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                text.append(msg["content"].get("text", ""))
            elif kind == "status" and msg["content"].get("execution_state") == "idle":
                break
        return "".join(text)

    def _restart(self, failed_index: int) -> int:
        """Restart the kernel and re-run, silently, the code cells above ``failed_index``
        that ran without an error, test cells excepted: the state the dead kernel held
        comes back as far as it can. Returns how many cells were re-run."""
        self._restarts += 1
        self.log.warning("restarting the kernel after cell %d", failed_index)
        run_sync(self.km.restart_kernel)(now=True)
        self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        run_sync(self.kc.wait_for_ready)(timeout=self.startup_timeout)
        ok = {r["index"] for r in self._records if r["status"] == "ran"}
        replayed = 0
        for index, cell in enumerate(self.nb.cells[:failed_index]):
            meta = _meta(cell)
            if cell.cell_type != "code" or index not in ok or (meta.get("grade") and not meta.get("solution")):
                continue
            if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
                continue
            if not self._run_quiet(cell.source, self._cell_timeout):
                break
            replayed += 1
        return replayed

    def _write_record(self) -> None:
        if not self.record_file:
            return
        data = {
            "cells": self._records,
            "restarts": self._restarts,
            "execution_s": round(time.monotonic() - self._started, 3),
            "cell_timeout": self._cell_timeout,
            "notebook_timeout": self.notebook_timeout,
            "dropped_files": getattr(self, "_dropped", {}),
            "disk_peak_mb": round(getattr(self, "_disk_peak", 0) / 2**20, 1) if self.disk_dir else None,
            "disk_before": getattr(self, "_disk_before", ""),
            "flags": getattr(self, "_flags", []),
        }
        Path(self.record_file).write_text(json.dumps(data, indent=1))
