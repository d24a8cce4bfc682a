"""DP k-means on a noisy quadtree (QuadkDP / UniQuadkDP): accounting, tree, fallback, NICV, determinism, speed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.dp_kmeans import (
    QuadTreeKMeans,
    nicv,
    noisy_quadtree,
    relative_improvement,
    weighted_kmeans,
)


def _blobs(n: int, seed: int = 0, k: int = 5, sd: float = 0.04) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.uniform(0.15, 0.85, size=(k, 2))
    return np.clip(centers[rng.integers(0, k, n)] + rng.normal(0, sd, (n, 2)), 0, 1)


def test_epsilon_accounting() -> None:
    for eps, gamma in ((1.0, 0.3), (0.05, 0.7), (2.5, 0.5)):
        m = QuadTreeKMeans(n_clusters=3, epsilon=eps, bounds=(0, 1), gamma=gamma, rng=0)
        assert m.epsilon_tree == pytest.approx(gamma * eps)
        assert m.epsilon_counts == pytest.approx((1 - gamma) * eps)
        assert m.epsilon_tree + m.epsilon_counts == pytest.approx(m.epsilon)
        assert m.epsilon == eps


def test_leaves_partition_the_box_and_counts_are_exact_without_noise() -> None:
    X = _blobs(20_000, seed=1)
    rng = np.random.default_rng(0)
    coords, depths, counts, _ = noisy_quadtree(X, epsilon_tree=1e9, epsilon_counts=1e9, max_depth=5,
                                               threshold=200.0, rng=rng)
    side = 1.0 / (1 << depths)
    assert np.sum(side ** 2) == pytest.approx(1.0)  # leaves tile the unit box
    # without noise the leaf counts are the true counts and the split rule is exact
    lo = coords * side[:, None]
    inside = np.all((X[:, None, :] >= lo[None]) & (X[:, None, :] < (lo + side[:, None])[None]), axis=2)
    true = inside.sum(axis=0)
    edge = np.isclose(X, 1.0).any(axis=1)
    assert not edge.any()
    assert np.allclose(counts, true, atol=1e-5)
    assert counts.sum() == pytest.approx(20_000, abs=1e-3)
    assert np.all((true <= 200) | (depths == 5))


def test_fallback_with_fewer_leaves_than_k() -> None:
    X = _blobs(500, seed=2)
    for variant in ("quad", "uniquad"):
        m = QuadTreeKMeans(n_clusters=8, epsilon=1.0, bounds=(0, 1), variant=variant, threshold=1e12,
                           samples_per_leaf=2, rng=3).fit(X)  # the root never splits: 1 leaf
        assert m.leaves_ is not None and len(m.leaves_) == 1
        assert m.fallback_ is not None and "uniform points" in m.fallback_
        assert m.cluster_centers_ is not None and m.cluster_centers_.shape == (8, 2)
        assert np.all((m.cluster_centers_ >= 0) & (m.cluster_centers_ <= 1))


def test_fallback_when_no_leaf_has_positive_weight() -> None:
    hits = 0
    for seed in range(40):
        m = QuadTreeKMeans(n_clusters=3, epsilon=0.01, bounds=(0, 1), threshold=1e12, rng=seed).fit(np.array([[0.5, 0.5]]))
        assert m.cluster_centers_ is not None and m.cluster_centers_.shape == (3, 2)
        if m.fallback_ and m.fallback_.startswith("no leaf"):
            hits += 1
    assert hits > 0  # P(Lap(200) <= -1) ~ 0.5 per seed


def test_nicv_matches_brute_force_and_rp() -> None:
    rng = np.random.default_rng(4)
    X = rng.random((1000, 3))
    C = rng.random((4, 3))
    brute = np.mean([min(np.sum((x - c) ** 2) for c in C) for x in X])
    assert nicv(X, C) == pytest.approx(brute, rel=1e-10)
    assert relative_improvement(2.0, 1.5, 0.5) == pytest.approx(1.0)


def test_dp_nicv_at_least_nonprivate_and_improves_with_epsilon() -> None:
    X = _blobs(20_000, seed=5)
    c, _ = weighted_kmeans(X, np.ones(len(X)), 5, rng=0, n_init=5)
    base = nicv(X, c)
    for variant in ("quad", "uniquad"):
        low = [nicv(X, QuadTreeKMeans(n_clusters=5, epsilon=0.05, bounds=(0, 1), variant=variant, rng=s)
                    .fit(X).cluster_centers_) for s in range(6)]
        high = [nicv(X, QuadTreeKMeans(n_clusters=5, epsilon=2.0, bounds=(0, 1), variant=variant, rng=s)
                     .fit(X).cluster_centers_) for s in range(6)]
        assert min(low + high) >= base * 0.999
        assert np.mean(high) <= np.mean(low)
        assert np.mean(high) <= base * 1.2  # large eps: close to non-private


def test_determinism_given_seed() -> None:
    X = _blobs(5_000, seed=6)
    for variant in ("quad", "uniquad"):
        a = QuadTreeKMeans(n_clusters=4, epsilon=0.5, bounds=(0, 1), variant=variant, rng=9).fit(X).cluster_centers_
        b = QuadTreeKMeans(n_clusters=4, epsilon=0.5, bounds=(0, 1), variant=variant, rng=9).fit(X).cluster_centers_
        c = QuadTreeKMeans(n_clusters=4, epsilon=0.5, bounds=(0, 1), variant=variant, rng=10).fit(X).cluster_centers_
        assert a is not None and b is not None and c is not None
        assert np.array_equal(a, b)
        assert not np.array_equal(a, c)


def test_bounds_in_data_units_and_predict() -> None:
    rng = np.random.default_rng(7)
    X = np.column_stack([rng.integers(17, 91, 3000), rng.integers(1, 100, 3000)]).astype(float)
    m = QuadTreeKMeans(n_clusters=3, epsilon=1.0, bounds=([17, 1], [90, 99]), variant="uniquad", rng=0).fit(X)
    assert m.cluster_centers_ is not None
    assert np.all(m.cluster_centers_ >= [17, 1]) and np.all(m.cluster_centers_ <= [90, 99])
    labels = m.predict(X)
    assert labels.shape == (3000,) and set(labels.tolist()) <= {0, 1, 2}
    assert m.leaves_ is not None and np.all(m.leaves_.lower >= [17, 1]) and np.all(m.leaves_.upper <= [90, 99])


def test_errors() -> None:
    with pytest.raises(PrivacyParameterError, match="gamma"):
        QuadTreeKMeans(n_clusters=3, epsilon=1, bounds=(0, 1), gamma=1.0)
    with pytest.raises(PrivacyParameterError, match="variant"):
        QuadTreeKMeans(n_clusters=3, epsilon=1, bounds=(0, 1), variant="tree")  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match="bounds"):
        QuadTreeKMeans(n_clusters=3, epsilon=1, bounds=(1, 0))
    m = QuadTreeKMeans(n_clusters=3, epsilon=1, bounds=([0, 0], [1, 1]), rng=0)
    with pytest.raises(PrivacyParameterError, match=r"column 1 must be within the public bounds \[0.0, 1.0\]"):
        m.fit(np.array([[0.5, 1.5]]))
    with pytest.raises(PrivacyParameterError, match="shape"):
        m.fit(np.zeros((4, 3)))
    clip = QuadTreeKMeans(n_clusters=1, epsilon=1, bounds=(0, 1), out_of_bounds="clip", rng=0)
    assert clip.fit(np.array([[0.5, 1.5], [0.2, 0.2]])).cluster_centers_ is not None


def test_uniquad_speed_100k_points_under_2s() -> None:
    X = _blobs(100_000, seed=8)
    t = time.perf_counter()
    QuadTreeKMeans(n_clusters=5, epsilon=1.0, bounds=(0, 1), variant="uniquad", rng=0).fit(X)
    assert time.perf_counter() - t < 2.0


class _RecordingRng:
    """Wraps a Generator and records every Laplace draw (scale, size) made by the tree."""

    def __init__(self, seed: int) -> None:
        self.gen = np.random.default_rng(seed)
        self.laplace_calls: list[tuple[float, int]] = []

    def laplace(self, loc: float, scale: float, size: tuple[int, ...]) -> np.ndarray:
        self.laplace_calls.append((float(scale), int(np.prod(size))))
        return self.gen.laplace(loc, scale, size=size)

    def random(self, size: tuple[int, ...] | int | None = None) -> object:
        return self.gen.random(size)


def test_tree_noise_scales_compose_to_epsilon() -> None:
    """Split levels use Lap(max_depth / eps1) (one count per node, nodes of a level disjoint), leaves Lap(1/eps2)."""
    X = _blobs(20_000, seed=11)
    rec = _RecordingRng(0)
    eps1, eps2, depth = 0.3, 0.7, 6
    coords, depths, counts, _ = noisy_quadtree(X, epsilon_tree=eps1, epsilon_counts=eps2, max_depth=depth,
                                               threshold=50.0, rng=rec)  # type: ignore[arg-type]
    *split_calls, leaf_call = rec.laplace_calls
    assert 1 <= len(split_calls) <= depth
    assert all(s == pytest.approx(depth / eps1) for s, _ in split_calls)
    assert leaf_call == (pytest.approx(1 / eps2), len(depths))
    # sensitivity 1 per call: eps1/depth per level, at most depth levels; eps2 for the disjoint leaves
    spent_tree = sum(1.0 / s for s, _ in split_calls)
    assert spent_tree <= eps1 + 1e-12
    assert spent_tree + 1.0 / leaf_call[0] <= eps1 + eps2 + 1e-12


def test_accountant_is_charged_and_stops_when_exhausted() -> None:
    from stream_anon.privacy.budget import BudgetAccountant, BudgetExhaustedError

    X = _blobs(2000, seed=12)
    acc = BudgetAccountant(total_epsilon=1.0)
    QuadTreeKMeans(n_clusters=3, epsilon=0.6, bounds=(0, 1), rng=0).fit(X, accountant=acc)
    assert acc.spent == pytest.approx(0.6)
    m = QuadTreeKMeans(n_clusters=3, epsilon=0.6, bounds=(0, 1), rng=0)
    with pytest.raises(BudgetExhaustedError):
        m.fit(X, accountant=acc)
    assert m.cluster_centers_ is None and m.leaves_ is None
    assert acc.spent == pytest.approx(0.6)
