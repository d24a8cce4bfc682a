"""The exact epsilon of a configured mechanism, computed from its own output distribution in the arithmetic it runs in.

:func:`exact_epsilon` takes a mechanism instance and returns an upper bound of its epsilon, exact up to a
rounding margin below 1e-12 (all values are rounded UP to a double):

* ``KRandomizedResponse``: the sampler keeps the true value iff ``rng.random() < p``; numpy's doubles are the
  2^53 multiples of 2^-53, so the keep probability is exactly ceil(p 2^53) / 2^53 and the k - 1 others share the
  rest uniformly (exact integer draw): eps = ln(ceil(p 2^53) (k - 1) / (2^53 - ceil(p 2^53))).
* ``RandomSubstitution`` (FRAPP): its inverse-CDF map u -> report is monotone in u, so each transition
  probability is (number of 2^-53-grid uniforms mapped to it) / 2^53, found exactly by binary search
  (:func:`frapp_sampling_matrix`); eps = max log-ratio of that integer matrix.
* ``LExtendedSubstitution``: independent: l times the FRAPP value (the l draws are independent and the worst
  output of one draw can repeat in all l); no-repeat: the closed form ln(A/B) of the ideal probabilities plus a
  rigorous margin for the float deviation of each draw (at most delta relative, computed exactly) and for the
  ties of the shuffle: 2 (l d/(1-d) + (l-1) d a/(1 - d a)) + 2 t/(1-t), d = delta/(1-delta), a = the largest
  rejected mass / (1 - it), t = l! l(l-1)/2 2^-53.
* ``BoundedLaplace``: the grid mechanism's table eps (``inf`` for ``unsafe_float=True``: binary64 outputs
  reachable from one input but not from its neighbour, see ``stream_anon.bench.reachability``).
* ``DiscretizedBoundedLaplace``: its table eps.
* ``QuadTreeKMeans``: eps of one window under its neighbouring relation, from the sampled noise scales.

The result is what one record (or one window, for k-means) spends through that mechanism; a record's total is
the sum over the mechanisms applied to it (:func:`record_epsilon`, sequential composition).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

import numpy as np

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.discrete_laplace import fraction_upper
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans
from stream_anon.privacy.exact import LOG_MARGIN, log_ratio_upper, max_ratio
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import (
    LExtendedSubstitution,
    RandomSubstitution,
    _frapp_draw,
    no_repeat_epsilon,
)

__all__ = [
    "UNIFORM_GRID_BITS",
    "exact_epsilon",
    "frapp_sampling_matrix",
    "frapp_sampling_ratio",
    "krr_sampling_epsilon",
    "krr_sampling_ratio",
    "matrix_ratio",
    "record_epsilon",
]

UNIFORM_GRID_BITS = 53
"""numpy's ``Generator.random()`` returns k * 2^-53 (the top 53 bits of one 64-bit word), for every bit generator."""


def krr_sampling_ratio(p: float, k: int) -> Fraction:
    """Exact worst likelihood ratio of k-RR as sampled: keep iff u < p on the 2^-53 grid, else one of the k - 1
    others uniformly: ceil(p 2^53) (k - 1) / (2^53 - ceil(p 2^53)) (0 if the report is never randomized)."""
    grid = 1 << UNIFORM_GRID_BITS
    keep = math.ceil(Fraction(p) * grid)
    return Fraction(0) if keep >= grid else Fraction(keep * (k - 1), grid - keep)


def krr_sampling_epsilon(p: float, k: int) -> float:
    """Exact eps of k-RR as sampled, rounded up (inf when p rounds to 1)."""
    ratio = krr_sampling_ratio(p, k)
    return math.inf if ratio == 0 else log_ratio_upper(ratio)


def frapp_sampling_matrix(n_values: int, gamma: float) -> np.ndarray:
    """Integer counts C[t, j] of the 2^53 uniforms u = m 2^-53 that FRAPP's sampler maps from t to j.

    The map is non-decreasing in u, so the first m reaching report >= j is found by binary search (vectorized
    over all (t, j)); C[t, j] = first(t, j + 1) - first(t, j).  Returned as Python ints in an object array.
    """
    grid = 1 << UNIFORM_GRID_BITS
    t = np.repeat(np.arange(n_values, dtype=np.int64), n_values)
    j = np.tile(np.arange(n_values, dtype=np.int64), n_values)
    lo = np.zeros(t.size, dtype=np.int64)  # first m with draw(m) >= j lies in [lo, hi]
    hi = np.full(t.size, grid, dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        draw = _frapp_draw(t, np.minimum(mid, grid - 1).astype(np.float64) / grid, n_values, gamma)
        reached = (draw >= j) & (mid < grid)
        hi = np.where(reached, mid, hi)
        lo = np.where(reached, lo, mid + 1)
    first = lo.reshape(n_values, n_values).astype(object)
    counts = np.empty((n_values, n_values), dtype=object)
    for a in range(n_values):
        for b in range(n_values):
            end = first[a, b + 1] if b + 1 < n_values else grid
            counts[a, b] = int(end) - int(first[a, b])
    return counts


def matrix_ratio(counts: np.ndarray) -> Fraction:
    """max over j, t, t' of C[t, j] / C[t', j] for an integer matrix (0 = infinite: some entry is 0)."""
    c = np.asarray(counts, dtype=object)
    best = Fraction(1)
    for j in range(c.shape[1]):
        col = [int(v) for v in c[:, j]]
        if min(col) == 0:
            return Fraction(0)
        best = max(best, Fraction(max(col), min(col)))
    return best


def frapp_sampling_ratio(n_values: int, gamma: float) -> Fraction:
    """Exact worst likelihood ratio of one FRAPP draw as sampled (from :func:`frapp_sampling_matrix`)."""
    return matrix_ratio(frapp_sampling_matrix(n_values, gamma))


def _frapp_epsilon(n_values: int, gamma: float) -> float:
    ratio = frapp_sampling_ratio(n_values, gamma)
    return math.inf if ratio == 0 else (0.0 if ratio == 1 else log_ratio_upper(ratio))


def _frapp_relative_deviation(n_values: int, gamma: float) -> float:
    """max |P_float(j | t) / P_ideal(j | t) - 1| of one FRAPP draw (exact counts vs the ideal x, gamma x)."""
    counts = frapp_sampling_matrix(n_values, gamma)
    grid = Fraction(1 << UNIFORM_GRID_BITS)
    g = Fraction(gamma)
    x = 1 / (g + n_values - 1)
    worst = Fraction(0)
    for a in range(n_values):
        for b in range(n_values):
            ideal = g * x if a == b else x
            worst = max(worst, abs(Fraction(int(counts[a, b])) / grid / ideal - 1))
    return float(worst) * (1 + 1e-12)


def _no_repeat_epsilon_upper(mech: LExtendedSubstitution) -> float:
    n_values, gamma, reports = mech.k, mech.gamma, mech.l
    delta = _frapp_relative_deviation(n_values, gamma)
    d = delta / (1.0 - delta)
    x = 1.0 / (gamma + n_values - 1)
    rejected = (gamma + reports - 2) * x  # largest mass already drawn before the last draw
    a = rejected / (1.0 - rejected)
    eta = reports * d / (1.0 - d) + (reports - 1) * d * a / (1.0 - d * a)
    ties = math.factorial(reports) * reports * (reports - 1) / 2 * 2.0 ** -UNIFORM_GRID_BITS
    shuffle = ties / (1.0 - ties)
    return no_repeat_epsilon(n_values, gamma, reports) + 2.0 * eta + 2.0 * shuffle + LOG_MARGIN


def exact_epsilon(mechanism: Any) -> float:
    """Upper bound (by < 1e-12 unless stated in the module docstring) of the exact eps of ``mechanism``."""
    if isinstance(mechanism, BoundedLaplace):
        return mechanism.epsilon if mechanism.epsilon_is_exact else math.inf
    if isinstance(mechanism, DiscretizedBoundedLaplace):
        return mechanism.table.epsilon()
    if isinstance(mechanism, QuadTreeKMeans):
        return fraction_upper(mechanism.epsilon_tree_exact + mechanism.epsilon_counts_exact)
    if isinstance(mechanism, KRandomizedResponse):
        return krr_sampling_epsilon(mechanism.p, mechanism.k)
    if isinstance(mechanism, RandomSubstitution):
        return _frapp_epsilon(mechanism.k, mechanism.gamma)
    if isinstance(mechanism, LExtendedSubstitution):
        if mechanism.variant == "independent":
            return mechanism.l * _frapp_epsilon(mechanism.k, mechanism.gamma)
        return _no_repeat_epsilon_upper(mechanism)
    raise PrivacyParameterError(f"mechanism: no exact epsilon known for {type(mechanism).__name__}")


def record_epsilon(mechanisms: Iterable[Any]) -> float:
    """What one record spends through all of ``mechanisms`` (sequential composition of their exact eps)."""
    values = [exact_epsilon(m) for m in mechanisms]
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.nextafter(math.fsum(values), math.inf)


def table_epsilon(weights: np.ndarray, radius: int | None = None) -> float:
    """eps of an integer probability table (re-export for callers holding a raw table)."""
    ratio, _ = max_ratio(weights, radius)
    return 0.0 if ratio == 1 else log_ratio_upper(ratio)
