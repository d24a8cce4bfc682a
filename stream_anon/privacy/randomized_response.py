"""k-ary randomized response (k-RR, a.k.a. generalized randomized response / direct encoding).

Warner (1965) for k = 2; the k-ary form is from Kairouz, Oh & Viswanath, "Extremal mechanisms for
local differential privacy" (NIPS 2014) and Wang et al., "Locally differentially private protocols for
frequency estimation" (USENIX Security 2017).

A record holding category v reports v with probability ``p = e^eps / (e^eps + k - 1)`` and each of the
other ``k - 1`` categories with probability ``q = (1 - p) / (k - 1) = 1 / (e^eps + k - 1)``, so
``p / q = e^eps``: the report is eps-locally differentially private.

Estimator (unbiased): with ``N_v`` reports of v among ``n``,
``n_hat_v = (N_v - q n) / (p - q)``,
``Var(n_hat_v) = n q (1 - q) / (p - q)^2 + n_v (1 - p - q) / (p - q)``.
The standard errors returned plug ``n_hat_v`` clipped to ``[0, n]`` in for the unknown ``n_v``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from stream_anon.core.validation import require_choice
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, crypto_rng, parameter_error
from stream_anon.privacy.exact import UNIFORM_GRID_BITS, log_ratio_upper
from stream_anon.privacy.frequency import (
    CategoryCodec,
    FrequencyEstimate,
    SingleReportEstimator,
)
from stream_anon.privacy.mechanism import CategoricalDomain, LocalMechanism

OutOfDomain = Literal["error", "random"]


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


class KRandomizedResponse(SingleReportEstimator, LocalMechanism):
    """k-RR over a fixed categorical domain (keyword-only, validated parameters; injected ``rng``).

    ``out_of_domain="error"`` (default) rejects a value outside ``categories`` with an error naming the
    value and the domain; ``"random"`` reports a uniformly random category for it (as OpenDP's
    ``make_randomized_response`` does).  That is still eps-LDP: a uniform report has probability
    ``1/k`` for every output and ``q <= 1/k <= p``.
    """

    def __init__(self, *, epsilon: float, categories: Sequence[Any] | np.ndarray,
                 out_of_domain: OutOfDomain = "error", rng: np.random.Generator | int | None = None):
        self.epsilon = check_epsilon(epsilon)
        self._codec = CategoryCodec(categories)
        self.out_of_domain: OutOfDomain = require_choice("out_of_domain", out_of_domain, ("error", "random"),
                                                         error=parameter_error)
        self.rng = crypto_rng(rng)
        k = self._codec.k
        # e^eps / (e^eps + k - 1) written to stay finite for large eps
        self.q = 1.0 / (math.exp(self.epsilon) + k - 1) if self.epsilon < 700 else 0.0
        self.p = 1.0 - (k - 1) * self.q

    def __repr__(self) -> str:
        return f"KRandomizedResponse(epsilon={self.epsilon!r}, k={self.k}, p={self.p:.6g}, q={self.q:.6g})"

    # ----------------------------------------------------------------- perturbation
    def randomise_codes(self, codes: np.ndarray) -> np.ndarray:
        """Randomize integer codes 0..k-1 (code -1 = out of domain, handled per ``out_of_domain``).

        One uniform draw decides keep (probability p); one integer draw in [0, k-2], shifted past the
        true code, picks the replacement uniformly among the k-1 other categories.
        """
        c = np.asarray(codes, dtype=np.int64)
        n = c.size
        flat = c.reshape(-1)
        ood = flat < 0
        if ood.any() or (flat >= self.k).any():
            if (flat >= self.k).any() or self.out_of_domain == "error":
                bad = int(flat[(flat < 0) | (flat >= self.k)][0])
                raise PrivacyParameterError(
                    f"value code {bad} is outside the domain: expected codes 0..{self.k - 1} for "
                    f"{self._codec.describe()}")
        keep = self.rng.random(n) < self.p
        other = self.rng.integers(0, self.k - 1, size=n, dtype=np.int64)
        other += other >= flat
        out = np.where(keep, flat, other)
        if ood.any():
            out[ood] = self.rng.integers(0, self.k, size=int(ood.sum()), dtype=np.int64)
        return out.reshape(c.shape)

    def randomise_many(self, values: Any) -> np.ndarray:
        """Randomize an array of category labels; returns an object array of labels, same shape."""
        codes = self._encode_inputs(values)
        return self._codec.decode(self.randomise_codes(codes))

    @property
    def exact_epsilon(self) -> float:
        """eps as sampled: the true value is kept iff ``rng.random() < p``; numpy's doubles are the 2^53 multiples
        of 2^-53, so the keep probability is exactly ceil(p 2^53) / 2^53 and the k - 1 others share the rest
        uniformly (exact integer draw): ln(ceil(p 2^53) (k - 1) / (2^53 - ceil(p 2^53))), rounded up
        (:func:`krr_sampling_epsilon`).  The stated ``epsilon`` is the target it was built for."""
        return krr_sampling_epsilon(self.p, self.k)

    @property
    def domain(self) -> CategoricalDomain:
        return CategoricalDomain(self.categories)

    def _encode_inputs(self, values: Any) -> np.ndarray:
        if self.out_of_domain == "error":
            return self._codec.encode_strict(values, what="value")
        return self._codec.encode(values)

    # ----------------------------------------------------------------- closed forms
    def transition_matrix(self) -> np.ndarray:
        """``M[i, j] = P(report j | true i)``: p on the diagonal, q elsewhere."""
        m = np.full((self.k, self.k), self.q)
        np.fill_diagonal(m, self.p)
        return m

    def variance(self, true_count: float | np.ndarray, n: int) -> float | np.ndarray:
        """``Var(n_hat_v) = n q (1-q) / (p-q)^2 + n_v (1-p-q) / (p-q)`` for true count ``n_v`` of ``n``."""
        d = self.p - self.q
        res = n * self.q * (1 - self.q) / d**2 + np.asarray(true_count, dtype=float) * (1 - self.p - self.q) / d
        return float(res) if np.ndim(res) == 0 else res

    # ----------------------------------------------------------------- estimation
    def estimate_from_counts(self, observed_counts: Sequence[float] | np.ndarray,
                             n: int | None = None) -> FrequencyEstimate:
        """Unbiased counts ``(N_v - q n) / (p - q)`` from report counts ``N_v`` (category order)."""
        y = np.asarray(observed_counts, dtype=float)
        if y.shape != (self.k,):
            raise PrivacyParameterError(f"observed_counts: expected {self.k} counts, got shape {y.shape}")
        total = int(round(y.sum())) if n is None else int(n)
        d = self.p - self.q
        est = (y - self.q * total) / d
        var = self.variance(np.clip(est, 0.0, total), total)
        return FrequencyEstimate(self.categories, est, np.sqrt(np.maximum(var, 0.0)), total,
                                 epsilon=self.epsilon, mechanism="krr",
                                 extra={"p": self.p, "q": self.q})

