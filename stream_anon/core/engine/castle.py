"""The delay-bounded k-anonymity engine: CASTLE (Cao, Carminati, Ferrari, Tan, IEEE TDSC 8(3), 2011).

Per arriving record t at position p (see /work/shared/docs/castle.md and docs/engine.md)::

    C = best_selection(t); C is None -> new cluster {t} else C += t
    if the record at position p - delta is still buffered: delay_constraint(it)

best_selection: minimum enlargement over all open clusters (one vectorized expression); among the
minimal ones those with loss(C + t) <= tau; none -> a new cluster while |Gamma| < beta, else a minimal one.
delay_constraint(t): release t's cluster if k-anonymous; else reuse a released cluster of Omega covering
t (random choice); else suppress t when more than half of Gamma is larger than t's cluster or Gamma holds
fewer than k distinct individuals; else merge t's cluster with its nearest clusters and release it.
output_cluster: KNN split when the cluster holds >= 2k individuals; tau = mean loss of the mu most recent
released clusters; a released cluster with loss < tau joins Omega (bounded by zeta / max_age).

Additions (all documented in docs/engine.md): leftover policy, l-diversity (castle.md's extension),
adaptive delay, wall-clock bound, UBDSA-style policy (:mod:`stream_anon.core.engine.policies`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.core.engine.clusters import ClusterStore, OmegaStore, QIEncoder
from stream_anon.core.engine.config import EngineConfig, EngineConfigError
from stream_anon.core.engine.policies import Policy
from stream_anon.core.engine.release import Release
from stream_anon.core.schema import Schema

_FREE = -1
_LEFTOVER = -2


class _Work:
    """Preallocated scratch arrays of the hot path (no allocation per record)."""

    def __init__(self, cap: int, width: int, jc: int):
        self.union = np.empty((cap, width))
        self.r = np.empty((cap, 1 + jc))


class Engine:
    """Streaming k-anonymizer with a bounded delay.

    ``push(record, now)`` returns the releases that this arrival triggered; ``flush()`` releases or
    suppresses everything still buffered (end of stream).  Every record is accounted for exactly once:
    ``records_in == records_released + records_suppressed + buffered_records``.
    """

    def __init__(self, schema: Schema, config: EngineConfig, *, rng: np.random.Generator | None = None,
                 class_id_prefix: str = ""):
        self.schema = schema
        self.config = config
        self.policy = Policy.from_config(config)
        self.enc = QIEncoder(schema, score=config.loss)
        self.rng = rng if rng is not None else (
            np.random.default_rng(config.seed) if config.seed is not None
            else np.random.default_rng(np.random.SeedSequence()))
        self.class_id_prefix = class_id_prefix
        self.k = config.k
        self.l = config.l
        self.sensitive: str | None = schema.sensitive[0].name if schema.sensitive else None
        if config.l is not None and config.l > 1:
            if self.sensitive is None:
                raise EngineConfigError("l", "used only with a sensitive attribute in the schema", config.l)
            dom = schema.sensitive[0].domain_values
            if dom and config.l > len(dom):
                raise EngineConfigError("l", f"an integer in [1, {len(dom)}] (distinct values of "
                                        f"{self.sensitive!r})", config.l)
        self.use_l = config.l is not None and config.l > 1
        self.person_id = schema.person_id
        self.record_id = schema.record_id or "id"
        self.delta = config.delta
        self.delta_eff = config.delta
        self.delta_min = config.effective_delta_min
        self.leftover_policy = config.leftover == "leftover"
        self.delta_leftover = config.effective_delta_leftover
        # ring of buffered records, indexed by arrival position % R
        extra = self.delta_leftover if self.leftover_policy else 0
        self.ring = config.delta + extra + 2
        self.j = self.enc.j
        self.V = np.zeros((self.ring, self.enc.width))  # layout vectors of buffered records (by ring slot)
        self.slot_cluster: list[int] = [_FREE] * self.ring  # cluster id, _FREE or _LEFTOVER
        self.slot_pos: list[int] = [-1] * self.ring  # arrival position of the record in the slot
        self.slot_record: list[Mapping[str, Any] | None] = [None] * self.ring
        self.slot_time: list[float] = [0.0] * self.ring
        self.slot_pid: list[Any] = [None] * self.ring
        self.slot_sens: list[Any] = [None] * self.ring
        self.gamma = ClusterStore(config.beta + 1, self.enc.width, weighted=config.loss != "lm")
        self.omega = OmegaStore(config.zeta, self.enc.width, config.max_age)
        self.p = -1  # position of the latest arrival
        self.next_expire = 0  # every position below this has been handled by the delay check
        self.n_buffered = 0
        self.gamma_records = 0
        self.gamma_pids: dict[Any, int] = {}
        self.gamma_sens: dict[Any, int] = {}
        self.recent_losses: deque[float] = deque(maxlen=config.mu)
        self.tau = 0.0
        self.tau_sum = 0.0  # tau * J (losses are summed over QIs internally)
        self._recent_sum = 0.0  # running sum of recent_losses
        self.leftover: deque[tuple[int, int]] = deque()  # (slot, deadline position)
        self.leftover_pids: dict[Any, int] = {}
        self.leftover_sens: dict[Any, int] = {}
        self.n_classes = 0
        self.n_suppressed_ids = 0
        self.records_in = 0
        self.records_released = 0
        self.records_suppressed = 0
        self.max_buffered = 0
        self.recent_keys: deque[tuple[str, ...]] = deque(maxlen=config.mu)
        self.recent_value_counts: list[dict[str, int]] = [{} for _ in range(self.enc.j)]
        self._out: list[Release] = []
        self._now = 0.0
        self._age_coef = np.zeros(self.gamma.capacity)
        self._age_weight = self.policy.age_weight
        self._early_release = self.policy.early_release
        self._max_seconds = config.max_delay_seconds
        self._plain = self.person_id is None and not self.use_l and self.policy.age_weight == 0.0
        self._release_slack = self.policy.release_slack
        self._beta = config.beta
        self._score_table = self.enc.score_table
        self._q = self.enc.q
        self._ones_c = self.enc.ones_c
        self._jc = self.enc.jc
        self._work = _Work(self.gamma.capacity, self.enc.width, self.enc.jc)
        self._rand_buf: list[float] = []
        self._rand_i = 0

    # ================================================================== public API
    @property
    def buffered_records(self) -> int:
        return self.n_buffered

    @property
    def open_clusters(self) -> int:
        return self.gamma.n_active

    def buffered_ids(self) -> list[Any]:
        """Ids of the records still buffered (in open clusters or the leftover cluster), in arrival order."""
        out = []
        for pos in range(max(0, self.p - self.ring + 1), self.p + 1):
            s = pos % self.ring
            if self.slot_pos[s] == pos and self.slot_cluster[s] != _FREE:
                rec = self.slot_record[s]
                out.append(rec[self.record_id] if rec is not None else None)
        return out

    def encode_many(self, columns: Mapping[str, Sequence[Any]]) -> np.ndarray:
        """Bulk encoding for :meth:`push_encoded` (offline use): one ``(n, 2J)`` row per record."""
        return self.enc.encode_many(columns)

    def push(self, record: Mapping[str, Any], now: float | None = None) -> list[Release]:
        """Process one validated record (``schema.validate``); return the releases it triggered."""
        return self.push_encoded(record, self.enc.encode(record), now)

    def push_encoded(self, record: Mapping[str, Any], v: np.ndarray, now: float | None = None) -> list[Release]:
        """As :meth:`push` with the QI encoding precomputed by :meth:`encode_many`."""
        out: list[Release] = []
        self._out = out
        self._now = now = time.time() if now is None else float(now)
        self.p = p = self.p + 1
        self.records_in += 1
        ring = self.ring
        s = p % ring
        slot_cluster = self.slot_cluster
        if slot_cluster[s] != _FREE:  # cannot happen: the ring spans the longest possible wait
            raise RuntimeError("engine ring overflow")
        self.V[s] = v
        slot_pos = self.slot_pos
        slot_pos[s] = p
        self.slot_record[s] = record
        self.slot_time[s] = now
        if self.person_id is not None:
            self.slot_pid[s] = record[self.person_id]
        if self.use_l:
            self.slot_sens[s] = record[self.sensitive]  # type: ignore[index]
        self.n_buffered = nb = self.n_buffered + 1
        if nb > self.max_buffered:
            self.max_buffered = nb
        c = self._best_selection(s, v)
        if c < 0:
            self._new_cluster(s)
        elif self._early_release and self._releasable(c):
            g = self.gamma
            age = (p - int(g.oldest[c])) / self.delta_eff
            if g.lsum[c] <= self.tau_sum * (1.0 + self._release_slack * age):
                self._output_cluster(c)
        # delay constraint (position based), then the optional wall-clock bound
        limit = p - self.delta_eff
        q = self.next_expire
        while q <= limit:
            self.next_expire = q + 1
            sq = q % ring
            if slot_pos[sq] == q and slot_cluster[sq] >= 0:
                self._delay_constraint(sq)
            q = self.next_expire
        if self._max_seconds is not None:
            self._expire_seconds(now)
        if self.leftover and self.leftover[0][1] <= p:
            self._leftover_deadline()
        return out

    def expire(self, now: float) -> list[Release]:
        """Apply the wall-clock bound without an arrival (for an idle stream); no-op without max_delay_seconds."""
        out: list[Release] = []
        self._out = out
        self._now = float(now)
        if self.config.max_delay_seconds is not None:
            self._expire_seconds(float(now))
        return out

    def flush(self, now: float | None = None) -> list[Release]:
        """End of stream: every buffered record is released (delay_constraint in arrival order) or suppressed."""
        out: list[Release] = []
        self._out = out
        self._now = time.time() if now is None else float(now)
        ring = self.ring
        while self.next_expire <= self.p:
            q = self.next_expire
            self.next_expire = q + 1
            sq = q % ring
            if self.slot_pos[sq] == q and self.slot_cluster[sq] >= 0:
                self._delay_constraint(sq)
        if self.leftover:
            self._leftover_flush()
        return out

    # ================================================================== CASTLE steps
    def _best_selection(self, s: int, v: np.ndarray) -> int:
        """Choose t's cluster by minimum enlargement and add t to it; -1 means: open a new cluster.

        For every open cluster at once: U = min(box, v) (the union box), L(C + t) = score(U) (one matmul, one
        gather), E = wnew * L(C + t) - base (see ClusterStore).  SetCmin = argmin E; a member with
        L(C + t) <= tau is taken; if none: a new cluster while |Gamma| < beta, else a minimal one.
        """
        g = self.gamma
        if g.n_active == 0:
            return -1
        w = self._work
        u = np.minimum(g.box, v, out=w.union)
        r = np.matmul(u, self._q, out=w.r)
        if self._jc:
            ls = self._score_table.take(r[:, 1:].astype(np.intp)) @ self._ones_c
            ls += r[:, 0]
        else:
            ls = r[:, 0].copy()
        e = g.wnew * ls
        e -= g.base
        if self._age_weight > 0.0:
            e -= (self.p - g.oldest) * self._age_coef
        c = int(e.argmin())
        tau = self.tau_sum
        lc = float(ls[c])
        if lc > tau:
            ties = e == e[c]
            if np.count_nonzero(ties) > 1:
                ok = np.flatnonzero(ties & (ls <= tau))
                if len(ok):
                    c = int(ok[0])
                    lc = float(ls[c])
                elif g.n_active < self._beta:
                    return -1
            elif g.n_active < self._beta:
                return -1
        g.box[c] = u[c]
        g.lsum[c] = lc
        if self._plain:  # no person id, no l-diversity, no age pressure: the bookkeeping of _attach, inlined
            g.members[c].append(s)
            n = g.n[c] + 1
            g.n[c] = n
            g.size[c] = n
            self.slot_cluster[s] = c
            self.gamma_records += 1
            if g.weighted:
                g.wnew[c] = n + 1
                g.base[c] = n * lc
            else:
                g.base[c] = lc
        else:
            self._attach(c, s)
        return c

    def _attach(self, c: int, s: int) -> None:
        """Bookkeeping of t joining cluster c (bounds already updated)."""
        g = self.gamma
        g.members[c].append(s)
        g.n[c] += 1
        self.slot_cluster[s] = c
        self.gamma_records += 1
        if self.person_id is not None:
            pid = self.slot_pid[s]
            d = g.pids[c]
            d[pid] = d.get(pid, 0) + 1
            g.size[c] = len(d)
            self.gamma_pids[pid] = self.gamma_pids.get(pid, 0) + 1
        else:
            g.size[c] += 1
        if self.use_l:
            v = self.slot_sens[s]
            d = g.sens[c]
            d[v] = d.get(v, 0) + 1
            self.gamma_sens[v] = self.gamma_sens.get(v, 0) + 1
        g.set_weights(c)
        if self.policy.age_weight > 0.0:
            self._set_age_coef(c)

    def _new_cluster(self, s: int) -> int:
        g = self.gamma
        c = g.allocate()
        g.box[c] = self.V[s]
        g.lsum[c] = 0.0
        g.oldest[c] = self.slot_pos[s]
        self._attach(c, s)
        return c

    def _set_age_coef(self, c: int) -> None:
        g = self.gamma
        below_k = g.active[c] and not self._releasable(c)
        self._age_coef[c] = self.policy.age_weight * self.j / self.delta_eff if below_k else 0.0

    def _releasable(self, c: int) -> bool:
        g = self.gamma
        if g.size[c] < self.k:
            return False
        return not self.use_l or len(g.sens[c]) >= self.l  # type: ignore[operator]

    def _delay_constraint(self, s: int) -> None:
        """CASTLE's delay_constraint for the expiring record in slot s."""
        g = self.gamma
        c = self.slot_cluster[s]
        if self._releasable(c):
            self._output_cluster(c)
            return
        if self._try_reuse(s):
            return
        own = g.size[c]
        m = sum(1 for x in g.size if x > own)  # free slots have size 0
        distinct = len(self.gamma_pids) if self.person_id is not None else self.gamma_records
        if (m > g.n_active / 2 or distinct < self.k
                or (self.use_l and len(self.gamma_sens) < self.l)):  # type: ignore[operator]
            self._detach(s)
            self._dispose(s)
            return
        c = self._merge(c)
        self._output_cluster(c)

    def _try_reuse(self, s: int, leftover: bool = False) -> bool:
        """Release t under the generalization of a random kept cluster covering it (CASTLE's Omega reuse)."""
        om = self.omega
        if om.count == 0:
            return False
        cover = om.covering(self.V[s], self.p)
        if len(cover) == 0:
            return False
        i = int(cover[0]) if len(cover) == 1 else int(cover[self._randint(len(cover))])
        meta = om.meta[i]
        assert meta is not None
        class_id, generalized, loss, size = meta
        if not leftover:
            self._detach(s)
        self._out.append(Release(
            class_id=class_id, kind="class", generalized=dict(generalized),
            record_ids=(self._rid(s),), records=(self.slot_record[s],),  # type: ignore[arg-type]
            delays=(self.p - self.slot_pos[s],), delays_seconds=(self._now - self.slot_time[s],),
            loss=loss, size=size, reused=True, leftover=leftover))
        self.records_released += 1
        self._free_slot(s)
        return True

    def _rid(self, s: int) -> Any:
        rec = self.slot_record[s]
        assert rec is not None
        return rec.get(self.record_id, self.slot_pos[s])

    def _detach(self, s: int) -> None:
        """Remove record s from its open cluster, recomputing the cluster's bounds."""
        g = self.gamma
        c = self.slot_cluster[s]
        g.members[c].remove(s)
        g.n[c] -= 1
        self.slot_cluster[s] = _FREE
        self.gamma_records -= 1
        if self.person_id is not None:
            pid = self.slot_pid[s]
            d = g.pids[c]
            d[pid] -= 1
            if d[pid] == 0:
                del d[pid]
            g.size[c] = len(d)
            self.gamma_pids[pid] -= 1
            if self.gamma_pids[pid] == 0:
                del self.gamma_pids[pid]
        else:
            g.size[c] -= 1
        if self.use_l:
            v = self.slot_sens[s]
            d = g.sens[c]
            d[v] -= 1
            if d[v] == 0:
                del d[v]
            self.gamma_sens[v] -= 1
            if self.gamma_sens[v] == 0:
                del self.gamma_sens[v]
        if not g.members[c]:
            g.release(c)
            return
        self._recompute(c)

    def _recompute(self, c: int) -> None:
        g = self.gamma
        idx = np.array(g.members[c])
        g.box[c] = self.V[idx].min(axis=0)
        g.lsum[c] = float(self.enc.score_rows(g.box[c]))
        g.oldest[c] = min(self.slot_pos[t] for t in g.members[c])
        g.set_weights(c)
        if self.policy.age_weight > 0.0:
            self._set_age_coef(c)

    def _dispose(self, s: int) -> None:
        """A record CASTLE would suppress: suppress it, or (leftover policy) move it to the leftover cluster."""
        if self.leftover_policy:
            self.slot_cluster[s] = _LEFTOVER
            self.leftover.append((s, self.p + self.delta_leftover))
            if self.person_id is not None:
                pid = self.slot_pid[s]
                self.leftover_pids[pid] = self.leftover_pids.get(pid, 0) + 1
            if self.use_l:
                v = self.slot_sens[s]
                self.leftover_sens[v] = self.leftover_sens.get(v, 0) + 1
            return
        self._suppress(s, leftover=False)

    def _suppress(self, s: int, leftover: bool) -> None:
        self.n_suppressed_ids += 1
        self._out.append(Release(
            class_id=f"{self.class_id_prefix}s{self.n_suppressed_ids}", kind="suppressed", generalized={},
            record_ids=(self._rid(s),), records=(self.slot_record[s],),  # type: ignore[arg-type]
            delays=(self.p - self.slot_pos[s],), delays_seconds=(self._now - self.slot_time[s],),
            loss=1.0, size=1, reused=False, leftover=leftover))
        self.records_suppressed += 1
        self._free_slot(s)

    def _free_slot(self, s: int) -> None:
        self.slot_cluster[s] = _FREE
        self.slot_record[s] = None
        self.n_buffered -= 1

    def _merge(self, c: int) -> int:
        """merge_clusters: absorb the open cluster of minimum enlargement until c is releasable.

        Enlargement of C by C': size-weighted form (|C| + |C'|) L(C u C') - |C| L(C) - |C'| L(C'), CASTLE's form
        L(C u C') - L(C); the union boxes of C with every open cluster are one ``minimum``.
        """
        g = self.gamma
        enc = self.enc
        while not self._releasable(c):
            u = np.minimum(g.box, g.box[c])
            ls = enc.score_rows(u)
            if g.weighted:  # wnew - 1 = |C'| and base = |C'| L(C') on open clusters; base = -inf on free ones
                e = (g.wnew + (g.n[c] - 1)) * ls - g.base - g.base[c]
            else:
                e = ls - g.lsum[c]
            e[~g.active] = np.inf
            e[c] = np.inf
            d = int(e.argmin())
            if not np.isfinite(e[d]):  # cannot happen: delay_constraint checked Gamma holds enough
                raise RuntimeError("merge_clusters: no cluster left to merge")
            g.box[c] = u[d]
            g.lsum[c] = ls[d]
            for sd in g.members[d]:
                self.slot_cluster[sd] = c
            g.members[c].extend(g.members[d])
            g.n[c] += g.n[d]
            g.oldest[c] = min(int(g.oldest[c]), int(g.oldest[d]))
            if self.person_id is not None:
                dc = g.pids[c]
                for pid, cnt in g.pids[d].items():
                    dc[pid] = dc.get(pid, 0) + cnt
                g.size[c] = len(dc)
            else:
                g.size[c] += g.size[d]
            if self.use_l:
                sc = g.sens[c]
                for v, cnt in g.sens[d].items():
                    sc[v] = sc.get(v, 0) + cnt
            g.release(d)
            g.set_weights(c)
        return c

    # ================================================================== output
    def _output_cluster(self, c: int) -> None:
        """output_cluster: split when >= 2k individuals, release each part, update tau and Omega."""
        g = self.gamma
        members = g.members[c]
        groups = self._split(members) if g.size[c] >= 2 * self.k else [members]
        n = len(members)
        self.gamma_records -= n
        if self.person_id is not None:
            for pid, cnt in g.pids[c].items():
                left = self.gamma_pids[pid] - cnt
                if left:
                    self.gamma_pids[pid] = left
                else:
                    del self.gamma_pids[pid]
        if self.use_l:
            for v, cnt in g.sens[c].items():
                left = self.gamma_sens[v] - cnt
                if left:
                    self.gamma_sens[v] = left
                else:
                    del self.gamma_sens[v]
        g.release(c)
        for grp in groups:
            self._release_group(grp, castle=True, leftover=False)

    def _release_group(self, grp: Sequence[int], castle: bool, leftover: bool) -> None:
        """Emit one equivalence class; with ``castle`` also update tau, Omega and the adaptive delay."""
        idx = np.fromiter(grp, dtype=np.int64, count=len(grp))
        enc = self.enc
        box = self.V[idx].min(axis=0)
        generalized, loss, score, nodes = enc.describe(box)
        self.n_classes += 1
        class_id = f"{self.class_id_prefix}c{self.n_classes}"
        if self.person_id is not None:
            size = len({self.slot_pid[s] for s in grp})
        else:
            size = len(grp)
        p, now = self.p, self._now
        sp, sr, st, sc = self.slot_pos, self.slot_record, self.slot_time, self.slot_cluster
        records = tuple(sr[s] for s in grp)
        rid = self.record_id
        rel = Release(
            class_id=class_id, kind="class", generalized=generalized,
            record_ids=tuple(r[rid] for r in records),  # type: ignore[index]
            records=records,  # type: ignore[arg-type]
            delays=tuple(p - sp[s] for s in grp),
            delays_seconds=tuple(now - st[s] for s in grp),
            loss=loss, size=size, reused=False, leftover=leftover)
        self._out.append(rel)
        n = len(grp)
        self.records_released += n
        self.n_buffered -= n
        for s in grp:
            sc[s] = _FREE
            sr[s] = None
        if not castle:
            return
        rl = self.recent_losses
        if len(rl) == rl.maxlen:
            self._recent_sum -= rl[0]
        rl.append(score)
        self._recent_sum += score
        if self.n_classes % 4096 == 0:  # re-sum now and then: no drift of the running sum on endless streams
            self._recent_sum = sum(rl)
        self.tau_sum = self._recent_sum / len(rl)
        self.tau = self.tau_sum / self.j
        if score < self.tau_sum:
            self.omega.add(enc.cover_of(box, nodes), p, (class_id, dict(generalized), loss, size))
        if self.config.adaptive_delay:
            self._adapt_delay(tuple(generalized.values()))

    def _adapt_delay(self, key: tuple[str, ...]) -> None:
        """Adaptive delay (our documented rule; the ADULT stream paper's exact rule is not available).

        Over the last W = mu released classes, r = (1/J) sum_a D_a / W, D_a = number of distinct released
        values of QI a: the share of distinct generalized values (1: every class has its own values, a fine
        output; small: classes collapse onto the same coarse nodes).  delta_eff = delta_min + (delta - delta_min)
        * (1 - r): a coarse output gets more time to gather similar records, a fine one is released sooner.
        """
        keys, counts = self.recent_keys, self.recent_value_counts
        if len(keys) == keys.maxlen:
            old = keys[0]
            for c, v in zip(counts, old, strict=True):
                c[v] -= 1
                if c[v] == 0:
                    del c[v]
        keys.append(key)
        for c, v in zip(counts, key, strict=True):
            c[v] = c.get(v, 0) + 1
        r = sum(len(c) for c in counts) / (len(counts) * len(keys))
        self.delta_eff = int(round(self.delta_min + (self.delta - self.delta_min) * (1.0 - r)))

    # ================================================================== split
    def _units(self, members: Sequence[int]) -> list[list[int]]:
        """Buckets of a cluster's records by individual (one record each without a person id)."""
        if self.person_id is None:
            return [[s] for s in members]
        by: dict[Any, list[int]] = {}
        for s in members:
            by.setdefault(self.slot_pid[s], []).append(s)
        return list(by.values())

    def _group_ok(self, grp: Sequence[int]) -> bool:
        if self.person_id is not None:
            if len({self.slot_pid[s] for s in grp}) < self.k:
                return False
        elif len(grp) < self.k:
            return False
        return not self.use_l or len({self.slot_sens[s] for s in grp}) >= self.l  # type: ignore[operator]

    def _split(self, members: Sequence[int]) -> list[list[int]]:
        """KNN split (CASTLE) or split_l (l-diversity) into groups of >= k individuals; falls back to no split."""
        units = self._units(members)
        groups = self._split_l(units) if self.use_l else self._split_knn(units)
        if len(groups) < 2 or not all(self._group_ok(g) for g in groups):
            return [list(members)]
        return groups

    def _randint(self, n: int) -> int:
        """Uniform integer in [0, n) from the engine's generator (drawn in blocks: one numpy call per 256)."""
        if self._rand_i >= len(self._rand_buf):
            self._rand_buf = self.rng.random(256).tolist()
            self._rand_i = 0
        u = self._rand_buf[self._rand_i]
        self._rand_i += 1
        return min(int(u * n), n - 1)

    def _reps(self, units: Sequence[list[int]]) -> np.ndarray:
        """One random record per unit (the unit's representative for distances)."""
        return np.fromiter((u[0] if len(u) == 1 else u[self._randint(len(u))] for u in units),
                           dtype=np.int64, count=len(units))

    def _split_knn(self, units: list[list[int]]) -> list[list[int]]:
        """CASTLE's KNN split: while >= k units remain, a random unit seeds a group with its k-1 nearest units
        (distance: scoring loss of the 2-record box; a unit is represented by a random one of its records; a
        unit, i.e. all records of one individual, moves as a whole); the remaining < k units join the group
        they enlarge least."""
        k = self.k
        enc = self.enc
        V = self.V
        groups: list[list[int]] = []
        if all(len(u) == 1 for u in units):  # no person id: units are single records, stay in arrays
            rem = np.fromiter((u[0] for u in units), dtype=np.int64, count=len(units))
            while len(rem) >= k:
                i = self._randint(len(rem))
                t = int(rem[i])
                rem[i] = rem[-1]
                rem = rem[:-1]
                if len(rem) > k - 1:
                    d = enc.score_rows(np.minimum(V[rem], V[t]))
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
        units = list(units)
        while len(units) >= k:
            i = self._randint(len(units))
            seed_unit = units.pop(i)
            t = seed_unit[0] if len(seed_unit) == 1 else seed_unit[self._randint(len(seed_unit))]
            reps = self._reps(units)
            d = enc.score_rows(np.minimum(V[reps], V[t]))
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

    def _split_l(self, units: list[list[int]]) -> list[list[int]]:
        """split_l (castle.md): bucket units by sensitive value; each group = a random seed plus, from every
        other bucket, about max(1, k |B_j| / sum |B|) nearest units; topped up to k; while >= l buckets and >= k
        units remain; the rest go to the nearest group."""
        k, l_ = self.k, int(self.l)  # type: ignore[arg-type]
        enc = self.enc
        buckets: dict[Any, list[list[int]]] = {}
        for u in units:
            buckets.setdefault(self.slot_sens[u[0]], []).append(u)
        groups: list[list[int]] = []
        while True:
            live = [v for v, b in buckets.items() if b]
            total = sum(len(buckets[v]) for v in live)
            if len(live) < l_ or total < k:
                break
            v0 = live[self._randint(len(live))]
            b0 = buckets[v0]
            seed_unit = b0.pop(self._randint(len(b0)))
            t = seed_unit[0]
            grp = list(seed_unit)
            taken = 1
            for v in live:
                if v == v0:
                    continue
                b = buckets[v]
                want = max(1, int(round(k * len(b) / total)))
                reps = self._reps(b)
                d = enc.score_rows(np.minimum(self.V[reps], self.V[t]))
                order = np.argsort(d, kind="stable")[:want]
                chosen = set(order.tolist())
                for j in sorted(chosen):
                    grp.extend(b[j])
                taken += len(chosen)
                buckets[v] = [u for j, u in enumerate(b) if j not in chosen]
            if taken < k:  # top up with the nearest remaining units of any bucket
                pool = [(v, j) for v, b in buckets.items() for j in range(len(b))]
                if len(pool) < k - taken:
                    groups.append(grp)
                    break
                reps = self._reps([buckets[v][j] for v, j in pool])
                d = enc.score_rows(np.minimum(self.V[reps], self.V[t]))
                pick = np.argsort(d, kind="stable")[: k - taken]
                drop: dict[Any, set[int]] = {}
                for q in pick.tolist():
                    v, j = pool[q]
                    grp.extend(buckets[v][j])
                    drop.setdefault(v, set()).add(j)
                for v, js in drop.items():
                    buckets[v] = [u for j, u in enumerate(buckets[v]) if j not in js]
            groups.append(grp)
        rest = [u for b in buckets.values() for u in b]
        if groups and rest:
            self._assign_rest(groups, rest)
        return groups

    def _assign_rest(self, groups: list[list[int]], units: Sequence[list[int]]) -> None:
        """Each remaining unit joins the sub-cluster it enlarges least (size-weighted scoring loss against the
        sub-clusters as the KNN step formed them; all units x all sub-clusters in one vectorized expression)."""
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

    # ================================================================== wall clock and leftover
    def _expire_seconds(self, now: float) -> None:
        bound = now - float(self.config.max_delay_seconds)  # type: ignore[arg-type]
        ring = self.ring
        while self.next_expire <= self.p:
            q = self.next_expire
            sq = q % ring
            if self.slot_pos[sq] == q and self.slot_cluster[sq] >= 0:
                if self.slot_time[sq] > bound:
                    break
                self.next_expire = q + 1
                self._delay_constraint(sq)
            else:
                self.next_expire = q + 1

    def _leftover_releasable(self) -> bool:
        if self.person_id is not None:
            if len(self.leftover_pids) < self.k:
                return False
        elif len(self.leftover) < self.k:
            return False
        return not self.use_l or len(self.leftover_sens) >= self.l  # type: ignore[operator]

    def _release_leftover(self) -> None:
        members = [s for s, _ in self.leftover]
        self.leftover.clear()
        self.leftover_pids.clear()
        self.leftover_sens.clear()
        distinct = len({self.slot_pid[s] for s in members}) if self.person_id is not None else len(members)
        groups = self._split(members) if distinct >= 2 * self.k else [members]
        for grp in groups:
            self._release_group(grp, castle=False, leftover=True)

    def _leftover_deadline(self) -> None:
        """The oldest leftover record reached its deadline: release the leftover cluster as classes of >= k,
        else reuse or suppress the records whose deadline has passed."""
        if self._leftover_releasable():
            self._release_leftover()
            return
        while self.leftover and self.leftover[0][1] <= self.p:
            s, _ = self.leftover.popleft()
            self._leftover_forget(s)
            if not self._try_reuse(s, leftover=True):
                self._suppress(s, leftover=True)

    def _leftover_forget(self, s: int) -> None:
        if self.person_id is not None:
            pid = self.slot_pid[s]
            self.leftover_pids[pid] -= 1
            if self.leftover_pids[pid] == 0:
                del self.leftover_pids[pid]
        if self.use_l:
            v = self.slot_sens[s]
            self.leftover_sens[v] -= 1
            if self.leftover_sens[v] == 0:
                del self.leftover_sens[v]

    def _leftover_flush(self) -> None:
        if self._leftover_releasable():
            self._release_leftover()
            return
        while self.leftover:
            s, _ = self.leftover.popleft()
            self._leftover_forget(s)
            if not self._try_reuse(s, leftover=True):
                self._suppress(s, leftover=True)
