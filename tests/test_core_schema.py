"""Schemas: validation errors name field, allowed domain and value; roles; YAML/JSON loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_anon.core.hierarchy import HierarchyError
from stream_anon.core.schema import Kind, Role, Schema, SchemaError, adult_schema

RECORD: dict[str, Any] = {
    "id": "adult-00000", "age": 39, "workclass": "State-gov", "fnlwgt": 77516, "education": "Bachelors",
    "education-num": 13, "marital-status": "Never-married", "occupation": "Adm-clerical",
    "relationship": "Not-in-family", "race": "White", "sex": "Male", "capital-gain": 2174, "capital-loss": 0,
    "hours-per-week": 40, "native-country": "United-States", "income": "<=50K",
}


@pytest.fixture(scope="module")
def adult() -> Schema:
    return adult_schema()


def with_(**changes: Any) -> dict[str, Any]:
    r = dict(RECORD)
    r.update(changes)
    return r


def test_adult_schema_layout(adult: Schema) -> None:
    assert [a.name for a in adult.qis] == [
        "age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week",
        "workclass", "education", "marital-status", "occupation", "relationship", "race", "sex", "native-country"]
    assert [a.name for a in adult.sensitive] == ["income"]
    assert adult["age"].lo == 17 and adult["age"].hi == 90 and adult["age"].integer
    assert adult.record_id == "id" and adult.person_id is None


def test_adult_numeric_domains_state_their_public_source(adult: Schema) -> None:
    """Issue 9.7: documented ranges and top-codes, or a declared policy bound, never the file's extremes."""
    domains = {a.name: (a.lo, a.hi) for a in adult.numeric_qis}
    assert domains == {"age": (17, 90), "fnlwgt": (1, 2_000_000), "education-num": (1, 16),
                       "capital-gain": (0, 99999), "capital-loss": (0, 99999), "hours-per-week": (1, 99)}
    for a in adult.numeric_qis:
        assert a.source, f"{a.name} has no source"
    source = {a.name: str(a.source) for a in adult.numeric_qis}
    assert "AAGE > 16" in source["age"] and "top-code" in source["age"]
    assert "HRSWK > 0" in source["hours-per-week"] and "top-code" in source["hours-per-week"]
    assert "declared policy bound, not a documented one" in source["fnlwgt"]
    # the training file's extremes of fnlwgt and capital-loss are not used as bounds
    assert domains["fnlwgt"] != (12285, 1484705) and domains["capital-loss"] != (0, 4356)


def test_source_is_kept_and_checked() -> None:
    spec: dict[str, Any] = {"attributes": [
        {"name": "x", "role": "quasi_identifier", "type": "numeric", "domain": [0, 9],
         "source": "  the form's\n  two-digit box  "}]}
    assert Schema.from_dict(spec)["x"].source == "the form's two-digit box"
    assert Schema.from_dict(spec).with_roles(qis=["x"])["x"].source == "the form's two-digit box"
    spec["attributes"][0].pop("source")
    assert Schema.from_dict(spec)["x"].source is None
    for bad in (42, "  ", ["a"]):
        spec["attributes"][0]["source"] = bad
        with pytest.raises(SchemaError, match="attribute 'x': source must be a non-empty string") as info:
            Schema.from_dict(spec)
        assert info.value.field == "x" and info.value.value == bad


def test_valid_record_is_normalized(adult: Schema) -> None:
    out = adult.validate(with_(age="39", sex=" Male ", **{"hours-per-week": 40.0}))
    assert out["age"] == 39 and isinstance(out["age"], int)
    assert out["hours-per-week"] == 40 and isinstance(out["hours-per-week"], int)
    assert out["sex"] == "Male"
    assert adult.validate(RECORD) == RECORD


@pytest.mark.parametrize(
    ("change", "field", "allowed_part", "value", "message_part"),
    [
        ({"workclass": "Space-agency"}, "workclass", "one of 9 values", "Space-agency", "unknown category 'Space-agency'"),
        ({"age": 130}, "age", "integer in [17, 90]", 130, "outside the public domain [17, 90]"),
        ({"age": 16}, "age", "integer in [17, 90]", 16, "value 16 outside"),
        ({"age": 39.5}, "age", "integer in [17, 90]", 39.5, "expected an integer"),
        ({"age": "old"}, "age", "integer in [17, 90]", "old", "got 'old'"),
        ({"age": [39]}, "age", "integer in [17, 90]", [39], "got list [39]"),
        ({"age": True}, "age", "integer in [17, 90]", True, "got bool True"),
        ({"age": float("nan")}, "age", "integer in [17, 90]", None, "outside the public domain"),
        ({"sex": 1}, "sex", "one of 2 values", 1, "expected a string"),
        ({"income": ">60K"}, "income", "one of 2 values", ">60K", "unknown category"),
    ],
)
def test_validate_errors_name_field_allowed_and_value(adult: Schema, change: dict[str, Any], field: str,
                                                      allowed_part: str, value: Any, message_part: str) -> None:
    with pytest.raises(SchemaError) as info:
        adult.validate(with_(**change))
    e = info.value
    assert e.field == field
    assert e.allowed is not None and allowed_part in e.allowed
    if value is not None:
        assert e.value == value and type(e.value) is type(value)
    assert message_part in str(e) and repr(field) in str(e)


def test_missing_and_extra_fields(adult: Schema) -> None:
    rec = dict(RECORD)
    del rec["education"]
    with pytest.raises(SchemaError, match="field 'education': missing; expected one of 16 values") as info:
        adult.validate(rec)
    assert info.value.field == "education" and info.value.value is None
    with pytest.raises(SchemaError, match=r"unexpected field\(s\) \['salary'\]") as info:
        adult.validate(with_(salary=1))
    assert info.value.field == "salary"
    assert adult.validate(with_(salary=1), allow_extra=True)["age"] == 39
    rec = dict(RECORD)
    del rec["id"]
    with pytest.raises(SchemaError, match="'id' \\(record id\\): missing") as info:
        adult.validate(rec)
    assert info.value.field == "id"
    with pytest.raises(SchemaError, match="must be a JSON object"):
        adult.validate([1, 2])  # type: ignore[arg-type]


def test_with_roles(adult: Schema) -> None:
    s = adult.with_roles(qis=["age", "sex"])
    assert [a.name for a in s.qis] == ["age", "sex"]
    assert s["workclass"].role is Role.OTHER and s["income"].role is Role.SENSITIVE
    s2 = adult.with_roles(qis=["age", "sex"], sensitive="race")
    assert [a.name for a in s2.qis] == ["age", "sex"] and [a.name for a in s2.sensitive] == ["race"]
    assert s2["income"].role is Role.OTHER
    with pytest.raises(SchemaError, match="categorical quasi-identifier 'income' needs a hierarchy"):
        adult.with_roles(qis=["age", "income"], sensitive="race")
    assert adult["workclass"].role is Role.QUASI_IDENTIFIER  # the original is untouched
    with pytest.raises(SchemaError, match=r"unknown quasi-identifier\(s\) \['height'\]") as info:
        adult.with_roles(qis=["age", "height"])
    assert info.value.field == "qi" and info.value.value == ["height"]
    with pytest.raises(SchemaError, match="unknown sensitive attribute 'wealth'"):
        adult.with_roles(sensitive="wealth")
    with pytest.raises(SchemaError, match="'income' cannot be both a quasi-identifier and the sensitive"):
        adult.with_roles(qis=["age", "income"])


def test_numeric_qi_without_domain_is_an_error(tmp_path: Path) -> None:
    spec = {"name": "t", "attributes": [{"name": "x", "role": "quasi_identifier", "type": "numeric"}]}
    with pytest.raises(SchemaError, match="numeric quasi-identifier 'x' needs a public domain") as info:
        Schema.from_dict(spec)
    assert info.value.field == "x"
    # promoting a domain-less numeric attribute to QI fails the same way
    ok = Schema.from_dict({"name": "t", "attributes": [{"name": "x", "role": "other", "type": "numeric"},
                                                       {"name": "y", "role": "sensitive", "values": ["a"]}]})
    with pytest.raises(SchemaError, match="needs a public domain"):
        ok.with_roles(qis=["x"])
    with pytest.raises(SchemaError, match="domain bounds must be numbers"):
        Schema.from_dict({"attributes": [{"name": "x", "type": "numeric", "domain": ["a", 3]}]})
    with pytest.raises(SchemaError, match="domain must be \\[lo, hi\\]"):
        Schema.from_dict({"attributes": [{"name": "x", "type": "numeric", "domain": [3]}]})
    with pytest.raises(SchemaError, match="categorical quasi-identifier 'c' needs a hierarchy"):
        Schema.from_dict({"attributes": [{"name": "c", "role": "quasi_identifier"}]})
    with pytest.raises(SchemaError, match="role 'boss' not one of"):
        Schema.from_dict({"attributes": [{"name": "c", "role": "boss"}]})
    with pytest.raises(SchemaError, match="type 'text' not one of"):
        Schema.from_dict({"attributes": [{"name": "c", "type": "text"}]})
    with pytest.raises(SchemaError, match="attribute names repeat"):
        Schema.from_dict({"attributes": [{"name": "c"}, {"name": "c"}]})


def _write_schema_files(tmp_path: Path) -> dict[str, Any]:
    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "city.csv").write_text("Lyon;FR;*\nParis;FR;*\nRome;IT;*\n", encoding="utf-8")
    return {
        "name": "people", "record_id": "pid", "person_id": None,
        "attributes": [
            {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
            {"name": "city", "role": "quasi_identifier", "type": "categorical", "hierarchy": "h/city.csv"},
            {"name": "score", "role": "other", "type": "numeric", "domain": [0, 1]},
            {"name": "diagnosis", "role": "sensitive", "type": "categorical", "values": ["a", "b"]},
        ],
    }


@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_load_yaml_and_json_with_relative_hierarchy(tmp_path: Path, fmt: str) -> None:
    import yaml

    spec = _write_schema_files(tmp_path)
    path = tmp_path / f"schema.{fmt}"
    path.write_text(yaml.safe_dump(spec) if fmt == "yaml" else json.dumps(spec), encoding="utf-8")
    s = Schema.load(path)
    assert s.name == "people" and s.record_id == "pid"
    assert [a.name for a in s.qis] == ["age", "city"]
    assert s["city"].kind is Kind.CATEGORICAL and s["city"].hierarchy is not None
    assert s["city"].hierarchy.label_of_range(0, 1) == "FR"
    rec = s.validate({"pid": 7, "age": 30, "city": "Rome", "score": 0.5, "diagnosis": "a"})
    assert rec["pid"] == 7 and rec["score"] == 0.5
    num, cat = s.encode_qis(rec)
    assert num.tolist() == [30.0] and cat.tolist() == [2]
    num2, cat2 = s.encode_qis_many({"age": [30, 40], "city": ["Rome", "Lyon"]})
    assert np.array_equal(num2, [[30.0], [40.0]]) and np.array_equal(cat2, [[2], [0]])


def test_schema_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("attributes: [unclosed\n", encoding="utf-8")
    with pytest.raises(SchemaError, match="not valid YAML"):
        Schema.load(bad)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{", encoding="utf-8")
    with pytest.raises(SchemaError, match="not valid JSON"):
        Schema.load(bad_json)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n", encoding="utf-8")
    with pytest.raises(SchemaError, match="expected a mapping"):
        Schema.load(scalar)
    spec = _write_schema_files(tmp_path)
    spec["attributes"][1]["hierarchy"] = "h/missing.csv"
    with pytest.raises(SchemaError, match="attribute 'city': hierarchy file .*missing.csv' does not exist"):
        Schema.from_dict(spec, base_dir=tmp_path)
    (tmp_path / "h" / "ragged.csv").write_text("a;A;*\nb;*\n", encoding="utf-8")
    spec["attributes"][1]["hierarchy"] = "h/ragged.csv"
    with pytest.raises(HierarchyError, match="hierarchy 'city', row 2"):
        Schema.from_dict(spec, base_dir=tmp_path)
