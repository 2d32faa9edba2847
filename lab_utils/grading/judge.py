"""The grader's side of a test cell: its verdict, decided outside the student's kernel.

A test cell's source (the instructor's, which nbgrader restores before executing it) is
split at its ``### JUDGE`` line (:func:`split`): the kernel runs the part above it, which
calls the student's code and ends by handing plain values in
(:func:`lab_utils.grading.handin.hand_in`); the judge below it runs here, in the grading
worker, on those values alone (:func:`run`). The kernel never holds the judge's source, so
it cannot read the expected answers, and no object of the student's takes part in a
comparison. A throughput test's timing is the grader's too
(:class:`lab_utils.grading.throughput.Driver`), with the points and bands read from the
cell's source (:func:`timed_call`).

:func:`verdict` then writes the cell's outputs so that nbgrader scores exactly what the
grader decided: an error output for a failure, a float result for partial credit, nothing
for full marks. What the kernel displayed cannot change that: its results are dropped,
hand-in bundles taken out, and lines it printed that look like the grader's own
(``[grading-flag]``, ``[grading-timing]``) removed and flagged ``forged flag``.
"""

from __future__ import annotations

import ast
import builtins
import json
import math
import secrets
from dataclasses import dataclass, field

from nbformat.notebooknode import NotebookNode

from lab_utils.grading.cells import credit, ratio_credit
from lab_utils.grading.handin import MIME, NotPlain, Values
from lab_utils.integrity import PROBE

__all__ = [
    "JUDGE",
    "split",
    "timed_call",
    "free_names",
    "Verdict",
    "run",
    "verdict",
    "GRADER_LINES",
    "probe_code",
    "read_probe",
    "cleanup_code",
]

JUDGE = "### JUDGE"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
#: what a judge may name besides what it assigns and Python's builtins
JUDGE_NAMES = {"v", "np", "pd", "math", "credit", "ratio_credit"}
#: lines the grader writes into a test cell's output; the same lines printed by the kernel are forged
GRADER_LINES = ("[grading-flag]", "[grading-timing]")


def split(source: str) -> tuple[str, str | None]:
    """``(what the kernel runs, the judge)`` of a test cell's ``source``: the judge is the lines
    between a ``### JUDGE`` line (inside the hidden tests) and ``### END HIDDEN TESTS``; the
    kernel runs the rest. No ``### JUDGE`` line: ``(source, None)``."""
    lines = source.splitlines(keepends=True)
    begin = next((i for i, x in enumerate(lines) if x.strip().startswith(HIDDEN_BEGIN)), None)
    if begin is None:
        return source, None
    at = next((i for i in range(begin, len(lines)) if lines[i].strip().startswith(JUDGE)), None)
    if at is None:
        return source, None
    end = next((i for i in range(at, len(lines)) if lines[i].strip().startswith(HIDDEN_END)), len(lines))
    return "".join(lines[:at] + lines[end:]), "".join(lines[at + 1 : end])


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


def timed_call(source: str) -> dict | None:
    """The literal arguments of the ``throughput.compare(...)`` call in ``source`` (points,
    bands, warmup, rounds, max_rounds, noise, unit: what the grader needs to time and credit
    it), or None without one. An argument that is not a literal is left out (the settings'
    value is used), except ``points`` and ``bands``, which must be literals."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "compare"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "throughput"
        ):
            kw = {k.arg: _literal(k.value) for k in node.keywords if k.arg}
            if kw.get("points") is None or kw.get("bands") is None:
                raise ValueError("throughput.compare in a test cell needs literal points= and bands=")
            keep = ("points", "bands", "warmup", "rounds", "max_rounds", "noise", "unit")
            return {k: kw[k] for k in keep if kw.get(k) is not None}
    return None


def free_names(judge: str) -> set[str]:
    """Names ``judge`` reads that it neither assigns nor imports, and that are neither
    builtins nor :data:`JUDGE_NAMES`: what it could only find in the kernel (a mistake)."""
    tree = ast.parse(judge)
    stored, loaded = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (stored if isinstance(node.ctx, ast.Store | ast.Del) else loaded).add(node.id)
        elif isinstance(node, ast.arg):
            stored.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.Lambda):
            if not isinstance(node, ast.Lambda):
                stored.add(node.name)
        elif isinstance(node, ast.alias):
            stored.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            stored.add(node.name)
    return loaded - stored - JUDGE_NAMES - set(dir(builtins))


@dataclass
class Verdict:
    """A test cell's result as the grader decided it. ``score`` None means full marks."""

    status: str  # passed, failed, error
    score: float | None = None
    ename: str = ""
    evalue: str = ""
    flags: list[dict] = field(default_factory=list)
    detail: str = ""  # for the instructor (the result's record), never shown in feedback: where the judge failed


class _LazyPandas:
    def __getattr__(self, name):
        import pandas

        return getattr(pandas, name)


def run(judge: str, values: Values, points: float, grade_id: str = "") -> Verdict:
    """Run ``judge`` on ``values`` (see the module doc): its last expression, when there is one,
    is the credit (a float in [0, points]); an assertion that fails fails the cell."""
    import numpy as np

    ns = {"v": values, "np": np, "pd": _LazyPandas(), "math": math, "credit": credit, "ratio_credit": ratio_credit}
    tree = ast.parse(judge)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    try:
        exec(compile(tree, f"<judge {grade_id}>", "exec"), ns)  # noqa: S102 (the instructor's code, on plain data)
        result = eval(compile(ast.Expression(last.value), f"<judge {grade_id}>", "eval"), ns) if last else None  # noqa: S307
    except AssertionError as exc:
        return Verdict("failed", 0.0, "AssertionError", "a hidden test failed", detail=_where(exc))
    except NotPlain as exc:  # flagged where the values were taken (SandboxExecute)
        return Verdict("error", 0.0, "NotPlain", str(exc), detail=_where(exc))
    except Exception as exc:  # noqa: BLE001 (whatever the student's values make the judge raise costs the cell)
        return Verdict("error", 0.0, type(exc).__name__, "raised in the hidden tests", detail=_where(exc))
    if result is None:
        return Verdict("passed")
    if type(result) is not float or not 0.0 <= result <= float(points):
        raise ValueError(
            f"the judge of {grade_id} must end with credit(...) (a float in [0, {points}]), got {result!r}"
        )
    return Verdict("passed" if result >= float(points) else "failed", result)


def _where(exc: BaseException) -> str:
    """``judge line N: Exception: message`` (the innermost frame of the judge's own code)."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith("<judge")]
    line = f"judge line {frames[-1].lineno}: " if frames else ""
    return f"{line}{type(exc).__name__}: {str(exc)[:300]}"


def _error(ename: str, evalue: str) -> NotebookNode:
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def take_handin(cell) -> dict | None:
    """The last hand-in bundle of ``cell``'s outputs (its ``values``), all of them removed."""
    found, kept = None, []
    for out in cell.get("outputs", []):
        data = out.get("data") or {}
        if MIME in data:
            bundle = data[MIME]
            if isinstance(bundle, dict) and isinstance(bundle.get("values"), dict):
                found = json.loads(json.dumps(bundle["values"]))  # plain dicts and lists, not notebook nodes
            continue
        kept.append(out)
    cell.outputs = kept
    return found


def drop_forged_lines(cell) -> list[str]:
    """Remove the lines of ``cell``'s streams that look like the grader's own; returns them."""
    forged = []
    for out in cell.get("outputs", []):
        if out.get("output_type") != "stream":
            continue
        keep = []
        for line in out.get("text", "").splitlines(keepends=True):
            (forged if line.lstrip().startswith(GRADER_LINES) else keep).append(line)
        out["text"] = "".join(keep)
    cell.outputs = [o for o in cell.outputs if o.get("output_type") != "stream" or o.get("text")]
    return [line.strip() for line in forged]


def verdict(cell, *, reply_ok: bool, judge: str | None, values: dict | None, timing, timed: bool,
            points: float, grade_id: str) -> Verdict:  # fmt: skip
    """Decide a test cell that ran (its kernel replied) and write its outputs to match: see the
    module doc. ``timing``: the :class:`~lab_utils.grading.throughput.Outcome` of its timed
    comparison, None when there was none or it did not finish; ``timed``: the cell has one."""
    cell.outputs = [o for o in cell.outputs if o.get("output_type") != "execute_result"]
    flags = []
    if not reply_ok:
        v = Verdict("error", 0.0)  # its error output (the kernel's, or nbgrader's from the reply) scores it 0
        if not any(o.get("output_type") == "error" for o in cell.outputs):
            cell.outputs.append(_error("Error", "the cell raised an error"))
        return v
    if judge is not None:
        if values is None:
            flags.append(
                {"kind": "tampered with grading", "detail": f"{grade_id}: the cell ended without handing in its values"}
            )
            v = Verdict("error", 0.0, "NoHandIn", "the test cell ended without handing in its values", flags)
        else:
            v = run(judge, Values(values), points, grade_id)
    else:
        v = Verdict("passed")
    if timed:
        if timing is None:
            flags.append({"kind": "tampered with grading", "detail": f"{grade_id}: the timed comparison never ran"})
            v = Verdict("error", 0.0, "NoTiming", "the grader's timed comparison did not run", v.flags + flags)
        else:
            cell.outputs.append(NotebookNode(output_type="stream", name="stdout", text="\n".join(
                [timing.lines[0], "[grading-timing] " + json.dumps(timing.timing), *timing.lines[1:]]) + "\n"))  # fmt: skip
            share = timing.credit
            if v.status == "passed":
                v = Verdict("passed" if share >= points else "failed", share, flags=v.flags)
            v.flags += [{**f, "detail": f"{grade_id}: {f['detail']}"} for f in timing.flags]
    if v.ename:
        cell.outputs.append(_error(v.ename, v.evalue))
    elif v.score is not None:
        cell.outputs.append(
            NotebookNode(
                output_type="execute_result",
                data={"text/plain": repr(float(v.score))},
                metadata={},
                execution_count=cell.get("execution_count"),
            )  # fmt: skip
        )
    return v


# ---------------------------------------------------------------- what the grader asks the kernel
def new_nonce() -> str:
    return secrets.token_hex(8)


def _apart(code: str) -> str:
    """Kernel code that runs ``code`` in a namespace of its own: nothing of the notebook's is
    read, bound or deleted by what the grader asks."""
    return f"(lambda ns: exec({code!r}, ns))({{}})\n"


def cleanup_code(nonce: str) -> str:
    """Kernel code that forgets the test cells' source: every cached cell (linecache, IPython's
    own cache) holding ``nonce``, the line the grader puts atop each test cell it runs."""
    return _apart(
        "import linecache\n"
        "for c in (linecache.cache, getattr(linecache, '_ipython_cache', {})):\n"
        f"    for k in [k for k, e in list(c.items()) if '{nonce}' in ''.join(e[2] if len(e) > 2 else ())]:\n"
        "        c.pop(k, None)\n"
    )


def probe_code(nonce: str, trusted: tuple[str, ...]) -> str:
    """Kernel code that prints ``nonce`` and the JSON list of what the submission replaced: a
    builtin, a clock, IPython's traceback, display or execution machinery, or a function of
    ``lab_utils`` (anything whose code was not loaded from the ``trusted`` folders)."""
    return _apart(f"{PROBE}\n_lab_probe({nonce!r}, None, {tuple(trusted)!r})\n")


def read_probe(cell_outputs: list, nonce: str) -> list[str] | None:
    """What the probe found (see :func:`probe_code`), None when it did not answer."""
    for out in cell_outputs:
        if out.get("output_type") != "stream":
            continue
        for line in out.get("text", "").splitlines():
            if line.startswith(nonce + " "):
                try:
                    found = json.loads(line[len(nonce) + 1 :])
                except ValueError:
                    return None
                return [str(x) for x in found] if isinstance(found, list) else None
    return None
