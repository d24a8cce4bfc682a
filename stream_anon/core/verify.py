"""Independent verification of a released (anonymized) table — it does not use the engine.

A released table has one row per released record: ``record_id``, ``class_id``, the quasi-identifier
columns as released strings (``"[30-39]"`` intervals, hierarchy node labels) and the sensitive column.
Checks, all vectorized (pandas groupby):

1. no ``record_id`` appears twice in the file;
2. every class has at least ``k`` distinct individuals: distinct values of ``person_id`` when that column
   is given (CASTLE's k_s-anonymity counts persons, not tuples), else distinct record ids;
3. every row of a class carries identical QI strings (the class *is* the equivalence class);
4. with ``l``: every class holds at least ``l`` distinct sensitive values (``>= l``; a port's off-by-one
   asked for ``l + 1``);
5. with ``schema``: every QI string parses (interval ``[lo-hi]`` inside the public domain, or a label of
   the attribute's hierarchy); with ``original`` as well: every released record exists in the original
   data and each generalized value covers the original value (interval contains it; node covers the leaf).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from stream_anon.core.intervals import parse_interval
from stream_anon.core.schema import Attribute, Kind, Schema

__all__ = ["VerificationReport", "verify_release_frame", "verify_release_file", "infer_columns"]

MAX_MESSAGES_PER_CHECK = 20


@dataclass
class VerificationReport:
    """``ok`` iff ``violations`` is empty; messages name the class (or record) and what failed."""

    ok: bool
    violations: list[str]
    classes: int
    min_class_size: int
    records: int
    violation_counts: dict[str, int] = field(default_factory=dict)

    def __str__(self) -> str:
        head = (f"{'OK' if self.ok else 'VIOLATIONS'}: {self.records} records, {self.classes} classes, "
                f"min class size {self.min_class_size}")
        return "\n".join([head, *("  - " + v for v in self.violations)])


class _Collector:
    def __init__(self) -> None:
        self.messages: list[str] = []
        self.counts: dict[str, int] = {}

    def add(self, check: str, items: Sequence[str], total: int | None = None) -> None:
        total = len(items) if total is None else total
        if total == 0:
            return
        self.counts[check] = self.counts.get(check, 0) + total
        self.messages.extend(items[:MAX_MESSAGES_PER_CHECK])
        if total > MAX_MESSAGES_PER_CHECK:
            self.messages.append(f"{check}: ... and {total - MAX_MESSAGES_PER_CHECK} more")


def infer_columns(columns: Sequence[str], *, record_id: str = "record_id", class_id: str = "class_id",
                  sensitive: str | None = None, person_id: str | None = None) -> tuple[list[str], str | None]:
    """(QI columns, sensitive column) of a released CSV whose QIs were not named.

    The sensitive column is ``sensitive`` if given, else the last column (the ``anonymize`` output order:
    record_id, class_id, QIs..., sensitive); the QIs are all remaining columns except record_id, class_id and
    ``person_id``.  A table without a sensitive column must name its QIs explicitly.
    """
    cols = list(columns)
    if sensitive is None:
        rest = [c for c in cols if c not in (record_id, class_id, person_id)]
        sensitive = rest[-1] if rest else None
    qis = [c for c in cols if c not in (record_id, class_id, person_id, sensitive)]
    return qis, sensitive


def verify_release_frame(df: pd.DataFrame, qi_columns: Sequence[str], k: int, l: int | None = None,  # noqa: E741
                         sensitive: str | None = None, *, record_id: str = "record_id",
                         class_id: str = "class_id", person_id: str | None = None, schema: Schema | None = None,
                         original: pd.DataFrame | None = None, original_id: str | None = None) -> VerificationReport:
    """Check a released table (see the module docstring); returns a :class:`VerificationReport`.

    ``k`` >= 1; ``l`` (optional) >= 1 needs ``sensitive``.  ``schema`` enables parsing/domain checks of the QI
    strings; ``original`` (the input records, id column ``original_id``, default ``schema.record_id`` or
    ``"id"``) enables the coverage check and needs ``schema``.
    """
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"verify: k must be an integer >= 1, got {k!r}")
    if l is not None and (isinstance(l, bool) or not isinstance(l, int | np.integer) or l < 1):
        raise ValueError(f"verify: l must be an integer >= 1, got {l!r}")
    if l is not None and sensitive is None:
        raise ValueError("verify: l-diversity needs the sensitive column (sensitive=None given)")
    if original is not None and schema is None:
        raise ValueError("verify: checking coverage of the original data needs the schema")
    qis = list(qi_columns)
    needed = [record_id, class_id, *qis] + ([sensitive] if l is not None and sensitive else []) + (
        [person_id] if person_id else [])
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"verify: column(s) {missing} missing from the released table; found {list(df.columns)}")
    out = _Collector()
    n = len(df)
    if n == 0:
        return VerificationReport(ok=True, violations=[], classes=0, min_class_size=0, records=0)
    cids = df[class_id].astype(str)
    rids = df[record_id].astype(str)

    # 1. duplicate record ids
    dup = rids[rids.duplicated(keep=False)]
    if len(dup):
        counts = dup.value_counts()
        out.add("duplicate record_id", [f"record_id {r!r} appears {c} times" for r, c in counts.items()], len(counts))

    grouped = df.groupby(cids, sort=False)
    # 2. class size in distinct individuals
    who = df[person_id].astype(str) if person_id else rids
    sizes = who.groupby(cids, sort=False).nunique()
    unit = f"distinct {person_id!r} values" if person_id else "distinct records"
    small = sizes[sizes < k]
    out.add("class below k", [f"class {c!r}: {int(s)} {unit} < k={k}" for c, s in small.items()], len(small))

    # 3. identical QI strings within a class
    if qis:
        nunique = grouped[qis].nunique(dropna=False)
        bad = nunique[(nunique > 1).any(axis=1)]
        msgs = []
        for c, row in bad.iterrows():
            cols = [q for q in qis if row[q] > 1]
            examples = {q: sorted(map(str, df.loc[cids == c, q].unique()))[:3] for q in cols}
            msgs.append(f"class {c!r}: rows differ on quasi-identifier(s) {cols}: {examples}")
        out.add("inconsistent class", msgs, len(bad))

    # 4. l-diversity (>= l distinct sensitive values)
    if l is not None and sensitive is not None:
        distinct = df[sensitive].astype(str).groupby(cids, sort=False).nunique()
        low = distinct[distinct < l]
        out.add("class below l", [f"class {c!r}: {int(d)} distinct {sensitive!r} values < l={l}"
                                  for c, d in low.items()], len(low))

    # 5. strings parse within the schema; generalizations cover the original values
    if schema is not None:
        _check_against_schema(df, qis, schema, rids, cids, out, original,
                              original_id or schema.record_id or "id")

    return VerificationReport(ok=not out.messages, violations=out.messages, classes=int(len(sizes)),
                              min_class_size=int(sizes.min()), records=n, violation_counts=dict(out.counts))


def _parse_column(a: Attribute, values: pd.Series) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """Vectorized over unique strings: (lo, hi) per row (value bounds or leaf range) and per-string errors."""
    errors: dict[str, str] = {}
    table: dict[str, tuple[float, float]] = {}
    for u in pd.unique(values):
        text = str(u)
        try:
            if a.kind is Kind.NUMERIC:
                lo, hi = parse_interval(text)
                assert a.lo is not None and a.hi is not None
                if lo < a.lo or hi > a.hi:
                    errors[text] = f"interval {text!r} leaves the public domain [{a.lo:g}, {a.hi:g}]"
            else:
                h = a.hierarchy
                assert h is not None
                node = h.node(text)
                lo, hi = float(h.node_leaf_lo[node]), float(h.node_leaf_hi[node])
        except ValueError as e:
            errors[text] = str(e)
            lo, hi = np.nan, np.nan
        table[text] = (lo, hi)
    s = values.astype(str)
    lo_arr = s.map({t: b[0] for t, b in table.items()}).to_numpy(dtype=np.float64)
    hi_arr = s.map({t: b[1] for t, b in table.items()}).to_numpy(dtype=np.float64)
    return lo_arr, hi_arr, errors


def _check_against_schema(df: pd.DataFrame, qis: list[str], schema: Schema, rids: pd.Series, cids: pd.Series,
                          out: _Collector,
                          original: pd.DataFrame | None, original_id: str) -> None:
    unknown = [q for q in qis if q not in schema or not schema[q].is_qi]
    if unknown:
        out.add("unknown quasi-identifier", [f"column {q!r} is not a quasi-identifier of schema {schema.name!r}"
                                             for q in unknown])
    qis = [q for q in qis if q not in unknown]
    orig: pd.DataFrame | None = None
    if original is not None:
        if original_id not in original.columns:
            raise ValueError(f"verify: original data has no id column {original_id!r}; found {list(original.columns)}")
        orig_index = pd.Index(original[original_id].astype(str))
        if not orig_index.is_unique:
            raise ValueError(f"verify: original data has duplicate ids in column {original_id!r}")
        pos = orig_index.get_indexer(rids)
        absent = rids[pos < 0]
        out.add("record not in original", [f"record_id {r!r} is not in the original data" for r in absent[:50]],
                len(absent))
        orig = original.iloc[np.where(pos < 0, 0, pos)].reset_index(drop=True)
        present = pos >= 0
    for q in qis:
        a = schema[q]
        lo, hi, errors = _parse_column(a, df[q])
        out.add("unparsable value", [f"column {q!r}: {msg}" for msg in errors.values()])
        if orig is None:
            continue
        col = orig[q]
        if a.kind is Kind.NUMERIC:
            x = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
        else:
            h = a.hierarchy
            assert h is not None
            x = col.astype(str).map(h.leaf_index).to_numpy(dtype=np.float64)  # NaN: not a leaf
        ok = (lo <= x) & (x <= hi)
        bad = present & ~ok & ~np.isnan(lo)
        where = np.flatnonzero(bad)
        msgs = [f"class {cids.iloc[i]!r}, record_id {rids.iloc[i]!r}: column {q!r} released {str(df[q].iloc[i])!r} does not cover the "
                f"original value {_native(col.iloc[i])!r}" for i in where[:MAX_MESSAGES_PER_CHECK]]
        out.add("value not covered", msgs, len(where))


def _native(v: object) -> object:
    item = getattr(v, "item", None)
    return item() if callable(item) else v


def verify_release_file(path: str | os.PathLike[str], k: int, l: int | None = None,  # noqa: E741
                        qi_columns: Sequence[str] | None = None, sensitive: str | None = None, *,
                        record_id: str = "record_id", class_id: str = "class_id", person_id: str | None = None,
                        schema: Schema | None = None, original: pd.DataFrame | None = None,
                        original_id: str | None = None) -> VerificationReport:
    """Read a released CSV (all columns as strings) and :func:`verify_release_frame` it.

    Without ``qi_columns`` they are inferred by :func:`infer_columns` (all columns except record_id, class_id,
    person_id and the sensitive column, which defaults to the last column).
    """
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"verify: {path} is not a readable CSV: {str(e).strip()}") from None
    if qi_columns is None:
        qi_columns, inferred = infer_columns(df.columns, record_id=record_id, class_id=class_id, sensitive=sensitive,
                                             person_id=person_id)
        sensitive = sensitive or inferred
    return verify_release_frame(df, qi_columns, k, l, sensitive, record_id=record_id, class_id=class_id,
                                person_id=person_id, schema=schema, original=original, original_id=original_id)
