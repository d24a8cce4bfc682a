"""Peers as oracles for k-RR / FRAPP: diffprivlib (probabilities) and pure-ldp (estimator values).

Test-only dependencies: diffprivlib==0.6.6 (with scikit-learn<1.9), pure-ldp==1.2.0 (+ statsmodels, which
pure-ldp needs but does not declare).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stream_anon.privacy import KRandomizedResponse, RandomSubstitution


@pytest.mark.parametrize("eps, k", [(0.5, 2), (1.0, 4), (3.0, 9)])
def test_diffprivlib_exponential_categorical_equals_krr(eps: float, k: int) -> None:
    """diffprivlib's ExponentialCategorical with all pairwise utilities 1 is k-RR: same p and q."""
    from diffprivlib.mechanisms import ExponentialCategorical

    cats = [f"v{i}" for i in range(k)]
    peer = ExponentialCategorical(epsilon=eps, utility_list=[(a, b, 1) for a, b in itertools.combinations(cats, 2)])
    ours = KRandomizedResponse(epsilon=eps, categories=cats)
    for a in cats:
        norm = peer._normalising_constant[a]
        for b in cats:
            expected = ours.p if a == b else ours.q
            assert peer._get_prob(a, b) / norm == pytest.approx(expected, rel=1e-12)
    # and its sampler agrees statistically with p
    peer_rs = ExponentialCategorical(epsilon=eps, random_state=1,
                                     utility_list=[(a, b, 1) for a, b in itertools.combinations(cats, 2)])
    n = 4000
    kept = sum(peer_rs.randomise(cats[0]) == cats[0] for _ in range(n)) / n
    assert abs(kept - ours.p) <= 4 * math.sqrt(ours.p * (1 - ours.p) / n)


@pytest.mark.parametrize("eps, d", [(1.0, 5), (2.0, 12)])
def test_pure_ldp_direct_encoding_same_estimates(eps: float, d: int) -> None:
    """pure-ldp's DE server on the same reports gives the same estimates as our k-RR and FRAPP."""
    from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer

    rng = np.random.default_rng(3)
    true = rng.integers(0, d, size=3000)
    ours = KRandomizedResponse(epsilon=eps, categories=list(range(d)), rng=4)
    reports = ours.randomise_codes(true)
    # DEServer.aggregate takes the 0-based report index; estimate(v) maps v through index_mapper (default
    # x - 1: values 1..d, so a 0-based value would silently read the last bucket)
    server = DEServer(epsilon=eps, d=d, index_mapper=lambda x: x - 1)
    for r in reports:
        server.aggregate(int(r))
    peer = np.array([server.estimate(v + 1, suppress_warnings=True) for v in range(d)])
    est = ours.estimate_counts_from_codes(reports)
    assert np.allclose(peer, est.counts, rtol=1e-9, atol=1e-7)
    frapp = RandomSubstitution(categories=list(range(d)), gamma=math.exp(eps))
    assert np.allclose(peer, frapp.estimate_from_counts(np.bincount(reports, minlength=d)).counts,
                       rtol=1e-9, atol=1e-7)
    client = DEClient(epsilon=eps, d=d)
    assert client.p == pytest.approx(ours.p) and client.q == pytest.approx(ours.q)
