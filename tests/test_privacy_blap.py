"""Bounded Laplace: density (KS), bounds, diffprivlib oracle, privacy ratio, estimators, speed."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy import integrate, stats

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.bounded_laplace import (
    BoundedLaplace,
    actual_epsilon,
    bounded_laplace_scale,
)

CONFIGS = [  # epsilon, sensitivity, lower, upper
    (1.0, 2.0, -1.0, 1.0),
    (1.0, 1.0, -1.0, 1.0),
    (0.5, 10.0, 17.0, 90.0),
    (2.0, 1.0, 0.0, 1.0),
    (0.1, 0.3, 0.0, 1.0),
    (3.0, 98.0, 1.0, 99.0),
]


@pytest.mark.parametrize(("eps", "sens", "lo", "hi"), CONFIGS)
def test_scale_bias_variance_match_diffprivlib(eps: float, sens: float, lo: float, hi: float) -> None:
    from diffprivlib.mechanisms import LaplaceBoundedDomain

    ours = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, sensitivity=sens, rng=0)
    peer = LaplaceBoundedDomain(epsilon=eps, sensitivity=sens, lower=lo, upper=hi, random_state=0)
    assert ours.scale == pytest.approx(peer._find_scale(), rel=1e-9)
    xs = np.linspace(lo, hi, 9)
    for x in xs:
        assert ours.bias(x) == pytest.approx(peer.bias(x), rel=1e-8, abs=1e-10 * (hi - lo))
        assert ours.variance(x) == pytest.approx(peer.variance(x), rel=1e-8)


@pytest.mark.parametrize(("eps", "sens", "lo", "hi"), CONFIGS)
def test_scale_really_gives_epsilon(eps: float, sens: float, lo: float, hi: float) -> None:
    m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, sensitivity=sens, rng=0)
    assert actual_epsilon(m.scale, sens, hi - lo) == pytest.approx(eps, rel=1e-9)
    assert actual_epsilon(m.scale, sens, hi - lo) <= eps * (1 + 1e-12)
    if sens < hi - lo:  # the naive scale under-protects
        assert actual_epsilon(sens / eps, sens, hi - lo) > eps * 1.01
        assert m.scale > m.naive_scale


def test_scale_with_delta_matches_diffprivlib() -> None:
    from diffprivlib.mechanisms import LaplaceBoundedDomain

    for eps, delta, sens in ((0.5, 0.05, 1.0), (1.0, 0.2, 0.3), (2.0, 0.01, 2.0)):
        ours = BoundedLaplace(epsilon=eps, lower=-1, upper=1, sensitivity=sens, delta=delta)
        peer = LaplaceBoundedDomain(epsilon=eps, delta=delta, sensitivity=sens, lower=-1, upper=1)
        assert ours.scale == pytest.approx(peer._find_scale(), rel=1e-9)
        assert actual_epsilon(ours.scale, sens, 2.0) == pytest.approx(eps - math.log1p(-delta), rel=1e-9)


def test_patent_scale_and_peer_fact() -> None:
    # dQ = 2 on [-1, 1], delta = 0: b = 2 / eps exactly (naive = correct)
    for eps in (0.1, 0.5, 1.0, 4.0):
        assert BoundedLaplace(epsilon=eps, lower=-1, upper=1).scale == pytest.approx(2.0 / eps, rel=1e-12)
    # privacy-peers.md: sensitivity 1 with b = 1/eps gives actual eps 1.38 at nominal 1
    assert actual_epsilon(1.0, 1.0, 2.0) == pytest.approx(1.3799, abs=1e-4)
    # delta > 0 loosens: b = dQ / (eps - ln(1 - delta)) when dQ = width
    assert bounded_laplace_scale(epsilon=1.0, sensitivity=2.0, width=2.0, delta=0.1) == pytest.approx(
        2.0 / (1.0 - math.log(0.9)), rel=1e-12)


@pytest.mark.parametrize("eps", [0.5, 2.0, 20.0])
@pytest.mark.parametrize("x", [-1.0, -0.3, 0.9, 1.0])
def test_density_matches_formula_ks(eps: float, x: float) -> None:
    m = BoundedLaplace(epsilon=eps, lower=-1, upper=1, rng=np.random.default_rng(int(1000 * eps + 10 * x + 50)))
    y = m.randomise_many(np.full(20_000, x))
    assert y.min() >= -1.0 and y.max() <= 1.0
    res = stats.kstest(y, lambda v: m.cdf(v, x))
    assert res.pvalue > 1e-3, res


def test_density_integrates_to_one_and_cdf_consistent() -> None:
    m = BoundedLaplace(epsilon=1.3, lower=17, upper=90, rng=0)
    for x in (17.0, 30.0, 90.0):
        total = integrate.quad(lambda v, x=x: float(m.density(v, x)[0]), 17, 90, points=[x], epsabs=1e-12)[0]
        assert total == pytest.approx(1.0, abs=1e-9)
        mid = integrate.quad(lambda v, x=x: float(m.density(v, x)[0]), 17, 50, points=[x] if x < 50 else None)[0]
        assert float(m.cdf(50.0, x)[0]) == pytest.approx(mid, abs=1e-9)
        mean = integrate.quad(lambda v, x=x: v * float(m.density(v, x)[0]), 17, 90, points=[x])[0]
        assert float(m.expected_output(x)) == pytest.approx(mean, abs=1e-8)


def test_outputs_stay_in_data_bounds_even_at_extremes() -> None:
    m = BoundedLaplace(epsilon=0.01, lower=17, upper=90, rng=1)
    x = np.concatenate([np.full(50_000, 17.0), np.full(50_000, 90.0)])
    y = m.randomise_many(x)
    assert y.min() >= 17 and y.max() <= 90
    m2 = BoundedLaplace(epsilon=200.0, lower=17, upper=90, rng=2)
    y2 = m2.randomise_many(x)
    assert y2.min() >= 17 and y2.max() <= 90
    assert np.abs(y2 - x).max() < 5.0  # scale 0.365 years


def test_two_sample_ks_against_diffprivlib_samples() -> None:
    from diffprivlib.mechanisms import LaplaceBoundedDomain

    for x, sens in ((20.0, 10.0), (60.0, 73.0)):
        ours = BoundedLaplace(epsilon=0.7, lower=17, upper=90, sensitivity=sens, rng=3)
        peer = LaplaceBoundedDomain(epsilon=0.7, sensitivity=sens, lower=17, upper=90, random_state=4)
        a = ours.randomise_many(np.full(3000, x))
        b = np.array([peer.randomise(x) for _ in range(3000)])
        assert stats.ks_2samp(a, b).pvalue > 1e-3


def _max_log_ratio_with_tolerance(ya: np.ndarray, yb: np.ndarray, edges: np.ndarray) -> tuple[float, float]:
    """Max over bins of ln(p_a/p_b) and ln(p_b/p_a) minus 4 SE (delta method, bins with >= 400 counts each)."""
    ca, _ = np.histogram(ya, edges)
    cb, _ = np.histogram(yb, edges)
    ok = (ca >= 400) & (cb >= 400)
    pa, pb = ca[ok] / ya.size, cb[ok] / yb.size
    se = np.sqrt((1 - pa) / (ya.size * pa) + (1 - pb) / (yb.size * pb))
    lr = np.abs(np.log(pa / pb))
    return float((lr - 4 * se).max()), float((lr + 4 * se).max())


def test_empirical_privacy_ratio_within_e_eps() -> None:
    n = 400_000
    edges = np.linspace(-1, 1, 41)
    # patent setting: neighbours are the two ends of the domain
    m = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, rng=5)
    lo, _ = _max_log_ratio_with_tolerance(m.randomise_many(np.full(n, -1.0)), m.randomise_many(np.full(n, 1.0)), edges)
    assert lo <= 1.0
    # sensitivity 1 on [-1, 1] with the Holohan scale: worst pair q=-1, q'=0
    m1 = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, sensitivity=1.0, rng=6)
    lo1, _ = _max_log_ratio_with_tolerance(m1.randomise_many(np.full(n, -1.0)),
                                           m1.randomise_many(np.full(n, 0.0)), edges)
    assert lo1 <= 1.0
    # exact bin probabilities never exceed e^eps
    pa = np.diff(m1.cdf(edges, -1.0))
    pb = np.diff(m1.cdf(edges, 0.0))
    assert np.abs(np.log(pa / pb)).max() <= 1.0 + 1e-12


def test_naive_scale_is_detectably_not_epsilon() -> None:
    """With sensitivity 1 and the naive b = 1/eps the ratio exceeds e^eps (actual 1.38): test can fail."""
    n = 400_000
    # b = 1 on [-1, 1] is the naive scale dQ/eps for dQ = 1, eps = 1 (here obtained as the correct scale of
    # eps = 2 with dQ = 2); for neighbours at distance 1 it gives 1 + ln dC(1) = 1.38, not 1
    naive = BoundedLaplace(epsilon=2.0, lower=-1, upper=1, sensitivity=2.0, rng=7)
    assert naive.scale == pytest.approx(1.0)
    edges = np.linspace(-1, 1, 41)
    _, hi = _max_log_ratio_with_tolerance(naive.randomise_many(np.full(n, -1.0)),
                                          naive.randomise_many(np.full(n, 0.0)), edges)
    lo, _ = _max_log_ratio_with_tolerance(naive.randomise_many(np.full(n, -1.0)),
                                          naive.randomise_many(np.full(n, 0.0)), edges)
    assert lo > 1.0 + 0.1  # clearly above the nominal eps = 1 for neighbours at distance 1
    assert hi >= lo


@pytest.mark.parametrize("x", [-0.8, 0.0, 0.55])
def test_unbiased_transform_exact_away_from_bounds(x: float) -> None:
    for eps in (0.3, 1.0, 8.0):
        m = BoundedLaplace(epsilon=eps, lower=-1, upper=1, rng=0)
        f = lambda v, m=m: float(m.unbiased_transform(np.asarray([v]))[0] * m.density(v, x)[0])  # noqa: E731
        pts = sorted({-1.0, -0.9, x, 0.9, 1.0})
        val = sum(integrate.quad(f, a, c, epsabs=1e-13)[0] for a, c in zip(pts[:-1], pts[1:], strict=True))
        assert val == pytest.approx(x, abs=1e-8)


def test_unbiased_transform_bias_at_bound_equals_bound_formula() -> None:
    m = BoundedLaplace(epsilon=1.0, lower=17, upper=90, rng=0)
    f = lambda v: float(m.unbiased_transform(np.asarray([v]))[0] * m.density(v, 17.0)[0])  # noqa: E731
    edge = 17 + 0.1 * 73 / 2
    val = integrate.quad(f, 17, edge)[0] + integrate.quad(f, edge, 90 - 0.1 * 73 / 2)[0] + \
        integrate.quad(f, 90 - 0.1 * 73 / 2, 90)[0]
    assert val - 17.0 == pytest.approx(m.max_transform_bias(), rel=1e-6)


@pytest.mark.parametrize("x", [20.0, 38.0, 71.0])
@pytest.mark.parametrize("method", ["boundary-corrected", "aggregate"])
def test_mean_estimator_unbiased_within_4se_constant_inputs(x: float, method: str) -> None:
    m = BoundedLaplace(epsilon=1.0, lower=17, upper=90, rng=np.random.default_rng(int(x) + len(method)))
    est, se = m.estimate_mean(m.randomise_many(np.full(100_000, x)), method=method)  # type: ignore[arg-type]
    assert abs(est - x) <= 4 * se


def test_mean_estimator_on_adult_age(adult_path: object) -> None:
    from stream_anon.core.datasets import read_adult

    ages = read_adult(adult_path)["age"].to_numpy(dtype=float)  # type: ignore[arg-type]
    m = BoundedLaplace(epsilon=1.0, lower=17, upper=90, rng=11)
    strip = 0.1 * 73 / 2
    share_near = float(np.mean((ages < 17 + strip) | (ages > 90 - strip)))
    bias_bound = m.max_transform_bias() * share_near
    ests = []
    for _ in range(3):
        est, se = m.estimate_mean(m.randomise_many(ages))
        ests.append(est)
        assert abs(est - ages.mean()) <= 4 * se + bias_bound
    # the aggregate inversion is consistent only for equal inputs: on ADULT its limit is off by > 1 year
    assert m.aggregate_target(ages) - ages.mean() > 1.0


def test_expected_output_monotone_and_inverse_round_trip() -> None:
    m = BoundedLaplace(epsilon=0.8, lower=1, upper=99, sensitivity=5, rng=0)
    xs = np.linspace(1, 99, 301)
    g = np.asarray(m.expected_output(xs))
    assert np.all(np.diff(g) > 0)
    back = np.asarray(m.inverse_expected_output(g))
    assert np.allclose(back, xs, atol=1e-9)
    assert float(m.inverse_expected_output(0.0)) == 1.0  # below g's range: the lower bound


def test_randomise_is_seeded_and_scalar() -> None:
    a = BoundedLaplace(epsilon=1, lower=0, upper=10, rng=42).randomise_many(np.arange(11.0))
    b = BoundedLaplace(epsilon=1, lower=0, upper=10, rng=42).randomise_many(np.arange(11.0))
    assert np.array_equal(a, b)
    v = BoundedLaplace(epsilon=1, lower=0, upper=10, rng=1).randomise(3)
    assert isinstance(v, float) and 0 <= v <= 10


def test_snapping_puts_outputs_on_grid() -> None:
    m = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, snap_bits=10, rng=0)
    y = m.randomise_many(np.linspace(-1, 1, 10_000))
    assert np.all(np.round(y * 1024) == y * 1024)
    assert y.min() >= -1 and y.max() <= 1


def test_bad_parameters_and_inputs_raise_clear_errors() -> None:
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        BoundedLaplace(epsilon=0, lower=0, upper=1)
    with pytest.raises(PrivacyParameterError, match="upper"):
        BoundedLaplace(epsilon=1, lower=1, upper=1)
    with pytest.raises(PrivacyParameterError, match="sensitivity"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, sensitivity=2)
    with pytest.raises(PrivacyParameterError, match="delta"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, delta=1.0)
    m = BoundedLaplace(epsilon=1, lower=17, upper=90, rng=0)
    with pytest.raises(PrivacyParameterError, match=r"\[17.0, 90.0\].*got 91"):
        m.randomise_many([30, 91])
    with pytest.raises(PrivacyParameterError, match="NaN"):
        m.randomise_many([np.nan])
    clip = BoundedLaplace(epsilon=1, lower=17, upper=90, out_of_bounds="clip", rng=0)
    assert 17 <= clip.randomise(150) <= 90
    with pytest.raises(PrivacyParameterError, match="method"):
        m.estimate_mean([20, 30], method="median")  # type: ignore[arg-type]


def test_speed_at_least_one_million_values_per_second() -> None:
    m = BoundedLaplace(epsilon=1.0, lower=17, upper=90, rng=0)
    x = np.random.default_rng(0).uniform(17, 90, 1_000_000)
    m.randomise_many(x[:1000])
    best = min(_timed(m, x) for _ in range(3))
    assert 1_000_000 / best >= 1_000_000


def _timed(m: BoundedLaplace, x: np.ndarray) -> float:
    t = time.perf_counter()
    m.randomise_many(x)
    return time.perf_counter() - t
