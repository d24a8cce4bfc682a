"""Differentially private k-means from a noisy quadtree histogram: QuadkDP and UniQuadkDP.

References
----------
* QuadkDP: Goo, Hong & Shim, "Differentially private k-means clustering based on a quadtree" (J. KIISE 2018).
* UniQuadkDP: Hong, Goo & Shim (uniform sampling inside the quadtree leaves).

Algorithm (d-dimensional points in a PUBLIC box, 2^d-ary tree, D = max_depth):

1. Tree (eps1 = gamma * eps).  Level l = 0 .. D-1: every node of level l gets a noisy count c + Z, Z discrete
   Laplace (exact integer sampling, :mod:`stream_anon.privacy.discrete_laplace`); a node splits into its 2^d
   children iff the noisy count exceeds ``threshold``.  Nodes of one level are disjoint, so one level is a
   histogram query, and the levels compose sequentially.
2. Leaf counts (eps2 = (1 - gamma) eps).  The leaves partition the box: one noisy count per leaf, c + Z,
   negatives clipped to 0 (post-processing).
3. Clustering (post-processing, no budget): weighted Lloyd k-means with k-means++ initialisation on
   * QuadkDP ("quad"): leaf centres weighted by their noisy counts;
   * UniQuadkDP ("uniquad"): ``samples_per_leaf`` = m points drawn uniformly in each leaf, weight count / m.
   Fallback when there are fewer than k distinct weighted points (few leaves with positive weight): each
   positive leaf is represented by ceil(k / #positive) uniform points (the UniQuad representation); with no
   positive leaf at all, k-means++ runs on uniform points of the whole box (weight 1).  Never crashes.

**Neighbouring relation and noise.**  ``neighbouring="replace"`` (default): the data sets are windows of a FIXED
number of records n (the stream is cut by count), so neighbours differ by replacing one record.  The root count
is n (public, no noise); a replaced record leaves one cell and enters another, so each level's histogram and the
leaf histogram have L1 sensitivity 2.  Noise: levels 1..D-1 get scale 2 (D-1)/eps1, the leaves 2/eps2.
``neighbouring="add_remove"``: one record more or less, sensitivity 1 everywhere, root included: levels
0..D-1 get scale D/eps1, leaves 1/eps2 (the paper's calibration).  The exact eps of a fit is
sum over noisy levels of (sensitivity / level scale) + sensitivity / leaf scale, with the scales as the exact
rationals that are sampled (``epsilon_tree``, ``epsilon_counts``, ``epsilon``; <= the targets).
:func:`window_epsilon` evaluates any calibration under either relation: the paper's (add/remove) calibration
spends 2 eps1 (D-1)/D + 2 eps2 under replace-one, 1.833 at eps = 1, gamma = 0.5, D = 6.

Utility metric: NICV = (1/|D|) sum_x min_j ||x - c_j||^2 on the original data (``nicv``);
RP = (NICV_Quad - NICV_UniQuad) / NICV_noprivacy (``relative_improvement``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from stream_anon.core.validation import require_choice, require_float, require_int
from stream_anon.privacy.base import (
    PrivacyParameterError,
    check_epsilon,
    crypto_rng,
    parameter_error,
)
from stream_anon.privacy.discrete_laplace import (
    discrete_laplace_epsilon,
    fraction_upper,
    rational_scale,
    sample_discrete_laplace,
)
from stream_anon.privacy.mechanism import BoxDomain

__all__ = [
    "NEIGHBOURING",
    "QuadTreeKMeans",
    "QuadTreeNoise",
    "QuadTreeLeaves",
    "kmeans_plusplus",
    "nicv",
    "noisy_quadtree",
    "quadtree_noise",
    "relative_improvement",
    "weighted_kmeans",
    "window_epsilon",
]

Variant = Literal["quad", "uniquad"]
Neighbouring = Literal["replace", "add_remove"]
NEIGHBOURING: tuple[str, ...] = ("replace", "add_remove")
VARIANTS: tuple[str, ...] = ("quad", "uniquad")


# ------------------------------------------------------------------------------------------ accounting
@dataclass(frozen=True)
class QuadTreeNoise:
    """The noise of one fit: per-level scale of the tree (levels ``first_noisy_level`` .. D-1) and leaf scale.

    Scales are the exact rationals sampled (discrete Laplace); ``None`` = that part adds no noise.
    """

    max_depth: int
    tree_scale: Fraction | None
    first_noisy_level: int
    count_scale: Fraction

    @property
    def noisy_levels(self) -> int:
        return max(0, self.max_depth - self.first_noisy_level) if self.tree_scale is not None else 0


def window_epsilon(noise: QuadTreeNoise, neighbouring: Neighbouring) -> tuple[Fraction, Fraction]:
    """Exact (tree, leaf counts) eps of one fit with this noise under a neighbouring relation.

    replace-one (windows of fixed size): the root count is the window size, unchanged (sensitivity 0); every
    other level and the leaves have L1 sensitivity 2.  add/remove: sensitivity 1 at every level and the leaves.
    A level without noise (the root under ``"replace"``) must have sensitivity 0 under the relation, else
    eps is infinite (raises).
    """
    require_choice("neighbouring", neighbouring, NEIGHBOURING, error=parameter_error)
    sens_root, sens = (0, 2) if neighbouring == "replace" else (1, 1)
    tree = Fraction(0)
    for level in range(noise.max_depth):
        s_level = sens_root if level == 0 else sens
        noisy = noise.tree_scale is not None and level >= noise.first_noisy_level
        if not noisy:
            if s_level:
                raise PrivacyParameterError(f"level {level} has no noise but sensitivity {s_level} under "
                                            f"{neighbouring!r}: eps is infinite")
            continue
        assert noise.tree_scale is not None
        tree += discrete_laplace_epsilon(s_level, noise.tree_scale)
    return tree, discrete_laplace_epsilon(sens, noise.count_scale)


def quadtree_noise(*, epsilon_tree: float, epsilon_counts: float, max_depth: int,
                   neighbouring: Neighbouring) -> QuadTreeNoise:
    """The calibration that spends at most (epsilon_tree, epsilon_counts) under ``neighbouring`` (see module)."""
    if neighbouring == "replace":
        noisy = max_depth - 1  # levels 1 .. D-1; the root count is the public window size
        tree_scale = rational_scale(2.0 * noisy / epsilon_tree) if noisy > 0 else None
        return QuadTreeNoise(max_depth, tree_scale, 1, rational_scale(2.0 / epsilon_counts))
    if neighbouring == "add_remove":
        return QuadTreeNoise(max_depth, rational_scale(max_depth / epsilon_tree), 0,
                             rational_scale(1.0 / epsilon_counts))
    raise PrivacyParameterError(f"neighbouring: must be one of {NEIGHBOURING}, got {neighbouring!r}")


# --------------------------------------------------------------------------------------------- metrics
def nicv(X: Any, centers: Any) -> float:
    """Normalized intra-cluster variance: (1/|D|) sum_x min_j ||x - c_j||^2 (chunked, vectorized)."""
    x = np.asarray(X, dtype=np.float64)
    c = np.asarray(centers, dtype=np.float64)
    if x.ndim != 2 or c.ndim != 2 or x.shape[1] != c.shape[1]:
        raise PrivacyParameterError(f"nicv: X (n, d) and centers (k, d) must agree in d, got {x.shape}, {c.shape}")
    if x.shape[0] == 0:
        raise PrivacyParameterError("nicv: X is empty")
    total = 0.0
    c2 = (c * c).sum(axis=1)
    for start in range(0, x.shape[0], 65536):
        part = x[start:start + 65536]
        d2 = (part * part).sum(axis=1)[:, None] - 2.0 * part @ c.T + c2[None, :]
        total += float(np.maximum(d2.min(axis=1), 0.0).sum())
    n_points: int = x.shape[0]
    return total / n_points


def relative_improvement(nicv_quad: float, nicv_uniquad: float, nicv_noprivacy: float) -> float:
    """RP = (NICV_Quad - NICV_UniQuad) / NICV_noprivacy (positive: UniQuadkDP is better)."""
    return (nicv_quad - nicv_uniquad) / nicv_noprivacy


# ------------------------------------------------------------------------------------ weighted k-means
def _sq_dist(points: np.ndarray, centers: np.ndarray) -> np.ndarray:
    d2 = (points * points).sum(axis=1)[:, None] - 2.0 * points @ centers.T + (centers * centers).sum(axis=1)[None, :]
    squared: np.ndarray = np.maximum(d2, 0.0)
    return squared


def kmeans_plusplus(points: np.ndarray, weights: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Weighted k-means++ seeding (Arthur & Vassilvitskii 2007): P(pick x) ~ w(x) D(x)^2."""
    n = points.shape[0]
    w = np.asarray(weights, dtype=np.float64)
    first = rng.choice(n, p=w / w.sum())
    centers = [points[first]]
    closest = _sq_dist(points, points[first:first + 1])[:, 0]
    for _ in range(1, k):
        p = w * closest
        s = p.sum()
        idx = rng.choice(n, p=p / s) if s > 0 else rng.choice(n, p=w / w.sum())
        centers.append(points[idx])
        closest = np.minimum(closest, _sq_dist(points, points[idx:idx + 1])[:, 0])
    return np.array(centers)


def weighted_kmeans(points: Any, weights: Any, n_clusters: int, *, rng: np.random.Generator | int | None = None,
                    max_iter: int = 100, tol: float = 1e-8, n_init: int = 1) -> tuple[np.ndarray, float]:
    """Weighted Lloyd k-means with k-means++ init; returns (centers (k, d), weighted inertia).

    Requires at least ``n_clusters`` points with positive weight.  An empty cluster keeps its centre.
    The best of ``n_init`` seeded restarts (lowest weighted inertia) is returned.
    """
    gen = crypto_rng(rng)
    pts = np.asarray(points, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    k = require_int("n_clusters", n_clusters, low=1, error=parameter_error)
    keep = w > 0
    pts, w = pts[keep], w[keep]
    if pts.shape[0] < k:
        raise PrivacyParameterError(f"weighted_kmeans: need at least n_clusters={k} points with positive weight, "
                                    f"got {pts.shape[0]}")
    best: tuple[np.ndarray, float] | None = None
    for _ in range(require_int("n_init", n_init, low=1, error=parameter_error)):
        centers = kmeans_plusplus(pts, w, k, gen)
        for _ in range(max_iter):
            labels = _sq_dist(pts, centers).argmin(axis=1)
            mass = np.bincount(labels, weights=w, minlength=k)
            sums = np.stack([np.bincount(labels, weights=w * pts[:, j], minlength=k) for j in range(pts.shape[1])],
                            axis=1)
            new = np.where(mass[:, None] > 0, sums / np.where(mass > 0, mass, 1.0)[:, None], centers)
            shift = float(((new - centers) ** 2).sum())
            centers = new
            if shift <= tol:
                break
        inertia = float((w * _sq_dist(pts, centers).min(axis=1)).sum())
        if best is None or inertia < best[1]:
            best = (centers, inertia)
    assert best is not None
    return best


# -------------------------------------------------------------------------------------------- quadtree
@dataclass(frozen=True)
class QuadTreeLeaves:
    """Leaves of the noisy quadtree: boxes [lower, upper] (data units), depth, noisy counts (clipped >= 0)."""

    lower: np.ndarray  # (L, d)
    upper: np.ndarray  # (L, d)
    depth: np.ndarray  # (L,)
    noisy_counts: np.ndarray  # (L,)
    n_nodes: int  # nodes created in total (including internal ones)

    @property
    def centers(self) -> np.ndarray:
        midpoints: np.ndarray = (self.lower + self.upper) / 2.0
        return midpoints

    def __len__(self) -> int:
        return int(self.depth.shape[0])


def _codes(coords: np.ndarray, level: int) -> np.ndarray:
    """Integer code of cell coordinates (n, d) at a level (base 2^level digits)."""
    base = np.int64(1) << np.int64(level)
    code = np.zeros(coords.shape[0], dtype=np.int64)
    for j in range(coords.shape[1]):
        code = code * base + coords[:, j]
    return code


def noisy_quadtree(unit_points: np.ndarray, *, noise: QuadTreeNoise, threshold: float,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Build the noisy 2^d-ary tree on points of the unit box; returns (leaf coords, leaf depths, noisy counts, nodes).

    Leaf coords are integer cell coordinates at the leaf's depth (cell = coords / 2^depth .. (coords+1) / 2^depth).
    Levels below ``noise.first_noisy_level`` (the root under replace-one) split on their exact count.
    """
    n, d = unit_points.shape
    max_depth = noise.max_depth
    offsets = ((np.arange(2 ** d)[:, None] >> np.arange(d)[None, ::-1]) & 1).astype(np.int64)  # (2^d, d)
    node_coords = np.zeros((1, d), dtype=np.int64)
    pts = unit_points
    leaf_coords: list[np.ndarray] = []
    leaf_depths: list[np.ndarray] = []
    leaf_true: list[np.ndarray] = []
    n_nodes = 1
    for level in range(max_depth + 1):
        side = 1 << level
        pc = np.minimum((pts * side).astype(np.int64), side - 1)
        pcode = _codes(pc, level)
        ncode = _codes(node_coords, level)
        order = np.argsort(ncode)
        ncode_sorted = ncode[order]
        pos = np.searchsorted(ncode_sorted, pcode)  # every point lies in an active node
        counts_sorted = np.bincount(pos, minlength=ncode.shape[0])
        counts = np.empty_like(counts_sorted)
        counts[order] = counts_sorted
        if level == max_depth:
            split = np.zeros(ncode.shape[0], dtype=bool)
        elif level < noise.first_noisy_level or noise.tree_scale is None:
            split = counts > threshold
        else:
            noisy = counts + sample_discrete_laplace(rng, noise.tree_scale, counts.shape[0])
            split = noisy > threshold
        leaf_coords.append(node_coords[~split])
        leaf_depths.append(np.full(int((~split).sum()), level, dtype=np.int64))
        leaf_true.append(counts[~split])
        if not split.any():
            break
        parents = node_coords[split]
        node_coords = (parents[:, None, :] * 2 + offsets[None, :, :]).reshape(-1, d)
        n_nodes += node_coords.shape[0]
        # keep only the points inside split nodes
        split_sorted = split[order]
        pts = pts[split_sorted[pos]]
    coords = np.concatenate(leaf_coords, axis=0)
    depths = np.concatenate(leaf_depths)
    true_counts = np.concatenate(leaf_true)
    noise_z = sample_discrete_laplace(rng, noise.count_scale, true_counts.shape[0])
    noisy_counts = np.maximum(true_counts + noise_z, 0).astype(np.float64)
    return coords, depths, noisy_counts, n_nodes


# ------------------------------------------------------------------------------------------- estimator
class QuadTreeKMeans:
    """eps-DP k-means via a noisy quadtree histogram (QuadkDP / UniQuadkDP, see module docstring).

    Parameters (keyword-only): ``n_clusters`` k; ``epsilon`` total budget; ``bounds`` = (lower, upper), scalars
    or length-d sequences, PUBLIC (never derived from the data); ``gamma`` in (0, 1): share for the tree;
    ``variant`` "quad" (leaf centres) or "uniquad" (uniform samples in leaves); ``max_depth`` (default
    max(1, 12 // d): 6 levels for d = 2); ``threshold`` on noisy counts for splitting (default
    3 * sqrt(2) * tree noise scale, three noise standard deviations, so an empty node splits with probability
    about 0.5 exp(-3 sqrt 2) = 0.7 %); ``samples_per_leaf`` m for "uniquad"; ``out_of_bounds`` "error" or "clip";
    ``neighbouring`` "replace" (default: fixed-size windows) or "add_remove" (module docstring);
    ``n_init`` k-means restarts (post-processing); ``rng``.

    ``epsilon_tree``, ``epsilon_counts`` and ``epsilon`` (their sum) are the EXACT eps one fit spends under
    ``neighbouring`` (rounded up to a double; each <= its target gamma eps, (1 - gamma) eps), computed from the
    noise scales actually sampled (``noise``).  They need the dimension d: from ``bounds`` (length-d), or, with
    scalar bounds and no ``max_depth``, d = 1 until ``fit`` sees X (then recomputed).
    After ``fit``: ``cluster_centers_`` (k, d), ``leaves_`` (QuadTreeLeaves), ``fallback_`` (None or what was
    done).
    """

    def __init__(
        self,
        *,
        n_clusters: int,
        epsilon: float,
        bounds: tuple[Any, Any],
        gamma: float = 0.5,
        variant: Variant = "quad",
        max_depth: int | None = None,
        threshold: float | None = None,
        samples_per_leaf: int = 10,
        out_of_bounds: Literal["error", "clip"] = "error",
        neighbouring: Neighbouring = "replace",
        n_init: int = 3,
        max_iter: int = 100,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        self.n_clusters = require_int("n_clusters", n_clusters, low=1, error=parameter_error)
        self.target_epsilon = check_epsilon(epsilon)
        self.neighbouring: Neighbouring = require_choice("neighbouring", neighbouring, NEIGHBOURING,
                                                         error=parameter_error)
        self.gamma = require_float("gamma", gamma, low=0.0, high=1.0, low_open=True, high_open=True,
                                   error=parameter_error)
        self.variant: Variant = require_choice("variant", variant, VARIANTS, error=parameter_error)
        try:
            lo = np.atleast_1d(np.asarray(bounds[0], dtype=np.float64))
            hi = np.atleast_1d(np.asarray(bounds[1], dtype=np.float64))
        except (TypeError, ValueError, IndexError) as e:
            raise PrivacyParameterError(f"bounds: expected (lower, upper) numbers or sequences, got {bounds!r}") from e
        if lo.shape != hi.shape or lo.ndim != 1 or not np.all(np.isfinite(lo)) or not np.all(np.isfinite(hi)) \
                or not np.all(hi > lo):
            raise PrivacyParameterError(f"bounds: need finite lower < upper of equal length, got {bounds!r}")
        self.lower, self.upper = lo, hi
        self.max_depth = None if max_depth is None else require_int("max_depth", max_depth, low=1, high=62,
                                                                    error=parameter_error)
        self.threshold = None if threshold is None else require_float("threshold", threshold, error=parameter_error)
        self.samples_per_leaf = require_int("samples_per_leaf", samples_per_leaf, low=1, error=parameter_error)
        self.out_of_bounds = require_choice("out_of_bounds", out_of_bounds, ("error", "clip"), error=parameter_error)
        self.n_init = require_int("n_init", n_init, low=1, error=parameter_error)
        self.max_iter = require_int("max_iter", max_iter, low=1, error=parameter_error)
        self.rng = crypto_rng(rng)
        self.target_epsilon_tree = self.gamma * self.target_epsilon
        self.target_epsilon_counts = self.target_epsilon - self.target_epsilon_tree
        self._set_noise(self.lower.shape[0])
        self.cluster_centers_: np.ndarray | None = None
        self.leaves_: QuadTreeLeaves | None = None
        self.fallback_: str | None = None
        self.threshold_: float | None = None
        self.max_depth_: int | None = None

    def __repr__(self) -> str:
        return (f"QuadTreeKMeans(n_clusters={self.n_clusters}, epsilon={self.epsilon!r}, gamma={self.gamma}, "
                f"variant={self.variant!r}, neighbouring={self.neighbouring!r})")

    @property
    def exact_epsilon(self) -> float:
        """eps of one window (one fit) under ``neighbouring``, from the sampled noise scales: the exact rational
        tree + leaf-count eps rounded up (the same value as ``epsilon``)."""
        return fraction_upper(self.epsilon_tree_exact + self.epsilon_counts_exact)

    @property
    def domain(self) -> BoxDomain:
        """The public box (``bounds``; with scalar bounds, one dimension until ``fit`` sees X)."""
        return BoxDomain(tuple(float(v) for v in self.lower), tuple(float(v) for v in self.upper))

    def _depth(self, d: int) -> int:
        return self.max_depth if self.max_depth is not None else max(1, 12 // d)

    def _set_noise(self, d: int) -> None:
        """Noise scales for dimension d and the exact eps they spend under ``neighbouring``."""
        self.noise = quadtree_noise(epsilon_tree=self.target_epsilon_tree, epsilon_counts=self.target_epsilon_counts,
                                    max_depth=self._depth(d), neighbouring=self.neighbouring)
        tree, counts = window_epsilon(self.noise, self.neighbouring)
        self.epsilon_tree_exact, self.epsilon_counts_exact = tree, counts
        self.epsilon_tree = fraction_upper(tree)
        self.epsilon_counts = fraction_upper(counts)
        self.epsilon = fraction_upper(tree + counts)

    def _unit(self, X: Any) -> np.ndarray:
        x = np.asarray(X, dtype=np.float64)
        if x.ndim == 1 and self.lower.shape[0] == 1:
            x = x[:, None]
        if x.ndim == 2 and self.lower.shape[0] == 1 and x.shape[1] > 1:  # scalar bounds: the same for every column
            self.lower = np.repeat(self.lower, x.shape[1])
            self.upper = np.repeat(self.upper, x.shape[1])
        if x.ndim != 2 or x.shape[1] != self.lower.shape[0]:
            raise PrivacyParameterError(f"X: expected shape (n, {self.lower.shape[0]}) matching bounds, got {x.shape}")
        if x.shape[0] == 0:
            raise PrivacyParameterError("X: no points")
        if np.isnan(x).any():
            raise PrivacyParameterError("X: contains NaN")
        outside = (x < self.lower) | (x > self.upper)
        if outside.any() and self.out_of_bounds == "error":
            r, c = np.argwhere(outside)[0]
            raise PrivacyParameterError(
                f"X: column {c} must be within the public bounds [{self.lower[c]}, {self.upper[c]}], got {x[r, c]!r} "
                f"({int(outside.any(axis=1).sum())} point(s) outside; pass out_of_bounds='clip')")
        return np.clip((x - self.lower) / (self.upper - self.lower), 0.0, 1.0)

    def fit(self, X: Any, *, accountant: Any = None) -> QuadTreeKMeans:
        """Build the noisy tree (spends ``epsilon``) and cluster its synthetic weighted points.

        ``accountant``: optional object with ``spend(epsilon, label)`` (e.g. ``BudgetAccountant``), charged the
        exact ``epsilon`` before any noise is drawn; if it raises (budget exhausted) nothing is computed.
        Under ``"replace"`` the window size n = len(X) is treated as public (it is the fixed window length).
        """
        u = self._unit(X)
        d = u.shape[1]
        if d > 16:
            raise PrivacyParameterError(f"X: at most 16 dimensions (2^d children per split), got d={d}")
        max_depth = self._depth(d)
        if d * max_depth > 62:
            raise PrivacyParameterError(f"max_depth: d * max_depth must be <= 62, got {d} * {max_depth}")
        if max_depth != self.noise.max_depth:
            self._set_noise(d)
        if accountant is not None:
            accountant.spend(self.epsilon, f"dp-kmeans {self.variant} (tree {self.epsilon_tree:g} + "
                                           f"leaf counts {self.epsilon_counts:g}, {self.neighbouring})")
        tree_scale = self.noise.tree_scale
        threshold = (self.threshold if self.threshold is not None
                     else 3.0 * math.sqrt(2.0) * (float(tree_scale) if tree_scale is not None
                                                  else max_depth / self.target_epsilon_tree))
        self.max_depth_, self.threshold_ = max_depth, float(threshold)
        coords, depths, counts, n_nodes = noisy_quadtree(u, noise=self.noise, threshold=float(threshold),
                                                         rng=self.rng)
        cell = 1.0 / (np.int64(1) << depths).astype(np.float64)
        lo_unit = coords * cell[:, None]
        hi_unit = lo_unit + cell[:, None]
        width = self.upper - self.lower
        self.leaves_ = QuadTreeLeaves(self.lower + lo_unit * width, self.lower + hi_unit * width, depths, counts,
                                      n_nodes)
        k = self.n_clusters
        pos = counts > 0
        n_pos = int(pos.sum())
        self.fallback_ = None
        if self.variant == "quad" and n_pos >= k:
            points = (lo_unit[pos] + hi_unit[pos]) / 2.0
            weights = counts[pos]
        else:
            m = self.samples_per_leaf if self.variant == "uniquad" else 1
            if n_pos == 0:
                self.fallback_ = "no leaf has a positive noisy count: k-means++ on uniform points of the whole box"
                points = self.rng.random((max(k, 1) * self.samples_per_leaf, d))
                weights = np.ones(points.shape[0])
            else:
                if n_pos * m < k:
                    m = math.ceil(k / n_pos)
                    self.fallback_ = (f"{n_pos} leaves with positive weight < k={k}: {m} uniform points per leaf "
                                      f"(UniQuad representation)")
                lo_p, hi_p = lo_unit[pos], hi_unit[pos]
                r = self.rng.random((n_pos, m, d))
                points = (lo_p[:, None, :] + r * (hi_p - lo_p)[:, None, :]).reshape(-1, d)
                weights = np.repeat(counts[pos] / m, m)
        centers_unit, _ = weighted_kmeans(points, weights, k, rng=self.rng, max_iter=self.max_iter,
                                          n_init=self.n_init)
        self.cluster_centers_ = self.lower + np.clip(centers_unit, 0.0, 1.0) * width
        return self

    def predict(self, X: Any) -> np.ndarray:
        """Index of the nearest centre for each point."""
        if self.cluster_centers_ is None:
            raise PrivacyParameterError("QuadTreeKMeans: call fit(X) before predict")
        x = np.asarray(X, dtype=np.float64)
        nearest: np.ndarray = _sq_dist(x.reshape(x.shape[0], -1), self.cluster_centers_).argmin(axis=1)
        return nearest
