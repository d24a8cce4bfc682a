"""The delay-bounded k-anonymity engine: CASTLE (Cao, Carminati, Ferrari, Tan, IEEE TDSC 8(3), 2011).

The reconstruction this module follows, with every choice it makes, is docs/castle.md. Per arriving record
t at position p::

    C = best_selection(t); C is None -> new cluster {t} else C += t
    if the record at position p - delta is still buffered: delay_constraint(it)

best_selection: minimum enlargement over all open clusters (one vectorized expression); among the
minimal ones those with loss(C + t) <= tau; none -> a new cluster while |Gamma| < beta, else a minimal one.
delay_constraint(t): release t's cluster if k-anonymous; else reuse a released cluster of Omega covering
t (random choice); else suppress t when more than half of Gamma is larger than t's cluster or Gamma holds
fewer than k distinct individuals; else merge_clusters(t's cluster) and output it.
output_cluster: split when the cluster holds >= 2k individuals (:mod:`.split`); tau = mean loss of the mu
most recent released clusters; a released cluster with loss < tau joins Omega (bounded by zeta / max_age).

The optional policies act at hooks of this loop (:mod:`.policies`, :mod:`.leftover`): the UBDSA-style policy,
the wall-clock bound, the leftover cluster and the adaptive delay.  A diversity requirement (l-diversity of
any model, t-closeness: :class:`~stream_anon.core.diversity.DiversityRequirement`) is a condition on the
sensitive-value counts of a cluster (:mod:`.sensitive`): of releasability, of Gamma as a whole in
delay_constraint, of each part of a split, of a reuse, and a preference in merge_clusters.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_anon.core.diversity import DiversityParameterError, DiversityRequirement
from stream_anon.core.engine.clusters import ClusterStore, OmegaStore, QIEncoder, ScoreScratch
from stream_anon.core.engine.config import EngineConfig, EngineConfigError
from stream_anon.core.engine.leftover import LeftoverCluster
from stream_anon.core.engine.policies import AdaptiveDelay, Policy, WallClockBound
from stream_anon.core.engine.release import Release
from stream_anon.core.engine.sensitive import SensitiveCodes, resize
from stream_anon.core.engine.split import BlockDraws, Splitter
from stream_anon.core.engine.tally import Tally
from stream_anon.core.schema import Kind, Schema

_FREE = -1  # slot_cluster of a ring slot that holds no buffered record
_LEFTOVER = -2  # slot_cluster of a record waiting in the leftover cluster


def diversity_requirement(schema: Schema, config: EngineConfig) -> DiversityRequirement | None:
    """The diversity requirement of ``config`` on the schema's (first) sensitive attribute, None when nothing is
    required (``l`` unset or <= 1 and no ``t_closeness``); checked against the attribute's domain."""
    wants_l = config.l is not None and config.l > 1
    if not wants_l and config.t_closeness is None:
        return None
    param = "l" if wants_l else "t_closeness"
    if not schema.sensitive:
        raise EngineConfigError(param, "used only with a sensitive attribute in the schema", getattr(config, param))
    sensitive = schema.sensitive[0]
    try:
        distance = DiversityRequirement.resolve_distance(config.t_distance, sensitive.kind is Kind.NUMERIC)
        req = DiversityRequirement(model=config.diversity, l=config.l if wants_l else None, c=config.c,
                                   t=config.t_closeness, distance=distance)
    except DiversityParameterError as e:
        raise EngineConfigError(e.parameter, e.allowed, e.value) from None
    dom = sensitive.domain_values
    if wants_l and dom and req.min_distinct > len(dom):
        what = "a number" if req.model == "entropy" else "an integer"
        raise EngineConfigError("l", f"{what} in [1, {len(dom)}] (distinct values of {sensitive.name!r})", config.l)
    return req


class _Work:
    """Preallocated scratch arrays of the hot path (no allocation per record)."""

    def __init__(self, cap: int, width: int, jn: int, jc: int):
        # imported here: numba's import (0.5-1 s) only in processes that run an engine
        from stream_anon.core.engine.kernels import MAX_TERMS, union_enlargements
        self.union_enlargements = union_enlargements
        self.compiled = max(jn, jc) <= MAX_TERMS  # union_enlargements (kernels.py), else numpy
        self.ls, self.e = np.empty(cap), np.empty(cap)  # each cluster's score with the arrival, its enlargement
        self.num, self.cat = np.empty(jn), np.empty(jc)
        self.union = np.empty((cap, width)) if not self.compiled else np.empty((0, width))
        self.score = ScoreScratch((cap,), jn, jc)


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
        self.sensitive: str | None = schema.sensitive[0].name if schema.sensitive else None
        self.diversity = diversity_requirement(schema, config)  # None: nothing required beyond k
        self.use_l = self.diversity is not None  # sensitive values are tracked
        self.person_id = schema.person_id
        self.record_id = schema.record_id or "id"
        self.delta = config.delta
        self.delta_eff = config.delta  # the position bound in use (< delta only with the adaptive delay)
        self.j = self.enc.j
        # the buffer: a ring of slots indexed by arrival position % ring (records wait at most delta
        # arrivals, plus delta_leftover in the leftover cluster)
        self.ring = config.delta + (config.effective_delta_leftover if config.leftover == "leftover" else 0) + 2
        self.V = np.zeros((self.ring, self.enc.width))  # layout vectors of buffered records (by ring slot)
        self.slot_cluster: list[int] = [_FREE] * self.ring  # cluster id, _FREE or _LEFTOVER
        self.slot_pos: list[int] = [-1] * self.ring  # arrival position of the record in the slot
        self.slot_record: list[Mapping[str, Any] | None] = [None] * self.ring
        self.slot_time: list[float] = [0.0] * self.ring
        self.slot_pid: list[Any] = [None] * self.ring  # person id (with a person id in the schema)
        self.slot_sens: list[Any] = [None] * self.ring  # sensitive value (with a diversity requirement)
        self.slot_code: list[int] = [0] * self.ring  # its code (sensitive.SensitiveCodes)
        persons = self.person_id is not None
        self.codes: SensitiveCodes | None = None
        if self.diversity is not None:
            attr = schema.sensitive[0]
            self.codes = SensitiveCodes(self.diversity, attr.domain_values if attr.kind is Kind.CATEGORICAL else (),
                                        every=config.effective_t_reference_every, on_grow=self._grow_codes)
        nv = self.codes.width if self.codes is not None else 0
        # Gamma (open clusters), Omega (released clusters kept for reuse), tau
        self.gamma = ClusterStore(config.beta + 1, self.enc.width, weighted=config.loss != "lm",
                                  persons=persons, values=False, n_values=nv)
        self.in_gamma = Tally(persons=persons, values=False)  # every record of Gamma
        self.gamma_values = np.zeros(nv)  # sensitive-value counts of all of Gamma (with a requirement)
        # a requirement that adding records can break: merges prefer satisfying unions, and Omega keeps each kept
        # class's counts (a reuse must keep its class satisfying)
        self._non_monotone = self.diversity is not None and not self.diversity.monotone
        self.omega = OmegaStore(config.zeta, self.enc.width, config.max_age,
                                n_values=nv if self._non_monotone else 0)
        self.recent_losses: deque[float] = deque(maxlen=config.mu)
        self.tau = 0.0
        self.tau_sum = 0.0  # tau * J (losses are summed over QIs internally)
        self._recent_sum = 0.0  # running sum of recent_losses
        self.draws = BlockDraws(self.rng)
        self.splitter = Splitter(self.enc, self.V, k=self.k, persons=persons, person_of=self.slot_pid,
                                 value_of=self.slot_sens, draws=self.draws, codes=self.codes,
                                 code_of=self.slot_code)
        # optional policies (policies.py, leftover.py)
        self.wall_clock = (WallClockBound(config.max_delay_seconds, self._expire_waiting_since)
                           if config.max_delay_seconds is not None else None)
        self.leftover = (LeftoverCluster(k=self.k, codes=self.codes,
                                         delta_leftover=config.effective_delta_leftover,
                                         persons=persons, split=self.splitter.split,
                                         release=self._release_leftover_class,
                                         reuse_or_suppress=self._reuse_or_suppress_leftover)
                         if config.leftover == "leftover" else None)
        self.adaptive = (AdaptiveDelay(config.delta, config.effective_delta_min, config.mu, self.j)
                         if config.adaptive_delay else None)
        self.p = -1  # position of the latest arrival
        self.next_expire = 0  # every position below this has been handled by the delay check
        self.n_buffered = 0
        self.n_classes = 0
        self.n_suppressed_ids = 0
        self.records_in = 0
        self.records_released = 0
        self.records_suppressed = 0
        self.max_buffered = 0
        self._out: list[Release] = []
        self._now = 0.0
        self._age_coef = np.zeros(self.gamma.capacity)
        self._age_weight = self.policy.age_weight
        self._early_release = self.policy.early_release
        self._plain = not persons and not self.use_l and not self.policy.age_pressure
        self._beta = config.beta
        self._work = _Work(self.gamma.capacity, self.enc.width, self.enc.jn, self.enc.jc)

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
        # buffer t at position p, ring slot s
        self.p = p = self.p + 1
        self.records_in += 1
        s = p % self.ring
        if self.slot_cluster[s] != _FREE:  # cannot happen: the ring spans the longest possible wait
            raise RuntimeError("engine ring overflow")
        self.V[s] = v
        self.slot_pos[s] = p
        self.slot_record[s] = record
        self.slot_time[s] = now
        if self.person_id is not None:
            self.slot_pid[s] = record[self.person_id]
        if self.use_l:
            value = record[self.sensitive]  # type: ignore[index]
            codes = self.codes
            assert codes is not None
            code = codes.code(value)
            self.slot_sens[s] = value
            self.slot_code[s] = code
            if codes.t:
                codes.arrive(code)
        self.n_buffered = nb = self.n_buffered + 1
        if nb > self.max_buffered:
            self.max_buffered = nb
        # C = best_selection(t): None -> a new cluster {t}; else t has joined C
        c = self._best_selection(s, v)
        if c < 0:
            self._new_cluster(s)
        elif self._early_release and self._releasable(c):  # UBDSA-style early release
            age = (p - int(self.gamma.oldest[c])) / self.delta_eff
            if self.policy.releases_early(self.gamma.lsum[c], self.tau_sum, age):
                self._output_cluster(c)
        # delay_constraint for the record at position p - delta (every position up to it, in order)
        self._expire_through(p - self.delta_eff)
        # hooks of the optional policies
        if self.wall_clock is not None:
            self.wall_clock.expire(now)
        if self.leftover is not None:
            self.leftover.after_arrival(p)
        return out

    def expire(self, now: float) -> list[Release]:
        """Apply the wall-clock bound without an arrival (for an idle stream); no-op without max_delay_seconds."""
        out: list[Release] = []
        self._out = out
        self._now = float(now)
        if self.wall_clock is not None:
            self.wall_clock.expire(float(now))
        return out

    def flush(self, now: float | None = None) -> list[Release]:
        """End of stream: every buffered record is released (delay_constraint in arrival order) or suppressed."""
        out: list[Release] = []
        self._out = out
        self._now = time.time() if now is None else float(now)
        self._expire_through(self.p)
        if self.leftover is not None:
            self.leftover.flush()
        return out

    # ================================================================== the buffer's deadlines
    def _expire_through(self, limit: int) -> None:
        """delay_constraint for every still-clustered record up to position ``limit``, oldest first."""
        slot_pos, slot_cluster, ring = self.slot_pos, self.slot_cluster, self.ring
        q = self.next_expire
        while q <= limit:
            self.next_expire = q + 1
            sq = q % ring
            if slot_pos[sq] == q and slot_cluster[sq] >= 0:
                self._delay_constraint(sq)
            q = self.next_expire

    def _expire_waiting_since(self, bound: float) -> None:
        """delay_constraint, oldest first, for every clustered record that arrived at or before ``bound``
        (seconds, the ``now`` of its push): the wall-clock bound's action."""
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

    # ================================================================== best_selection
    def _best_selection(self, s: int, v: np.ndarray) -> int:
        """Choose t's cluster by minimum enlargement and add t to it; -1 means: open a new cluster.

        For every open cluster in one compiled pass (``kernels.union_enlargements``, bit for bit the numpy formula
        of ``QIEncoder.score_rows``): U = min(box, v) (the union box), L(C + t) = score(U), E = wnew * L(C + t) -
        base (see ClusterStore).  SetCmin =
        argmin E; a member with L(C + t) <= tau is taken; if none: a new cluster while |Gamma| < beta, else a
        minimal one.
        """
        g = self.gamma
        if g.n_active == 0:
            return -1
        w = self._work
        enc = self.enc
        ls, e = w.ls, w.e
        if w.compiled:
            c = w.union_enlargements(g.box, v, enc.jn, enc.jc, enc.neg_inv_range, enc.score_table, g.wnew, g.base,
                                     self._age_weight > 0.0, self.p, g.oldest, self._age_coef, ls, e, w.num, w.cat)
        else:  # more than MAX_TERMS numeric or categorical QIs: the same formula in numpy
            ls[:] = enc.score_rows(np.minimum(g.box, v, out=w.union), w.score)
            np.multiply(g.wnew, ls, out=e)
            e -= g.base
            if self._age_weight > 0.0:  # UBDSA-style age pressure
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
        np.minimum(g.box[c], v, out=g.box[c])  # the union box
        g.lsum[c] = lc
        if self._plain:  # no person id, no l-diversity, no age pressure: _attach, inlined
            g.members[c].append(s)
            tally = g.tally[c]
            n = tally.records + 1
            tally.records = n
            g.size[c] = n
            self.slot_cluster[s] = c
            self.in_gamma.records += 1
            if g.weighted:
                g.wnew[c] = n + 1
                g.base[c] = n * lc
            else:
                g.base[c] = lc
        else:
            self._attach(c, s)
        return c

    def _attach(self, c: int, s: int) -> None:
        """Bookkeeping of t (slot s) joining cluster c (bounds already updated)."""
        g = self.gamma
        g.members[c].append(s)
        self.slot_cluster[s] = c
        person = self.slot_pid[s]
        tally = g.tally[c]
        tally.add(person, None)
        g.size[c] = tally.individuals
        self.in_gamma.add(person, None)
        if self.use_l:
            code = self.slot_code[s]
            g.counts[c, code] += 1
            self.gamma_values[code] += 1
        g.set_weights(c)
        if self._age_weight > 0.0:  # UBDSA-style age pressure
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
        """UBDSA-style age pressure: clusters below k (or l) are pulled by their age."""
        g = self.gamma
        below_k = g.active[c] and not self._releasable(c)
        self._age_coef[c] = self.policy.age_coefficient(self.j, self.delta_eff) if below_k else 0.0

    def _releasable(self, c: int) -> bool:
        """Cluster c has >= k distinct individuals and satisfies the diversity requirement."""
        g = self.gamma
        if g.size[c] < self.k:
            return False
        return self.codes is None or self.codes.ok(g.counts[c])

    def _gamma_meets(self) -> bool:
        """All of Gamma together has >= k individuals and satisfies the requirement (else merging cannot help)."""
        if self.in_gamma.individuals < self.k:
            return False
        return self.codes is None or self.codes.ok(self.gamma_values)

    # ================================================================== delay_constraint
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
        if self._non_monotone:  # merging all of Gamma is neither needed nor enough: plan the merges first
            plan = None if m > g.n_active / 2 else self._plan_merges(c)
            if plan is None:
                self._detach(s)
                self._dispose(s)
                return
            for d in plan:
                self._absorb(c, d)
            self._output_cluster(c)
            return
        if m > g.n_active / 2 or not self._gamma_meets():
            self._detach(s)
            self._dispose(s)
            return
        c = self._merge_clusters(c)
        self._output_cluster(c)

    def _try_reuse(self, s: int, leftover: bool = False) -> bool:
        """Release t under the generalization of a random kept cluster covering it (CASTLE's Omega reuse)."""
        om = self.omega
        if om.count == 0:
            return False
        cover = om.covering(self.V[s], self.p)
        if len(cover) and self._non_monotone:  # only kept classes that still satisfy the model with t in them
            codes = self.codes
            assert codes is not None and om.counts is not None and om.refs is not None
            rows = om.counts[cover]
            rows[:, self.slot_code[s]] += 1
            cover = cover[codes.ok_rows(rows, om.refs[cover] if codes.t else None)]
        if len(cover) == 0:
            return False
        i = int(cover[0]) if len(cover) == 1 else int(cover[self.draws.below(len(cover))])
        meta = om.meta[i]
        assert meta is not None
        class_id, generalized, loss, size = meta
        if om.counts is not None:
            om.counts[i, self.slot_code[s]] += 1
        if not leftover:
            self._detach(s)
        self._out.append(Release(
            class_id=class_id, kind="class", generalized=dict(generalized),
            record_ids=(self._rid(s),), records=(self.slot_record[s],),  # type: ignore[arg-type]
            delays=(self.p - self.slot_pos[s],), delays_seconds=(self._now - self.slot_time[s],),
            loss=loss, size=size, reused=True, leftover=leftover, reference=om.ref_pairs[i]))
        self.records_released += 1
        self._free_slot(s)
        return True

    def _detach(self, s: int) -> None:
        """Remove record s from its open cluster, recomputing the cluster's bounds."""
        g = self.gamma
        c = self.slot_cluster[s]
        g.members[c].remove(s)
        self.slot_cluster[s] = _FREE
        person = self.slot_pid[s]
        tally = g.tally[c]
        tally.remove(person, None)
        g.size[c] = tally.individuals
        self.in_gamma.remove(person, None)
        if self.use_l:
            code = self.slot_code[s]
            g.counts[c, code] -= 1
            self.gamma_values[code] -= 1
        if not g.members[c]:
            g.release(c)
            return
        idx = np.array(g.members[c])
        g.box[c] = self.V[idx].min(axis=0)
        g.lsum[c] = float(self.enc.score_rows(g.box[c]))
        g.oldest[c] = min(self.slot_pos[t] for t in g.members[c])
        g.set_weights(c)
        if self._age_weight > 0.0:
            self._set_age_coef(c)

    def _dispose(self, s: int) -> None:
        """A record CASTLE suppresses: suppressed, or (leftover policy) handed to the leftover cluster."""
        if self.leftover is not None:
            self.slot_cluster[s] = _LEFTOVER
            self.leftover.take(s, self.slot_pid[s], self.slot_code[s], self.p)
        else:
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

    def _rid(self, s: int) -> Any:
        rec = self.slot_record[s]
        assert rec is not None
        return rec.get(self.record_id, self.slot_pos[s])

    def _free_slot(self, s: int) -> None:
        self.slot_cluster[s] = _FREE
        self.slot_record[s] = None
        self.n_buffered -= 1

    # ================================================================== merge_clusters
    def _merge_clusters(self, c: int) -> int:
        """merge_clusters: absorb the open cluster of minimum enlargement until c is releasable.

        Enlargement of C by C': size-weighted form (|C| + |C'|) L(C u C') - |C| L(C) - |C'| L(C'), CASTLE's form
        L(C u C') - L(C); the union boxes of C with every open cluster are one ``minimum``.  (Used without a
        requirement or with distinct l-diversity, where all of Gamma satisfying it is what makes the loop end;
        other requirements go through :meth:`_plan_merges`.)
        """
        g = self.gamma
        enc = self.enc
        while not self._releasable(c):
            u = np.minimum(g.box, g.box[c])
            ls = enc.score_rows(u)
            if g.weighted:  # wnew - 1 = |C'| and base = |C'| L(C') on open clusters; base = -inf on free ones
                e = (g.wnew + (g.tally[c].records - 1)) * ls - g.base - g.base[c]
            else:
                e = ls - g.lsum[c]
            e[~g.active] = np.inf
            e[c] = np.inf
            d = int(e.argmin())
            if not np.isfinite(e[d]):  # cannot happen: delay_constraint checked Gamma holds enough
                raise RuntimeError("merge_clusters: no cluster left to merge")
            self._absorb(c, d, u[d], float(ls[d]))
        return c

    def _absorb(self, c: int, d: int, box: np.ndarray | None = None, lsum: float | None = None) -> None:
        """Open cluster d joins open cluster c (``box``/``lsum``: their union's, computed when not given)."""
        g = self.gamma
        if box is None:
            box = np.minimum(g.box[c], g.box[d])
            lsum = float(self.enc.score_rows(box))
        g.box[c] = box
        g.lsum[c] = lsum
        for sd in g.members[d]:
            self.slot_cluster[sd] = c
        g.members[c].extend(g.members[d])
        g.oldest[c] = min(int(g.oldest[c]), int(g.oldest[d]))
        g.tally[c].add_all(g.tally[d])
        g.size[c] = g.tally[c].individuals
        if self.use_l:
            g.counts[c] += g.counts[d]
        g.release(d)
        g.set_weights(c)

    def _plan_merges(self, c: int) -> list[int] | None:
        """merge_clusters under a requirement that more records can break (entropy, recursive, t-closeness):
        the clusters C would absorb, in order, to become releasable, or None when absorbing all of Gamma one by
        one never makes it releasable (then t is suppressed, as CASTLE does when Gamma cannot make k).

        Simulated on copies (nothing changes until the plan is applied): each step takes, among the clusters
        whose union with C satisfies the requirement (all unions checked at once), the one of minimum
        enlargement; if none does, the one of minimum enlargement (as CASTLE).  A subset of Gamma can satisfy
        the requirement when all of Gamma does not, and the other way round, so "all of Gamma satisfies it" (the
        test for k and distinct l) is neither needed nor enough here.
        """
        g = self.gamma
        enc = self.enc
        codes = self.codes
        assert codes is not None
        box = g.box[c].copy()
        lsum = float(g.lsum[c])
        n = g.tally[c].records
        counts = g.counts[c].copy()
        by_person = g.tally[c].by_person
        persons = set(by_person) if by_person is not None else None
        size = g.size[c]
        avail = g.active.copy()
        avail[c] = False
        plan: list[int] = []
        while not (size >= self.k and codes.ok(counts)):
            if not avail.any():
                return None
            u = np.minimum(g.box, box)
            ls = enc.score_rows(u)
            if g.weighted:
                e = (g.wnew + (n - 1)) * ls - g.base - n * lsum
            else:
                e = ls - lsum
            e[~avail] = np.inf
            ok = codes.ok_rows(g.counts + counts) & avail
            if ok.any():
                e[~ok] = np.inf
            d = int(e.argmin())
            plan.append(d)
            avail[d] = False
            box = u[d]
            lsum = float(ls[d])
            n += g.tally[d].records
            counts += g.counts[d]
            if persons is not None:
                persons.update(g.tally[d].by_person or ())
                size = len(persons)
            else:
                size = n
        return plan

    # ================================================================== output_cluster
    def _output_cluster(self, c: int) -> None:
        """output_cluster: split when >= 2k individuals; release each part, update tau and Omega."""
        g = self.gamma
        members = g.members[c]
        groups = self.splitter.split(members) if g.size[c] >= 2 * self.k else [members]
        self.in_gamma.remove_all(g.tally[c])
        if self.use_l:
            self.gamma_values -= g.counts[c]
        g.release(c)
        for grp in groups:
            rel, box, nodes, score = self._release_class(grp, leftover=False)
            self._update_tau(score)
            if score < self.tau_sum:
                counts = ref = None
                if self._non_monotone and self.codes is not None:
                    counts = np.bincount(np.fromiter((self.slot_code[x] for x in grp), dtype=np.intp, count=len(grp)),
                                         minlength=self.codes.width).astype(np.float64)
                    ref = self.codes.reference()
                self.omega.add(self.enc.cover_of(box, nodes), self.p,
                               (rel.class_id, dict(rel.generalized), rel.loss, rel.size),
                               counts=counts, ref=ref, ref_pairs=rel.reference)
            if self.adaptive is not None:
                self.delta_eff = self.adaptive.after_release(tuple(rel.generalized.values()))

    def _update_tau(self, score: float) -> None:
        """tau = mean loss of the mu most recently released clusters (kept as a running sum)."""
        rl = self.recent_losses
        if len(rl) == rl.maxlen:
            self._recent_sum -= rl[0]
        rl.append(score)
        self._recent_sum += score
        if self.n_classes % 4096 == 0:  # re-sum now and then: no drift of the running sum on endless streams
            self._recent_sum = sum(rl)
        self.tau_sum = self._recent_sum / len(rl)
        self.tau = self.tau_sum / self.j

    def _release_class(self, grp: Sequence[int], leftover: bool) -> tuple[Release, np.ndarray, list[int], float]:
        """Emit one equivalence class and free its slots; return it, its box, the LCA node of each categorical
        QI and its scoring loss summed over QIs."""
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
            loss=loss, size=size, reused=False, leftover=leftover,
            reference=self.codes.reference_pairs() if self.codes is not None else None)
        self._out.append(rel)
        n = len(grp)
        self.records_released += n
        self.n_buffered -= n
        for s in grp:
            sc[s] = _FREE
            sr[s] = None
        return rel, box, nodes, score

    # ================================================================== sensitive-value codes
    def _grow_codes(self, width: int) -> None:
        """A new sensitive value outgrew the count rows: widen every count array of the engine."""
        g = self.gamma
        g.counts = resize(g.counts, width)
        self.gamma_values = resize(self.gamma_values, width)
        if self.omega.counts is not None:
            self.omega.counts = resize(self.omega.counts, width)
            self.omega.refs = resize(self.omega.refs, width)  # type: ignore[arg-type]
        if self.leftover is not None and self.leftover.counts is not None:
            self.leftover.counts = resize(self.leftover.counts, width)

    # ================================================================== leftover actions
    def _release_leftover_class(self, grp: list[int]) -> None:
        self._release_class(grp, leftover=True)

    def _reuse_or_suppress_leftover(self, s: int) -> None:
        if not self._try_reuse(s, leftover=True):
            self._suppress(s, leftover=True)
