"""Data loaders: the real ADULT file, malformed copies, and any CSV with a schema file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from stream_anon.core.datasets import (
    ADULT_COLUMNS,
    ADULT_ENV,
    ADULT_RECORD_COUNT,
    ADULT_SHA256,
    DatasetError,
    adult_record_id,
    check_record_ids,
    detect_format,
    iter_adult_records,
    read_adult,
    read_csv_with_schema,
    read_records,
    resolve_adult_path,
    sha256_of,
)
from stream_anon.core.schema import Schema, adult_schema


@pytest.fixture(scope="module")
def adult_df(adult_path: Path) -> pd.DataFrame:
    return read_adult(adult_path)


def test_real_adult_file(adult_path: Path, adult_df: pd.DataFrame) -> None:
    assert sha256_of(adult_path) == ADULT_SHA256
    assert len(adult_df) == ADULT_RECORD_COUNT == 32_561
    assert list(adult_df.columns) == ["id", *ADULT_COLUMNS]
    assert adult_df["id"].iloc[0] == "adult-00000" and adult_df["id"].iloc[-1] == "adult-32560"
    assert adult_df["id"].is_unique
    # "?" is kept as its own category (a leaf of each hierarchy's Unknown branch)
    missing = {c: int((adult_df[c] == "?").sum()) for c in ("workclass", "occupation", "native-country")}
    assert missing == {"workclass": 1836, "occupation": 1843, "native-country": 583}
    assert int((adult_df.drop(columns=["workclass", "occupation", "native-country"]) == "?").sum().sum()) == 0
    for a in adult_schema().numeric_qis:
        assert str(adult_df[a.name].dtype) == "int64"
        assert a.lo is not None and a.hi is not None
        assert a.lo <= adult_df[a.name].min() and adult_df[a.name].max() <= a.hi  # the file lies in the public domain
    assert set(adult_df["income"]) == {"<=50K", ">50K"}


def test_iter_adult_records_are_json_ready_and_valid(adult_path: Path) -> None:
    schema = adult_schema()
    first = next(iter_adult_records(adult_path))
    assert first["id"] == adult_record_id(0) == "adult-00000"
    assert first["age"] == 39 and type(first["age"]) is int
    assert first["workclass"] == "State-gov" and type(first["workclass"]) is str
    assert schema.validate(first) == first


def test_path_resolution(adult_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ADULT_ENV, str(tmp_path / "nowhere.data"))
    assert resolve_adult_path(adult_path) == adult_path  # the flag beats the environment
    with pytest.raises(DatasetError, match=f"does not exist \\(from \\${ADULT_ENV}\\)"):
        resolve_adult_path()
    monkeypatch.delenv(ADULT_ENV)
    with pytest.raises(DatasetError, match=f"no ADULT file given: pass --adult PATH or set {ADULT_ENV}"):
        resolve_adult_path()


def _copy_head(adult_path: Path, dest: Path, n_lines: int, extra: str = "") -> Path:
    with open(adult_path, encoding="utf-8") as f:
        head = [next(f) for _ in range(n_lines)]
    dest.write_text("".join(head) + extra, encoding="utf-8")
    return dest


ROW = ("39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, Male, "
       "2174, 0, 40, United-States, <=50K")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("39, State-gov, 77516, Bachelors, 13\n", "line 4 has fewer than 15 fields"),
        (ROW + ", surplus\n", "not in the UCI adult.data format"),
        (ROW.replace("State-gov", "Space-agency") + "\n", "line 4, field 'workclass': unknown category 'Space-agency'"),
        (ROW.replace("39,", "39.5,", 1) + "\n", "line 4, field 'age': not an integer: got '39.5'"),
        (ROW.replace("39,", "abc,", 1) + "\n", "line 4, field 'age': not a number: got 'abc'"),
        (ROW.replace("39,", "120,", 1) + "\n", "line 4, field 'age': outside the public domain: got '120'"),
        (ROW.replace("<=50K", "<=50K.") + "\n", "line 4, field 'income': unknown category '<=50K.'"),
    ],
)
def test_malformed_copies_give_clear_errors(adult_path: Path, tmp_path: Path, extra: str, message: str) -> None:
    path = _copy_head(adult_path, tmp_path / "adult.data", 3, extra)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace(".", r"\.")):
        read_adult(path, check_count=False)


def test_truncated_copy(adult_path: Path, tmp_path: Path) -> None:
    data = adult_path.read_bytes()
    cut = tmp_path / "truncated.data"
    cut.write_bytes(data[: len(data) // 2])  # cut in the middle of a line
    with pytest.raises(DatasetError, match=r"line \d+ has fewer than 15 fields"):
        read_adult(cut)
    whole_lines = _copy_head(adult_path, tmp_path / "head.data", 100)
    with pytest.raises(DatasetError, match="100 records, expected 32561"):
        read_adult(whole_lines)
    assert len(read_adult(whole_lines, check_count=False)) == 100


# ------------------------------------------------------------------ any CSV with a schema file
def _custom(tmp_path: Path, rows: str, *, with_id: bool = False) -> tuple[Path, Schema]:
    (tmp_path / "city.csv").write_text("Lyon;FR;*\nParis;FR;*\nRome;IT;*\nMilan;IT;*\n", encoding="utf-8")
    spec = {
        "name": "visits",
        "record_id": "visit",
        "attributes": [
            {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
            {"name": "city", "role": "quasi_identifier", "type": "categorical", "hierarchy": "city.csv"},
            {"name": "bill", "role": "other", "type": "numeric", "domain": [0, 1000]},
            {"name": "diagnosis", "role": "sensitive", "type": "categorical", "values": ["flu", "cold"]},
        ],
    }
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    header = ("visit," if with_id else "") + "age,city,bill,diagnosis\n"
    csv = tmp_path / "visits.csv"
    csv.write_text(header + rows, encoding="utf-8")
    return csv, Schema.load(tmp_path / "schema.yaml")


def test_read_csv_with_schema(tmp_path: Path) -> None:
    csv, schema = _custom(tmp_path, "34,Lyon,12.5,flu\n51, Rome,100,cold\n")
    df = read_csv_with_schema(csv, schema)
    assert df["visit"].tolist() == ["visits-0", "visits-1"]
    assert df["age"].tolist() == [34, 51] and str(df["age"].dtype) == "int64"
    assert df["bill"].tolist() == [12.5, 100.0]
    assert df["city"].tolist() == ["Lyon", "Rome"]
    assert read_csv_with_schema(csv, schema, id_prefix="v")["visit"].tolist() == ["v-0", "v-1"]
    csv2, schema2 = _custom(tmp_path, "a1,34,Lyon,12.5,flu\n", with_id=True)
    assert read_csv_with_schema(csv2, schema2)["visit"].tolist() == ["a1"]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("34,Lyon,12.5,flu\n51,Berlin,1,cold\n", "row 2, field 'city': unknown category 'Berlin'"),
        ("34,Lyon,12.5,flu\n51.5,Rome,1,cold\n", "row 2, field 'age': not an integer: got '51.5'"),
        ("34,Lyon,1e9,flu\n", "row 1, field 'bill': outside the public domain"),
        ("34,Lyon,,flu\n", "row 1, field 'bill': not a number: got ''"),
        ("34,Lyon,5,measles\n", "row 1, field 'diagnosis': unknown category 'measles'"),
        ('34,Lyon,5,"flu\n', "cannot be read"),
    ],
)
def test_read_csv_with_schema_bad_rows(tmp_path: Path, rows: str, message: str) -> None:
    csv, schema = _custom(tmp_path, rows)
    with pytest.raises(DatasetError, match=message.replace("(", r"\(")):
        read_csv_with_schema(csv, schema)


def test_an_empty_record_id_and_a_missing_person_id_column_are_refused(tmp_path: Path) -> None:
    """The row checks of :meth:`Schema.validate`, made column by column: an empty record id names its row."""
    csv, schema = _custom(tmp_path, "a1,34,Lyon,12.5,flu\n,51,Rome,1,cold\n", with_id=True)
    with pytest.raises(DatasetError, match=r"row 2, field 'visit' \(record id\): empty"):
        read_csv_with_schema(csv, schema)
    csv.write_text("visit,age,city,bill,diagnosis\n a1,34,Lyon,12.5,flu\n", encoding="utf-8")
    spec = yaml.safe_load((tmp_path / "schema.yaml").read_text(encoding="utf-8"))
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump({**spec, "person_id": "patient"}), encoding="utf-8")
    with pytest.raises(DatasetError, match=r"field 'patient' \(person id\): missing"):
        read_csv_with_schema(csv, Schema.load(tmp_path / "schema.yaml"))


def test_read_csv_with_schema_missing_column(tmp_path: Path) -> None:
    csv, schema = _custom(tmp_path, "34,Lyon,12.5,flu\n")
    csv.write_text("age,city,diagnosis\n34,Lyon,flu\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"column\(s\) \['bill'\] required by schema 'visits' are missing"):
        read_csv_with_schema(csv, schema)


def test_read_records_detects_the_layout(adult_path: Path, tmp_path: Path) -> None:
    head = _copy_head(adult_path, tmp_path / "head.data", 50)
    assert detect_format(head) == "adult"
    df, fmt = read_records(head, adult_schema())
    assert fmt == "adult" and len(df) == 50 and df["id"].iloc[0] == "adult-00000"
    as_csv = tmp_path / "head.csv"
    df.to_csv(as_csv, index=False)
    assert detect_format(as_csv) == "csv"
    again, fmt2 = read_records(as_csv, adult_schema())
    assert fmt2 == "csv" and again["age"].tolist() == df["age"].tolist()
    csv, schema = _custom(tmp_path, "34,Lyon,12.5,flu\n")
    with pytest.raises(DatasetError, match=r"UCI ADULT layout has no column\(s\) \['city', 'bill', 'diagnosis'\]"):
        read_records(head, schema)
    csv.write_text("age,city,bill,diagnosis\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="no records"):
        read_records(csv, schema)


def _person_schema(tmp_path: Path, rows: str) -> tuple[pd.DataFrame, Schema]:
    csv, schema = _custom(tmp_path, "", with_id=True)
    spec = yaml.safe_load((tmp_path / "schema.yaml").read_text(encoding="utf-8"))
    spec["person_id"] = "patient"
    (tmp_path / "schema.yaml").write_text(yaml.safe_dump(spec), encoding="utf-8")
    csv.write_text("visit,patient,age,city,bill,diagnosis\n" + rows, encoding="utf-8")
    schema = Schema.load(tmp_path / "schema.yaml")
    return read_csv_with_schema(csv, schema), schema


def test_duplicate_record_ids_are_refused_naming_the_rows(tmp_path: Path) -> None:
    rows = "".join(f"v{i},34,Lyon,1,flu\n" for i in range(20)).replace("v16,", "v2,")
    csv, schema = _custom(tmp_path, rows, with_id=True)
    df = read_csv_with_schema(csv, schema)
    with pytest.raises(DatasetError, match="record id 'v2' appears in rows 3 and 17"):
        check_record_ids(df, schema, where="visits.csv")
    check_record_ids(df.drop(index=16), schema)  # unique ids: accepted


def test_duplicate_record_ids_with_a_person_id(tmp_path: Path) -> None:
    same, schema = _person_schema(tmp_path, "a,p1,34,Lyon,1,flu\nb,p2,40,Rome,1,cold\na,p1,35,Lyon,1,flu\n")
    check_record_ids(same, schema)  # one individual's records: the engine counts the person once
    other, schema = _person_schema(tmp_path, "a,p1,34,Lyon,1,flu\nb,p2,40,Rome,1,cold\na,p3,35,Lyon,1,flu\n")
    with pytest.raises(DatasetError, match=r"record id 'a' appears in rows 1 and 3 with different person ids \['p1', 'p3'\]"):
        check_record_ids(other, schema)
