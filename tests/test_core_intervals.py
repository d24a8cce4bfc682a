"""Released interval strings and interval-tree hierarchies."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.intervals import (
    IntervalFormatError,
    assign_bins,
    bin_labels,
    bin_values,
    format_interval,
    format_number,
    interval_hierarchy,
    parse_interval,
    parse_interval_exact,
)


def test_format_examples() -> None:
    assert format_interval(30, 39) == "[30-39]"
    assert format_interval(30.0, 39.0) == "[30-39]"
    assert format_interval(39, 39) == "[39-39]"
    assert format_interval(-5, -1) == "[-5--1]"
    assert format_interval(-0.0, 2.5) == "[0-2.5]"
    assert format_interval(1e-7, 1.5e17) == "[0.0000001-150000000000000000]"
    assert format_number(Fraction(7, 2)) == "3.5" and format_number(np.int64(12)) == "12"
    with pytest.raises(IntervalFormatError, match="exceeds upper bound"):
        format_interval(3, 2)
    with pytest.raises(IntervalFormatError, match="finite"):
        format_interval(0, float("inf"))


def test_parse_examples() -> None:
    assert parse_interval("[30-39]") == (30.0, 39.0)
    assert parse_interval("[-5--1]") == (-5.0, -1.0)
    assert parse_interval("[-5-3]") == (-5.0, 3.0)
    assert parse_interval(" [ 1.5 - 2 ] ") == (1.5, 2.0)
    assert parse_interval("42") == (42.0, 42.0) and parse_interval("-2.5") == (-2.5, -2.5)
    assert parse_interval_exact("[0.1-0.3]") == (Fraction(1, 10), Fraction(3, 10))
    for bad in ["", "[1e5-3]", "30-39", "[a-b]", "[5-3]", "[1-2", "[--1-2]"]:
        with pytest.raises(IntervalFormatError):
            parse_interval(bad)


@given(st.floats(-1e12, 1e12, allow_nan=False), st.floats(-1e12, 1e12, allow_nan=False))
def test_format_parse_round_trip(a: float, b: float) -> None:
    lo, hi = min(a, b), max(a, b)
    assert parse_interval(format_interval(lo, hi)) == (lo + 0.0, hi + 0.0)


@given(st.integers(-10**15, 10**15), st.integers(0, 10**6))
def test_integer_round_trip_is_exact(lo: int, width: int) -> None:
    text = format_interval(lo, lo + width)
    assert parse_interval_exact(text) == (lo, lo + width)
    assert "e" not in text


def test_integer_interval_hierarchy() -> None:
    h = interval_hierarchy("age", 17, 90, [5, 10, 20])
    assert h.leaves[:3] == ("[17-21]", "[22-26]", "[27-31]") and h.leaves[-1] == "[87-90]"
    assert h.n_leaves == 15 and h.height == 3
    assert h.label_of_range(0, 1) == "[17-26]" and h.label_of_range(0, 3) == "[17-36]"
    assert h.label_of_range(0, 14) == "*"
    assert h.label_of_range(14, 14) == "[87-90]"
    # round trip through the ARX CSV layout
    again = Hierarchy.from_csv_text(h.to_csv_text(), "age")
    assert again.node_labels == h.node_labels and np.array_equal(again.lca, h.lca)
    assert bin_labels(17, 90, 5) == list(h.leaves)
    idx = assign_bins([17, 21, 22, 89, 90], 17, 90, 5)
    assert idx.tolist() == [0, 0, 1, 14, 14]
    assert bin_values([30, 34, 35], 17, 90, 5) == ["[27-31]", "[32-36]", "[32-36]"]
    # every value's bin label parses back to an interval containing it
    values = np.arange(17, 91)
    for v, label in zip(values, bin_values(values, 17, 90, 5), strict=True):
        lo, hi = parse_interval(label)
        assert lo <= v <= hi


def test_real_interval_hierarchy_has_exact_decimal_edges() -> None:
    h = interval_hierarchy("x", 0, 1, [0.1, 0.2, 0.4], integer=False)
    assert h.leaves[:4] == ("[0-0.1)", "[0.1-0.2)", "[0.2-0.3)", "[0.3-0.4)")
    assert h.leaves[-1] == "[0.9-1]"
    assert assign_bins([0.0, 0.1, 0.3, 0.6, 0.99, 1.0], 0, 1, 0.1, integer=False).tolist() == [0, 1, 3, 6, 9, 9]
    assert Hierarchy.from_csv_text(h.to_csv_text(), "x").to_csv_text() == h.to_csv_text()


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match=r"widths\[1\]=15 must be a multiple of widths\[0\]=10"):
        interval_hierarchy("a", 0, 99, [10, 15])
    with pytest.raises(ValueError, match="at least one bin width"):
        interval_hierarchy("a", 0, 99, [])
    with pytest.raises(ValueError, match="must be > 0"):
        bin_labels(0, 10, 0)
    with pytest.raises(ValueError, match="lo < hi"):
        bin_labels(5, 5, 1)
    with pytest.raises(ValueError, match="integral"):
        bin_labels(0, 10, 2.5)
    with pytest.raises(ValueError, match=r"value 100.0 at position 1 is outside the interval domain \[0, 99\]"):
        assign_bins([3, 100], 0, 99, 10)
    with pytest.raises(ValueError, match="at most 4096"):
        interval_hierarchy("fnlwgt", 0, 1_000_000, [10])
