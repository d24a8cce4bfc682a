"""Loss metrics: exact hand-checked values (Fractions), identities between metrics, float == exact."""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction as F
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from stream_anon.core.datasets import read_adult
from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.intervals import format_interval
from stream_anon.core.loss import (
    ClassArrays,
    ReleasedClass,
    attribute_loss_matrix,
    average_class_size,
    cail_categorical_loss,
    cail_loss_matrix,
    cail_record_loss,
    cail_table,
    castle_loss,
    castle_loss_with_suppressed,
    castle_record_loss,
    categorical_attribute_loss,
    discernibility,
    goldberger_tassa_loss,
    gt_loss_table,
    iyengar_lm_loss,
    iyengar_lm_loss_per_attribute,
    numeric_attribute_loss,
    numeric_inverse_width,
    numeric_range_loss,
    parse_generalization,
    summarize_classes,
    summarize_release_frame,
    summarize_releases,
    ubdsa_cail_loss,
)
from stream_anon.core.schema import Attribute, Kind, Role, Schema, adult_schema

QI, CAT, NUM = Role.QUASI_IDENTIFIER, Kind.CATEGORICAL, Kind.NUMERIC
GENDER = Hierarchy.from_csv_text("male;*\nfemale;*\n", "gender")
ZIP = Hierarchy.from_csv_text(
    "62201;622**;*****\n62208;622**;*****\n35733;357**;*****\n35751;357**;*****\n35791;357**;*****\n", "zip")


def toy_schema(with_age: bool = False) -> Schema:
    """The issue's test vector (gender, zip); optionally a numeric QI age with public domain [0, 100]."""
    attrs = [Attribute("gender", QI, CAT, hierarchy=GENDER), Attribute("zip", QI, CAT, hierarchy=ZIP)]
    if with_age:
        attrs.insert(0, Attribute("age", QI, NUM, lo=0, hi=100, integer=True))
    attrs.append(Attribute("disease", Role.SENSITIVE, CAT, values=("flu", "cold", "none")))
    return Schema("toy", tuple(attrs), record_id="id")


def one_class(schema: Schema, gen: dict[str, str], size: int, exact: bool = True) -> ClassArrays:
    b = parse_generalization(schema, gen, exact=exact)
    return ClassArrays.from_classes(schema, [ReleasedClass(records=size, bounds=b)], exact=exact)


# ------------------------------------------------------------------ the issue's vector
def test_issue_vector_gt_contribution_is_three_quarters() -> None:
    s = toy_schema()
    bounds = parse_generalization(s, {"gender": "male", "zip": "357**"})
    assert bounds == {"gender": (0, 0), "zip": (2, 4)}
    # l_gender(male) = (1-1)/(2-1) = 0; l_zip(357**) = (3-1)/(5-1) = 2/4
    assert categorical_attribute_loss(GENDER, 0, 0) == 0
    assert categorical_attribute_loss(ZIP, 2, 4) == F(2, 4)
    assert castle_record_loss(s, bounds) == F(1, 4)
    arrays = one_class(s, {"gender": "male", "zip": "357**"}, 3)
    lm = attribute_loss_matrix(s, arrays, exact=True)
    assert lm.tolist() == [[F(0), F(1, 2)]]
    # contribution |C| * (1/J) * sum_a l_a = 3 * (1/2)(0 + 2/4) = 3/4; GT divides by N = 3
    gt = goldberger_tassa_loss(arrays.records, lm, 0)
    assert isinstance(gt, F) and gt * 3 == F(3, 4)
    assert gt == F(1, 4)


def test_issue_vector_cluster_from_records_matches_lca() -> None:
    s = toy_schema()
    members = [("male", "35733"), ("male", "35751"), ("male", "35791")]
    g_idx = [GENDER.leaf_index[g] for g, _ in members]
    z_idx = [ZIP.leaf_index[z] for _, z in members]
    assert GENDER.label_of_range(min(g_idx), max(g_idx)) == "male"
    assert ZIP.label_of_range(min(z_idx), max(z_idx)) == "357**"
    c = ReleasedClass(records=3, bounds={"gender": (min(g_idx), max(g_idx)), "zip": (min(z_idx), max(z_idx))})
    arrays = ClassArrays.from_classes(s, [c], exact=True)
    assert goldberger_tassa_loss(arrays.records, attribute_loss_matrix(s, arrays, exact=True)) == F(1, 4)


# ------------------------------------------------------------------ own cases
def test_singleton_released_alone_costs_zero_everywhere() -> None:
    s = toy_schema(with_age=True)
    arrays = one_class(s, {"age": "[37-37]", "gender": "female", "zip": "62208"}, 1)
    summary = summarize_classes(s, arrays, k=1, exact=True)
    assert summary.gt_loss == 0 and summary.lm_loss == 0 and summary.ubdsa_loss == 0
    assert summary.castle_loss == 0 and summary.castle_loss_with_suppressed == 0
    assert summary.discernibility == 1 and summary.c_avg == 1
    assert summary.lm_loss_per_attribute == {"age": 0, "gender": 0, "zip": 0}


def test_suppression_counts_one_per_record() -> None:
    s = toy_schema()
    arrays = one_class(s, {"gender": "male", "zip": "357**"}, 3)
    sm = summarize_classes(s, arrays, k=3, suppressed=2, exact=True)
    # N = 5: GT = (3 * 1/4 + 2) / 5 = 11/20
    assert sm.gt_loss == F(11, 20)
    assert sm.lm_loss_per_attribute == {"gender": F(2, 5), "zip": F(3 * F(1, 2) + 2, 5)}
    assert sm.lm_loss == F(2, 5) + F(7, 10) and sm.lm_loss_normalized == F(11, 20)
    assert sm.castle_loss == F(1, 4)  # released records only
    assert sm.castle_loss_with_suppressed == F(11, 20)
    assert sm.ubdsa_loss == F(3, 5) / 2  # CAIL ignores suppression: (0 + 3/5) / J
    assert sm.discernibility == 3 * 3 + 2 * 5
    assert (sm.records_released, sm.records_suppressed, sm.classes, sm.min_class_size) == (3, 2, 1, 3)


def test_everything_suppressed() -> None:
    s = toy_schema()
    empty = ClassArrays.from_classes(s, [], exact=True)
    sm = summarize_classes(s, empty, k=2, suppressed=4, exact=True)
    assert sm.gt_loss == 1 and sm.lm_loss == 2 and sm.lm_loss_normalized == 1
    assert sm.castle_loss_with_suppressed == 1
    assert sm.castle_loss == 0 and sm.ubdsa_loss == 0  # defined as 0 when nothing is released
    assert sm.discernibility == 4 * 4 and sm.classes == 0 and sm.min_class_size == 0 and sm.c_avg == 0
    nothing = summarize_classes(s, empty, k=2, suppressed=0, exact=True)
    assert nothing.gt_loss == 0 and nothing.discernibility == 0


def test_lm_range_is_zero_to_j() -> None:
    s = toy_schema(with_age=True)
    top = one_class(s, {"age": "[0-100]", "gender": "*", "zip": "*****"}, 4)
    sm = summarize_classes(s, top, k=2, exact=True)
    assert sm.lm_loss == 3 and sm.lm_loss_normalized == 1 and sm.gt_loss == 1
    assert sm.ubdsa_loss == 1  # root: leaves/|A| = 1 for both categorical QIs, numeric full width 1
    bottom = one_class(s, {"age": "[50-50]", "gender": "male", "zip": "62201"}, 4)
    assert summarize_classes(s, bottom, k=2, exact=True).lm_loss == 0


def test_mixed_numeric_and_categorical_exact() -> None:
    s = toy_schema(with_age=True)
    classes = [
        ReleasedClass(3, {"age": (30, 39), "gender": (0, 1), "zip": (0, 1)}),  # age 9/100, gender 1, zip 1/4
        ReleasedClass(2, {"age": (F(1, 2), F(3, 2)), "gender": (1, 1), "zip": (2, 2)}),  # age 1/100, 0, 0
    ]
    arrays = ClassArrays.from_classes(s, classes, exact=True)
    lm = attribute_loss_matrix(s, arrays, exact=True)
    assert lm.tolist() == [[F(9, 100), F(1), F(1, 4)], [F(1, 100), F(0), F(0)]]
    assert numeric_attribute_loss(30, 39, 0, 100) == F(9, 100)
    per = iyengar_lm_loss_per_attribute(arrays.records, lm, 1)
    assert per == [F(3 * 9 + 2 * 1, 100 * 6) + F(1, 6), F(3 + 1, 6), F(F(3, 4) + 1, 6)]
    gt = goldberger_tassa_loss(arrays.records, lm, 1)
    assert gt == (3 * (F(9, 100) + 1 + F(1, 4)) / 3 + 2 * F(1, 100) / 3 + 1) / 6
    assert iyengar_lm_loss(arrays.records, lm, 1) == 3 * gt
    assert castle_loss_with_suppressed(arrays.records, lm, 1) == gt
    assert castle_loss(arrays.records, lm) == (3 * (F(9, 100) + 1 + F(1, 4)) + 2 * F(1, 100)) / (3 * 5)
    cail = cail_loss_matrix(s, arrays, exact=True)
    # CAIL: gender "*" = 2/2; zip 622** = 2/5 (LM: 1/4); leaves 0
    assert cail.tolist() == [[F(9, 100), F(1), F(2, 5)], [F(1, 100), F(0), F(0)]]
    assert ubdsa_cail_loss(arrays.records, cail) == (3 * (F(9, 100) + 1 + F(2, 5)) + 2 * F(1, 100)) / (5 * 3)


def test_cail_hand_values_and_difference_from_lm() -> None:
    nc = adult_schema()["native-country"].hierarchy
    assert nc is not None and nc.n_leaves == 42
    india, iran = nc.leaf_index["India"], nc.leaf_index["Iran"]
    lo, hi = sorted((india, iran))
    assert nc.node_labels[nc.lca[lo, hi]] == "South-Asia"
    assert cail_categorical_loss(nc, lo, hi) == F(2, 42)  # a 2-leaf node among 42
    assert categorical_attribute_loss(nc, lo, hi) == F(1, 41)
    assert cail_categorical_loss(GENDER, 0, 1) == categorical_attribute_loss(GENDER, 0, 1) == 1  # 2 of 2
    assert cail_categorical_loss(ZIP, 3, 3) == categorical_attribute_loss(ZIP, 3, 3) == 0  # a leaf
    assert cail_categorical_loss(ZIP, 0, 4) == categorical_attribute_loss(ZIP, 0, 4) == 1  # the root
    # single-child chain "?" < Unknown-country < Unknown: LCA of one leaf is the leaf itself, cost 0
    q = nc.leaf_index["?"]
    assert cail_categorical_loss(nc, q, q) == 0
    s = toy_schema(with_age=True)
    rec = {"age": (10, 30), "gender": (0, 1), "zip": (0, 1)}
    assert cail_record_loss(s, rec) == F(20, 100) + 1 + F(2, 5)  # a sum, not divided by J
    assert castle_record_loss(s, rec) == (F(20, 100) + 1 + F(1, 4)) / 3


def test_discernibility_and_average_class_size() -> None:
    rec = np.array([3, 4])
    assert discernibility(rec, 1) == 9 + 16 + 1 * 8
    assert discernibility(rec) == 25
    assert average_class_size(rec, 3) == F(7, 6)
    assert average_class_size(np.array([5, 5, 5]), 5) == 1
    with pytest.raises(ValueError, match="k must be >= 1"):
        average_class_size(rec, 0)


def test_identities_and_float_path_match_exact() -> None:
    """GT == LM/J == CASTLE-with-suppressed; the float path equals the exact one; all in range."""
    s = adult_schema()
    rng = np.random.default_rng(7)
    classes = []
    for _ in range(200):
        bounds: dict[str, tuple[Any, Any]] = {}
        for a in s.numeric_qis:
            assert a.lo is not None and a.hi is not None
            x = np.sort(rng.integers(int(a.lo), int(a.hi) + 1, size=2))
            bounds[a.name] = (int(x[0]), int(x[1]))
        for a in s.categorical_qis:
            assert a.hierarchy is not None
            x = np.sort(rng.integers(0, a.hierarchy.n_leaves, size=2))
            bounds[a.name] = (int(x[0]), int(x[1]))
        classes.append(ReleasedClass(int(rng.integers(1, 30)), bounds))
    exact = summarize_classes(s, ClassArrays.from_classes(s, classes, exact=True), k=5, suppressed=37, exact=True)
    flt = summarize_classes(s, ClassArrays.from_classes(s, classes), k=5, suppressed=37)
    j = len(s.qis)
    assert exact.gt_loss == exact.lm_loss / j == exact.lm_loss_normalized == exact.castle_loss_with_suppressed
    assert 0 < exact.castle_loss < exact.gt_loss < 1  # suppression only adds loss
    assert 0 <= exact.ubdsa_loss <= 1
    for key, v in exact.as_dict().items():
        w = flt.as_dict()[key]
        if isinstance(v, dict):
            assert v == pytest.approx(w, rel=1e-12, abs=1e-15), key
        else:
            assert v == pytest.approx(w, rel=1e-12), key
    assert isinstance(flt.gt_loss, float) and isinstance(exact.gt_loss, F)


def test_parse_generalization_errors_name_the_field() -> None:
    s = toy_schema(with_age=True)
    with pytest.raises(ValueError, match="'zip'.*missing"):
        parse_generalization(s, {"age": "[1-2]", "gender": "*"})
    with pytest.raises(ValueError, match="no node labelled '999\\*\\*'"):
        parse_generalization(s, {"age": "[1-2]", "gender": "*", "zip": "999**"})
    with pytest.raises(ValueError, match="field 'age'.*not an interval"):
        parse_generalization(s, {"age": "thirty", "gender": "*", "zip": "*****"})
    assert parse_generalization(s, {"age": "[-5--1]", "gender": "*", "zip": "*****"}, exact=True)["age"] == (-5, -1)
    assert parse_generalization(s, {"age": "42", "gender": "*", "zip": "*****"})["age"] == (42.0, 42.0)


# ------------------------------------------------------------------ summaries from releases and frames
@dataclass(frozen=True)
class FakeRelease:
    class_id: str
    kind: str
    generalized: dict[str, str]
    record_ids: tuple[str, ...]
    records: tuple[dict[str, Any], ...] = field(default=())


def _rec(rid: str, gender: str, zipc: str, pid: str | None = None) -> dict[str, Any]:
    r = {"id": rid, "gender": gender, "zip": zipc, "disease": "flu"}
    if pid is not None:
        r["pid"] = pid
    return r


def test_summarize_releases_groups_reused_classes_and_counts_suppressed() -> None:
    s = toy_schema()
    g1 = {"gender": "male", "zip": "357**"}
    g2 = {"gender": "*", "zip": "622**"}
    releases = [
        FakeRelease("c1", "class", g1, ("r1", "r2", "r3"),
                    (_rec("r1", "male", "35733"), _rec("r2", "male", "35751"), _rec("r3", "male", "35791"))),
        FakeRelease("c2", "class", g2, ("r4", "r5"), (_rec("r4", "male", "62201"), _rec("r5", "female", "62208"))),
        FakeRelease("s1", "suppressed", {}, ("r6",), (_rec("r6", "female", "35733"),)),
        FakeRelease("c1", "class", g1, ("r7",), (_rec("r7", "male", "35751"),)),  # reused generalization
    ]
    sm = summarize_releases(releases, s, k=2, exact=True)
    assert (sm.records_released, sm.records_suppressed, sm.classes, sm.min_class_size) == (6, 1, 2, 2)
    assert sm.distinct_generalizations == 2
    # c1: 4 records, l = (0, 1/2); c2: 2 records, l = (1, 1/4); N = 7
    assert sm.gt_loss == (4 * F(1, 4) + 2 * F(5, 8) + 1) / 7
    assert sm.discernibility == 16 + 4 + 7
    assert sm.c_avg == F(6, 2 * 2)
    assert sm.ubdsa_loss == (4 * F(3, 5) + 2 * (1 + F(2, 5))) / (6 * 2)
    # the same table as a released CSV frame gives the same summary
    rows = [(rid, r.class_id, r.generalized["gender"], r.generalized["zip"], "flu")
            for r in releases if r.kind == "class" for rid in r.record_ids]
    frame = pd.DataFrame(rows, columns=["record_id", "class_id", "gender", "zip", "disease"])
    assert summarize_release_frame(frame, s, k=2, records_suppressed=1, exact=True) == sm
    json_ready = sm.as_dict()
    assert json_ready["gt_loss"] == pytest.approx(float(sm.gt_loss)) and isinstance(json_ready["gt_loss"], float)


def test_summarize_releases_counts_distinct_persons() -> None:
    s = Schema("toy", toy_schema().attributes, record_id="id", person_id="pid")
    g = {"gender": "male", "zip": "357**"}
    releases = [FakeRelease("c1", "class", g, ("a", "b", "c"),
                            (_rec("a", "male", "35733", "p1"), _rec("b", "male", "35751", "p1"),
                             _rec("c", "male", "35791", "p2")))]
    sm = summarize_releases(releases, s, k=2)
    assert sm.records_released == 3 and sm.min_class_size == 2  # 3 tuples, 2 individuals


def test_summarize_releases_rejects_conflicting_generalizations() -> None:
    s = toy_schema()
    releases = [FakeRelease("c1", "class", {"gender": "male", "zip": "357**"}, ("a",)),
                FakeRelease("c1", "class", {"gender": "*", "zip": "357**"}, ("b",))]
    with pytest.raises(ValueError, match="class 'c1' released under two different generalizations"):
        summarize_releases(releases, s, k=1)
    with pytest.raises(ValueError, match="kind must be"):
        summarize_releases([FakeRelease("x", "weird", {}, ("a",))], s, k=1)


def test_summarize_release_frame_missing_column() -> None:
    s = toy_schema()
    with pytest.raises(ValueError, match=r"column\(s\) \['zip'\] missing"):
        summarize_release_frame(pd.DataFrame({"record_id": ["a"], "class_id": ["c"], "gender": ["*"]}), s, k=1)


@pytest.mark.slow  # (exact arithmetic over all of ADULT: CI's full suite; the small exact-equals-float cases stay fast)
def test_adult_sorted_partition_summary_exact_equals_float(adult_path: Path) -> None:
    """A 32k-record release (ADULT sorted and cut into classes of 10): float == exact, identities hold."""
    s = adult_schema()
    df = read_adult(adult_path)
    order = df.sort_values(["age", "education-num", "sex"], kind="stable").index.to_numpy()
    cls = np.arange(len(order)) // 10
    cls[cls == cls.max()] = cls.max() - 1  # last partial class joins the previous one
    d = df.loc[order].reset_index(drop=True)
    d["class_id"] = cls
    g = d.groupby("class_id", sort=False)
    out = pd.DataFrame({"record_id": d["id"], "class_id": d["class_id"].astype(str)})
    for a in s.numeric_qis:
        lo, hi = g[a.name].transform("min"), g[a.name].transform("max")
        out[a.name] = [format_interval(x, y) for x, y in zip(lo, hi, strict=True)]
    for a in s.categorical_qis:
        h = a.hierarchy
        assert h is not None
        idx = d[a.name].map(h.leaf_index)
        lo = idx.groupby(d["class_id"]).transform("min")
        hi = idx.groupby(d["class_id"]).transform("max")
        out[a.name] = [h.label_of_range(x, y) for x, y in zip(lo, hi, strict=True)]
    out["income"] = d["income"]
    exact = summarize_release_frame(out, s, k=10, records_suppressed=100, exact=True)
    flt = summarize_release_frame(out, s, k=10, records_suppressed=100)
    assert exact.records_released == 32_561 and exact.classes == 3256 and exact.min_class_size == 10
    assert exact.gt_loss == exact.lm_loss_normalized == exact.castle_loss_with_suppressed
    assert float(exact.gt_loss) == pytest.approx(flt.gt_loss, rel=1e-12)
    assert float(exact.ubdsa_loss) == pytest.approx(flt.ubdsa_loss, rel=1e-12)
    # sorted by age first: the age intervals are nearly points, the unsorted categorical QIs are not
    assert flt.lm_loss_per_attribute["age"] < 0.01 < flt.lm_loss_per_attribute["occupation"]



def test_the_formulas_float_tables_are_the_exact_ones_rounded() -> None:
    """One formula per term: the float tables the engine scores with are the exact Fractions, correctly rounded
    (a quotient of two small integers in binary64 is the rounded exact quotient), on every ADULT hierarchy."""
    to_float = np.vectorize(float, otypes=[np.float64])
    for a in adult_schema().categorical_qis:
        h = a.hierarchy
        assert h is not None
        for table in (gt_loss_table, cail_table):
            exact, flt = table(h, exact=True), table(h)
            assert exact.dtype == object and isinstance(exact[0, -1], F)
            assert np.array_equal(to_float(exact), flt), (a.name, table.__name__)
        assert gt_loss_table(h)[0, 0] == 0 and cail_table(h)[0, 0] == 0 and gt_loss_table(h)[0, -1] == 1
    inv = numeric_inverse_width(17, 90, exact=True)
    assert inv == F(1, 73) and numeric_range_loss(F(20), F(38), inv) == F(18, 73)
    assert numeric_range_loss(np.array([20.0, 17.0]), np.array([38.0, 90.0]), numeric_inverse_width(17, 90)).tolist() \
        == [18.0 * (1.0 / 73.0), 73.0 * (1.0 / 73.0)]
    with pytest.raises(ValueError, match=r"need hi > lo"):
        numeric_inverse_width(5, 5)
