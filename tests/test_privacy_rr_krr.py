"""k-RR: parameters, errors, transition probabilities, estimator (unbiased, variance), privacy ratio.

Statistical tests use fixed seeds; every tolerance is derived from a variance (binomial or the
estimator's closed form), 4 standard errors unless stated.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_anon.privacy import KRandomizedResponse, PrivacyParameterError
from stream_anon.privacy.frequency import FrequencyEstimate

CATS = ["a", "b", "c", "d", "e"]


def test_probabilities_and_closed_forms() -> None:
    m = KRandomizedResponse(epsilon=1.0, categories=CATS, rng=0)
    assert m.p == pytest.approx(math.e / (math.e + 4))
    assert m.q == pytest.approx(1 / (math.e + 4))
    assert m.p / m.q == pytest.approx(math.e)
    tm = m.transition_matrix()
    assert np.allclose(tm.sum(axis=1), 1.0)
    # variance formula = sum of Bernoulli variances / (p - q)^2
    n, nv = 1000, 300
    direct = (nv * m.p * (1 - m.p) + (n - nv) * m.q * (1 - m.q)) / (m.p - m.q) ** 2
    assert m.variance(nv, n) == pytest.approx(direct)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"epsilon": 0.0, "categories": CATS}, "epsilon"),
    ({"epsilon": -1, "categories": CATS}, "epsilon"),
    ({"epsilon": float("nan"), "categories": CATS}, "epsilon"),
    ({"epsilon": 1.0, "categories": ["a"]}, "at least 2"),
    ({"epsilon": 1.0, "categories": ["a", "a", "b"]}, "distinct"),
    ({"epsilon": 1.0, "categories": CATS, "out_of_domain": "clip"}, "out_of_domain"),
])
def test_bad_parameters_are_named(kwargs: dict, fragment: str) -> None:
    with pytest.raises(PrivacyParameterError, match=fragment):
        KRandomizedResponse(**kwargs)


def test_out_of_domain_error_names_value_and_domain() -> None:
    m = KRandomizedResponse(epsilon=1.0, categories=CATS, rng=0)
    with pytest.raises(PrivacyParameterError, match=r"'zz'.*outside the domain.*5 categories"):
        m.randomise_many(np.array(["a", "zz", "b"], dtype=object))
    with pytest.raises(PrivacyParameterError, match="'zz'"):
        m.randomise("zz")


def test_out_of_domain_random_is_uniform() -> None:
    m = KRandomizedResponse(epsilon=3.0, categories=CATS, out_of_domain="random", rng=1)
    n = 50_000
    out = m.randomise_many(np.array(["zz"] * n, dtype=object))
    counts = np.array([(out == c).sum() for c in CATS])
    se = math.sqrt(n * 0.2 * 0.8)
    assert np.all(np.abs(counts - n / 5) <= 4 * se), counts
    # in-domain values still follow k-RR in the same call
    mixed = m.randomise_many(np.array(["a"] * n + ["zz"], dtype=object))
    share = float(np.mean(mixed[:n] == "a"))
    assert abs(share - m.p) <= 4 * math.sqrt(m.p * (1 - m.p) / n)


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_empirical_transition_probabilities(eps: float) -> None:
    m = KRandomizedResponse(epsilon=eps, categories=CATS, rng=2)
    n = 200_000
    true = np.full(n, 2, dtype=np.int64)
    out = m.randomise_codes(true)
    freq = np.bincount(out, minlength=5) / n
    expected = np.full(5, m.q)
    expected[2] = m.p
    tol = 4 * np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= tol), (freq, expected)


def test_randomise_many_keeps_labels_and_shape() -> None:
    m = KRandomizedResponse(epsilon=1.0, categories=CATS, rng=3)
    vals = np.array([["a", "b"], ["c", "d"]], dtype=object)
    out = m.randomise_many(vals)
    assert out.shape == (2, 2)
    assert set(out.ravel()) <= set(CATS)
    assert m.randomise("e") in CATS


def test_seeded_reproducible() -> None:
    vals = np.array(CATS * 100, dtype=object)
    a = KRandomizedResponse(epsilon=1.0, categories=CATS, rng=42).randomise_many(vals)
    b = KRandomizedResponse(epsilon=1.0, categories=CATS, rng=42).randomise_many(vals)
    c = KRandomizedResponse(epsilon=1.0, categories=CATS, rng=43).randomise_many(vals)
    assert (a == b).all() and not (a == c).all()


@pytest.mark.parametrize("eps", [0.5, 1.0, 3.0])
def test_estimator_unbiased_and_variance_matches(eps: float) -> None:
    """Mean over R repetitions within 4 SE of the truth; empirical variance matches the closed form."""
    k = len(CATS)
    m = KRandomizedResponse(epsilon=eps, categories=CATS, rng=10)
    truth = np.array([2000, 1200, 800, 500, 0])
    codes = np.repeat(np.arange(k), truth)
    n, reps = int(truth.sum()), 400
    ests = np.empty((reps, k))
    ses = np.empty((reps, k))
    for r in range(reps):
        est = m.estimate_counts_from_codes(m.randomise_codes(codes))
        ests[r], ses[r] = est.counts, est.std_errors
    var = np.asarray(m.variance(truth, n))
    se_of_mean = np.sqrt(var / reps)
    assert np.all(np.abs(ests.mean(axis=0) - truth) <= 4 * se_of_mean)
    # sample variance: relative SE ~ sqrt(2/(R-1)) for near-normal estimates
    ratio = ests.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) <= 4 * math.sqrt(2 / (reps - 1))), ratio
    # reported (plug-in) standard errors are close to the true ones on average
    assert np.all(np.abs(ses.mean(axis=0) / np.sqrt(var) - 1) < 0.1)


def test_estimate_counts_from_labels_and_frequencies() -> None:
    m = KRandomizedResponse(epsilon=2.0, categories=CATS, rng=5)
    vals = np.array(["a"] * 600 + ["b"] * 400, dtype=object)
    est = m.estimate_counts(m.randomise_many(vals))
    assert isinstance(est, FrequencyEstimate)
    assert est.n == 1000 and est.categories == tuple(CATS) and est.epsilon == 2.0
    assert est.counts.sum() == pytest.approx(1000)  # the k-RR estimator preserves the total
    assert np.allclose(est.frequencies, est.counts / 1000)
    proj = est.projected_frequencies()
    assert proj.min() >= 0 and proj.sum() == pytest.approx(1)
    cmp = est.compare([600, 400, 0, 0, 0])
    assert cmp["total_variation"] >= 0 and cmp["max_abs_count_error"] <= 5 * est.std_errors.max()
    with pytest.raises(PrivacyParameterError, match="report"):
        m.estimate_counts(np.array(["a", "nope"], dtype=object))


@pytest.mark.parametrize("eps", [0.7, 2.5])
def test_empirical_privacy_ratio(eps: float) -> None:
    """P[M(a)=s] <= e^eps P[M(b)=s] for every output s (hence every set S) within binomial tolerance;
    the worst output s = a reaches e^eps (eps is tight)."""
    m = KRandomizedResponse(epsilon=eps, categories=CATS, rng=7)
    n = 300_000
    pa = np.bincount(m.randomise_codes(np.zeros(n, dtype=np.int64)), minlength=5) / n
    pb = np.bincount(m.randomise_codes(np.ones(n, dtype=np.int64)), minlength=5) / n
    bound = math.exp(eps)
    tol = 4 * np.sqrt(pa * (1 - pa) / n + bound**2 * pb * (1 - pb) / n)
    assert np.all(pa - bound * pb <= tol)
    assert np.all(pb - bound * pa <= 4 * np.sqrt(pb * (1 - pb) / n + bound**2 * pa * (1 - pa) / n))
    assert abs(pa[0] - bound * pb[0]) <= tol[0]  # tight at s = a


def test_large_epsilon_stays_finite() -> None:
    m = KRandomizedResponse(epsilon=800.0, categories=CATS, rng=0)
    assert m.p == 1.0 and m.q == 0.0
    codes = np.arange(5)
    assert (m.randomise_codes(codes) == codes).all()
