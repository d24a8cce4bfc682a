"""Epsilon selection by accuracy: smallest grid eps meeting a target, the curve, seeding."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.epsilon_selection import (
    select_epsilon,
    select_epsilon_categorical,
    select_epsilon_classifier,
    select_epsilon_numeric,
)

GRID = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0)


def _ages(n: int = 5000, seed: int = 0) -> np.ndarray:
    return np.clip(np.random.default_rng(seed).normal(38, 13, n).round(), 17, 90)


def test_numeric_selects_smallest_grid_eps_meeting_target() -> None:
    x = _ages()
    curve = select_epsilon_numeric(x, lower=17, upper=90, target=8.0, metric="mae", grid=GRID, runs=3, rng=0)
    assert list(curve.epsilons) == list(GRID)
    meets = curve.values <= 8.0
    assert meets.any() and not meets.all()
    first = int(np.argmax(meets))
    assert curve.selected_epsilon == GRID[first]
    assert not meets[:first].any()
    # monotone-ish: error falls with eps
    assert stats.spearmanr(curve.epsilons, curve.values).statistic < -0.95
    assert curve.rows()[first]["meets"] is True


def test_mse_curve_equals_closed_form_within_4se() -> None:
    x = _ages(4000, seed=1)
    curve = select_epsilon_numeric(x, lower=17, upper=90, target=1.0, metric="mse", grid=(0.5, 2.0), runs=8, rng=1)
    for e, v, se in zip(curve.epsilons, curve.values, curve.std_errors, strict=True):
        m = BoundedLaplace(epsilon=float(e), lower=17, upper=90)
        expected = float(np.mean(np.asarray(m.variance(x)) + np.asarray(m.bias(x)) ** 2))
        assert abs(v - expected) <= 4 * se + 1e-9


def test_unreachable_target_returns_none_and_seeding_is_deterministic() -> None:
    x = _ages(2000, seed=2)
    a = select_epsilon_numeric(x, lower=17, upper=90, target=0.0, grid=GRID, runs=2, rng=5)
    b = select_epsilon_numeric(x, lower=17, upper=90, target=0.0, grid=GRID, runs=2, rng=5)
    assert a.selected_epsilon is None
    assert np.array_equal(a.values, b.values)


def test_mean_metric_error_shrinks() -> None:
    x = _ages(20_000, seed=3)
    curve = select_epsilon_numeric(x, lower=17, upper=90, target=0.5, metric="mean", grid=(0.1, 1.0, 10.0),
                                   runs=4, rng=3)
    assert curve.values[0] > curve.values[-1]
    assert curve.selected_epsilon in (1.0, 10.0)


def test_categorical_misclassification_curve() -> None:
    rng = np.random.default_rng(4)
    cats = ["a", "b", "c", "d", "e"]
    vals = rng.choice(cats, 5000)
    curve = select_epsilon_categorical(vals, categories=cats, target=0.3, grid=GRID, runs=2, rng=4)
    assert curve.values[0] > 0.6  # eps = 0.1: P(true) < 0.3
    # exact expectation: 1 - sum_i share_i P(true | i) from the (exactly calibrated) transition matrix
    share = np.array([(vals == c).mean() for c in cats])
    for e, v, se in zip(curve.epsilons, curve.values, curve.std_errors, strict=True):
        p_true = DiscretizedBoundedLaplace(epsilon=float(e), categories=cats).p_true
        expected = 1 - float(share @ p_true)
        assert abs(v - expected) <= 4 * max(se, np.sqrt(expected * (1 - expected) / (2 * 5000)))
    # stochastic rounding keeps an error ~ E|noise| / grid step even at eps = 30 (k-RR would be ~1e-12)
    assert 0.05 < curve.values[-1] < 0.2
    # monotone within sampling noise (flat near 1 - 1/m = 0.8 for tiny eps)
    tol = 4 * np.sqrt(curve.std_errors[1:] ** 2 + curve.std_errors[:-1] ** 2 + 2 * 0.8 * 0.2 / 10_000)
    assert np.all(np.diff(curve.values) <= tol)
    meets = curve.values <= 0.3
    assert curve.selected_epsilon == GRID[int(np.argmax(meets))]


def test_classifier_relative_accuracy_reaches_target() -> None:
    rng = np.random.default_rng(6)
    n = 3000
    X = rng.uniform(0, 1, (n, 2))
    y = (X[:, 0] + X[:, 1] > 1.0).astype(int)
    curve = select_epsilon_classifier(X, y, lower=[0, 0], upper=[1, 1], target=0.9, grid=(0.1, 1.0, 10.0, 100.0),
                                      runs=2, rng=6)
    assert curve.higher_is_better
    assert curve.values[-1] > 0.9
    assert curve.values[-1] >= curve.values[0]
    assert curve.selected_epsilon is not None and curve.selected_epsilon <= 100.0
    bal = select_epsilon(X, y=y, metric="classifier", lower=[0, 0], upper=[1, 1], target=0.75,
                         score="balanced_accuracy", grid=(100.0,), runs=1, rng=6)
    assert bal.selected_epsilon == 100.0


def test_dispatch_and_errors() -> None:
    x = _ages(500)
    assert select_epsilon(x, target=50, lower=17, upper=90, grid=(1.0,), runs=1, rng=0).selected_epsilon == 1.0
    with pytest.raises(PrivacyParameterError, match="lower/upper"):
        select_epsilon(x, target=1.0)
    with pytest.raises(PrivacyParameterError, match="categories"):
        select_epsilon(x, target=0.1, metric="misclassification")
    with pytest.raises(PrivacyParameterError, match="metric"):
        select_epsilon_numeric(x, lower=17, upper=90, target=1, metric="median")  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match="grid"):
        select_epsilon_numeric(x, lower=17, upper=90, target=1, grid=(0.0,))
