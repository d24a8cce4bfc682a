"""CASTLE's split of a large cluster into classes of >= k individuals (docs/castle.md, "Split").

``split`` (KNN) for k-anonymity, ``split_l`` under a diversity requirement (l-diversity of any model,
t-closeness: its stratified groups keep each part's sensitive distribution close to the cluster's); a part
that fails the requirement is merged into the part it enlarges least among those the union satisfies
(``_repair``). Records are grouped into *units*,
one per individual (all records of one person id; one record each without a person id); a unit always moves
as a whole, so an individual is never spread over two classes. Distances are the scoring loss of the union
box of two records, computed for many candidates in one vectorized expression.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_anon.core.engine.clusters import QIEncoder
from stream_anon.core.engine.sensitive import SensitiveCodes


class BlockDraws:
    """Uniform integers from the engine's seeded generator, drawn in blocks of 256 uniforms (one numpy call
    per block). Every random choice of the engine (split seeds, unit representatives, the Omega cluster to
    reuse) takes its number from here, in call order, so the output is identical for the same seed."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._buf: list[float] = []
        self._i = 0

    def below(self, n: int) -> int:
        """A uniform integer in [0, n)."""
        if self._i >= len(self._buf):
            self._buf = self.rng.random(256).tolist()
            self._i = 0
        u = self._buf[self._i]
        self._i += 1
        return min(int(u * n), n - 1)


class Splitter:
    """Splits a cluster given as ring slots into groups of >= k individuals (satisfying the requirement).

    ``vectors`` is the engine's ring of record vectors, ``person_of`` / ``value_of`` / ``code_of`` its per-slot
    person id, sensitive value and value code (read when ``persons`` / ``codes`` are set); the splitter only
    reads them.  ``codes``: the engine's :class:`~stream_anon.core.engine.sensitive.SensitiveCodes` (None: no
    diversity requirement).
    """

    def __init__(self, enc: QIEncoder, vectors: np.ndarray, *, k: int, persons: bool, person_of: list[Any],
                 value_of: list[Any], draws: BlockDraws, codes: SensitiveCodes | None = None,
                 code_of: list[int] | None = None):
        self.enc = enc
        self.V = vectors
        self.k = k
        self.codes = codes
        self.l_split = codes.req.min_distinct if codes is not None else None
        self.persons = persons
        self.person_of = person_of
        self.value_of = value_of
        self.code_of = code_of if code_of is not None else []
        self.draws = draws

    def split(self, members: Sequence[int]) -> list[list[int]]:
        """KNN split (split_l under a requirement); parts below k are not possible, parts that fail the
        requirement are merged into others (:meth:`_repair`); a split that leaves one part is not applied."""
        units = self._units(members)
        groups = self._split_l(units, self.l_split) if self.l_split is not None else self._split_knn(units)
        if len(groups) >= 2 and self.codes is not None:
            groups = self._repair(groups)
        if len(groups) < 2 or not all(self._group_ok(g) for g in groups):
            return [list(members)]
        return groups

    def _counts(self, grp: Sequence[int]) -> np.ndarray:
        assert self.codes is not None
        code_of = self.code_of
        return np.bincount(np.fromiter((code_of[s] for s in grp), dtype=np.intp, count=len(grp)),
                           minlength=self.codes.width).astype(np.float64)

    def _repair(self, groups: list[list[int]]) -> list[list[int]]:
        """Merge every part that fails the requirement into another: the one it enlarges least among those whose
        union with it satisfies the requirement (all unions checked at once), else the one it enlarges least.
        Ends with satisfying parts, or one part (the cluster, which satisfies it: the caller released it whole
        before)."""
        codes = self.codes
        assert codes is not None
        enc, V = self.enc, self.V
        counts = np.stack([self._counts(g) for g in groups])
        ok = codes.ok_rows(counts)
        while len(groups) > 1 and not ok.all():
            i = int(np.flatnonzero(~ok)[0])
            grp, row = groups.pop(i), counts[i]
            counts = np.delete(counts, i, axis=0)
            boxes = np.stack([V[np.array(g)].min(axis=0) for g in groups])
            n = np.array([len(g) for g in groups], dtype=np.float64)
            box = V[np.array(grp)].min(axis=0)
            e = (n + len(grp)) * enc.score_rows(np.minimum(boxes, box)) - n * enc.score_rows(boxes)
            union_ok = codes.ok_rows(counts + row)
            if union_ok.any():
                e[~union_ok] = np.inf
            j = int(e.argmin())
            groups[j] = groups[j] + grp
            counts[j] += row
            ok = codes.ok_rows(counts)
        return groups

    def _units(self, members: Sequence[int]) -> list[list[int]]:
        """Buckets of a cluster's records by individual (one record each without a person id)."""
        if not self.persons:
            return [[s] for s in members]
        by: dict[Any, list[int]] = {}
        for s in members:
            by.setdefault(self.person_of[s], []).append(s)
        return list(by.values())

    def _group_ok(self, grp: Sequence[int]) -> bool:
        if self.persons:
            if len({self.person_of[s] for s in grp}) < self.k:
                return False
        elif len(grp) < self.k:
            return False
        return self.codes is None or self.codes.ok(self._counts(grp))

    def _reps(self, units: Sequence[list[int]]) -> np.ndarray:
        """One random record per unit (the unit's representative for distances)."""
        below = self.draws.below
        return np.fromiter((u[0] if len(u) == 1 else u[below(len(u))] for u in units),
                           dtype=np.int64, count=len(units))

    def _nearest(self, units: Sequence[list[int]], t: int, n: int) -> list[int]:
        """Indices of the ``n`` units nearest to record ``t`` (stable order by distance; units represented by
        a random record each)."""
        d = self.enc.score_rows(np.minimum(self.V[self._reps(units)], self.V[t]))
        nearest: list[int] = np.argsort(d, kind="stable")[:n].tolist()
        return nearest

    def _split_knn(self, units: list[list[int]]) -> list[list[int]]:
        """CASTLE's KNN split: while >= k units remain, a random unit seeds a group with its k-1 nearest units
        (distance: scoring loss of the 2-record box; a unit is represented by a random one of its records); the
        remaining < k units join the group they enlarge least."""
        if all(len(u) == 1 for u in units):
            return self._split_knn_records(np.fromiter((u[0] for u in units), dtype=np.int64, count=len(units)))
        k = self.k
        below = self.draws.below
        groups: list[list[int]] = []
        units = list(units)
        while len(units) >= k:
            seed_unit = units.pop(below(len(units)))
            t = seed_unit[0] if len(seed_unit) == 1 else seed_unit[below(len(seed_unit))]
            d = self.enc.score_rows(np.minimum(self.V[self._reps(units)], self.V[t]))
            nn = np.argpartition(d, k - 2)[: k - 1] if len(units) > k - 1 else np.arange(len(units))
            chosen = set(nn.tolist())
            grp = list(seed_unit)
            for j in sorted(chosen):
                grp.extend(units[j])
            units = [u for j, u in enumerate(units) if j not in chosen]
            groups.append(grp)
        if groups and units:
            self._assign_rest(groups, units)
        return groups

    def _split_knn_records(self, rem: np.ndarray) -> list[list[int]]:
        """The KNN split when every unit is one record (no person id): the same steps on an array of slots."""
        k = self.k
        V = self.V
        groups: list[list[int]] = []
        while len(rem) >= k:
            i = self.draws.below(len(rem))
            t = int(rem[i])
            rem[i] = rem[-1]
            rem = rem[:-1]
            if len(rem) > k - 1:
                d = self.enc.score_rows(np.minimum(V[rem], V[t]))
                nn = np.argpartition(d, k - 2)[: k - 1]
                groups.append([t, *rem[nn].tolist()])
                keep = np.ones(len(rem), dtype=bool)
                keep[nn] = False
                rem = rem[keep]
            else:
                groups.append([t, *rem.tolist()])
                rem = rem[:0]
        if groups and len(rem):
            self._assign_rest(groups, [[int(x)] for x in rem])
        return groups

    def _split_l(self, units: list[list[int]], l_: int) -> list[list[int]]:
        """split_l: bucket units by sensitive value; each group = a random seed plus, from every other bucket,
        about max(1, k |B_j| / sum |B|) nearest units; topped up to k; while >= l buckets and >= k units
        remain; the rest go to the group they enlarge least."""
        k = self.k
        below = self.draws.below
        buckets: dict[Any, list[list[int]]] = {}
        for u in units:
            buckets.setdefault(self.value_of[u[0]], []).append(u)
        groups: list[list[int]] = []
        while True:
            live = [v for v, b in buckets.items() if b]
            total = sum(len(buckets[v]) for v in live)
            if len(live) < l_ or total < k:
                break
            v0 = live[below(len(live))]
            b0 = buckets[v0]
            seed_unit = b0.pop(below(len(b0)))
            t = seed_unit[0]
            grp = list(seed_unit)
            taken = 1
            for v in live:
                if v != v0:
                    b = buckets[v]
                    chosen = set(self._nearest(b, t, max(1, int(round(k * len(b) / total)))))
                    for j in sorted(chosen):
                        grp.extend(b[j])
                    taken += len(chosen)
                    buckets[v] = [u for j, u in enumerate(b) if j not in chosen]
            if taken < k and not self._top_up(buckets, t, k - taken, grp):
                groups.append(grp)
                break
            groups.append(grp)
        rest = [u for b in buckets.values() for u in b]
        if groups and rest:
            self._assign_rest(groups, rest)
        return groups

    def _top_up(self, buckets: dict[Any, list[list[int]]], t: int, n: int, grp: list[int]) -> bool:
        """Move the ``n`` units of any bucket nearest to ``t`` into ``grp``; False (nothing moved) if fewer
        than ``n`` units are left."""
        pool = [(v, j) for v, b in buckets.items() for j in range(len(b))]
        if len(pool) < n:
            return False
        drop: dict[Any, set[int]] = {}
        for q in self._nearest([buckets[v][j] for v, j in pool], t, n):
            v, j = pool[q]
            grp.extend(buckets[v][j])
            drop.setdefault(v, set()).add(j)
        for v, js in drop.items():
            buckets[v] = [u for j, u in enumerate(buckets[v]) if j not in js]
        return True

    def _assign_rest(self, groups: list[list[int]], units: Sequence[list[int]]) -> None:
        """Each remaining unit joins the group it enlarges least (size-weighted scoring loss against the groups
        as the seeding step formed them; all units x all groups in one vectorized expression)."""
        enc = self.enc
        V = self.V
        boxes = np.stack([V[np.array(grp)].min(axis=0) for grp in groups])  # (G, 2J)
        n = np.array([len(grp) for grp in groups], dtype=np.float64)
        ubox = np.stack([V[np.array(u)].min(axis=0) for u in units])  # (R, 2J)
        m = np.array([len(u) for u in units], dtype=np.float64)
        ls = enc.score_rows(np.minimum(ubox[:, None, :], boxes[None, :, :]))  # (R, G)
        e = (n[None, :] + m[:, None]) * ls - n[None, :] * enc.score_rows(boxes)[None, :]
        for u, gi in zip(units, e.argmin(axis=1).tolist(), strict=True):
            groups[gi].extend(u)
