"""exact_epsilon: what each configured mechanism really spends, from its own output distribution as sampled."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from stream_anon.privacy import (
    BoundedLaplace,
    DiscretizedBoundedLaplace,
    KRandomizedResponse,
    LExtendedSubstitution,
    PrivacyParameterError,
    QuadTreeKMeans,
    RandomSubstitution,
    UnsafeFloatBoundedLaplace,
    exact_epsilon,
    record_epsilon,
)
from stream_anon.privacy.exact import LOG_MARGIN
from stream_anon.privacy.randomized_response import krr_sampling_ratio
from stream_anon.privacy.substitution import (
    _frapp_draw,
    enumerated_epsilon,
    frapp_sampling_matrix,
    frapp_sampling_ratio,
)

CATS16 = [f"c{i}" for i in range(16)]


def _ln(r: Fraction) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = 50
        return Decimal(r.numerator).ln() - Decimal(r.denominator).ln()


@pytest.mark.parametrize("k", [2, 5, 16, 42])
@pytest.mark.parametrize("eps", [0.1, 1.0, 5.0])
def test_krr_exact_as_sampled(k: int, eps: float) -> None:
    mech = KRandomizedResponse(epsilon=eps, categories=list(range(k)))
    ratio = krr_sampling_ratio(mech.p, k)
    grid = 2 ** 53
    keep = math.ceil(Fraction(mech.p) * grid)
    # the keep probability is the share of 2^-53 grid points below p; the others share the rest exactly
    assert Fraction(keep - 1, grid) < Fraction(mech.p) <= Fraction(keep, grid)
    exact = _ln(ratio)
    assert abs(exact - Decimal(eps)) < Decimal(1e-14)  # the stated eps is right to the last bits
    assert exact <= Decimal(exact_epsilon(mech)) <= exact + Decimal(2 * LOG_MARGIN)


def test_frapp_sampling_matrix_counts_the_uniform_grid() -> None:
    n_values, gamma = 6, math.e
    counts = frapp_sampling_matrix(n_values, gamma)
    assert all(sum(int(v) for v in counts[t]) == 2 ** 53 for t in range(n_values))
    x = 1 / (gamma + n_values - 1)
    for t in range(n_values):
        for j in range(n_values):
            ideal = (gamma if t == j else 1.0) * x * 2 ** 53
            assert abs(int(counts[t, j]) - ideal) < 16  # within a few grid points of the ideal
    # spot check the boundaries: the first u of each report and the last u before it map as counted
    for t in range(n_values):
        first = 0
        for j in range(n_values):
            c = int(counts[t, j])
            u = np.array([first, first + c - 1], dtype=np.float64) / 2 ** 53
            assert _frapp_draw(np.full(2, t), u, n_values, gamma).tolist() == [j, j]
            first += c


def test_frapp_and_l_extended_exact_epsilons() -> None:
    rs = RandomSubstitution(categories=CATS16, epsilon=1.0)
    exact = _ln(frapp_sampling_ratio(16, rs.gamma))
    assert abs(exact - 1) < Decimal(1e-14)
    assert exact <= Decimal(exact_epsilon(rs)) <= exact + Decimal(2 * LOG_MARGIN)
    ind = LExtendedSubstitution(categories=CATS16, gamma=math.e, l=3)
    assert exact_epsilon(ind) == 3 * exact_epsilon(rs)
    assert exact_epsilon(ind) == pytest.approx(3.0, abs=1e-11)
    small = LExtendedSubstitution(categories=list(range(6)), gamma=2.0, l=3, variant="no-repeat")
    assert exact_epsilon(small) >= enumerated_epsilon(6, 2.0, 3)  # enumeration of the ideal set distribution
    assert exact_epsilon(small) - small.epsilon < 1e-11
    nr = LExtendedSubstitution.for_epsilon(categories=CATS16, epsilon=1.0, l=3, variant="no-repeat")
    assert 1.0 - 1e-9 < nr.epsilon <= exact_epsilon(nr) < 1.0 + 1e-11


def test_numeric_mechanisms_and_record_total() -> None:
    blap = BoundedLaplace(epsilon=1.0, lower=17, upper=90, integer=True)
    assert exact_epsilon(blap) == blap.epsilon <= 1.0
    assert exact_epsilon(UnsafeFloatBoundedLaplace(epsilon=1.0, lower=17, upper=90)) == math.inf
    income = DiscretizedBoundedLaplace(epsilon=1.0, categories=["<=50K", ">50K"], calibration="patent")
    assert exact_epsilon(income) == pytest.approx(0.3309, abs=1e-4)
    km = QuadTreeKMeans(n_clusters=3, epsilon=1.0, bounds=([17, 1], [90, 99]), neighbouring="add_remove")
    assert exact_epsilon(km) == 1.0  # under its own relation; under replace-one see window_epsilon (1.833)
    krr = KRandomizedResponse(epsilon=1.0, categories=["a", "b"])
    total = record_epsilon([krr, blap, income])
    assert total >= exact_epsilon(krr) + exact_epsilon(blap) + exact_epsilon(income) - 1e-15
    assert total == pytest.approx(2.3309, abs=1e-4)
    assert record_epsilon([blap, UnsafeFloatBoundedLaplace(epsilon=1.0, lower=0, upper=1)]) == math.inf
    with pytest.raises(PrivacyParameterError, match="no exact epsilon known for str"):
        exact_epsilon("k-RR")
