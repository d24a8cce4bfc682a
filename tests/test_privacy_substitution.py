"""FRAPP random substitution: matrix, inverse-CDF sampling, reconstruction, SE bound, equality with k-RR."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_anon.privacy import KRandomizedResponse, PrivacyParameterError, RandomSubstitution
from stream_anon.privacy.substitution import frapp_standard_error_bound, frapp_transition_matrix


def test_gamma_diagonal_matrix() -> None:
    m = frapp_transition_matrix(4, 3.0)
    x = 1 / (3.0 + 3)
    assert np.allclose(np.diag(m), 3.0 * x) and np.allclose(m[0, 1:], x)
    assert np.allclose(m.sum(axis=0), 1.0)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"categories": [1, 2, 3]}, "exactly one of gamma or epsilon"),
    ({"categories": [1, 2, 3], "gamma": 2.0, "epsilon": 1.0}, "exactly one"),
    ({"categories": [1, 2, 3], "gamma": 1.0}, r"gamma: must be in \(1, inf\)"),
    ({"categories": [1, 2, 3], "gamma": 0.5}, "gamma"),
    ({"categories": [1], "gamma": 2.0}, "at least 2"),
])
def test_bad_parameters(kwargs: dict, fragment: str) -> None:
    with pytest.raises(PrivacyParameterError, match=fragment):
        RandomSubstitution(**kwargs)


@pytest.mark.parametrize("gamma, big_n", [(5.0, 6), (1.5, 3), (20.0, 10)])
def test_inverse_cdf_sampling_follows_the_column(gamma: float, big_n: int) -> None:
    rs = RandomSubstitution(categories=list(range(big_n)), gamma=gamma, rng=11)
    n = 100_000
    for t in (0, big_n // 2, big_n - 1):
        freq = np.bincount(rs.randomise_codes(np.full(n, t)), minlength=big_n) / n
        expected = rs.transition_matrix()[:, t]
        assert np.all(np.abs(freq - expected) <= 4 * np.sqrt(expected * (1 - expected) / n)), (t, freq)
    assert rs.draws_used == 3 * n


@pytest.mark.parametrize("eps, k", [(0.5, 3), (1.0, 8), (4.0, 20)])
def test_equals_krr_with_gamma_e_eps(eps: float, k: int) -> None:
    """Same transition probabilities and the same estimator on the same counts."""
    cats = [f"c{i}" for i in range(k)]
    rs = RandomSubstitution(categories=cats, epsilon=eps)
    krr = KRandomizedResponse(epsilon=eps, categories=cats)
    assert rs.gamma == pytest.approx(math.exp(eps))
    assert rs.epsilon == pytest.approx(eps)
    assert np.allclose(rs.transition_matrix(), krr.transition_matrix().T)
    counts = np.random.default_rng(1).integers(0, 500, size=k).astype(float)
    a, b = rs.estimate_from_counts(counts), krr.estimate_from_counts(counts)
    assert np.allclose(a.counts, b.counts) and np.allclose(a.std_errors, b.std_errors)
    assert np.allclose(rs.reconstruct_by_inversion(counts), a.counts)


def test_reconstruction_unbiased_and_se_bound() -> None:
    """Unbiased within 4 SE; RMS relative L2 error reaches the bound for uniform data, stays below otherwise."""
    big_n, gamma, n, reps = 10, 5.0, 5000, 300
    rs = RandomSubstitution(categories=list(range(big_n)), gamma=gamma, rng=12)
    bound = frapp_standard_error_bound(big_n, gamma, n)
    assert rs.standard_error_bound(n) == pytest.approx(bound)
    # summed variance is data-independent: n (N-1)(N+2 gamma-2)/(gamma-1)^2
    for truth in (np.full(big_n, n // big_n), np.array([2000, 1000, 800, 500, 300, 200, 100, 50, 30, 20])):
        assert truth.sum() == n
        total_var = float(np.sum(rs.variance(truth, n)))
        assert total_var == pytest.approx(n * (big_n - 1) * (big_n + 2 * gamma - 2) / (gamma - 1) ** 2)
        codes = np.repeat(np.arange(big_n), truth)
        ests = np.array([rs.estimate_counts_from_codes(rs.randomise_codes(codes)).counts for _ in range(reps)])
        se_mean = np.sqrt(np.asarray(rs.variance(truth, n)) / reps)
        assert np.all(np.abs(ests.mean(axis=0) - truth) <= 4 * se_mean)
        sq = ((ests - truth) ** 2).sum(axis=1)  # ||X_hat - X||^2 per repetition
        # E||.||^2 = total_var; its sample mean has SE sd(sq)/sqrt(reps)
        assert abs(sq.mean() - total_var) <= 4 * sq.std(ddof=1) / math.sqrt(reps)
        rms_rel = math.sqrt(sq.mean()) / np.linalg.norm(truth)
        theory = math.sqrt(total_var) / np.linalg.norm(truth)
        assert theory <= bound * (1 + 1e-12)
        if (truth == truth[0]).all():
            assert theory == pytest.approx(bound)
        else:
            assert theory < 0.7 * bound
        assert rms_rel == pytest.approx(theory, rel=4 * math.sqrt(2 / reps))


def test_labels_roundtrip() -> None:
    rs = RandomSubstitution(categories=["x", "y", "z"], gamma=4.0, rng=1)
    out = rs.randomise_many(np.array(["x", "y", "z", "x"], dtype=object))
    assert out.shape == (4,) and set(out) <= {"x", "y", "z"}
    assert rs.randomise("y") in {"x", "y", "z"}
    with pytest.raises(PrivacyParameterError, match="'w'"):
        rs.randomise("w")
    est = rs.estimate_counts(out)
    assert est.n == 4 and est.mechanism == "rs" and est.extra["se_bound"] > 0


def test_empirical_privacy_ratio_is_gamma() -> None:
    """P[M(a)=s] <= gamma P[M(b)=s] for every report s within binomial tolerance; tight at s = a."""
    gamma, big_n, n = 6.0, 5, 300_000
    rs = RandomSubstitution(categories=list(range(big_n)), gamma=gamma, rng=21)
    pa = np.bincount(rs.randomise_codes(np.zeros(n, dtype=np.int64)), minlength=big_n) / n
    pb = np.bincount(rs.randomise_codes(np.ones(n, dtype=np.int64)), minlength=big_n) / n
    tol = 4 * np.sqrt(pa * (1 - pa) / n + gamma**2 * pb * (1 - pb) / n)
    assert np.all(pa - gamma * pb <= tol)
    assert abs(pa[0] - gamma * pb[0]) <= tol[0]
    assert math.exp(rs.epsilon) == pytest.approx(gamma)
