"""CASTLE's split of a large cluster into classes of >= k individuals (docs/castle.md, "Split").

``split`` (KNN) for k-anonymity, ``split_l`` for the l-diversity extension. Records are grouped into *units*,
one per individual (all records of one person id; one record each without a person id); a unit always moves
as a whole, so an individual is never spread over two classes. Distances are the scoring loss of the union
box of two records, computed for many candidates in one vectorized expression.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_anon.core.engine.clusters import QIEncoder


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
    """Splits a cluster given as ring slots into groups of >= k individuals (and >= l sensitive values).

    ``vectors`` is the engine's ring of record vectors, ``person_of`` / ``value_of`` its per-slot person id and
    sensitive value (read when ``persons`` / ``l`` are set); the splitter only reads them.
    """

    def __init__(self, enc: QIEncoder, vectors: np.ndarray, *, k: int, l: int | None,  # noqa: E741
                 persons: bool, person_of: list[Any], value_of: list[Any], draws: BlockDraws):
        self.enc = enc
        self.V = vectors
        self.k = k
        self.l = l
        self.persons = persons
        self.person_of = person_of
        self.value_of = value_of
        self.draws = draws

    def split(self, members: Sequence[int]) -> list[list[int]]:
        """KNN split (or split_l with l-diversity); a split with a part below k (or l) is not applied."""
        units = self._units(members)
        groups = self._split_l(units, self.l) if self.l is not None else self._split_knn(units)
        if len(groups) < 2 or not all(self._group_ok(g) for g in groups):
            return [list(members)]
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
        return self.l is None or len({self.value_of[s] for s in grp}) >= self.l

    def _reps(self, units: Sequence[list[int]]) -> np.ndarray:
        """One random record per unit (the unit's representative for distances)."""
        below = self.draws.below
        return np.fromiter((u[0] if len(u) == 1 else u[below(len(u))] for u in units),
                           dtype=np.int64, count=len(units))

    def _nearest(self, units: Sequence[list[int]], t: int, n: int) -> list[int]:
        """Indices of the ``n`` units nearest to record ``t`` (stable order by distance; units represented by
        a random record each)."""
        d = self.enc.score_rows(np.minimum(self.V[self._reps(units)], self.V[t]))
        return np.argsort(d, kind="stable")[:n].tolist()

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
