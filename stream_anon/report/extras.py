"""Compute the report's optional inputs with the run's own settings: the engine grid, eps-vs-error curves, side
estimates.

``stream-anon report RUN_DIR --compute-extras`` calls :func:`compute_extras`, which writes (only the files that are
missing unless ``overwrite``).  The settings are the run's (:func:`run_settings`: ``config.json`` of the run
directory, else the parameters in ``summary.json``, else every command's defaults, :mod:`stream_anon.core.defaults`),
the schema is the run's (``schema.yaml`` of the run directory, else ADULT), the data the run's (the caller gives
it: the ADULT file, a CSV of the schema, or the demo's synthetic records):

* ``grid.json``: the engine (``stream_anon.core.engine``) with the run's beta, mu, algorithm, loss, leftover, l and
  zeta, over the run's records (``grid_records``: default all of them) for every (k, delta) of the grid, the run's
  own (k, delta) among them, so that the plot shows the run's figure at its own point; losses of the released
  table from ``stream_anon.core.loss``: ``gt_loss`` (Goldberger-Tassa, in [0, 1]), ``lm_loss`` (Iyengar's LM,
  the sum over the J QIs, in [0, J]; with these hierarchies its per-cell loss equals GT's, so LM = J x GT),
  ``ubdsa_loss`` (CAIL).
* ``ldp_curves.json``: error of each of the run's side-path mechanisms on each of its attributes (k-RR, random
  substitution or its l-extended variant as configured, the discretized bounded Laplace, the bounded Laplace mean)
  vs eps on the data, mean and standard deviation over ``repetitions`` seeded runs.  Frequency oracles: total
  variation distance between the true distribution and the estimate projected onto the probability simplex
  (Euclidean projection, ``analysis.project_onto_simplex``), TV = 1/2 sum_v |p_hat(v) - f(v)|, in [0, 1].  (The
  unbiased estimate itself is not a distribution: its "TV" reached 13 for the discretized bounded Laplace at
  eps = 0.25.)  Bounded Laplace: absolute error of the estimated mean (boundary-corrected estimator), in the
  attribute's unit.
* ``side_estimates.json``: estimated vs true distribution of each of the run's side-path attributes through the
  run's own mechanisms (its eps per attribute), labelled ``offline:<mechanism>`` (computed here, not read from the
  service's side topics; the demo writes the service's own).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.config.side_paths import SidePathConfig, plan_side_paths, with_schema_attributes
from stream_anon.core.defaults import DEFAULTS, REPORT_EPSILONS, REPORT_GRID_DELTAS, REPORT_GRID_KS
from stream_anon.core.schema import Schema
from stream_anon.report.analysis import project_onto_simplex, total_variation
from stream_anon.report.rundir import (
    GRID_FILE,
    LDP_CURVES_FILE,
    SIDE_ESTIMATES_FILE,
    SIMPLEX_PROJECTION,
    SUMMARY_FILE,
    TV_METRIC,
    load_schema,
    summary_value,
)

log = logging.getLogger(__name__)

DEFAULT_KS = REPORT_GRID_KS  # stream_anon.core.defaults: one place for every command's defaults
DEFAULT_DELTAS = REPORT_GRID_DELTAS
DEFAULT_EPSILONS = REPORT_EPSILONS
CONFIG_FILE = "config.json"
ENGINE_KEYS = ("k", "delta", "beta", "mu", "algorithm", "loss", "leftover", "l", "diversity", "c", "t_closeness",
               "t_distance", "zeta")


@dataclass(frozen=True)
class RunSettings:
    """The run's own settings, as its run directory states them (:func:`run_settings`)."""

    engine: dict[str, Any]  # k, delta, beta, mu, algorithm, loss, leftover, l, zeta
    schema: Schema
    side: SidePathConfig  # attribute lists resolved against the schema
    records: int | None  # records_in of summary.json
    synthetic: bool
    seed: int | None
    sources: dict[str, str]  # setting -> where it came from: config.json, summary.json or defaults

    @property
    def is_adult(self) -> bool:
        return self.schema.name == "adult"


def _stated(summary: dict[str, Any], key: str) -> tuple[Any] | None:
    """``(value,)`` when ``summary.json`` states ``key`` (a null included: ``l: null`` is a setting), where
    :func:`~stream_anon.report.rundir.summary_value` looks; None when it does not."""
    for node in (summary, summary.get("config", {}).get("anonymization") if isinstance(summary.get("config"), dict)
                 else None, summary.get("anonymization"), summary.get("parameters"), summary.get("engine"),
                 summary.get("config")):
        if isinstance(node, dict) and key in node and not isinstance(node[key], dict | list):
            return (node[key],)
    return None


def run_settings(run_dir: str | Path) -> RunSettings:
    """The settings of the run in ``run_dir``: each engine parameter from ``config.json`` (the service's
    ``anonymization`` section, as the demo and ``audit --run-dir`` write it), else from ``summary.json`` (top level,
    ``parameters``, ``anonymization``), else every command's default (:data:`~stream_anon.core.defaults.DEFAULTS`);
    the schema from ``schema.yaml`` (else ADULT); the side paths from ``config.json`` (else the schema's
    declarations)."""
    d = Path(run_dir)
    config: dict[str, Any] = {}
    if (d / CONFIG_FILE).is_file():
        loaded = json.loads((d / CONFIG_FILE).read_text(encoding="utf-8"))
        config = loaded if isinstance(loaded, dict) else {}
    summary = json.loads((d / SUMMARY_FILE).read_text(encoding="utf-8")) if (d / SUMMARY_FILE).is_file() else {}
    section = config.get("anonymization")
    anon: dict[str, Any] = section if isinstance(section, dict) else {}
    engine: dict[str, Any] = {}
    sources: dict[str, str] = {}
    defaults = DEFAULTS.as_dict()
    for key in ENGINE_KEYS:
        stated = _stated(summary, key)
        if key in anon:
            engine[key], sources[key] = anon[key], CONFIG_FILE
        elif stated is not None:
            engine[key], sources[key] = stated[0], SUMMARY_FILE
        else:
            engine[key], sources[key] = defaults[key], "defaults"
    for key in ("k", "delta", "beta", "mu"):
        engine[key] = int(engine[key])
    if engine["zeta"] is not None:
        engine["zeta"] = int(engine["zeta"])
    if engine["l"] is not None:
        engine["l"] = int(engine["l"]) if float(engine["l"]).is_integer() else float(engine["l"])
    schema = load_schema(d)
    if anon.get("qi") is not None or anon.get("sensitive") is not None:
        schema = schema.with_roles(qis=anon.get("qi"), sensitive=anon.get("sensitive"))
    side = SidePathConfig.coerce({k: v for k, v in (config.get("side_paths") or {}).items()
                                  if k in {f.name for f in dataclasses.fields(SidePathConfig)}})
    records = summary_value(summary, "records_in")
    seed = anon["seed"] if "seed" in anon else summary_value(summary, "seed")
    return RunSettings(engine=engine, schema=schema, side=with_schema_attributes(side, schema),
                       records=int(records) if records is not None else None,
                       synthetic=summary_value(summary, "synthetic") is True,
                       seed=int(seed) if seed is not None else None, sources=sources)


def compute_grid(records: Sequence[dict[str, Any]], schema: Schema, *, ks: Sequence[int] = DEFAULT_KS,
                 deltas: Sequence[int] = DEFAULT_DELTAS, loss_metrics: Sequence[str] | None = None,
                 beta: int = DEFAULTS.beta, mu: int = DEFAULTS.mu, algorithm: str = DEFAULTS.algorithm,
                 leftover: str = DEFAULTS.leftover, l: int | float | None = DEFAULTS.l,  # noqa: E741
                 diversity: str = DEFAULTS.diversity, c: float | None = DEFAULTS.c,
                 t_closeness: float | None = DEFAULTS.t_closeness, t_distance: str = DEFAULTS.t_distance,
                 zeta: int = DEFAULTS.zeta, seed: int = 0) -> list[dict[str, Any]]:
    """Run the engine on ``records`` (validated) for every (k, delta, loss_metric) with delta >= k (the other
    parameters as given: the run's); ``loss_metrics`` default: the engine's scoring loss of the run
    (:data:`~stream_anon.core.defaults.DEFAULTS`)."""
    from stream_anon.core.engine import Engine, EngineConfig
    from stream_anon.core.loss import summarize_releases

    out = []
    for loss_metric in (loss_metrics or (DEFAULTS.loss,)):
        for k in ks:
            for delta in deltas:
                if delta < k:
                    continue
                t0 = time.perf_counter()
                engine = Engine(schema, EngineConfig(k=k, delta=delta, beta=beta, mu=mu, algorithm=algorithm,
                                                     loss=loss_metric, leftover=leftover, l=l, diversity=diversity,
                                                     c=c, t_closeness=t_closeness, t_distance=t_distance, zeta=zeta,
                                                     seed=seed))
                releases = []
                for r in records:
                    releases.extend(engine.push(r))
                releases.extend(engine.flush())
                s = summarize_releases(releases, schema, k)
                seconds = time.perf_counter() - t0
                total = s.records_released + s.records_suppressed
                out.append({"k": k, "delta": delta, "beta": beta, "mu": mu, "loss_metric": loss_metric,
                            "algorithm": algorithm, "leftover": leftover, "l": l, "diversity": diversity, "c": c,
                            "t_closeness": t_closeness, "zeta": zeta,
                            "records": len(records), "qis": len(schema.qis), "gt_loss": float(s.gt_loss),
                            "lm_loss": float(s.lm_loss), "ubdsa_loss": float(s.ubdsa_loss),
                            "suppressed_fraction": s.records_suppressed / total if total else 0.0,
                            "classes": s.classes, "seconds": round(seconds, 3)})
                log.info("grid k=%d delta=%d loss=%s: GT %.4f in %.2f s (%.0f records/s)", k, delta, loss_metric,
                         s.gt_loss, seconds, len(records) / seconds if seconds > 0 else float("inf"))
    return out


def _true_counts(values: np.ndarray, categories: Sequence[Any]) -> np.ndarray:
    index = {c: i for i, c in enumerate(categories)}
    codes = np.fromiter((index[v] for v in values), dtype=np.int64, count=len(values))
    return np.bincount(codes, minlength=len(categories)).astype(float)


MechanismFactory = Callable[[float, list[Any], np.random.Generator], Any]


def _frequency_mechanisms(schema: Schema, side: SidePathConfig | None = None
                          ) -> list[tuple[str, str, MechanismFactory]]:
    """(mechanism label, attribute, factory(epsilon, categories, rng) -> mechanism with randomise/estimate) for
    each categorical side-path attribute of the run (``side``, its lists resolved; default: the schema's
    declarations)."""
    from stream_anon.privacy import (
        DiscretizedBoundedLaplace,
        KRandomizedResponse,
        LExtendedSubstitution,
        RandomSubstitution,
    )

    side = with_schema_attributes(side if side is not None else SidePathConfig(), schema)
    out: list[tuple[str, str, MechanismFactory]] = []
    if side.krr.enabled:
        for a in side.krr.attributes or ():
            out.append(("k-RR", a, lambda e, c, rng: KRandomizedResponse(epsilon=e, categories=c, rng=rng)))
    if side.rs.enabled:
        rs = side.rs
        for a in rs.attributes or ():
            if rs.l == 1:
                out.append(("random substitution", a,
                            lambda e, c, rng: RandomSubstitution(categories=c, epsilon=e, rng=rng)))
            else:
                def lext(e: float, c: list[Any], rng: np.random.Generator, rs: Any = rs) -> Any:
                    return LExtendedSubstitution.for_epsilon(categories=c, epsilon=e, l=rs.l, variant=rs.variant,
                                                             rng=rng)

                out.append((f"l-extended substitution (l={rs.l}, {rs.variant})", a, lext))
    if side.blap.enabled:
        for a in side.blap.categorical_attributes or ():
            out.append(("discretized bounded Laplace", a,
                        lambda e, c, rng: DiscretizedBoundedLaplace(epsilon=e, categories=c, rng=rng)))
    return [m for m in out if m[1] in schema]


def _numeric_attributes(schema: Schema, side: SidePathConfig | None = None) -> list[str]:
    side = with_schema_attributes(side if side is not None else SidePathConfig(), schema)
    return [a for a in (side.blap.attributes or ()) if side.blap.enabled and a in schema]


def _categories(df: pd.DataFrame, schema: Schema, attribute: str) -> list[Any]:
    a = schema[attribute]
    if a.kind.value == "numeric":
        assert a.lo is not None and a.hi is not None
        return list(range(int(a.lo), int(a.hi) + 1))
    return list(a.domain_values)


def compute_ldp_curves(df: pd.DataFrame, schema: Schema, *, epsilons: Sequence[float] = DEFAULT_EPSILONS,
                       repetitions: int = 5, seed: int = 0, side: SidePathConfig | None = None
                       ) -> list[dict[str, Any]]:
    """eps vs error of the run's side-path mechanisms on the columns of ``df`` (mean and std over
    ``repetitions``); ``side``: the run's side-path settings (default: the schema's declarations)."""
    from stream_anon.privacy import BoundedLaplace

    rng = np.random.default_rng(seed)
    curves = []
    for label, attribute, factory in _frequency_mechanisms(schema, side):
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
    for attribute in _numeric_attributes(schema, side):
        a = schema[attribute]
        assert a.lo is not None and a.hi is not None
        x = df[attribute].to_numpy(dtype=float)
        points = []
        for eps in epsilons:
            errs = []
            for _ in range(repetitions):
                bl = BoundedLaplace(epsilon=float(eps), lower=a.lo, upper=a.hi, integer=a.integer, rng=rng)
                mean, _se = bl.estimate_mean(bl.randomise_many(x))
                errs.append(abs(mean - float(x.mean())))
            points.append({"epsilon": float(eps), "error": float(np.mean(errs)),
                           "error_std": float(np.std(errs, ddof=1)) if repetitions > 1 else 0.0})
        curves.append({"mechanism": "bounded Laplace (mean)", "attribute": attribute,
                       "error_metric": "absolute error of the mean", "n": len(x), "repetitions": repetitions,
                       "points": points})
    return curves


def compute_side_estimates(df: pd.DataFrame, schema: Schema, *, side: SidePathConfig | None = None,
                           seed: int = 0) -> list[dict[str, Any]]:
    """Estimated vs true distribution of each of the run's side-path attributes through the run's own mechanisms
    (:func:`~stream_anon.config.side_paths.plan_side_paths`: the eps per attribute the run configured)."""
    rng = np.random.default_rng(seed)
    plan = plan_side_paths(side if side is not None else SidePathConfig(), schema, rng)
    out: list[dict[str, Any]] = []
    for p in [*plan.krr, *plan.rs, *plan.blap_categorical]:
        if p.attribute not in df:
            continue
        values = df[p.attribute].astype(str).to_numpy()
        true = _true_counts(values, p.categories)
        est = p.mech.estimate_counts(p.mech.randomise_many(values))
        n = len(values)
        out.append({"topic": f"offline:{p.mechanism}", "attribute": p.attribute, "kind": "frequency",
                    "epsilon": p.epsilon, "categories": [str(c) for c in p.categories],
                    "estimated": (est.counts / n).tolist(), "true": (true / n).tolist(),
                    "std_errors": (est.std_errors / n).tolist()})
    for q in plan.blap_numeric:
        if q.attribute not in df:
            continue
        x = df[q.attribute].to_numpy(dtype=float)
        mean, se = q.mech.estimate_mean(q.mech.randomise_many(x))
        out.append({"topic": "offline:blap", "attribute": q.attribute, "kind": "mean", "epsilon": q.epsilon,
                    "estimated": mean, "true": float(x.mean()), "std_error": se})
    return out


def compute_extras(run_dir: str | Path, data: pd.DataFrame, *, settings: RunSettings | None = None,
                   grid_records: int | None = None, ks: Sequence[int] = DEFAULT_KS,
                   deltas: Sequence[int] = DEFAULT_DELTAS, epsilons: Sequence[float] = DEFAULT_EPSILONS,
                   repetitions: int = 5, seed: int = 0, overwrite: bool = False) -> list[Path]:
    """Write ``grid.json``, ``ldp_curves.json`` and ``side_estimates.json`` into ``run_dir`` with the run's
    settings (``settings``, default :func:`run_settings`) on ``data`` (the run's records, validated against its
    schema: the caller reads them); return what was written.  The grid holds the run's own (k, delta);
    ``grid_records``: records per grid run (default: the run's record count, at most ``len(data)``)."""
    from stream_anon.core.datasets import iter_records

    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    st = settings if settings is not None else run_settings(d)
    schema = st.schema
    e = st.engine
    written = []

    def dump(name: str, payload: Any) -> None:
        (d / name).write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        written.append(d / name)

    if overwrite or not (d / GRID_FILE).exists():
        n = grid_records or st.records or len(data)
        records = [schema.validate(r, allow_extra=True) for r in iter_records(data.head(n))]
        dump(GRID_FILE, compute_grid(records, schema, ks=sorted({*ks, e["k"]}), deltas=sorted({*deltas, e["delta"]}),
                                     loss_metrics=(e["loss"],), beta=e["beta"], mu=e["mu"],
                                     algorithm=e["algorithm"], leftover=e["leftover"], l=e["l"],
                                     diversity=e["diversity"], c=e["c"], t_closeness=e["t_closeness"],
                                     t_distance=e["t_distance"],
                                     zeta=e["zeta"] if e["zeta"] is not None else DEFAULTS.zeta, seed=seed))
    if overwrite or not (d / LDP_CURVES_FILE).exists():
        dump(LDP_CURVES_FILE, compute_ldp_curves(data, schema, epsilons=epsilons, repetitions=repetitions, seed=seed,
                                                 side=st.side))
    if overwrite or not (d / SIDE_ESTIMATES_FILE).exists():
        dump(SIDE_ESTIMATES_FILE, compute_side_estimates(data, schema, side=st.side, seed=seed))
    return written
