"""Record schemas: each attribute's role, type and public domain.

A schema file (YAML or JSON) looks like::

    name: adult
    record_id: id            # field carrying the record id (optional)
    person_id: null          # field carrying the individual's id (optional, CASTLE's pid)
    missing: "?"             # token for a missing value
    attributes:
      - {name: age, role: quasi_identifier, type: numeric, domain: [17, 90], integer: true,
         source: "adult.names extraction AAGE > 16; CPS top-code 90"}
      - {name: workclass, role: quasi_identifier, type: categorical, hierarchy: hierarchies/workclass.csv}
      - {name: income, role: sensitive, type: categorical, values: ["<=50K", ">50K"], side_paths: [blap]}

``side_paths`` (optional, per attribute) declares which local-DP side paths publish perturbed copies of the
attribute (:data:`SIDE_PATHS`): ``krr`` and ``rs`` take categorical attributes with a declared domain, ``kmeans``
numeric ones with a public domain, ``blap`` either; identifiers never.  The service's side paths take their
attributes from these declarations unless the configuration lists them; a schema that declares none runs no
side paths.

Numeric quasi-identifiers generalize to intervals inside the configured *public* domain
``[lo, hi]`` (never the running min/max of the stream: that would leak and drift); ``source`` says where
a domain comes from (a documented range or top-code, or a declared policy bound) and is kept on the
attribute. Categorical quasi-identifiers generalize along their hierarchy.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from stream_anon.core.hierarchy import Hierarchy
from stream_anon.core.validation import is_number

_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` in libyaml's C parser when PyYAML has it (12x faster on the ADULT schema), else in Python;
    the same safe subset of YAML either way."""
    return yaml.load(text, Loader=_SAFE_LOADER)  # noqa: S506 (a safe loader)


class Role(StrEnum):
    IDENTIFIER = "identifier"
    QUASI_IDENTIFIER = "quasi_identifier"
    SENSITIVE = "sensitive"
    OTHER = "other"


class Kind(StrEnum):
    NUMERIC = "numeric"
    CATEGORICAL = "categorical"


SIDE_PATHS = ("krr", "rs", "blap", "kmeans")
"""The local-DP side paths an attribute can declare (``side_paths: [...]``): k-randomized response and random
substitution (categorical), bounded Laplace (numeric or categorical), windowed DP k-means (numeric)."""


class SchemaError(ValueError):
    """A schema file, or a record checked against a schema, is invalid.

    ``field``, ``allowed`` and ``value`` name what was wrong, for dead-letter reasons.
    """

    def __init__(self, message: str, *, field: str | None = None, allowed: str | None = None, value: Any = None):
        super().__init__(message)
        self.field = field
        self.allowed = allowed
        self.value = value


@dataclass(frozen=True, eq=False)
class Attribute:
    name: str
    role: Role
    kind: Kind
    lo: float | None = None  # numeric public domain
    hi: float | None = None
    integer: bool = False
    hierarchy: Hierarchy | None = None  # categorical QIs
    values: tuple[str, ...] | None = None  # categorical non-QI domain (e.g. sensitive)
    source: str | None = None  # where the public domain comes from (documentation, top-code or policy)
    side_paths: tuple[str, ...] = ()  # side paths that publish perturbed copies of it (SIDE_PATHS)

    @property
    def is_qi(self) -> bool:
        return self.role is Role.QUASI_IDENTIFIER

    @property
    def numeric_domain(self) -> tuple[float, float]:
        """A numeric QI's public domain ``(lo, hi)`` (a :class:`Schema` requires one of every numeric QI)."""
        if self.lo is None or self.hi is None:
            raise SchemaError(f"field {self.name!r}: no public domain [lo, hi]", field=self.name)
        return self.lo, self.hi

    @property
    def qi_hierarchy(self) -> Hierarchy:
        """A categorical QI's hierarchy (a :class:`Schema` requires one of every categorical QI)."""
        if self.hierarchy is None:
            raise SchemaError(f"field {self.name!r}: no generalization hierarchy", field=self.name)
        return self.hierarchy

    @property
    def domain_values(self) -> tuple[str, ...]:
        """The categorical domain (hierarchy leaves or declared values)."""
        if self.hierarchy is not None:
            return self.hierarchy.leaves
        return self.values or ()

    def describe_domain(self) -> str:
        if self.kind is Kind.NUMERIC:
            return f"{'integer' if self.integer else 'number'} in [{_fmt(self.lo)}, {_fmt(self.hi)}]"
        vals = self.domain_values
        shown = ", ".join(repr(v) for v in vals[:12]) + (", ..." if len(vals) > 12 else "")
        return f"one of {len(vals)} values ({shown})" if vals else "any string"

    def check(self, value: Any) -> Any:
        """Return the value normalized to the attribute's type or raise SchemaError."""
        if self.kind is Kind.NUMERIC:
            if not (is_number(value) or isinstance(value, str)):
                raise SchemaError(
                    f"field {self.name!r}: expected {self.describe_domain()}, got {type(value).__name__} {value!r}",
                    field=self.name, allowed=self.describe_domain(), value=value,
                )
            try:
                x = float(value)
            except ValueError:
                raise SchemaError(
                    f"field {self.name!r}: expected {self.describe_domain()}, got {value!r}",
                    field=self.name, allowed=self.describe_domain(), value=value,
                ) from None
            if not math.isfinite(x) or (self.lo is not None and x < self.lo) or (self.hi is not None and x > self.hi):
                raise SchemaError(
                    f"field {self.name!r}: value {value!r} outside the public domain [{_fmt(self.lo)}, {_fmt(self.hi)}]",
                    field=self.name, allowed=self.describe_domain(), value=value,
                )
            if self.integer and x != int(x):
                raise SchemaError(
                    f"field {self.name!r}: expected an integer in [{_fmt(self.lo)}, {_fmt(self.hi)}], got {value!r}",
                    field=self.name, allowed=self.describe_domain(), value=value,
                )
            return int(x) if self.integer else x
        if not isinstance(value, str):
            raise SchemaError(
                f"field {self.name!r}: expected a string, {self.describe_domain()}, got {type(value).__name__} {value!r}",
                field=self.name, allowed=self.describe_domain(), value=value,
            )
        value = value.strip()
        vals = self.domain_values
        if vals:
            index = self.hierarchy.leaf_index if self.hierarchy is not None else None
            ok = value in index if index is not None else value in vals
            if not ok:
                raise SchemaError(
                    f"field {self.name!r}: unknown category {value!r}; expected {self.describe_domain()}",
                    field=self.name, allowed=self.describe_domain(), value=value,
                )
        return value


def _fmt(x: float | None) -> str:
    if x is None:
        return "?"
    return str(int(x)) if float(x).is_integer() else repr(x)


@dataclass(frozen=True, eq=False)
class Schema:
    """An ordered set of attributes with roles; the single description of a record type."""

    name: str
    attributes: tuple[Attribute, ...]
    record_id: str | None = "id"
    person_id: str | None = None
    missing: str | None = "?"
    source_dir: Path | None = None
    _by_name: dict[str, Attribute] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        names = [a.name for a in self.attributes]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SchemaError(f"schema {self.name!r}: attribute names repeat: {sorted(dup)}")
        object.__setattr__(self, "_by_name", {a.name: a for a in self.attributes})
        for a in self.attributes:
            if a.kind is Kind.NUMERIC and a.is_qi and (a.lo is None or a.hi is None or not a.hi > a.lo):
                raise SchemaError(
                    f"schema {self.name!r}: numeric quasi-identifier {a.name!r} needs a public domain [lo, hi] "
                    f"with hi > lo, got [{a.lo}, {a.hi}]", field=a.name,
                )
            if a.kind is Kind.CATEGORICAL and a.is_qi and a.hierarchy is None:
                raise SchemaError(f"schema {self.name!r}: categorical quasi-identifier {a.name!r} needs a hierarchy",
                                  field=a.name)

    # ------------------------------------------------------------------ views
    def __getitem__(self, name: str) -> Attribute:
        try:
            return self._by_name[name]
        except KeyError:
            raise SchemaError(f"schema {self.name!r}: no attribute {name!r}; known: {list(self._by_name)}",
                              field=name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.attributes]

    @property
    def qis(self) -> list[Attribute]:
        """Quasi-identifiers in schema order: numeric ones first, then categorical (engine layout)."""
        return self.numeric_qis + self.categorical_qis

    @property
    def numeric_qis(self) -> list[Attribute]:
        return [a for a in self.attributes if a.is_qi and a.kind is Kind.NUMERIC]

    @property
    def categorical_qis(self) -> list[Attribute]:
        return [a for a in self.attributes if a.is_qi and a.kind is Kind.CATEGORICAL]

    @property
    def sensitive(self) -> list[Attribute]:
        return [a for a in self.attributes if a.role is Role.SENSITIVE]

    def side_path_attributes(self, path: str, kind: Kind | None = None) -> list[str]:
        """Names of the attributes that declare ``path`` in their ``side_paths`` (of ``kind`` when given), in
        schema order."""
        return [a.name for a in self.attributes if path in a.side_paths and (kind is None or a.kind is kind)]

    def with_roles(self, qis: Sequence[str] | None = None, sensitive: str | None = None) -> Schema:
        """A copy with the QI set (and optionally the sensitive attribute) replaced.

        Attributes dropped from the QI set become ``other``; a QI newly added must have what a QI needs.
        """
        qset = set(qis) if qis is not None else None
        if qset is not None:
            unknown = qset - set(self.names)
            if unknown:
                raise SchemaError(f"unknown quasi-identifier(s) {sorted(unknown)}; known: {self.names}",
                                  field="qi", allowed=", ".join(self.names), value=sorted(unknown))
        if sensitive is not None and sensitive not in self:
            raise SchemaError(f"unknown sensitive attribute {sensitive!r}; known: {self.names}",
                              field="sensitive", allowed=", ".join(self.names), value=sensitive)
        if qset is not None:
            new_sensitive = sensitive if sensitive is not None else next((a.name for a in self.sensitive), None)
            for a in self.attributes:
                if a.name not in qset:
                    continue
                if a.name == new_sensitive or (sensitive is None and a.role is Role.SENSITIVE):
                    raise SchemaError(f"attribute {a.name!r} cannot be both a quasi-identifier and the sensitive "
                                      f"attribute", field="qi", allowed="non-sensitive attributes", value=a.name)
                if a.role is Role.IDENTIFIER:
                    raise SchemaError(f"attribute {a.name!r} is an identifier and cannot be a quasi-identifier",
                                      field="qi", allowed="non-identifier attributes", value=a.name)
        attrs = []
        for a in self.attributes:
            role = a.role
            if sensitive is not None:
                if a.name == sensitive:
                    role = Role.SENSITIVE
                elif role is Role.SENSITIVE:
                    role = Role.OTHER
            if qset is not None and role is not Role.SENSITIVE and role is not Role.IDENTIFIER:
                role = Role.QUASI_IDENTIFIER if a.name in qset else Role.OTHER
            attrs.append(replace(a, role=role))
        return replace(self, attributes=tuple(attrs), _by_name={})

    # ------------------------------------------------------------------ validation
    def validate(self, record: Mapping[str, Any], *, allow_extra: bool = False) -> dict[str, Any]:
        """Check a record against the schema; return it normalized (numbers typed, strings stripped).

        Raises SchemaError naming the field, the allowed domain and the value received.
        """
        if not isinstance(record, Mapping):
            raise SchemaError(f"record must be a JSON object, got {type(record).__name__}", field=None,
                              allowed="object", value=record)
        out: dict[str, Any] = {}
        if self.record_id is not None:
            rid = record.get(self.record_id)
            if rid is None or (isinstance(rid, str) and rid == "") or isinstance(rid, bool | float | list | dict):
                raise SchemaError(f"field {self.record_id!r} (record id): missing or not a string/integer, got {rid!r}",
                                  field=self.record_id, allowed="non-empty string or integer", value=rid)
            out[self.record_id] = rid
        for a in self.attributes:
            if a.name not in record:
                raise SchemaError(f"field {a.name!r}: missing; expected {a.describe_domain()}",
                                  field=a.name, allowed=a.describe_domain(), value=None)
            out[a.name] = a.check(record[a.name])
        if self.person_id is not None and self.person_id not in out:
            if self.person_id not in record:
                raise SchemaError(f"field {self.person_id!r} (person id): missing", field=self.person_id,
                                  allowed="string or integer", value=None)
            out[self.person_id] = record[self.person_id]
        if not allow_extra:
            extra = set(record) - set(out)
            if extra:
                raise SchemaError(f"unexpected field(s) {sorted(extra)}; the schema {self.name!r} has {self.names}",
                                  field=sorted(extra)[0], allowed=", ".join(self.names), value=sorted(extra))
        return out

    def encode_qis(self, record: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """QI values of one validated record as (numeric float64[Jn], categorical leaf-index int64[Jc])."""
        num = np.array([float(record[a.name]) for a in self.numeric_qis], dtype=np.float64)
        cat = np.array([a.qi_hierarchy.leaf_index[record[a.name]] for a in self.categorical_qis],
                       dtype=np.int64)
        return num, cat

    def encode_qis_many(self, columns: Mapping[str, Sequence[Any]]) -> tuple[np.ndarray, np.ndarray]:
        """Column-wise encoding of many validated records: ``(n, Jn)`` float64 and ``(n, Jc)`` int64."""
        nq, cq = self.numeric_qis, self.categorical_qis
        n = len(next(iter(columns.values()))) if columns else 0
        num = np.empty((n, len(nq)), dtype=np.float64)
        cat = np.empty((n, len(cq)), dtype=np.int64)
        for j, a in enumerate(nq):
            num[:, j] = np.asarray(columns[a.name], dtype=np.float64)
        for j, a in enumerate(cq):
            idx = a.qi_hierarchy.leaf_index
            cat[:, j] = [idx[v] for v in columns[a.name]]
        return num, cat

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], base_dir: str | Path | None = None) -> Schema:
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        name = str(spec.get("name", "schema"))
        attrs = []
        raw_attrs = spec.get("attributes")
        if not isinstance(raw_attrs, list) or not raw_attrs:
            raise SchemaError(f"schema {name!r}: 'attributes' must be a non-empty list")
        for i, a in enumerate(raw_attrs):
            if not isinstance(a, Mapping) or "name" not in a:
                raise SchemaError(f"schema {name!r}: attribute #{i} needs a 'name'")
            an = str(a["name"])
            try:
                role = Role(a.get("role", "other"))
            except ValueError:
                raise SchemaError(f"schema {name!r}, attribute {an!r}: role {a.get('role')!r} not one of "
                                  f"{[r.value for r in Role]}", field=an) from None
            try:
                kind = Kind(a.get("type", "categorical"))
            except ValueError:
                raise SchemaError(f"schema {name!r}, attribute {an!r}: type {a.get('type')!r} not one of "
                                  f"{[k.value for k in Kind]}", field=an) from None
            lo = hi = None
            if "domain" in a:
                dom = a["domain"]
                if not (isinstance(dom, list | tuple) and len(dom) == 2):
                    raise SchemaError(f"schema {name!r}, attribute {an!r}: domain must be [lo, hi], got {dom!r}", field=an)
                try:
                    lo, hi = float(dom[0]), float(dom[1])
                except (TypeError, ValueError):
                    raise SchemaError(f"schema {name!r}, attribute {an!r}: domain bounds must be numbers, got {dom!r}",
                                      field=an, allowed="[lo, hi] numbers", value=dom) from None
            hierarchy = None
            if "hierarchy" in a and a["hierarchy"] is not None:
                hpath = Path(a["hierarchy"])
                if not hpath.is_absolute():
                    hpath = base / hpath
                if not hpath.is_file():
                    raise SchemaError(f"schema {name!r}, attribute {an!r}: hierarchy file {str(hpath)!r} does not exist",
                                      field=an, allowed="an existing ARX hierarchy CSV", value=str(hpath))
                hierarchy = Hierarchy.from_csv(hpath, name=an)
            values = tuple(str(v) for v in a["values"]) if a.get("values") is not None else None
            source = a.get("source")
            if source is not None and not (isinstance(source, str) and source.strip()):
                raise SchemaError(f"schema {name!r}, attribute {an!r}: source must be a non-empty string, got {source!r}",
                                  field=an, allowed="a non-empty string", value=source)
            attr = Attribute(name=an, role=role, kind=kind, lo=lo, hi=hi, integer=bool(a.get("integer", False)),
                             hierarchy=hierarchy, values=values,
                             source=" ".join(source.split()) if source is not None else None)
            attrs.append(replace(attr, side_paths=_side_paths(name, attr, a.get("side_paths"))))
        return cls(name=name, attributes=tuple(attrs), record_id=spec.get("record_id", "id"),
                   person_id=spec.get("person_id"), missing=spec.get("missing", "?"), source_dir=base)

    @classmethod
    def load(cls, path: str | Path) -> Schema:
        """Load a YAML or JSON schema file; hierarchy paths are relative to the file."""
        p = Path(path)
        text = p.read_text(encoding="utf-8")
        try:
            spec = json.loads(text) if p.suffix.lower() == ".json" else load_yaml(text)
        except (json.JSONDecodeError, yaml.YAMLError) as e:
            raise SchemaError(f"schema file {p}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'}: {e}",
                              field=None, allowed="a YAML/JSON mapping", value=str(p)) from None
        if not isinstance(spec, Mapping):
            raise SchemaError(f"schema file {p}: expected a mapping at top level")
        return cls.from_dict(spec, base_dir=p.parent)


def _side_paths(schema: str, attr: Attribute, raw: Any) -> tuple[str, ...]:
    """The ``side_paths`` of an attribute's spec, checked against what each side path can take."""
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple) or not all(isinstance(x, str) for x in items):
        raise SchemaError(f"schema {schema!r}, attribute {attr.name!r}: side_paths must be a list of "
                          f"{', '.join(SIDE_PATHS)}, got {raw!r}", field=attr.name, allowed=", ".join(SIDE_PATHS),
                          value=raw)
    unknown = [x for x in items if x not in SIDE_PATHS]
    if unknown:
        raise SchemaError(f"schema {schema!r}, attribute {attr.name!r}: side_paths {unknown} not among "
                          f"{list(SIDE_PATHS)}", field=attr.name, allowed=", ".join(SIDE_PATHS), value=unknown)
    if items and attr.role is Role.IDENTIFIER:
        raise SchemaError(f"schema {schema!r}, attribute {attr.name!r}: an identifier never goes to a side path, "
                          f"got side_paths {list(items)}", field=attr.name, allowed="no side_paths", value=list(items))
    numeric_domain = attr.kind is Kind.NUMERIC and attr.lo is not None and attr.hi is not None and attr.hi > attr.lo
    categorical_domain = attr.kind is Kind.CATEGORICAL and len(attr.domain_values) >= 2
    needs = {"krr": (categorical_domain, "a categorical attribute with a declared domain of at least 2 values"),
             "rs": (categorical_domain, "a categorical attribute with a declared domain of at least 2 values"),
             "kmeans": (numeric_domain, "a numeric attribute with a public domain [lo, hi]"),
             "blap": (numeric_domain or categorical_domain,
                      "a numeric attribute with a public domain or a categorical one with a declared domain")}
    for path in items:
        ok, what = needs[path]
        if not ok:
            raise SchemaError(f"schema {schema!r}, attribute {attr.name!r}: side path {path!r} needs {what}",
                              field=attr.name, allowed=what, value=path)
    return tuple(dict.fromkeys(items))


ADULT_SCHEMA_PATH = Path(__file__).parent / "data" / "adult" / "schema.yaml"


@functools.cache
def adult_schema() -> Schema:
    """The shipped ADULT schema: 14 QIs (6 numeric, 8 categorical), income sensitive (read once: a schema is
    immutable)."""
    return Schema.load(ADULT_SCHEMA_PATH)
