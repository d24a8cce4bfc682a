"""Bounded Laplace for categorical/ordinal values with stochastic discretization (KR 10-2456177), exact eps.

The m categories (in the given order; it matters for ordinal data) sit on t_i = -1 + 2 i/(m-1) of [-1, 1];
the patent perturbs t_i with the bounded Laplace (scale b) and rounds the result stochastically to a
neighbouring category.  The resulting m x m transition matrix has a closed form (:func:`discretized_probabilities`);
as for the grid mechanism (:mod:`.grid`), that matrix is stored as an integer table, which IS the mechanism:
its eps is exact and sampling draws exactly from it.  (Post-processing of the bounded Laplace: the eps of the
table is never above the continuous mechanism's.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from stream_anon.core.validation import require_choice, require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, crypto_rng, parameter_error
from stream_anon.privacy.bounded_laplace.grid import calibrate_scale
from stream_anon.privacy.bounded_laplace.mechanism import CALIBRATIONS, Calibration
from stream_anon.privacy.bounded_laplace.theory import normalizer
from stream_anon.privacy.exact import IntegerTable
from stream_anon.privacy.frequency import FrequencyEstimate
from stream_anon.privacy.mechanism import CategoricalDomain, LocalMechanism

__all__ = [
    "DiscretizedBoundedLaplace",
    "calibrate_discretized_scale",
    "discretized_epsilon",
    "discretized_probabilities",
    "discretized_transition_matrix",
]


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
    m = require_int("m", m, low=2, error=parameter_error)
    b = require_float("scale", scale, low=0.0, low_open=True, error=parameter_error)
    h = 2.0 / (m - 1)
    t = -1.0 + h * np.arange(m)
    lam = h / b
    i0a, i1a = _exp_moments(np.asarray(lam))
    i0, i1 = float(i0a), float(i1a)
    P = np.zeros((m, m))
    for i in range(m):
        q = t[i]
        cq = float(normalizer(np.asarray(q), b))
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
    b = 2.0 / check_epsilon(epsilon) if scale is None else require_float("scale", scale, low=0.0, low_open=True,
                                                                        error=parameter_error)
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
    m = require_int("m", m, low=2, error=parameter_error)

    def eps_of(b: float) -> float:
        return IntegerTable.from_probabilities(discretized_probabilities(b, m)).epsilon()

    return calibrate_scale(eps_of, eps, 2.0 / eps, floor=1e-20)


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
        self.calibration: Calibration = require_choice("calibration", calibration, CALIBRATIONS,
                                                       error=parameter_error)
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
        reported: np.ndarray = self._cat_array[self.randomise_indices(self.encode(values))]
        return reported

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

