"""Vectorized state of the engine: QI encoding, open clusters (Gamma) and released clusters (Omega).

Encoding ("min-only" layout).  A record becomes one float vector of length 2J::

    v = [ x_1..x_Jn | A_1..A_Jc | -x_1..-x_Jn | -B_1..-B_Jc ]

with x the raw numeric values, and for a categorical QI a with M_a leaves and leaf index c (leaves are
numbered depth-first, so every node covers a contiguous leaf range and the LCA of a set of leaves is the LCA
of its min and max leaf): ``A = o_a + c * M_a`` and ``B = c``, where o_a is the offset of a's ``(M_a x M_a)``
loss table inside one flat vector holding the tables of all categorical QIs.

The box (generalization) of a set of records is then the *elementwise minimum* of their vectors:
``[min x | min A | -max x | -max B]``; the union of two boxes is their elementwise minimum; and a box covers a
record exactly when ``box <= v`` elementwise.  The loss of a box, summed over the J QIs, is::

    L = sum_a (max x_a - min x_a) / (U_a - L_a)  +  sum_a table[min A_a + max B_a]

computed as ``(min x + (-max x)) * (-1/(U_a - L_a))`` summed by numpy (the numeric part) and one gather at the
flat table index ``min A - (-max B)``, summed by numpy (the categorical part).  Scoring a record against every
open cluster is therefore a few whole-array operations -- no loop over clusters or attributes.  Indices are
small integers held exactly in float64.  No BLAS call: a matrix product's summation order depends on the CPU
kernel BLAS picks (measured: OpenBLAS's Haswell and Sandybridge kernels gave the LM-scored engine different
release streams on ADULT, ties in the enlargement broken differently), numpy's own sums do not, so the same
input and seed give the same releases on every machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.core.engine.tally import Tally
from stream_anon.core.intervals import format_interval
from stream_anon.core.loss import (
    cail_node_losses,
    cail_table,
    gt_loss_table,
    lm_node_losses,
    numeric_inverse_width,
    numeric_range_loss,
)
from stream_anon.core.schema import Attribute, Schema


class QIEncoder:
    """Encodes records' QIs (min-only layout) and turns boxes back into released strings and losses.

    ``score`` selects the categorical loss table used for cluster choice: ``"gt"`` / ``"lm"``
    (l_a = (leaves(LCA) - 1)/(M_a - 1)) or ``"ubdsa"`` (CAIL: leaves(LCA)/M_a for a generalized value, 0 for a
    leaf).  Numeric QIs score (max - min)/(U - L) under all three.  Released losses always use l_a.
    """

    def __init__(self, schema: Schema, score: str = "gt"):
        self.schema = schema
        self.numeric: list[Attribute] = schema.numeric_qis
        self.categorical: list[Attribute] = schema.categorical_qis
        jn, jc = len(self.numeric), len(self.categorical)
        self.jn, self.jc, self.j = jn, jc, jn + jc
        if self.j == 0:
            raise ValueError("schema has no quasi-identifier; the engine needs at least one")
        self.width = 2 * self.j
        self.names = [a.name for a in self.numeric] + [a.name for a in self.categorical]
        self.num_lo = np.array([float(a.numeric_domain[0]) for a in self.numeric], dtype=np.float64)
        self.num_hi = np.array([float(a.numeric_domain[1]) for a in self.numeric], dtype=np.float64)
        self.num_inv_range = np.array([numeric_inverse_width(*a.numeric_domain) for a in self.numeric],
                                      dtype=np.float64)
        self.hierarchies = [a.qi_hierarchy for a in self.categorical]
        self.m = np.array([h.n_leaves for h in self.hierarchies], dtype=np.int64)
        sizes = self.m * self.m
        self.offsets = (np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if jc
                        else np.zeros(0, np.int64))
        gt = [gt_loss_table(h).ravel() for h in self.hierarchies]
        cail = [cail_table(h).ravel() for h in self.hierarchies]
        self.gt_table = np.concatenate(gt).astype(np.float64) if jc else np.zeros(1)
        self.cail_table = np.concatenate(cail).astype(np.float64) if jc else np.zeros(1)
        self.score_table = self.cail_table if score == "ubdsa" else self.gt_table
        self.leaf_index = [h.leaf_index for h in self.hierarchies]
        # slices of the layout
        self.sx = slice(0, jn)
        self.sa = slice(jn, self.j)
        self.snx = slice(self.j, self.j + jn)
        self.snb = slice(self.j + jn, 2 * self.j)
        self.neg_inv_range = -self.num_inv_range  # (min x + (-max x)) * this = (max - min) / (U - L)
        # per-node Python tables for describing one released box without numpy scalar access
        self._lca = [h.lca.tolist() for h in self.hierarchies]
        self._node_label = [h.node_labels for h in self.hierarchies]
        self._node_lo = [h.node_leaf_lo.tolist() for h in self.hierarchies]
        self._node_hi = [h.node_leaf_hi.tolist() for h in self.hierarchies]
        self._node_gt: list[list[float]] = []
        self._node_score: list[list[float]] = []
        for h in self.hierarchies:
            assert h is not None
            gt_node = lm_node_losses(h).tolist()
            self._node_gt.append(gt_node)
            self._node_score.append(cail_node_losses(h).tolist() if score == "ubdsa" else gt_node)
        self._inv = self.num_inv_range.tolist()
        self._offsets = self.offsets.tolist()
        self._m = self.m.tolist()
        self._num_names = [a.name for a in self.numeric]
        self._num_integer = [a.integer for a in self.numeric]
        self._cat_names = [a.name for a in self.categorical]

    # ------------------------------------------------------------------ encoding
    def encode(self, record: Mapping[str, Any]) -> np.ndarray:
        """One validated record -> its layout vector (length 2J)."""
        v = np.empty(self.width)
        jn, j = self.jn, self.j
        for t, a in enumerate(self.numeric):
            x = float(record[a.name])
            v[t] = x
            v[j + t] = -x
        for t, (idx, a) in enumerate(zip(self.leaf_index, self.categorical, strict=True)):
            c = idx[record[a.name]]
            v[jn + t] = self.offsets[t] + c * self.m[t]
            v[j + jn + t] = -c
        return v

    def encode_many(self, columns: Mapping[str, Sequence[Any]]) -> np.ndarray:
        """Column-wise encoding of many validated records: ``(n, 2J)`` float64."""
        raw, leaves = self.schema.encode_qis_many(columns)
        n = raw.shape[0]
        v = np.empty((n, self.width))
        v[:, self.sx] = raw
        v[:, self.snx] = -raw
        v[:, self.sa] = self.offsets + leaves * self.m
        v[:, self.snb] = -leaves
        return v

    # ------------------------------------------------------------------ boxes
    def score_rows(self, rows: np.ndarray, scratch: ScoreScratch | None = None) -> np.ndarray:
        """Scoring loss summed over QIs of boxes given as layout rows (shape ``(..., 2J)``): the numeric part
        ``sum_a (max x_a - min x_a) / (U_a - L_a)`` plus the categorical table entries at ``min A - (-max B)``
        (numpy's sums, no BLAS: the same result on every CPU).  ``scratch``: preallocated arrays of the rows'
        shape (the engine's hot path); without it they are allocated for this call."""
        s = scratch if scratch is not None else ScoreScratch(rows.shape[:-1], self.jn, self.jc)
        num = np.add(rows[..., self.sx], rows[..., self.snx], out=s.num)
        num *= self.neg_inv_range
        out: np.ndarray = num.sum(axis=-1)
        if self.jc:
            s.idx[...] = np.subtract(rows[..., self.sa], rows[..., self.snb], out=s.cat)
            out += self.score_table.take(s.idx, out=s.cat).sum(axis=-1)
        return out

    def describe(self, box: np.ndarray) -> tuple[dict[str, str], float, float, list[int]]:
        """One released box -> (released strings, per-record loss mean_a l_a, scoring loss summed over QIs,
        LCA node per categorical QI).  Pure Python on ``box.tolist()`` (called once per released class)."""
        b = box.tolist()
        jn, j = self.jn, self.j
        gen: dict[str, str] = {}
        gt_sum = 0.0
        for t in range(jn):
            lo, hi = b[t], -b[j + t]
            gt_sum += numeric_range_loss(lo, hi, self._inv[t])
            if self._num_integer[t]:
                gen[self._num_names[t]] = f"[{int(lo)}-{int(hi)}]"  # == format_interval for integers
            else:
                gen[self._num_names[t]] = format_interval(lo, hi)
        sc_sum = gt_sum
        nodes: list[int] = []
        for t in range(self.jc):
            clo = int(b[jn + t] - self._offsets[t]) // self._m[t]
            chi = int(-b[j + jn + t])
            node = self._lca[t][clo][chi]
            nodes.append(node)
            gen[self._cat_names[t]] = self._node_label[t][node]
            gt_sum += self._node_gt[t][node]
            sc_sum += self._node_score[t][node]
        return gen, gt_sum / j, sc_sum, nodes

    def cover_of(self, box: np.ndarray, nodes: list[int]) -> np.ndarray:
        """The released generalization as a box (categorical ranges widened to the LCA node's leaf range)."""
        out = box.copy()
        jn, j = self.jn, self.j
        for t, node in enumerate(nodes):
            out[jn + t] = self._offsets[t] + self._node_lo[t][node] * self._m[t]
            out[j + jn + t] = -self._node_hi[t][node]
        return out


class ScoreScratch:
    """Work arrays of :meth:`QIEncoder.score_rows` for rows of shape ``lead + (2J,)``: ``num`` (min x + (-max x)),
    ``cat`` (the flat table index, then its entry) and ``idx`` (that index as an integer)."""

    def __init__(self, lead: tuple[int, ...], jn: int, jc: int) -> None:
        self.num = np.empty((*lead, jn))
        self.cat = np.empty((*lead, jc))
        self.idx = np.empty((*lead, jc), dtype=np.intp)


class ClusterStore:
    """Gamma: at most ``capacity`` open clusters, each a box row in one preallocated ``(capacity, 2J)`` array.

    Per cluster c: ``box`` (elementwise min of its members' vectors; +inf for a free slot, so the union with a
    record is the record itself and every score stays finite), ``lsum`` (scoring loss summed over QIs),
    ``tally`` (records, person ids and sensitive values: :class:`~stream_anon.core.engine.tally.Tally`),
    ``size`` (distinct individuals, ``tally[c].individuals`` kept as a plain list for the outlier rule),
    ``oldest`` (earliest arrival position), ``members`` (ring slots).  ``wnew`` and ``base`` make the enlargement one expression, ``E = wnew * L(C + t) - base``:
    size-weighted form (GT, CAIL): ``wnew = n + 1, base = n * L(C)``; CASTLE's form (LM): ``wnew = 1,
    base = L(C)``.  Free slots have ``base = -inf`` so their E is +inf.  With a diversity requirement
    (``n_values`` > 0), ``counts`` holds each cluster's sensitive-value counts, one row per cluster over the
    value codes (:mod:`stream_anon.core.engine.sensitive`), so a requirement is checked for all clusters at once.
    """

    def __init__(self, capacity: int, width: int, weighted: bool, *, persons: bool, values: bool,
                 n_values: int = 0):
        self.capacity = capacity
        self.weighted = weighted
        self.box = np.full((capacity, width), np.inf)
        self.lsum = np.zeros(capacity)
        self.tally = [Tally(persons=persons, values=values) for _ in range(capacity)]
        self.size: list[int] = [0] * capacity  # distinct individuals (Python ints: scalar access is the hot path)
        self.oldest = np.zeros(capacity, dtype=np.int64)
        self.wnew = np.ones(capacity)
        self.base = np.full(capacity, -np.inf)
        self.active = np.zeros(capacity, dtype=bool)
        self.members: list[list[int]] = [[] for _ in range(capacity)]
        self.free: list[int] = list(range(capacity - 1, -1, -1))
        self.n_active = 0
        self.counts = np.zeros((capacity, n_values))

    def set_weights(self, c: int) -> None:
        n = self.tally[c].records
        if self.weighted:
            self.wnew[c] = n + 1
            self.base[c] = n * self.lsum[c]
        else:
            self.wnew[c] = 1.0
            self.base[c] = self.lsum[c]

    def allocate(self) -> int:
        c = self.free.pop()
        self.active[c] = True
        self.n_active += 1
        return c

    def release(self, c: int) -> None:
        self.active[c] = False
        self.box[c] = np.inf
        self.base[c] = -np.inf
        self.wnew[c] = 1.0
        self.tally[c].clear()
        self.size[c] = 0
        self.lsum[c] = 0.0
        self.members[c] = []
        self.counts[c] = 0.0
        self.free.append(c)
        self.n_active -= 1


class OmegaStore:
    """Omega: released clusters kept for reuse, bounded to the ``zeta`` most recent (a ring) and, optionally,
    to those released at most ``max_age`` arrivals ago.  A record is covered by kept cluster i iff
    ``cover[i] <= v`` elementwise (free entries are +inf): one comparison for all kept clusters.

    With ``n_values`` > 0 (a diversity requirement that more records can break) each entry also keeps its class's
    sensitive-value ``counts`` (raised by every reuse), the reference it was checked against (``refs``, code
    rows) and that reference as released (``ref_pairs``), so a reuse is allowed only if the class still
    satisfies the requirement with the record in it."""

    def __init__(self, zeta: int, width: int, max_age: int | None, *, n_values: int = 0):
        self.zeta = zeta
        self.max_age = max_age
        cap = max(zeta, 1)
        self.cover = np.full((cap, width), np.inf)
        self.pos = np.zeros(cap, dtype=np.int64)
        self.meta: list[tuple[str, dict[str, str], float, int] | None] = [None] * cap
        self.next = 0
        self.count = 0
        self.counts: np.ndarray | None = np.zeros((cap, n_values)) if n_values else None
        self.refs: np.ndarray | None = np.zeros((cap, n_values)) if n_values else None
        self.ref_pairs: list[tuple[tuple[Any, int], ...] | None] = [None] * cap

    def add(self, cover: np.ndarray, pos: int, meta: tuple[str, dict[str, str], float, int], *,
            counts: np.ndarray | None = None, ref: np.ndarray | None = None,
            ref_pairs: tuple[tuple[Any, int], ...] | None = None) -> None:
        if self.zeta == 0:
            return
        i = self.next
        if self.meta[i] is None:
            self.count += 1
        self.cover[i] = cover
        self.pos[i] = pos
        self.meta[i] = meta
        self.ref_pairs[i] = ref_pairs
        if self.counts is not None and counts is not None:
            self.counts[i] = counts
            if self.refs is not None and ref is not None:
                self.refs[i] = ref
        self.next = (i + 1) % self.zeta

    def covering(self, v: np.ndarray, now_pos: int) -> np.ndarray:
        """Indices of kept clusters whose released generalization covers the record vector ``v``."""
        if self.count == 0:
            return np.zeros(0, dtype=np.int64)
        ok = (self.cover <= v).all(axis=1)
        if self.max_age is not None:
            ok &= self.pos >= now_pos - self.max_age
        return np.flatnonzero(ok)
