"""Data set loaders: the original UCI ADULT file, and any CSV described by a schema file.

Records are plain dicts, JSON-ready: ``{"id": "adult-00000", "age": 39, "workclass": "State-gov", ...}``.
Numeric fields are ints/floats, categorical fields strings; ADULT's missing marker ``?`` is kept as
the category ``"?"``, a leaf of its own under an "Unknown" branch of the hierarchies.

:func:`read_records` is what the offline tools read: either layout (detected), every row validated, and
:func:`check_record_ids` refuses a record id that appears twice unless a person id says both rows are the
same individual.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.core.schema import Attribute, Kind, Schema, adult_schema

ADULT_COLUMNS: tuple[str, ...] = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income",
)
ADULT_RECORD_COUNT = 32_561
ADULT_SHA256 = "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d"
ADULT_URL = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data"
ADULT_ENV = "STREAM_ANON_ADULT"


class DatasetError(ValueError):
    """The data file is missing, malformed or not the expected file."""


def _check_column(df: pd.DataFrame, a: Attribute, *, where: str, unit: str) -> None:
    """Convert/check one column in place, vectorized; the first bad row raises DatasetError naming it.

    Numeric: must parse, be finite, integral when the attribute is ``integer`` (never silently truncated),
    and lie in the public domain.  Categorical with a known domain: must be one of its values.
    """
    col = df[a.name]
    if a.kind is Kind.NUMERIC:
        conv = pd.to_numeric(col, errors="coerce")
        bad = conv.isna() | ~np.isfinite(conv.fillna(0.0))
        what = "not a number"
        if not bad.any() and a.integer:
            bad, what = conv != conv.round(), "not an integer"
        if not bad.any() and (a.lo is not None or a.hi is not None):
            lo = -np.inf if a.lo is None else a.lo
            hi = np.inf if a.hi is None else a.hi
            bad, what = (conv < lo) | (conv > hi), "outside the public domain"
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DatasetError(f"{where}: {unit} {i + 1}, field {a.name!r}: {what}: got {col.iloc[i]!r}; "
                               f"expected {a.describe_domain()}")
        df[a.name] = conv.astype("int64") if a.integer else conv.astype("float64")
        return
    values = a.domain_values
    if values:
        bad = ~col.isin(values)
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise DatasetError(f"{where}: {unit} {i + 1}, field {a.name!r}: unknown category {col.iloc[i]!r}; "
                               f"expected {a.describe_domain()}")


def adult_record_id(index: int) -> str:
    """Deterministic record id of the ADULT record at 0-based line ``index``."""
    return f"adult-{index:05d}"


def resolve_adult_path(path: str | os.PathLike[str] | None = None, *, origin: str | None = None) -> Path:
    """The ADULT file: the given path (a flag) beats ``$STREAM_ANON_ADULT``; error if neither names a file.

    ``origin`` says where a given path came from, for the messages (default ``--adult``, the flag of every
    command that takes one); a path from the environment is always ``$STREAM_ANON_ADULT``.
    """
    if path is not None:
        chosen: str | os.PathLike[str] | None = path
        origin = origin or "--adult"
    else:
        chosen, origin = os.environ.get(ADULT_ENV), f"${ADULT_ENV}"
    if not chosen:
        raise DatasetError(
            f"no ADULT file given: pass --adult PATH or set {ADULT_ENV} (the UCI file adult.data, sha256 {ADULT_SHA256})"
        )
    p = Path(chosen)
    if p.is_dir():
        raise DatasetError(f"ADULT file {str(p)!r} (from {origin}) is a directory, not the adult.data file")
    if not p.is_file():
        raise DatasetError(f"ADULT file {str(p)!r} does not exist (from {origin})")
    if not os.access(p, os.R_OK):
        raise DatasetError(f"ADULT file {str(p)!r} (from {origin}) cannot be read (permission denied)")
    return p


def sha256_of(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_adult(path: str | os.PathLike[str] | None = None, *, check_count: bool = True,
               origin: str | None = None) -> pd.DataFrame:
    """Read the original ``adult.data`` (``", "``-separated, no header) into a DataFrame with an ``id`` column.

    Integers stay integers, categories strings; ``?`` stays the category ``"?"``.  With ``check_count``
    the file must hold exactly 32,561 records (the UCI training file).  Errors (:class:`DatasetError`) name the
    file, where its path came from (``origin``, see :func:`resolve_adult_path`), the line and the field.
    """
    p = resolve_adult_path(path, origin=origin)
    where = f"ADULT file {p} (from {origin or ('--adult' if path is not None else '$' + ADULT_ENV)})"
    try:
        df = pd.read_csv(p, header=None, names=list(ADULT_COLUMNS), sep=",", skipinitialspace=True,
                         dtype=str, keep_default_na=False, engine="c")
    except pd.errors.EmptyDataError:
        raise DatasetError(f"{where}: empty file (no records); expected the UCI adult.data") from None
    except (pd.errors.ParserError, UnicodeDecodeError, ValueError) as e:
        raise DatasetError(f"{where}: not in the UCI adult.data format ({len(ADULT_COLUMNS)} comma-separated fields "
                           f"per line): {' '.join(str(e).split())}") from None
    df = df[df["age"].str.len() > 0].reset_index(drop=True)  # trailing blank line in the UCI file
    if df["income"].eq("").any():
        bad = int(df.index[df["income"].eq("")][0])
        raise DatasetError(f"{where}: line {bad + 1} has fewer than {len(ADULT_COLUMNS)} fields")
    schema = adult_schema()
    for a in schema.attributes:
        _check_column(df, a, where=where, unit="line")
    df.insert(0, "id", [adult_record_id(i) for i in range(len(df))])
    if check_count and len(df) != ADULT_RECORD_COUNT:
        raise DatasetError(f"{where}: {len(df)} records, expected {ADULT_RECORD_COUNT} (the UCI ADULT training file)")
    return df


def read_adult_for_replay(path: str | os.PathLike[str], *, origin: str,
                          records: int | None = None) -> tuple[pd.DataFrame, str | None]:
    """The ADULT file a demo/replay of its first ``records`` records (None: all) reads: the frame, cut to
    ``records``, and a warning when the file is valid but not the UCI file itself (its sha256 differs).

    :class:`DatasetError` (one line naming the file and ``origin``, where its path came from) when it is not a
    readable file, not in the UCI format (the line and field), or holds fewer records than the UCI file (or
    than ``records``): a truncated or wrong file is refused, never replayed as if it were ADULT.
    """
    p = resolve_adult_path(path, origin=origin)
    where = f"ADULT file {p} (from {origin})"
    digest = sha256_of(p)
    try:
        df = read_adult(p, check_count=False, origin=origin)
    except DatasetError as e:
        raise DatasetError(f"{e} (sha256 {digest[:16]}..., not the UCI adult.data's {ADULT_SHA256[:16]}...)") from None
    n = len(df)
    wanted = ADULT_RECORD_COUNT if records is None else records
    if n == 0:
        raise DatasetError(f"{where} holds no record (blank lines only); expected the UCI adult.data "
                           f"({ADULT_RECORD_COUNT:,} records, sha256 {ADULT_SHA256[:16]}...)")
    if n < wanted:
        asked = (f"the {ADULT_RECORD_COUNT:,} of the UCI adult.data (sha256 {ADULT_SHA256[:16]}...)"
                 if records is None else f"the {records:,} asked for with --records")
        raise DatasetError(f"{where} holds {n:,} records, fewer than {asked}: pass the complete file, or "
                           f"--records {n} (or fewer) to replay the records it holds")
    warning = None
    if digest != ADULT_SHA256:
        warning = (f"{where} is not the UCI adult.data (sha256 {digest[:16]}..., expected {ADULT_SHA256[:16]}...); "
                   f"its {n:,} records are valid ADULT records: using them")
    return (df if records is None else df.iloc[:records]), warning


def iter_records(df: pd.DataFrame) -> Iterator[dict[str, Any]]:
    """Rows of a loaded frame as JSON-ready dicts (native Python ints/strings)."""
    names = list(df.columns)
    columns = [df[c].tolist() for c in df.columns]  # column by column: native Python values, no per-cell .item()
    for row in zip(*columns, strict=True):
        yield dict(zip(names, row, strict=True))


def iter_adult_records(path: str | os.PathLike[str] | None = None) -> Iterator[dict[str, Any]]:
    """ADULT records in file order, as dicts with deterministic ids ``adult-00000`` ...."""
    yield from iter_records(read_adult(path))


def read_csv_with_schema(path: str | os.PathLike[str], schema: Schema, *, id_prefix: str | None = None,
                         header: bool = True, sep: str = ",") -> pd.DataFrame:
    """Read any CSV described by ``schema``; every row is validated (clear error naming line and field).

    Without a record-id column the ids are ``{id_prefix or schema.name}-{index}``.
    """
    try:
        df = pd.read_csv(path, header=0 if header else None, names=None if header else schema.names, sep=sep,
                         skipinitialspace=True, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot be read as a {sep!r}-separated CSV: {str(e).strip()}") from None
    missing = [n for n in schema.names if n not in df.columns]
    if missing:
        raise DatasetError(f"{path}: column(s) {missing} required by schema {schema.name!r} are missing; "
                           f"found {list(df.columns)}")
    rid = schema.record_id or "id"
    if rid not in df.columns:
        prefix = id_prefix or schema.name
        df.insert(0, rid, [f"{prefix}-{i}" for i in range(len(df))])
    _check_frame(df, schema, where=str(path), unit="row")
    return df


def _check_frame(df: pd.DataFrame, schema: Schema, *, where: str, unit: str) -> None:
    """Every row of ``df`` valid for ``schema`` (:meth:`Schema.validate`'s checks, column by column, vectorized):
    each attribute's values (:func:`_check_column`, which converts numeric columns in place), a non-empty record
    id, a person-id column when the schema has one; the first bad row raises :class:`DatasetError` naming it."""
    for a in schema.attributes:
        _check_column(df, a, where=where, unit=unit)
    rid = schema.record_id or "id"
    if rid not in df.columns:
        raise DatasetError(f"{where}: no record-id column {rid!r} (schema {schema.name!r})")
    empty = df[rid].astype(str).eq("")  # (as Schema.validate: an empty id; any other string is one)
    if empty.any():
        i = int(np.flatnonzero(empty.to_numpy())[0])
        raise DatasetError(f"{where}: {unit} {i + 1}, field {rid!r} (record id): empty; expected a non-empty string")
    if schema.person_id is not None and schema.person_id not in df.columns:
        raise DatasetError(f"{where}: field {schema.person_id!r} (person id): missing (schema {schema.name!r})")


def detect_format(path: str | os.PathLike[str]) -> str:
    """``adult`` for the UCI layout (no header, 15 ", "-separated fields, a number first), else ``csv``."""
    with open(path, encoding="utf-8", errors="replace") as f:
        first = f.readline()
    fields = [x.strip() for x in first.split(",")]
    if len(fields) == len(ADULT_COLUMNS) and fields[0].isdigit():
        return "adult"
    return "csv"


def read_records(path: str | os.PathLike[str], schema: Schema, fmt: str | None = None) -> tuple[pd.DataFrame, str]:
    """The records of ``path`` in file (arrival) order, every row validated against ``schema``; and the format.

    ``fmt``: ``adult`` (the UCI layout, any number of lines, ids ``adult-00000``... in the schema's record-id
    column) or ``csv`` (a header naming the schema's columns, see :func:`read_csv_with_schema`); None detects
    it (:func:`detect_format`).  Raises :class:`DatasetError` naming the line/row, the field, the allowed
    domain and the value received, or when the file holds no record at all.
    """
    fmt = fmt or detect_format(path)
    if fmt == "adult":
        missing = [a.name for a in schema.attributes if a.name not in ADULT_COLUMNS]
        if missing:
            raise DatasetError(f"{path}: a file in the UCI ADULT layout has no column(s) {missing} required by "
                               f"schema {schema.name!r}; give a CSV with a header")
        df = read_adult(path, check_count=False)
        rid = schema.record_id or "id"
        if rid != "id":
            df = df.rename(columns={"id": rid})
        _check_frame(df, schema, where=str(path), unit="line")
    elif fmt == "csv":
        df = read_csv_with_schema(path, schema)
    else:
        raise DatasetError(f"format: must be 'adult' or 'csv', got {fmt!r}")
    if len(df) == 0:
        raise DatasetError(f"{path}: no records (the file holds {'no data line' if fmt == 'adult' else 'a header only'})")
    return df, fmt


def check_record_ids(df: pd.DataFrame, schema: Schema, *, where: str = "input") -> None:
    """Refuse a record id that appears in two rows, naming the rows (1-based data rows, header not counted).

    With a person id in the schema, rows sharing a record id are accepted when they also share the person
    id: they are records of one individual, and the engine counts distinct persons per class (CASTLE's
    k_s-anonymity).  Rows sharing a record id with *different* person ids are refused.
    """
    rid = schema.record_id or "id"
    if rid not in df.columns:
        return
    ids = df[rid].astype(str)
    dup = ids.duplicated(keep=False).to_numpy()
    if not dup.any():
        return
    pid = schema.person_id
    rows = pd.Series(np.flatnonzero(dup) + 1, index=ids.index[dup])
    groups = rows.groupby(ids[dup], sort=False)
    problems: list[str] = []
    for value, where_rows in groups:
        numbers = [int(x) for x in where_rows]
        shown = _and_list([str(n) for n in numbers[:5]]) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")
        if pid is not None and pid in df.columns:
            persons = df[pid].astype(str).iloc[[n - 1 for n in numbers]].unique()
            if len(persons) == 1:
                continue
            problems.append(f"record id {value!r} appears in rows {shown} with different person ids "
                            f"{[str(p) for p in persons[:5]]}")
        else:
            problems.append(f"record id {value!r} appears in rows {shown}")
    if problems:
        more = f" (and {len(problems) - 3} more duplicated ids)" if len(problems) > 3 else ""
        hint = ("" if pid is not None else
                "; each row must be a distinct record (a schema with a person_id counts records of one "
                "individual once)")
        raise DatasetError(f"{where}: duplicate record ids in column {rid!r}: {'; '.join(problems[:3])}{more}{hint}")


def _and_list(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
