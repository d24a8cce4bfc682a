"""Choose eps by accuracy: the smallest eps on a grid whose measured error meets a target (KR 10-2456177).

For each eps of the grid (ascending) the data are perturbed ``runs`` times with a seeded generator and the
metric is averaged; the result is the whole eps-vs-error curve (mean and standard error over runs) and the
smallest grid eps whose mean meets the target (``None`` if none does).

Metrics
* numeric (``select_epsilon_numeric``, bounded Laplace): ``"mae"`` mean |M(x) - x|, ``"mse"`` mean (M(x) - x)^2
  of the released values, or ``"mean"`` |mean_hat - mean| of the recovered mean (aggregate estimator);
* categorical (``select_epsilon_categorical``): misclassification rate P(report != true), for the discretized
  bounded Laplace (``"blap"``) or k-RR (``"krr"``);
* downstream classifier (``select_epsilon_classifier``): score of a classifier trained on perturbed training
  features, evaluated on clean test data, relative to the same classifier trained on clean data (e.g. >= 0.75).
  The eps of a record is split equally over its d perturbed columns (sequential composition).
  scikit-learn is imported lazily (only when no ``classifier`` factory is passed).

Note the selected eps is chosen from the data: the choice itself is not private.  Run it on public or
historical data of the same kind, not on the data to be released.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from stream_anon.core.validation import require_choice, require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, crypto_rng, parameter_error
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.randomized_response import KRandomizedResponse

__all__ = [
    "DEFAULT_EPSILON_GRID",
    "EpsilonCurve",
    "select_epsilon",
    "select_epsilon_categorical",
    "select_epsilon_classifier",
    "select_epsilon_numeric",
]

DEFAULT_EPSILON_GRID: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5, 10.0)


@dataclass(frozen=True)
class EpsilonCurve:
    """eps-vs-metric curve and the smallest grid eps meeting the target."""

    metric: str
    target: float
    higher_is_better: bool
    epsilons: np.ndarray
    values: np.ndarray  # mean of the metric over runs, per eps
    std_errors: np.ndarray  # standard error of that mean over runs
    runs: int
    selected_epsilon: float | None

    def meets(self, value: float) -> bool:
        return value >= self.target if self.higher_is_better else value <= self.target

    def rows(self) -> list[dict[str, float | bool]]:
        return [{"epsilon": float(e), "value": float(v), "se": float(s), "meets": self.meets(float(v))}
                for e, v, s in zip(self.epsilons, self.values, self.std_errors, strict=True)]

    def format_table(self, unit: str = "") -> str:
        head = f"{'eps':>7} {self.metric + unit:>22} {'SE':>10}  meets {'>=' if self.higher_is_better else '<='} " \
               f"{self.target:g}"
        lines = [head]
        for r in self.rows():
            mark = "yes" if r["meets"] else "no"
            sel = "  <- selected" if self.selected_epsilon is not None and r["epsilon"] == self.selected_epsilon else ""
            lines.append(f"{r['epsilon']:>7g} {r['value']:>22.5g} {r['se']:>10.3g}  {mark}{sel}")
        return "\n".join(lines)


def _grid(grid: Sequence[float]) -> np.ndarray:
    vals = [check_epsilon(e, "grid") for e in grid]
    if not vals:
        raise PrivacyParameterError("grid: need at least one epsilon")
    return np.array(sorted(set(vals)))


def _check_target(target: Any) -> float:
    return require_float("target", target, low=0.0, error=parameter_error)


def _curve(metric: str, target: float, higher: bool, eps: np.ndarray, per_run: np.ndarray) -> EpsilonCurve:
    runs = per_run.shape[1]
    means = per_run.mean(axis=1)
    ses = per_run.std(axis=1, ddof=1) / math.sqrt(runs) if runs > 1 else np.zeros_like(means)
    selected = None
    for e, v in zip(eps, means, strict=True):
        if (v >= target) if higher else (v <= target):
            selected = float(e)
            break
    return EpsilonCurve(metric, target, higher, eps, means, ses, runs, selected)


def select_epsilon_numeric(
    values: Any, *, lower: float, upper: float, target: float,
    metric: Literal["mae", "mse", "mean"] = "mae", grid: Sequence[float] = DEFAULT_EPSILON_GRID, runs: int = 5,
    integer: bool = False, rng: np.random.Generator | int | None = None,
) -> EpsilonCurve:
    """Smallest eps for which the bounded Laplace on [lower, upper] meets ``target`` (data units).

    ``integer``: an integer attribute (the mechanism's integer grid, as the side path uses it)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size < 2:
        raise PrivacyParameterError(f"values: need at least 2 values, got {x.size}")
    require_choice("metric", metric, ("mae", "mse", "mean"), error=parameter_error)
    tgt = _check_target(target)
    eps = _grid(grid)
    n_runs = require_int("runs", runs, low=1, error=parameter_error)
    gen = crypto_rng(rng)
    true_mean = float(x.mean())
    out = np.empty((eps.size, n_runs))
    for i, e in enumerate(eps):
        mech = BoundedLaplace(epsilon=float(e), lower=lower, upper=upper, integer=integer, rng=gen)
        for r in range(n_runs):
            y = mech.randomise_many(x)
            if metric == "mae":
                out[i, r] = float(np.abs(y - x).mean())
            elif metric == "mse":
                out[i, r] = float(((y - x) ** 2).mean())
            else:
                out[i, r] = abs(mech.estimate_mean(y)[0] - true_mean)
    return _curve(metric, tgt, False, eps, out)


def select_epsilon_categorical(
    values: Any, *, categories: Sequence[Any], target: float, mechanism: Literal["blap", "krr"] = "blap",
    grid: Sequence[float] = DEFAULT_EPSILON_GRID, runs: int = 5, rng: np.random.Generator | int | None = None,
) -> EpsilonCurve:
    """Smallest eps whose misclassification rate P(report != true) is at most ``target``."""
    vals = np.asarray(values, dtype=object).ravel()
    if vals.size < 1:
        raise PrivacyParameterError("values: empty")
    require_choice("mechanism", mechanism, ("blap", "krr"), error=parameter_error)
    tgt = _check_target(target)
    if tgt > 1:
        raise PrivacyParameterError(f"target: a misclassification rate must be in [0, 1], got {target!r}")
    eps = _grid(grid)
    n_runs = require_int("runs", runs, low=1, error=parameter_error)
    gen = crypto_rng(rng)
    out = np.empty((eps.size, n_runs))
    for i, e in enumerate(eps):
        mech: Any
        if mechanism == "blap":
            mech = DiscretizedBoundedLaplace(epsilon=float(e), categories=categories, rng=gen)
        else:
            mech = KRandomizedResponse(epsilon=float(e), categories=list(categories), rng=gen)
        for r in range(n_runs):
            rep = np.asarray(mech.randomise_many(vals), dtype=object)
            out[i, r] = float(np.mean(rep != vals))
    return _curve(f"misclassification ({mechanism})", tgt, False, eps, out)


def _default_classifier(balanced: bool = False) -> Any:
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise PrivacyParameterError(
            "classifier: scikit-learn is not installed; install it or pass classifier=<factory returning an "
            "object with fit(X, y) and predict(X)>") from e
    return make_pipeline(StandardScaler(),
                         LogisticRegression(max_iter=1000, class_weight="balanced" if balanced else None))


def _score(y_true: np.ndarray, y_pred: np.ndarray, score: str) -> float:
    if score == "accuracy":
        return float(np.mean(y_true == y_pred))
    classes = np.unique(y_true)
    return float(np.mean([np.mean(y_pred[y_true == c] == c) for c in classes]))


def select_epsilon_classifier(
    X: Any, y: Any, *, lower: Sequence[float], upper: Sequence[float], target: float = 0.75,
    score: Literal["accuracy", "balanced_accuracy"] = "accuracy", classifier: Callable[[], Any] | None = None,
    test_fraction: float = 0.3, grid: Sequence[float] = DEFAULT_EPSILON_GRID, runs: int = 3,
    integer: bool | Sequence[bool] = False, rng: np.random.Generator | int | None = None,
) -> EpsilonCurve:
    """Smallest eps (per record, split equally over the d columns) whose relative score reaches ``target``.

    ``integer``: per column (or one for all), whether it is an integer attribute (integer grid).

    relative score = score(model trained on perturbed train features; clean test) / score(model trained on clean
    train features; clean test).  ``score="balanced_accuracy"`` avoids the majority-class trap (on ADULT,
    always predicting "<=50K" already has accuracy 0.76); the default classifier (standardized logistic
    regression, scikit-learn) then uses balanced class weights.
    """
    x = np.asarray(X, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    labels = np.asarray(y)
    if x.ndim != 2 or labels.shape[0] != x.shape[0] or x.shape[0] < 10:
        raise PrivacyParameterError(f"X, y: need X (n, d) and y (n,) with n >= 10, got {x.shape} and {labels.shape}")
    lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (x.shape[1],))
    hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (x.shape[1],))
    ints = np.broadcast_to(np.asarray(integer, dtype=bool), (x.shape[1],))
    require_choice("score", score, ("accuracy", "balanced_accuracy"), error=parameter_error)
    require_float("test_fraction", test_fraction, low=0.0, high=1.0, low_open=True, high_open=True,
                  error=parameter_error)
    tgt = _check_target(target)
    eps = _grid(grid)
    n_runs = require_int("runs", runs, low=1, error=parameter_error)
    gen = crypto_rng(rng)
    balanced = score == "balanced_accuracy"
    factory = classifier or (lambda: _default_classifier(balanced))
    perm = gen.permutation(x.shape[0])
    n_test = max(1, int(round(test_fraction * x.shape[0])))
    test, train = perm[:n_test], perm[n_test:]
    base_model = factory().fit(x[train], labels[train])
    base = _score(labels[test], np.asarray(base_model.predict(x[test])), score)
    if base <= 0:
        raise PrivacyParameterError(f"classifier: the clean model scores {base}; a relative score is undefined")
    d = x.shape[1]
    out = np.empty((eps.size, n_runs))
    for i, e in enumerate(eps):
        mechs = [BoundedLaplace(epsilon=float(e) / d, lower=float(lo[j]), upper=float(hi[j]), integer=bool(ints[j]),
                                rng=gen) for j in range(d)]
        for r in range(n_runs):
            noisy = np.column_stack([mechs[j].randomise_many(x[train, j]) for j in range(d)])
            model = factory().fit(noisy, labels[train])
            out[i, r] = _score(labels[test], np.asarray(model.predict(x[test])), score) / base
    return _curve(f"relative {score}", tgt, True, eps, out)


def select_epsilon(
    values: Any, *, target: float,
    metric: Literal["mae", "mse", "mean", "misclassification", "classifier"] = "mae",
    lower: Any = None, upper: Any = None, categories: Sequence[Any] | None = None, y: Any = None, **kwargs: Any,
) -> EpsilonCurve:
    """Dispatch on ``metric``: numeric ("mae"/"mse"/"mean", needs lower/upper), categorical
    ("misclassification", needs categories) or downstream "classifier" (values = X, needs y, lower, upper)."""
    if metric in ("mae", "mse", "mean"):
        if lower is None or upper is None:
            raise PrivacyParameterError(f"lower/upper: public bounds are required for metric {metric!r}")
        return select_epsilon_numeric(values, lower=lower, upper=upper, target=target, metric=metric, **kwargs)
    if metric == "misclassification":
        if categories is None:
            raise PrivacyParameterError("categories: required for metric 'misclassification'")
        return select_epsilon_categorical(values, categories=categories, target=target, **kwargs)
    if metric == "classifier":
        if y is None or lower is None or upper is None:
            raise PrivacyParameterError("y, lower, upper: required for metric 'classifier'")
        return select_epsilon_classifier(values, y, lower=lower, upper=upper, target=target, **kwargs)
    raise PrivacyParameterError(
        f"metric: must be 'mae', 'mse', 'mean', 'misclassification' or 'classifier', got {metric!r}")
