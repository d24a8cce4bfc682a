"""Side-path options and their validation against the schema: the one place their rules are checked.

:class:`SidePathConfig` is the ``side_paths`` section of the service's config; :func:`plan_side_paths` checks it
against a schema and decides which mechanism runs on which attribute with which eps (:class:`SidePlan`).  Both the
service (at config load, before anything starts) and :class:`~stream_anon.side.processor.SidePathProcessor` use it;
a bad option raises :class:`SidePathConfigError` (or the mechanism's ``PrivacyParameterError``) naming the option,
the allowed values and the value.

Epsilons: each attribute of a per-record topic spends the exact eps of its mechanism (``epsilon`` per attribute, or
``record_epsilon`` split equally); one record's eps on a topic is their sum, and over all side topics the sum over
topics (sequential composition, Dwork & Roth Thm 3.16).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from stream_anon.core.schema import Kind, Schema, adult_schema
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import LExtendedSubstitution, RandomSubstitution, gamma_for_epsilon


class SidePathConfigError(ValueError):
    """A side-path option is invalid (the message names the option, the allowed values and the value)."""


# ============================================================================================ options
@dataclass(frozen=True)
class KRRConfig:
    """k-RR copies on ``adult.krr``: ``epsilon`` per attribute, or ``record_epsilon`` split equally."""

    enabled: bool = True
    attributes: list[str] = field(
        default_factory=lambda: ["sex", "race", "marital-status", "relationship", "workclass"])
    epsilon: float = 1.0
    record_epsilon: float | None = None  # set: every attribute gets record_epsilon / len(attributes)


@dataclass(frozen=True)
class RSConfig:
    """Random substitution copies on ``adult.rs``.

    ``epsilon`` is the exact eps per attribute (gamma derived: ``e^eps`` for l = 1, ``e^(eps/l)`` for
    independent l-extended, bisection on the exact eps for ``no-repeat``); ``gamma`` overrides it and the
    honest eps of that gamma is then reported.  ``l`` > 1: l-extended substitution, ``variant``
    ``independent`` | ``no-repeat``.
    """

    enabled: bool = True
    attributes: list[str] = field(default_factory=lambda: ["education", "occupation"])
    epsilon: float = 1.0
    gamma: float | None = None
    l: int = 1  # noqa: E741
    variant: str = "independent"
    record_epsilon: float | None = None


@dataclass(frozen=True)
class BLapConfig:
    """Bounded Laplace copies on ``adult.blap``: numeric ``attributes`` (schema public bounds) and
    ``categorical_attributes`` through the discretized bounded Laplace (categories in schema order)."""

    enabled: bool = True
    attributes: list[str] = field(default_factory=lambda: ["age", "hours-per-week", "education-num"])
    categorical_attributes: list[str] = field(default_factory=lambda: ["income"])
    epsilon: float = 1.0
    record_epsilon: float | None = None
    snap_bits: int | None = None  # round outputs to 2^-snap_bits on [-1, 1] (Mironov 2012 mitigation)
    boundary_width: float = 0.1  # of the boundary-corrected mean estimator (normalized units)


@dataclass(frozen=True)
class KMeansConfig:
    """Windowed DP k-means on ``adult.kmeans``: ``epsilon`` per tumbling window of ``window`` records.

    ``total_epsilon``: optional stream budget charged ``epsilon`` per window (use it when individuals recur
    across windows); None = each record is in exactly one window (parallel composition).
    """

    enabled: bool = True
    attributes: list[str] = field(default_factory=lambda: ["age", "hours-per-week"])
    n_clusters: int = 3
    epsilon: float = 1.0
    gamma: float = 0.5
    window: int = 5000
    variant: str = "uniquad"
    total_epsilon: float | None = None
    min_partial_window: int = 500  # at an end-of-stream flush, a partial window this large is released


@dataclass(frozen=True)
class SidePathConfig:
    """All side-path settings: the ``side_paths`` section of the service config."""

    enabled: bool = True
    group_id: str | None = None  # None: "<kafka.group_id>-ldp"
    krr: KRRConfig = field(default_factory=KRRConfig)
    rs: RSConfig = field(default_factory=RSConfig)
    blap: BLapConfig = field(default_factory=BLapConfig)
    kmeans: KMeansConfig = field(default_factory=KMeansConfig)
    estimates_every: int = 5000  # records between two rounds of estimates (0 = only at flush/timer)
    estimates_every_seconds: float | None = 60.0  # also publish after this long with new records
    total_epsilon: float | None = None  # cap on one record's eps summed over all side topics (None = no cap)
    truth: bool = False  # exact statistics beside the estimates (NOT private: demo/testing only)
    dead_letter: bool = False  # also dead-letter bad input (off: the main path already does; count + skip)
    seed: int | None = None  # None = OS entropy

    def check(self, schema: Schema | None = None) -> SidePlan:
        """Validate against ``schema`` (default ADULT): the plan, or :class:`SidePathConfigError` (or the
        mechanisms' ``PrivacyParameterError``) naming the option, the allowed values and the value."""
        return plan_side_paths(self, schema if schema is not None else adult_schema(), np.random.default_rng(0))

    @classmethod
    def coerce(cls, obj: SidePathConfig | Mapping[str, Any] | None) -> SidePathConfig:
        """A ``SidePathConfig`` from itself, a mapping of its options (nested sections as mappings), or None."""
        if isinstance(obj, SidePathConfig):
            return obj
        if obj is None:
            return cls()
        if not isinstance(obj, Mapping):
            raise SidePathConfigError(f"side_paths: expected a mapping or SidePathConfig, got {type(obj).__name__}")
        return _from_mapping(cls, obj, "side_paths")


def _from_mapping(cls: type[Any], data: Mapping[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    defaults = cls()
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise SidePathConfigError(f"unknown option {prefix}.{name}; {prefix} has {sorted(fields)}")
        default = getattr(defaults, name)
        if dataclasses.is_dataclass(default) and isinstance(value, Mapping):
            kwargs[name] = _from_mapping(type(default), value, f"{prefix}.{name}")
        else:
            kwargs[name] = list(value) if isinstance(value, tuple) else value
    return cls(**kwargs)


@dataclass(frozen=True)
class SideTopics:
    """Side topic names; the defaults (for input ``adult.raw``) are written here once, and the service's
    ``topics`` section takes them from here."""

    krr: str = "adult.krr"
    rs: str = "adult.rs"
    blap: str = "adult.blap"
    estimates: str = "adult.estimates"
    kmeans: str = "adult.kmeans"
    dlq: str = "adult.dlq"

    def per_record(self) -> dict[Role, str]:
        """Role of a per-record topic -> its name."""
        return {"krr": self.krr, "rs": self.rs, "blap": self.blap}


# ============================================================================================ validation
Role = Literal["krr", "rs", "blap"]
"""A per-record side topic: k-RR, random substitution, bounded Laplace."""

CategoricalMechanism = KRandomizedResponse | RandomSubstitution | LExtendedSubstitution | DiscretizedBoundedLaplace


@dataclass(frozen=True)
class CategoricalPlan:
    """One categorical attribute through one frequency-oracle mechanism on a per-record topic."""

    role: Role
    mechanism: str  # krr | rs | rs-l/<variant> | blap-cat
    attribute: str
    categories: list[str]
    mech: CategoricalMechanism
    epsilon: float  # the mechanism's exact eps
    reports_per_record: int = 1


@dataclass(frozen=True)
class NumericPlan:
    """One numeric attribute through the bounded Laplace on its public domain."""

    attribute: str
    mech: BoundedLaplace
    boundary_width: float

    @property
    def epsilon(self) -> float:
        return float(self.mech.epsilon)


@dataclass(frozen=True)
class KMeansPlan:
    """The windowed DP k-means output: attributes and their public box."""

    attributes: list[str]
    lower: np.ndarray
    upper: np.ndarray


@dataclass(frozen=True)
class SidePlan:
    """Which mechanism runs on which attribute (mechanisms built with the given generator), and the eps one record
    spends per per-record topic (``epsilon_per_role``) and over all of them (``epsilon_all``)."""

    krr: list[CategoricalPlan]
    rs: list[CategoricalPlan]
    blap_numeric: list[NumericPlan]
    blap_categorical: list[CategoricalPlan]
    kmeans: KMeansPlan | None
    epsilon_per_role: dict[Role, float]
    epsilon_all: float


def _err(option: str, allowed: str, value: Any) -> SidePathConfigError:
    return SidePathConfigError(f"option side_paths.{option}: expected {allowed}, got {value!r}")


def _positive(option: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < float(value) < math.inf):
        raise _err(option, "a number in (0, inf)", value)
    return float(value)


def _split(option: str, per_attribute: float, record_epsilon: float | None, n: int) -> float:
    """eps per attribute: ``record_epsilon / n`` when a per-record budget is split, else ``per_attribute``."""
    if record_epsilon is None:
        return _positive(f"{option}.epsilon", per_attribute)
    return _positive(f"{option}.record_epsilon", record_epsilon) / max(n, 1)


def _categories(schema: Schema, option: str, name: str) -> list[str]:
    if name not in schema:
        raise _err(option, f"attributes of schema {schema.name!r} ({schema.names})", name)
    a = schema[name]
    if a.kind is not Kind.CATEGORICAL or len(a.domain_values) < 2:
        raise _err(option, "categorical attributes with a declared domain of at least 2 values", name)
    return [str(c) for c in a.domain_values]


def _public_bounds(schema: Schema, option: str, name: str) -> tuple[float, float]:
    attr = schema[name] if name in schema else None
    if attr is None or attr.kind is not Kind.NUMERIC or attr.lo is None or attr.hi is None:
        raise _err(option, "numeric attributes with a public domain [lo, hi] in the schema", name)
    return float(attr.lo), float(attr.hi)


def plan_side_paths(config: SidePathConfig, schema: Schema, rng: np.random.Generator) -> SidePlan:
    """Check every side-path option against ``schema`` and build the mechanisms (drawing from ``rng``)."""
    krr = _plan_krr(config.krr, schema, rng)
    rs = _plan_rs(config.rs, schema, rng)
    blap_num, blap_cat = _plan_blap(config.blap, schema, rng)
    per_role: dict[Role, float] = {}
    roles: tuple[tuple[Role, list[float]], ...] = (
        ("krr", [p.epsilon for p in krr]), ("rs", [p.epsilon for p in rs]),
        ("blap", [p.epsilon for p in blap_num] + [p.epsilon for p in blap_cat]))
    for role, epsilons in roles:
        if epsilons:
            per_role[role] = math.fsum(epsilons)
    eps_all = math.fsum(per_role.values())
    if config.total_epsilon is not None and \
            eps_all > _positive("total_epsilon", config.total_epsilon) * (1 + 1e-9):
        detail = ", ".join(f"{role}: {e:g}" for role, e in per_role.items())
        raise _err("total_epsilon", f"at least the eps one record spends over all side topics ({eps_all:g} = {detail})",
                   config.total_epsilon)
    return SidePlan(krr, rs, blap_num, blap_cat, _plan_kmeans(config.kmeans, schema, rng), per_role, eps_all)


def _plan_krr(k: KRRConfig, schema: Schema, rng: np.random.Generator) -> list[CategoricalPlan]:
    if not (k.enabled and k.attributes):
        return []
    eps = _split("krr", k.epsilon, k.record_epsilon, len(k.attributes))
    out = []
    for a in k.attributes:
        cats = _categories(schema, "krr.attributes", a)
        m = KRandomizedResponse(epsilon=eps, categories=cats, rng=rng)
        out.append(CategoricalPlan("krr", "krr", a, cats, m, float(m.epsilon)))
    return out


def _plan_rs(r: RSConfig, schema: Schema, rng: np.random.Generator) -> list[CategoricalPlan]:
    if not (r.enabled and r.attributes):
        return []
    if r.variant not in ("independent", "no-repeat"):
        raise _err("rs.variant", "'independent' or 'no-repeat'", r.variant)
    if isinstance(r.l, bool) or not isinstance(r.l, int) or r.l < 1:
        raise _err("rs.l", "an integer >= 1", r.l)
    eps_target = _split("rs", r.epsilon, r.record_epsilon, len(r.attributes))
    name = "rs" if r.l == 1 else f"rs-l/{r.variant}"
    out = []
    for a in r.attributes:
        cats = _categories(schema, "rs.attributes", a)
        gamma = float(r.gamma) if r.gamma is not None else \
            gamma_for_epsilon(len(cats), eps_target, r.l, r.variant)  # type: ignore[arg-type]
        mech: RandomSubstitution | LExtendedSubstitution
        if r.l == 1:
            mech = RandomSubstitution(categories=cats, gamma=gamma, rng=rng)
        else:
            mech = LExtendedSubstitution(categories=cats, gamma=gamma, l=r.l, variant=r.variant,  # type: ignore[arg-type]
                                         rng=rng)
        out.append(CategoricalPlan("rs", name, a, cats, mech, float(mech.epsilon), reports_per_record=r.l))
    return out


def _plan_blap(b: BLapConfig, schema: Schema,
               rng: np.random.Generator) -> tuple[list[NumericPlan], list[CategoricalPlan]]:
    if not (b.enabled and (b.attributes or b.categorical_attributes)):
        return [], []
    eps = _split("blap", b.epsilon, b.record_epsilon, len(b.attributes) + len(b.categorical_attributes))
    numeric = []
    for a in b.attributes:
        lo, hi = _public_bounds(schema, "blap.attributes", a)
        numeric.append(NumericPlan(a, BoundedLaplace(epsilon=eps, lower=lo, upper=hi, snap_bits=b.snap_bits, rng=rng),
                                   b.boundary_width))
    categorical = []
    for a in b.categorical_attributes:
        cats = _categories(schema, "blap.categorical_attributes", a)
        mc = DiscretizedBoundedLaplace(epsilon=eps, categories=cats, rng=rng)
        categorical.append(CategoricalPlan("blap", "blap-cat", a, cats, mc, float(mc.epsilon)))
    return numeric, categorical


def _plan_kmeans(k: KMeansConfig, schema: Schema, rng: np.random.Generator) -> KMeansPlan | None:
    if not k.enabled:
        return None
    if len(k.attributes) < 1:
        raise _err("kmeans.attributes", "at least one numeric attribute", k.attributes)
    bounds = [_public_bounds(schema, "kmeans.attributes", a) for a in k.attributes]
    if isinstance(k.window, bool) or not isinstance(k.window, int) or k.window < max(2, k.n_clusters):
        raise _err("kmeans.window", f"an integer >= max(2, n_clusters={k.n_clusters})", k.window)
    if k.variant not in ("quad", "uniquad"):
        raise _err("kmeans.variant", "'quad' or 'uniquad'", k.variant)
    if k.total_epsilon is not None:
        _positive("kmeans.total_epsilon", k.total_epsilon)
    lower = np.array([lo for lo, _ in bounds], dtype=np.float64)
    upper = np.array([hi for _, hi in bounds], dtype=np.float64)
    # the mechanism validates n_clusters, gamma and the box
    QuadTreeKMeans(n_clusters=k.n_clusters, epsilon=_positive("kmeans.epsilon", k.epsilon), bounds=(lower, upper),
                   gamma=k.gamma, variant=k.variant, rng=rng)  # type: ignore[arg-type]
    return KMeansPlan(list(k.attributes), lower, upper)
