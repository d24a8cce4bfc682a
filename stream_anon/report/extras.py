"""Compute the report's optional inputs directly on ADULT: the engine grid, eps-vs-error curves, side estimates.

``stream-anon report RUN_DIR --compute-extras`` calls :func:`compute_extras`, which writes (only the files
that are missing unless ``overwrite``):

* ``grid.json``: the engine (``stream_anon.core.engine``) run over the first ``grid_records`` ADULT records
  for every (k, delta) of the grid; losses of the released table from ``stream_anon.core.loss``:
  ``gt_loss`` (Goldberger-Tassa), ``lm_loss`` (LM normalized by the number of QIs), ``ubdsa_loss`` (CAIL).
* ``ldp_curves.json``: error of each LDP mechanism vs eps on the whole file, mean and standard deviation
  over ``repetitions`` seeded runs.  Frequency oracles: total variation distance between the true
  distribution and the estimate projected onto the probability simplex (Euclidean projection,
  ``analysis.project_onto_simplex``), TV = 1/2 sum_v |p_hat(v) - f(v)|, in [0, 1].  (The unbiased estimate
  itself is not a distribution: its "TV" reached 13 for the discretized bounded Laplace at eps = 0.25.)
  Bounded Laplace: absolute error of the estimated mean (boundary-corrected estimator), in the attribute's unit.
* ``side_estimates.json``: estimated vs true distribution of one attribute per mechanism at ``side_epsilon``
  (labelled ``offline:<mechanism>``: computed here, not read from the service's side topics).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.core.schema import Schema, adult_schema
from stream_anon.report.analysis import project_onto_simplex, total_variation
from stream_anon.report.rundir import (
    GRID_FILE,
    LDP_CURVES_FILE,
    SIDE_ESTIMATES_FILE,
    SIMPLEX_PROJECTION,
    TV_METRIC,
)

log = logging.getLogger(__name__)

DEFAULT_KS = (5, 10, 25, 50)
DEFAULT_DELTAS = (250, 500, 1000, 2000)
DEFAULT_EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)


@dataclass(frozen=True)
class GridPoint:
    k: int
    delta: int
    beta: int
    mu: int
    loss_metric: str
    algorithm: str


def compute_grid(records: Sequence[dict[str, Any]], schema: Schema, *, ks: Sequence[int] = DEFAULT_KS,
                 deltas: Sequence[int] = DEFAULT_DELTAS, loss_metrics: Sequence[str] = ("gt",), beta: int = 50,
                 mu: int = 100, algorithm: str = "castle", seed: int = 0) -> list[dict[str, Any]]:
    """Run the engine on ``records`` (validated) for every (k, delta, loss_metric) with delta >= k."""
    from stream_anon.core.engine import Engine, EngineConfig
    from stream_anon.core.loss import summarize_releases

    out = []
    for loss_metric in loss_metrics:
        for k in ks:
            for delta in deltas:
                if delta < k:
                    continue
                t0 = time.perf_counter()
                engine = Engine(schema, EngineConfig(k=k, delta=delta, beta=beta, mu=mu, algorithm=algorithm,
                                                     loss=loss_metric, seed=seed))
                releases = []
                for r in records:
                    releases.extend(engine.push(r))
                releases.extend(engine.flush())
                s = summarize_releases(releases, schema, k)
                seconds = time.perf_counter() - t0
                total = s.records_released + s.records_suppressed
                out.append({"k": k, "delta": delta, "beta": beta, "mu": mu, "loss_metric": loss_metric,
                            "algorithm": algorithm, "records": len(records), "gt_loss": float(s.gt_loss),
                            "lm_loss": float(s.lm_loss_normalized), "ubdsa_loss": float(s.ubdsa_loss),
                            "suppressed_fraction": s.records_suppressed / total if total else 0.0,
                            "classes": s.classes, "seconds": round(seconds, 3)})
                log.info("grid k=%d delta=%d loss=%s: GT %.4f in %.2f s (%.0f records/s)", k, delta, loss_metric,
                         s.gt_loss, seconds, len(records) / seconds if seconds > 0 else float("inf"))
    return out


def _true_counts(values: np.ndarray, categories: Sequence[Any]) -> np.ndarray:
    index = {c: i for i, c in enumerate(categories)}
    codes = np.fromiter((index[v] for v in values), dtype=np.int64, count=len(values))
    return np.bincount(codes, minlength=len(categories)).astype(float)


def _frequency_mechanisms(schema: Schema) -> list[tuple[str, str, Callable[[float, list[Any], np.random.Generator], Any]]]:
    """(mechanism label, attribute, factory(epsilon, categories, rng) -> mechanism with randomise/estimate)."""
    from stream_anon.privacy import KRandomizedResponse, LExtendedSubstitution, RandomSubstitution

    mechs: list[tuple[str, str, Callable[[float, list[Any], np.random.Generator], Any]]] = [
        ("k-RR", "education", lambda e, c, rng: KRandomizedResponse(epsilon=e, categories=c, rng=rng)),
        ("random substitution", "occupation", lambda e, c, rng: RandomSubstitution(categories=c, epsilon=e, rng=rng)),
        ("l-extended substitution (l=2)", "occupation",
         lambda e, c, rng: LExtendedSubstitution.for_epsilon(categories=c, epsilon=e, l=2, rng=rng)),
    ]
    try:
        from stream_anon.privacy.bounded_laplace import DiscretizedBoundedLaplace

        mechs.append(("discretized bounded Laplace", "education-num",
                      lambda e, c, rng: DiscretizedBoundedLaplace(epsilon=e, categories=c, rng=rng)))
    except ImportError:  # pragma: no cover - numeric mechanisms not built
        log.warning("DiscretizedBoundedLaplace not available: its curve is left out")
    return mechs


def _categories(df: pd.DataFrame, schema: Schema, attribute: str) -> list[Any]:
    a = schema[attribute]
    if a.kind.value == "numeric":
        assert a.lo is not None and a.hi is not None
        return list(range(int(a.lo), int(a.hi) + 1))
    return list(a.domain_values)


def compute_ldp_curves(df: pd.DataFrame, schema: Schema, *, epsilons: Sequence[float] = DEFAULT_EPSILONS,
                       repetitions: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """eps vs error of every LDP mechanism on the columns of ``df`` (mean and std over ``repetitions``)."""
    rng = np.random.default_rng(seed)
    curves = []
    for label, attribute, factory in _frequency_mechanisms(schema):
        cats = _categories(df, schema, attribute)
        values = df[attribute].to_numpy()
        true = _true_counts(values, cats)
        true_freq = true / true.sum()
        points = []
        for eps in epsilons:
            errs = []
            for _ in range(repetitions):
                mech = factory(float(eps), cats, rng)
                est = mech.estimate_counts(mech.randomise_many(values))
                errs.append(total_variation(project_onto_simplex(est.frequencies), true_freq))
            points.append({"epsilon": float(eps), "error": float(np.mean(errs)),
                           "error_std": float(np.std(errs, ddof=1)) if repetitions > 1 else 0.0})
        curves.append({"mechanism": label, "attribute": attribute, "error_metric": TV_METRIC,
                       "projection": SIMPLEX_PROJECTION, "n": len(values), "repetitions": repetitions,
                       "points": points})
    try:
        from stream_anon.privacy.bounded_laplace import BoundedLaplace
    except ImportError:  # pragma: no cover
        return curves
    for attribute in ("age", "hours-per-week"):
        a = schema[attribute]
        assert a.lo is not None and a.hi is not None
        x = df[attribute].to_numpy(dtype=float)
        points = []
        for eps in epsilons:
            errs = []
            for _ in range(repetitions):
                bl = BoundedLaplace(epsilon=float(eps), lower=a.lo, upper=a.hi, rng=rng)
                mean, _se = bl.estimate_mean(bl.randomise_many(x))
                errs.append(abs(mean - float(x.mean())))
            points.append({"epsilon": float(eps), "error": float(np.mean(errs)),
                           "error_std": float(np.std(errs, ddof=1)) if repetitions > 1 else 0.0})
        curves.append({"mechanism": "bounded Laplace (mean)", "attribute": attribute,
                       "error_metric": "absolute error of the mean", "n": len(x), "repetitions": repetitions,
                       "points": points})
    return curves


def compute_side_estimates(df: pd.DataFrame, schema: Schema, *, epsilon: float = 1.0, seed: int = 0
                           ) -> list[dict[str, Any]]:
    """Estimated vs true frequencies of one attribute per frequency mechanism, and bounded-Laplace means."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    for label, attribute, factory in _frequency_mechanisms(schema):
        cats = _categories(df, schema, attribute)
        values = df[attribute].to_numpy()
        true = _true_counts(values, cats)
        mech = factory(float(epsilon), cats, rng)
        est = mech.estimate_counts(mech.randomise_many(values))
        n = len(values)
        out.append({"topic": f"offline:{label}", "attribute": attribute, "kind": "frequency", "epsilon": epsilon,
                    "categories": [str(c) for c in cats], "estimated": (est.counts / n).tolist(),
                    "true": (true / n).tolist(), "std_errors": (est.std_errors / n).tolist()})
    try:
        from stream_anon.privacy.bounded_laplace import BoundedLaplace
    except ImportError:  # pragma: no cover
        return out
    for attribute in ("age", "hours-per-week"):
        a = schema[attribute]
        assert a.lo is not None and a.hi is not None
        x = df[attribute].to_numpy(dtype=float)
        bl = BoundedLaplace(epsilon=float(epsilon), lower=a.lo, upper=a.hi, rng=rng)
        mean, se = bl.estimate_mean(bl.randomise_many(x))
        out.append({"topic": "offline:bounded Laplace", "attribute": attribute, "kind": "mean", "epsilon": epsilon,
                    "estimated": mean, "true": float(x.mean()), "std_error": se})
    return out


def compute_extras(run_dir: str | Path, *, adult_path: str | Path | None = None, grid_records: int = 5000,
                   ks: Sequence[int] = DEFAULT_KS, deltas: Sequence[int] = DEFAULT_DELTAS,
                   epsilons: Sequence[float] = DEFAULT_EPSILONS, repetitions: int = 5, side_epsilon: float = 1.0,
                   seed: int = 0, overwrite: bool = False) -> list[Path]:
    """Write ``grid.json``, ``ldp_curves.json`` and ``side_estimates.json`` into ``run_dir``; return what was written."""
    from stream_anon.core.datasets import iter_records, read_adult

    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    schema = adult_schema()
    df = read_adult(adult_path)
    written = []

    def dump(name: str, data: Any) -> None:
        (d / name).write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        written.append(d / name)

    if overwrite or not (d / GRID_FILE).exists():
        records = [schema.validate(r) for r in iter_records(df.head(grid_records))]
        dump(GRID_FILE, compute_grid(records, schema, ks=ks, deltas=deltas, seed=seed))
    if overwrite or not (d / LDP_CURVES_FILE).exists():
        dump(LDP_CURVES_FILE, compute_ldp_curves(df, schema, epsilons=epsilons, repetitions=repetitions, seed=seed))
    if overwrite or not (d / SIDE_ESTIMATES_FILE).exists():
        dump(SIDE_ESTIMATES_FILE, compute_side_estimates(df, schema, epsilon=side_epsilon, seed=seed))
    return written
