"""The service's single configuration object: YAML file, then ``STREAM_ANON_*`` environment, then flags.

:class:`Config` is frozen and validated once, when it is loaded (:meth:`Config.load`), against everything it
names: the engine's parameters through :class:`~stream_anon.core.engine.EngineConfig` (the one validator of the
engine's rules), the schema file and the QI/sensitive roles, and the side-path options against the schema
(:func:`~stream_anon.config.side_paths.plan_side_paths`, when the side paths are on).  A derived config is a new one:
:meth:`Config.with_options` (validated again) or ``dataclasses.replace``.

Precedence (highest first): command-line flag > environment variable > YAML file > built-in default.

Every option lives in a section; its environment variable is ``STREAM_ANON_<SECTION>_<FIELD>`` (upper
case, ``-`` and ``.`` become ``_``), e.g. ``STREAM_ANON_KAFKA_BOOTSTRAP_SERVERS``,
``STREAM_ANON_ANONYMIZATION_K``, ``STREAM_ANON_SIDE_PATHS_KRR_EPSILON``.  Any option can be set on the
command line with ``--set section.field=value`` (``--set side_paths.krr.epsilon=0.5``); the common ones
also have their own flags (see ``stream_anon.cli.service``).  Values from the environment and ``--set``
are text converted by the option's type: numbers, ``true``/``false``, lists as ``[age, sex]`` or
``age,sex``; ``null`` (or empty) clears an optional option; text options take the text as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from stream_anon.config.side_paths import SidePathConfig, SidePathConfigError, SideTopics, plan_side_paths
from stream_anon.core.defaults import DEFAULTS
from stream_anon.core.diversity import DiversityRequirement
from stream_anon.core.engine.castle import diversity_requirement
from stream_anon.core.engine.config import EngineConfig, EngineConfigError
from stream_anon.core.schema import Schema, SchemaError, adult_schema, load_yaml
from stream_anon.formats.release import ReleaseConfigError, ReleaseOptions
from stream_anon.kafka_io.settings import (
    CONSUMER_CLIENTS,
    MIN_OUTPUT_BOUND,
    PRODUCER_CLIENTS,
    BootstrapAddressError,
    KafkaSettings,
    TopicLayout,
    parse_bootstrap_servers,
)
from stream_anon.privacy.base import PrivacyParameterError

ENV_PREFIX = "STREAM_ANON_"
DEFAULT_TICK_SECONDS = 5.0
"""``release.tick_seconds``: the classes formed within one wall-clock tick of this length are published together at
its end, in a random order, all with the tick's end as their Kafka timestamp (:mod:`stream_anon.service.ticks`)."""
MAX_TICK_SECONDS = 3600.0
"""The longest ``release.tick_seconds`` (an hour; ``stream_anon.service.ticks`` checks the same bound)."""

RAW_SUFFIX = ".raw"
DERIVED_TOPICS = ("anon", "suppressed", "dlq", "krr", "rs", "blap", "estimates", "kmeans")
"""The ``topics`` options that default to ``<base>.<option>``, base = the input topic without a trailing ``.raw``
(:func:`derived_topic`): input ``visits.raw`` (or ``visits``) -> ``visits.anon``, ``visits.dlq``, ...  The ledger
is ``<input>.ledger`` and the side paths' budget topic ``<input>.side-budget``."""
PATH_OPTIONS = ("anonymization.schema", "kafka.ssl_cafile", "kafka.ssl_certfile", "kafka.ssl_keyfile",
                "kafka.ssl_crlfile")
"""Options naming files: a relative path in a config file is resolved against that file's folder (from a flag
or an environment variable: against the current directory)."""


def topic_base(input_topic: str) -> str:
    """The input topic without a trailing ``.raw`` (``visits.raw`` -> ``visits``; ``visits`` stays)."""
    return input_topic[: -len(RAW_SUFFIX)] if input_topic.endswith(RAW_SUFFIX) and input_topic != RAW_SUFFIX \
        else input_topic


def derived_topic(input_topic: str, option: str) -> str:
    """The default name of the topic option ``option`` (one of :data:`DERIVED_TOPICS`) for ``input_topic``."""
    return f"{topic_base(input_topic)}.{option}"


class ConfigError(ValueError):
    """An option is unknown or has an invalid value (the message names option, allowed values, value)."""


@dataclass(frozen=True)
class TopicSettings:
    """Topic names and how the service creates missing topics.

    Every output topic left empty (``null`` in a file) is derived from the input (:data:`DERIVED_TOPICS`):
    ``<input without .raw>.anon`` and so on; the defaults are those of input ``adult.raw``.
    """

    input: str = "adult.raw"
    anon: str = ""  # "" (null): <base>.anon, base = input without a trailing .raw
    krr: str = ""  # "": <base>.krr
    rs: str = ""  # "": <base>.rs
    blap: str = ""  # "": <base>.blap
    estimates: str = ""  # "": <base>.estimates
    kmeans: str = ""  # "": <base>.kmeans
    dlq: str = ""  # "": <base>.dlq
    suppressed: str = ""  # "": <base>.suppressed
    ledger: str | None = None  # the internal ledger (compacted); None = "<input>.ledger"
    create: bool = True  # create missing topics at start
    partitions: int = 1  # partitions of topics the service creates (outputs get as many as the input has)
    replication_factor: int | None = None  # None: the cluster's broker count, at most 3
    min_insync_replicas: int | None = None  # None: 2 on topics with 3+ replicas (else the broker's default)

    def __post_init__(self) -> None:
        derived = []
        for option in DERIVED_TOPICS:
            if not getattr(self, option):
                object.__setattr__(self, option, derived_topic(self.input, option))
                derived.append(option)
        object.__setattr__(self, "_derived", frozenset(derived))

    @property
    def derived(self) -> frozenset[str]:
        """The options whose names were derived from the input (not given)."""
        return self._derived  # type: ignore[attr-defined]

    def outputs(self) -> dict[str, str]:
        return {"anon": self.anon, "suppressed": self.suppressed, "dlq": self.dlq}

    def ledger_topic(self) -> str:
        """The ledger's name: ``ledger``, or ``<input>.ledger`` when unset."""
        return self.ledger or f"{self.input}.ledger"

    def side(self) -> dict[str, str]:
        return {"krr": self.krr, "rs": self.rs, "blap": self.blap, "estimates": self.estimates,
                "kmeans": self.kmeans}

    def side_topics(self) -> SideTopics:
        return SideTopics(krr=self.krr, rs=self.rs, blap=self.blap, estimates=self.estimates, kmeans=self.kmeans,
                          dlq=self.dlq)

    def service_topics(self) -> list[str]:
        """The topics the main path creates at start: input, ledger and its outputs (the side paths create the
        topics of the side paths that run: :mod:`stream_anon.side.app`)."""
        return list(dict.fromkeys([self.input, self.ledger_topic(), *self.outputs().values()]))

    def layout(self) -> TopicLayout:
        """How missing topics are created: ``create``, ``partitions`` (at least as many as the input has),
        ``replication_factor``; the ledger compacted."""
        return TopicLayout(create=self.create, partitions=self.partitions, replication_factor=self.replication_factor,
                           match_partitions_of=self.input, compacted=frozenset({self.ledger_topic()}),
                           min_insync_replicas=self.min_insync_replicas)


@dataclass(frozen=True)
class AnonymizationSettings:
    """The main path: schema, QI set and the engine's parameters (``stream_anon.core.engine.EngineConfig``)."""

    schema: str | None = None  # schema file (YAML/JSON); None = the shipped ADULT schema
    qi: list[str] | None = None  # None = the schema's quasi-identifiers
    sensitive: str | None = None  # None = the schema's sensitive attribute
    k: int = DEFAULTS.k  # every command's defaults: stream_anon.core.defaults
    delta: int = DEFAULTS.delta
    beta: int = DEFAULTS.beta
    mu: int = DEFAULTS.mu
    algorithm: str = DEFAULTS.algorithm  # castle | ubdsa
    loss: str = DEFAULTS.loss  # gt | lm | ubdsa
    leftover: str = DEFAULTS.leftover  # suppress | leftover
    delta_leftover: int | None = None
    l: int | float | None = DEFAULTS.l  # noqa: E741  (l of the l-diversity model; null: none, docs/threat-model.md)
    diversity: str = DEFAULTS.diversity  # distinct | entropy | recursive (the l-diversity model, core/diversity.py)
    c: float | None = DEFAULTS.c  # c of recursive (c, l)-diversity
    t_closeness: float | None = DEFAULTS.t_closeness  # t-closeness against the stream's running distribution (null: off)
    t_distance: str = DEFAULTS.t_distance  # auto | equal | ordered: ground distance of t-closeness
    t_reference_every: int | None = None  # the running distribution is frozen every this many arrivals (null: delta)
    zeta: int | None = DEFAULTS.zeta  # CASTLE's cluster reuse: the service requires 0 (docs/threat-model.md)
    max_age: int | None = None
    max_delay_seconds: float | None = None
    adaptive_delay: bool = False
    delta_min: int | None = None
    seed: int | None = None  # None = OS entropy (production); set for reproducible runs

    def load_schema(self) -> Schema:
        """The schema of ``schema`` (default ADULT) with the configured QI/sensitive roles."""
        schema = Schema.load(self.schema) if self.schema else adult_schema()
        if self.qi is not None or self.sensitive is not None:
            schema = schema.with_roles(qis=self.qi, sensitive=self.sensitive)
        return schema

    def engine_config(self, seed: int | None) -> EngineConfig:
        """The engine's parameters (validated by :class:`EngineConfig`, which names the parameter on error)."""
        extra: dict[str, Any] = {} if self.zeta is None else {"zeta": self.zeta}
        return EngineConfig(k=self.k, delta=self.delta, beta=self.beta, mu=self.mu, algorithm=self.algorithm,
                            loss=self.loss, leftover=self.leftover, delta_leftover=self.delta_leftover, l=self.l,
                            diversity=self.diversity, c=self.c, t_closeness=self.t_closeness,
                            t_distance=self.t_distance, t_reference_every=self.t_reference_every,
                            max_age=self.max_age, max_delay_seconds=self.max_delay_seconds,
                            adaptive_delay=self.adaptive_delay, delta_min=self.delta_min, seed=seed, **extra)

    def requirement(self, schema: Schema) -> DiversityRequirement | None:
        """The diversity requirement on ``schema``'s sensitive attribute (None: nothing beyond k), as the
        engine builds it (one definition for the engine, the gate and the class message)."""
        return diversity_requirement(schema, self.engine_config(seed=None))


@dataclass(frozen=True)
class ServiceSettings:
    """Behaviour of the service loop itself."""

    max_message_bytes: int = 65536  # larger input messages go to the DLQ as "oversized"
    dlq_max_bytes: int = 1000000  # original bytes kept in a DLQ entry (longer ones are truncated, flagged)
    max_output_bytes: int | None = None  # largest message written (None: the broker's limit, read at start)
    workers: int = 1  # pipeline worker processes (0 = in the service's thread); partition p -> worker p mod n
    commit_interval_ms: int = 500  # flush producer + commit watermarks at most this often
    poll_timeout_ms: int = 200
    idle_flush_seconds: float = 0.0  # >0: flush a partition's engine after this long without input (0 = never)
    readback_chunk: int = 2000  # output messages read per step when recovering a partition
    producer_recovery_seconds: float = 60.0  # nothing acknowledged this long while messages wait: recreate the producer
    metrics_port: int = 9108  # 0 = no metrics endpoint
    metrics_addr: str = "127.0.0.1"
    side_paths_mode: str = "process"  # process | thread | off: how run/demo start the side paths (own group)
    side_metrics_port: int = 9109  # side-path metrics endpoint in "process" mode (0 = off)
    healthz_stall_seconds: float = 60.0  # /healthz answers 503 once the main loop has not ticked for this long
    loss_confirm_seconds: float = 10.0  # an end below what was committed/acknowledged is a loss only if it stays so


@dataclass(frozen=True)
class ReleaseSettings:
    """What leaves the service on public topics (docs/threat-model.md)."""

    include_record_ids: bool = False  # true: class messages carry their members' record ids (OUTSIDE the threat model)
    secret: str | None = None  # key of side-copy pseudonyms and dead-letter hashes (>= 16 bytes); None: generated at start
    tick_seconds: float = DEFAULT_TICK_SECONDS  # class messages leave at the end of wall-clock ticks (0 = at once)


@dataclass(frozen=True)
class DeadLetterSettings:
    """The internal dead-letter topic."""

    payload: str = "redacted"  # redacted: reason, field, length, position, keyed hash | raw: also the original bytes


@dataclass(frozen=True)
class Config:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    anonymization: AnonymizationSettings = field(default_factory=AnonymizationSettings)
    side_paths: SidePathConfig = field(default_factory=SidePathConfig)  # options: stream_anon.config.side_paths
    service: ServiceSettings = field(default_factory=ServiceSettings)
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    dlq: DeadLetterSettings = field(default_factory=DeadLetterSettings)

    # -------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None) -> Config:
        """Defaults, then the YAML file, then ``STREAM_ANON_*`` variables of ``env`` (default ``os.environ``),
        then ``overrides`` (dotted option -> value, from flags); validated (:class:`ConfigError`)."""
        tree = _tree(cls())
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file {str(p)!r} does not exist")
            try:
                data = load_yaml(p.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError as e:
                raise ConfigError(f"config file {p}: not valid YAML: {' '.join(str(e).split())}") from None
            if not isinstance(data, Mapping):
                raise ConfigError(f"config file {p}: expected a mapping of sections at top level, got {type(data).__name__}")
            _apply_mapping(tree, cls, data, prefix="", origin=f"config file {p}")
            _resolve_paths(tree, data, p.parent)
        for name, raw in sorted((env if env is not None else os.environ).items()):
            if not name.startswith(ENV_PREFIX):
                continue
            dotted = env_to_option(name)
            if dotted is None:
                continue  # not a config option (e.g. STREAM_ANON_ADULT)
            _set(tree, cls, dotted, raw, origin=f"environment variable {name}")  # text: converted by the field's type
        for dotted, value in (overrides or {}).items():
            _set(tree, cls, dotted, value, origin="command line")
        cfg = _build(cls, tree)
        cfg.validate()
        return cfg

    def with_options(self, options: Mapping[str, Any], *, origin: str = "value") -> Config:
        """A new config: this one with ``options`` (dotted option -> value, converted like flags), validated."""
        tree = _tree(self)
        for dotted, value in options.items():
            _set(tree, type(self), dotted, value, origin=origin)
        cfg = _build(type(self), tree)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check every option; raises :class:`ConfigError` (one line naming the option, the allowed values and
        the value received)."""
        s, k, t = self.service, self.kafka, self.topics
        checks: list[tuple[str, bool, str, Any]] = [
            ("service.max_message_bytes", s.max_message_bytes > 0, "a positive integer", s.max_message_bytes),
            ("service.max_output_bytes", s.max_output_bytes is None or s.max_output_bytes >= MIN_OUTPUT_BOUND,
             f"empty (the broker's limit) or an integer >= {MIN_OUTPUT_BOUND}", s.max_output_bytes),
            ("service.workers", s.workers >= 0, "an integer >= 0 (0 = inline)", s.workers),
            ("service.commit_interval_ms", s.commit_interval_ms >= 0, "an integer >= 0", s.commit_interval_ms),
            ("service.producer_recovery_seconds", s.producer_recovery_seconds > 0, "a number of seconds > 0",
             s.producer_recovery_seconds),
            ("service.metrics_port", 0 <= s.metrics_port <= 65535, "0 (off) or a port 1-65535", s.metrics_port),
            ("service.side_metrics_port", 0 <= s.side_metrics_port <= 65535, "0 (off) or a port 1-65535",
             s.side_metrics_port),
            ("service.healthz_stall_seconds", s.healthz_stall_seconds > 0, "a number of seconds > 0",
             s.healthz_stall_seconds),
            ("service.loss_confirm_seconds", s.loss_confirm_seconds >= 0, "a number of seconds >= 0",
             s.loss_confirm_seconds),
            ("service.side_paths_mode", s.side_paths_mode in ("process", "thread", "off"), "process, thread or off",
             s.side_paths_mode),
            ("service.idle_flush_seconds", s.idle_flush_seconds >= 0, "a number >= 0 (0 = never)",
             s.idle_flush_seconds),
            ("release.tick_seconds", self.release.tick_seconds == 0 or 0.001 <= self.release.tick_seconds
             <= MAX_TICK_SECONDS, f"0 (publish each class at once) or a number of seconds in [0.001, "
             f"{MAX_TICK_SECONDS:.0f}]", self.release.tick_seconds),
            ("topics.partitions", t.partitions >= 1, "an integer >= 1", t.partitions),
            ("topics.replication_factor", t.replication_factor is None or t.replication_factor >= 1,
             "null (the cluster's broker count, at most 3) or an integer >= 1", t.replication_factor),
            ("topics.min_insync_replicas", t.min_insync_replicas is None or 1 <= t.min_insync_replicas <= (
                t.replication_factor or t.min_insync_replicas), "null (2 with 3+ replicas) or an integer from 1 to "
             "topics.replication_factor", t.min_insync_replicas),
            ("kafka.max_poll_records", k.max_poll_records >= 1, "an integer >= 1", k.max_poll_records),
            ("kafka.producer_client", k.producer_client in PRODUCER_CLIENTS, " or ".join(PRODUCER_CLIENTS),
             k.producer_client),
            ("kafka.consumer_client", k.consumer_client in CONSUMER_CLIENTS, " or ".join(CONSUMER_CLIENTS),
             k.consumer_client),
        ]
        for name, ok, allowed, value in checks:
            if not ok:
                raise ConfigError(f"option {name}: expected {allowed}, got {value!r}")
        if k.bootstrap_servers is not None:
            try:
                parse_bootstrap_servers(k.bootstrap_servers)
            except BootstrapAddressError as e:
                raise ConfigError(f"option kafka.bootstrap_servers: {e}") from None
        names = [t.input, *t.outputs().values(), t.ledger_topic()]
        if len(set(names)) != len(names):
            raise ConfigError(f"topics: input, output and ledger topics must differ, got {names}")
        try:
            self.release_options()
        except ReleaseConfigError as e:
            raise ConfigError(str(e)) from None
        a = self.anonymization
        try:
            schema = a.load_schema()
        except (SchemaError, OSError, ValueError, yaml.YAMLError) as e:
            roles = " (with anonymization.qi / anonymization.sensitive)" if a.qi or a.sensitive else ""
            raise ConfigError(f"option anonymization.schema{roles}: {a.schema or 'ADULT'}: "
                              f"{' '.join(str(e).split())}") from None
        try:
            a.engine_config(seed=a.seed)
        except EngineConfigError as e:
            raise ConfigError(f"option anonymization.{e.parameter}: expected {e.allowed}, got {e.value!r}") from None
        _check_service_privacy(a, schema)
        try:
            a.requirement(schema)
        except EngineConfigError as e:
            raise ConfigError(f"option anonymization.{e.parameter}: expected {e.allowed}, got {e.value!r}") from None
        if self.side_paths.enabled and s.side_paths_mode != "off":
            try:
                plan_side_paths(self.side_paths, schema, np.random.default_rng(0))
            except SidePathConfigError as e:
                raise ConfigError(f"{e} (schema {schema.name!r}; side paths can be turned off with "
                                  f"side_paths.enabled: false)") from None
            except PrivacyParameterError as e:
                raise ConfigError(f"side_paths: {e}") from None

    def side_paths_off(self) -> str | None:
        """Why the side paths do not run, or None when they do: turned off, or the schema declares no side-path
        attribute and the configuration lists none (nothing to publish)."""
        if not self.side_paths.enabled:
            return "side_paths.enabled is false"
        if self.service.side_paths_mode == "off":
            return "service.side_paths_mode is off"
        schema = self.anonymization.load_schema()
        if not plan_side_paths(self.side_paths, schema, np.random.default_rng(0)).publishes:
            return (f"schema {schema.name!r} declares no side-path attributes (declare them with side_paths: [krr, "
                    f"rs, blap, kmeans] on an attribute, or list them in side_paths.<path>.attributes)")
        return None

    def release_options(self) -> ReleaseOptions:
        """The options of the release formats (``release.*``, ``dlq.payload``, ``service.dlq_max_bytes``)."""
        return ReleaseOptions(include_record_ids=self.release.include_record_ids, secret=self.release.secret,
                              dlq_payload=self.dlq.payload, dlq_max_payload_bytes=self.service.dlq_max_bytes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def redacted(self) -> dict[str, Any]:
        """``to_dict`` with passwords and the release secret replaced, for logs and run directories."""
        d = self.to_dict()
        for key in ("sasl_plain_password", "ssl_password"):
            if d["kafka"].get(key):
                d["kafka"][key] = "***"
        if d["release"].get("secret"):
            d["release"]["secret"] = "***"
        return d


def _resolve_paths(tree: Tree, data: Mapping[str, Any], base: Path) -> None:
    """The :data:`PATH_OPTIONS` a config file sets, relative ones resolved against the file's folder ``base``."""
    for dotted in PATH_OPTIONS:
        section, option = dotted.split(".")
        given = data.get(section)
        keys = {str(k).replace("-", "_") for k in given} if isinstance(given, Mapping) else set()
        value = tree[section].get(option)
        if option in keys and isinstance(value, str) and value:
            path = Path(value).expanduser()
            if not path.is_absolute():
                tree[section][option] = str(base / path)


def _check_service_privacy(a: AnonymizationSettings, schema: Schema) -> None:
    """The service's threat-model defaults (docs/threat-model.md): no cluster reuse; l-diversity and t-closeness
    that the schema's sensitive attribute can satisfy."""
    if a.zeta != 0:
        got = "null (the engine's default reuse)" if a.zeta is None else repr(a.zeta)
        raise ConfigError(f"option anonymization.zeta: CASTLE's cluster reuse publishes single records, which a "
                          f"reader of the anon topic can re-identify by arrival time; the service requires 0, got "
                          f"{got} (docs/threat-model.md)")
    wants_l = a.l is not None and a.l > 1
    if not schema.sensitive and (wants_l or a.t_closeness is not None):
        also = " and anonymization.t_closeness: null" if a.t_closeness is not None else ""
        if wants_l:
            raise ConfigError(f"option anonymization.l: l-diversity (default 2 in the service) needs a sensitive "
                              f"attribute and schema {schema.name!r} has none; set anonymization.l: null{also} to "
                              f"release k-anonymous classes without it (docs/threat-model.md)")
        raise ConfigError(f"option anonymization.t_closeness: t-closeness (default 0.2 in the service) needs a "
                          f"sensitive attribute and schema {schema.name!r} has none; set anonymization.t_closeness: "
                          f"null to release k-anonymous classes without it (docs/threat-model.md)")
    if not wants_l or a.l is None:
        return
    attr = schema.sensitive[0]
    values = attr.domain_values
    if values and len(values) < a.l:
        raise ConfigError(f"option anonymization.l: expected at most the {len(values)} distinct value(s) of the "
                          f"sensitive attribute {attr.name!r} of schema {schema.name!r}, got {a.l}; set "
                          f"anonymization.l: null to release without l-diversity (docs/threat-model.md)")


def option_names(obj: object | None = None, prefix: str = "") -> list[str]:
    """Every dotted option name, in declaration order (for documentation and tests)."""
    obj = obj if obj is not None else Config()
    assert dataclasses.is_dataclass(obj)
    out: list[str] = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            out.extend(option_names(v, prefix + f.name + "."))
        else:
            out.append(prefix + f.name)
    return out


def env_name(dotted: str) -> str:
    """``anonymization.k`` -> ``STREAM_ANON_ANONYMIZATION_K``."""
    return ENV_PREFIX + dotted.replace(".", "_").replace("-", "_").upper()


@functools.cache
def _env_options() -> dict[str, str]:
    return {env_name(o): o for o in option_names()}


def env_to_option(name: str) -> str | None:
    """The dotted option an environment variable sets, or None if it is not a config variable."""
    return _env_options().get(name)


Tree = dict[str, Any]
"""A config as nested dicts (section -> option -> value), the form it takes while it is being loaded."""


def _tree(cfg: object) -> Tree:
    assert dataclasses.is_dataclass(cfg)
    tree = {f.name: _tree(getattr(cfg, f.name)) if dataclasses.is_dataclass(getattr(cfg, f.name))
            else getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, TopicSettings):  # derived names follow a later change of the input
        tree.update({option: "" for option in cfg.derived})
    return tree


def _build(cls: type[Any], tree: Tree) -> Any:
    hints = typing.get_type_hints(cls)
    return cls(**{name: _build(hints[name], value) if isinstance(value, dict) and dataclasses.is_dataclass(hints[name])
                  else value for name, value in tree.items()})


def _fields(cls: type[Any]) -> dict[str, Any]:
    """Option name -> its type (a section's dataclass, or the annotated type of a value)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _set(tree: Tree, cls: type[Any], dotted: str, value: Any, *, origin: str) -> None:
    """Set one option by its dotted name (``anonymization.k``), converting to the option's type."""
    parts = dotted.replace("-", "_").split(".")
    node, node_cls = tree, cls
    for i, part in enumerate(parts):
        if node_cls is None:
            raise ConfigError(f"{origin}: option {dotted!r}: {'.'.join(parts[:i])!r} is not a section")
        fields = _fields(node_cls)
        if part not in fields:
            raise ConfigError(f"{origin}: unknown option {dotted!r}; "
                              f"{'.'.join(parts[:i]) or 'top level'} has {sorted(fields)}")
        hint = fields[part]
        if i == len(parts) - 1:
            if dataclasses.is_dataclass(hint):
                if not isinstance(value, Mapping):
                    raise ConfigError(f"{origin}: option {dotted!r} is a section; give a mapping, got {value!r}")
                _apply_mapping(node[part], hint, value, prefix=dotted + ".", origin=origin)  # type: ignore[arg-type]
            else:
                node[part] = _convert(value, hint, dotted, origin)
            return
        node = node[part]
        node_cls = hint if dataclasses.is_dataclass(hint) else None  # type: ignore[assignment]


def _apply_mapping(node: Tree, cls: type[Any], data: Mapping[str, Any], *, prefix: str, origin: str) -> None:
    fields = _fields(cls)
    for key, value in data.items():
        key_s = str(key).replace("-", "_")
        if key_s not in fields:
            raise ConfigError(f"{origin}: unknown option {prefix + key_s!r}; "
                              f"{prefix.rstrip('.') or 'top level'} has {sorted(fields)}")
        hint = fields[key_s]
        if dataclasses.is_dataclass(hint):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{origin}: option {prefix + key_s!r} is a section; give a mapping, got {value!r}")
            _apply_mapping(node[key_s], hint, value, prefix=prefix + key_s + ".", origin=origin)  # type: ignore[arg-type]
        else:
            node[key_s] = _convert(value, hint, prefix + key_s, origin)


def _parse_scalar(raw: str) -> Any:
    try:
        return load_yaml(raw) if raw.strip() != "" else None
    except yaml.YAMLError:
        return raw


def _convert(value: Any, hint: Any, name: str, origin: str) -> Any:
    """Convert ``value`` to the annotated type ``hint`` (int, float, bool, str, list[str], optional)."""
    args = typing.get_args(hint)
    origin_t = typing.get_origin(hint)
    if origin_t in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if isinstance(value, str) and value.strip() in ("null", "") and type(None) in args:
            return None
        for alt in inner[:-1]:  # int | float: an integer if it is one, else a number
            try:
                return _convert(value, alt, name, origin)
            except ConfigError:
                continue
        return _convert(value, inner[-1], name, origin)
    if hint is str and name.startswith("topics.") and name[len("topics."):] in DERIVED_TOPICS and (
            value is None or (isinstance(value, str) and value.strip() in ("", "null"))):
        return ""  # derived from the input topic
    if origin_t is list:
        if isinstance(value, str):
            parsed = _parse_scalar(value)
            value = parsed if isinstance(parsed, list) else [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise ConfigError(f"{origin}: option {name!r}: expected a list, got {value!r}")
        return [_convert(v, args[0], name, origin) for v in value]
    try:
        if hint is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return value.strip().lower() in ("true", "yes", "1", "on")
            if isinstance(value, int) and value in (0, 1):
                return bool(value)
            raise ValueError
        if hint is int:
            if isinstance(value, bool):
                raise ValueError
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        if hint is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if hint is str:
            if isinstance(value, dict | list):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        tname = getattr(hint, "__name__", str(hint))
        raise ConfigError(f"{origin}: option {name!r}: expected {tname}, got {value!r}") from None
    return value
