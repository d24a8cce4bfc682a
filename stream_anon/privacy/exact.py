"""Finite mechanisms in exact arithmetic: integer probability tables, their exact epsilon, exact sampling.

A finite local mechanism maps an input index i (0..R-1) to an output index j (0..C-1).  Here it is *defined*
by an integer table W: every row sums to exactly 2^k and every entry is at least 1, so

    P(j | i) = W[i, j] / 2^k          exactly (a dyadic rational),

every output is reachable from every input, and the mechanism's epsilon for a neighbouring relation
"|i - i'| <= r" is

    eps = max_{|i - i'| <= r, j} ln(W[i, j] / W[i', j]),

a maximum over ratios of integers, found exactly (integer comparisons and :class:`fractions.Fraction`) and
then rounded UP to a double: :func:`log_ratio_upper` returns ln(ratio) computed in binary64 plus
``LOG_MARGIN`` = 2^-40 (about 9.1e-13), which exceeds the rounding error of that computation (below 1e-14 for
ratios up to 2^64), so the stated value is an upper bound of the exact one and above it by less than 1e-12.

Sampling is an inverse CDF in integers: one ``rng.integers(0, 2^k)`` per value, then a vectorized branchless
binary search of fixed depth ceil(log2 C) in row i of the cumulative table, so the output distribution is
exactly W / 2^k for a generator whose integers are uniform (numpy maps a power-of-two range onto one 64-bit
word without rejection).  Every value costs the same operations: no data-dependent loop or rejection (the
memory addresses read do depend on the row and the draw; see docs/privacy-numeric.md on timing).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from stream_anon.core.validation import require_int
from stream_anon.privacy.base import PrivacyParameterError, parameter_error

__all__ = [
    "LOG_MARGIN",
    "IntegerTable",
    "integer_weights",
    "log_ratio_upper",
    "TABLE_BITS",
    "UNIFORM_GRID_BITS",
    "max_ratio",
]

LOG_MARGIN = 2.0 ** -40
"""Added to a double-precision ln(ratio) so the stated epsilon is an upper bound of the exact one."""

UNIFORM_GRID_BITS = 53
"""numpy's ``Generator.random()`` returns k * 2^-53 (the top 53 bits of one 64-bit word), for every bit generator:
the exact epsilon of a sampler driven by ``random()`` is computed on that grid (k-RR, FRAPP)."""


def log_ratio_upper(ratio: Fraction) -> float:
    """ln(ratio) rounded up: ln(float(ratio)) + LOG_MARGIN.

    float(Fraction) is correctly rounded (relative error <= 2^-53, i.e. <= 1.2e-16 on the log) and libm's
    log is faithful (< 1 ulp, <= 7.2e-15 for results below 64), so the margin 2^-40 covers both.
    """
    if ratio <= 0:
        raise PrivacyParameterError(f"ratio: must be positive, got {ratio}")
    return math.log(float(ratio)) + LOG_MARGIN


TABLE_BITS = 62
"""k of the tables: probabilities are multiples of 2^-62 (the smallest is 2^-62 = 2.2e-19)."""


def integer_weights(probabilities: np.ndarray, bits: int) -> np.ndarray:
    """Integer weights with rows summing to exactly 2^bits, every entry >= 1, close to ``probabilities``.

    W = max(1, floor(p * 2^bits)) (exact: scaling by a power of two is exact in binary64), then the row's
    deficit (or surplus, from the clamping) is put on the row's largest entry (>= 2^bits / C, so it stays
    >= 1).  The rows of ``probabilities`` need not sum to 1 exactly; they are normalized first.
    """
    p = np.asarray(probabilities, dtype=np.float64)
    if p.ndim != 2 or not np.all(np.isfinite(p)) or np.any(p < 0):
        raise PrivacyParameterError("probabilities: need a finite, non-negative 2-D array")
    bits = require_int("bits", bits, low=1, high=62, error=parameter_error)
    p = p / p.sum(axis=1, keepdims=True)
    total = np.int64(1) << np.int64(bits)
    w: np.ndarray = np.maximum(np.floor(p * float(total)).astype(np.int64), 1)
    deficit = total - w.sum(axis=1)
    top = np.argmax(w, axis=1)
    rows = np.arange(w.shape[0])
    w[rows, top] += deficit
    if np.any(w[rows, top] < 1):
        raise PrivacyParameterError(f"probabilities: {w.shape[1]} outputs do not fit into 2^{bits} weights")
    assert np.all(w.sum(axis=1) == total)
    return w


def _sliding_min(w: np.ndarray, radius: int) -> np.ndarray:
    """m[i, j] = min over rows i' with |i' - i| <= radius of w[i', j] (exact, int64; O(R C log radius)).

    Forward minima over [i, i + radius] by doubling (a sparse table), then the centred window is
    min(forward[max(i - radius, 0)], forward[i]).
    """
    n = w.shape[0]
    if radius <= 0:
        return w.copy()
    if radius >= n - 1:
        return np.broadcast_to(w.min(axis=0), w.shape).copy()
    length = radius + 1
    level, span = w.copy(), 1
    while span * 2 <= length:  # level[i] = min of rows [i, i + 2 span - 1] (truncated at the end)
        nxt = level.copy()
        nxt[: n - span] = np.minimum(level[: n - span], level[span:])
        level, span = nxt, span * 2
    fwd = level.copy()
    shift = length - span  # span <= length < 2 span: two overlapping windows cover [i, i + radius]
    if shift > 0:
        fwd[: n - shift] = np.minimum(level[: n - shift], level[shift:])
    back = fwd[np.maximum(np.arange(n) - radius, 0)]
    window_min: np.ndarray = np.minimum(fwd, back)
    return window_min


def max_ratio(weights: np.ndarray, radius: int | None = None) -> tuple[Fraction, tuple[int, int, int]]:
    """Exact max of W[i, j] / W[i', j] over |i - i'| <= radius (None: all pairs) and returns (ratio, (i, i', j)).

    The maximum is located in floating point (log of int64 weights, error ~1e-16) and decided among all
    candidates within 1e-9 of it with exact integer arithmetic.
    """
    w = np.asarray(weights)
    if w.ndim != 2 or w.dtype.kind not in "iu" or np.any(w < 1):
        raise PrivacyParameterError("weights: need a 2-D integer array with every entry >= 1")
    n = w.shape[0]
    r = n - 1 if radius is None else min(int(radius), n - 1)
    if r <= 0:
        return Fraction(1), (0, 0, 0)
    wmin = _sliding_min(w, r)
    logr = np.log(w.astype(np.float64)) - np.log(wmin.astype(np.float64))
    best_f = float(logr.max())
    cand = np.argwhere(logr >= best_f - 1e-9)
    best = Fraction(0)
    where = (0, 0, 0)
    for i, j in cand:
        lo, hi = max(0, i - r), min(n, i + r + 1)
        col = w[lo:hi, j]
        i2 = lo + int(np.argmin(col))
        ratio = Fraction(int(w[i, j]), int(w[i2, j]))
        if ratio > best:
            best, where = ratio, (int(i), int(i2), int(j))
    return best, where


class IntegerTable:
    """A finite mechanism P(j | i) = weights[i, j] / 2^bits, with its exact sampler (see module docstring).

    ``weights`` (R, C) int64, entries >= 1, rows summing to 2^bits (default ``TABLE_BITS`` = 62); read-only.
    """

    def __init__(self, weights: np.ndarray, bits: int) -> None:
        w = np.array(weights, dtype=np.int64)
        bits = require_int("bits", bits, low=1, high=62, error=parameter_error)
        if w.ndim != 2 or np.any(w < 1) or np.any(w.sum(axis=1) != (np.int64(1) << np.int64(bits))):
            raise PrivacyParameterError(f"weights: rows must sum to 2^{bits} with every entry >= 1")
        w.setflags(write=False)
        self.weights = w
        self.bits = int(bits)
        # cumulative rows padded to a power-of-two width with 2^bits (never <= a draw u < 2^bits)
        depth = max(0, math.ceil(math.log2(w.shape[1])))
        padded = np.full((w.shape[0], 1 << depth), np.int64(1) << np.int64(bits), dtype=np.int64)
        padded[:, : w.shape[1]] = np.cumsum(w, axis=1)
        flat = padded.ravel()
        flat.setflags(write=False)
        self._flat_cum = flat
        self._depth = depth

    @classmethod
    def from_probabilities(cls, probabilities: np.ndarray, bits: int | None = None) -> IntegerTable:
        """The table closest to ``probabilities`` (see :func:`integer_weights`); bits default table_bits(R)."""
        p = np.asarray(probabilities, dtype=np.float64)
        k = TABLE_BITS if bits is None else int(bits)
        return cls(integer_weights(p, k), k)

    def __repr__(self) -> str:
        return f"IntegerTable({self.n_inputs} x {self.n_outputs}, bits={self.bits})"

    @property
    def n_inputs(self) -> int:
        return int(self.weights.shape[0])

    @property
    def n_outputs(self) -> int:
        return int(self.weights.shape[1])

    @property
    def probabilities(self) -> np.ndarray:
        """W / 2^bits as float64 (for estimators; the exact values are the integers)."""
        return self.weights.astype(np.float64) / float(np.int64(1) << np.int64(self.bits))

    def max_ratio(self, radius: int | None = None) -> tuple[Fraction, tuple[int, int, int]]:
        return max_ratio(self.weights, radius)

    def epsilon(self, radius: int | None = None) -> float:
        """Upper bound (by < 1e-12) of the exact eps for neighbours |i - i'| <= radius (None: all pairs)."""
        ratio, _ = max_ratio(self.weights, radius)
        return 0.0 if ratio == 1 else log_ratio_upper(ratio)

    def sample(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One output index per input index in ``rows`` (int64 array, values 0..R-1), exactly distributed.

        u = rng.integers(0, 2^bits) and j = #{c : cum_i[c] <= u}, found by a branchless binary search of fixed
        depth ceil(log2 C) over row i of the padded cumulative table: the same operations for every value.
        """
        r = np.asarray(rows, dtype=np.int64)
        u = rng.integers(0, np.int64(1) << np.int64(self.bits), size=r.shape, dtype=np.int64)
        return self.lookup(r, u)

    def lookup(self, rows: np.ndarray, u: np.ndarray) -> np.ndarray:
        """The output index for input ``rows`` and uniform integers ``u`` in [0, 2^bits) (the inverse CDF)."""
        width = np.int64(1) << np.int64(self._depth)
        base = np.asarray(rows, dtype=np.int64) * width
        pos = base.copy()
        step = int(width) >> 1
        flat = self._flat_cum
        while step:
            pos += (flat[pos + (step - 1)] <= u) * np.int64(step)
            step >>= 1
        return pos - base
