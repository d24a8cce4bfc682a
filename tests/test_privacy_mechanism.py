"""The mechanism protocol: every mechanism answers exact_epsilon and domain itself, and accounting only asks it.

The values themselves are recomputed independently in test_privacy_accounting.py and test_side_exact_epsilon.py;
here: every mechanism satisfies the protocol, accounting returns exactly what the mechanism says, the domains
are the public ones, and the shared ``randomise`` draws what ``randomise_many`` draws."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stream_anon.privacy import (
    BoundedLaplace,
    DiscretizedBoundedLaplace,
    KRandomizedResponse,
    LExtendedSubstitution,
    LocalMechanism,
    PrivacyMechanism,
    PrivacyParameterError,
    QuadTreeKMeans,
    RandomSubstitution,
    UnsafeFloatBoundedLaplace,
    exact_epsilon,
)
from stream_anon.privacy.mechanism import BoxDomain, CategoricalDomain, IntervalDomain

CATS = ["a", "b", "c", "d"]


def _local(seed: int) -> list[tuple[LocalMechanism, Any]]:
    """(mechanism, one input value) for every local randomiser, all seeded with ``seed``."""
    return [
        (KRandomizedResponse(epsilon=1.0, categories=CATS, rng=seed), "b"),
        (RandomSubstitution(categories=CATS, epsilon=1.0, rng=seed), "c"),
        (LExtendedSubstitution(categories=CATS, gamma=2.0, l=2, rng=seed), "a"),
        (LExtendedSubstitution(categories=CATS, gamma=2.0, l=2, variant="no-repeat", rng=seed), "d"),
        (DiscretizedBoundedLaplace(epsilon=1.0, categories=CATS, rng=seed), "b"),
        (BoundedLaplace(epsilon=1.0, lower=17, upper=90, integer=True, rng=seed), 38),
        (UnsafeFloatBoundedLaplace(epsilon=1.0, lower=17, upper=90, rng=seed), 38.5),
    ]


def test_every_mechanism_answers_the_protocol_and_accounting_asks_it() -> None:
    kmeans = QuadTreeKMeans(n_clusters=2, epsilon=1.0, bounds=([0, 0], [1, 2]))
    for mech in [m for m, _ in _local(0)] + [kmeans]:
        assert isinstance(mech, PrivacyMechanism), type(mech).__name__
        assert exact_epsilon(mech) == mech.exact_epsilon, type(mech).__name__
    assert not isinstance(kmeans, LocalMechanism)  # charged per window, not a per-value randomiser
    assert kmeans.domain == BoxDomain((0.0, 0.0), (1.0, 2.0)) and kmeans.exact_epsilon == kmeans.epsilon


def test_exact_epsilon_is_the_sampled_one_and_differs_from_the_stated_one_where_it_should() -> None:
    krr, rs, ind, nr, dblap, blap, unsafe = (m for m, _ in _local(0))
    for m in (krr, rs, nr):  # stated target vs as sampled: above it by at most the rounding margin (~1e-12)
        assert m.epsilon <= m.exact_epsilon < m.epsilon + 1e-11
    assert ind.exact_epsilon == 2 * rs.__class__(categories=CATS, gamma=2.0).exact_epsilon
    assert dblap.exact_epsilon == dblap.epsilon and blap.exact_epsilon == blap.epsilon
    assert unsafe.exact_epsilon == math.inf and unsafe.epsilon == 1.0  # the ideal real-valued eps only


def test_domains_are_the_public_ones() -> None:
    krr, rs, ind, _, dblap, blap, unsafe = (m for m, _ in _local(0))
    for m in (krr, rs, ind, dblap):
        assert m.domain == CategoricalDomain(tuple(CATS)) and len(m.domain) == 4
    assert blap.domain == IntervalDomain(17.0, 90.0, True)
    assert unsafe.domain == IntervalDomain(17.0, 90.0, False)


def test_randomise_draws_what_randomise_many_draws() -> None:
    for (one, value), (many, _) in zip(_local(7), _local(7), strict=True):
        single = one.randomise(value)
        batch = many.randomise_many(np.asarray([value], dtype=object if isinstance(value, str) else float))[0]
        assert np.array_equal(np.asarray(single), np.asarray(batch)), type(one).__name__
    assert isinstance(BoundedLaplace(epsilon=1.0, lower=0, upper=1, rng=0).randomise(0.5), float)


def test_an_object_without_the_protocol_is_refused() -> None:
    with pytest.raises(PrivacyParameterError, match="no exact epsilon known for dict"):
        exact_epsilon({"epsilon": 1.0})
