"""Discretized bounded Laplace for categories: exact transition matrix, frequencies, estimator, privacy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.bounded_laplace import DiscretizedBoundedLaplace, discretized_transition_matrix
from stream_anon.privacy.frequency import FrequencyEstimate

CATS = ["a", "b", "c", "d", "e"]


def _quadrature_matrix(eps: float, m: int) -> np.ndarray:
    b = 2.0 / eps
    h = 2.0 / (m - 1)
    t = -1 + h * np.arange(m)
    P = np.zeros((m, m))
    for i in range(m):
        q = t[i]
        c = 1 - (math.exp(-(q + 1) / b) + math.exp(-(1 - q) / b)) / 2

        def f(y: float, q: float = q, c: float = c) -> float:
            return math.exp(-abs(y - q) / b) / (2 * b * c)

        for j in range(m):
            def kern(y: float, j: int = j) -> float:
                return max(0.0, 1 - abs(y - t[j]) / h) * f(y)
            lo, hi = max(-1.0, t[j] - h), min(1.0, t[j] + h)
            pts = [p for p in (t[j], q) if lo < p < hi]
            P[i, j] = integrate.quad(kern, lo, hi, points=pts or None, epsabs=1e-13, epsrel=1e-12)[0]
    return P


@pytest.mark.parametrize(("eps", "m"), [(1.0, 5), (0.05, 3), (4.0, 7), (20.0, 4), (0.5, 2)])
def test_transition_matrix_closed_form_equals_quadrature(eps: float, m: int) -> None:
    P = discretized_transition_matrix(eps, m)
    assert np.allclose(P.sum(axis=1), 1.0, atol=1e-12)
    assert np.all(P > 0)
    assert np.allclose(P, _quadrature_matrix(eps, m), atol=1e-10)


def test_utility_vs_krr_at_eps1_m5() -> None:
    mech = DiscretizedBoundedLaplace(epsilon=1.0, categories=CATS, rng=0)
    p_true = mech.p_true
    assert p_true.min() == pytest.approx(0.1822, abs=1e-4)  # end categories
    assert p_true.max() == pytest.approx(0.3077, abs=1e-4)
    krr_p = math.e / (math.e + 4)
    assert krr_p == pytest.approx(0.4046, abs=1e-4)
    assert p_true.max() < krr_p


def test_post_processing_keeps_epsilon_ldp_exactly() -> None:
    for eps in (0.2, 1.0, 3.0):
        P = discretized_transition_matrix(eps, 6)
        ratios = P[:, None, :] / P[None, :, :]
        assert np.log(ratios).max() <= eps + 1e-12


def test_empirical_frequencies_match_transition_matrix() -> None:
    mech = DiscretizedBoundedLaplace(epsilon=1.0, categories=CATS, rng=1)
    P = mech.transition_matrix
    n = 60_000
    for i, c in enumerate(CATS):
        rep = mech.randomise_many([c] * n)
        freq = np.array([(rep == k).mean() for k in CATS])
        se = np.sqrt(P[i] * (1 - P[i]) / n)
        assert np.all(np.abs(freq - P[i]) <= 4 * se), (c, freq, P[i])


def test_estimate_counts_unbiased_within_4se_and_se_matches_spread() -> None:
    rng = np.random.default_rng(2)
    truth = np.array([5000, 12000, 3000, 8000, 2000])
    values = np.repeat(np.array(CATS, dtype=object), truth)
    ests = []
    last: FrequencyEstimate | None = None
    for r in range(30):
        mech = DiscretizedBoundedLaplace(epsilon=2.0, categories=CATS, rng=rng)
        last = mech.estimate_counts(mech.randomise_many(values))
        ests.append(last.counts)
        if r == 0:
            assert np.all(np.abs(last.counts - truth) <= 4 * last.std_errors)
    assert last is not None and last.n == truth.sum() and last.categories == tuple(CATS)
    assert last.epsilon == 2.0
    arr = np.array(ests)
    mean_se = last.std_errors / math.sqrt(len(ests))
    assert np.all(np.abs(arr.mean(axis=0) - truth) <= 4 * mean_se)
    # the analytic SE agrees with the spread over 30 runs (chi-square band for 29 df, ~ +-40 %)
    ratio = arr.std(axis=0, ddof=1) / last.std_errors
    assert np.all((ratio > 0.6) & (ratio < 1.45)), ratio


def test_ordinal_order_and_decode() -> None:
    mech = DiscretizedBoundedLaplace(epsilon=50.0, categories=[1, 2, 3], rng=3)
    rep = mech.randomise_many([1, 2, 3] * 1000)
    assert set(rep.tolist()) <= {1, 2, 3}
    assert (rep == np.array([1, 2, 3] * 1000, dtype=object)).mean() > 0.9  # b = 0.04: nearly always true
    idx = mech.randomise_indices(np.array([0, 2]))
    assert idx.dtype == np.int64 and set(idx.tolist()) <= {0, 1, 2}


def test_errors_name_the_problem() -> None:
    mech = DiscretizedBoundedLaplace(epsilon=1.0, categories=CATS, rng=0)
    with pytest.raises(PrivacyParameterError, match="'z' is not one of the 5 categories"):
        mech.randomise_many(["a", "z"])
    with pytest.raises(PrivacyParameterError, match="at least 2"):
        DiscretizedBoundedLaplace(epsilon=1.0, categories=["a"])
    with pytest.raises(PrivacyParameterError, match="distinct"):
        DiscretizedBoundedLaplace(epsilon=1.0, categories=["a", "a"])
    with pytest.raises(PrivacyParameterError, match="indices"):
        mech.randomise_indices(np.array([5]))
