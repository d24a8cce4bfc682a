"""The public grid and its integer table: the bounded Laplace as a finite mechanism with an exact epsilon.

The public domain [lower, upper] is cut into a public grid of M points y_0 = lower < ... < y_{M-1} = upper,
step s = (upper - lower) / (M - 1) (:func:`grid_for_domain`: the integer grid for ``integer=True`` domains of
width <= 1024, else 2^8 intervals, i.e. the power-of-two step 2^-7 on the normalized scale [-1, 1]).  A value
on the grid, index i, is replaced by index j with

    P(j | i) = W[i, j] / 2^62,   W = integer weights of  exp(-|j - i| / t) / Z_i   (t = b / s, scale in steps),

the truncated discrete Laplace (the discrete Laplace of OpenDP conditioned on the grid; Canonne, Kamath &
Steinke, NeurIPS 2020), stored as integers (every W[i, j] >= 1, every row summing to exactly 2^62;
:mod:`stream_anon.privacy.exact`).  That table IS the mechanism: its epsilon for the neighbouring relation
|i - i'| <= r is the maximum log-ratio of table entries, computed exactly and rounded up by < 1e-12
(:func:`grid_epsilon`), and sampling draws exactly from it with integers (:class:`GridModel`).
:func:`calibrate_grid_scale` finds the smallest-noise t whose exact eps meets a target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from stream_anon.core.validation import require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, parameter_error
from stream_anon.privacy.bounded_laplace.theory import bounded_laplace_scale
from stream_anon.privacy.exact import IntegerTable

__all__ = [
    "DEFAULT_REAL_GRID_INTERVALS",
    "MAX_GRID_INTERVALS",
    "GridModel",
    "calibrate_grid_scale",
    "calibrate_scale",
    "grid_epsilon",
    "grid_for_domain",
    "grid_laplace_probabilities",
    "grid_laplace_table",
]

MAX_GRID_INTERVALS = 1024
"""At most this many grid intervals (tables of (M x M) int64: 8.4 MB at the maximum)."""
DEFAULT_REAL_GRID_INTERVALS = 256
"""Grid of a real domain: 2^8 intervals, i.e. step 2^-7 on the normalized scale [-1, 1]."""


def grid_for_domain(lower: float, upper: float, *, integer: bool = False, grid_step: float | None = None
                    ) -> tuple[int, float]:
    """(number of intervals n, step) of the public output grid lower + j * step, j = 0..n.

    ``grid_step`` given: it must divide the width into at most ``MAX_GRID_INTERVALS`` equal steps.  Else
    ``integer=True`` (integer bounds): step 1 when the width is at most ``MAX_GRID_INTERVALS``, otherwise
    ``MAX_GRID_INTERVALS`` equal (non-integer) steps; real domains: ``DEFAULT_REAL_GRID_INTERVALS`` = 2^8 steps.
    """
    width = float(upper) - float(lower)
    if grid_step is not None:
        st = require_float("grid_step", grid_step, low=0.0, low_open=True, error=parameter_error)
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
    probabilities: np.ndarray = p / p.sum(axis=1, keepdims=True)
    return probabilities


def _build_grid_table(n_points: int, scale_steps: float) -> IntegerTable:
    return IntegerTable.from_probabilities(grid_laplace_probabilities(n_points, scale_steps))


@lru_cache(maxsize=16)
def grid_laplace_table(n_points: int, scale_steps: float) -> IntegerTable:
    """The integer table of the truncated discrete Laplace with scale t (in steps) on M points (cached)."""
    require_int("n_points", n_points, low=2, high=MAX_GRID_INTERVALS + 1, error=parameter_error)
    return _build_grid_table(n_points, require_float("scale_steps", scale_steps, low=0.0, low_open=True,
                                                     error=parameter_error))


def grid_epsilon(n_points: int, scale_steps: float, radius: int | None = None) -> float:
    """Exact eps (rounded up by < 1e-12) of the grid table for neighbours |i - i'| <= radius (None: all)."""
    return grid_laplace_table(n_points, scale_steps).epsilon(radius)


def calibrate_scale(eps_of: Callable[[float], float], target: float, guess: float, floor: float) -> float:
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
    return calibrate_scale(eps_of, eps, guess, floor=1.0 / 64.0)



class GridModel:
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
        outputs: np.ndarray = self.values[self.table.sample(self.rows(x, rng), rng)]
        return outputs

    def _mix(self, per_row: np.ndarray, x: np.ndarray) -> np.ndarray:
        lo, frac = self._position(x)
        hi = np.minimum(lo + 1, self.n_points - 1)
        mixed: np.ndarray = (1.0 - frac) * per_row[lo] + frac * per_row[hi]
        return mixed

    def expected_output(self, x: np.ndarray) -> np.ndarray:
        return self._mix(self.mean_out, x)

    def variance(self, x: np.ndarray) -> np.ndarray:
        m = self._mix(self.mean_out, x)
        variance: np.ndarray = np.maximum(self._mix(self.second_out, x) - m * m, 0.0)
        return variance

    def inverse_expected_output(self, y: np.ndarray) -> np.ndarray:
        inputs: np.ndarray = np.interp(y, self.mean_out, self.values)
        return inputs

    def slope(self, x: float) -> float:
        g = np.gradient(self.mean_out, self.values)
        return float(np.interp(x, self.values, g))

    def pmf(self, x: float) -> np.ndarray:
        lo, frac = self._position(np.asarray([x], dtype=np.float64))
        hi = min(int(lo[0]) + 1, self.n_points - 1)
        pmf: np.ndarray = (1.0 - frac[0]) * self.P[int(lo[0])] + frac[0] * self.P[hi]
        return pmf

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
        bias: np.ndarray = self.P @ self.transform(boundary_width) - self.values
        return bias

