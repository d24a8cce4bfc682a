"""Independent verifier of released tables: every check can fail, and each failure names its class."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from stream_anon.core.datasets import read_adult
from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.intervals import format_interval
from stream_anon.core.schema import Attribute, Kind, Role, Schema, adult_schema
from stream_anon.core.verify import (
    ReleaseRoles,
    RolesError,
    meta_path,
    read_release_meta,
    resolve_roles,
    verify_release_file,
    verify_release_frame,
    write_release_meta,
)

QI, CAT, NUM = Role.QUASI_IDENTIFIER, Kind.CATEGORICAL, Kind.NUMERIC
ZIP = Hierarchy.from_csv_text(
    "62201;622**;*****\n62208;622**;*****\n35733;357**;*****\n35751;357**;*****\n35791;357**;*****\n", "zip")
SCHEMA = Schema("toy", (Attribute("age", QI, NUM, lo=0, hi=100, integer=True), Attribute("zip", QI, CAT, hierarchy=ZIP),
                        Attribute("disease", Role.SENSITIVE, CAT, values=("flu", "cold", "none"))), record_id="id")
ORIGINAL = pd.DataFrame({"id": ["r1", "r2", "r3", "r4", "r5", "r6"], "age": [30, 34, 39, 50, 52, 51],
                         "zip": ["35733", "35751", "35791", "62201", "62208", "62201"],
                         "disease": ["flu", "cold", "flu", "none", "flu", "cold"]})


def released() -> pd.DataFrame:
    return pd.DataFrame({
        "record_id": ["r1", "r2", "r3", "r4", "r5", "r6"],
        "class_id": ["A", "A", "A", "B", "B", "B"],
        "age": ["[30-39]"] * 3 + ["[50-52]"] * 3,
        "zip": ["357**"] * 3 + ["622**"] * 3,
        "disease": ["flu", "cold", "flu", "none", "flu", "cold"],
    })


def check(df: pd.DataFrame, k: int = 3, l: int | None = None, **kw: object):  # noqa: E741
    return verify_release_frame(df, ["age", "zip"], k, l, "disease", **kw)  # type: ignore[arg-type]


def test_valid_release_passes_all_checks() -> None:
    r = check(released(), k=3, l=2, schema=SCHEMA, original=ORIGINAL)
    assert r.ok, r.violations
    assert (r.classes, r.min_class_size, r.records) == (2, 3, 6)
    assert "OK" in str(r)


def test_class_below_k_is_named() -> None:
    r = check(released(), k=4)
    assert not r.ok
    assert r.violations == ["class 'A': 3 distinct records < k=4", "class 'B': 3 distinct records < k=4"]
    assert r.violation_counts == {"class below k": 2}


def test_l_diversity_is_at_least_l_not_l_plus_one() -> None:
    # class A holds exactly 2 distinct diseases: l=2 must pass (a port's off-by-one asked for 3)
    assert check(released(), l=2).ok
    r = check(released(), l=3)
    assert r.violations == ["class 'A': 2 distinct 'disease' values < l=3"]
    with pytest.raises(ValueError, match="needs the sensitive column"):
        verify_release_frame(released(), ["age", "zip"], 2, 2)


def test_rows_of_a_class_must_agree() -> None:
    df = released()
    df.loc[1, "zip"] = "*****"
    r = check(df)
    assert len(r.violations) == 1
    assert r.violations[0].startswith("class 'A': rows differ on quasi-identifier(s) ['zip']")


def test_duplicate_record_id() -> None:
    df = released()
    df.loc[4, "record_id"] = "r1"
    r = check(df, k=2)
    assert "record_id 'r1' appears 2 times" in r.violations
    # distinct records per class: B now holds r4, r1, r6 (3 distinct) - still fine for k=2
    assert r.violation_counts == {"duplicate record_id": 1}


def test_person_id_counts_individuals_not_rows() -> None:
    df = released()
    df["pid"] = ["p1", "p1", "p2", "p3", "p4", "p5"]
    assert check(df, k=3).ok
    r = check(df, k=3, person_id="pid")
    assert r.violations == ["class 'A': 2 distinct 'pid' values < k=3"]
    assert r.min_class_size == 2


def test_values_must_parse_and_stay_in_domain() -> None:
    df = released()
    df["age"] = ["[30-39]"] * 3 + ["[50-520]"] * 3
    df["zip"] = ["357**"] * 3 + ["999**"] * 3
    r = check(df, schema=SCHEMA)
    assert r.violation_counts == {"unparsable value": 2}
    assert any("column 'age'" in v and "leaves the public domain [0, 100]" in v for v in r.violations)
    assert any("column 'zip'" in v and "no node labelled '999**'" in v for v in r.violations)


def test_generalization_must_cover_the_original() -> None:
    df = released()
    df["age"] = ["[30-38]"] * 3 + ["[50-52]"] * 3  # r3 is 39
    df["zip"] = ["357**"] * 3 + ["62201"] * 3  # r5 is 62208
    r = check(df, schema=SCHEMA, original=ORIGINAL)
    assert r.violation_counts == {"value not covered": 2}
    assert ("class 'A', record_id 'r3': column 'age' released '[30-38]' does not cover the original value 39"
            in r.violations)
    assert any(v.startswith("class 'B', record_id 'r5': column 'zip' released '62201'") for v in r.violations)
    orig = ORIGINAL[ORIGINAL["id"] != "r6"]
    r2 = check(released(), schema=SCHEMA, original=orig)
    assert r2.violations == ["record_id 'r6' is not in the original data"]
    with pytest.raises(ValueError, match="needs the schema"):
        check(released(), original=ORIGINAL)


def test_parameter_and_column_errors() -> None:
    with pytest.raises(ValueError, match="k must be an integer >= 1, got 0"):
        check(released(), k=0)
    with pytest.raises(ValueError, match="l must be an integer >= 1, got 0"):
        check(released(), l=0)
    with pytest.raises(ValueError, match=r"column\(s\) \['zip'\] missing"):
        check(released().drop(columns=["zip"]))
    empty = check(released().iloc[:0])
    assert empty.ok and empty.classes == 0 and empty.records == 0


def test_zero_quasi_identifiers_is_refused() -> None:
    with pytest.raises(ValueError, match="no quasi-identifier column"):
        verify_release_frame(released(), [], 3, None, "disease")


def test_public_layout_without_record_ids_counts_rows() -> None:
    df = released().drop(columns=["record_id"])
    r = verify_release_frame(df, ["age", "zip"], 3, 2, "disease", record_id=None, schema=SCHEMA)
    assert r.ok and (r.classes, r.min_class_size, r.size_unit) == (2, 3, "records")
    r4 = verify_release_frame(df, ["age", "zip"], 4, record_id=None)
    assert r4.violations == ["class 'A': 3 records < k=4", "class 'B': 3 records < k=4"]
    with pytest.raises(ValueError, match="needs the record ids"):
        verify_release_frame(df, ["age", "zip"], 3, record_id=None, schema=SCHEMA, original=ORIGINAL)
    with pytest.raises(ValueError, match=r"\['record_id'\] missing"):
        verify_release_frame(df, ["age", "zip"], 3)  # the default expects record ids: say so, never guess


def test_person_id_allows_one_persons_repeated_record_id_only() -> None:
    df = released()
    df["pid"] = ["p1", "p2", "p3", "p4", "p5", "p6"]
    df.loc[2, "record_id"] = "r1"  # r1 twice, both for... p1 and p3: two persons
    r = check(df, k=3, person_id="pid")
    assert r.violations == ["record_id 'r1' appears for 2 different 'pid' values"]
    df.loc[2, "pid"] = "p1"  # the same person twice: fine for the id check, but class A has 2 persons
    r2 = check(df, k=3, person_id="pid")
    assert r2.violations == ["class 'A': 2 distinct 'pid' values < k=3"]
    assert check(df, k=2, person_id="pid").ok


COLUMNS = ["record_id", "class_id", "age", "zip", "disease"]


def test_resolve_roles_never_guesses() -> None:
    with pytest.raises(RolesError, match="cannot tell which columns are quasi-identifiers.*--qi.*--schema.*meta"):
        resolve_roles(COLUMNS)
    # naming the QIs but not the sensitive column leaves a column without a role
    with pytest.raises(RolesError, match=r"column\(s\) \['disease'\] have no role"):
        resolve_roles(COLUMNS, qis=["age", "zip"])
    roles = resolve_roles(COLUMNS, qis=["age", "zip"], sensitive="disease")
    assert (roles.quasi_identifiers, roles.sensitive, roles.record_id, roles.layout) == (
        ("age", "zip"), ("disease",), "record_id", "with-ids")
    # from a schema: its QIs and sensitive attributes among the columns
    from_schema = resolve_roles(COLUMNS, schema=SCHEMA)
    assert (from_schema.quasi_identifiers, from_schema.sensitive) == (("age", "zip"), ("disease",))
    assert from_schema.source == "schema 'toy'"
    # the sensitive column dropped: the QIs are still the schema's QIs (never the last column)
    dropped = resolve_roles(["class_id", "age", "zip"], schema=SCHEMA)
    assert (dropped.quasi_identifiers, dropped.sensitive, dropped.layout) == (("age", "zip"), (), "public")
    with pytest.raises(RolesError, match=r"column\(s\) \['delay'\] have no role"):
        resolve_roles([*COLUMNS, "delay"], schema=SCHEMA)
    with pytest.raises(RolesError, match="--qi names 'height' as the quasi-identifier column"):
        resolve_roles(COLUMNS, qis=["height"], sensitive="disease")
    with pytest.raises(RolesError, match="cannot be both a quasi-identifier and sensitive"):
        resolve_roles(COLUMNS, qis=["age", "zip", "disease"], sensitive="disease")
    with pytest.raises(RolesError, match="none of the quasi-identifiers of schema 'toy'"):
        resolve_roles(["class_id", "disease"], schema=SCHEMA)
    with pytest.raises(RolesError, match="'class_id' as the class id column"):
        resolve_roles(["age", "zip", "disease"], qis=["age", "zip"], sensitive="disease")
    with pytest.raises(RolesError, match="appear more than once"):
        resolve_roles(["class_id", "age", "age"], qis=["age"])


def test_meta_file_round_trip_and_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    roles = ReleaseRoles(class_id="class_id", quasi_identifiers=("age", "zip"), sensitive=("disease",),
                         source="test", withheld_person_id="pid")
    meta = write_release_meta(path, roles, k=3)
    assert meta == meta_path(path) == tmp_path / "out.csv.meta.json"
    back = read_release_meta(meta)
    assert (back.class_id, back.quasi_identifiers, back.sensitive, back.record_id, back.withheld_person_id) == (
        "class_id", ("age", "zip"), ("disease",), None, "pid")
    got = resolve_roles(["class_id", "age", "zip", "disease"], meta=back)
    assert got.quasi_identifiers == ("age", "zip") and got.withheld_person_id == "pid"
    # the arguments beat the meta file, and every column still needs a role
    assert resolve_roles(["class_id", "age", "zip", "disease"], meta=back, qis=["zip", "age"]).quasi_identifiers == (
        "zip", "age")
    with pytest.raises(RolesError, match=r"\['disease'\] have no role"):
        resolve_roles(["class_id", "age", "zip", "disease"], meta=back, qis=["age"], sensitive="zip")
    with pytest.raises(RolesError, match=r"names column\(s\) \['disease'\] that the file does not have"):
        resolve_roles(["class_id", "age", "zip"], meta=back, schema=SCHEMA)
    meta.write_text('{"format": "something else"}', encoding="utf-8")
    with pytest.raises(RolesError, match="not a stream-anon release description"):
        read_release_meta(meta)
    meta.write_text("{", encoding="utf-8")
    with pytest.raises(RolesError, match="cannot be read as JSON"):
        read_release_meta(meta)


def test_verify_release_file_takes_roles_from_meta_or_schema(tmp_path: Path) -> None:
    path = tmp_path / "out.csv"
    released().to_csv(path, index=False)
    with pytest.raises(RolesError, match="cannot tell"):
        verify_release_file(path, 3)
    r = verify_release_file(path, 3, 2, schema=SCHEMA)
    assert r.ok and r.classes == 2 and r.roles is not None and r.roles.sensitive == ("disease",)
    assert not verify_release_file(path, 4, schema=SCHEMA).ok
    write_release_meta(path, ReleaseRoles(class_id="class_id", quasi_identifiers=("age", "zip"),
                                          sensitive=("disease",), record_id="record_id"))
    r2 = verify_release_file(path, 3, 2)
    assert r2.ok and r2.roles is not None and r2.roles.source.startswith("meta file")
    with pytest.raises(RolesError, match="cannot tell"):
        verify_release_file(path, 3, meta=False)
    bad = tmp_path / "bad.csv"
    bad.write_text('record_id,class_id\n"a,b\n', encoding="utf-8")
    with pytest.raises(ValueError, match="not a readable CSV"):
        verify_release_file(bad, 2, qi_columns=["class_id"])


def test_edited_release_without_sensitive_column_never_passes(tmp_path: Path) -> None:
    """Regression (issue 11): the sensitive column dropped and a QI edited so that a class falls below k.

    The old verifier took the last column (a QI) as sensitive and passed the file."""
    df = released().drop(columns=["disease"])
    df.loc[[0, 1], "zip"] = "*****"  # class A: only one row keeps '357**'
    path = tmp_path / "edited.csv"
    df.to_csv(path, index=False)
    with pytest.raises(RolesError):
        verify_release_file(path, 3)
    r = verify_release_file(path, 3, schema=SCHEMA)
    assert not r.ok and r.violation_counts == {"inconsistent class": 1}
    df.loc[[0, 1], "class_id"] = "A2"  # consistent classes now, but A and A2 are below k
    df.to_csv(path, index=False)
    r = verify_release_file(path, 3, schema=SCHEMA)
    assert sorted(r.violations) == ["class 'A': 1 distinct records < k=3", "class 'A2': 2 distinct records < k=3"]


def adult_release(df: pd.DataFrame, schema: Schema, k: int) -> pd.DataFrame:
    """A reference k-anonymous release of ADULT: sort, cut into classes of k, generalize each class."""
    order = df.sort_values(["age", "education-num", "sex"], kind="stable").index.to_numpy()
    cls = np.arange(len(order)) // k
    cls[cls == cls.max()] = cls.max() - 1
    d = df.loc[order].reset_index(drop=True)
    key = pd.Series(cls)
    out = pd.DataFrame({"record_id": d["id"], "class_id": [f"c{c}" for c in cls]})
    for a in schema.numeric_qis:
        g = d[a.name].groupby(key)
        out[a.name] = [format_interval(x, y) for x, y in zip(g.transform("min"), g.transform("max"), strict=True)]
    for a in schema.categorical_qis:
        h = a.hierarchy
        assert h is not None
        g = d[a.name].map(h.leaf_index).groupby(key)
        out[a.name] = [h.label_of_range(x, y) for x, y in zip(g.transform("min"), g.transform("max"), strict=True)]
    out["income"] = d["income"]
    return out


@pytest.mark.slow  # (all of ADULT: CI's full suite; the fast tier verifies the engine's output on 2,000 records below)
def test_adult_32k_release_verified_quickly_and_corruption_caught(adult_path: Path, tmp_path: Path) -> None:
    s = adult_schema()
    df = read_adult(adult_path)
    out = adult_release(df, s, 5)
    path = tmp_path / "adult_k5.csv"
    out.to_csv(path, index=False)
    t0 = time.process_time()  # CPU time: the bound holds on a loaded machine
    r = verify_release_file(path, 5, schema=s, original=df)
    seconds = time.process_time() - t0
    assert r.ok, r.violations[:5]
    assert (r.records, r.classes, r.min_class_size) == (32_561, 6512, 5)
    assert seconds < 10, f"verifying 32,561 rows took {seconds:.1f} CPU s"
    # one generalized value that no longer covers its record, one class cut below k
    bad = out.copy()
    i = int(np.flatnonzero(bad["age"].str.startswith("[90"))[0]) if bad["age"].str.startswith("[90").any() else 0
    bad.loc[i, "age"] = "[17-17]" if df.set_index("id").loc[bad.loc[i, "record_id"], "age"] != 17 else "[18-18]"
    victim = bad["class_id"].iloc[100]
    bad = bad.drop(index=bad.index[bad["class_id"] == victim][:1])
    r2 = verify_release_frame(bad, [a.name for a in s.qis], 5, schema=s, original=df)
    assert not r2.ok
    assert r2.violation_counts["class below k"] == 1
    assert f"class {victim!r}: 4 distinct records < k=5" in r2.violations
    assert r2.violation_counts["inconsistent class"] == 1  # the edited row now differs from its class
    assert r2.violation_counts["value not covered"] == 1


def test_engine_output_passes_the_independent_checks(adult_path: Path) -> None:
    """Cross-check through the agreed interface: engine releases verify, and the loss module agrees with
    each Release's own per-record loss."""
    from stream_anon.core.datasets import iter_records
    from stream_anon.core.engine import Engine, EngineConfig
    from stream_anon.core.loss import castle_record_loss, parse_generalization, summarize_releases

    s = adult_schema()
    df = read_adult(adult_path).head(2000)
    engine = Engine(s, EngineConfig(k=5, delta=200, beta=20, mu=20))
    releases = []
    for rec in iter_records(df):
        releases += engine.push(s.validate(rec))
    releases += engine.flush()
    rows = [{"record_id": rid, "class_id": r.class_id, **r.generalized, "income": rec["income"]}
            for r in releases if r.kind == "class" for rid, rec in zip(r.record_ids, r.records, strict=True)]
    out = pd.DataFrame(rows)
    report = verify_release_frame(out, [a.name for a in s.qis], 5, schema=s, original=df)
    assert report.ok, report.violations[:5]
    summary = summarize_releases(releases, s, 5)
    assert summary.records_released + summary.records_suppressed == 2000
    assert summary.records_released == report.records and summary.classes == report.classes
    for r in releases:
        if r.kind == "class":
            assert float(castle_record_loss(s, parse_generalization(s, r.generalized))) == pytest.approx(r.loss, abs=1e-12)
