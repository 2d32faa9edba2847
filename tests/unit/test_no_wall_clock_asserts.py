"""No test asserts a wall-clock time against a budget: a slower machine, or a busier one,
must still see a green suite whenever the code is right. Speed is measured in ``bench/``
(JSON, ratios within one run); a test may compare two times measured in the same run (a
ratio), bound a *rate* from above (a shaped link is no faster than its rate), or guard
against a hang with a timeout that raises (``communicate(timeout=...)``,
``@pytest.mark.timeout``), but never ``assert elapsed < N``.

The check reads every test module's syntax tree: an ordering comparison (``<``, ``<=``,
``>``, ``>=``) between a duration (a clock reading, ``time.monotonic() - t0``, or a name
such as ``elapsed``, ``seconds``, ``wall_time_s``) and a constant, or any comparison with a
``*_budget`` value, is a wall-clock assertion. A duration in a denominator is a rate."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "perf_counter_ns"}
DURATION = re.compile(r"(^|_)(elapsed|seconds|duration|took|stopped_in|wall|wall_s|wall_time|wall_time_s)$")
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _is_clock(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCKS
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    )


def _is_duration(node: ast.AST) -> bool:
    """A clock reading, a difference involving one, or a value named like a duration;
    a duration divided into something (a rate) is not one."""
    if _is_clock(node):
        return True
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Div):
            return _is_duration(node.left)  # size / elapsed is a rate; elapsed / n still a duration
        return _is_duration(node.left) or _is_duration(node.right)
    name = _name(node)
    return bool(name and DURATION.search(name))


def _is_constant(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name | ast.Attribute):
        return (_name(node) or "").isupper()  # RUN_BOUND, LIMIT_S
    if isinstance(node, ast.UnaryOp):
        return _is_constant(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_constant(node.left) and _is_constant(node.right)
    return False


def _mentions_budget(node: ast.AST) -> bool:
    return any("budget" in (_name(n) or "") for n in ast.walk(node))


def wall_clock_asserts(source: str, filename: str = "<test>") -> list[str]:
    """``file:line: code`` of every assertion in ``source`` that compares a wall-clock time with a budget."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Assert):
            continue
        for cmp in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            operands = [cmp.left, *cmp.comparators]
            timed = any(
                isinstance(op, ORDER)
                and ((_is_duration(a) and _is_constant(b)) or (_is_constant(a) and _is_duration(b)))
                for op, a, b in zip(cmp.ops, operands, operands[1:], strict=False)
            )
            if timed or _mentions_budget(cmp):
                found.append(f"{filename}:{node.lineno}: {ast.get_source_segment(source, node) or ''}".strip())
                break
    return found


@pytest.mark.parametrize(
    "code",
    [
        "assert time.monotonic() - t0 < 10",
        "assert 15 > time.time() - started",
        "assert elapsed <= 4.0",
        "assert row['wall_time_s'] < LABS[lab]['ci_budget_s']",
        "assert seconds < RUN_BOUND",
        "assert info['seconds'] < 2.0, info",
        "assert ok and took < 60 * 2",
    ],
)
def test_the_check_finds_a_wall_clock_assertion(code):
    assert wall_clock_asserts(code) != [], code


@pytest.mark.parametrize(
    "code",
    [
        "assert size * 8 / elapsed < 20e6 * 1.1",  # a rate bounded from above: slower only helps
        "assert ps_s > ring_s",  # two times measured in one run: a ratio
        "assert first['student_s'] != second['student_s']",
        "assert time.monotonic() < deadline",  # polling a deadline is not an assertion on speed
        "assert len(steps) < 10",
    ],
)
def test_the_check_leaves_rates_ratios_and_counts_alone(code):
    assert wall_clock_asserts(code) == [], code


def test_no_test_asserts_a_wall_clock_time():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        if path.resolve() == Path(__file__).resolve():
            continue  # this file's own examples
        found += wall_clock_asserts(path.read_text(), str(path.relative_to(TESTS)))
    assert found == [], "wall-clock assertions (move the budget to bench/, or use a hang guard):\n" + "\n".join(found)
