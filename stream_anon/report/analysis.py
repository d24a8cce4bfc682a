"""Numbers the report plots, computed from the released records and the schema (no plotting here).

Relative generalization of a released value (0 = exact, 1 = the whole domain), the per-attribute term of
the Goldberger-Tassa / LM loss (Goldberger & Tassa 2010; Iyengar 2002), computed by :mod:`stream_anon.core.loss`:
    numeric     ``[a-b]``  ->  (b - a) / (hi - lo)          with ``[lo, hi]`` the attribute's public domain
    categorical node  n    ->  (leaves(n) - 1) / (M - 1)     with M the number of leaves of its hierarchy
The hierarchy *level* of a categorical value is ``height - depth(n)``: 0 for a leaf (not generalized),
``height`` for the root ``*``.

Distances between distributions: :func:`total_variation` is defined for probability vectors, and an unbiased
LDP frequency estimate is not one (entries may be negative or exceed 1, so "TV" of the raw estimate reached 28
on ADULT).  :func:`project_onto_simplex` maps the estimate to the closest probability vector first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from stream_anon.core.hierarchy import HierarchyError
from stream_anon.core.intervals import IntervalFormatError, parse_interval
from stream_anon.core.loss import lm_node_losses, numeric_inverse_width, numeric_range_loss
from stream_anon.core.schema import Attribute, Kind, Schema

SUPPRESSED_LABELS = frozenset({"*", ""})


@dataclass
class AttributeGeneralization:
    """Per-record relative generalization of one quasi-identifier column of ``released.csv``."""

    name: str
    kind: str  # "numeric" | "categorical"
    relative: np.ndarray  # float per record in [0, 1]; NaN where the value could not be interpreted
    levels: np.ndarray | None  # categorical: hierarchy level per record (-1 if unknown)
    height: int | None  # categorical: height of the hierarchy
    unparsed: int  # values that are neither an interval of the domain nor a node of the hierarchy

    @property
    def mean_relative(self) -> float:
        ok = ~np.isnan(self.relative)
        return float(self.relative[ok].mean()) if ok.any() else float("nan")


def _numeric_relative(attr: Attribute, labels: list[str]) -> np.ndarray:
    assert attr.lo is not None and attr.hi is not None
    vmin = np.full(len(labels), np.nan)
    vmax = np.full(len(labels), np.nan)
    suppressed = np.zeros(len(labels), dtype=bool)
    for i, label in enumerate(labels):
        if label.strip() in SUPPRESSED_LABELS:
            suppressed[i] = True
            continue
        try:
            vmin[i], vmax[i] = parse_interval(label)
        except IntervalFormatError:
            continue
    out = np.clip(numeric_range_loss(vmin, vmax, numeric_inverse_width(attr.lo, attr.hi)), 0.0, 1.0)
    out[suppressed] = 1.0
    return out


def _categorical(attr: Attribute, labels: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    h = attr.hierarchy
    assert h is not None
    node_loss = lm_node_losses(h)
    rel = np.full(len(labels), np.nan)
    lev = np.full(len(labels), -1, dtype=np.int64)
    for i, label in enumerate(labels):
        try:
            node = h.node(label)
        except HierarchyError:
            if label.strip() in SUPPRESSED_LABELS:
                node = h.root
            else:
                continue
        rel[i] = node_loss[node]
        lev[i] = h.height - int(h.node_depth[node])
    return rel, lev, h.height


def generalization_levels(released: pd.DataFrame, schema: Schema) -> list[AttributeGeneralization]:
    """Relative generalization (and hierarchy level) of every QI column present in ``released``.

    Each distinct released string is interpreted once and mapped back onto the records (vectorized over
    records; a released column has at most a few thousand distinct generalizations).
    """
    out = []
    for attr in schema.qis:
        if attr.name not in released.columns:
            continue
        codes, uniques = pd.factorize(released[attr.name].astype(str), sort=False)
        labels = [str(u) for u in uniques]
        if attr.kind is Kind.NUMERIC:
            rel_u = _numeric_relative(attr, labels)
            lev_u: np.ndarray | None = None
            height = None
        else:
            rel_u, lev_u, height = _categorical(attr, labels)
        rel = rel_u[codes] if len(labels) else np.zeros(0)
        levels = lev_u[codes] if lev_u is not None and len(labels) else None
        out.append(AttributeGeneralization(name=attr.name, kind=attr.kind.value, relative=rel, levels=levels,
                                           height=height, unparsed=int(np.isnan(rel).sum())))
    return out


def class_sizes(released: pd.DataFrame) -> np.ndarray:
    """Records per released class id (a class released again under a reused cluster counts once per id)."""
    if len(released) == 0:
        return np.zeros(0, dtype=np.int64)
    return released.groupby("class_id", sort=False).size().to_numpy(dtype=np.int64)


def quantiles(values: np.ndarray, qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float]:
    """``{"p50": ..., "p90": ..., "max": ...}`` of the finite values (empty dict when there are none)."""
    v = values[np.isfinite(values)]
    if v.size == 0:
        return {}
    out = {f"p{round(q * 100):d}": float(np.quantile(v, q)) for q in qs}
    out["max"] = float(v.max())
    out["mean"] = float(v.mean())
    return out


def project_onto_simplex(v: np.ndarray) -> np.ndarray:
    """Euclidean projection of ``v`` onto the probability simplex: ``argmin_p ||p - v||_2`` s.t. ``p >= 0``,
    ``sum(p) = 1``.

    Sort-based algorithm (Held, Wolfe & Crowder 1974; Duchi, Shalev-Shwartz, Singer & Chandra, ICML 2008,
    Fig. 1; Wang & Carreira-Perpinan 2013): with ``u`` = ``v`` sorted descending,
    ``rho = max{j : u_j - (sum_{i<=j} u_i - 1) / j > 0}``, ``theta = (sum_{i<=rho} u_i - 1) / rho`` and
    ``p = max(v - theta, 0)``.  O(n log n); a probability vector is returned unchanged.
    """
    x = np.asarray(v, dtype=float)
    if x.ndim != 1 or x.size == 0 or not np.isfinite(x).all():
        raise ValueError(f"project_onto_simplex: expected a non-empty finite 1-d vector, got {x!r:.80}")
    u = np.sort(x)[::-1]
    css = np.cumsum(u) - 1.0
    j = np.arange(1, x.size + 1)
    rho = int(np.flatnonzero(u - css / j > 0)[-1]) + 1
    theta = css[rho - 1] / rho
    return np.maximum(x - theta, 0.0)


def total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """Total variation distance of two probability vectors, ``1/2 sum_v |p(v) - q(v)|``, in [0, 1]."""
    a, b = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"total_variation: shapes differ: {a.shape} vs {b.shape}")
    return float(0.5 * np.abs(a - b).sum())
