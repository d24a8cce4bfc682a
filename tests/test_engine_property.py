"""Property test (hypothesis): over random streams and parameters every release is k-anonymous (and
l-diverse when asked), every generalized value covers the original, every record is accounted for exactly
once, no record waits more than delta arrivals under `suppress` (delta + delta_leftover under `leftover`),
and the output is deterministic given the seed."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_anon.core.engine import Engine, EngineConfig, Release
from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.intervals import parse_interval
from stream_anon.core.schema import Attribute, Kind, Role, Schema

QI, CAT, NUM = Role.QUASI_IDENTIFIER, Kind.CATEGORICAL, Kind.NUMERIC
ZIP = Hierarchy.from_csv_text(
    "62201;622**;*****\n62208;622**;*****\n35733;357**;*****\n35751;357**;*****\n35791;357**;*****\n", "zip")
SEX = Hierarchy.from_csv_text("m;*\nf;*\n", "sex")
SENS = ("a", "b", "c", "d")


def schema_for(with_pid: bool, numeric: int, categorical: int) -> Schema:
    attrs: list[Attribute] = []
    for j in range(numeric):
        attrs.append(Attribute(f"x{j}", QI, NUM, lo=-10, hi=10, integer=j % 2 == 0))
    cats = [("zip", ZIP), ("sex", SEX)][:categorical]
    for name, h in cats:
        attrs.append(Attribute(name, QI, CAT, hierarchy=h))
    attrs.append(Attribute("s", Role.SENSITIVE, CAT, values=SENS))
    return Schema("prop", tuple(attrs), record_id="id", person_id="pid" if with_pid else None)


@st.composite
def scenarios(draw: Any) -> tuple[Schema, EngineConfig, list[dict[str, Any]]]:
    with_pid = draw(st.booleans())
    numeric = draw(st.integers(0, 2))
    categorical = draw(st.integers(0 if numeric else 1, 2))
    schema = schema_for(with_pid, numeric, categorical)
    k = draw(st.integers(2, 4))
    delta = draw(st.integers(k, 4 * k + 3))
    leftover = draw(st.sampled_from(["suppress", "leftover"]))
    l_ = draw(st.sampled_from([None, None, 2, 3]))
    adaptive = draw(st.booleans())
    cfg = EngineConfig(
        k=k, delta=delta, beta=draw(st.integers(1, 6)), mu=draw(st.integers(1, 5)),
        algorithm=draw(st.sampled_from(["castle", "ubdsa"])), loss=draw(st.sampled_from(["gt", "lm", "ubdsa"])),
        leftover=leftover, delta_leftover=draw(st.sampled_from([None, 1, 3, 2 * delta])), l=l_,
        zeta=draw(st.integers(0, 6)), max_age=draw(st.sampled_from([None, 3, 50])), adaptive_delay=adaptive,
        delta_min=k if adaptive else None, seed=draw(st.integers(0, 3)),
        age_weight=draw(st.sampled_from([0.0, 0.5, 2.0])), release_slack=draw(st.sampled_from([0.0, 1.0, 3.0])),
    )
    n = draw(st.integers(0, 70))
    recs = []
    for i in range(n):
        r: dict[str, Any] = {"id": f"r{i}"}
        for j in range(numeric):
            v = draw(st.integers(-10, 10))
            r[f"x{j}"] = v if j % 2 == 0 else v / 2
        if categorical >= 1:
            r["zip"] = draw(st.sampled_from(ZIP.leaves))
        if categorical >= 2:
            r["sex"] = draw(st.sampled_from(SEX.leaves))
        r["s"] = draw(st.sampled_from(SENS))
        if with_pid:
            r["pid"] = draw(st.sampled_from(["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"]))
        recs.append(r)
    return schema, cfg, recs


def run(schema: Schema, cfg: EngineConfig, recs: list[dict[str, Any]]) -> list[Release]:
    eng = Engine(schema, cfg)
    out: list[Release] = []
    for r in recs:
        out += eng.push(schema.validate(r), 0.0)
        assert eng.records_in == eng.records_released + eng.records_suppressed + eng.buffered_records
    out += eng.flush(0.0)
    assert eng.buffered_records == 0 and eng.buffered_ids() == []
    return out


def covers(schema: Schema, gen: Mapping[str, str], rec: Mapping[str, Any]) -> bool:
    for a in schema.qis:
        text = gen[a.name]
        if a.kind is Kind.NUMERIC:
            lo, hi = parse_interval(text)
            if not lo <= rec[a.name] <= hi:
                return False
        else:
            h = a.hierarchy
            assert h is not None
            if not h.covers(h.node(text), h.leaf_index[rec[a.name]]):
                return False
    return True


FAST_EXAMPLES, FULL_EXAMPLES = 50, 400
"""Examples of the property in the fast tier, and in CI's full suite (the ``slow`` twin below)."""


@settings(max_examples=FAST_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_releases_are_k_anonymous_cover_and_account_for_every_record(scenario: Any) -> None:
    check_releases(scenario)


@pytest.mark.slow
@settings(max_examples=FULL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_releases_are_k_anonymous_cover_and_account_for_every_record_on_more_examples(scenario: Any) -> None:
    check_releases(scenario)


def check_releases(scenario: Any) -> None:
    """Every record exactly once, within the delay bound, in classes of k individuals (and l values) whose one
    generalization covers them; the same releases again from the same seed."""
    schema, cfg, recs = scenario
    out = run(schema, cfg, recs)
    # every record exactly once
    ids = [i for r in out for i in r.record_ids]
    assert sorted(ids) == sorted(r["id"] for r in recs)
    # delays
    bound = cfg.delta + (cfg.effective_delta_leftover if cfg.leftover == "leftover" else 0)
    for r in out:
        assert len(r.delays) == len(r.record_ids) == len(r.records)
        assert all(0 <= d <= bound for d in r.delays)
        if not r.leftover:
            assert all(d <= cfg.delta for d in r.delays)
    # classes: k distinct individuals (and l values) per class id; one generalization per class id
    people: dict[str, set[Any]] = defaultdict(set)
    values: dict[str, set[Any]] = defaultdict(set)
    gens: dict[str, dict[str, str]] = {}
    for r in out:
        if r.kind == "suppressed":
            assert r.generalized == {} and r.loss == 1.0
            continue
        assert r.generalized.keys() == {a.name for a in schema.qis}
        assert gens.setdefault(r.class_id, r.generalized) == r.generalized
        for rec in r.records:
            assert covers(schema, r.generalized, rec)
            people[r.class_id].add(rec.get("pid", rec["id"]))
            values[r.class_id].add(rec["s"])
        if not r.reused:
            assert r.size >= cfg.k
            assert 0.0 <= r.loss <= 1.0
    for cid, who in people.items():
        assert len(who) >= cfg.k, cid
        if cfg.l is not None:
            assert len(values[cid]) >= cfg.l, cid
    # determinism given the seed
    again = run(schema, cfg, recs)
    assert [(r.class_id, r.kind, r.record_ids, r.generalized, r.delays) for r in out] == \
           [(r.class_id, r.kind, r.record_ids, r.generalized, r.delays) for r in again]
