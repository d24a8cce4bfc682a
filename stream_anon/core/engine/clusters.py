"""Vectorized state of the engine: QI encoding, open clusters (Gamma) and released clusters (Omega).

Encoding (one row per record, see :class:`QIEncoder`):

* numeric QI a: the raw value x and its scaled value x' = (x - L_a) / (U_a - L_a) over the public domain
  [L_a, U_a]; the numeric loss of a box is ``max x' - min x'`` = (max - min) / (U_a - L_a).
* categorical QI a with M_a leaves: leaf index c (leaves are numbered depth-first, so a node covers a
  contiguous leaf range and the LCA of a set is the LCA of its min and max leaf).  All per-attribute
  ``(M_a x M_a)`` loss tables are flattened into one vector at offset o_a; a record carries
  ``A = o_a + c * M_a`` and ``B = c``.  Because ``M_a > 0`` the minimum of A over a cluster is
  ``o_a + min(c) * M_a``, so the loss of a cluster is ``table[min(A) + max(B)]``: one flat gather for
  all attributes of all clusters.

A cluster is stored as four rows (min x', max x', min A, max B) in preallocated arrays, so the loss of
adding a record to *every* open cluster is a handful of numpy calls (no loop over clusters/attributes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.core.intervals import format_interval
from stream_anon.core.schema import Attribute, Schema


class QIEncoder:
    """Encodes records' QIs for the engine and turns cluster boxes back into released strings.

    ``score`` selects the loss table used for cluster choice: ``"gt"`` / ``"lm"`` (l_a = (leaves - 1)/(M - 1))
    or ``"ubdsa"`` (CAIL: leaves/M for a generalized value, 0 for a leaf).  Released losses always use l_a.
    """

    def __init__(self, schema: Schema, score: str = "gt"):
        self.schema = schema
        self.numeric: list[Attribute] = schema.numeric_qis
        self.categorical: list[Attribute] = schema.categorical_qis
        self.jn = len(self.numeric)
        self.jc = len(self.categorical)
        self.j = self.jn + self.jc
        if self.j == 0:
            raise ValueError("schema has no quasi-identifier; the engine needs at least one")
        self.names = [a.name for a in self.numeric] + [a.name for a in self.categorical]
        self.num_lo = np.array([float(a.lo) for a in self.numeric], dtype=np.float64)  # type: ignore[arg-type]
        self.num_hi = np.array([float(a.hi) for a in self.numeric], dtype=np.float64)  # type: ignore[arg-type]
        self.num_inv_range = 1.0 / (self.num_hi - self.num_lo) if self.jn else np.zeros(0)
        self.hierarchies = [a.hierarchy for a in self.categorical]
        self.m = np.array([h.n_leaves for h in self.hierarchies], dtype=np.int64)  # type: ignore[union-attr]
        sizes = self.m * self.m
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) if self.jc else np.zeros(0, np.int64)
        gt = [h.gt_loss_table().ravel() for h in self.hierarchies]  # type: ignore[union-attr]
        cail = [h.cail_table().ravel() for h in self.hierarchies]  # type: ignore[union-attr]
        self.gt_table = np.concatenate(gt).astype(np.float64) if self.jc else np.zeros(1)
        self.cail_table = np.concatenate(cail).astype(np.float64) if self.jc else np.zeros(1)
        self.score_table = self.cail_table if score == "ubdsa" else self.gt_table
        self.leaf_index = [h.leaf_index for h in self.hierarchies]  # type: ignore[union-attr]
        self.ones_n = np.ones(self.jn)
        self.ones_c = np.ones(self.jc)

    # ------------------------------------------------------------------ encoding
    def encode(self, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """One record -> (float row ``[x' (Jn), x (Jn)]``, int row ``[A (Jc), B (Jc)]``)."""
        raw = [float(record[a.name]) for a in self.numeric]
        leaves = [idx[record[a.name]] for idx, a in zip(self.leaf_index, self.categorical, strict=True)]
        f = np.empty(2 * self.jn)
        f[self.jn:] = raw
        f[: self.jn] = (f[self.jn:] - self.num_lo) * self.num_inv_range
        b = np.array(leaves, dtype=np.int64)
        i = np.concatenate([self.offsets + b * self.m, b]) if self.jc else np.zeros(0, np.int64)
        return f, i

    def encode_many(self, columns: Mapping[str, Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Column-wise encoding of many validated records: ``(n, 2 Jn)`` float64 and ``(n, 2 Jc)`` int64."""
        raw, leaves = self.schema.encode_qis_many(columns)
        n = raw.shape[0]
        f = np.empty((n, 2 * self.jn))
        f[:, self.jn:] = raw
        f[:, : self.jn] = (raw - self.num_lo) * self.num_inv_range
        i = np.empty((n, 2 * self.jc), dtype=np.int64)
        i[:, : self.jc] = self.offsets + leaves * self.m
        i[:, self.jc:] = leaves
        return f, i

    # ------------------------------------------------------------------ boxes
    def box_of(self, frows: np.ndarray, irows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Raw numeric (lo, hi) and leaf (lo, hi) of a set of encoded rows."""
        jn, jc = self.jn, self.jc
        raw = frows[:, jn:]
        leaves = irows[:, jc:]
        return raw.min(axis=0), raw.max(axis=0), leaves.min(axis=0), leaves.max(axis=0)

    def losses_of_box(self, nlo: np.ndarray, nhi: np.ndarray, clo: np.ndarray, chi: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Per-attribute l_a (numeric then categorical) and the scoring-loss per attribute of one box."""
        num = (nhi - nlo) * self.num_inv_range
        idx = self.offsets + clo * self.m + chi
        gt = np.concatenate([num, self.gt_table[idx]]) if self.jc else num
        sc = np.concatenate([num, self.score_table[idx]]) if self.jc else num
        return gt, sc

    def labels_of_box(self, nlo: np.ndarray, nhi: np.ndarray, clo: np.ndarray, chi: np.ndarray) -> dict[str, str]:
        """The released strings: ``"[lo-hi]"`` per numeric QI, the LCA label per categorical QI."""
        out: dict[str, str] = {}
        for j, a in enumerate(self.numeric):
            lo, hi = float(nlo[j]), float(nhi[j])
            if a.integer:
                out[a.name] = format_interval(int(lo), int(hi))
            else:
                out[a.name] = format_interval(lo, hi)
        for j, a in enumerate(self.categorical):
            out[a.name] = a.hierarchy.label_of_range(int(clo[j]), int(chi[j]))  # type: ignore[union-attr]
        return out

    def node_range(self, clo: np.ndarray, chi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Leaf range covered by the released LCA node (what a reuse must be covered by), per categorical QI."""
        lo = np.empty(self.jc, dtype=np.int64)
        hi = np.empty(self.jc, dtype=np.int64)
        for j, h in enumerate(self.hierarchies):
            node = h.lca[int(clo[j]), int(chi[j])]  # type: ignore[union-attr]
            lo[j] = h.node_leaf_lo[node]  # type: ignore[union-attr]
            hi[j] = h.node_leaf_hi[node]  # type: ignore[union-attr]
        return lo, hi

    def pair_loss(self, f: np.ndarray, i: np.ndarray, frows: np.ndarray, irows: np.ndarray) -> np.ndarray:
        """Scoring loss sum of the 2-record box {t, r} for every row r (distance used by the KNN split)."""
        jn, jc = self.jn, self.jc
        out = np.abs(frows[:, :jn] - f[:jn]) @ self.ones_n if jn else np.zeros(len(frows))
        if jc:
            idx = np.minimum(irows[:, :jc], i[:jc]) + np.maximum(irows[:, jc:], i[jc:])
            out = out + self.score_table.take(idx) @ self.ones_c
        return out

    def box_score(self, xlo: np.ndarray, xhi: np.ndarray, alo: np.ndarray, bhi: np.ndarray) -> np.ndarray:
        """Scoring loss sum of boxes given as rows (scaled numeric lo/hi, A-min, B-max); any leading shape."""
        out = (xhi - xlo) @ self.ones_n if self.jn else np.zeros(xlo.shape[:-1])
        if self.jc:
            out = out + self.score_table.take(alo + bhi) @ self.ones_c
        return out


class ClusterStore:
    """Gamma: at most ``capacity`` open clusters in preallocated arrays.

    Per cluster c: ``xlo/xhi`` (min/max scaled numeric), ``alo/bhi`` (min A / max B), ``lsum`` (scoring loss
    summed over QIs), ``n`` (records), ``size`` (distinct individuals), ``oldest`` (earliest arrival position),
    ``members`` (ring slots).  ``wnew`` and ``base`` make the enlargement one expression,
    ``E = wnew * lsum(C + t) - base``: for the size-weighted form (GT, CAIL) ``wnew = n + 1, base = n * lsum``;
    for CASTLE's form (LM) ``wnew = 1, base = lsum``.  Free slots have ``base = -inf`` so E = +inf there.
    """

    def __init__(self, capacity: int, enc: QIEncoder, weighted: bool):
        self.capacity = capacity
        self.weighted = weighted
        jn, jc = enc.jn, enc.jc
        self.xlo = np.zeros((capacity, jn))
        self.xhi = np.zeros((capacity, jn))
        self.alo = np.tile(enc.offsets, (capacity, 1)).astype(np.int64) if jc else np.zeros((capacity, 0), np.int64)
        self.bhi = np.zeros((capacity, jc), dtype=np.int64)
        self.lsum = np.zeros(capacity)
        self.n = np.zeros(capacity, dtype=np.int64)
        self.size = np.zeros(capacity, dtype=np.int64)
        self.oldest = np.zeros(capacity, dtype=np.int64)
        self.wnew = np.ones(capacity)
        self.base = np.full(capacity, -np.inf)
        self.active = np.zeros(capacity, dtype=bool)
        self.members: list[list[int]] = [[] for _ in range(capacity)]
        self.pids: list[dict[Any, int]] = [{} for _ in range(capacity)]
        self.sens: list[dict[Any, int]] = [{} for _ in range(capacity)]
        self.free: list[int] = list(range(capacity - 1, -1, -1))
        self.n_active = 0

    def set_weights(self, c: int) -> None:
        n = int(self.n[c])
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
        self.base[c] = -np.inf
        self.wnew[c] = 1.0
        self.n[c] = 0
        self.size[c] = 0
        self.lsum[c] = 0.0
        self.members[c] = []
        self.pids[c] = {}
        self.sens[c] = {}
        self.free.append(c)
        self.n_active -= 1


class OmegaStore:
    """Omega: released clusters kept for reuse, bounded to the ``zeta`` most recent (ring) and ``max_age`` arrivals.

    Cover test of a record against all kept clusters is one vectorized expression over raw numeric bounds
    and leaf-index bounds.
    """

    def __init__(self, zeta: int, jn: int, jc: int, max_age: int | None):
        self.zeta = zeta
        self.max_age = max_age
        cap = max(zeta, 1)
        self.nlo = np.zeros((cap, jn))
        self.nhi = np.zeros((cap, jn))
        self.clo = np.zeros((cap, jc), dtype=np.int64)
        self.chi = np.zeros((cap, jc), dtype=np.int64)
        self.valid = np.zeros(cap, dtype=bool)
        self.pos = np.zeros(cap, dtype=np.int64)
        self.meta: list[tuple[str, dict[str, str], float, int] | None] = [None] * cap
        self.next = 0
        self.count = 0

    def add(self, nlo: np.ndarray, nhi: np.ndarray, clo: np.ndarray, chi: np.ndarray, pos: int,
            meta: tuple[str, dict[str, str], float, int]) -> None:
        if self.zeta == 0:
            return
        i = self.next
        self.nlo[i] = nlo
        self.nhi[i] = nhi
        self.clo[i] = clo
        self.chi[i] = chi
        self.pos[i] = pos
        if not self.valid[i]:
            self.count += 1
        self.valid[i] = True
        self.meta[i] = meta
        self.next = (i + 1) % self.zeta

    def covering(self, raw: np.ndarray, leaves: np.ndarray, now_pos: int) -> np.ndarray:
        """Indices of kept clusters whose generalization covers the record (raw numeric, leaf indices)."""
        if self.count == 0:
            return np.zeros(0, dtype=np.int64)
        ok = self.valid.copy()
        if self.max_age is not None:
            ok &= self.pos >= now_pos - self.max_age
        if raw.size:
            ok &= (self.nlo <= raw).all(axis=1) & (raw <= self.nhi).all(axis=1)
        if leaves.size:
            ok &= (self.clo <= leaves).all(axis=1) & (leaves <= self.chi).all(axis=1)
        return np.flatnonzero(ok)
