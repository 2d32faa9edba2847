"""Every test cell accounted for, and every locked cell a submission changed.

- :func:`account`: one row per autograded test cell: points, score, and a status
  (``passed``, ``failed``, ``error``, ``timed out``, ``not run``; ``kernel died``
  for the cell that killed it) with the reason;
- :func:`changed_cells`: flags for locked cells a submission edited or deleted
  (nbgrader puts the instructor's version back, so the grade is right, but the
  instructor should know);

Flags come from the grader alone (its executor, :mod:`lab_utils.grading.execute`): a line a
notebook prints is never taken for one.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["account", "changed_cells", "restore_deleted"]


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_test(cell) -> bool:
    m = _meta(cell)
    return cell.get("cell_type") == "code" and bool(m.get("grade")) and not m.get("solution")


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line[:limit]


def _status_from_outputs(cell) -> tuple[str, str] | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            if out.get("ename") == "AssertionError":
                return "failed", "AssertionError: " + (_first_line(out.get("evalue")) or "a test failed")
            return "error", f"{out.get('ename')}: {_first_line(out.get('evalue'))}"
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stderr":
            return "failed", "wrote to stderr: " + _first_line(out.get("text"))
    return None


def account(root: Path, lab: str, student: str, graded: Path, executed: dict) -> tuple[list[dict], float, float]:
    """(rows, score, max_score) of ``student``'s ``lab`` in the course at ``root``.

    ``graded`` is the autograded notebook, ``executed`` the record written by
    :class:`~lab_utils.grading.execute.SandboxExecute`."""
    import nbformat
    from nbgrader.api import Gradebook

    nb = nbformat.read(graded, as_version=4)
    events = {c.get("grade_id"): c for c in executed.get("cells", []) if c.get("grade_id")}
    with Gradebook(f"sqlite:///{Path(root) / 'gradebook.db'}") as gb:
        scores = {g.name: (g.score, g.max_score) for g in gb.find_submission_notebook(lab, lab, student).grades}
        submission = gb.find_submission(lab, student)
        total, max_total = float(submission.score), float(submission.max_score)
    rows = []
    for cell in nb.cells:
        if not _is_test(cell):
            continue
        grade_id = _meta(cell)["grade_id"]
        score, points = scores.get(grade_id, (0.0, float(_meta(cell).get("points", 0))))
        event = events.get(grade_id, {})
        if event.get("status") in ("timed out", "kernel died", "not run"):
            status, reason = (
                event["status"],
                _first_line(
                    next((o.get("evalue", "") for o in cell.get("outputs", []) if o.get("output_type") == "error"), "")
                ),
            )
        elif (found := _status_from_outputs(cell)) is not None:
            status, reason = found
        elif score < points:
            status, reason = "failed", f"partial credit {score:g}/{points:g}"
        else:
            status, reason = "passed", ""
        rows.append(
            {
                "grade_id": grade_id,
                "points": points,
                "score": score,
                "status": status,
                "reason": reason,
                "seconds": event.get("seconds"),
            }
        )
    return rows, total, max_total


def changed_cells(submitted: Path, released: Path) -> list[dict]:
    """Flags for the locked cells of ``released`` that ``submitted`` edited or deleted."""
    import nbformat
    from nbgrader.utils import compute_checksum

    try:
        sub = nbformat.read(submitted, as_version=4)
    except (ValueError, OSError) as exc:  # not JSON, not a notebook, unreadable
        return [{"kind": "unreadable notebook", "detail": f"{type(exc).__name__}: {_first_line(str(exc))}"}]
    rel = nbformat.read(released, as_version=4)
    have = {_meta(c).get("grade_id"): c for c in sub.cells if _meta(c).get("grade_id")}
    flags = []
    for cell in rel.cells:
        meta = _meta(cell)
        if not meta.get("locked") or not meta.get("grade_id"):
            continue
        grade_id, what = meta["grade_id"], "test cell" if _is_test(cell) else "locked cell"
        mine = have.get(grade_id)
        if mine is None:
            flags.append({"kind": "deleted cell", "detail": f"{what} {grade_id} was deleted (restored and graded)"})
        elif meta.get("checksum") and compute_checksum(mine) != meta["checksum"]:
            flags.append(
                {
                    "kind": "tampered cell",
                    "detail": f"{what} {grade_id} was edited (the instructor's version was graded)",
                }
            )
    return flags


def restore_deleted(submitted: Path, released: Path) -> list[str]:
    """Put every locked cell of ``released`` that ``submitted`` lacks back, after the
    cell that precedes it in the release (nbgrader's own ``add_missing_cells`` fails
    when that cell is not a graded one). nbgrader then overwrites each with the
    gradebook's version. Returns the restored grade ids."""
    import copy

    import nbformat

    sub = nbformat.read(submitted, as_version=4)
    rel = nbformat.read(released, as_version=4)
    have = {_meta(c).get("grade_id") for c in sub.cells if _meta(c).get("grade_id")}
    restored, previous = [], None
    for cell in rel.cells:
        grade_id = _meta(cell).get("grade_id")
        if grade_id and grade_id not in have and _meta(cell).get("locked"):
            ids = [_meta(c).get("grade_id") for c in sub.cells]
            at = ids.index(previous) + 1 if previous in ids else 0
            sub.cells.insert(at, copy.deepcopy(cell))
            have.add(grade_id)
            restored.append(grade_id)
        if grade_id:
            previous = grade_id
    if restored:
        nbformat.write(sub, submitted)
    return restored
