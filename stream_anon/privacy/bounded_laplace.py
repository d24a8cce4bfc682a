"""Bounded Laplace on a public grid with an exact epsilon, and its discretization for categories.

References
----------
* Korean patent KR 10-2456177 (bounded Laplace on [-1, 1], b = 2/eps, stochastic discretization for categories).
* N. Holohan, S. Antonatos, S. Braghin, P. Mac Aonghusa, "The Bounded Laplace Mechanism in Differential
  Privacy", Journal of Privacy and Confidentiality 10(1), 2020 (the normalizer term of eps).
* I. Mironov, "On significance of the least significant bits for differential privacy", CCS 2012 (why the
  textbook floating-point sampler is not eps-DP: the set of reachable doubles depends on the input).
* C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020 and
  OpenDP's discrete Laplace (the test oracle of the grid pmf and of its privacy map).

**The grid mechanism (default).**  The public domain [lower, upper] is cut into a public grid of M points
y_0 = lower < y_1 < ... < y_{M-1} = upper, step s = (upper - lower) / (M - 1) (:func:`grid_for_domain`:
the integer grid for ``integer=True`` domains of width <= 1024, else 2^8 intervals, i.e. the power-of-two step
2^-7 on the normalized scale [-1, 1]).  A value on the grid, index i, is replaced by index j with

    P(j | i) = W[i, j] / 2^62,   W = integer weights of  exp(-|j - i| / t) / Z_i   (t = b / s, scale in steps),

the truncated discrete Laplace (the discrete Laplace of OpenDP conditioned on the grid), stored as integers
(every W[i, j] >= 1, every row summing to exactly 2^62; :mod:`stream_anon.privacy.exact`).  That table IS the
mechanism: its epsilon for the neighbouring relation is the maximum log-ratio of table entries, computed
exactly and rounded up by < 1e-12, and sampling draws exactly from it with integers.  A value between two grid
points is first rounded to one of them at random, unbiasedly (a mixture of two rows: with all values
neighbours, any mixture keeps the table's eps; for a smaller ``sensitivity`` the relation is widened by one step).
``calibration="exact"`` (default) bisects t until the exact eps meets the target;  ``"patent"`` uses
b = sensitivity / eps (= 2/eps on [-1, 1]: the seed patent) and states the exact eps that scale gives.

The continuous sampler of the earlier versions (binary64 inverse CDF) is kept only behind
``unsafe_float=True``: it is eps-DP only for the ideal real-valued mechanism; in binary64 a share of its outputs
cannot be produced from a neighbouring input (``stream_anon.bench.reachability``), so its eps is infinite.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any, Literal

import numpy as np

from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, check_int, crypto_rng
from stream_anon.privacy.exact import IntegerTable
from stream_anon.privacy.frequency import FrequencyEstimate
from stream_anon.privacy.mechanism import CategoricalDomain, IntervalDomain, LocalMechanism

__all__ = [
    "DEFAULT_REAL_GRID_INTERVALS",
    "MAX_GRID_INTERVALS",
    "BoundedLaplace",
    "DiscretizedBoundedLaplace",
    "actual_epsilon",
    "bounded_laplace_scale",
    "calibrate_grid_scale",
    "discretized_epsilon",
    "discretized_transition_matrix",
    "grid_epsilon",
    "grid_for_domain",
    "grid_laplace_table",
    "normalizer_ratio",
]

OutOfBounds = Literal["error", "clip"]
Calibration = Literal["exact", "patent"]

MAX_GRID_INTERVALS = 1024
"""At most this many grid intervals (tables of (M x M) int64: 8.4 MB at the maximum)."""
DEFAULT_REAL_GRID_INTERVALS = 256
"""Grid of a real domain: 2^8 intervals, i.e. step 2^-7 on the normalized scale [-1, 1]."""


# ------------------------------------------------------------- continuous scale theory (Holohan et al. 2020)
def normalizer_ratio(scale: float, sensitivity: float, width: float) -> float:
    """dC(b) of Holohan et al. (2020): max over neighbours of C_q' / C_q (>= 1; 1 when sensitivity == width)."""
    b, dq, w = float(scale), float(sensitivity), float(width)
    num = -math.expm1(-dq / b) - math.expm1(-(w - dq) / b)
    den = -math.expm1(-w / b)
    return num / den


def actual_epsilon(scale: float, sensitivity: float, width: float) -> float:
    """Exact eps of the bounded Laplace with this scale: dQ / b + ln dC(b) (tight for delta = 0).

    The bound is attained at q = lower, q' = lower + dQ, output y = lower (Holohan et al. 2020), e.g.
    sensitivity 1 on [-1, 1] with the naive b = 1 gives 1 + ln dC(1) = 1.38, not 1.
    """
    _check_positive(scale, "scale")
    dq = min(float(sensitivity), float(width))
    return dq / scale + math.log(normalizer_ratio(scale, dq, width))


def bounded_laplace_scale(*, epsilon: float, sensitivity: float, width: float, delta: float = 0.0) -> float:
    """Smallest scale b with dQ / b + ln dC(b) <= eps - ln(1 - delta) (Holohan et al. 2020, fixed point).

    Solved by bisection to machine precision; the returned value is on the safe side of the fixed point.
    A sensitivity above the width is replaced by the width (no two inputs of the domain differ by more).
    """
    eps = check_epsilon(epsilon)
    _check_positive(sensitivity, "sensitivity")
    _check_positive(width, "width")
    if not (0.0 <= delta < 1.0):
        raise PrivacyParameterError(f"delta: must be in [0, 1), got {delta!r}")
    dq = min(float(sensitivity), float(width))
    budget = eps - math.log1p(-delta)

    def loss(b: float) -> float:
        return dq / b + math.log(normalizer_ratio(b, dq, width))

    lo = dq / budget  # loss(lo) >= budget since ln dC >= 0
    if loss(lo) <= budget:
        return lo
    hi = lo * 2.0
    while loss(hi) > budget:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if loss(mid) > budget:
            lo = mid
        else:
            hi = mid
    return hi


def _check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise PrivacyParameterError(f"{name}: expected a positive number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not (v > 0) or math.isinf(v):
        raise PrivacyParameterError(f"{name}: must be in (0, inf), got {value!r}")
    return v


def _check_finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise PrivacyParameterError(f"{name}: expected a finite number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise PrivacyParameterError(f"{name}: must be finite, got {value!r}")
    return v


# ------------------------------------------------------- continuous closed forms (ideal real-valued mechanism)
def _normalizer(q: np.ndarray, b: float) -> np.ndarray:
    """C_q = 1 - (exp(-(q+1)/b) + exp(-(1-q)/b)) / 2 on [-1, 1]."""
    return -0.5 * (np.expm1(-(q + 1.0) / b) + np.expm1(-(1.0 - q) / b))


def _bias_n(q: np.ndarray, b: float) -> np.ndarray:
    """E[Y] - q on [-1, 1] (diffprivlib/Holohan closed form with lower=-1, upper=1)."""
    a = np.exp(-(q + 1.0) / b)
    c = np.exp(-(1.0 - q) / b)
    return ((b + 1.0 + q) / 2.0 * a - (b + 1.0 - q) / 2.0 * c) / _normalizer(q, b)


def _variance_n(q: np.ndarray, b: float) -> np.ndarray:
    a = np.exp(-(q + 1.0) / b)
    c = np.exp(-(1.0 - q) / b)
    second = (q * q - (a + c) / 2.0 - b * (a + c) + b * b * (2.0 - a - c)) / _normalizer(q, b)
    mean = q + _bias_n(q, b)
    return np.maximum(second - mean * mean, 0.0)


def _cdf_n(y: np.ndarray, q: np.ndarray, b: float) -> np.ndarray:
    """P(Y <= y | q) on [-1, 1]."""
    y = np.clip(y, -1.0, 1.0)
    left_mass = -0.5 * np.expm1(-(q + 1.0) / b)
    below = np.where(
        y < q,
        0.5 * (np.exp(-(q - y) / b) - np.exp(-(q + 1.0) / b)),
        left_mass - 0.5 * np.expm1(-(y - q) / b),
    )
    return np.clip(below / _normalizer(q, b), 0.0, 1.0)


def _sample_n(q: np.ndarray, b: float, rng: np.random.Generator) -> np.ndarray:
    """UNSAFE binary64 inverse-CDF draws from f_q on [-1, 1] (``unsafe_float=True`` only; one uniform per value).

    Exact for real numbers; in binary64 the set of reachable outputs depends on q (Mironov 2012), see
    :func:`_sample_n_from_uniform` and ``stream_anon.bench.reachability``.

    The mass left of q is (1 - exp(-(q+1)/b)) / 2, right of q (1 - exp(-(1-q)/b)) / 2.  A uniform u scaled to the
    total picks the side and, rescaled within it, the quantile w of a truncated exponential on [0, a]:
    distance d = -b log(1 - w (1 - exp(-a/b))).
    """
    return _sample_n_from_uniform(q, b, rng.random(q.shape))


def _sample_n_from_uniform(q: np.ndarray, b: float, uniform: np.ndarray) -> np.ndarray:
    """The binary64 map (input q, uniform u in [0, 1)) -> output of the unsafe sampler (deterministic)."""
    m_left = -np.expm1(-(q + 1.0) / b)
    m_right = -np.expm1(-(1.0 - q) / b)
    u = uniform * (m_left + m_right)
    left = u < m_left
    w_m = np.where(left, u, u - m_left)  # = w * (1 - exp(-a/b)), w uniform on [0, 1) within the chosen side
    d = -b * np.log1p(-w_m)
    y = np.where(left, q - d, q + d)
    return np.clip(y, -1.0, 1.0)


# ------------------------------------------------------------------------------------------------- grid
def grid_for_domain(lower: float, upper: float, *, integer: bool = False, grid_step: float | None = None
                    ) -> tuple[int, float]:
    """(number of intervals n, step) of the public output grid lower + j * step, j = 0..n.

    ``grid_step`` given: it must divide the width into at most ``MAX_GRID_INTERVALS`` equal steps.  Else
    ``integer=True`` (integer bounds): step 1 when the width is at most ``MAX_GRID_INTERVALS``, otherwise
    ``MAX_GRID_INTERVALS`` equal (non-integer) steps; real domains: ``DEFAULT_REAL_GRID_INTERVALS`` = 2^8 steps.
    """
    width = float(upper) - float(lower)
    if grid_step is not None:
        st = _check_positive(grid_step, "grid_step")
        n = round(width / st)
        if n < 1 or abs(n * st - width) > 1e-9 * width or n > MAX_GRID_INTERVALS:
            raise PrivacyParameterError(
                f"grid_step: must divide upper - lower = {width:g} into 1..{MAX_GRID_INTERVALS} equal steps, "
                f"got {grid_step!r} ({width / st:.6g} steps)")
        return n, width / n
    if integer:
        if float(lower) != math.floor(lower) or float(upper) != math.floor(upper):
            raise PrivacyParameterError(f"integer: needs integer bounds, got [{lower!r}, {upper!r}]")
        n = int(width)
        if n <= MAX_GRID_INTERVALS:
            return n, 1.0
        return MAX_GRID_INTERVALS, width / MAX_GRID_INTERVALS
    return DEFAULT_REAL_GRID_INTERVALS, width / DEFAULT_REAL_GRID_INTERVALS


@lru_cache(maxsize=16)
def _distances(n_points: int) -> np.ndarray:
    i = np.arange(n_points, dtype=np.float64)
    d = np.abs(i[:, None] - i[None, :])
    d.setflags(write=False)
    return d


def grid_laplace_probabilities(n_points: int, scale_steps: float) -> np.ndarray:
    """exp(-|j - i| / t) / Z_i on an M-point grid (float64; the mechanism is its integer table)."""
    p = np.exp(-_distances(n_points) / float(scale_steps))
    return p / p.sum(axis=1, keepdims=True)


def _build_grid_table(n_points: int, scale_steps: float) -> IntegerTable:
    return IntegerTable.from_probabilities(grid_laplace_probabilities(n_points, scale_steps))


@lru_cache(maxsize=16)
def grid_laplace_table(n_points: int, scale_steps: float) -> IntegerTable:
    """The integer table of the truncated discrete Laplace with scale t (in steps) on M points (cached)."""
    check_int(n_points, "n_points", 2, MAX_GRID_INTERVALS + 1)
    return _build_grid_table(n_points, _check_positive(scale_steps, "scale_steps"))


def grid_epsilon(n_points: int, scale_steps: float, radius: int | None = None) -> float:
    """Exact eps (rounded up by < 1e-12) of the grid table for neighbours |i - i'| <= radius (None: all)."""
    return grid_laplace_table(n_points, scale_steps).epsilon(radius)


def _calibrate(eps_of: Callable[[float], float], target: float, guess: float, floor: float) -> float:
    """Smallest scale s (to relative 1e-12) with eps_of(s) <= target; eps_of decreases in s.

    The bracket grows geometrically around ``guess`` (relative steps 1e-9, 4e-9, ...: the continuous formulas
    are usually within 1e-6 of the answer), then bisection on log s.
    """
    step = 1e-9
    hi = guess * (1.0 + step)
    while eps_of(hi) > target:
        step *= 4.0
        if step > 1e15:
            raise PrivacyParameterError(f"epsilon: {target!r} is below what a 2^62 integer table can resolve "
                                        f"(even uniform noise states {eps_of(hi):.3g})")
        hi = guess * (1.0 + step)
    step = 1e-9
    lo = guess * (1.0 - step)
    while eps_of(lo) <= target:
        if lo <= floor:
            return lo  # even a near-deterministic table stays within the target
        hi = lo
        step = min(step * 4.0, 0.5)
        lo = max(lo * (1.0 - step), floor / 2.0)
    for _ in range(200):
        if hi / lo - 1.0 < 1e-12:
            break
        mid = math.sqrt(lo * hi)
        if eps_of(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi


@lru_cache(maxsize=256)
def calibrate_grid_scale(n_points: int, radius: int | None, epsilon: float) -> float:
    """Scale t (in grid steps) of the smallest-noise grid table whose exact eps is <= ``epsilon`` (cached)."""
    eps = check_epsilon(epsilon)
    r = n_points - 1 if radius is None else min(int(radius), n_points - 1)

    def eps_of(t: float) -> float:
        return _build_grid_table(n_points, t).epsilon(r)

    guess = bounded_laplace_scale(epsilon=eps, sensitivity=float(r), width=float(n_points - 1))
    return _calibrate(eps_of, eps, guess, floor=1.0 / 64.0)


# ------------------------------------------------------------------------------------------------ models
class _GridModel:
    """The exact grid mechanism: table, sampler, and the closed forms that follow from the table."""

    def __init__(self, lower: float, upper: float, n_intervals: int, scale_steps: float, integer_inputs: bool
                 ) -> None:
        self.lower, self.upper = lower, upper
        self.n_points = n_intervals + 1
        self.step = (upper - lower) / n_intervals
        self.integer_inputs = integer_inputs
        self.table = grid_laplace_table(self.n_points, scale_steps)
        self.P = self.table.probabilities
        values = lower + self.step * np.arange(self.n_points, dtype=np.float64)
        values[-1] = upper
        self.values = values
        self.mean_out = self.P @ values
        self.second_out = self.P @ (values * values)
        self._transforms: dict[float, np.ndarray] = {}

    # inputs -> rows
    def _position(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(lower grid index, fraction towards the next one) of each input."""
        pos = (x - self.lower) / self.step
        near = np.rint(pos)
        pos = np.where(np.abs(pos - near) <= 1e-9, near, pos)
        lo = np.clip(np.floor(pos), 0, self.n_points - 1)
        frac = np.where(lo >= self.n_points - 1, 0.0, pos - lo)
        return lo.astype(np.int64), frac

    def rows(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        if self.integer_inputs:  # validated integers in [lower, upper]: the grid index itself
            return (x - self.lower).astype(np.int64)
        lo, frac = self._position(x)
        if np.any(frac > 0):  # unbiased stochastic rounding onto the grid (a mixture of two rows)
            lo = lo + (rng.random(frac.shape) < frac)
        return lo

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return self.values[self.table.sample(self.rows(x, rng), rng)]

    def _mix(self, per_row: np.ndarray, x: np.ndarray) -> np.ndarray:
        lo, frac = self._position(x)
        hi = np.minimum(lo + 1, self.n_points - 1)
        return (1.0 - frac) * per_row[lo] + frac * per_row[hi]

    def expected_output(self, x: np.ndarray) -> np.ndarray:
        return self._mix(self.mean_out, x)

    def variance(self, x: np.ndarray) -> np.ndarray:
        m = self._mix(self.mean_out, x)
        return np.maximum(self._mix(self.second_out, x) - m * m, 0.0)

    def inverse_expected_output(self, y: np.ndarray) -> np.ndarray:
        return np.interp(y, self.mean_out, self.values)

    def slope(self, x: float) -> float:
        g = np.gradient(self.mean_out, self.values)
        return float(np.interp(x, self.values, g))

    def pmf(self, x: float) -> np.ndarray:
        lo, frac = self._position(np.asarray([x], dtype=np.float64))
        hi = min(int(lo[0]) + 1, self.n_points - 1)
        return (1.0 - frac[0]) * self.P[int(lo[0])] + frac[0] * self.P[hi]

    def cdf(self, y: np.ndarray, x: float) -> np.ndarray:
        c = np.cumsum(self.pmf(x))
        idx = np.floor((np.asarray(y, dtype=np.float64) - self.lower) / self.step + 1e-9).astype(np.int64)
        return np.where(idx < 0, 0.0, c[np.clip(idx, 0, self.n_points - 1)])

    # outputs -> estimates
    def output_index(self, y: Any) -> np.ndarray:
        yv = np.asarray(y, dtype=np.float64)
        j = np.rint((yv - self.lower) / self.step)
        jc = np.clip(j, 0, self.n_points - 1).astype(np.int64)
        off = np.abs(self.values[jc] - yv) > 1e-9 * (self.upper - self.lower)
        if np.any(off) or np.any(np.isnan(yv)):
            bad = float(yv[off | np.isnan(yv)].flat[0])
            raise PrivacyParameterError(
                f"perturbed: {bad!r} is not an output of this mechanism (grid lower + j * {self.step:g} on "
                f"[{self.lower:g}, {self.upper:g}])")
        return jc

    def transform(self, boundary_width: float) -> np.ndarray:
        """h over the grid outputs: unbiased for inputs >= w (normalized) from both bounds, minimum variance.

        w = 0: h = P^-1 x, the unique exactly unbiased transform.  w > 0: minimize sum_i Var(h | i) (uniform
        weights over the grid inputs) subject to E[h | i] = x_i for the inputs I at least w * (upper - lower) / 2
        from both bounds: h = Q^-1 A^T lam with A = P[I], Q = diag(mean_i P[i, :]), (A Q^-1 A^T) lam = x_I.
        """
        key = float(boundary_width)
        if key not in self._transforms:
            x = self.values
            half = (self.upper - self.lower) / 2.0
            dist = np.minimum(x - self.lower, self.upper - x) / half
            interior = dist >= key - 1e-12
            if interior.all():
                h = np.linalg.solve(self.P, x)
            else:
                q = self.P.mean(axis=0)
                a = self.P[interior]
                lam = np.linalg.solve((a / q) @ a.T, x[interior])
                h = (a.T @ lam) / q
            self._transforms[key] = h
        return self._transforms[key]

    def transform_bias(self, boundary_width: float) -> np.ndarray:
        """E[h | i] - x_i per grid input (0 up to rounding inside, the bias near the bounds)."""
        return self.P @ self.transform(boundary_width) - self.values


class _FloatModel:
    """The earlier binary64 sampler (ideal real-valued bounded Laplace): kept only for ``unsafe_float=True``."""

    def __init__(self, lower: float, upper: float, normalized_scale: float, snap_bits: int | None) -> None:
        self.lower, self.upper = lower, upper
        self.width = upper - lower
        self.b = normalized_scale
        self.snap_bits = snap_bits

    def to_unit(self, x: np.ndarray) -> np.ndarray:
        return np.clip((x - self.lower) * (2.0 / self.width) - 1.0, -1.0, 1.0)

    def from_unit(self, y: np.ndarray) -> np.ndarray:
        return np.clip(self.lower + (y + 1.0) * (self.width / 2.0), self.lower, self.upper)

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        y = _sample_n(self.to_unit(x), self.b, rng)
        if self.snap_bits is not None:
            step = 2.0 ** -self.snap_bits
            y = np.clip(np.round(y / step) * step, -1.0, 1.0)
        return self.from_unit(y)

    def expected_output(self, x: np.ndarray) -> np.ndarray:
        q = self.to_unit(x)
        return self.from_unit(q + _bias_n(q, self.b))

    def variance(self, x: np.ndarray) -> np.ndarray:
        return _variance_n(self.to_unit(x), self.b) * (self.width / 2.0) ** 2

    def inverse_expected_output(self, y: np.ndarray) -> np.ndarray:
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        lo = np.full(yn.shape, -1.0)
        hi = np.full(yn.shape, 1.0)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            below = mid + _bias_n(mid, self.b) < yn
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return self.from_unit(0.5 * (lo + hi))

    def slope(self, x: float) -> float:
        q = float(self.to_unit(np.asarray([x]))[0])
        h = 1e-5
        lo, hi = max(-1.0, q - h), min(1.0, q + h)
        g = np.asarray([lo, hi]) + _bias_n(np.asarray([lo, hi]), self.b)
        return float(g[1] - g[0]) / (hi - lo)

    def cdf(self, y: np.ndarray, x: float) -> np.ndarray:
        q = self.to_unit(np.asarray([x], dtype=np.float64))
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        return _cdf_n(yn, q, self.b)

    def transform_values(self, perturbed: Any, boundary_width: float) -> np.ndarray:
        """The continuous boundary-corrected transform (see ``docs/privacy-numeric.md``)."""
        w, b = boundary_width, self.b
        yn = (np.asarray(perturbed, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        c_edge = -0.5 * math.expm1(-2.0 / b)
        spike = b * c_edge / math.expm1(w / b)
        hn = yn - b * (np.exp(-(yn + 1.0) / b) - np.exp(-(1.0 - yn) / b))
        hn = hn - spike * (yn <= -1.0 + w) + spike * (yn >= 1.0 - w)
        return self.lower + (hn + 1.0) * (self.width / 2.0)

    def max_transform_bias(self, boundary_width: float) -> float:
        return 0.5 * self.b * -math.expm1(-boundary_width / self.b) * self.width / 2.0


# ---------------------------------------------------------------------------------------------- mechanism
class BoundedLaplace(LocalMechanism):
    """Bounded Laplace on a public domain [lower, upper], on a public grid, with an exact eps (module docstring).

    Parameters (keyword-only):

    * ``epsilon``: the target; ``.epsilon`` is what the mechanism really spends (computed from its integer
      table, <= the target with ``calibration="exact"``).  Give ``scale`` instead to fix b and get its eps.
    * ``lower < upper``: public bounds (never derived from data).
    * ``sensitivity``: inputs within it are neighbours (default the width: any two values are neighbours,
      the patent's dQ = 2 on [-1, 1]).
    * ``integer``: integer attribute: integer grid (see :func:`grid_for_domain`) and integer inputs only.
    * ``grid_step``: explicit grid step (must divide the width); default from the domain.
    * ``calibration``: ``"exact"`` (default: bisection until the exact eps meets ``epsilon``) or ``"patent"``
      (b = sensitivity / epsilon, e.g. 2/eps on [-1, 1]; eps stated is what that scale gives on the grid).
    * ``scale``: b in data units (instead of ``epsilon``).
    * ``out_of_bounds``: ``"error"`` (default) or ``"clip"`` inputs into the domain.
    * ``unsafe_float``: the earlier continuous binary64 sampler (Holohan scale, optional ``snap_bits``,
      ``delta``).  NOT eps-DP in floating point (``exact_epsilon`` reports inf); for comparisons only.
    * ``snap_bits``: superseded by the grid; accepted for compatibility, applied only with ``unsafe_float``.
    * ``rng``: injected generator (default ChaCha20 from OS entropy, :func:`crypto_rng`).

    Attributes: ``epsilon`` (exact, spent per value), ``target_epsilon``, ``scale`` (b, data units),
    ``normalized_scale`` (b on [-1, 1]), ``grid`` (output values), ``grid_step``, ``neighbour_steps`` (the
    relation on grid indices), ``transition_matrix`` (P[i, j] = W[i, j] / 2^62), ``table``.
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        lower: float,
        upper: float,
        sensitivity: float | None = None,
        integer: bool = False,
        grid_step: float | None = None,
        calibration: Calibration = "exact",
        scale: float | None = None,
        delta: float = 0.0,
        out_of_bounds: OutOfBounds = "error",
        unsafe_float: bool = False,
        snap_bits: int | None = None,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        if (epsilon is None) == (scale is None):
            raise PrivacyParameterError(f"give exactly one of epsilon or scale, got epsilon={epsilon!r}, "
                                        f"scale={scale!r}")
        self.target_epsilon = None if epsilon is None else check_epsilon(epsilon)
        self.lower = _check_finite(lower, "lower")
        self.upper = _check_finite(upper, "upper")
        if not self.upper > self.lower:
            raise PrivacyParameterError(f"upper: must be greater than lower={self.lower}, got {upper!r}")
        self.width = self.upper - self.lower
        self.sensitivity = self.width if sensitivity is None else _check_positive(sensitivity, "sensitivity")
        if self.sensitivity > self.width:
            raise PrivacyParameterError(
                f"sensitivity: must be in (0, upper - lower = {self.width}], got {sensitivity!r}")
        if calibration not in ("exact", "patent"):
            raise PrivacyParameterError(f"calibration: must be 'exact' or 'patent', got {calibration!r}")
        self.calibration: Calibration = calibration
        if isinstance(delta, bool) or not isinstance(delta, int | float | np.floating) or not 0.0 <= delta < 1.0:
            raise PrivacyParameterError(f"delta: must be in [0, 1), got {delta!r}")
        self.delta = float(delta)
        if out_of_bounds not in ("error", "clip"):
            raise PrivacyParameterError(f"out_of_bounds: must be 'error' or 'clip', got {out_of_bounds!r}")
        self.out_of_bounds: OutOfBounds = out_of_bounds
        self.integer = bool(integer)
        self.unsafe_float = bool(unsafe_float)
        self.snap_bits = None if snap_bits is None else check_int(snap_bits, "snap_bits", 1, 52)
        self.rng = crypto_rng(rng)
        self._grid: _GridModel | None = None
        self._float: _FloatModel | None = None
        if self.unsafe_float:
            self._init_float(scale)
        else:
            if self.delta != 0.0:
                raise PrivacyParameterError(f"delta: the grid mechanism is pure eps-DP (delta = 0), got {delta!r}; "
                                            f"delta > 0 exists only with unsafe_float=True")
            if self.snap_bits is not None:
                warnings.warn("BoundedLaplace(snap_bits=...) is superseded: outputs always lie on the exact grid; "
                              "snap_bits is ignored", DeprecationWarning, stacklevel=2)
            self._init_grid(scale, grid_step)
        self.naive_scale = self.sensitivity / self.target_epsilon if self.target_epsilon else math.nan

    def _init_grid(self, scale: float | None, grid_step: float | None) -> None:
        n_int, step = grid_for_domain(self.lower, self.upper, integer=self.integer, grid_step=grid_step)
        n_points = n_int + 1
        integer_inputs = self.integer and step == 1.0
        if self.sensitivity >= self.width:
            radius = n_points - 1
        elif integer_inputs:
            radius = max(1, math.floor(self.sensitivity + 1e-9))
        else:  # stochastic rounding of real inputs moves each by < 1 step
            radius = min(n_points - 1, math.ceil(self.sensitivity / step - 1e-9) + 1)
        self.grid_step = step
        self.neighbour_steps = radius
        if scale is not None:
            t = _check_positive(scale, "scale") / step
        elif self.calibration == "patent":
            assert self.target_epsilon is not None
            t = self.sensitivity / self.target_epsilon / step
        else:
            assert self.target_epsilon is not None
            t = calibrate_grid_scale(n_points, radius, self.target_epsilon)
        self._grid = _GridModel(self.lower, self.upper, n_int, t, integer_inputs)
        self.table = self._grid.table
        self.scale = t * step
        self.normalized_scale = 2.0 * self.scale / self.width
        self.epsilon = self.table.epsilon(radius)
        self.epsilon_is_exact = True

    def _init_float(self, scale: float | None) -> None:
        if scale is not None:
            b = _check_positive(scale, "scale")
            self.epsilon = actual_epsilon(b, self.sensitivity, self.width) - math.log1p(-self.delta)
        else:
            assert self.target_epsilon is not None
            b = (self.sensitivity / self.target_epsilon if self.calibration == "patent" else
                 bounded_laplace_scale(epsilon=self.target_epsilon, sensitivity=self.sensitivity,
                                       width=self.width, delta=self.delta))
            self.epsilon = self.target_epsilon
        self.scale = b
        self.normalized_scale = 2.0 * b / self.width
        self.grid_step = 0.0
        self.neighbour_steps = 0
        self._float = _FloatModel(self.lower, self.upper, self.normalized_scale, self.snap_bits)
        self.epsilon_is_exact = False  # the ideal real-valued mechanism's eps; binary64 outputs: infinite

    def __repr__(self) -> str:
        kind = "unsafe_float" if self.unsafe_float else f"grid_step={self.grid_step:g}"
        return (f"BoundedLaplace(epsilon={self.epsilon!r}, lower={self.lower}, upper={self.upper}, "
                f"sensitivity={self.sensitivity}, {kind}, scale={self.scale:.6g})")

    @property
    def exact_epsilon(self) -> float:
        """The grid table's eps (``epsilon``); ``inf`` for ``unsafe_float`` (binary64 outputs reachable from one
        input but not from its neighbour, see ``stream_anon.bench.reachability``)."""
        return self.epsilon if self.epsilon_is_exact else math.inf

    @property
    def domain(self) -> IntervalDomain:
        return IntervalDomain(self.lower, self.upper, self.integer)

    # ---------------------------------------------------------------- grid views
    @property
    def grid(self) -> np.ndarray:
        """The public output values (empty for ``unsafe_float``)."""
        return self._grid.values.copy() if self._grid is not None else np.empty(0)

    @property
    def transition_matrix(self) -> np.ndarray:
        """P[i, j] = P(output grid[j] | input grid[i]) = W[i, j] / 2^62 (float64 view of the exact table)."""
        if self._grid is None:
            raise PrivacyParameterError("transition_matrix: the unsafe_float mechanism has no finite table")
        return self._grid.P.copy()

    def pmf(self, x: float) -> np.ndarray:
        """P(M(x) = grid[j]) for every j (a mixture of two rows for an input between grid points)."""
        g = self._require_grid("pmf")
        return g.pmf(float(self._checked(np.asarray([x]))[0]))

    def _require_grid(self, what: str) -> _GridModel:
        if self._grid is None:
            raise PrivacyParameterError(f"{what}: not defined for the unsafe_float mechanism")
        return self._grid

    # ---------------------------------------------------------------- inputs
    def _checked(self, x: Any, name: str = "value") -> np.ndarray:
        arr = np.asarray(x, dtype=np.float64)
        if np.isnan(arr).any():
            raise PrivacyParameterError(f"{name}: NaN is not a value in [{self.lower}, {self.upper}]")
        bad = (arr < self.lower) | (arr > self.upper)
        if bad.any():
            if self.out_of_bounds == "error":
                v = float(arr[bad].flat[0])
                raise PrivacyParameterError(
                    f"{name}: must be in the public domain [{self.lower}, {self.upper}], got {v!r} "
                    f"({int(bad.sum())} value(s) outside; pass out_of_bounds='clip' to clip)")
            arr = np.clip(arr, self.lower, self.upper)
        if self._grid is not None and self._grid.integer_inputs:
            frac = arr != np.floor(arr)
            if frac.any():
                raise PrivacyParameterError(
                    f"{name}: expected an integer in [{self.lower:g}, {self.upper:g}], got {float(arr[frac].flat[0])!r}")
        return arr

    # ---------------------------------------------------------------- randomisation
    def randomise_many(self, x: Any) -> np.ndarray:
        """Perturb an array of values (vectorized); float64 outputs on the public grid in [lower, upper]."""
        arr = self._checked(x)
        if self._grid is not None:
            return self._grid.sample(arr, self.rng)
        assert self._float is not None
        return self._float.sample(arr, self.rng)

    def randomise(self, x: float) -> float:
        """Perturb one value."""
        return float(self.randomise_many(np.asarray([x], dtype=np.float64))[0])

    # ---------------------------------------------------------------- closed forms (data units)
    def _model(self) -> _GridModel | _FloatModel:
        m = self._grid if self._grid is not None else self._float
        assert m is not None
        return m

    def expected_output(self, x: Any) -> np.ndarray | float:
        """g(x) = E[M(x)], exact from the table (piecewise linear between grid points); strictly increasing."""
        return _scalar_or_array(self._model().expected_output(self._checked(x)), x)

    def bias(self, x: Any) -> np.ndarray | float:
        """E[M(x)] - x."""
        arr = self._checked(x)
        return _scalar_or_array(self._model().expected_output(arr) - arr, x)

    def variance(self, x: Any) -> np.ndarray | float:
        """Var[M(x)], exact from the table."""
        return _scalar_or_array(self._model().variance(self._checked(x)), x)

    def cdf(self, y: Any, x: float) -> np.ndarray:
        """P(M(x) <= y)."""
        return self._model().cdf(np.asarray(y, dtype=np.float64), float(self._checked(np.asarray([x]))[0]))

    def inverse_expected_output(self, y: Any) -> np.ndarray | float:
        """g^{-1}(y), clipped to g's range (narrower than the domain): linear interpolation of the exact g."""
        return _scalar_or_array(self._model().inverse_expected_output(np.asarray(y, dtype=np.float64)), y)

    # ---------------------------------------------------------------- estimation
    def unbiased_transform(self, perturbed: Any, *, boundary_width: float = 0.1) -> np.ndarray:
        """h(y) with E[h(M(x))] = x exactly for every x at least ``boundary_width`` (normalized) from both bounds.

        Grid mechanism: the minimum-variance such h over the grid outputs (``_GridModel.transform``), bias near
        the bounds at most ``max_transform_bias``; ``boundary_width=0``: h = P^-1 x, exactly unbiased for EVERY
        input (larger variance; numbers in docs/privacy-numeric.md).  ``unsafe_float``: the continuous
        boundary-corrected transform.  Outputs must be this mechanism's grid values.
        """
        w = self._boundary_width(boundary_width)
        if self._grid is not None:
            return self._grid.transform(w)[self._grid.output_index(perturbed)]
        assert self._float is not None
        if w == 0.0:
            raise PrivacyParameterError("boundary_width: must be > 0 for the unsafe_float mechanism")
        return self._float.transform_values(perturbed, w)

    def max_transform_bias(self, *, boundary_width: float = 0.1) -> float:
        """Largest |E[h(M(x))] - x| of ``unbiased_transform`` over the domain, in data units (0 for width 0)."""
        w = self._boundary_width(boundary_width)
        if self._grid is not None:
            return float(np.abs(self._grid.transform_bias(w)).max()) if w > 0 else 0.0
        assert self._float is not None
        return self._float.max_transform_bias(w)

    def _boundary_width(self, boundary_width: float) -> float:
        if isinstance(boundary_width, bool) or not isinstance(boundary_width, int | float | np.floating):
            raise PrivacyParameterError(f"boundary_width: expected a number in [0, 0.5], got {boundary_width!r}")
        w = float(boundary_width)
        if not 0.0 <= w <= 0.5:
            raise PrivacyParameterError(f"boundary_width: must be in [0, 0.5] (normalized units), got {boundary_width!r}")
        return w

    def estimate_mean(self, perturbed: Any, *,
                      method: Literal["boundary-corrected", "unbiased", "aggregate", "per-value"] = "boundary-corrected",
                      boundary_width: float = 0.1) -> tuple[float, float]:
        """Estimate the mean of the true values from perturbed outputs; returns (mean, standard error).

        ``"boundary-corrected"`` (default): mean of ``unbiased_transform(y, boundary_width)``: exactly unbiased
        when no true value lies within ``boundary_width`` (normalized; w * (upper - lower) / 2 in data units) of
        a bound, else biased by at most ``max_transform_bias`` times the share of such values.
        ``"unbiased"``: the same with boundary_width = 0 (grid only): exactly unbiased for any data.
        SE = sd(h) / sqrt(n) (conservative for heterogeneous data).
        ``"aggregate"``: g^{-1}(ybar), SE by the delta method; consistent only when all inputs are equal.
        ``"per-value"``: mean of g^{-1}(y_i); biased (for comparison).
        """
        y = np.asarray(perturbed, dtype=np.float64).ravel()
        n = y.size
        if n < 2:
            raise PrivacyParameterError(f"perturbed: need at least 2 values to estimate a mean and its SE, got {n}")
        if np.isnan(y).any():
            raise PrivacyParameterError("perturbed: contains NaN")
        if method in ("boundary-corrected", "unbiased"):
            w = 0.0 if method == "unbiased" else boundary_width
            hv = self.unbiased_transform(y, boundary_width=w)
            return float(hv.mean()), float(hv.std(ddof=1)) / math.sqrt(n)
        if method == "aggregate":
            ybar = float(y.mean())
            est = float(self.inverse_expected_output(ybar))
            se_y = float(y.std(ddof=1)) / math.sqrt(n)
            return est, se_y / self._model().slope(est)
        if method == "per-value":
            xs = np.asarray(self.inverse_expected_output(y))
            return float(xs.mean()), float(xs.std(ddof=1)) / math.sqrt(n)
        raise PrivacyParameterError(
            f"method: must be 'boundary-corrected', 'unbiased', 'aggregate' or 'per-value', got {method!r}")

    def aggregate_target(self, true_values: Any) -> float:
        """g^{-1}(mean_i g(x_i)): the limit of the aggregate mean estimator for these inputs (diagnostic)."""
        return float(self.inverse_expected_output(float(np.mean(self.expected_output(true_values)))))


def _scalar_or_array(result: np.ndarray, like: Any) -> np.ndarray | float:
    return float(np.asarray(result).reshape(-1)[0]) if np.ndim(like) == 0 else np.asarray(result)


# --------------------------------------------------------------------------------- discretized variant
def _exp_moments(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """I0 = int_0^1 e^{-lam u} du and I1 = int_0^1 u e^{-lam u} du, stable for small |lam| (series)."""
    lam = np.asarray(lam, dtype=np.float64)
    small = np.abs(lam) < 0.5
    safe = np.where(small, 1.0, lam)
    i0 = np.where(small, 0.0, -np.expm1(-safe) / safe)
    i1 = np.where(small, 0.0, (1.0 - np.exp(-safe) * (1.0 + safe)) / (safe * safe))
    lam_s = np.where(small, lam, 0.0)  # the series only where it converges fast
    s0 = np.zeros_like(lam)
    s1 = np.zeros_like(lam)
    term = np.ones_like(lam)  # (-lam)^n / n!
    for n in range(0, 25):
        s0 = s0 + term / (n + 1)
        s1 = s1 + term / (n + 2)
        term = term * (-lam_s) / (n + 1)
    return np.where(small, s0, i0), np.where(small, s1, i1)


def discretized_probabilities(scale: float, m: int) -> np.ndarray:
    """P[i, j] of the bounded Laplace on [-1, 1] with scale b followed by stochastic rounding to m categories.

    Category i sits at t_i = -1 + 2 i / (m - 1); an output y in [t_k, t_{k+1}] is reported as k+1 with
    probability (y - t_k)/h, else k (h = 2/(m-1)), i.e. the rounding kernel of j is the hat max(0, 1 - |y-t_j|/h).
    Each P[i, j] is the closed-form integral of the truncated Laplace density against that kernel (float64; the
    mechanism is the integer table of these values).
    """
    m = check_int(m, "m", 2)
    b = _check_positive(scale, "scale")
    h = 2.0 / (m - 1)
    t = -1.0 + h * np.arange(m)
    lam = h / b
    i0a, i1a = _exp_moments(np.asarray(lam))
    i0, i1 = float(i0a), float(i1a)
    P = np.zeros((m, m))
    for i in range(m):
        q = t[i]
        cq = float(_normalizer(np.asarray(q), b))
        for k in range(m - 1):
            # on [t_k, t_{k+1}] the density exp(-|y - q|/b)/(2 b C) is one decaying exponential (q is a node):
            # k >= i: y = t_k + h u, exp(-(t_k - q)/b) e^{-lam u}, weight of k+1 = u;
            # k < i:  y = t_{k+1} - h v, exp(-(q - t_{k+1})/b) e^{-lam v}, weight of k+1 = 1 - v  (lam = h/b >= 0)
            if k >= i:
                amp = math.exp(-(t[k] - q) / b) * h / (2.0 * b * cq)
                mass_all, mass_up = amp * i0, amp * i1
            else:
                amp = math.exp(-(q - t[k + 1]) / b) * h / (2.0 * b * cq)
                mass_all, mass_up = amp * i0, amp * (i0 - i1)
            P[i, k + 1] += mass_up
            P[i, k] += mass_all - mass_up
    return P


def discretized_transition_matrix(epsilon: float, m: int, *, scale: float | None = None) -> np.ndarray:
    """The float64 transition matrix of the patent's construction: scale b = 2/eps on [-1, 1] (or ``scale``)."""
    b = 2.0 / check_epsilon(epsilon) if scale is None else _check_positive(scale, "scale")
    return discretized_probabilities(b, m)


@lru_cache(maxsize=128)
def _discretized_table(scale: float, m: int) -> IntegerTable:
    return IntegerTable.from_probabilities(discretized_probabilities(scale, m))


def discretized_epsilon(scale: float, m: int) -> float:
    """Exact eps (rounded up by < 1e-12) of the discretized mechanism's integer table (all categories neighbours)."""
    return _discretized_table(float(scale), m).epsilon()


@lru_cache(maxsize=128)
def calibrate_discretized_scale(m: int, epsilon: float) -> float:
    """Normalized scale b whose discretized table has exact eps <= ``epsilon`` (smallest such b, to 1e-12)."""
    eps = check_epsilon(epsilon)
    m = check_int(m, "m", 2)

    def eps_of(b: float) -> float:
        return IntegerTable.from_probabilities(discretized_probabilities(b, m)).epsilon()

    return _calibrate(eps_of, eps, 2.0 / eps, floor=1e-20)


class DiscretizedBoundedLaplace(LocalMechanism):
    """Bounded Laplace for categorical/ordinal values with stochastic discretization (KR 10-2456177), exact eps.

    The m categories (in the given order; it matters for ordinal data) sit on t_i = -1 + 2 i/(m-1) of [-1, 1];
    the patent perturbs t_i with the bounded Laplace (scale b) and rounds the result stochastically to a
    neighbouring category.  Here the resulting m x m transition matrix (closed form,
    :func:`discretized_probabilities`) is stored as an integer table and sampled exactly (one integer draw per
    value); ``.epsilon`` is the table's exact eps.  ``calibration="exact"`` (default) chooses b so that it
    meets ``epsilon``; ``"patent"`` keeps b = 2/eps, which spends LESS than stated (m = 2: 0.331 at eps 1; the
    exact value is what ``.epsilon`` then says).  With m = 2 the calibrated mechanism is k-RR exactly.
    """

    def __init__(self, *, epsilon: float, categories: Sequence[Any], calibration: Calibration = "exact",
                 rng: np.random.Generator | int | None = None) -> None:
        self.target_epsilon = check_epsilon(epsilon)
        cats = list(categories)
        if len(cats) < 2:
            raise PrivacyParameterError(f"categories: need at least 2 categories, got {len(cats)}")
        if len(set(cats)) != len(cats):
            raise PrivacyParameterError(f"categories: must be distinct, got {cats!r}")
        if calibration not in ("exact", "patent"):
            raise PrivacyParameterError(f"calibration: must be 'exact' or 'patent', got {calibration!r}")
        self.calibration: Calibration = calibration
        self.categories: tuple[Any, ...] = tuple(cats)
        self.m = len(cats)
        self._index = {c: i for i, c in enumerate(cats)}
        self.rng = crypto_rng(rng)
        self.scale = (2.0 / self.target_epsilon if calibration == "patent"
                      else calibrate_discretized_scale(self.m, self.target_epsilon))
        self.normalized_scale = self.scale
        self.table = _discretized_table(self.scale, self.m)
        self.epsilon = self.table.epsilon()
        self.step = 2.0 / (self.m - 1)
        self._P = self.table.probabilities
        self._cat_array = np.empty(self.m, dtype=object)
        self._cat_array[:] = cats

    def __repr__(self) -> str:
        return f"DiscretizedBoundedLaplace(epsilon={self.epsilon!r}, m={self.m}, scale={self.scale:.6g})"

    @property
    def transition_matrix(self) -> np.ndarray:
        """P[i, j] = P(report j | true i) = W[i, j] / 2^62, exact (rows sum to 1)."""
        return self._P.copy()

    @property
    def p_true(self) -> np.ndarray:
        """P(report = true category) per category (diagonal of the transition matrix)."""
        return np.diag(self._P).copy()

    def encode(self, values: Any) -> np.ndarray:
        """Category values -> indices 0..m-1; a value outside the domain raises an error naming it."""
        arr = np.asarray(values, dtype=object).ravel()
        try:
            return np.fromiter((self._index[v] for v in arr), dtype=np.int64, count=arr.size)
        except KeyError as e:
            raise PrivacyParameterError(
                f"value: {e.args[0]!r} is not one of the {self.m} categories {list(self.categories)[:12]!r}"
            ) from None
        except TypeError as e:  # unhashable
            raise PrivacyParameterError(f"value: unhashable value in input ({e})") from None

    def randomise_indices(self, indices: Any) -> np.ndarray:
        """Perturb category indices 0..m-1 (vectorized, exact integer sampling); returns reported indices."""
        idx = np.asarray(indices)
        if idx.size and (not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0 or idx.max() >= self.m):
            raise PrivacyParameterError(f"indices: must be integers in [0, {self.m - 1}], got dtype {idx.dtype} "
                                        f"range [{idx.min()}, {idx.max()}]")
        return self.table.sample(idx.astype(np.int64), self.rng)

    def randomise_many(self, values: Any) -> np.ndarray:
        """Perturb an array of categories; returns an object array of reported categories."""
        return self._cat_array[self.randomise_indices(self.encode(values))]

    @property
    def exact_epsilon(self) -> float:
        """The integer table's eps (all categories neighbours), the same value as ``epsilon``."""
        return self.table.epsilon()

    @property
    def domain(self) -> CategoricalDomain:
        return CategoricalDomain(self.categories)

    def estimate_counts(self, reports: Any) -> FrequencyEstimate:
        """Unbiased counts n_hat = P^{-T} N from reported categories N, with standard errors.

        E[N] = P^T n, so n_hat = solve(P^T, N) is unbiased.  Cov(N) = sum_i n_i (diag(P_i) - P_i P_i^T) is
        estimated by diag(N) - P^T diag(n_hat) P (unbiased); SE = sqrt(diag(P^{-T} Cov P^{-1})).
        """
        counts = np.bincount(self.encode(reports), minlength=self.m).astype(np.float64)
        return self.estimate_counts_from_report_counts(counts)

    def estimate_counts_from_report_counts(self, report_counts: Any) -> FrequencyEstimate:
        N = np.asarray(report_counts, dtype=np.float64)
        if N.shape != (self.m,):
            raise PrivacyParameterError(f"report_counts: expected shape ({self.m},), got {N.shape}")
        P = self._P
        inv_t = np.linalg.inv(P.T)
        n_hat = inv_t @ N
        cov_n = np.diag(N) - P.T @ np.diag(n_hat) @ P
        cov = inv_t @ cov_n @ inv_t.T
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        return FrequencyEstimate(self.categories, n_hat, se, int(round(N.sum())), epsilon=self.epsilon,
                                 mechanism="discretized-bounded-laplace")
