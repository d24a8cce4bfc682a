"""Information-loss metrics of a released (anonymized) table, one named and cited function each.

Notation.  A released equivalence class ``C`` has ``|C|`` records and, per quasi-identifier ``a``, a closure
``gen_a(C)``: the interval ``[min, max]`` of its members for a numeric QI, the lowest common ancestor (LCA) of
its members' leaves for a categorical QI (described by ``(min_leaf, max_leaf)``, since leaves are numbered so
that every node covers a contiguous leaf range, see :mod:`stream_anon.core.hierarchy`).  ``J`` = number of
QIs, ``R`` = released records, ``S`` = suppressed records, ``N = R + S``.

Per-attribute loss (normalized certainty penalty / LM entry, values in [0, 1]):

    l_a(C) = (leaves(gen_a(C)) - 1) / (M_a - 1)          categorical, M_a = number of leaves of a's hierarchy
    l_a(C) = (max - min) / (hi_a - lo_a)                  numeric, [lo_a, hi_a] = the PUBLIC domain

Table metrics:

* Goldberger–Tassa, LM form (Goldberger & Tassa, "Efficient anonymizations with enhanced utility", TDP 3(2)
  2010): ``GT = (1/N) sum_C |C| (1/J) sum_a l_a(C) + S/N``, range [0, 1].
* Iyengar LM (Iyengar, "Transforming data to satisfy privacy constraints", KDD 2002):
  ``LM = sum_a LM_a``, ``LM_a = (sum_C |C| l_a(C) + S) / N`` (column mean of l_a over the table, a suppressed
  entry counts 1), range [0, J]; ``LM / J`` is reported too.  By construction ``GT == LM / J``.
* CASTLE loss (Cao et al., TDSC 2011): per record ``InfoLoss = (1/J) sum_a l_a``; ``castle_loss`` is its mean
  over released records (``= GT`` restricted to the released records); ``castle_loss_with_suppressed`` counts
  every suppressed record as 1 and equals ``GT``.
* UBDSA cardinality-aware information loss, CAIL (Sopaoglu & Abul, J. Intell. Inf. Syst. 54, 2020), as the
  ADULT stream paper (Lee et al. 2023) describes it: per released record
  ``sum_a c_a`` with ``c_a = leaves(gen_a)/|A_a|`` for a generalized categorical value (0 when it stays a
  leaf) and ``c_a = (max - min)/(hi - lo)`` for numeric; table loss = mean over released records / J.
  It ignores suppressed records and, unlike LM, divides by ``|A_a|`` (not ``|A_a| - 1``) and charges the
  leaf count (not leaf count - 1): a 2-leaf node of a 2-leaf hierarchy costs 1 in both, a 2-leaf node among
  42 leaves costs 2/42 under CAIL but 1/41 under LM, a leaf costs 0 in both.
* Discernibility (Bayardo & Agrawal, "Data privacy through optimal k-anonymization", ICDE 2005):
  ``DM = sum_E |E|^2 + S * N``.
* Normalized average class size (LeFevre, DeWitt & Ramakrishnan, "Mondrian multidimensional
  k-anonymity", ICDE 2006): ``C_avg = (R / #classes) / k`` (suppressed records belong to no class).

Every metric has an exact path (``exact=True``: :class:`fractions.Fraction` arithmetic on numpy object arrays)
and a float path (numpy float64), both vectorized over classes.  Metrics of an empty release are 0.

This module is the one place of these formulas: the per-attribute terms (:func:`numeric_range_loss`,
:func:`lm_categorical_loss`, :func:`cail_categorical_loss_of`) and their per-node / leaf-pair tables
(:func:`lm_node_losses`, :func:`cail_node_losses`, :func:`gt_loss_table`, :func:`cail_table`) are what the
engine scores and releases with (:mod:`stream_anon.core.engine.clusters`), what the summaries and the report
compute, exact or float.  A numeric range is weighted by the reciprocal of the domain width
(:func:`numeric_inverse_width`), as the engine's vectorized scoring does, so the float values agree to the bit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import numpy as np
import pandas as pd

from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.intervals import format_interval, parse_interval, parse_interval_exact
from stream_anon.core.schema import Attribute, Kind, Schema

__all__ = [
    "Number",
    "ReleasedClass",
    "ClassArrays",
    "LossSummary",
    "ReleaseLike",
    "format_interval",
    "parse_interval",
    "parse_interval_exact",
    "numeric_inverse_width",
    "numeric_range_loss",
    "lm_categorical_loss",
    "cail_categorical_loss_of",
    "lm_node_losses",
    "cail_node_losses",
    "gt_loss_table",
    "cail_table",
    "numeric_attribute_loss",
    "categorical_attribute_loss",
    "cail_categorical_loss",
    "castle_record_loss",
    "cail_record_loss",
    "attribute_loss_matrix",
    "cail_loss_matrix",
    "goldberger_tassa_loss",
    "goldberger_tassa_from_totals",
    "iyengar_lm_loss_per_attribute",
    "iyengar_lm_loss",
    "castle_loss",
    "castle_loss_with_suppressed",
    "ubdsa_cail_loss",
    "discernibility",
    "average_class_size",
    "parse_generalization",
    "summarize_classes",
    "summarize_releases",
    "summarize_release_frame",
]

Number = float | Fraction
Bounds = Mapping[str, tuple[Any, Any]]


# ============================================================================ inputs
@dataclass(frozen=True)
class ReleasedClass:
    """Engine-neutral description of one released equivalence class.

    ``bounds[qi]`` is ``(min, max)`` of the members' values for a numeric QI and ``(min_leaf, max_leaf)``
    (leaf indices of the QI's hierarchy) for a categorical QI.  ``individuals`` = distinct persons
    (defaults to ``records``).
    """

    records: int
    bounds: Bounds
    individuals: int | None = None
    class_id: str = ""


@dataclass(frozen=True)
class ClassArrays:
    """``n`` released classes as arrays, QIs in ``schema.qis`` order (numeric first, then categorical).

    ``records``/``individuals``: ``(n,)`` int64; ``num_min``/``num_max``: ``(n, Jn)`` (float64, or object
    arrays of Fractions for the exact path); ``cat_min``/``cat_max``: ``(n, Jc)`` int64 leaf indices.
    """

    records: np.ndarray
    num_min: np.ndarray
    num_max: np.ndarray
    cat_min: np.ndarray
    cat_max: np.ndarray
    individuals: np.ndarray
    class_ids: tuple[str, ...] = ()

    @property
    def n_classes(self) -> int:
        return int(len(self.records))

    @classmethod
    def from_classes(cls, schema: Schema, classes: Sequence[ReleasedClass], *, exact: bool = False) -> ClassArrays:
        nq, cq = schema.numeric_qis, schema.categorical_qis
        n = len(classes)
        for c in classes:
            missing = [a.name for a in schema.qis if a.name not in c.bounds]
            if missing:
                raise ValueError(f"released class {c.class_id!r}: no bounds for quasi-identifier(s) {missing}")
        dtype: Any = object if exact else np.float64
        conv = Fraction if exact else float
        num_min = np.empty((n, len(nq)), dtype=dtype)
        num_max = np.empty((n, len(nq)), dtype=dtype)
        for j, a in enumerate(nq):
            num_min[:, j] = [conv(c.bounds[a.name][0]) for c in classes]
            num_max[:, j] = [conv(c.bounds[a.name][1]) for c in classes]
        cat_min = np.array([[int(c.bounds[a.name][0]) for a in cq] for c in classes], dtype=np.int64).reshape(n, len(cq))
        cat_max = np.array([[int(c.bounds[a.name][1]) for a in cq] for c in classes], dtype=np.int64).reshape(n, len(cq))
        records = np.array([c.records for c in classes], dtype=np.int64)
        individuals = np.array([c.records if c.individuals is None else c.individuals for c in classes], dtype=np.int64)
        return cls(records=records, num_min=num_min, num_max=num_max, cat_min=cat_min, cat_max=cat_max,
                   individuals=individuals, class_ids=tuple(c.class_id for c in classes))


class ReleaseLike(Protocol):
    """What :func:`summarize_releases` reads from the engine's ``Release`` (see the agreed interface)."""

    @property
    def class_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def generalized(self) -> Mapping[str, str]: ...
    @property
    def record_ids(self) -> tuple[Any, ...]: ...
    @property
    def records(self) -> tuple[Mapping[str, Any], ...]: ...


# ============================================================================ per-attribute terms: the formulas
def numeric_inverse_width(domain_lo: Any, domain_hi: Any, *, exact: bool = False) -> Number:
    """1 / (hi - lo) of a numeric QI's public domain [lo, hi]: the weight of a released range in l_a."""
    if exact:
        width = Fraction(domain_hi) - Fraction(domain_lo)
        if width <= 0:
            raise ValueError(f"numeric domain: need hi > lo, got [{domain_lo}, {domain_hi}]")
        return 1 / width
    if not float(domain_hi) > float(domain_lo):
        raise ValueError(f"numeric domain: need hi > lo, got [{domain_lo}, {domain_hi}]")
    return 1.0 / (float(domain_hi) - float(domain_lo))


def numeric_range_loss(vmin: Any, vmax: Any, inverse_width: Number) -> Any:
    """Numeric l_a = (max - min) / (hi - lo) over the public domain [lo, hi] (LM: Iyengar, KDD 2002; Goldberger &
    Tassa, TDP 2010; CASTLE's and CAIL's numeric term), computed as (max - min) * :func:`numeric_inverse_width`.

    Vectorized: scalars or arrays; float64 in, float64 out; Fractions (object arrays) with a Fraction
    ``inverse_width``: exact.
    """
    return (vmax - vmin) * inverse_width


def lm_categorical_loss(leaves: Any, n_leaves: int, *, exact: bool = False) -> Any:
    """Categorical l_a = (leaves(gen) - 1) / (M - 1) (LM, Iyengar KDD 2002; Goldberger & Tassa 2010): 0 for a leaf,
    1 for the root; 0 for every value when the hierarchy has a single leaf (M = 1).

    ``leaves``: the number of leaves under the released node (scalar or array); float64, or Fractions when
    ``exact`` (a scalar Fraction, or an object array).
    """
    m = int(n_leaves)
    if exact:
        if np.ndim(leaves) == 0:
            return Fraction(int(leaves) - 1, m - 1) if m > 1 else Fraction(0)
        out = np.empty(np.shape(leaves), dtype=object)
        out.ravel()[:] = [Fraction(int(c) - 1, m - 1) if m > 1 else Fraction(0) for c in np.ravel(leaves)]
        return out
    counts = np.asarray(leaves, dtype=np.int64)
    return (counts - 1) / (m - 1) if m > 1 else np.zeros(counts.shape)


def cail_categorical_loss_of(leaves: Any, n_leaves: int, generalized: Any, *, exact: bool = False) -> Any:
    """UBDSA CAIL categorical term (Sopaoglu & Abul, JIIS 2020, as Lee et al. 2023 describe it): leaves(gen) / |A_a|
    when the value is generalized (the released node is not a leaf), 0 when it stays a leaf.

    ``leaves`` and ``generalized`` (bool): scalars or arrays of one shape; float64, or Fractions when ``exact``.
    """
    m = int(n_leaves)
    if exact:
        if np.ndim(leaves) == 0:
            return Fraction(int(leaves), m) if generalized else Fraction(0)
        out = np.empty(np.shape(leaves), dtype=object)
        out.ravel()[:] = [Fraction(int(c), m) if g else Fraction(0)
                          for c, g in zip(np.ravel(leaves), np.ravel(generalized), strict=True)]
        return out
    terms = np.asarray(leaves, dtype=np.int64).astype(float) / max(m, 1)
    terms[~np.asarray(generalized, dtype=bool)] = 0.0
    return terms


def _generalized_nodes(hierarchy: Hierarchy) -> np.ndarray:
    """Per node id: True for an inner node (node ids < M are the leaves, see :mod:`stream_anon.core.hierarchy`)."""
    return np.arange(len(hierarchy.node_labels)) >= hierarchy.n_leaves


def lm_node_losses(hierarchy: Hierarchy, *, exact: bool = False) -> np.ndarray:
    """:func:`lm_categorical_loss` of every node of ``hierarchy`` (indexed by node id)."""
    return np.asarray(lm_categorical_loss(hierarchy.node_leaf_counts(), hierarchy.n_leaves, exact=exact))


def cail_node_losses(hierarchy: Hierarchy, *, exact: bool = False) -> np.ndarray:
    """:func:`cail_categorical_loss_of` of every node of ``hierarchy`` (indexed by node id)."""
    return np.asarray(cail_categorical_loss_of(hierarchy.node_leaf_counts(), hierarchy.n_leaves,
                                               _generalized_nodes(hierarchy), exact=exact))


def gt_loss_table(hierarchy: Hierarchy, *, exact: bool = False) -> np.ndarray:
    """``(M, M)``: the LM / Goldberger–Tassa l_a of the LCA of leaves (i, j), i.e. of the closure of any set of
    leaves with min i and max j: (leaves(LCA(i, j)) - 1) / (M - 1)."""
    table: np.ndarray = lm_node_losses(hierarchy, exact=exact)[hierarchy.lca]
    return table


def cail_table(hierarchy: Hierarchy, *, exact: bool = False) -> np.ndarray:
    """``(M, M)``: the CAIL term of LCA(i, j): leaves(LCA)/M when the LCA is an inner node, 0 when it is a leaf."""
    table: np.ndarray = cail_node_losses(hierarchy, exact=exact)[hierarchy.lca]
    return table


# ============================================================================ per-attribute losses (exact)
def numeric_attribute_loss(vmin: float | Fraction, vmax: float | Fraction, domain_lo: float | Fraction,
                           domain_hi: float | Fraction) -> Fraction:
    """Numeric l_a = (max - min) / (hi - lo) over the public domain [lo, hi] (LM, Iyengar KDD 2002), exact."""
    inverse_width = numeric_inverse_width(domain_lo, domain_hi, exact=True)
    if vmax < vmin:
        raise ValueError(f"numeric generalization: min {vmin!r} exceeds max {vmax!r}")
    loss: Fraction = numeric_range_loss(Fraction(vmin), Fraction(vmax), inverse_width)
    return loss


def _lca(hierarchy: Hierarchy, min_leaf: int, max_leaf: int) -> int:
    lo, hi = sorted((int(min_leaf), int(max_leaf)))
    return int(hierarchy.lca[lo, hi])


def categorical_attribute_loss(hierarchy: Hierarchy, min_leaf: int, max_leaf: int) -> Fraction:
    """Categorical l_a = (leaves(LCA) - 1) / (M - 1) (LM, Iyengar KDD 2002; Goldberger & Tassa 2010), exact."""
    node = _lca(hierarchy, min_leaf, max_leaf)
    loss: Fraction = lm_categorical_loss(hierarchy.leaf_count(node), hierarchy.n_leaves, exact=True)
    return loss


def cail_categorical_loss(hierarchy: Hierarchy, min_leaf: int, max_leaf: int) -> Fraction:
    """UBDSA CAIL categorical term: leaves(LCA) / |A_a| when generalized, 0 when the value stays a leaf."""
    node = _lca(hierarchy, min_leaf, max_leaf)
    loss: Fraction = cail_categorical_loss_of(hierarchy.leaf_count(node), hierarchy.n_leaves,
                                              node >= hierarchy.n_leaves, exact=True)
    return loss


def _attr_loss(a: Attribute, bound: tuple[Any, Any], cail: bool) -> Fraction:
    if a.kind is Kind.NUMERIC:
        return numeric_attribute_loss(Fraction(bound[0]), Fraction(bound[1]), *a.numeric_domain)
    h = a.hierarchy
    assert h is not None
    return cail_categorical_loss(h, *bound) if cail else categorical_attribute_loss(h, *bound)


def castle_record_loss(schema: Schema, bounds: Bounds) -> Fraction:
    """CASTLE InfoLoss of a generalized record (Cao et al., TDSC 2011): (1/J) sum_a l_a, exact."""
    qis = schema.qis
    return sum((_attr_loss(a, bounds[a.name], cail=False) for a in qis), Fraction(0)) / len(qis)


def cail_record_loss(schema: Schema, bounds: Bounds) -> Fraction:
    """UBDSA CAIL of one released record (Sopaoglu & Abul 2020): sum_a c_a (not divided by J), exact."""
    return sum((_attr_loss(a, bounds[a.name], cail=True) for a in schema.qis), Fraction(0))


# ============================================================================ vectorized per-class matrices
def _loss_matrix(schema: Schema, arrays: ClassArrays, *, exact: bool, cail: bool) -> np.ndarray:
    nq, cq = schema.numeric_qis, schema.categorical_qis
    n, jn = arrays.n_classes, len(nq)
    out = np.empty((n, jn + len(cq)), dtype=object if exact else np.float64)
    for j, a in enumerate(nq):
        assert a.lo is not None and a.hi is not None
        inverse_width = numeric_inverse_width(a.lo, a.hi, exact=exact)
        if exact:
            vmin = np.array([Fraction(v) for v in arrays.num_min[:, j]], dtype=object)
            vmax = np.array([Fraction(v) for v in arrays.num_max[:, j]], dtype=object)
            out[:, j] = numeric_range_loss(vmin, vmax, inverse_width)
        else:
            out[:, j] = numeric_range_loss(arrays.num_min[:, j].astype(np.float64),
                                           arrays.num_max[:, j].astype(np.float64), inverse_width)
    for j, a in enumerate(cq):
        h = a.hierarchy
        assert h is not None
        table = cail_table(h, exact=exact) if cail else gt_loss_table(h, exact=exact)
        lo_idx = np.minimum(arrays.cat_min[:, j], arrays.cat_max[:, j])
        hi_idx = np.maximum(arrays.cat_min[:, j], arrays.cat_max[:, j])
        out[:, jn + j] = table[lo_idx, hi_idx]
    return out


def attribute_loss_matrix(schema: Schema, arrays: ClassArrays, *, exact: bool = False) -> np.ndarray:
    """``(n, J)``: l_a(C) for every class and QI (LM entries; columns in ``schema.qis`` order)."""
    return _loss_matrix(schema, arrays, exact=exact, cail=False)


def cail_loss_matrix(schema: Schema, arrays: ClassArrays, *, exact: bool = False) -> np.ndarray:
    """``(n, J)``: the CAIL term c_a(C) for every class and QI (Sopaoglu & Abul 2020)."""
    return _loss_matrix(schema, arrays, exact=exact, cail=True)


# ============================================================================ table metrics
def _zero(exact: bool) -> Number:
    return Fraction(0) if exact else 0.0


def _weighted_column_sums(records: np.ndarray, loss_matrix: np.ndarray) -> tuple[int, np.ndarray, bool]:
    """(R, sum_C |C| l_a(C) per column, exact?) — object (Fraction) columns stay exact."""
    r = np.asarray(records, dtype=np.int64)
    if loss_matrix.ndim != 2 or loss_matrix.shape[0] != r.shape[0]:
        raise ValueError(f"loss matrix shape {loss_matrix.shape} does not match {r.shape[0]} classes")
    if loss_matrix.shape[1] == 0:
        raise ValueError("loss: the schema has no quasi-identifiers (J = 0)")
    exact = loss_matrix.dtype == object
    if exact:
        weights = r.astype(object)  # Python ints: Fraction * int stays a Fraction
        sums = np.array([sum((w * x for w, x in zip(weights, loss_matrix[:, j], strict=True)), Fraction(0))
                         for j in range(loss_matrix.shape[1])], dtype=object)
    else:
        sums = r.astype(np.float64) @ loss_matrix.astype(np.float64)
    return int(r.sum()), sums, exact


def goldberger_tassa_loss(records: np.ndarray, loss_matrix: np.ndarray, suppressed: int = 0) -> Number:
    """Goldberger–Tassa loss, LM form (TDP 2010): GT = (1/N) sum_C |C| (1/J) sum_a l_a(C) + S/N, in [0, 1].

    ``records``: ``(n,)`` class sizes in records; ``loss_matrix``: ``(n, J)`` from :func:`attribute_loss_matrix`;
    ``suppressed``: S; N = sum(records) + S.  Exact (Fraction) when ``loss_matrix`` is an object array.
    """
    released, sums, exact = _weighted_column_sums(records, loss_matrix)
    j = loss_matrix.shape[1]
    if exact:
        return goldberger_tassa_from_totals(sum(sums, Fraction(0)) / j, released, int(suppressed))
    return float(goldberger_tassa_from_totals(float(sums.sum()) / j, released, int(suppressed)))


def goldberger_tassa_from_totals(weighted_loss: Number, released: int, suppressed: int) -> Number:
    """Goldberger–Tassa loss from running totals (what a streaming release keeps): GT = (W + S) / N with
    W = sum_C |C| InfoLoss(C) (InfoLoss = mean over QIs of l_a), N = released + S; 0 when N = 0."""
    n_total = int(released) + int(suppressed)
    if n_total == 0:
        return _zero(isinstance(weighted_loss, Fraction))
    return (weighted_loss + int(suppressed)) / n_total


def iyengar_lm_loss_per_attribute(records: np.ndarray, loss_matrix: np.ndarray, suppressed: int = 0) -> list[Number]:
    """Iyengar LM per attribute (KDD 2002): LM_a = (sum_C |C| l_a(C) + S) / N, each in [0, 1]."""
    released, sums, exact = _weighted_column_sums(records, loss_matrix)
    n_total = released + int(suppressed)
    if n_total == 0:
        return [_zero(exact) for _ in range(loss_matrix.shape[1])]
    if exact:
        return [(s + int(suppressed)) / n_total for s in sums]
    return [float((s + suppressed) / n_total) for s in sums]


def iyengar_lm_loss(records: np.ndarray, loss_matrix: np.ndarray, suppressed: int = 0) -> Number:
    """Iyengar LM (KDD 2002): sum over QIs of the column mean of l_a, suppressed entries 1; range [0, J]."""
    per = iyengar_lm_loss_per_attribute(records, loss_matrix, suppressed)
    return sum(per, Fraction(0)) if loss_matrix.dtype == object else float(sum(per))


def castle_loss(records: np.ndarray, loss_matrix: np.ndarray) -> Number:
    """CASTLE average loss (Cao et al., TDSC 2011): mean over released records of (1/J) sum_a l_a, in [0, 1]."""
    return goldberger_tassa_loss(records, loss_matrix, 0)


def castle_loss_with_suppressed(records: np.ndarray, loss_matrix: np.ndarray, suppressed: int) -> Number:
    """CASTLE average loss with every suppressed record counted 1: (sum_C |C| InfoLoss(C) + S) / N (= GT)."""
    return goldberger_tassa_loss(records, loss_matrix, suppressed)


def ubdsa_cail_loss(records: np.ndarray, cail_matrix: np.ndarray) -> Number:
    """UBDSA CAIL table loss (Sopaoglu & Abul 2020, as Lee et al. 2023 describe it):
    (1/J) * mean over released records of sum_a c_a; suppressed records are not counted.
    """
    return goldberger_tassa_loss(records, cail_matrix, 0)


def discernibility(records: np.ndarray, suppressed: int = 0) -> int:
    """Discernibility metric (Bayardo & Agrawal, ICDE 2005): sum_E |E|^2 + S * N (N = all records)."""
    r = np.asarray(records, dtype=np.int64)
    n_total = int(r.sum()) + int(suppressed)
    return int((r * r).sum()) + int(suppressed) * n_total


def average_class_size(records: np.ndarray, k: int) -> Number:
    """Normalized average equivalence-class size (LeFevre et al., ICDE 2006): C_avg = (R / #classes) / k.

    R = released records; 1 is ideal (every class exactly k).  0 when nothing is released.
    """
    if int(k) < 1:
        raise ValueError(f"average_class_size: k must be >= 1, got {k!r}")
    r = np.asarray(records, dtype=np.int64)
    if r.size == 0:
        return Fraction(0)
    return Fraction(int(r.sum()), int(r.size) * int(k))


# ============================================================================ parsing released strings
def parse_generalization(schema: Schema, generalized: Mapping[str, str], *, exact: bool = False) -> dict[str, tuple[Any, Any]]:
    """Released strings -> bounds: numeric ``"[lo-hi]"`` -> (lo, hi); categorical node label -> (min_leaf, max_leaf).

    Raises ``ValueError`` naming the attribute and the string when a QI is missing or does not parse.
    """
    out: dict[str, tuple[Any, Any]] = {}
    for a in schema.qis:
        if a.name not in generalized:
            raise ValueError(f"generalization: quasi-identifier {a.name!r} missing (got {sorted(generalized)})")
        out[a.name] = _parse_value(a, generalized[a.name], exact)
    return out


def _parse_value(a: Attribute, text: str, exact: bool) -> tuple[Any, Any]:
    if a.kind is Kind.NUMERIC:
        try:
            return parse_interval_exact(text) if exact else parse_interval(text)
        except ValueError as e:
            raise ValueError(f"field {a.name!r}: {e}") from None
    h = a.hierarchy
    assert h is not None
    node = h.node(str(text))
    return int(h.node_leaf_lo[node]), int(h.node_leaf_hi[node])


# ============================================================================ summaries
@dataclass
class LossSummary:
    """Every metric of one released table (see the module docstring for formulas and references)."""

    records_released: int
    records_suppressed: int
    classes: int
    min_class_size: int
    distinct_generalizations: int
    gt_loss: Number
    lm_loss: Number
    lm_loss_normalized: Number
    lm_loss_per_attribute: dict[str, Number] = field(default_factory=dict)
    ubdsa_loss: Number = 0.0
    castle_loss: Number = 0.0
    castle_loss_with_suppressed: Number = 0.0
    discernibility: int = 0
    c_avg: Number = 0.0

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: Fractions become floats."""
        def conv(v: Any) -> Any:
            if isinstance(v, dict):
                return {k: conv(x) for k, x in v.items()}
            if isinstance(v, Fraction | np.floating):
                return float(v)
            if isinstance(v, np.integer):
                return int(v)
            return v
        return {k: conv(v) for k, v in asdict(self).items()}


def summarize_classes(schema: Schema, arrays: ClassArrays, k: int, *, suppressed: int = 0, exact: bool = False,
                      distinct_generalizations: int | None = None) -> LossSummary:
    """All metrics from classes as arrays (the fast path; the engine or a benchmark may call it directly)."""
    if exact and arrays.num_min.dtype != object:
        arrays = ClassArrays(records=arrays.records,
                             num_min=np.array([[Fraction(float(x)) for x in row] for row in arrays.num_min],
                                              dtype=object).reshape(arrays.num_min.shape),
                             num_max=np.array([[Fraction(float(x)) for x in row] for row in arrays.num_max],
                                              dtype=object).reshape(arrays.num_max.shape),
                             cat_min=arrays.cat_min, cat_max=arrays.cat_max, individuals=arrays.individuals,
                             class_ids=arrays.class_ids)
    lm = attribute_loss_matrix(schema, arrays, exact=exact)
    cail = cail_loss_matrix(schema, arrays, exact=exact)
    rec = arrays.records
    per = iyengar_lm_loss_per_attribute(rec, lm, suppressed)
    lm_total: Number = sum(per, Fraction(0)) if exact else float(sum(per))
    j = len(schema.qis)
    if distinct_generalizations is None:
        distinct_generalizations = _count_distinct_rows(arrays)
    c_avg = average_class_size(rec, k)
    return LossSummary(
        records_released=int(np.asarray(rec, dtype=np.int64).sum()),
        records_suppressed=int(suppressed),
        classes=arrays.n_classes,
        min_class_size=int(arrays.individuals.min()) if arrays.n_classes else 0,
        distinct_generalizations=distinct_generalizations,
        gt_loss=goldberger_tassa_loss(rec, lm, suppressed),
        lm_loss=lm_total,
        lm_loss_normalized=lm_total / j,
        lm_loss_per_attribute={a.name: v for a, v in zip(schema.qis, per, strict=True)},
        ubdsa_loss=ubdsa_cail_loss(rec, cail),
        castle_loss=castle_loss(rec, lm),
        castle_loss_with_suppressed=castle_loss_with_suppressed(rec, lm, suppressed),
        discernibility=discernibility(rec, suppressed),
        c_avg=c_avg if exact else float(c_avg),
    )


def _count_distinct_rows(arrays: ClassArrays) -> int:
    if arrays.n_classes == 0:
        return 0
    cols = [arrays.num_min, arrays.num_max, arrays.cat_min, arrays.cat_max]
    rows = {tuple(x) for x in zip(*(c[:, j] for c in cols for j in range(c.shape[1])), strict=True)}
    return len(rows)


def _person_key(schema: Schema, rec: Mapping[str, Any] | None, rid: Any) -> Any:
    if schema.person_id is not None and rec is not None and schema.person_id in rec:
        return ("person", rec[schema.person_id])
    return ("record", rid)


def summarize_releases(releases: Iterable[ReleaseLike], schema: Schema, k: int, *, exact: bool = False) -> LossSummary:
    """All metrics of the engine's output (a list of ``Release``).

    Releases sharing a ``class_id`` (a reused cluster's generalization) form one class: their records are
    counted together and their distinct individuals (by ``schema.person_id`` when the records carry it,
    else by record id) give the class size.  ``kind == "suppressed"`` releases count towards S.
    """
    class_bounds: dict[str, tuple[Mapping[str, str], dict[str, tuple[Any, Any]]]] = {}
    class_records: dict[str, int] = {}
    class_people: dict[str, set[Any]] = {}
    suppressed = 0
    for r in releases:
        n_rec = len(r.record_ids)
        if r.kind == "suppressed":
            suppressed += n_rec
            continue
        if r.kind != "class":
            raise ValueError(f"release {r.class_id!r}: kind must be 'class' or 'suppressed', got {r.kind!r}")
        cid = str(r.class_id)
        gen = dict(r.generalized)
        if cid in class_bounds:
            if class_bounds[cid][0] != gen:
                raise ValueError(f"class {cid!r} released under two different generalizations: "
                                 f"{class_bounds[cid][0]} and {gen}")
        else:
            class_bounds[cid] = (gen, parse_generalization(schema, gen, exact=exact))
        class_records[cid] = class_records.get(cid, 0) + n_rec
        recs: Sequence[Mapping[str, Any] | None] = r.records if len(r.records) == n_rec else [None] * n_rec
        people = class_people.setdefault(cid, set())
        people.update(_person_key(schema, rec, rid) for rec, rid in zip(recs, r.record_ids, strict=True))
    classes = [ReleasedClass(records=class_records[c], bounds=b, individuals=len(class_people[c]), class_id=c)
               for c, (_, b) in class_bounds.items()]
    arrays = ClassArrays.from_classes(schema, classes, exact=exact)
    distinct = len({tuple(sorted(g.items())) for g, _ in class_bounds.values()})
    return summarize_classes(schema, arrays, k, suppressed=suppressed, exact=exact, distinct_generalizations=distinct)


def summarize_release_frame(df: pd.DataFrame, schema: Schema, k: int, *, records_suppressed: int = 0,
                            record_id: str = "record_id", class_id: str = "class_id", person_id: str | None = None,
                            exact: bool = False) -> LossSummary:
    """All metrics of a released table (the ``anonymize --output`` CSV read with ``dtype=str``).

    One row per released record: ``record_id``, ``class_id``, the QI columns as released strings, the
    sensitive column.  Suppressed records are not in the file: pass their number as ``records_suppressed``.
    A class's generalization is read from its first row (``verify`` checks that all rows agree).  Class size
    = distinct ``person_id`` values when that column is given, else distinct record ids.
    """
    qis = schema.qis
    need = [class_id, record_id] + [a.name for a in qis] + ([person_id] if person_id else [])
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ValueError(f"released table: column(s) {missing} missing; found {list(df.columns)}")
    if len(df) == 0:
        arrays = ClassArrays.from_classes(schema, [], exact=exact)
        return summarize_classes(schema, arrays, k, suppressed=records_suppressed, exact=exact)
    cids = df[class_id].astype(str)
    grouped = df.groupby(cids, sort=False)
    first = grouped.first()
    records = grouped.size().to_numpy(dtype=np.int64)
    who = person_id or record_id
    individuals = grouped[who].nunique().to_numpy(dtype=np.int64)
    nq, cq = schema.numeric_qis, schema.categorical_qis
    n = len(first)
    dtype: Any = object if exact else np.float64
    num_min = np.empty((n, len(nq)), dtype=dtype)
    num_max = np.empty((n, len(nq)), dtype=dtype)
    cat_min = np.empty((n, len(cq)), dtype=np.int64)
    cat_max = np.empty((n, len(cq)), dtype=np.int64)
    for j, a in enumerate(nq):
        col = first[a.name].astype(str)
        parsed = {u: _parse_value(a, u, exact) for u in pd.unique(col)}
        num_min[:, j] = [parsed[v][0] for v in col]
        num_max[:, j] = [parsed[v][1] for v in col]
    for j, a in enumerate(cq):
        col = first[a.name].astype(str)
        parsed = {u: _parse_value(a, u, exact) for u in pd.unique(col)}
        cat_min[:, j] = [parsed[v][0] for v in col]
        cat_max[:, j] = [parsed[v][1] for v in col]
    arrays = ClassArrays(records=records, num_min=num_min, num_max=num_max, cat_min=cat_min, cat_max=cat_max,
                         individuals=individuals, class_ids=tuple(str(c) for c in first.index))
    distinct = int(first[[a.name for a in qis]].drop_duplicates().shape[0])
    return summarize_classes(schema, arrays, k, suppressed=records_suppressed, exact=exact,
                             distinct_generalizations=distinct)
