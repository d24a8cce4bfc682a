"""The pre-publish gate: every real engine class passes; every faulty class fails, naming what failed."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.core.engine import Engine, EngineConfig
from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.intervals import interval_hierarchy
from stream_anon.core.schema import Attribute, Kind, Role, Schema, adult_schema
from stream_anon.service.gate import GATE_CHECKS, GateResult, PrePublishGate


@pytest.fixture(scope="module")
def adult_rows(adult_path: Path) -> list[dict[str, Any]]:
    return list(iter_records(read_adult(adult_path)))


def engine_classes(rows: list[dict[str, Any]], n: int, **cfg: Any) -> list[tuple[Any, list[Any]]]:
    """(release, input record ids) of the classes the engine releases on the first n rows; the engine tracks
    records by position, as the service does with source offsets."""
    key = (id(rows), n, tuple(sorted(cfg.items())))
    if key in _CLASSES:
        return _CLASSES[key]
    schema = adult_schema()
    eng = Engine(schema, EngineConfig(**{"k": 10, "delta": 1000, "beta": 50, "mu": 100, "zeta": 0, "seed": 3,
                                         **cfg}))
    out = []
    ids = []
    for i, r in enumerate(rows[:n]):
        ids.append(r["id"])
        out += eng.push(dict(r, id=i), 0.0)
    out += eng.flush(0.0)
    _CLASSES[key] = [(r, [ids[o] for o in r.record_ids]) for r in out if r.kind == "class"]
    return _CLASSES[key]


_CLASSES: dict[tuple[Any, ...], list[tuple[Any, list[Any]]]] = {}


@pytest.mark.slow  # (all of ADULT: CI's full suite; not in the fast tier, for its time budget)
def test_every_engine_class_on_all_of_adult_passes(adult_rows: list[dict[str, Any]]) -> None:
    classes = engine_classes(adult_rows, len(adult_rows))
    gate = PrePublishGate(adult_schema(), k=10)
    verdicts = [gate.check(r.generalized, r.records, ids) for r, ids in classes]
    assert len(classes) > 2000
    assert [v.describe() for v in verdicts if not v.ok] == []
    assert all(v.individuals == len(r.records) for v, (r, _) in zip(verdicts, classes, strict=True))


def test_reuse_releases_are_refused(adult_rows: list[dict[str, Any]]) -> None:
    """CASTLE's reuse of Omega publishes one record under an earlier class's generalization: below k."""
    reused = [(r, ids) for r, ids in engine_classes(adult_rows, 8000, zeta=1000) if r.reused]
    gate = PrePublishGate(adult_schema(), k=10)
    assert reused and all(r.size >= 10 for r, _ in reused)  # the engine reports the reused class's size
    verdicts = [gate.check(r.generalized, r.records, ids) for r, ids in reused]
    assert all(not v.ok and v.failures == ("k",) and v.individuals == 1 for v in verdicts)


def test_l_diverse_engine_classes_pass_with_l(adult_rows: list[dict[str, Any]]) -> None:
    classes = engine_classes(adult_rows, 6000, l=2)
    gate = PrePublishGate(adult_schema(), k=10, l=2)
    assert classes and all(gate.check(r.generalized, r.records, ids).ok for r, ids in classes)
    # the same classes from an engine without l: some have a single income value, the gate with l=2 says so
    plain = engine_classes(adult_rows, 6000)
    refused = [v for v in (gate.check(r.generalized, r.records, ids) for r, ids in plain) if not v.ok]
    assert refused and all(v.failures == ("l",) and v.distinct_sensitive == 1 for v in refused)


@pytest.fixture(scope="module")
def a_class(adult_rows: list[dict[str, Any]]) -> tuple[dict[str, str], list[dict[str, Any]], list[Any]]:
    r, ids = engine_classes(adult_rows, 3000)[5]
    return dict(r.generalized), [dict(m) for m in r.records], list(ids)


def test_too_few_members_fails_k(a_class: Any) -> None:
    gen, members, ids = a_class
    gate = PrePublishGate(adult_schema(), k=10)
    res = gate.check(gen, members[:9], ids[:9])
    assert not res.ok and res.failures == ("k",) and res.individuals == 9
    assert "9 individuals (distinct record ids) < k=10" in res.describe()
    assert gate.check(gen, [], []).failures == ("k",)


def test_duplicate_record_ids_count_as_one_individual(a_class: Any) -> None:
    gen, members, ids = a_class
    gate = PrePublishGate(adult_schema(), k=len(members))
    assert gate.check(gen, members, ids).ok
    dup = [*ids[:-1], ids[0]]  # the same input record twice (a replayed message)
    res = gate.check(gen, members, dup)
    assert not res.ok and res.failures == ("k",) and res.individuals == len(members) - 1


def test_without_record_ids_the_records_id_field_is_used(a_class: Any) -> None:
    gen, members, ids = a_class
    gate = PrePublishGate(adult_schema(), k=len(members))
    same = [dict(m, id="x") for m in members]
    assert gate.check(gen, [dict(m, id=i) for m, i in zip(members, ids, strict=True)]).ok
    assert gate.check(gen, same).individuals == 1


def test_too_few_sensitive_values_fails_l(a_class: Any) -> None:
    gen, members, ids = a_class
    gate = PrePublishGate(adult_schema(), k=5, l=2)
    one = [dict(m, income="<=50K") for m in members]
    res = gate.check(gen, one, ids)
    assert not res.ok and res.failures == ("l",) and res.distinct_sensitive == 1
    assert "1 distinct 'income' values < l=2" in res.describe()


@pytest.mark.parametrize("qi", ["age", "hours-per-week", "sex", "native-country", "occupation"])
def test_a_member_outside_the_generalization_fails_coverage(adult_rows: list[dict[str, Any]], qi: str) -> None:
    schema = adult_schema()
    a = schema[qi]
    root = f"[{a.lo:.0f}-{a.hi:.0f}]" if a.kind is Kind.NUMERIC else "*"
    r, ids = next((r, ids) for r, ids in engine_classes(adult_rows, 3000) if r.generalized[qi] != root)
    gen, bad = dict(r.generalized), [dict(m) for m in r.records]
    g = gen[qi]
    value: Any
    if a.kind is Kind.NUMERIC:
        lo, hi = (int(x) for x in g[1:-1].split("-"))
        value = hi + 1 if hi < a.hi else lo - 1  # type: ignore[operator]
    else:
        h = a.hierarchy
        assert h is not None
        node = h.node(g)
        value = next(leaf for i, leaf in enumerate(h.leaves) if not h.covers(node, i))
    bad[3][qi] = value
    res = PrePublishGate(schema, k=10).check(gen, bad, ids)
    assert not res.ok and res.failures == ("coverage",)
    assert f"{qi!r}: 1 member(s) outside released {g!r} (positions [3])" in res.describe()
    if isinstance(value, str):
        assert value not in res.describe()  # no member value in the details (they go to logs)


def test_generalization_that_does_not_name_the_qis_or_cannot_be_parsed_fails_format(a_class: Any) -> None:
    gen, members, ids = a_class
    gate = PrePublishGate(adult_schema(), k=10)
    missing = {q: v for q, v in gen.items() if q != "race"}
    assert gate.check(missing, members, ids).failures == ("format",)
    extra = dict(gen, income="*")
    assert "unexpected keys ['income']" in gate.check(extra, members, ids).describe()
    for q, v in (("age", "30 to 39"), ("workclass", "Nowhere")):
        res = gate.check(dict(gen, **{q: v}), members, ids)
        assert res.failures == ("format",) and repr(v) in res.describe()
    broken = [dict(m) for m in members]
    del broken[2]["education"]
    res = gate.check(gen, broken, ids)
    assert not res.ok and res.failures == ("format",)  # never raises
    wrong_type = [dict(m) for m in members]
    wrong_type[0]["age"] = "forty"
    assert gate.check(gen, wrong_type, ids).failures == ("format",)
    assert gate.check(gen, members, ids[:-1]).failures == ("format",)


def test_several_failures_are_all_named(a_class: Any) -> None:
    gen, members, ids = a_class
    gate = PrePublishGate(adult_schema(), k=10, l=2)
    bad = [dict(m, income=">50K") for m in members[:4]]
    bad[0]["age"] = 17 if gen["age"] != "[17-90]" and not gen["age"].startswith("[17-") else 90
    res = gate.check(gen, bad, ids[:4])
    assert set(res.failures) == {"k", "l", "coverage"} and set(res.failures) <= set(GATE_CHECKS)


def test_person_id_schema_counts_people_not_records() -> None:
    h = Hierarchy.from_rows("city", [["a", "north", "*"], ["b", "north", "*"], ["c", "south", "*"]])
    schema = Schema("people", (
        Attribute("age", Role.QUASI_IDENTIFIER, Kind.NUMERIC, lo=0, hi=100, integer=True),
        Attribute("city", Role.QUASI_IDENTIFIER, Kind.CATEGORICAL, hierarchy=h),
        Attribute("sick", Role.SENSITIVE, Kind.CATEGORICAL, values=("yes", "no")),
    ), record_id="id", person_id="pid")
    gate = PrePublishGate(schema, k=3, l=2)
    gen = {"age": "[20-29]", "city": "north"}
    members = [{"id": i, "pid": p, "age": 20 + i, "city": "ab"[i % 2], "sick": "yes" if i % 2 else "no"}
               for i, p in enumerate(["p1", "p2", "p3", "p1"])]
    assert gate.check(gen, members, ["r0", "r1", "r2", "r3"]).ok
    res = gate.check(gen, [dict(m, pid="p1") if m["pid"] == "p3" else m for m in members], ["r0", "r1", "r2", "r3"])
    assert res.failures == ("k",) and res.individuals == 2 and "distinct 'pid' values" in res.describe()
    assert gate.check(dict(gen, city="south"), members).failures == ("coverage",)
    assert gate.check(dict(gen, city="*"), members).ok


def test_interval_hierarchy_qi_and_real_valued_intervals() -> None:
    hours = interval_hierarchy("hours", 0, 99, [10, 50])
    schema = Schema("s", (
        Attribute("hours", Role.QUASI_IDENTIFIER, Kind.CATEGORICAL, hierarchy=hours),
        Attribute("rate", Role.QUASI_IDENTIFIER, Kind.NUMERIC, lo=0.0, hi=1.0),
    ), record_id="id")
    gate = PrePublishGate(schema, k=2)
    members = [{"id": 1, "hours": "[0-9]", "rate": 0.1}, {"id": 2, "hours": "[10-19]", "rate": 0.30000000000000004}]
    parent = hours.node_labels[int(hours.lca[0, 1])]
    assert gate.check({"hours": parent, "rate": "[0.1-0.30000000000000004]"}, members).ok
    assert gate.check({"hours": parent, "rate": "[0.1-0.3]"}, members).failures == ("coverage",)
    assert gate.check({"hours": "[0-9]", "rate": "[0-1]"}, members).failures == ("coverage",)


def test_the_interval_cache_stays_bounded(adult_rows: list[dict[str, Any]]) -> None:
    gate = PrePublishGate(adult_schema(), k=10, cache_size=8)
    classes = engine_classes(adult_rows, 3000)
    for r, ids in classes:
        assert gate.check(r.generalized, r.records, ids).ok
    assert len(gate._bounds) <= 8


def test_random_faults_are_always_caught(a_class: Any) -> None:
    """Each of many random single faults (drop members, duplicate ids, move a value outside) is refused."""
    gen, members, ids = a_class
    schema = adult_schema()
    gate = PrePublishGate(schema, k=len(members))
    rng = random.Random(11)
    numeric = [a for a in schema.qis if a.kind is Kind.NUMERIC and gen[a.name] != f"[{a.lo:.0f}-{a.hi:.0f}]"]
    for _ in range(300):
        ms, rid = [dict(m) for m in members], list(ids)
        fault = rng.choice(["drop", "dup", "outside"] if numeric else ["drop", "dup"])
        if fault == "drop":
            i = rng.randrange(len(ms))
            del ms[i], rid[i]
        elif fault == "dup":
            rid[rng.randrange(1, len(rid))] = rid[0]
        else:
            a = rng.choice(numeric)
            lo, hi = (float(x) for x in gen[a.name][1:-1].split("-"))
            ms[rng.randrange(len(ms))][a.name] = int(hi) + 1 if hi < a.hi else int(lo) - 1  # type: ignore[operator]
        res = gate.check(gen, ms, rid)
        assert isinstance(res, GateResult) and not res.ok, fault


def test_invalid_parameters_are_refused() -> None:
    schema = adult_schema()
    for kw in ({"k": 1}, {"k": True}, {"k": 10, "l": 0}):
        with pytest.raises(ValueError):
            PrePublishGate(schema, **kw)
