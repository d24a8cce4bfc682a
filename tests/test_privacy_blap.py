"""Bounded Laplace, continuous theory and the unsafe binary64 sampler (``UnsafeFloatBoundedLaplace``): Holohan
scale, density (KS), diffprivlib oracle, empirical privacy ratio; plus the grid mechanism's estimators and errors.

The exact grid mechanism (default) has its exactness tests in ``test_privacy_blap_exact.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, stats

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.bounded_laplace import (
    BoundedLaplace,
    UnsafeFloatBoundedLaplace,
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

    ours = UnsafeFloatBoundedLaplace(epsilon=eps, lower=lo, upper=hi, sensitivity=sens, rng=0)
    peer = LaplaceBoundedDomain(epsilon=eps, sensitivity=sens, lower=lo, upper=hi, random_state=0)
    assert ours.scale == pytest.approx(peer._find_scale(), rel=1e-9)
    xs = np.linspace(lo, hi, 9)
    for x in xs:
        assert ours.bias(x) == pytest.approx(peer.bias(x), rel=1e-8, abs=1e-10 * (hi - lo))
        assert ours.variance(x) == pytest.approx(peer.variance(x), rel=1e-8)


@pytest.mark.parametrize(("eps", "sens", "lo", "hi"), CONFIGS)
def test_scale_really_gives_epsilon(eps: float, sens: float, lo: float, hi: float) -> None:
    m = UnsafeFloatBoundedLaplace(epsilon=eps, lower=lo, upper=hi, sensitivity=sens, rng=0)
    assert actual_epsilon(m.scale, sens, hi - lo) == pytest.approx(eps, rel=1e-9)
    assert actual_epsilon(m.scale, sens, hi - lo) <= eps * (1 + 1e-12)
    if sens < hi - lo:  # the naive scale under-protects
        assert actual_epsilon(sens / eps, sens, hi - lo) > eps * 1.01
        assert m.scale > m.naive_scale


def test_scale_with_delta_matches_diffprivlib() -> None:
    from diffprivlib.mechanisms import LaplaceBoundedDomain

    for eps, delta, sens in ((0.5, 0.05, 1.0), (1.0, 0.2, 0.3), (2.0, 0.01, 2.0)):
        ours = UnsafeFloatBoundedLaplace(epsilon=eps, lower=-1, upper=1, sensitivity=sens, delta=delta)
        peer = LaplaceBoundedDomain(epsilon=eps, delta=delta, sensitivity=sens, lower=-1, upper=1)
        assert ours.scale == pytest.approx(peer._find_scale(), rel=1e-9)
        assert actual_epsilon(ours.scale, sens, 2.0) == pytest.approx(eps - math.log1p(-delta), rel=1e-9)


def test_patent_scale_and_peer_fact() -> None:
    # dQ = 2 on [-1, 1], delta = 0: b = 2 / eps exactly (naive = correct)
    for eps in (0.1, 0.5, 1.0, 4.0):
        assert UnsafeFloatBoundedLaplace(epsilon=eps, lower=-1, upper=1).scale == pytest.approx(
            2.0 / eps, rel=1e-12)
        # the grid mechanism calibrated exactly lands on the same scale (full-width truncated discrete Laplace)
        assert BoundedLaplace(epsilon=eps, lower=-1, upper=1).scale == pytest.approx(2.0 / eps, rel=1e-9)
    # privacy-peers.md: sensitivity 1 with b = 1/eps gives actual eps 1.38 at nominal 1
    assert actual_epsilon(1.0, 1.0, 2.0) == pytest.approx(1.3799, abs=1e-4)
    # delta > 0 loosens: b = dQ / (eps - ln(1 - delta)) when dQ = width
    assert bounded_laplace_scale(epsilon=1.0, sensitivity=2.0, width=2.0, delta=0.1) == pytest.approx(
        2.0 / (1.0 - math.log(0.9)), rel=1e-12)


@pytest.mark.parametrize("eps", [0.5, 2.0, 20.0])
@pytest.mark.parametrize("x", [-1.0, -0.3, 0.9, 1.0])
def test_density_matches_formula_ks(eps: float, x: float) -> None:
    m = UnsafeFloatBoundedLaplace(epsilon=eps, lower=-1, upper=1,
                                  rng=np.random.default_rng(int(1000 * eps + 10 * x + 50)))
    y = m.randomise_many(np.full(20_000, x))
    assert y.min() >= -1.0 and y.max() <= 1.0
    res = stats.kstest(y, lambda v: m.cdf(v, x))
    assert res.pvalue > 1e-3, res


def test_continuous_cdf_and_expected_output_match_quadrature() -> None:
    m = UnsafeFloatBoundedLaplace(epsilon=1.3, lower=17, upper=90, rng=0)
    b = m.normalized_scale

    def density(v: float, x: float) -> float:  # f_q(y) of the module docstring, in data units
        q, y = (x - 17) * 2 / 73 - 1, (v - 17) * 2 / 73 - 1
        c = 1 - (math.exp(-(q + 1) / b) + math.exp(-(1 - q) / b)) / 2
        return math.exp(-abs(y - q) / b) / (2 * b * c) * 2 / 73

    for x in (17.0, 30.0, 90.0):
        assert integrate.quad(density, 17, 90, args=(x,), points=[x], epsabs=1e-12)[0] == pytest.approx(1.0, abs=1e-9)
        mid = integrate.quad(density, 17, 50, args=(x,), points=[x] if x < 50 else None)[0]
        assert float(m.cdf(50.0, x)[0]) == pytest.approx(mid, abs=1e-9)
        mean = integrate.quad(lambda v, x=x: v * density(v, x), 17, 90, points=[x])[0]
        assert float(m.expected_output(x)) == pytest.approx(mean, abs=1e-8)


def test_outputs_stay_in_data_bounds_even_at_extremes() -> None:
    x = np.concatenate([np.full(50_000, 17.0), np.full(50_000, 90.0)])
    for mechanism in (UnsafeFloatBoundedLaplace, BoundedLaplace):
        m = mechanism(epsilon=0.01, lower=17, upper=90, rng=1)
        y = m.randomise_many(x)
        assert y.min() >= 17 and y.max() <= 90
        m2 = mechanism(epsilon=200.0, lower=17, upper=90, rng=2)
        y2 = m2.randomise_many(x)
        assert y2.min() >= 17 and y2.max() <= 90
        assert np.abs(y2 - x).max() < 5.0  # scale 0.365 years (grid: the table caps the eps it can state)


def test_two_sample_ks_against_diffprivlib_samples() -> None:
    from diffprivlib.mechanisms import LaplaceBoundedDomain

    for x, sens in ((20.0, 10.0), (60.0, 73.0)):
        ours = UnsafeFloatBoundedLaplace(epsilon=0.7, lower=17, upper=90, sensitivity=sens, rng=3)
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
    m = UnsafeFloatBoundedLaplace(epsilon=1.0, lower=-1, upper=1, rng=5)
    lo, _ = _max_log_ratio_with_tolerance(m.randomise_many(np.full(n, -1.0)), m.randomise_many(np.full(n, 1.0)), edges)
    assert lo <= 1.0
    # sensitivity 1 on [-1, 1] with the Holohan scale: worst pair q=-1, q'=0
    m1 = UnsafeFloatBoundedLaplace(epsilon=1.0, lower=-1, upper=1, sensitivity=1.0, rng=6)
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
    naive = UnsafeFloatBoundedLaplace(epsilon=2.0, lower=-1, upper=1, sensitivity=2.0, rng=7)
    assert naive.scale == pytest.approx(1.0)
    edges = np.linspace(-1, 1, 41)
    _, hi = _max_log_ratio_with_tolerance(naive.randomise_many(np.full(n, -1.0)),
                                          naive.randomise_many(np.full(n, 0.0)), edges)
    lo, _ = _max_log_ratio_with_tolerance(naive.randomise_many(np.full(n, -1.0)),
                                          naive.randomise_many(np.full(n, 0.0)), edges)
    assert lo > 1.0 + 0.1  # clearly above the nominal eps = 1 for neighbours at distance 1
    assert hi >= lo


@pytest.mark.parametrize(("lo", "hi", "integer"), [(17, 90, True), (1, 16, True), (-1, 1, False)])
def test_grid_transforms_unbiased_exactly(lo: float, hi: float, integer: bool) -> None:
    """E[h(M(x))] from the exact table: = x for every grid input (w = 0), for inputs >= w from the bounds (w > 0),
    and the largest deviation elsewhere is max_transform_bias."""
    for eps in (0.3, 1.0, 8.0):
        m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=integer, rng=0)
        P, x = m.transition_matrix, m.grid
        h0 = m.unbiased_transform(x, boundary_width=0.0)
        assert np.allclose(P @ h0, x, rtol=0, atol=1e-7 * (hi - lo))
        assert m.max_transform_bias(boundary_width=0.0) == 0.0
        h = m.unbiased_transform(x)  # default boundary_width = 0.1
        bias = P @ h - x
        inside = np.minimum(x - lo, hi - x) >= 0.1 * (hi - lo) / 2 - 1e-9
        assert np.abs(bias[inside]).max() <= 1e-7 * (hi - lo)
        assert np.abs(bias).max() == pytest.approx(m.max_transform_bias(), rel=1e-12)
        assert m.max_transform_bias() > 0  # the price of the smaller variance: a bias near the bounds
        # minimum variance: h0 also meets the constraints, so h has the smaller mean second moment over inputs
        assert float((P @ (h * h)).mean()) <= float((P @ (h0 * h0)).mean()) * (1 + 1e-9)


def test_unsafe_continuous_transform_exact_away_from_bounds() -> None:
    for eps in (0.3, 1.0, 8.0):
        m = UnsafeFloatBoundedLaplace(epsilon=eps, lower=-1, upper=1, rng=0)
        b = m.normalized_scale

        def f(y: float, q: float, m: UnsafeFloatBoundedLaplace = m, b: float = b) -> float:
            c = 1 - (math.exp(-(q + 1) / b) + math.exp(-(1 - q) / b)) / 2
            return float(m.unbiased_transform(np.asarray([y]))[0]) * math.exp(-abs(y - q) / b) / (2 * b * c)

        for q in (-0.8, 0.0, 0.55):
            pts = sorted({-1.0, -0.9, q, 0.9, 1.0})
            val = sum(integrate.quad(f, a, c, args=(q,), epsabs=1e-13)[0]
                      for a, c in zip(pts[:-1], pts[1:], strict=True))
            assert val == pytest.approx(q, abs=1e-8)


@pytest.mark.parametrize("x", [20.0, 38.0, 71.0])
@pytest.mark.parametrize("method", ["boundary-corrected", "unbiased", "aggregate"])
def test_mean_estimator_unbiased_within_4se_constant_inputs(x: float, method: str) -> None:
    m = BoundedLaplace(epsilon=1.0, lower=17, upper=90, integer=True, rng=int(x) + len(method))
    est, se = m.estimate_mean(m.randomise_many(np.full(100_000, x)), method=method)  # type: ignore[arg-type]
    assert abs(est - x) <= 4 * se


def test_mean_estimator_on_adult_age(adult_path: object) -> None:
    from stream_anon.core.datasets import read_adult

    ages = read_adult(adult_path)["age"].to_numpy(dtype=float)  # type: ignore[arg-type]
    m = BoundedLaplace(epsilon=1.0, lower=17, upper=90, integer=True, rng=11)
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
    for m in (BoundedLaplace(epsilon=0.8, lower=1, upper=99, sensitivity=5, rng=0),
              UnsafeFloatBoundedLaplace(epsilon=0.8, lower=1, upper=99, sensitivity=5, rng=0)):
        xs = np.linspace(1, 99, 301)
        g = np.asarray(m.expected_output(xs))
        assert np.all(np.diff(g) > 0)
        back = np.asarray(m.inverse_expected_output(g))
        assert np.allclose(back, xs, atol=1e-9)
        assert float(m.inverse_expected_output(0.0)) == 1.0  # below g's range: the lower bound


def test_grid_moments_are_mixtures_of_table_rows() -> None:
    """An input between grid points is rounded to one of them at random, unbiasedly: its pmf, mean and variance
    are the mixtures of the two rows (checked against a seeded sample)."""
    m = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, rng=3)
    x = 0.3  # between grid points 0.296875 and 0.3046875
    p = m.pmf(x)
    lo = int(np.floor((x + 1) / m.grid_step))
    f = (x + 1) / m.grid_step - lo
    P = m.transition_matrix
    assert np.allclose(p, (1 - f) * P[lo] + f * P[lo + 1], atol=1e-15)
    mean = float(p @ m.grid)
    assert float(m.expected_output(x)) == pytest.approx(mean, abs=1e-12)
    assert float(m.variance(x)) == pytest.approx(float(p @ m.grid ** 2) - mean ** 2, rel=1e-10)
    y = m.randomise_many(np.full(200_000, x))
    assert abs(y.mean() - mean) <= 4 * math.sqrt(float(m.variance(x)) / y.size)


def test_randomise_is_seeded_and_scalar() -> None:
    a = BoundedLaplace(epsilon=1, lower=0, upper=10, rng=42).randomise_many(np.arange(11.0))
    b = BoundedLaplace(epsilon=1, lower=0, upper=10, rng=42).randomise_many(np.arange(11.0))
    assert np.array_equal(a, b)
    v = BoundedLaplace(epsilon=1, lower=0, upper=10, rng=1).randomise(3)
    assert isinstance(v, float) and 0 <= v <= 10


def test_outputs_on_the_public_grid_and_snap_bits_superseded() -> None:
    m = BoundedLaplace(epsilon=1.0, lower=-1, upper=1, rng=0)
    y = m.randomise_many(np.linspace(-1, 1, 10_000))
    assert np.all(np.round(y * 128) == y * 128)  # default real grid: step 2^-7
    age = BoundedLaplace(epsilon=1.0, lower=17, upper=90, integer=True, rng=0)
    ya = age.randomise_many(np.arange(17.0, 91.0))
    assert np.all(ya == np.round(ya)) and len(age.grid) == 74
    with pytest.warns(DeprecationWarning, match="snap_bits"):
        BoundedLaplace(epsilon=1.0, lower=-1, upper=1, snap_bits=10, rng=0)
    unsafe = UnsafeFloatBoundedLaplace(epsilon=1.0, lower=-1, upper=1, snap_bits=10, rng=0)
    yu = unsafe.randomise_many(np.linspace(-1, 1, 10_000))
    assert np.all(np.round(yu * 1024) == yu * 1024)


def test_bad_parameters_and_inputs_raise_clear_errors() -> None:
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        BoundedLaplace(epsilon=0, lower=0, upper=1)
    with pytest.raises(PrivacyParameterError, match="upper"):
        BoundedLaplace(epsilon=1, lower=1, upper=1)
    with pytest.raises(PrivacyParameterError, match="sensitivity"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, sensitivity=2)
    with pytest.raises(PrivacyParameterError, match="delta"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, delta=1.0)
    with pytest.raises(PrivacyParameterError, match="delta.*pure"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, delta=0.1)
    with pytest.raises(PrivacyParameterError, match="exactly one of epsilon or scale"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, scale=2.0)
    with pytest.raises(PrivacyParameterError, match="grid_step"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, grid_step=0.3)
    with pytest.raises(PrivacyParameterError, match="integer bounds"):
        BoundedLaplace(epsilon=1, lower=0, upper=1.5, integer=True)
    with pytest.raises(PrivacyParameterError, match="calibration"):
        BoundedLaplace(epsilon=1, lower=0, upper=1, calibration="holohan")  # type: ignore[arg-type]
    integer = BoundedLaplace(epsilon=1, lower=17, upper=90, integer=True, rng=0)
    with pytest.raises(PrivacyParameterError, match=r"expected an integer in \[17, 90\], got 38.5"):
        integer.randomise_many([38.5])
    with pytest.raises(PrivacyParameterError, match="not an output of this mechanism"):
        integer.unbiased_transform([38.25])
    with pytest.raises(PrivacyParameterError, match="boundary_width"):
        integer.unbiased_transform([38.0], boundary_width=0.7)
    m = BoundedLaplace(epsilon=1, lower=17, upper=90, rng=0)
    with pytest.raises(PrivacyParameterError, match=r"\[17.0, 90.0\].*got 91"):
        m.randomise_many([30, 91])
    with pytest.raises(PrivacyParameterError, match="NaN"):
        m.randomise_many([np.nan])
    clip = BoundedLaplace(epsilon=1, lower=17, upper=90, out_of_bounds="clip", rng=0)
    assert 17 <= clip.randomise(150) <= 90
    with pytest.raises(PrivacyParameterError, match="method"):
        m.estimate_mean([20, 30], method="median")  # type: ignore[arg-type]
