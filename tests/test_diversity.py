"""The diversity models (core/diversity.py): hand-computed examples of each check, the papers' EMD examples, and
properties (entropy l implies distinct ceil(l), recursive (c, l) implies distinct l, the plain-Python check equals
the vectorized one, EMD bounds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_anon.core.diversity import (
    DiversityParameterError,
    DiversityRequirement,
    RunningReference,
    counts_matrix,
    disclosure_figures,
    emd,
    entropy,
)


def req(**kw: object) -> DiversityRequirement:
    return DiversityRequirement(**kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------- hand-computed
def test_distinct_l_counts_values_not_records() -> None:
    r = req(l=2)
    assert r.satisfied({"a": 9, "b": 1}) and not r.satisfied({"a": 10})
    assert req(l=3).satisfied({"a": 1, "b": 1, "c": 1}) and not req(l=3).satisfied({"a": 5, "b": 5})


def test_entropy_l_is_entropy_at_least_log_l() -> None:
    assert entropy(np.array([3, 1])) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))  # 0.5623
    assert req(model="entropy", l=2).satisfied({"a": 5, "b": 5})  # H = log 2 exactly: at the bound, passes
    assert not req(model="entropy", l=2).satisfied({"a": 6, "b": 4})  # H = 0.6730 < 0.6931
    assert req(model="entropy", l=1.5).satisfied({"a": 8, "b": 2})  # H(0.2) = 0.5004 >= log 1.5 = 0.4055
    assert not req(model="entropy", l=1.5).satisfied({"a": 9, "b": 1})  # H(0.1) = 0.3251
    assert req(model="entropy", l=3).satisfied({"a": 4, "b": 4, "c": 4})
    assert not req(model="entropy", l=3).satisfied({"a": 4, "b": 4, "c": 3})
    assert not req(model="entropy", l=1.5).satisfied({"a": 12})


def test_recursive_c_l_compares_the_largest_count_with_the_tail() -> None:
    r = req(model="recursive", c=2, l=2)
    assert r.satisfied({"a": 3, "b": 2})  # 3 < 2 * 2
    assert not r.satisfied({"a": 4, "b": 2})  # 4 < 2 * 2 is false: strict
    r3 = req(model="recursive", c=1, l=3)  # r1 < r3 + r4 + ...
    assert not r3.satisfied({"a": 5, "b": 3, "c": 2})  # 5 < 2
    assert req(model="recursive", c=3, l=3).satisfied({"a": 5, "b": 3, "c": 2})  # 5 < 3 * 2
    assert not req(model="recursive", c=100, l=3).satisfied({"a": 5, "b": 3})  # fewer than l values
    assert req(model="recursive", c=2, l=2).satisfied({"x": 2, "y": 2, "z": 1, "w": 1})  # 2 < 2 * (2 + 1 + 1)


def test_ordered_emd_reproduces_li_li_venkatasubramanian() -> None:
    """t-Closeness (ICDE 2007), Sec. 4.2: salaries {3k, ..., 11k} uniformly in the table; the class {3k, 4k, 5k}
    is at 0.375, the class {6k, 8k, 11k} at 0.167 (ordered distance)."""
    q = {s: 1 for s in range(3, 12)}
    one = req(t=0.375, distance="ordered")
    _, p1, ref = counts_matrix([{3: 1, 4: 1, 5: 1}], q)
    _, p2, _ = counts_matrix([{6: 1, 8: 1, 11: 1}], q)
    assert ref is not None
    assert float(emd(p1, ref, "ordered")[0]) == pytest.approx(0.375)
    assert float(emd(p2, ref, "ordered")[0]) == pytest.approx(1 / 6)
    assert one.satisfied({3: 1, 4: 1, 5: 1}, q) and not req(t=0.37, distance="ordered").satisfied({3: 1, 4: 1, 5: 1}, q)
    assert req(t=0.17, distance="ordered").satisfied({6: 1, 8: 1, 11: 1}, q)


def test_equal_distance_emd_is_the_total_variation() -> None:
    # nine diseases uniformly in the table, a class holding three of them: 1/2 (3 x 2/9 + 6 x 1/9) = 2/3
    q = {d: 1 for d in "abcdefghi"}
    _, p, ref = counts_matrix([{"a": 1, "b": 1, "c": 1}], q)
    assert ref is not None
    assert float(emd(p, ref, "equal")[0]) == pytest.approx(2 / 3)
    # income: class 7 x <=50K, 3 x >50K against 76 / 24: |0.30 - 0.24| = 0.06
    assert float(emd(np.array([7, 3]), np.array([76, 24]), "equal")) == pytest.approx(0.06)
    assert req(t=0.06).satisfied({"<=50K": 7, ">50K": 3}, {"<=50K": 76, ">50K": 24})
    assert not req(t=0.05).satisfied({"<=50K": 7, ">50K": 3}, {"<=50K": 76, ">50K": 24})


def test_two_values_ordered_equals_equal() -> None:
    for p in ([7, 3], [10, 0], [0, 4], [1, 1]):
        a, b = emd(np.array(p), np.array([76, 24]), "ordered"), emd(np.array(p), np.array([76, 24]), "equal")
        assert float(a) == pytest.approx(float(b)) == pytest.approx(abs(p[0] / sum(p) - 0.76))


def test_ordered_domain_is_what_the_class_or_the_reference_holds() -> None:
    # a value neither holds (a zero column) is no step of the ordered distance
    with_gap = emd(np.array([1, 0, 0, 1]), np.array([1, 1, 0, 0]), "ordered")
    without = emd(np.array([1, 0, 1]), np.array([1, 1, 0]), "ordered")
    assert float(with_gap) == pytest.approx(float(without)) == pytest.approx((0 + 0.5 + 0) / 2)


def test_t_closeness_needs_its_reference_and_an_empty_class_never_passes() -> None:
    with pytest.raises(ValueError, match="reference"):
        req(t=0.2).check(np.array([1, 1]))
    assert not req().check(np.array([0, 0]))
    assert not req(t=1).satisfied({}, {"a": 1})


def test_parameters_are_validated_naming_the_option() -> None:
    cases = [({"model": "max"}, "diversity"), ({"model": "recursive", "l": 2}, "c"), ({"c": 2, "l": 2}, "c"),
             ({"model": "recursive", "c": 2, "l": 1}, "l"), ({"l": 1.5}, "l"), ({"model": "entropy", "l": 0.5}, "l"),
             ({"t": 1.5}, "t_closeness"), ({"t": -0.1}, "t_closeness"), ({"distance": "auto"}, "t_distance"),
             ({"model": "recursive", "c": 0, "l": 2}, "c"), ({"l": True}, "l")]
    for kw, name in cases:
        with pytest.raises(DiversityParameterError) as e:
            req(**kw)
        assert e.value.parameter == name, kw
    with pytest.raises(DiversityParameterError, match="ordered needs numeric"):
        DiversityRequirement.resolve_distance("ordered", numeric=False)
    assert DiversityRequirement.resolve_distance("auto", numeric=True) == "ordered"
    assert DiversityRequirement.resolve_distance("auto", numeric=False) == "equal"


def test_descriptions_and_public_fields() -> None:
    assert req(l=2).public_fields() == {} and req(l=2).describe() == "distinct 2-diversity"
    e = req(model="entropy", l=1.5, t=0.2)
    assert e.public_fields() == {"diversity": {"model": "entropy", "l": 1.5},
                                 "t_closeness": {"t": 0.2, "distance": "equal"}}
    assert req(model="recursive", c=3, l=2).public_fields() == {"diversity": {"model": "recursive", "l": 2, "c": 3}}
    assert e.min_distinct == 2 and req(model="entropy", l=2).min_distinct == 2 and req(t=0.1).min_distinct == 1
    assert req(l=2).monotone and not e.monotone and not req(t=0.3).monotone
    lines = req(model="entropy", l=2, t=0.1).explain({"a": 9, "b": 1}, {"a": 1, "b": 1}, "income")
    assert len(lines) == 2 and "entropy of 'income' 0.3251 < log(l)=0.6931" in lines[0]
    assert "EMD of 'income' to the reference 0.4000 > t=0.1" in lines[1]


def test_disclosure_figures() -> None:
    f = disclosure_figures([{"a": 9, "b": 1}, {"a": 5, "b": 5}, {"b": 10}], prior={"a": 14, "b": 16, "c": 10})
    assert f["records"] == 30 and f["classes"] == 3
    assert f["share_dominated"] == pytest.approx(20 / 30)  # 9/10 and 10/10 are >= 90 %
    assert f["majority_guess"] == pytest.approx((9 + 5 + 10) / 30)
    assert f["prior_released"] == pytest.approx(16 / 30) and f["prior"] == pytest.approx(16 / 40)


def test_running_reference_freezes_every_n_arrivals() -> None:
    ref = RunningReference(3)
    ref.observe("a")
    assert ref.current() == (("a", 1),)  # before the first snapshot: the live counts
    ref.observe("b")
    ref.observe("b")
    assert ref.current() == (("a", 1), ("b", 2))  # frozen after the 3rd
    ref.observe("a")
    ref.observe(">")
    assert ref.current() == (("a", 1), ("b", 2))  # still the snapshot
    ref.observe("b")
    assert ref.current() == ((">", 1), ("a", 2), ("b", 3))
    num = RunningReference(10)
    for v in (10, 2.5, 3):
        num.observe(v)
    assert [v for v, _ in num.current()] == [2.5, 3, 10]  # numbers in numeric order
    with pytest.raises(DiversityParameterError):
        RunningReference(0)


# ---------------------------------------------------------------------------------------------- properties
counts_lists = st.lists(st.integers(0, 12), min_size=1, max_size=7)
models = st.one_of(
    st.builds(lambda l_: req(l=l_), st.integers(1, 5)),
    st.builds(lambda l_: req(model="entropy", l=l_), st.floats(1.0, 5.0, allow_nan=False)),
    st.builds(lambda c, l_: req(model="recursive", c=c, l=l_), st.floats(0.1, 5.0, allow_nan=False), st.integers(2, 5)),
    st.builds(lambda t, d: req(t=t, distance=d), st.floats(0.0, 1.0, allow_nan=False), st.sampled_from(["equal", "ordered"])),
    st.builds(lambda l_, t: req(model="entropy", l=l_, t=t), st.floats(1.0, 3.0, allow_nan=False),
              st.floats(0.0, 1.0, allow_nan=False)),
)


@settings(max_examples=400, deadline=None)
@given(counts=counts_lists, l_=st.floats(1.0, 6.0, allow_nan=False))
def test_entropy_l_implies_distinct_ceil_l(counts: list[int], l_: float) -> None:
    c = np.array(counts)
    if req(model="entropy", l=l_).check(c):
        assert req(l=math.ceil(l_ - 1e-9)).check(c)


@settings(max_examples=400, deadline=None)
@given(counts=counts_lists, c=st.floats(0.1, 10.0, allow_nan=False), l_=st.integers(2, 6))
def test_recursive_c_l_implies_distinct_l(counts: list[int], c: float, l_: int) -> None:
    x = np.array(counts)
    if req(model="recursive", c=c, l=l_).check(x):
        assert req(l=l_).check(x)


@settings(max_examples=300, deadline=None)
@given(counts=counts_lists, lo=st.floats(1.0, 4.0, allow_nan=False), step=st.floats(0.0, 2.0, allow_nan=False))
def test_entropy_l_is_monotone_in_l(counts: list[int], lo: float, step: float) -> None:
    x = np.array(counts)
    if req(model="entropy", l=lo + step).check(x):
        assert req(model="entropy", l=lo).check(x)


@pytest.mark.slow  # (CI's full suite; not in the fast tier, for its time budget)
@settings(max_examples=500, deadline=None)
@given(model=models, rows=st.lists(counts_lists, min_size=1, max_size=6), data=st.data())
def test_plain_python_check_equals_the_vectorized_check(model: DiversityRequirement, rows: list[list[int]],
                                                        data: st.DataObject) -> None:
    width = max(len(r) for r in rows)
    mat = np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.float64)
    ref = np.array(data.draw(st.lists(st.integers(0, 30), min_size=width, max_size=width)), dtype=np.float64)
    vec = model.check(mat, ref if model.t is not None else None)
    for i in range(len(rows)):
        assert bool(vec[i]) == model.check_row(mat[i].tolist(), ref.tolist() if model.t is not None else None)


@settings(max_examples=300, deadline=None)
@given(p=counts_lists, data=st.data(), distance=st.sampled_from(["equal", "ordered"]), k=st.integers(2, 5))
def test_emd_is_a_distance_in_0_1_and_scale_free(p: list[int], data: st.DataObject, distance: str, k: int) -> None:
    q = data.draw(st.lists(st.integers(0, 20), min_size=len(p), max_size=len(p)))
    a, b = np.array(p, dtype=float), np.array(q, dtype=float)
    d = float(emd(a, b, distance))
    assert -1e-12 <= d <= 1 + 1e-12
    assert float(emd(a * k, b, distance)) == pytest.approx(d)  # only the distributions matter
    if a.sum() > 0:
        assert float(emd(a, a, distance)) == pytest.approx(0.0, abs=1e-12)
        assert req(t=1.0, distance=distance).check(a, b) == (b.sum() > 0)  # t = 1 admits every class


# ---------------------------------------------------------------------------------------------- class + LDP copies
def _posterior_odds(values: list[str], lik: list[dict[str, float]], v: str, w: str) -> float:
    """Exact odds P(T=v)/P(T=w) for member 0 of a class whose multiset of values is ``values`` (all assignments
    equally likely a priori), given each member's copy likelihoods ``lik[i][value]``."""
    from itertools import combinations

    def arrangements(members: tuple[int, ...], left: list[str]) -> list[dict[int, str]]:
        if not left:
            return [{}]
        x = left[0]
        k = left.count(x)
        rest = [y for y in left if y != x]
        out = []
        for chosen in combinations(members, k):
            others = tuple(m for m in members if m not in chosen)
            for tail in arrangements(others, rest):
                out.append({**{m: x for m in chosen}, **tail})
        return out

    num = {v: 0.0, w: 0.0}
    for sigma in arrangements(tuple(range(len(values))), sorted(values)):
        if sigma[0] in num:
            p = 1.0
            for i, x in sigma.items():
                p *= lik[i][x]
            num[sigma[0]] += p
    return num[v] / num[w]


@settings(max_examples=150, deadline=None)
@given(cv=st.integers(1, 3), cw=st.integers(1, 3), cu=st.integers(0, 1), eps_t=st.floats(0.0, 2.0),
       eps_o=st.floats(0.0, 2.0), data=st.data())
def test_class_with_linked_ldp_copies_is_bounded_by_e_to_eps_t_plus_eps_o(
        cv: int, cw: int, cu: int, eps_t: float, eps_o: float, data: st.DataObject) -> None:
    """docs/threat-model.md, "Combining a class with LDP copies": the odds a class gives, c_v / c_w, times at most
    e^(eps_T) e^(eps_O) (not e^eps), and the bound is attained."""
    values = ["v"] * cv + ["w"] * cw + ["u"] * cu
    n = len(values)

    def copy(eps: float) -> dict[str, float]:  # an eps-LDP copy: likelihoods within a factor e^eps of each other
        return {x: math.exp(data.draw(st.floats(0.0, 1.0)) * eps) for x in "vwu"}

    lik = [copy(eps_t)] + [copy(eps_o) for _ in range(n - 1)]
    bound = cv / cw * math.exp(eps_t) * math.exp(eps_o)
    assert _posterior_odds(values, lik, "v", "w") <= bound * (1 + 1e-9)
    worst = [{"v": math.exp(eps_t), "w": 1.0, "u": 1.0}] + [{"v": 1.0, "w": math.exp(eps_o), "u": 1.0}] * (n - 1)
    if cu == 0:
        assert _posterior_odds(values, worst, "v", "w") == pytest.approx(bound)


def test_the_documented_example() -> None:
    # 7 x <=50K, 3 x >50K, every member's income copy eps = 1: odds 3/7 -> 3/7 e^2 = 3.17, probability 0.76
    values = [">"] * 3 + ["<"] * 7
    worst = [{">": math.e, "<": 1.0}] + [{">": 1.0, "<": math.e}] * 9
    odds = _posterior_odds(values, worst, ">", "<")
    assert odds == pytest.approx(3 / 7 * math.e ** 2) and odds / (1 + odds) == pytest.approx(0.7600, abs=1e-4)
