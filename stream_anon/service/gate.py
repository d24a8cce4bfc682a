"""The pre-publish gate: an independent check of every class before it is produced (pure; issue 8, item 4).

Independent of the engine: it does not read the engine's counters (cluster sizes, sensitive-value tallies,
boxes); it recomputes from the class's member records and the released strings, with its own parsing of the
generalization, what a published class must satisfy:

1. at least ``k`` distinct individuals: distinct person ids when the schema has a person id, else distinct
   *input* record ids (two messages with the same record id are one individual: a replayed or duplicated
   record cannot make a class look bigger than it is);
2. the diversity requirement (:class:`~stream_anon.core.diversity.DiversityRequirement`) on the sensitive
   attribute (the schema's first): at least ``l`` distinct values (``l`` > 1), or entropy / recursive (c, l)
   l-diversity, and t-closeness against the gate's OWN running reference: the gate is fed every record the
   pipeline pushes to the engine (:meth:`PrePublishGate.observe`) and keeps the reference by the rule of
   :class:`~stream_anon.core.diversity.RunningReference`; the published class carries that reference (the
   engine's own copy only steers class formation);
3. the generalization names exactly the schema's QIs, and covers every member's original value: a numeric QI's
   value lies inside the released interval ``"[lo-hi]"``; a categorical QI's value is a leaf under the released
   hierarchy node.

Cost: per class O(members x QIs) C-level operations (a tuple ``itemgetter`` per member, one transpose, per
numeric QI one ``min``/``max``, per categorical QI one frozenset ``issuperset``), with the released strings
looked up in tables precomputed per schema (categorical: label -> frozenset of covered leaves) or cached
(numeric interval strings -> bounds).  No pandas.  Measured cost: docs/threat-model.md, "Pre-publish gate".
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_anon.core.diversity import DiversityRequirement, RunningReference
from stream_anon.core.intervals import IntervalFormatError, parse_interval
from stream_anon.core.schema import Kind, Schema

GATE_CHECKS = ("k", "l", "t", "format", "coverage")
"""What a refused class failed: too few individuals, the l-diversity model (too few distinct sensitive values,
too little entropy, recursive (c, l)), t-closeness (the EMD to the reference above t), a generalization that
does not name the schema's QIs (or cannot be parsed, or a member lacks a field), a member outside the
generalization."""

_MAX_DETAILS = 5


@dataclass(frozen=True)
class GateResult:
    """The verdict on one class: ``ok``; otherwise ``failures`` (codes of :data:`GATE_CHECKS`) and ``details``
    (one line per problem, naming the QI, the released value and the members' positions in the class; never a
    member's value, so the lines can go to logs and to the internal suppressed topic)."""

    ok: bool
    individuals: int = 0
    distinct_sensitive: int | None = None
    failures: tuple[str, ...] = ()
    details: tuple[str, ...] = ()
    reference: tuple[tuple[Any, int], ...] | None = None  # with t-closeness: the reference the class was checked on

    def describe(self) -> str:
        """One line for logs and the suppressed record (the class's QI values are not repeated)."""
        if self.ok:
            return "passed"
        return "; ".join(self.details) if self.details else ", ".join(self.failures)


def _single_getter(name: str) -> Callable[[Any], tuple[Any, ...]]:
    def get(m: Any) -> tuple[Any, ...]:
        return (m[name],)

    return get


class PrePublishGate:
    """The gate for one schema and configuration; :meth:`check` runs on every class in the hot path.

    Args:
        schema: the record schema (QIs, hierarchies, person id, sensitive attribute).
        k: minimum distinct individuals per class (>= 2).
        l: minimum distinct sensitive values per class (None or 1: not checked); shorthand for
            ``requirement=DiversityRequirement(l=l)``.
        requirement: the diversity requirement (l-diversity model, t-closeness); overrides ``l``.
        reference_every: with t-closeness, the reference is frozen after every this many observed records (the
            engine's ``t_reference_every``, default its delta).
        cache_size: numeric interval strings kept parsed (the cache is cleared when full: bounded state).
    """

    def __init__(self, schema: Schema, *, k: int, l: int | None = None,  # noqa: E741
                 requirement: DiversityRequirement | None = None, reference_every: int | None = None,
                 cache_size: int = 65536) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"gate k: must be an integer >= 2, got {k!r}")
        if l is not None and (isinstance(l, bool) or not isinstance(l, int) or l < 1):
            raise ValueError(f"gate l: must be None or an integer >= 1, got {l!r}")
        if not schema.qis:
            raise ValueError(f"gate: schema {schema.name!r} has no quasi-identifier")
        self.schema = schema
        self.k = k
        if requirement is None and l is not None and l > 1:
            requirement = DiversityRequirement(l=l)
        self.requirement = requirement if requirement is not None and requirement.active else None
        req = self.requirement
        self.l = int(req.l) if req is not None and req.l_active and req.model == "distinct" else None  # type: ignore[arg-type]
        # what the distinct count above does not cover: entropy / recursive l-diversity, t-closeness
        self._model: DiversityRequirement | None = None
        if req is not None and (req.t is not None or (req.l_active and req.model != "distinct")):
            other_l = req.l_active and req.model != "distinct"
            self._model = DiversityRequirement(model=req.model if other_l else "distinct",
                                               l=req.l if other_l else None, c=req.c, t=req.t,
                                               distance=req.distance)
        if req is not None and not schema.sensitive:
            raise ValueError("gate l: the schema has no sensitive attribute")
        self.reference: RunningReference | None = None
        if req is not None and req.t is not None:
            if reference_every is None:
                raise ValueError("gate: t-closeness needs reference_every (the engine's t_reference_every)")
            self.reference = RunningReference(reference_every)
        self.person_id = schema.person_id
        self.record_id = schema.record_id or "id"
        self.sensitive = schema.sensitive[0].name if schema.sensitive else None
        self.qis = tuple(a.name for a in schema.qis)
        self.qi_set = frozenset(self.qis)
        self._getter: Callable[[Any], tuple[Any, ...]] = (
            operator.itemgetter(*self.qis) if len(self.qis) > 1 else _single_getter(self.qis[0]))
        # per QI: (name, numeric?, categorical label -> covered leaves)
        self._plan: list[tuple[str, bool, dict[str, frozenset[Any]] | None]] = []
        for a in schema.qis:
            if a.kind is Kind.NUMERIC:
                self._plan.append((a.name, True, None))
            else:
                h = a.hierarchy
                assert h is not None
                covers: dict[str, frozenset[Any]] = {}
                for node, label in enumerate(h.node_labels):
                    lo, hi = int(h.node_leaf_lo[node]), int(h.node_leaf_hi[node])
                    leaves = frozenset(h.leaves[lo: hi + 1])
                    prev = covers.get(label)
                    covers[label] = leaves if prev is None else prev | leaves  # chains share a label
                self._plan.append((a.name, False, covers))
        self._bounds: dict[str, tuple[float, float] | None] = {}
        self._cache_size = cache_size

    # ------------------------------------------------------------------ hot path
    def observe(self, record: Mapping[str, Any]) -> None:
        """A record the pipeline pushes to the engine (t-closeness: it joins the running reference; no-op
        otherwise).  Call it for exactly the records the engine receives, in their order."""
        if self.reference is not None:
            self.reference.observe(record[self.sensitive])  # type: ignore[index]

    def _interval(self, text: Any) -> tuple[float, float] | None:
        b = self._bounds.get(text)
        if b is None and text not in self._bounds:
            try:
                b = parse_interval(text)
            except IntervalFormatError:
                b = None
            if len(self._bounds) >= self._cache_size:
                self._bounds.clear()
            self._bounds[text] = b
        return b

    def check(self, generalized: Mapping[str, str], members: Sequence[Mapping[str, Any]],
              record_ids: Sequence[Any] | None = None) -> GateResult:
        """Check one class.  ``members``: the members' original (validated) records; ``record_ids``: their INPUT
        record ids, same order (used when the schema has no person id; default: the records' record-id field,
        which the service overwrites with the source offset, so pass them).  Never raises."""
        try:
            return self._check(generalized, members, record_ids)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            return GateResult(False, failures=("format",), details=(f"class not checkable: {e!r}"[:300],))

    def _check(self, generalized: Mapping[str, str], members: Sequence[Mapping[str, Any]],
               record_ids: Sequence[Any] | None) -> GateResult:
        n = len(members)
        if n == 0:
            return GateResult(False, failures=("k",), details=(f"no members (k={self.k})",))
        if self.person_id is not None:
            pid = self.person_id
            individuals = len({m[pid] for m in members})
        elif record_ids is not None:
            if len(record_ids) != n:
                return GateResult(False, failures=("format",),
                                  details=(f"{len(record_ids)} record ids for {n} members",))
            individuals = len(set(record_ids))
        else:
            rid = self.record_id
            individuals = len({m[rid] for m in members})
        distinct = None
        model_fails: list[tuple[str, str]] = []
        reference = None
        if self.l is not None:
            s = self.sensitive
            assert s is not None
            distinct = len({m[s] for m in members})
        ok = individuals >= self.k and (distinct is None or distinct >= self.l)  # type: ignore[operator]
        if self._model is not None:
            model_fails, distinct, reference = self._check_model(self._model, members)
            ok = ok and not model_fails
        if ok and generalized.keys() == self.qi_set:
            interval = self._interval
            for (name, numeric, covers), col in zip(self._plan, zip(*map(self._getter, members), strict=True),
                                                    strict=True):
                g = generalized[name]
                if numeric:
                    b = interval(g)
                    if b is None or min(col) < b[0] or max(col) > b[1]:
                        ok = False
                        break
                else:
                    cov = covers.get(g)  # type: ignore[union-attr]
                    if cov is None or not cov.issuperset(col):
                        ok = False
                        break
            if ok:
                return GateResult(True, individuals=individuals, distinct_sensitive=distinct, reference=reference)
        return self._diagnose(generalized, members, individuals, distinct, model_fails)

    def _check_model(self, req: DiversityRequirement, members: Sequence[Mapping[str, Any]]
                     ) -> tuple[list[tuple[str, str]], int, tuple[tuple[Any, int], ...] | None]:
        """The diversity model beyond distinct l (entropy, recursive, t-closeness): (failures as (check code,
        line), distinct sensitive values, the reference used)."""
        s = self.sensitive
        assert s is not None
        counts: dict[Any, int] = {}
        for m in members:
            v = m[s]
            counts[v] = counts.get(v, 0) + 1
        reference = self.reference.current() if self.reference is not None else None
        ref_map = dict(reference) if reference is not None else None
        if req.satisfied(counts, ref_map):
            return [], len(counts), reference
        l_only = DiversityRequirement(model=req.model, l=req.l, c=req.c) if req.l_active else DiversityRequirement()
        t_only = DiversityRequirement(t=req.t, distance=req.distance) if req.t is not None else None
        fails = [("l", line) for line in l_only.explain(counts, None, s)]
        if t_only is not None:
            fails += [("t", line) for line in t_only.explain(counts, ref_map, s)]
        if not fails:  # cannot happen (the parts fail when the whole does): refuse rather than pass
            fails = [("l", "diversity check and its explanation disagree")]
        return fails, len(counts), reference

    # ------------------------------------------------------------------ failure path (slow, complete)
    def _diagnose(self, generalized: Mapping[str, str], members: Sequence[Mapping[str, Any]], individuals: int,
                  distinct: int | None, model_fails: Sequence[tuple[str, str]] = ()) -> GateResult:
        failures: list[str] = []
        details: list[str] = []
        unit = f"distinct {self.person_id!r} values" if self.person_id else "distinct record ids"
        if individuals < self.k:
            failures.append("k")
            details.append(f"{individuals} individuals ({unit}) < k={self.k}")
        if distinct is not None and self.l is not None and distinct < self.l:
            failures.append("l")
            details.append(f"{distinct} distinct {self.sensitive!r} values < l={self.l}")
        for code, line in model_fails:
            failures.append(code)
            details.append(line)
        keys = set(generalized.keys())
        if keys != self.qi_set:
            failures.append("format")
            missing, extra = sorted(self.qi_set - keys), sorted(keys - self.qi_set)
            details.append(f"generalization names {sorted(keys)}; missing QIs {missing}, unexpected keys {extra}")
        uncovered = []
        for name, numeric, covers in self._plan:
            if name not in generalized:
                continue
            g = generalized[name]
            if numeric:
                b = self._interval(g)
                if b is None:
                    failures.append("format")
                    details.append(f"{name!r}: released {g!r} is not an interval '[lo-hi]'")
                    continue
                bad = [i for i, m in enumerate(members) if not b[0] <= m[name] <= b[1]]
            else:
                cov = covers.get(g) if covers is not None else None
                if cov is None:
                    failures.append("format")
                    details.append(f"{name!r}: released {g!r} is not a node of its hierarchy")
                    continue
                bad = [i for i, m in enumerate(members) if m[name] not in cov]
            if bad:
                shown = bad[:_MAX_DETAILS]
                more = f" and {len(bad) - len(shown)} more" if len(bad) > len(shown) else ""
                uncovered.append(f"{name!r}: {len(bad)} member(s) outside released {g!r} (positions {shown}{more})")
        if uncovered:
            failures.append("coverage")
            details.extend(uncovered)
        if not failures:  # cannot happen (the fast path said no): report rather than pass
            failures.append("format")
            details.append("gate fast path and diagnosis disagree")
        return GateResult(False, individuals=individuals, distinct_sensitive=distinct,
                          failures=tuple(dict.fromkeys(failures)), details=tuple(details))
