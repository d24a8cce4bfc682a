"""Discretized bounded Laplace for categories: closed-form matrix, exact eps and its calibration, k-RR comparison,
frequencies, estimator."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy import integrate

from stream_anon.privacy import KRandomizedResponse, exact_epsilon
from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.bounded_laplace import (
    DiscretizedBoundedLaplace,
    discretized_epsilon,
    discretized_transition_matrix,
)
from stream_anon.privacy.exact import LOG_MARGIN
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


def _exact_ln_ratio(weights: np.ndarray) -> Decimal:
    best = max(Fraction(int(weights[:, j].max()), int(weights[:, j].min())) for j in range(weights.shape[1]))
    with localcontext() as ctx:
        ctx.prec = 50
        return Decimal(best.numerator).ln() - Decimal(best.denominator).ln()


@pytest.mark.parametrize(("m", "spent"), [(2, 0.331), (5, 0.833)])
def test_patent_scale_overcharges_as_the_issue_measured(m: int, spent: float) -> None:
    """b = 2/eps (the patent) states 1.0 and spends 0.331 (m = 2) / 0.833 (m = 5): recomputed from the table."""
    mech = DiscretizedBoundedLaplace(epsilon=1.0, categories=list(range(m)), calibration="patent")
    exact = _exact_ln_ratio(mech.table.weights)
    assert exact <= Decimal(mech.epsilon) <= exact + Decimal(2 * LOG_MARGIN)
    assert mech.epsilon == pytest.approx(spent, abs=5e-4)
    # the float closed form gives the same value (the integer table only rounds at 2^-62)
    P = discretized_transition_matrix(1.0, m)
    assert float(np.log(P.max(axis=0) / P.min(axis=0)).max()) == pytest.approx(mech.epsilon, abs=1e-12)


@pytest.mark.parametrize("m", [2, 3, 5, 16])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_exact_calibration_meets_the_target(m: int, eps: float) -> None:
    mech = DiscretizedBoundedLaplace(epsilon=eps, categories=list(range(m)))
    w = mech.table.weights
    assert w.min() >= 1 and np.all(w.sum(axis=1) == 2 ** 62)
    exact = _exact_ln_ratio(w)
    assert exact <= Decimal(mech.epsilon) <= exact + Decimal(2 * LOG_MARGIN)
    assert mech.epsilon <= eps and eps - mech.epsilon < 1e-9
    assert exact_epsilon(mech) == mech.epsilon == discretized_epsilon(mech.scale, m)
    assert mech.scale < 2.0 / eps  # calibrated, it needs less noise than the patent's b = 2/eps


def test_two_categories_calibrated_is_k_rr_and_k_rr_dominates_the_patent_scale() -> None:
    for eps in (0.5, 1.0, 2.0):
        mech = DiscretizedBoundedLaplace(epsilon=eps, categories=["<=50K", ">50K"])
        krr = KRandomizedResponse(epsilon=eps, categories=["<=50K", ">50K"])
        assert np.allclose(mech.transition_matrix, krr.transition_matrix(), atol=1e-12)
        patent = DiscretizedBoundedLaplace(epsilon=eps, categories=["<=50K", ">50K"], calibration="patent")
        assert patent.p_true[0] < krr.p - 0.05  # same stated eps, less signal (eps 0.5: 0.541 vs 0.622; 1: 0.582 vs 0.731)
        # ... because it is k-RR at its exact eps: 0.331 at a stated 1.0
        assert patent.p_true[0] == pytest.approx(math.exp(patent.epsilon) / (1 + math.exp(patent.epsilon)), abs=1e-12)


def test_utility_vs_krr_at_eps1_m5() -> None:
    mech = DiscretizedBoundedLaplace(epsilon=1.0, categories=CATS, rng=0)
    p_true = mech.p_true
    assert p_true.min() == pytest.approx(0.1947, abs=1e-4)  # end categories (patent scale: 0.1822)
    assert p_true.max() == pytest.approx(0.3192, abs=1e-4)  # (patent scale: 0.3077)
    krr_p = math.e / (math.e + 4)
    assert krr_p == pytest.approx(0.4046, abs=1e-4)
    assert p_true.max() < krr_p


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
    assert last.epsilon is not None and 2.0 - 1e-9 < last.epsilon <= 2.0
    arr = np.array(ests)
    mean_se = last.std_errors / math.sqrt(len(ests))
    assert np.all(np.abs(arr.mean(axis=0) - truth) <= 4 * mean_se)
    # the analytic SE agrees with the spread over 30 runs (chi-square band for 29 df, ~ +-40 %)
    ratio = arr.std(axis=0, ddof=1) / last.std_errors
    assert np.all((ratio > 0.6) & (ratio < 1.45)), ratio


def test_ordinal_order_and_decode() -> None:
    mech = DiscretizedBoundedLaplace(epsilon=20.0, categories=[1, 2, 3], rng=3)
    rep = mech.randomise_many([1, 2, 3] * 1000)
    assert set(rep.tolist()) <= {1, 2, 3}
    assert (rep == np.array([1, 2, 3] * 1000, dtype=object)).mean() > 0.9  # nearly always true
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
    with pytest.raises(PrivacyParameterError, match="calibration"):
        DiscretizedBoundedLaplace(epsilon=1.0, categories=CATS, calibration="holohan")  # type: ignore[arg-type]
