"""Numeric intervals: the released string format, and interval-tree hierarchies.

Released numeric generalizations are written ``"[lo-hi]"`` (closed interval, both bounds inclusive),
bounds in plain positional notation (never an exponent: ``1e-07`` is written ``0.0000001``), integral
values without a decimal point (``"[30-39]"``).  A class whose members share one value is still written
as an interval (``"[39-39]"``); :func:`parse_interval` also accepts a bare number ``"39"``.  Negative
bounds keep their sign: ``"[-5--1]"`` is ``[-5, -1]`` and ``"[-5-3]"`` is ``[-5, 3]``; the format is
unambiguous because the separator is the first ``-`` that follows a digit of the lower bound.

Interval-tree hierarchies (issue 2, "hierarchies ... can also be built for numeric attributes as interval
trees") turn a numeric attribute into a categorical one: the leaves are the finest bins, each coarser
level merges aligned bins of a larger width, the root is ``*``.  Bin a column with :func:`assign_bins`
(leaf indices) or :func:`bin_values` (leaf labels) and declare the attribute categorical with the
hierarchy.  Every level's width must be a multiple of the previous one so that bins nest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from decimal import Decimal
from fractions import Fraction

import numpy as np

from stream_anon.core.hierarchy import Hierarchy

__all__ = [
    "IntervalFormatError",
    "format_number",
    "format_interval",
    "parse_interval",
    "parse_interval_exact",
    "bin_labels",
    "assign_bins",
    "bin_values",
    "interval_hierarchy",
]

MAX_INTERVAL_LEAVES = 4096  # the hierarchy keeps an (M, M) LCA table

_NUM = r"-?(?:\d+(?:\.\d*)?|\.\d+)"
_INTERVAL_RE = re.compile(rf"^\[\s*({_NUM})\s*-\s*({_NUM})\s*\]$")
_SINGLE_RE = re.compile(rf"^\s*({_NUM})\s*$")


class IntervalFormatError(ValueError):
    """A string is not a released interval ``"[lo-hi]"`` (or a single number)."""


def format_number(x: float | int | Fraction | Decimal | np.integer | np.floating) -> str:
    """Plain positional notation, no exponent; integral values without a decimal point; ``-0`` as ``0``."""
    if isinstance(x, Fraction):
        if x.denominator == 1:
            return str(x.numerator)
        x = float(x)
    if isinstance(x, int | np.integer):
        return str(int(x))
    if isinstance(x, Decimal):
        d = x
    else:
        xf = float(x)
        if not math.isfinite(xf):
            raise IntervalFormatError(f"interval bound must be finite, got {x!r}")
        if xf.is_integer():
            return str(int(xf))
        d = Decimal(repr(xf))  # shortest round-tripping decimal
    text = format(d, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def format_interval(lo: float | int | Fraction | Decimal, hi: float | int | Fraction | Decimal) -> str:
    """The released string of a numeric generalization: ``"[lo-hi]"`` (``lo <= hi`` required)."""
    if hi < lo:
        raise IntervalFormatError(f"interval lower bound {lo!r} exceeds upper bound {hi!r}")
    return f"[{format_number(lo)}-{format_number(hi)}]"


def _match(text: str) -> tuple[str, str]:
    if not isinstance(text, str):
        raise IntervalFormatError(f"expected an interval string '[lo-hi]', got {type(text).__name__} {text!r}")
    text = text.strip()
    m = _INTERVAL_RE.match(text)
    if m is not None:
        return m.group(1), m.group(2)
    m = _SINGLE_RE.match(text)
    if m is not None:
        return m.group(1), m.group(1)
    raise IntervalFormatError(f"not an interval: {text!r}; expected '[lo-hi]' (e.g. '[30-39]', '[-5--1]') or a number")


def parse_interval(text: str) -> tuple[float, float]:
    """Inverse of :func:`format_interval`: ``"[30-39]" -> (30.0, 39.0)``; ``"39" -> (39.0, 39.0)``."""
    a, b = _match(text)
    lo, hi = float(a), float(b)
    if hi < lo:
        raise IntervalFormatError(f"interval {text!r}: lower bound exceeds upper bound")
    return lo, hi


def parse_interval_exact(text: str) -> tuple[Fraction, Fraction]:
    """As :func:`parse_interval`, with the decimal bounds as exact fractions (``"0.1"`` is 1/10)."""
    a, b = _match(text)
    lo, hi = Fraction(a), Fraction(b)
    if hi < lo:
        raise IntervalFormatError(f"interval {text!r}: lower bound exceeds upper bound")
    return lo, hi


# ---------------------------------------------------------------------------------------------- binning
def _dec(x: float) -> Decimal:
    """The decimal the user meant (``0.1`` is 1/10, not the binary double) so bin edges carry no float noise."""
    return Decimal(repr(float(x))) if not float(x).is_integer() else Decimal(int(float(x)))


def _check_domain(lo: float, hi: float, width: float, integer: bool, what: str = "width") -> int:
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise ValueError(f"interval domain: need finite lo < hi, got lo={lo!r}, hi={hi!r}")
    if not (math.isfinite(width) and width > 0):
        raise ValueError(f"interval {what}: must be > 0, got {width!r}")
    if integer and (not float(lo).is_integer() or not float(hi).is_integer() or not float(width).is_integer()):
        raise ValueError(f"integer intervals need integral lo, hi and {what}s, got lo={lo!r}, hi={hi!r}, {what}={width!r}")
    span = (_dec(hi) - _dec(lo) + (1 if integer else 0)) / _dec(width)
    return max(1, int(span.to_integral_value(rounding="ROUND_CEILING")))


def _bin_starts(lo: float, width: float, n: int) -> list[Decimal]:
    return [_dec(lo) + i * _dec(width) for i in range(n)]


def _bin_label(start: Decimal, hi: float, width: float, last: bool, integer: bool) -> str:
    if integer:
        return format_interval(start, min(start + _dec(width) - 1, _dec(hi)))
    if last:
        return format_interval(start, _dec(hi))
    return f"[{format_number(start)}-{format_number(start + _dec(width))})"  # half-open, except the last bin


def bin_labels(lo: float, hi: float, width: float, *, integer: bool = True) -> list[str]:
    """Labels of the bins of ``width`` aligned at ``lo`` covering ``[lo, hi]``.

    Integer domains: closed integer bins ``[lo + i*w, lo + (i+1)*w - 1]`` (e.g. ``"[30-34]"``), the last one
    clipped at ``hi``.  Real domains: half-open bins ``"[a-b)"``, the last one closed ``"[a-hi]"``; edges are
    computed in decimal (``lo``, ``hi``, ``width`` as written), so ``0.1``-wide bins read ``[0.2-0.3)``.
    """
    n = _check_domain(lo, hi, width, integer)
    return [_bin_label(s, hi, width, i == n - 1, integer) for i, s in enumerate(_bin_starts(lo, width, n))]


def assign_bins(values: Sequence[float] | np.ndarray, lo: float, hi: float, width: float, *,
                integer: bool = True) -> np.ndarray:
    """Leaf (finest-bin) index of every value, vectorized: the last bin whose start is ``<= x``.

    Values outside ``[lo, hi]`` (or not finite) raise ``ValueError`` naming the value and its position.
    """
    n = _check_domain(lo, hi, width, integer)
    x = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(x) | (x < lo) | (x > hi)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"value {float(x.flat[i])!r} at position {i} is outside the interval domain [{lo}, {hi}]")
    starts = np.array([float(s) for s in _bin_starts(lo, width, n)], dtype=np.float64)
    return (np.searchsorted(starts, x, side="right") - 1).astype(np.int64)


def bin_values(values: Sequence[float] | np.ndarray, lo: float, hi: float, width: float, *,
               integer: bool = True) -> list[str]:
    """The finest-bin label of every value (the leaf of :func:`interval_hierarchy` it falls in)."""
    labels = bin_labels(lo, hi, width, integer=integer)
    return [labels[i] for i in assign_bins(values, lo, hi, width, integer=integer)]


def interval_hierarchy(name: str, lo: float, hi: float, widths: Sequence[float], *, integer: bool = True,
                       root: str = "*") -> Hierarchy:
    """An interval-tree hierarchy over ``[lo, hi]``: leaves are bins of ``widths[0]``, each next level bins of
    ``widths[j]`` (a multiple of ``widths[j-1]``), all aligned at ``lo``; the root ``*`` covers everything.

    Example: ``interval_hierarchy("age", 17, 90, [5, 10, 20])`` has leaves ``[17-21], [22-26], ...``.
    """
    if not widths:
        raise ValueError("interval_hierarchy: widths must name at least one bin width, got []")
    ws = [float(w) for w in widths]
    counts = [_check_domain(lo, hi, w, integer, what=f"widths[{j}]") for j, w in enumerate(ws)]
    for j in range(1, len(ws)):
        ratio = _dec(ws[j]) / _dec(ws[j - 1])
        if ratio < 1 or ratio != ratio.to_integral_value():
            raise ValueError(f"interval_hierarchy: widths[{j}]={widths[j]!r} must be a multiple of "
                             f"widths[{j - 1}]={widths[j - 1]!r} (bins must nest)")
    if counts[0] > MAX_INTERVAL_LEAVES:
        raise ValueError(f"interval_hierarchy: {counts[0]} leaves with widths[0]={widths[0]!r}; at most "
                         f"{MAX_INTERVAL_LEAVES} allowed (the hierarchy keeps an M x M table)")
    level_labels = [bin_labels(lo, hi, w, integer=integer) for w in ws]
    leaves_per_bin = [int(_dec(w) / _dec(ws[0])) for w in ws]  # exact integer nesting, no float floor
    rows = []
    for i in range(counts[0]):
        row = [level_labels[0][i]]
        for j in range(1, len(ws)):
            row.append(level_labels[j][min(i // leaves_per_bin[j], counts[j] - 1)])
        row.append(root)
        rows.append(row)
    return Hierarchy.from_rows(name, rows)
