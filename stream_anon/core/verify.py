"""Independent verification of a released (anonymized) table — it does not use the engine.

A released table has one row per released record: the ``class_id`` column, the quasi-identifier columns
as released strings (``"[30-39]"`` intervals, hierarchy node labels) and the sensitive column(s).  Two
layouts (docs/offline-tools.md):

* *public* (``anonymize --output``'s default): ``class_id`` is an opaque random id; there is no record id,
  the rows of a class and the classes are in random order;
* *with ids* (``anonymize --keep-ids``): ``record_id`` first (and the person id column when the schema has
  one), the engine's class ids, release order.

The verifier never guesses which column is what: :func:`resolve_roles` takes the roles from the caller
(``--qi``/``--sensitive``), from the release's *meta file* ``<release>.meta.json`` that ``anonymize``
writes beside it (:func:`write_release_meta`), or from a schema, and refuses (:class:`RolesError`) when a
column has no role or a named column is missing.

Checks, all vectorized (pandas groupby):

1. with record ids: no ``record_id`` appears twice (with a person id: not twice for different persons);
2. every class has at least ``k`` distinct individuals: distinct values of ``person_id`` when that column
   is given (CASTLE's k_s-anonymity counts persons, not tuples), else distinct record ids, else rows;
3. every row of a class carries identical QI strings (the class *is* the equivalence class);
4. with ``l``: every class holds at least ``l`` distinct sensitive values (``>= l``; a port's off-by-one
   asked for ``l + 1``); with a ``requirement``
   (:class:`~stream_anon.core.diversity.DiversityRequirement`): entropy or recursive (c, l) l-diversity, and
   t-closeness against each class's stated reference (``references``: what the release carries; anonymize's
   meta file) or, without one, against the file's own distribution of the sensitive column (a different
   test: a stream checks each class against the distribution seen when it was released, see
   docs/offline-tools.md); the distribution of classes' distances to the file's own distribution is
   reported as a note either way;
5. with ``schema``: every QI string parses (interval ``[lo-hi]`` inside the public domain, or a label of
   the attribute's hierarchy); with ``original`` as well (needs record ids): every released record exists
   in the original data and each generalized value covers the original value (interval contains it; node
   covers the leaf).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.core.diversity import DiversityRequirement, emd
from stream_anon.core.intervals import parse_interval
from stream_anon.core.schema import Attribute, Kind, Schema
from stream_anon.core.validation import raising, require_int

__all__ = ["VerificationReport", "ReleaseRoles", "RolesError", "verify_release_frame", "verify_release_file",
           "read_release", "resolve_roles", "meta_path", "read_release_meta", "read_release_references",
           "write_release_meta", "diversity_meta",
           "RELEASE_META_FORMAT", "RELEASE_META_SUFFIX"]

RELEASE_META_SUFFIX = ".meta.json"
RELEASE_META_FORMAT = "stream-anon release"
RELEASE_META_VERSION = 1
MAX_MESSAGES_PER_CHECK = 20
_VERIFY_ERROR = raising(ValueError, prefix="verify")


@dataclass
class VerificationReport:
    """``ok`` iff ``violations`` is empty; messages name the class (or record) and what failed."""

    ok: bool
    violations: list[str]
    classes: int
    min_class_size: int
    records: int
    violation_counts: dict[str, int] = field(default_factory=dict)
    size_unit: str = "distinct records"  # what a class size counts
    roles: ReleaseRoles | None = None  # the column roles checked (set by verify_release_file)
    notes: list[str] = field(default_factory=list)  # informational lines (not violations)

    def __str__(self) -> str:
        head = (f"{'OK' if self.ok else 'VIOLATIONS'}: {self.records} records, {self.classes} classes, "
                f"min class size {self.min_class_size} ({self.size_unit})")
        return "\n".join([head, *("  - " + v for v in self.violations), *("  note: " + n for n in self.notes)])


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


class RolesError(ValueError):
    """The roles of a release's columns are unknown, contradictory or name a missing column.

    The message says what the verifier needs (an option, a schema, the meta file).
    """


@dataclass(frozen=True)
class ReleaseRoles:
    """Which column of a released table is what; ``source`` says where the roles came from (for messages)."""

    class_id: str
    quasi_identifiers: tuple[str, ...]
    sensitive: tuple[str, ...] = ()
    record_id: str | None = None
    person_id: str | None = None
    source: str = "arguments"
    withheld_person_id: str | None = None  # the schema's person id, not released (class sizes count records)

    @property
    def columns(self) -> list[str]:
        """Every column with a role, in the release's column order."""
        ids = [c for c in (self.record_id, self.person_id) if c]
        return [*ids, self.class_id, *self.quasi_identifiers, *self.sensitive]

    @property
    def layout(self) -> str:
        return "public" if self.record_id is None and self.person_id is None else "with-ids"

    def describe(self) -> str:
        ids = "".join(f", {name} {col!r}" for name, col in (("record id", self.record_id),
                                                             ("person id", self.person_id)) if col)
        sens = ", ".join(repr(c) for c in self.sensitive) or "none"
        return (f"roles from {self.source}: quasi-identifiers {list(self.quasi_identifiers)}, sensitive {sens}, "
                f"class id {self.class_id!r}{ids}")


def meta_path(release: str | os.PathLike[str]) -> Path:
    """Where the meta file of ``release`` lives: ``<release>.meta.json`` (``out.csv`` -> ``out.csv.meta.json``)."""
    p = Path(release)
    return p.with_name(p.name + RELEASE_META_SUFFIX)


def write_release_meta(release: str | os.PathLike[str], roles: ReleaseRoles, **info: Any) -> Path:
    """Write ``<release>.meta.json``: the release's column roles (and ``info``, e.g. k, l, counts); returns its path.

    The meta file is what lets ``verify`` check a release without guessing; a plain CSV reader ignores it.
    It holds no record id, offset or timing.
    """
    doc: dict[str, Any] = {
        "format": RELEASE_META_FORMAT, "version": RELEASE_META_VERSION, "layout": roles.layout,
        "columns": {"class_id": roles.class_id, "quasi_identifiers": list(roles.quasi_identifiers),
                    "sensitive": list(roles.sensitive), "record_id": roles.record_id, "person_id": roles.person_id},
        "withheld_person_id": roles.withheld_person_id,
        **info,
    }
    path = meta_path(release)
    path.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return path


def read_release_meta(path: str | os.PathLike[str]) -> ReleaseRoles:
    """The roles stated by a meta file (see :func:`write_release_meta`); :class:`RolesError` if it is not one."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RolesError(f"meta file {str(p)!r} cannot be read as JSON: {e}") from None
    if not isinstance(doc, Mapping) or doc.get("format") != RELEASE_META_FORMAT:
        raise RolesError(f"meta file {str(p)!r} is not a stream-anon release description "
                         f"(expected \"format\": \"{RELEASE_META_FORMAT}\")")
    if doc.get("version") != RELEASE_META_VERSION:
        raise RolesError(f"meta file {str(p)!r}: version {doc.get('version')!r} not supported "
                         f"(expected {RELEASE_META_VERSION})")
    cols = doc.get("columns")

    def names(key: str) -> tuple[str, ...]:
        v = cols.get(key) if isinstance(cols, Mapping) else None
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise RolesError(f"meta file {str(p)!r}: columns.{key} must be a list of column names, got {v!r}")
        return tuple(v)

    def name(key: str, required: bool) -> str | None:
        v = cols.get(key) if isinstance(cols, Mapping) else None
        if v is None and not required:
            return None
        if not isinstance(v, str) or not v:
            raise RolesError(f"meta file {str(p)!r}: columns.{key} must be a column name, got {v!r}")
        return v

    class_id = name("class_id", True)
    assert class_id is not None
    withheld = doc.get("withheld_person_id")
    return ReleaseRoles(class_id=class_id, quasi_identifiers=names("quasi_identifiers"),
                        sensitive=names("sensitive"), record_id=name("record_id", False),
                        person_id=name("person_id", False), source=f"meta file {str(p)!r}",
                        withheld_person_id=withheld if isinstance(withheld, str) else None)


def diversity_meta(requirement: DiversityRequirement | None,
                   references: Mapping[str, Sequence[tuple[Any, int]]] | None) -> dict[str, Any]:
    """What a meta file states about the diversity model (keyword arguments of :func:`write_release_meta`):
    ``diversity`` (entropy / recursive) and ``t_closeness`` with the distinct references and each class's index
    among them (``class_reference``: class id -> index).

    The references are the running distribution's snapshots; a class's index tells which snapshot was in force
    at its release (so roughly when it was released, as a class message's timestamp does in the service)."""
    if requirement is None:
        return {}
    out = dict(requirement.public_fields())
    if requirement.t is not None:
        distinct: dict[tuple[tuple[Any, int], ...], int] = {}
        index = {cid: distinct.setdefault(tuple((v, int(n)) for v, n in ref), len(distinct))
                 for cid, ref in (references or {}).items()}
        out["t_closeness"] = {**out["t_closeness"], "references": [[list(p) for p in ref] for ref in distinct],
                              "class_reference": index}
    return out


def _meta_t_distance(path: Path) -> str | None:
    try:
        block = json.loads(path.read_text(encoding="utf-8")).get("t_closeness")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    d = block.get("distance") if isinstance(block, Mapping) else None
    return d if d in ("equal", "ordered") else None


def read_release_references(path: str | os.PathLike[str]) -> dict[str, dict[Any, int]] | None:
    """The t-closeness references a meta file states (class id -> value -> count), or None when it has none.

    ``anonymize`` writes ``"t_closeness": {"t", "distance", "references": [[[value, count], ...], ...],
    "class_reference": {class id: index into references}}``."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RolesError(f"meta file {str(p)!r} cannot be read as JSON: {e}") from None
    block = doc.get("t_closeness") if isinstance(doc, Mapping) else None
    if block is None:
        return None
    try:
        refs = [{v: int(n) for v, n in r} for r in block["references"]]
        return {str(cid): refs[int(i)] for cid, i in block["class_reference"].items()}
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise RolesError(f"meta file {str(p)!r}: t_closeness must hold references and class_reference ({e!r})") from None


def resolve_roles(columns: Sequence[str], *, qis: Sequence[str] | None = None, sensitive: str | None = None,
                  person_id: str | None = None, meta: ReleaseRoles | None = None, schema: Schema | None = None,
                  where: str = "the release") -> ReleaseRoles:
    """The role of every column of a release whose header is ``columns``, without guessing.

    Sources, strongest first: the arguments (``qis``, ``sensitive``, ``person_id``), the release's ``meta``
    file, the ``schema`` (its QIs and sensitive attributes among ``columns``).  ``class_id`` and
    ``record_id`` are the layouts' fixed names unless the meta file says otherwise.  Raises
    :class:`RolesError` saying what is needed when there is no source for the QIs, when a named column is
    missing, when a column has two roles, or when a column has none (a column nobody described could be
    a quasi-identifier that nobody checks).
    """
    cols = list(columns)
    present = set(cols)
    repeated = sorted({c for c in cols if cols.count(c) > 1})
    if repeated:
        raise RolesError(f"{where}: column name(s) {repeated} appear more than once in the header")
    used: dict[str, None] = {}  # the sources actually used, in order (for messages)

    def need(col: str, what: str, origin: str) -> str:
        if col not in present:
            raise RolesError(f"{where}: {origin} names {col!r} as the {what} column, but the file has no such "
                             f"column; its columns are {cols}")
        return col

    if meta is not None:
        unknown = [c for c in meta.columns if c not in present]
        if unknown:
            raise RolesError(f"{where}: the {meta.source} names column(s) {unknown} that the file does not have "
                             f"(its columns are {cols}): the meta file does not describe this file; fix or remove "
                             f"it, or pass --meta with the right one")
        used[meta.source] = None
    class_id = meta.class_id if meta is not None else "class_id"
    need(class_id, "class id", meta.source if meta is not None else "the release layout")
    record_id = meta.record_id if meta is not None else ("record_id" if "record_id" in present else None)
    schema_src = f"schema {schema.name!r}" if schema is not None else ""

    # person id: argument > meta > the schema's (when the file carries it)
    withheld: str | None = None
    pid: str | None = None
    if person_id is not None:
        pid = need(person_id, "person id", "--person-id")
        used["--person-id"] = None
    elif meta is not None:
        pid, withheld = meta.person_id, meta.withheld_person_id
    elif schema is not None and schema.person_id is not None:
        if schema.person_id in present:
            pid = schema.person_id
            used[schema_src] = None
        else:
            withheld = schema.person_id

    # quasi-identifiers: argument > meta > schema
    if qis is not None:
        q = tuple(need(c, "quasi-identifier", "--qi") for c in qis)
        used["--qi"] = None
    elif meta is not None:
        q = meta.quasi_identifiers
    elif schema is not None:
        q = tuple(a.name for a in schema.attributes if a.is_qi and a.name in present)
        used[schema_src] = None
        if not q:
            raise RolesError(f"{where}: none of the quasi-identifiers of {schema_src} ({[a.name for a in schema.qis]}) "
                             f"is a column of the file (columns {cols}); name them with --qi")
    else:
        raise RolesError(f"{where}: cannot tell which columns are quasi-identifiers and which is sensitive: "
                         f"give --qi (and --sensitive), --schema, or keep the meta file written by anonymize "
                         f"beside the release (<release>{RELEASE_META_SUFFIX}, or --meta PATH)")
    if not q:
        raise RolesError(f"{where}: no quasi-identifier column: a release without one cannot be checked")

    # sensitive: argument > meta > schema (those the file carries) > none
    if sensitive is not None:
        sens: tuple[str, ...] = (need(sensitive, "sensitive", "--sensitive"),)
        used["--sensitive"] = None
    elif meta is not None:
        sens = meta.sensitive
    elif schema is not None:
        sens = tuple(a.name for a in schema.sensitive if a.name in present)
        used[schema_src] = None
    else:
        sens = ()

    roles_of: dict[str, list[str]] = {}
    for role, names in (("the class id", [class_id]), ("an id", [c for c in (record_id, pid) if c]),
                        ("a quasi-identifier", list(q)), ("sensitive", list(sens))):
        for c in names:
            roles_of.setdefault(c, []).append(role)
    for c, r in roles_of.items():
        if len(r) > 1:
            raise RolesError(f"{where}: column {c!r} cannot be both {r[0]} and {r[1]}")
    unassigned = [c for c in cols if c not in roles_of]
    if unassigned:
        raise RolesError(f"{where}: column(s) {unassigned} have no role (roles from {' and '.join(used)}): every "
                         f"column must be a quasi-identifier (--qi), a sensitive column (--sensitive), or be "
                         f"described by --schema or the release's meta file")
    return ReleaseRoles(class_id=class_id, quasi_identifiers=q, sensitive=sens, record_id=record_id, person_id=pid,
                        source=" and ".join(used), withheld_person_id=None if pid else withheld)


def read_release(path: str | os.PathLike[str]) -> pd.DataFrame:
    """A released CSV, every column as strings; :class:`ValueError` if it is not a readable CSV."""
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise ValueError(f"release file {str(path)!r} is not a readable CSV: {' '.join(str(e).split())}") from None


def verify_release_frame(df: pd.DataFrame, qi_columns: Sequence[str], k: int, l: int | None = None,  # noqa: E741
                         sensitive: str | None = None, *, record_id: str | None = "record_id",
                         class_id: str = "class_id", person_id: str | None = None, schema: Schema | None = None,
                         original: pd.DataFrame | None = None, original_id: str | None = None,
                         requirement: DiversityRequirement | None = None,
                         references: Mapping[str, Mapping[Any, int]] | None = None) -> VerificationReport:
    """Check a released table (see the module docstring); returns a :class:`VerificationReport`.

    ``qi_columns`` must not be empty.  ``k`` >= 1; ``l`` (optional) >= 1 needs ``sensitive``.
    ``record_id=None``: the public layout, without record ids (a class's size is then its number of rows,
    or of distinct ``person_id`` values).  ``schema`` enables parsing/domain checks of the QI strings;
    ``original`` (the input records, id column ``original_id``, default ``schema.record_id`` or ``"id"``)
    enables the coverage check and needs ``schema`` and record ids.
    """
    require_int("k", k, low=1, error=_VERIFY_ERROR)
    if l is not None:
        require_int("l", l, low=1, error=_VERIFY_ERROR)
    if requirement is not None and requirement.l_active and requirement.model == "distinct":
        if l is None or l < int(requirement.l):  # type: ignore[arg-type]
            l = int(requirement.l)  # type: ignore[arg-type]  # noqa: E741
    beyond = requirement is not None and (requirement.t is not None or
                                          (requirement.l_active and requirement.model != "distinct"))
    if (l is not None or beyond) and sensitive is None:
        raise ValueError("verify: l-diversity needs the sensitive column (sensitive=None given)")
    if original is not None and schema is None:
        raise ValueError("verify: checking coverage of the original data needs the schema")
    if original is not None and record_id is None:
        raise ValueError("verify: checking coverage of the original data needs the record ids (a release with ids)")
    qis = list(qi_columns)
    if not qis:
        raise ValueError("verify: no quasi-identifier column given: a class's QIs could not be checked")
    needed = [c for c in (record_id, class_id) if c] + qis + (
        [sensitive] if (l is not None or beyond) and sensitive else []) + ([person_id] if person_id else [])
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise ValueError(f"verify: column(s) {missing} missing from the released table; found {list(df.columns)}")
    out = _Collector()
    n = len(df)
    unit = f"distinct {person_id!r} values" if person_id else "distinct records" if record_id else "records"
    if n == 0:
        return VerificationReport(ok=True, violations=[], classes=0, min_class_size=0, records=0, size_unit=unit)
    cids = df[class_id].astype(str)
    rids = df[record_id].astype(str) if record_id else pd.Series(np.arange(n).astype(str), index=df.index)

    # 1. duplicate record ids (with a person id: the same record id for two different persons)
    if record_id:
        dup_mask = rids.duplicated(keep=False)
        if person_id and dup_mask.any():
            persons = df.loc[dup_mask, person_id].astype(str).groupby(rids[dup_mask]).nunique()
            bad_ids = persons[persons > 1]
            out.add("duplicate record_id", [f"record_id {r!r} appears for {int(c)} different {person_id!r} values"
                                            for r, c in bad_ids.items()], len(bad_ids))
        elif dup_mask.any():
            counts = rids[dup_mask].value_counts()
            out.add("duplicate record_id", [f"record_id {r!r} appears {c} times" for r, c in counts.items()],
                    len(counts))

    grouped = df.groupby(cids, sort=False)
    # 2. class size in distinct individuals
    who = df[person_id].astype(str) if person_id else rids
    sizes = who.groupby(cids, sort=False).nunique()
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

    # 4b. the model beyond distinct l: entropy / recursive l-diversity, t-closeness
    notes: list[str] = []
    if beyond and requirement is not None and sensitive is not None:
        _check_model(df[sensitive].astype(str), cids, requirement, references, sensitive, out, notes)

    # 5. strings parse within the schema; generalizations cover the original values
    if schema is not None:
        _check_against_schema(df, qis, schema, rids, cids, out, original,
                              original_id or schema.record_id or "id")

    return VerificationReport(ok=not out.messages, violations=out.messages, classes=int(len(sizes)),
                              min_class_size=int(sizes.min()), records=n, violation_counts=dict(out.counts),
                              size_unit=unit, notes=notes)


def _check_model(values: pd.Series, cids: pd.Series, req: DiversityRequirement,
                 references: Mapping[str, Mapping[Any, int]] | None, sensitive: str, out: _Collector,
                 notes: list[str]) -> None:
    """Entropy / recursive l-diversity and t-closeness of every class, vectorized over classes (one crosstab).

    Values are compared as text (a CSV holds text; a reference's values are read as text too).  The ordered
    distance orders them as numbers."""
    table = pd.crosstab(cids, values)
    ref_table: pd.DataFrame | None = None
    if req.t is not None and references is not None:
        missing = [c for c in table.index if str(c) not in references]
        out.add("no t-closeness reference", [f"class {c!r}: the release states no reference distribution for it"
                                            for c in missing[:MAX_MESSAGES_PER_CHECK]], len(missing))
        rows = {str(c): {str(v): int(n) for v, n in references.get(str(c), {}).items()} for c in table.index}
        ref_table = pd.DataFrame.from_dict(rows, orient="index").fillna(0)
        cols = table.columns.union(ref_table.columns)
        table = table.reindex(columns=cols, fill_value=0)
        ref_table = ref_table.reindex(index=[str(c) for c in table.index], columns=cols, fill_value=0)
    if req.t is not None and req.distance == "ordered":
        num = pd.to_numeric(pd.Series(table.columns), errors="coerce")
        if num.isna().any():
            bad = [str(v) for v in pd.Series(table.columns)[num.isna()][:3]]
            out.add("t-closeness", [f"column {sensitive!r}: the ordered distance needs numeric values, got {bad}"])
            return
        order = np.argsort(num.to_numpy(), kind="stable")
        table = table.iloc[:, order]
        if ref_table is not None:
            ref_table = ref_table.iloc[:, order]
    counts = table.to_numpy(dtype=np.float64)
    own = counts.sum(axis=0)
    if req.l_active and req.model != "distinct":
        bad_l = np.flatnonzero(~req.l_check(counts))
        l_req = DiversityRequirement(model=req.model, l=req.l, c=req.c)
        msgs = [f"class {table.index[i]!r}: " + "; ".join(l_req.explain(dict(zip(table.columns, counts[i], strict=True)),
                                                                        None, sensitive))
                for i in bad_l[:MAX_MESSAGES_PER_CHECK]]
        out.add(f"class not {req.model} l-diverse", msgs, len(bad_l))
    if req.t is None:
        return
    t_req = DiversityRequirement(t=req.t, distance=req.distance)
    d_own = emd(counts, own, req.distance)
    if ref_table is None:
        bad_t = np.flatnonzero(d_own > req.t + 1e-9)
        what = "the file's own distribution"
        notes.append(f"t-closeness checked against {what} of {sensitive!r} (no per-class reference given, e.g. no "
                     f"meta file): a stream checks each class against the distribution when it was released, so a "
                     f"streamed release may fail this and still hold its claim")
    else:
        refs = ref_table.to_numpy(dtype=np.float64)
        d_ref = emd(counts, refs, req.distance)
        stated = refs.sum(axis=1) > 0  # a class without one is reported above
        bad_t = np.flatnonzero(~t_req.check(counts, refs) & stated)
        what = "its stated reference"
        over = int(np.count_nonzero(d_own > req.t + 1e-9))
        notes.append(f"against the file's own distribution of {sensitive!r} (not the claim): {over} of {len(counts)} "
                     f"classes are farther than t={req.t} (max EMD {float(d_own.max()):.4f}; against the stated "
                     f"references max {float(d_ref[stated].max()) if stated.any() else 0.0:.4f})")
    dist = d_own if ref_table is None else emd(counts, ref_table.to_numpy(dtype=np.float64), req.distance)
    msgs = [f"class {table.index[i]!r}: EMD of {sensitive!r} to {what} {float(dist[i]):.4f} > t={req.t} "
            f"({req.distance} distance)" for i in bad_t[:MAX_MESSAGES_PER_CHECK]]
    out.add("class not t-close", msgs, len(bad_t))


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
        pos = orig_index.get_indexer(pd.Index(rids))
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
                        person_id: str | None = None, schema: Schema | None = None,
                        meta: str | os.PathLike[str] | bool = True, original: pd.DataFrame | None = None,
                        original_id: str | None = None, requirement: DiversityRequirement | None = None,
                        t_distance: str = "auto") -> VerificationReport:
    """Read a released CSV (all columns as strings), resolve its roles and :func:`verify_release_frame` it.

    ``meta``: True reads ``<path>.meta.json`` when it exists, a path reads that meta file (which must
    exist), False ignores meta files.  Roles: :func:`resolve_roles` (raises :class:`RolesError` when it
    cannot tell).  With ``l``, the l-diversity column is ``sensitive`` or the first sensitive column.
    The report's ``roles`` says which columns were checked as what.  ``requirement``: the diversity model
    to check beyond distinct l; its t-closeness references come from the meta file (else the file's own
    distribution is the reference, and the report notes it).  ``t_distance`` (``auto``, ``equal``,
    ``ordered``) replaces the requirement's distance; ``auto``: the meta file's, else ordered when the schema
    says the sensitive attribute is numeric (or, without a schema, every value is a number), else equal.
    """
    df = read_release(path)
    roles_meta: ReleaseRoles | None = None
    references = None
    meta_file: Path | None = None
    if meta is True:
        if meta_path(path).is_file():
            meta_file = meta_path(path)
    elif meta is not False:
        meta_file = Path(meta)
    if meta_file is not None:
        roles_meta = read_release_meta(meta_file)
        if requirement is not None and requirement.t is not None:
            references = read_release_references(meta_file)
    roles = resolve_roles(list(df.columns), qis=qi_columns, sensitive=sensitive, person_id=person_id,
                          meta=roles_meta, schema=schema, where=str(path))
    l_column = roles.sensitive[0] if roles.sensitive else None
    if (l is not None or (requirement is not None and requirement.active)) and l_column is None:
        raise RolesError(f"{path}: l-diversity needs a sensitive column and the release has none "
                         f"({roles.describe()}); name it with --sensitive")
    if requirement is not None and requirement.t is not None and l_column is not None:
        distance = t_distance
        if distance == "auto":
            stated = _meta_t_distance(meta_file) if meta_file is not None else None
            if stated is not None:
                distance = stated
            elif schema is not None and l_column in schema:
                distance = "ordered" if schema[l_column].kind is Kind.NUMERIC else "equal"
            else:
                numeric = pd.to_numeric(df[l_column], errors="coerce").notna().all()
                distance = "ordered" if numeric and len(df) else "equal"
        requirement = DiversityRequirement(model=requirement.model, l=requirement.l, c=requirement.c,
                                           t=requirement.t, distance=distance)
    report = verify_release_frame(df, roles.quasi_identifiers, k, l, l_column, record_id=roles.record_id,
                                  class_id=roles.class_id, person_id=roles.person_id, schema=schema,
                                  original=original, original_id=original_id, requirement=requirement,
                                  references=references)
    report.roles = roles
    return report
