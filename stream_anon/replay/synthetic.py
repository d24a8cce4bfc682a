"""Synthetic ADULT-shaped records for unbounded load tests: same schema, ADULT's marginal frequencies.

Each attribute is drawn independently from its marginal distribution in the UCI ADULT training file
(32,561 records), with one exception: ``education-num`` is a function of ``education`` in ADULT
(16 categories, 16 codes, one-to-one), so the generator derives it from the drawn ``education``;
that keeps both marginals exact and every record internally consistent.  Other correlations
(e.g. ``relationship=Husband`` implies ``sex=Male``) are *not* kept: the records are for load and
throughput tests, not for utility measurements.

Marginals (counts, never records):

* categorical attributes: the count of every category;
* numeric attributes with at most ``max_exact_values`` distinct values (age, education-num,
  capital-gain, capital-loss, hours-per-week): the count of every distinct value;
* other numeric attributes (fnlwgt): a histogram over ``n_bins`` bins with quantile edges; a value
  is drawn uniformly inside its bin.

They are computed from the real file when it is available (``$STREAM_ANON_ADULT`` or a path) and
otherwise read from the JSON shipped next to this module (``data/adult_marginals.json``), so the
generator works offline.  Record ids are clearly synthetic: ``synth-000000``, ``synth-000001``, ...

Randomness comes from an injected ``numpy.random.Generator`` (``rng=``; OS entropy by default,
a seed in tests).  Generation is vectorized in batches; the output is deterministic for a given
seed and ``batch_size``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.core.datasets import ADULT_ENV, read_adult, sha256_of
from stream_anon.core.schema import Kind, Schema, adult_schema
from stream_anon.core.validation import raising, require_int

MARGINALS_FORMAT = "stream-anon-marginals/1"
ADULT_MARGINALS_PATH = Path(__file__).parent / "data" / "adult_marginals.json"
SYNTHETIC_ID_PREFIX = "synth"


class MarginalsError(ValueError):
    """A marginals file or a generator parameter is invalid (the message names the field and the value)."""


@dataclass(frozen=True, eq=False)
class AttributeMarginal:
    """The marginal distribution of one attribute.

    ``kind`` is ``"categorical"`` (``values`` = category labels), ``"values"`` (numeric, ``values`` =
    the distinct numbers) or ``"bins"`` (numeric, ``edges`` = ``n+1`` bin edges; bin ``i`` is
    ``[edges[i], edges[i+1])``, the last bin closed).  ``counts`` are the observed counts.
    """

    name: str
    kind: str
    counts: np.ndarray
    values: tuple[Any, ...] | None = None
    edges: np.ndarray | None = None
    integer: bool = True

    def __post_init__(self) -> None:
        if self.kind not in ("categorical", "values", "bins"):
            raise MarginalsError(f"attribute {self.name!r}: kind must be 'categorical', 'values' or 'bins', "
                                 f"got {self.kind!r}")
        counts = np.asarray(self.counts, dtype=np.int64)
        object.__setattr__(self, "counts", counts)
        if counts.ndim != 1 or counts.size == 0 or (counts < 0).any() or counts.sum() <= 0:
            raise MarginalsError(f"attribute {self.name!r}: counts must be a non-empty list of non-negative integers "
                                 f"with a positive sum, got {counts.tolist()!r}")
        if self.kind == "bins":
            if self.edges is None:
                raise MarginalsError(f"attribute {self.name!r}: kind 'bins' needs 'edges'")
            edges = np.asarray(self.edges, dtype=np.float64)
            object.__setattr__(self, "edges", edges)
            if edges.shape != (counts.size + 1,) or not np.all(np.diff(edges) > 0):
                raise MarginalsError(f"attribute {self.name!r}: edges must be {counts.size + 1} increasing numbers, "
                                     f"got {edges.size}")
        elif self.values is None or len(self.values) != counts.size:
            raise MarginalsError(f"attribute {self.name!r}: 'values' must have one entry per count "
                                 f"({counts.size}), got {None if self.values is None else len(self.values)}")

    @property
    def probabilities(self) -> np.ndarray:
        """Category (or value, or bin) probabilities: counts / total."""
        return self.counts / self.counts.sum()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "counts": self.counts.tolist()}
        if self.kind == "bins":
            assert self.edges is not None
            out["edges"] = [int(e) if self.integer else float(e) for e in self.edges]
        else:
            out["values"] = list(self.values or ())
        if self.kind != "categorical":
            out["integer"] = self.integer
        return out

    @classmethod
    def from_json(cls, name: str, spec: Mapping[str, Any]) -> AttributeMarginal:
        if not isinstance(spec, Mapping) or "kind" not in spec or "counts" not in spec:
            raise MarginalsError(f"attribute {name!r}: expected an object with 'kind' and 'counts', got {spec!r}")
        values = tuple(spec["values"]) if spec.get("values") is not None else None
        edges = np.asarray(spec["edges"], dtype=np.float64) if spec.get("edges") is not None else None
        return cls(name=name, kind=str(spec["kind"]), counts=np.asarray(spec["counts"], dtype=np.int64),
                   values=values, edges=edges, integer=bool(spec.get("integer", True)))


@dataclass(frozen=True, eq=False)
class Marginals:
    """Per-attribute marginals of a data set, plus functional dependencies ``derived -> (given, map)``."""

    n: int
    attributes: dict[str, AttributeMarginal]
    dependencies: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    source: str = ""
    schema_name: str = "adult"

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_frame(cls, df: pd.DataFrame, schema: Schema, *, max_exact_values: int = 256, n_bins: int = 100,
                   source: str = "") -> Marginals:
        """Marginals of the schema's attributes in ``df`` (one categorical/exact/binned entry each).

        A numeric attribute that is a function of a categorical one (each category maps to one value,
        e.g. ADULT's education -> education-num) is recorded as a dependency and derived when sampling.
        """
        if len(df) == 0:
            raise MarginalsError("cannot compute marginals of an empty frame")
        attrs: dict[str, AttributeMarginal] = {}
        deps: dict[str, tuple[str, dict[str, Any]]] = {}
        categorical = [a.name for a in schema.attributes if a.kind is Kind.CATEGORICAL]
        for a in schema.attributes:
            col = df[a.name]
            if a.kind is Kind.CATEGORICAL:
                vc = col.astype(str).value_counts(sort=False)
                order = [v for v in a.domain_values if v in vc.index] or sorted(vc.index)
                order += sorted(v for v in vc.index if v not in set(order))
                attrs[a.name] = AttributeMarginal(a.name, "categorical", vc.loc[order].to_numpy(np.int64),
                                                  values=tuple(str(v) for v in order))
                continue
            values = col.to_numpy()
            distinct = np.unique(values)
            if distinct.size <= max_exact_values:
                vals, counts = np.unique(values, return_counts=True)
                cast = int if a.integer else float
                attrs[a.name] = AttributeMarginal(a.name, "values", counts, values=tuple(cast(v) for v in vals),
                                                  integer=a.integer)
            else:
                qs = np.quantile(values.astype(np.float64), np.linspace(0.0, 1.0, n_bins + 1))
                edges = np.unique(np.round(qs) if a.integer else qs)
                counts = np.histogram(values, bins=edges)[0]
                attrs[a.name] = AttributeMarginal(a.name, "bins", counts, edges=edges, integer=a.integer)
            for c in categorical:  # functional dependency on a categorical attribute?
                per = df.groupby(c, sort=True)[a.name].nunique()
                if int(per.max()) == 1 and df[c].nunique() > 1:
                    first = df.groupby(c, sort=True)[a.name].first()
                    deps[a.name] = (c, {str(k): (int(v) if a.integer else float(v)) for k, v in first.items()})
                    break
        return cls(n=len(df), attributes=attrs, dependencies=deps, source=source, schema_name=schema.name)

    @classmethod
    def from_adult_file(cls, path: str | os.PathLike[str] | None = None) -> Marginals:
        """Marginals computed from the real UCI ADULT file (path, or ``$STREAM_ANON_ADULT``)."""
        df = read_adult(path)
        p = Path(path) if path is not None else Path(os.environ[ADULT_ENV])
        return cls.from_frame(df, adult_schema(), source=f"UCI ADULT {p.name} (sha256 {sha256_of(p)})")

    # ------------------------------------------------------------------ JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "format": MARGINALS_FORMAT,
            "schema": self.schema_name,
            "source": self.source,
            "n": self.n,
            "note": "marginal counts per category / distinct value / histogram bin; no records",
            "attributes": {name: m.to_json() for name, m in self.attributes.items()},
            "dependencies": {name: {"given": given, "map": mapping} for name, (given, mapping) in self.dependencies.items()},
        }

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the JSON (one line per attribute, so diffs stay readable)."""
        spec = self.to_json()
        head = {k: v for k, v in spec.items() if k not in ("attributes", "dependencies")}
        lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
        for key in ("attributes", "dependencies"):
            items = [f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in spec[key].items()]
            lines.append(f" {json.dumps(key)}: {{\n" + ",\n".join(items) + "\n }" + ("," if key == "attributes" else ""))
        lines.append("}")
        text = "\n".join(lines) + "\n"
        assert json.loads(text) == json.loads(json.dumps(spec))
        Path(path).write_text(text, encoding="utf-8")

    @classmethod
    def from_json(cls, spec: Mapping[str, Any]) -> Marginals:
        if not isinstance(spec, Mapping) or spec.get("format") != MARGINALS_FORMAT:
            got = spec.get("format") if isinstance(spec, Mapping) else type(spec).__name__
            raise MarginalsError(f"marginals: 'format' must be {MARGINALS_FORMAT!r}, got {got!r}")
        raw = spec.get("attributes")
        if not isinstance(raw, Mapping) or not raw:
            raise MarginalsError("marginals: 'attributes' must be a non-empty object")
        attrs = {str(k): AttributeMarginal.from_json(str(k), v) for k, v in raw.items()}
        deps = {str(k): (str(v["given"]), dict(v["map"])) for k, v in (spec.get("dependencies") or {}).items()}
        return cls(n=int(spec.get("n", 0)), attributes=attrs, dependencies=deps, source=str(spec.get("source", "")),
                   schema_name=str(spec.get("schema", "adult")))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Marginals:
        try:
            spec = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise MarginalsError(f"marginals file {str(path)!r}: {e}") from e
        return cls.from_json(spec)


def adult_marginals(path: str | os.PathLike[str] | None = None, *, prefer_file: bool = True) -> Marginals:
    """ADULT's marginals: from the real file when available (``path`` or ``$STREAM_ANON_ADULT``), else shipped JSON."""
    if prefer_file:
        chosen = path if path is not None else os.environ.get(ADULT_ENV)
        if chosen and Path(chosen).is_file():
            return Marginals.from_adult_file(chosen)
        if path is not None:
            raise MarginalsError(f"ADULT file {str(path)!r} does not exist")
    return Marginals.load(ADULT_MARGINALS_PATH)


def synthetic_record_id(index: int, prefix: str = SYNTHETIC_ID_PREFIX) -> str:
    """Id of the ``index``-th synthetic record: ``synth-000000`` (width grows past 999,999)."""
    return f"{prefix}-{index:06d}"


class SyntheticGenerator:
    """Unbounded iterator of synthetic records drawn from ``marginals`` (validated against ``schema``).

    ``records(n)``/``columns(n)`` draw a fixed number; iterating yields records forever, generated
    ``batch_size`` at a time (vectorized: one ``rng.choice`` per attribute per batch).
    """

    def __init__(self, marginals: Marginals | None = None, schema: Schema | None = None, *,
                 rng: np.random.Generator | int | None = None, id_prefix: str = SYNTHETIC_ID_PREFIX,
                 start_index: int = 0, batch_size: int = 8192) -> None:
        self.schema = schema if schema is not None else adult_schema()
        self.marginals = marginals if marginals is not None else adult_marginals()
        # test data, not privacy noise: numpy's default generator (reproducible with a seed, fast)
        self.rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        batch_size = require_int("batch_size", batch_size, low=1, error=raising(MarginalsError))
        start_index = require_int("start_index", start_index, low=0, error=raising(MarginalsError))
        self.id_prefix = id_prefix
        self.batch_size = batch_size
        self.next_index = start_index
        self.id_field = self.schema.record_id or "id"
        self._buffer: list[dict[str, Any]] = []
        self._check_against_schema()

    def _check_against_schema(self) -> None:
        for a in self.schema.attributes:
            if a.name not in self.marginals.attributes and a.name not in self.marginals.dependencies:
                raise MarginalsError(f"marginals have no entry for schema attribute {a.name!r}; "
                                     f"known: {sorted(self.marginals.attributes)}")
            m = self.marginals.attributes.get(a.name)
            if m is None:
                continue
            if a.kind is Kind.CATEGORICAL:
                allowed = set(a.domain_values)
                bad = [v for v in (m.values or ()) if allowed and v not in allowed]
                if bad:
                    raise MarginalsError(f"attribute {a.name!r}: categories {bad} are not in the schema domain "
                                         f"({a.describe_domain()})")
            else:
                lo = m.edges[0] if m.kind == "bins" else min(m.values or (0,))  # type: ignore[index]
                hi = m.edges[-1] if m.kind == "bins" else max(m.values or (0,))  # type: ignore[index]
                if (a.lo is not None and lo < a.lo) or (a.hi is not None and hi > a.hi):
                    raise MarginalsError(f"attribute {a.name!r}: marginal range [{lo}, {hi}] leaves the schema "
                                         f"domain [{a.lo}, {a.hi}]")

    def columns(self, n: int) -> dict[str, np.ndarray]:
        """``n`` fresh records as columns (numpy arrays; ids an object array), drawn in one vectorized batch.

        Bypasses the record buffer of ``records``/iteration (do not mix the two on one generator if the
        exact sequence matters).
        """
        if n < 0:
            raise MarginalsError(f"n: expected an integer >= 0, got {n!r}")
        out: dict[str, np.ndarray] = {}
        start = self.next_index
        out[self.id_field] = np.array([synthetic_record_id(i, self.id_prefix) for i in range(start, start + n)],
                                      dtype=object)
        self.next_index += n
        for a in self.schema.attributes:
            m = self.marginals.attributes.get(a.name)
            if a.name in self.marginals.dependencies or m is None:
                continue
            idx = self.rng.choice(m.counts.size, size=n, p=m.probabilities)
            if m.kind == "bins":
                assert m.edges is not None
                lo, hi = m.edges[idx], m.edges[idx + 1]
                if m.integer:
                    last = idx == m.counts.size - 1  # last bin is closed: [lo, hi]
                    out[a.name] = self.rng.integers(lo.astype(np.int64), hi.astype(np.int64) + last)
                else:
                    out[a.name] = lo + (hi - lo) * self.rng.random(n)
            else:
                values = np.asarray(m.values, dtype=object if m.kind == "categorical" else None)
                out[a.name] = values[idx]
        for name, (given, mapping) in self.marginals.dependencies.items():
            out[name] = np.array([mapping[v] for v in out[given]])
        return {k: out[k] for k in [self.id_field, *self.schema.names]}

    def _batch(self) -> list[dict[str, Any]]:
        cols = self.columns(self.batch_size)
        names = list(cols)
        lists = [cols[k].tolist() for k in names]
        return [dict(zip(names, row, strict=True)) for row in zip(*lists, strict=True)]

    def records(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` records as JSON-ready dicts (native ints/floats/strings), schema order, id first.

        Drawn in fixed batches of ``batch_size`` (buffered), so the stream depends only on the seed and
        ``batch_size``: ``records(100) + records(200) == records(300)``.
        """
        if n < 0:
            raise MarginalsError(f"n: expected an integer >= 0, got {n!r}")
        out = self._buffer[:n]
        del self._buffer[:n]
        while len(out) < n:
            batch = self._batch()
            take = n - len(out)
            out.extend(batch[:take])
            self._buffer = batch[take:]
        return out

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            if not self._buffer:
                self._buffer = self._batch()
            buf, self._buffer = self._buffer, []
            yield from buf


def synthetic_adult_records(n: int | None = None, *, rng: np.random.Generator | int | None = None,
                            marginals: Marginals | None = None, adult_path: str | os.PathLike[str] | None = None,
                            start_index: int = 0) -> Iterator[dict[str, Any]]:
    """Synthetic ADULT records (ids ``synth-000000``...): ``n`` of them, or unbounded for ``n=None``.

    Marginals: ``marginals`` if given, else computed from the real file when available, else the shipped JSON.
    """
    gen = SyntheticGenerator(marginals if marginals is not None else adult_marginals(adult_path), rng=rng,
                             start_index=start_index)
    if n is None:
        yield from gen
        return
    left = n
    while left > 0:
        take = min(left, gen.batch_size)
        yield from gen.records(take)
        left -= take
