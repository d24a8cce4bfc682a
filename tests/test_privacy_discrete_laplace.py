"""Exact discrete Laplace (k-means noise): pmf, exact eps of the rational scale, OpenDP oracle."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import opendp.prelude as dp
import pytest
from scipy import stats

from stream_anon.privacy.base import PrivacyParameterError, seeded_crypto_rng
from stream_anon.privacy.discrete_laplace import (
    discrete_laplace_epsilon,
    discrete_laplace_pmf,
    fraction_upper,
    rational_scale,
    sample_discrete_laplace,
)

dp.enable_features("contrib")


def _g_test(sample: np.ndarray, scale: Fraction) -> tuple[float, int]:
    """G statistic of a sample against the exact pmf, cells with expected count >= 5 plus the two tails pooled."""
    n = sample.size
    cut = 1
    while n * float(discrete_laplace_pmf(np.asarray([cut]), scale)[0]) >= 5:
        cut += 1
    ks = np.arange(-cut + 1, cut)
    expected = n * discrete_laplace_pmf(ks, scale)
    observed = np.array([(sample == k).sum() for k in ks], dtype=float)
    tail_e, tail_o = n - expected.sum(), float(n - observed.sum())
    expected, observed = np.append(expected, tail_e), np.append(observed, tail_o)
    nz = observed > 0
    return 2.0 * float(np.sum(observed[nz] * np.log(observed[nz] / expected[nz]))), len(expected) - 1


@pytest.mark.parametrize("scale", [0.7, 2.0, 20.0, 33.3333])
def test_sampler_matches_the_exact_pmf(scale: float) -> None:
    s = rational_scale(scale)
    z = sample_discrete_laplace(seeded_crypto_rng(int(scale * 10)), s, 200_000)
    g, df = _g_test(z, s)
    assert g < stats.chi2.ppf(1 - 1e-4, df)
    assert discrete_laplace_pmf(np.arange(-2000, 2001), s).sum() == pytest.approx(1.0, abs=1e-9)


def test_rational_scale_rounds_up_and_epsilon_is_exact() -> None:
    for scale in (0.7, 20.0, 10 / 3, 12.0):
        s = rational_scale(scale)
        assert s >= Fraction(scale) and s - Fraction(scale) < Fraction(1, 2 ** 20)
        assert s.denominator & (s.denominator - 1) == 0  # a power of two
        eps = discrete_laplace_epsilon(2, s)
        assert eps == 2 / s and eps <= 2 / Fraction(scale)
        assert Fraction(fraction_upper(eps)) >= eps  # rounded up to a double
        assert fraction_upper(eps) - float(eps) <= math.ulp(float(eps))
    assert rational_scale(20.0) == Fraction(20)  # exact scales stay exact
    with pytest.raises(PrivacyParameterError, match="scale"):
        rational_scale(0.0)


def test_opendp_privacy_map_agrees() -> None:
    """OpenDP's discrete Laplace on integers: map(d_in) = d_in / scale (rounded up); ours is the exact rational."""
    for scale in (2.0, 12.0, 20.0, 4.0):
        meas = dp.m.make_laplace(dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=scale)
        for sens in (1, 2):
            assert float(discrete_laplace_epsilon(sens, rational_scale(scale))) == pytest.approx(meas.map(sens),
                                                                                             rel=1e-12)


def test_opendp_samples_have_the_same_distribution() -> None:
    """Two-sample chi-square of our sampler against OpenDP's (CKS 2020 in Rust) at the same scale."""
    scale = 3.0
    meas = dp.m.make_laplace(dp.vector_domain(dp.atom_domain(T=int)), dp.l1_distance(T=int), scale=scale)
    theirs = np.asarray(meas([0] * 60_000))
    ours = sample_discrete_laplace(seeded_crypto_rng(9), rational_scale(scale), 60_000)
    edges = np.arange(-12, 14) - 0.5
    a, _ = np.histogram(np.clip(theirs, -12, 13), edges)
    b, _ = np.histogram(np.clip(ours, -12, 13), edges)
    res = stats.chi2_contingency(np.vstack([a, b]))
    assert res.pvalue > 1e-4
