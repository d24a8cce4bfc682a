"""CASTLE steps on tiny hand-built streams: best_selection, delay bound, suppression rules, merge, Omega
reuse, split, l-diversity, person ids, wall-clock bound, parameter errors."""

from __future__ import annotations

from typing import Any

import pytest

from stream_anon.core.engine import Engine, EngineConfig, EngineConfigError, Release
from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.schema import Attribute, Kind, Role, Schema

QI, CAT, NUM = Role.QUASI_IDENTIFIER, Kind.CATEGORICAL, Kind.NUMERIC
ZIP = Hierarchy.from_csv_text(
    "62201;622**;*****\n62208;622**;*****\n35733;357**;*****\n35751;357**;*****\n35791;357**;*****\n", "zip")


def toy_schema(person_id: bool = False) -> Schema:
    """x numeric on the public domain [0, 100], zip categorical (5 leaves), sensitive s in {a, b, c}."""
    attrs = [Attribute("x", QI, NUM, lo=0, hi=100, integer=True), Attribute("zip", QI, CAT, hierarchy=ZIP),
             Attribute("s", Role.SENSITIVE, CAT, values=("a", "b", "c"))]
    return Schema("toy", tuple(attrs), record_id="id", person_id="pid" if person_id else None)


class Run:
    """Pushes records r0, r1, ... and keeps every release."""

    def __init__(self, schema: Schema | None = None, **cfg: Any):
        self.schema = schema or toy_schema()
        self.engine = Engine(self.schema, EngineConfig(**cfg))
        self.releases: list[Release] = []
        self.n = 0

    def push(self, x: int, z: str, s: str = "a", pid: str | None = None, now: float | None = 0.0) -> list[Release]:
        rec: dict[str, Any] = {"id": f"r{self.n}", "x": x, "zip": z, "s": s}
        if pid is not None:
            rec["pid"] = pid
        self.n += 1
        out = self.engine.push(self.schema.validate(rec), now)
        self.releases += out
        return out

    def flush(self) -> list[Release]:
        out = self.engine.flush(0.0)
        self.releases += out
        return out

    def classes(self) -> list[Release]:
        return [r for r in self.releases if r.kind == "class"]

    def ids(self, rel: Release) -> set[str]:
        return set(rel.record_ids)


def test_best_selection_joins_zero_enlargement_and_opens_cluster_above_tau() -> None:
    run = Run(k=2, delta=3, beta=2, mu=1)
    run.push(10, "35733")
    run.push(10, "35733")  # enlargement 0 <= tau = 0: joins r0's cluster
    assert run.engine.open_clusters == 1
    run.push(90, "62201")  # enlargement > tau = 0 and |Gamma| < beta: new cluster
    assert run.engine.open_clusters == 2
    out = run.push(90, "62201")  # position 3: r0 (position 0) reaches delta = 3 -> its cluster {r0, r1} is output
    assert len(out) == 1
    rel = out[0]
    assert rel.kind == "class" and run.ids(rel) == {"r0", "r1"}
    assert rel.generalized == {"x": "[10-10]", "zip": "35733"}
    assert rel.delays == (3, 2) and rel.loss == 0.0 and rel.size == 2
    out = run.flush()
    assert [run.ids(r) for r in out] == [{"r2", "r3"}]
    assert out[0].delays == (1, 0)


def test_beta_bounds_open_clusters() -> None:
    run = Run(k=3, delta=20, beta=1, mu=1)
    for x in (0, 100, 50, 7, 93):
        run.push(x, "62201")
        assert run.engine.open_clusters == 1


def test_no_record_waits_more_than_delta_arrivals() -> None:
    run = Run(k=2, delta=4, beta=3, mu=2)
    xs = [0, 100, 50, 3, 97, 51, 2, 99, 49, 60, 10, 90]
    for i, x in enumerate(xs):
        run.push(x, ["62201", "35791", "35733"][i % 3])
        assert run.engine.buffered_records <= 4  # positions p-delta+1 .. p
    run.flush()
    delays = [d for r in run.releases for d in r.delays]
    assert len(delays) == len(xs) and max(delays) <= 4


def test_outlier_rule_suppresses_when_more_than_half_of_gamma_is_larger() -> None:
    run = Run(k=3, delta=4, beta=3, mu=1)
    run.push(50, "35733")   # r0: alone
    run.push(0, "62201")    # r1: new cluster
    run.push(0, "62201")    # r2: joins r1
    run.push(100, "35791")  # r3: new cluster
    out = run.push(100, "35791")  # r4 joins r3; r0 expires: m = 2 clusters larger > |Gamma| / 2 = 1.5
    assert len(out) == 1 and out[0].kind == "suppressed" and out[0].record_ids == ("r0",)
    assert out[0].generalized == {} and out[0].loss == 1.0 and out[0].delays == (4,)
    # flush: r1's cluster (2 < k) is not an outlier (m = 0) and Gamma holds 4 >= k records: merge with r3's
    out = run.flush()
    assert len(out) == 1 and run.ids(out[0]) == {"r1", "r2", "r3", "r4"}
    assert out[0].generalized == {"x": "[0-100]", "zip": "*****"}
    assert run.engine.records_suppressed == 1 and run.engine.records_released == 4


def test_fewer_than_k_individuals_in_gamma_suppresses() -> None:
    run = Run(toy_schema(person_id=True), k=3, delta=3, beta=2, mu=1)
    for x in (1, 2, 3, 4):
        run.push(x, "35733", pid="alice")  # one individual: never k-anonymous
    out = run.flush()
    assert all(r.kind == "suppressed" for r in run.releases)
    assert sum(len(r.record_ids) for r in run.releases) == 4
    assert out and run.engine.buffered_records == 0


def test_person_id_counts_distinct_individuals() -> None:
    run = Run(toy_schema(person_id=True), k=2, delta=3, beta=1, mu=1)
    run.push(1, "35733", pid="alice")
    run.push(2, "35733", pid="alice")
    run.push(3, "35733", pid="bob")
    run.flush()
    (rel,) = run.classes()
    assert rel.size == 2 and len(rel.record_ids) == 3


def test_merge_clusters_picks_the_nearest_cluster() -> None:
    run = Run(k=2, delta=3, beta=3, mu=1)
    run.push(10, "35733")  # r0 alone
    run.push(90, "62201")  # r1: new cluster
    run.push(12, "35733")  # r2: new cluster? no: |Gamma| = 2 < 3 and enlargement > tau = 0 -> new cluster
    out = run.push(95, "62208")  # r3; r0 expires below k, m = 0: merge with the nearest cluster (r2's)
    assert len(out) == 1 and run.ids(out[0]) == {"r0", "r2"}
    assert out[0].generalized == {"x": "[10-12]", "zip": "35733"}


def test_omega_reuse_releases_under_a_covering_cluster() -> None:
    run = Run(k=2, delta=2, beta=2, mu=2, zeta=10)
    run.push(0, "62201")    # r0
    run.push(100, "35791")  # r1: new cluster
    out = run.push(50, "35733")  # r2 joins r1's cluster (|Gamma| = beta); r0 expires: merged, released
    assert [run.ids(r) for r in out] == [{"r0", "r1", "r2"}] and out[0].loss == 1.0
    run.push(20, "35751")   # r3
    run.push(20, "35751")   # r4
    out = run.push(22, "35733")  # r5 joins; r3 expires: {r3, r4, r5} released, loss 0.26 < tau -> Omega
    (low,) = out
    assert run.ids(low) == {"r3", "r4", "r5"}
    assert low.generalized == {"x": "[20-22]", "zip": "357**"}
    assert low.loss == pytest.approx((2 / 100 + 2 / 4) / 2)
    run.push(21, "35791")   # r6 alone
    run.push(90, "62201")   # r7: new cluster
    out = run.push(95, "62208")  # r8 joins r7; r6 expires below k: covered by the Omega cluster -> reused
    (reused,) = out
    assert reused.reused and reused.record_ids == ("r6",) and reused.class_id == low.class_id
    assert reused.generalized == low.generalized and reused.size == 3 and reused.delays == (2,)


def test_zeta_zero_disables_reuse() -> None:
    run = Run(k=2, delta=2, beta=2, mu=2, zeta=0)
    for x, z in [(0, "62201"), (100, "35791"), (50, "35733"), (20, "35751"), (20, "35751"), (22, "35733"),
                 (21, "35791"), (90, "62201"), (95, "62208")]:
        run.push(x, z)
    run.flush()
    assert not any(r.reused for r in run.releases)
    assert run.engine.omega.count == 0


def test_omega_is_bounded_by_zeta() -> None:
    run = Run(k=2, delta=4, beta=4, mu=3, zeta=3)
    for i in range(400):
        run.push((i * 37) % 101, ["62201", "62208", "35733", "35751", "35791"][(i * 7) % 5])
        assert run.engine.omega.count <= 3
    run.flush()


def test_split_when_cluster_holds_2k() -> None:
    run = Run(k=2, delta=10, beta=1, mu=1, seed=3)
    for x in (0, 1, 2, 50, 51, 52):
        run.push(x, "35733")
    run.flush()
    classes = run.classes()
    assert len(classes) >= 2
    assert all(c.size >= 2 for c in classes)
    assert sorted(i for c in classes for i in c.record_ids) == [f"r{i}" for i in range(6)]
    assert all(c.loss < 0.26 for c in classes)  # unsplit: (52/100 + 0) / 2 = 0.26


def test_l_diversity_needs_l_values_not_l_plus_one() -> None:
    run = Run(k=2, delta=10, beta=1, mu=1, l=2, seed=1)
    for x, s in [(1, "a"), (2, "a"), (3, "b"), (4, "b")]:
        run.push(x, "35733", s=s)
    run.flush()
    classes = run.classes()
    assert len(classes) == 2  # split_l: two classes, each with exactly the two values a and b
    for c in classes:
        assert sorted(r["s"] for r in c.records) == ["a", "b"]


def test_l_diversity_merges_until_l_values() -> None:
    run = Run(k=2, delta=3, beta=2, mu=1, l=2)
    run.push(1, "35733", s="a")
    run.push(1, "35733", s="a")   # k reached, but one sensitive value
    run.push(90, "62201", s="b")  # new cluster
    run.push(90, "62201", s="b")
    run.flush()
    for c in run.classes():
        assert len({r["s"] for r in c.records}) >= 2
    assert sum(len(r.record_ids) for r in run.releases) == 4


def test_l_larger_than_sensitive_domain_is_rejected() -> None:
    with pytest.raises(EngineConfigError, match="l: must be an integer in \\[1, 3\\]"):
        Engine(toy_schema(), EngineConfig(k=2, delta=5, beta=2, mu=1, l=4))


def test_wall_clock_bound() -> None:
    run = Run(k=2, delta=100, beta=2, mu=1, max_delay_seconds=5.0)
    run.push(10, "35733", now=0.0)
    run.push(10, "35733", now=1.0)
    run.push(90, "62201", now=3.0)
    out = run.push(90, "62201", now=7.0)  # r0 waited 7 s >= 5 s: its cluster {r0, r1} is output; r2 only 4 s
    assert [run.ids(r) for r in out] == [{"r0", "r1"}]
    assert out[0].delays_seconds == (7.0, 6.0)
    out = run.engine.expire(20.0)  # no arrival: r2 waited 17 s
    assert [set(r.record_ids) for r in out] == [{"r2", "r3"}]


def test_leftover_policy_holds_instead_of_suppressing() -> None:
    run = Run(k=2, delta=4, beta=3, mu=1, leftover="leftover", delta_leftover=6)
    run.push(50, "35733")   # r0: will be an outlier
    run.push(0, "62201")
    run.push(0, "62201")
    run.push(100, "35791")
    out = run.push(100, "35791")  # r0 expires as an outlier: goes to the leftover cluster, not suppressed
    assert out == [] or all(r.kind == "class" for r in out)
    assert "r0" in run.engine.buffered_ids()
    run.push(52, "35751")
    run.flush()
    assert run.engine.records_suppressed == 0 or all(r.leftover for r in run.releases if r.kind == "suppressed")
    assert sum(len(r.record_ids) for r in run.releases) == 6
    for c in run.classes():
        assert c.size >= 2
    assert max(d for r in run.releases for d in r.delays) <= 4 + 6


@pytest.mark.parametrize("kwargs, parameter", [
    ({"k": 1, "delta": 5, "beta": 1, "mu": 1}, "k"),
    ({"k": 5, "delta": 4, "beta": 1, "mu": 1}, "delta"),
    ({"k": 2, "delta": 5, "beta": 0, "mu": 1}, "beta"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 0}, "mu"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "algorithm": "mondrian"}, "algorithm"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "loss": "entropy"}, "loss"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "leftover": "drop"}, "leftover"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "l": 0}, "l"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "zeta": -1}, "zeta"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "max_delay_seconds": 0}, "max_delay_seconds"),
    ({"k": 2, "delta": 5, "beta": 1, "mu": 1, "delta_min": 1}, "delta_min"),
    ({"k": 2.5, "delta": 5, "beta": 1, "mu": 1}, "k"),
])
def test_bad_parameters_name_parameter_range_and_value(kwargs: dict[str, Any], parameter: str) -> None:
    with pytest.raises(EngineConfigError) as e:
        EngineConfig(**kwargs)
    assert e.value.parameter == parameter
    assert str(e.value).startswith(f"{parameter}: must be")
    assert repr(kwargs[parameter]) in str(e.value)


def test_flush_mid_stream_then_continue() -> None:
    run = Run(k=2, delta=4, beta=2, mu=2)
    for i in range(7):
        run.push(i * 13 % 100, ["62201", "35733", "35791"][i % 3])
    run.flush()
    assert run.engine.buffered_records == 0 and run.engine.open_clusters == 0
    for i in range(7, 20):
        run.push(i * 13 % 100, ["62201", "35733", "35791"][i % 3])
        assert run.engine.buffered_records <= 4
    run.flush()
    ids = sorted(int(i[1:]) for r in run.releases for i in r.record_ids)
    assert ids == list(range(20))
    assert max(d for r in run.releases for d in r.delays) <= 4
    people: dict[str, int] = {}
    for r in run.classes():
        people[r.class_id] = people.get(r.class_id, 0) + len(r.record_ids)
    assert all(n >= 2 for n in people.values())


def test_split_keeps_each_individual_in_one_class() -> None:
    run = Run(toy_schema(person_id=True), k=2, delta=10, beta=1, mu=1, seed=5)
    pids = ["p0", "p0", "p1", "p2", "p3", "p4", "p4"]
    for x, pid in zip([1, 2, 3, 50, 51, 90, 91], pids, strict=True):
        run.push(x, "35733", pid=pid)
    run.flush()
    classes = run.classes()
    assert len(classes) == 2  # 5 individuals >= 2k: KNN split into 2 groups of 2, the 5th joins the nearer one
    owner: dict[str, str] = {}
    for c in classes:
        who = {r["pid"] for r in c.records}
        assert c.size == len(who) >= 2
        for r in c.records:
            assert owner.setdefault(r["pid"], c.class_id) == c.class_id  # never split across classes
    assert sum(len(c.record_ids) for c in classes) == 7
