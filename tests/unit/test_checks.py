"""One wording for one mistake: lab_utils.checks, which every public function's argument checks use."""

from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from lab_utils import checks
from lab_utils.hub.store import durable_file


@pytest.mark.parametrize("value", [1, 7, np.int64(3)])
def test_a_count_is_an_int_of_at_least_low(value):
    got = checks.count("workers", value)
    assert got == value and type(got) is int


@pytest.mark.parametrize("value", [0, -2, True, 2.0, "2", None, np.float64(2)])
def test_anything_else_is_refused_naming_the_argument_and_the_value(value):
    with pytest.raises(ValueError, match=rf"^workers must be an integer >= 1, got {value!r}$"):
        checks.count("workers", value)


def test_the_lower_bound_is_the_callers():
    assert checks.count("top", 0, low=0) == 0
    with pytest.raises(ValueError, match="max_samples must be an integer >= 2, got 1"):
        checks.count("max_samples", 1, low=2)


def test_counts_are_a_non_empty_list_of_counts():
    assert checks.counts("sizes", (1, np.int32(4))) == [1, 4]
    for bad in ([], [1, 0], [2, True]):
        with pytest.raises(ValueError, match="sizes must be a non-empty list of integers >= 1"):
            checks.counts("sizes", bad)


def test_seconds_are_finite_and_above_zero_and_none_only_where_allowed():
    assert checks.seconds("deadline", 2) == 2.0 and checks.seconds("timeout", None, optional=True) is None
    for bad in (0, -1.5, math.inf, math.nan, True, "5"):
        with pytest.raises(ValueError, match=r"deadline must be a number of seconds > 0, got"):
            checks.seconds("deadline", bad)
    with pytest.raises(ValueError, match=r"timeout must be a number of seconds > 0 or None, got 0"):
        checks.seconds("timeout", 0, optional=True)
    with pytest.raises(ValueError, match=r"deadline must be a number of seconds > 0, got None"):
        checks.seconds("deadline", None)


def test_at_least_is_an_argparse_type_whose_error_names_the_option(capsys):
    p = argparse.ArgumentParser(prog="ring_check")
    p.add_argument("--sizes", type=checks.at_least(0), nargs="+")
    assert p.parse_args(["--sizes", "0", "8"]).sizes == [0, 8]
    for bad in ("-1", "2.5", "many"):
        with pytest.raises(SystemExit):
            p.parse_args(["--sizes", "4", bad])
        assert f"argument --sizes: must be an integer >= 0, got {bad!r}" in capsys.readouterr().err


def test_a_durable_file_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "receipt.json"
    with durable_file(target) as f:
        f.write(b"one")
    assert target.read_bytes() == b"one"
    with pytest.raises(RuntimeError, match="disk full"), durable_file(target) as f:
        f.write(b"half of two")
        raise RuntimeError("disk full")
    assert target.read_bytes() == b"one" and sorted(p.name for p in tmp_path.iterdir()) == ["receipt.json"]
