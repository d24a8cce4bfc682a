"""Side-path options and their validation against the schema: the one place their rules are checked.

:class:`SidePathConfig` is the ``side_paths`` section of the service's config; :func:`plan_side_paths` checks it
against a schema and decides which mechanism runs on which attribute with which eps (:class:`SidePlan`).  Both the
service (at config load, before anything starts) and :class:`~stream_anon.side.processor.SidePathProcessor` use it;
a bad option raises :class:`SidePathConfigError` (or the mechanism's ``PrivacyParameterError``) naming the option,
the allowed values and the value.

Epsilons are COMPUTED, never assumed: every attribute states the exact eps of its mechanism as configured
(the mechanism's ``exact_epsilon``, :mod:`stream_anon.privacy.mechanism`: from its own output distribution in the
arithmetic it runs in, rounded up), one record's eps on a topic is their sum, the k-means output adds the exact eps
of the one window the record is in (replace-one windows of a fixed record count), and the record's total over all
side outputs is the sum of those (sequential composition, Dwork & Roth Thm 3.16).  Sums are exact sums of the
doubles rounded up (:func:`upper_sum`).  Caps (``<topic>.record_epsilon``, ``total_epsilon``,
``person_budget.cap_epsilon``, ``kmeans.total_epsilon``) are compared with the relative tolerance
:data:`~stream_anon.privacy.budget.RELATIVE_TOLERANCE` (k-RR and random substitution at a target of 1 state
1.0000000000009: the float sampler's exact eps, rounded up).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import numpy as np

from stream_anon.core.schema import Kind, Schema, adult_schema
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.budget import RELATIVE_TOLERANCE
from stream_anon.privacy.discrete_laplace import fraction_upper
from stream_anon.privacy.display import format_epsilon
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans
from stream_anon.privacy.mechanism import PrivacyMechanism
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import LExtendedSubstitution, RandomSubstitution, gamma_for_epsilon

OUT_OF_DOMAIN_MODES = ("clip", "skip")
"""``side_paths.out_of_domain``: clip an out-of-domain numeric value into the schema's public domain, or skip the
record (the main path dead-letters it either way)."""

DEFAULT_RECORD_EPSILON: dict[str, float] = {"krr": 1.4, "rs": 1.0, "blap": 1.1}
"""A topic's eps per record, split equally over its attributes, when neither ``epsilon`` nor ``record_epsilon`` (nor,
for random substitution, ``gamma``) is set.  With the k-means window's 0.4 the default record spends 3.9 (stated
3.9000000000050...) over all side outputs, under the default lifetime cap of 4 (docs/side-paths.md)."""
DEFAULT_LIFETIME_CAP = 4.0
"""``person_budget.cap_epsilon`` by default: what one record (or person) may spend over all side outputs, all passes
and all consumer groups together: a lifetime cap, counted in the persisted sketch."""
DEFAULT_MIXING_RECORDS = 1000
"""``mixing.records``: a window of side copies is released once it holds this many records (or is
``mixing.seconds`` old)."""
DEFAULT_MIXING_SECONDS = 30.0
"""``mixing.seconds``: a window of side copies is released at the latest this long after its first record."""


class SidePathConfigError(ValueError):
    """A side-path option is invalid (the message names the option, the allowed values and the value)."""


# ============================================================================================ options
@dataclass(frozen=True)
class KRRConfig:
    """k-RR copies on ``adult.krr``: ``epsilon`` per attribute, or ``record_epsilon`` split equally (at most one of
    them; neither: ``record_epsilon`` = :data:`DEFAULT_RECORD_EPSILON` ``["krr"]``).  ``attributes`` None: the
    schema's attributes that declare ``side_paths: [krr]``."""

    enabled: bool = True
    attributes: list[str] | None = None  # None: from the schema (attributes declaring side_paths: [krr])
    epsilon: float | None = None
    record_epsilon: float | None = None  # set: every attribute targets record_epsilon / len(attributes)


@dataclass(frozen=True)
class RSConfig:
    """Random substitution copies on ``adult.rs``.

    Give at most one of ``epsilon`` (the target eps per attribute; gamma derived: ``e^eps`` for l = 1,
    ``e^(eps/l)`` for independent l-extended, bisection on the exact eps for ``no-repeat``), ``record_epsilon``
    (split equally over the attributes) or ``gamma`` (the matrix parameter itself; its exact eps is what is
    stated and counted against the caps).  None of them: ``record_epsilon`` = :data:`DEFAULT_RECORD_EPSILON`
    ``["rs"]``.  ``l`` > 1: l-extended substitution, ``variant`` ``independent`` | ``no-repeat``.
    """

    enabled: bool = True
    attributes: list[str] | None = None  # None: from the schema (attributes declaring side_paths: [rs])
    epsilon: float | None = None
    gamma: float | None = None
    l: int = 1  # noqa: E741
    variant: str = "independent"
    record_epsilon: float | None = None


@dataclass(frozen=True)
class BLapConfig:
    """Bounded Laplace copies on ``adult.blap``: numeric ``attributes`` on the schema's public domain (an exact
    grid: the integer grid for integer attributes) and ``categorical_attributes`` through the discretized bounded
    Laplace (categories in schema order); ``epsilon`` per attribute or ``record_epsilon`` split equally (at most one
    of them; neither: ``record_epsilon`` = :data:`DEFAULT_RECORD_EPSILON` ``["blap"]``)."""

    enabled: bool = True
    attributes: list[str] | None = None  # None: the schema's numeric attributes declaring side_paths: [blap]
    categorical_attributes: list[str] | None = None  # None: the schema's categorical ones declaring it
    epsilon: float | None = None
    record_epsilon: float | None = None
    boundary_width: float = 0.1  # of the boundary-corrected mean estimator (normalized units)


@dataclass(frozen=True)
class KMeansConfig:
    """Windowed DP k-means on ``adult.kmeans``: target ``epsilon`` per tumbling window of ``window`` records
    (replace-one neighbours: the window size is public); each release states the window's exact eps.

    ``total_epsilon``: optional stream budget charged each window's exact eps (use it when individuals recur
    across windows); persisted, so a restart does not reset it.  None = each record is in exactly one window
    (parallel composition).
    """

    enabled: bool = True
    attributes: list[str] | None = None  # None: the schema's attributes declaring side_paths: [kmeans]
    n_clusters: int = 3
    epsilon: float = 0.4
    gamma: float = 0.5
    window: int = 5000
    variant: str = "uniquad"
    total_epsilon: float | None = None
    min_partial_window: int = 500  # at an end-of-stream flush, a partial window this large is released


@dataclass(frozen=True)
class PersonBudgetConfig:
    """The lifetime eps cap of each person (the schema's ``person_id``) or, without a person id, of each record (its
    ``record_id``): a keyed count-min sketch (:class:`~stream_anon.privacy.person_budget.PersonBudgetSketch`,
    ``depth`` x ``width`` counters, 8 bytes each) charged one record's total eps each time the record is perturbed,
    over all passes and consumer groups; a record whose person (or id) would exceed ``cap_epsilon`` gets no side
    output at all.  Persisted with the other budgets, keyed by the input topic.  ``cap_epsilon: null`` turns the
    cap off (every pass over the same records then spends again; a WARNING at start)."""

    cap_epsilon: float | None = DEFAULT_LIFETIME_CAP
    width: int = 1 << 17
    depth: int = 8  # 8 x 2^17 x 8 bytes = 8 MiB; all of ADULT: 0.022 false refusals expected (docs/side-paths.md)


@dataclass(frozen=True)
class MixingConfig:
    """Side copies leave in windows: the copies of one input partition's records are held until the window holds
    ``records`` records or its first record is ``seconds`` old, then each topic's copies of the window are sent in
    an independent uniformly random order, all with the window's release time as their Kafka timestamp
    (:mod:`stream_anon.side.mixing`)."""

    records: int = DEFAULT_MIXING_RECORDS
    seconds: float = DEFAULT_MIXING_SECONDS


@dataclass(frozen=True)
class SidePathConfig:
    """All side-path settings: the ``side_paths`` section of the service config."""

    enabled: bool = True
    group_id: str | None = None  # None: "<kafka.group_id>-ldp"
    krr: KRRConfig = field(default_factory=KRRConfig)
    rs: RSConfig = field(default_factory=RSConfig)
    blap: BLapConfig = field(default_factory=BLapConfig)
    kmeans: KMeansConfig = field(default_factory=KMeansConfig)
    person_budget: PersonBudgetConfig = field(default_factory=PersonBudgetConfig)
    mixing: MixingConfig = field(default_factory=MixingConfig)
    estimates_every: int = 5000  # records between two rounds of estimates (0 = only at flush/timer)
    estimates_every_seconds: float | None = 60.0  # also publish after this long with new records
    total_epsilon: float | None = None  # cap on one record's eps summed over all side outputs (None = no cap)
    pseudonyms: bool = True  # copies keyed by HMAC(release.secret, record id); false: no key, no id, shuffled
    out_of_domain: str = "clip"  # clip | skip: numeric values outside the schema's public domain
    budget_topic: str | None = None  # internal compacted topic of the cumulative budgets; None: "<input>.side-budget"
    truth: bool = False  # exact statistics beside the estimates (NOT private: demo/testing only)
    dead_letter: bool = False  # also dead-letter bad input (off: the main path already does; count + skip)
    seed: int | None = None  # noise seed: refused unless allow_seeded_noise (tests and benchmarks only)
    allow_seeded_noise: bool = False  # true: accept `seed` (reproducible noise; logged as a WARNING at start)

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


def with_schema_attributes(config: SidePathConfig, schema: Schema) -> SidePathConfig:
    """``config`` with every attribute list left unset (None) taken from the schema's ``side_paths``
    declarations (:meth:`~stream_anon.core.schema.Schema.side_path_attributes`); lists given are kept."""
    def given(value: list[str] | None, path: str, kind: Kind | None = None) -> list[str]:
        return list(value) if value is not None else schema.side_path_attributes(path, kind)

    k, r, b, m = config.krr, config.rs, config.blap, config.kmeans
    return dataclasses.replace(
        config, krr=dataclasses.replace(k, attributes=given(k.attributes, "krr")),
        rs=dataclasses.replace(r, attributes=given(r.attributes, "rs")),
        blap=dataclasses.replace(b, attributes=given(b.attributes, "blap", Kind.NUMERIC),
                                 categorical_attributes=given(b.categorical_attributes, "blap", Kind.CATEGORICAL)),
        kmeans=dataclasses.replace(m, attributes=given(m.attributes, "kmeans", Kind.NUMERIC)))


def budget_topic(config: SidePathConfig, input_topic: str) -> str:
    """The internal compacted topic of the side paths' cumulative budgets: ``side_paths.budget_topic``, else
    ``<input>.side-budget``."""
    return config.budget_topic or f"{input_topic}.side-budget"


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
    epsilon: float  # the mechanism's exact eps (its exact_epsilon, rounded up)
    reports_per_record: int = 1


@dataclass(frozen=True)
class NumericPlan:
    """One numeric attribute through the bounded Laplace on its public domain (exact grid)."""

    attribute: str
    mech: BoundedLaplace
    boundary_width: float
    epsilon: float  # exact (the mechanism's exact_epsilon)


@dataclass(frozen=True)
class KMeansPlan:
    """The windowed DP k-means output: attributes, their public box and the exact eps of one window (replace-one,
    as :class:`~stream_anon.privacy.dp_kmeans.QuadTreeKMeans` computes it from the noise it samples)."""

    attributes: list[str]
    lower: np.ndarray
    upper: np.ndarray
    epsilon: float  # one window, exact (tree + leaf counts, rounded up)
    epsilon_tree: float
    epsilon_counts: float


@dataclass(frozen=True)
class SidePlan:
    """Which mechanism runs on which attribute (mechanisms built with the given generator) and the exact eps one
    record spends: per per-record topic (``epsilon_per_role``), through the k-means window it is in
    (``epsilon_kmeans``, 0 without k-means) and over all side outputs (``epsilon_all``)."""

    krr: list[CategoricalPlan]
    rs: list[CategoricalPlan]
    blap_numeric: list[NumericPlan]
    blap_categorical: list[CategoricalPlan]
    kmeans: KMeansPlan | None
    epsilon_per_role: dict[Role, float]
    epsilon_all: float

    @property
    def epsilon_kmeans(self) -> float:
        return self.kmeans.epsilon if self.kmeans is not None else 0.0

    @property
    def publishes(self) -> bool:
        """Whether any side path has an attribute to publish (False: nothing would run)."""
        return bool(self.krr or self.rs or self.blap_numeric or self.blap_categorical or self.kmeans)


def upper_sum(values: Iterable[float]) -> float:
    """The exact sum of the doubles ``values`` rounded UP to a double (so a stated total is never below the sum
    of its parts)."""
    return fraction_upper(sum((Fraction(v) for v in values), Fraction(0)))


def exceeds(value: float, cap: float) -> bool:
    """``value > cap`` beyond the relative tolerance every budget uses (:data:`RELATIVE_TOLERANCE`)."""
    return value > cap * (1.0 + RELATIVE_TOLERANCE)


def _err(option: str, allowed: str, value: Any) -> SidePathConfigError:
    return SidePathConfigError(f"option side_paths.{option}: expected {allowed}, got {value!r}")


def _positive(option: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < float(value) < math.inf):
        raise _err(option, "a number in (0, inf)", value)
    return float(value)


def _split(option: str, per_attribute: float | None, record_epsilon: float | None, n: int) -> float:
    """Target eps per attribute of topic ``option``: ``epsilon``, or ``record_epsilon / n``; both given is refused
    naming both (they would disagree about what a record spends); neither: the topic's
    :data:`DEFAULT_RECORD_EPSILON` split over the ``n`` attributes."""
    if per_attribute is not None and record_epsilon is not None:
        raise SidePathConfigError(
            f"options side_paths.{option}.epsilon ({per_attribute!r}) and side_paths.{option}.record_epsilon "
            f"({record_epsilon!r}) are both set: give one of them (epsilon per attribute, or record_epsilon split "
            f"equally over the {n} attribute(s))")
    if per_attribute is not None:
        return _positive(f"{option}.epsilon", per_attribute)
    if record_epsilon is not None:
        return _positive(f"{option}.record_epsilon", record_epsilon) / max(n, 1)
    return DEFAULT_RECORD_EPSILON[option] / max(n, 1)


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


def _fmt(eps: float, cap: Any = None) -> str:
    """eps at 4 decimals (the exact double stays in the outputs); beside a cap, enough decimals to differ."""
    return format_epsilon(eps, beside=float(cap) if isinstance(cap, int | float) and not isinstance(cap, bool)
                          else None)


def plan_side_paths(config: SidePathConfig, schema: Schema, rng: np.random.Generator) -> SidePlan:
    """Check every side-path option against ``schema``, build the mechanisms (drawing from ``rng``), compute the
    exact eps of each and refuse a configuration whose sums exceed a cap (the error names the option and the exact
    values).  Attribute lists left unset come from the schema (:func:`with_schema_attributes`); a path without
    attributes is off (k-means given an explicit empty list is an error)."""
    kmeans_listed = config.kmeans.attributes is not None
    config = with_schema_attributes(config, schema)
    _check_general(config, schema)
    krr = _plan_krr(config.krr, schema, rng)
    rs = _plan_rs(config.rs, schema, rng)
    blap_num, blap_cat = _plan_blap(config.blap, schema, rng)
    per_role: dict[Role, float] = {}
    roles: tuple[tuple[Role, list[float], float | None], ...] = (
        ("krr", [p.epsilon for p in krr], config.krr.record_epsilon),
        ("rs", [p.epsilon for p in rs], config.rs.record_epsilon),
        ("blap", [p.epsilon for p in blap_num] + [p.epsilon for p in blap_cat], config.blap.record_epsilon))
    for role, epsilons, cap in roles:
        if not epsilons:
            continue
        per_role[role] = total = upper_sum(epsilons)
        if cap is not None and exceeds(total, cap):
            raise _err(f"{role}.record_epsilon", f"at least the exact eps one record spends on the topic ("
                       f"{_fmt(total, cap)} = " + " + ".join(_fmt(e) for e in epsilons) + ")", cap)
    kmeans = _plan_kmeans(config.kmeans, schema, rng) if kmeans_listed or config.kmeans.attributes else None
    parts = [*per_role.values(), *([kmeans.epsilon] if kmeans is not None else [])]
    eps_all = upper_sum(parts) if parts else 0.0
    if config.total_epsilon is not None:
        cap = _positive("total_epsilon", config.total_epsilon)
        if exceeds(eps_all, cap):
            detail = ", ".join([f"{role}: {_fmt(e)}" for role, e in per_role.items()]
                               + ([f"kmeans (one window): {_fmt(kmeans.epsilon)}"] if kmeans is not None else []))
            raise _err("total_epsilon", f"at least the exact eps one record spends over all side outputs "
                       f"({_fmt(eps_all, cap)} = {detail})", config.total_epsilon)
    pb = config.person_budget
    if pb.cap_epsilon is not None:
        cap = _positive("person_budget.cap_epsilon", pb.cap_epsilon)
        if schema.person_id is None and schema.record_id is None:
            raise _err("person_budget.cap_epsilon", f"null for schema {schema.name!r}, which declares neither a "
                       f"person_id nor a record_id (the lifetime cap counts what each person, else each record id, "
                       f"spent)", pb.cap_epsilon)
        if exceeds(eps_all, cap):
            raise _err("person_budget.cap_epsilon", f"at least the exact eps of one record over all side outputs "
                       f"({_fmt(eps_all, cap)})", pb.cap_epsilon)
        for name, value, lo, hi in (("width", pb.width, 16, 1 << 30), ("depth", pb.depth, 1, 16)):
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise _err(f"person_budget.{name}", f"an integer in [{lo}, {hi}]", value)
    return SidePlan(krr, rs, blap_num, blap_cat, kmeans, per_role, eps_all)


def _check_general(config: SidePathConfig, schema: Schema) -> None:
    for section in ("krr", "blap"):  # (rs checks epsilon / record_epsilon / gamma in _plan_rs, also when disabled)
        sec = getattr(config, section)
        if sec.epsilon is not None and sec.record_epsilon is not None:
            _split(section, sec.epsilon, sec.record_epsilon, len(sec.attributes or ()))  # raises, naming both
    m = config.mixing
    if isinstance(m.records, bool) or not isinstance(m.records, int) or m.records < 1:
        raise _err("mixing.records", "an integer >= 1 (records per window of side copies)", m.records)
    if isinstance(m.seconds, bool) or not isinstance(m.seconds, int | float) or not 0 < m.seconds <= 86_400:
        raise _err("mixing.seconds", "a number of seconds in (0, 86400]", m.seconds)
    if config.out_of_domain not in OUT_OF_DOMAIN_MODES:
        raise _err("out_of_domain", " or ".join(repr(m) for m in OUT_OF_DOMAIN_MODES), config.out_of_domain)
    for name in ("pseudonyms", "allow_seeded_noise", "truth", "dead_letter"):
        if not isinstance(getattr(config, name), bool):
            raise _err(name, "true or false", getattr(config, name))
    if config.seed is not None:
        if isinstance(config.seed, bool) or not isinstance(config.seed, int) or config.seed < 0:
            raise _err("seed", "null or an integer >= 0", config.seed)
        if not config.allow_seeded_noise:
            raise _err("seed", "null: a noise seed makes every perturbation reproducible by whoever reads the "
                       "configuration (set side_paths.allow_seeded_noise: true for tests and benchmarks only)",
                       config.seed)
    if config.budget_topic is not None and (not isinstance(config.budget_topic, str) or not config.budget_topic):
        raise _err("budget_topic", "null or a topic name", config.budget_topic)
    if config.pseudonyms and schema.record_id is None:
        raise _err("pseudonyms", f"false for schema {schema.name!r}, which declares no record_id (a pseudonym is "
                   f"derived from the record id)", config.pseudonyms)


def _exact(mech: PrivacyMechanism) -> float:
    return float(mech.exact_epsilon)


def _names(attributes: list[str] | None) -> list[str]:
    """An attribute list after :func:`with_schema_attributes` (never None there)."""
    return list(attributes or ())


def _plan_krr(k: KRRConfig, schema: Schema, rng: np.random.Generator) -> list[CategoricalPlan]:
    attributes = _names(k.attributes)
    if not (k.enabled and attributes):
        return []
    eps = _split("krr", k.epsilon, k.record_epsilon, len(attributes))
    out = []
    for a in attributes:
        cats = _categories(schema, "krr.attributes", a)
        m = KRandomizedResponse(epsilon=eps, categories=cats, rng=rng)
        out.append(CategoricalPlan("krr", "krr", a, cats, m, _exact(m)))
    return out


def _plan_rs(r: RSConfig, schema: Schema, rng: np.random.Generator) -> list[CategoricalPlan]:
    given = [name for name, v in (("rs.epsilon", r.epsilon), ("rs.record_epsilon", r.record_epsilon),
                                  ("rs.gamma", r.gamma)) if v is not None]
    if len(given) > 1:
        raise _err(given[-1], f"null when {given[0]} is set (give one of rs.epsilon, rs.record_epsilon, rs.gamma: "
                   f"the exact eps of the resulting gamma is what is stated)", getattr(r, given[-1].split(".")[1]))
    attributes = _names(r.attributes)
    if not (r.enabled and attributes):
        return []
    if r.variant not in ("independent", "no-repeat"):
        raise _err("rs.variant", "'independent' or 'no-repeat'", r.variant)
    if isinstance(r.l, bool) or not isinstance(r.l, int) or r.l < 1:
        raise _err("rs.l", "an integer >= 1", r.l)
    gamma_fixed = None if r.gamma is None else _positive("rs.gamma", r.gamma)
    eps_target = 0.0 if gamma_fixed is not None else _split("rs", r.epsilon, r.record_epsilon, len(attributes))
    name = "rs" if r.l == 1 else f"rs-l/{r.variant}"
    out = []
    for a in attributes:
        cats = _categories(schema, "rs.attributes", a)
        gamma = gamma_fixed if gamma_fixed is not None else \
            gamma_for_epsilon(len(cats), eps_target, r.l, r.variant)  # type: ignore[arg-type]
        mech: RandomSubstitution | LExtendedSubstitution
        if r.l == 1:
            mech = RandomSubstitution(categories=cats, gamma=gamma, rng=rng)
        else:
            mech = LExtendedSubstitution(categories=cats, gamma=gamma, l=r.l, variant=r.variant,  # type: ignore[arg-type]
                                         rng=rng)
        out.append(CategoricalPlan("rs", name, a, cats, mech, _exact(mech), reports_per_record=r.l))
    return out


def _plan_blap(b: BLapConfig, schema: Schema,
               rng: np.random.Generator) -> tuple[list[NumericPlan], list[CategoricalPlan]]:
    numeric_names, categorical_names = _names(b.attributes), _names(b.categorical_attributes)
    if not (b.enabled and (numeric_names or categorical_names)):
        return [], []
    eps = _split("blap", b.epsilon, b.record_epsilon, len(numeric_names) + len(categorical_names))
    numeric = []
    for a in numeric_names:
        lo, hi = _public_bounds(schema, "blap.attributes", a)
        m = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=schema[a].integer, rng=rng)
        numeric.append(NumericPlan(a, m, b.boundary_width, _exact(m)))
    categorical = []
    for a in categorical_names:
        cats = _categories(schema, "blap.categorical_attributes", a)
        mc = DiscretizedBoundedLaplace(epsilon=eps, categories=cats, rng=rng)
        categorical.append(CategoricalPlan("blap", "blap-cat", a, cats, mc, _exact(mc)))
    return numeric, categorical


def kmeans_mechanism(k: KMeansConfig, lower: np.ndarray, upper: np.ndarray,
                     rng: np.random.Generator) -> QuadTreeKMeans:
    """The mechanism of one k-means window as the side paths configure it (replace-one neighbours)."""
    return QuadTreeKMeans(n_clusters=k.n_clusters, epsilon=k.epsilon, bounds=(lower, upper), gamma=k.gamma,
                          variant=k.variant, neighbouring="replace", rng=rng)  # type: ignore[arg-type]


def _plan_kmeans(k: KMeansConfig, schema: Schema, rng: np.random.Generator) -> KMeansPlan | None:
    if not k.enabled:
        return None
    attributes = _names(k.attributes)
    if len(attributes) < 1:
        raise _err("kmeans.attributes", "at least one numeric attribute", k.attributes)
    bounds = [_public_bounds(schema, "kmeans.attributes", a) for a in attributes]
    if isinstance(k.window, bool) or not isinstance(k.window, int) or k.window < max(2, k.n_clusters):
        raise _err("kmeans.window", f"an integer >= max(2, n_clusters={k.n_clusters})", k.window)
    if k.variant not in ("quad", "uniquad"):
        raise _err("kmeans.variant", "'quad' or 'uniquad'", k.variant)
    _positive("kmeans.epsilon", k.epsilon)
    lower = np.array([lo for lo, _ in bounds], dtype=np.float64)
    upper = np.array([hi for _, hi in bounds], dtype=np.float64)
    km = kmeans_mechanism(k, lower, upper, rng)  # validates n_clusters, gamma and the box
    window_eps = _exact(km)
    if k.total_epsilon is not None and exceeds(window_eps, _positive("kmeans.total_epsilon", k.total_epsilon)):
        raise _err("kmeans.total_epsilon", f"at least the exact eps of one window ({_fmt(window_eps, k.total_epsilon)})",
                   k.total_epsilon)
    return KMeansPlan(attributes, lower, upper, window_eps, float(km.epsilon_tree), float(km.epsilon_counts))
