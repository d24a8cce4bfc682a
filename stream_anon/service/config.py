"""The service's single configuration object: YAML file, then ``STREAM_ANON_*`` environment, then flags.

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
import os
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from stream_anon.service.side_paths import SidePathConfig

ENV_PREFIX = "STREAM_ANON_"


class ConfigError(ValueError):
    """An option is unknown or has an invalid value (the message names option, allowed values, value)."""


@dataclass
class KafkaSettings:
    """Connection and client options; the security options pass straight through to kafka-python."""

    bootstrap_servers: str | None = None  # None: start an embedded Tansu broker on a free loopback port
    client_id: str = "stream-anon"
    group_id: str = "stream-anon-main"
    group_instance_id: str | None = None  # static group membership (a restarted member keeps its partitions)
    security_protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism: str | None = None  # PLAIN | SCRAM-SHA-256 | SCRAM-SHA-512 | OAUTHBEARER | GSSAPI
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = None
    sasl_kerberos_service_name: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: str | None = None
    ssl_crlfile: str | None = None
    ssl_check_hostname: bool = True
    session_timeout_ms: int = 10000
    heartbeat_interval_ms: int = 3000
    max_poll_interval_ms: int = 300000
    max_poll_records: int = 5000
    fetch_max_bytes: int = 52428800
    fetch_max_wait_ms: int = 100
    max_partition_fetch_bytes: int = 1048576
    linger_ms: int = 20
    batch_size: int = 262144
    compression_type: str | None = None
    request_timeout_ms: int = 30000
    enable_idempotence: bool = True
    max_request_size: int = 4194304
    connect_timeout_ms: int = 5000  # one connection attempt at start
    startup_retry_seconds: float = 300.0  # give up connecting at start after this long (0 = forever)
    retry_backoff_max_seconds: float = 30.0

    def security_options(self) -> dict[str, Any]:
        """The SASL/SSL keyword arguments for kafka-python clients (only those set)."""
        keys = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                "sasl_kerberos_service_name", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
                "ssl_crlfile")
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            out["ssl_check_hostname"] = self.ssl_check_hostname
        return out


@dataclass
class TopicSettings:
    """Topic names (defaults for input ``adult.raw``) and how the service creates missing topics."""

    input: str = "adult.raw"
    anon: str = "adult.anon"
    krr: str = "adult.krr"
    rs: str = "adult.rs"
    blap: str = "adult.blap"
    estimates: str = "adult.estimates"
    kmeans: str = "adult.kmeans"
    dlq: str = "adult.dlq"
    suppressed: str = "adult.suppressed"
    create: bool = True  # create missing topics at start
    partitions: int = 1  # partitions of topics the service creates (outputs get as many as the input has)
    replication_factor: int = 1

    def outputs(self) -> dict[str, str]:
        return {"anon": self.anon, "suppressed": self.suppressed, "dlq": self.dlq}

    def side(self) -> dict[str, str]:
        return {"krr": self.krr, "rs": self.rs, "blap": self.blap, "estimates": self.estimates,
                "kmeans": self.kmeans}


@dataclass
class AnonymizationSettings:
    """The main path: schema, QI set and the engine's parameters (``stream_anon.core.engine.EngineConfig``)."""

    schema: str | None = None  # schema file (YAML/JSON); None = the shipped ADULT schema
    qi: list[str] | None = None  # None = the schema's quasi-identifiers
    sensitive: str | None = None  # None = the schema's sensitive attribute
    k: int = 10
    delta: int = 1000
    beta: int = 50
    mu: int = 100
    algorithm: str = "castle"  # castle | ubdsa
    loss: str = "gt"  # gt | lm | ubdsa
    leftover: str = "suppress"  # suppress | leftover
    delta_leftover: int | None = None
    l: int | None = None  # noqa: E741  (l-diversity, CASTLE's extension)
    zeta: int | None = None  # None = the engine's default
    max_age: int | None = None
    max_delay_seconds: float | None = None
    adaptive_delay: bool = False
    delta_min: int | None = None
    seed: int | None = None  # None = OS entropy (production); set for reproducible runs


@dataclass
class ServiceSettings:
    """Behaviour of the service loop itself."""

    max_message_bytes: int = 65536  # larger input messages go to the DLQ as "oversized"
    dlq_max_bytes: int = 1000000  # original bytes kept in a DLQ entry (longer ones are truncated, flagged)
    workers: int = 1  # pipeline worker processes (0 = in the service's thread); partition p -> worker p mod n
    commit_interval_ms: int = 500  # flush producer + commit watermarks at most this often
    poll_timeout_ms: int = 200
    idle_flush_seconds: float = 0.0  # >0: flush a partition's engine after this long without input (0 = never)
    readback_chunk: int = 2000  # output messages read per step when recovering a partition
    metrics_port: int = 9108  # 0 = no metrics endpoint
    metrics_addr: str = "127.0.0.1"
    side_paths_mode: str = "process"  # process | thread | off: how run/demo start the side paths (own group)
    side_metrics_port: int = 9109  # side-path metrics endpoint in "process" mode (0 = off)


@dataclass
class Config:
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topics: TopicSettings = field(default_factory=TopicSettings)
    anonymization: AnonymizationSettings = field(default_factory=AnonymizationSettings)
    side_paths: SidePathConfig = field(default_factory=SidePathConfig)  # owned by side_paths.py
    service: ServiceSettings = field(default_factory=ServiceSettings)

    # -------------------------------------------------------------- loading
    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None) -> Config:
        """Defaults, then the YAML file, then ``STREAM_ANON_*`` variables of ``env`` (default ``os.environ``),
        then ``overrides`` (dotted option -> value, from flags)."""
        cfg = cls()
        if path is not None:
            p = Path(path)
            if not p.is_file():
                raise ConfigError(f"config file {str(p)!r} does not exist")
            data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
            if not isinstance(data, Mapping):
                raise ConfigError(f"config file {p}: expected a mapping of sections at top level, got {type(data).__name__}")
            _apply_mapping(cfg, data, prefix="", origin=f"config file {p}")
        for name, raw in sorted((env if env is not None else os.environ).items()):
            if not name.startswith(ENV_PREFIX):
                continue
            dotted = env_to_option(name)
            if dotted is None:
                continue  # not a config option (e.g. STREAM_ANON_ADULT)
            cfg.set(dotted, raw, origin=f"environment variable {name}")  # text: converted by the field's type
        for dotted, value in (overrides or {}).items():
            cfg.set(dotted, value, origin="command line")
        cfg.validate()
        return cfg

    def set(self, dotted: str, value: Any, *, origin: str = "value") -> None:
        """Set one option by its dotted name (``anonymization.k``), converting to the field's type."""
        parts = dotted.replace("-", "_").split(".")
        target: Any = self
        for i, part in enumerate(parts):
            if not dataclasses.is_dataclass(target):
                raise ConfigError(f"{origin}: option {dotted!r}: {'.'.join(parts[:i])!r} is not a section")
            fields = {f.name: f for f in dataclasses.fields(target)}
            if part not in fields:
                raise ConfigError(f"{origin}: unknown option {dotted!r}; "
                                  f"{'.'.join(parts[:i]) or 'top level'} has {sorted(fields)}")
            if i == len(parts) - 1:
                hint = typing.get_type_hints(type(target))[part]
                current = getattr(target, part)
                if dataclasses.is_dataclass(current):
                    if not isinstance(value, Mapping):
                        raise ConfigError(f"{origin}: option {dotted!r} is a section; give a mapping, got {value!r}")
                    _apply_mapping(current, value, prefix=dotted + ".", origin=origin)
                else:
                    setattr(target, part, _convert(value, hint, dotted, origin))
                return
            target = getattr(target, part)

    def validate(self) -> None:
        a = self.anonymization
        checks: list[tuple[str, bool, str, Any]] = [
            ("anonymization.k", a.k >= 2, "an integer >= 2", a.k),
            ("anonymization.delta", a.delta >= a.k, f"an integer >= k ({a.k})", a.delta),
            ("anonymization.beta", a.beta >= 1, "an integer >= 1", a.beta),
            ("anonymization.mu", a.mu >= 1, "an integer >= 1", a.mu),
            ("anonymization.algorithm", a.algorithm in ("castle", "ubdsa"), "castle or ubdsa", a.algorithm),
            ("anonymization.loss", a.loss in ("gt", "lm", "ubdsa"), "gt, lm or ubdsa", a.loss),
            ("anonymization.leftover", a.leftover in ("suppress", "leftover"), "suppress or leftover", a.leftover),
            ("service.max_message_bytes", self.service.max_message_bytes > 0, "a positive integer",
             self.service.max_message_bytes),
            ("service.workers", self.service.workers >= 0, "an integer >= 0 (0 = inline)", self.service.workers),
            ("service.commit_interval_ms", self.service.commit_interval_ms >= 0, "an integer >= 0",
             self.service.commit_interval_ms),
            ("service.metrics_port", 0 <= self.service.metrics_port <= 65535, "0 (off) or a port 1-65535",
             self.service.metrics_port),
            ("topics.partitions", self.topics.partitions >= 1, "an integer >= 1", self.topics.partitions),
            ("service.side_paths_mode", self.service.side_paths_mode in ("process", "thread", "off"),
             "process, thread or off", self.service.side_paths_mode),
            ("kafka.max_poll_records", self.kafka.max_poll_records >= 1, "an integer >= 1",
             self.kafka.max_poll_records),
        ]
        for name, ok, allowed, value in checks:
            if not ok:
                raise ConfigError(f"option {name}: expected {allowed}, got {value!r}")
        names = [self.topics.input, *self.topics.outputs().values()]
        if len(set(names)) != len(names):
            raise ConfigError(f"topics: input and output topics must differ, got {names}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def redacted(self) -> dict[str, Any]:
        """``to_dict`` with passwords replaced, for logs and run directories."""
        d = self.to_dict()
        for key in ("sasl_plain_password", "ssl_password"):
            if d["kafka"].get(key):
                d["kafka"][key] = "***"
        return d


def option_names(obj: Any = None, prefix: str = "") -> list[str]:
    """Every dotted option name, in declaration order (for documentation and tests)."""
    obj = obj if obj is not None else Config()
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


_ENV_TO_OPTION: dict[str, str] = {}


def env_to_option(name: str) -> str | None:
    """The dotted option an environment variable sets, or None if it is not a config variable."""
    if not _ENV_TO_OPTION:
        _ENV_TO_OPTION.update({env_name(o): o for o in option_names()})
    return _ENV_TO_OPTION.get(name)


def _apply_mapping(target: Any, data: Mapping[str, Any], *, prefix: str, origin: str) -> None:
    root = target
    for key, value in data.items():
        key_s = str(key).replace("-", "_")
        fields = {f.name for f in dataclasses.fields(root)}
        if key_s not in fields:
            raise ConfigError(f"{origin}: unknown option {prefix + key_s!r}; "
                              f"{prefix.rstrip('.') or 'top level'} has {sorted(fields)}")
        current = getattr(root, key_s)
        if dataclasses.is_dataclass(current):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(f"{origin}: option {prefix + key_s!r} is a section; give a mapping, got {value!r}")
            _apply_mapping(current, value, prefix=prefix + key_s + ".", origin=origin)
        else:
            hint = typing.get_type_hints(type(root))[key_s]
            setattr(root, key_s, _convert(value, hint, prefix + key_s, origin))


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() != "" else None
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
        return _convert(value, inner[0], name, origin)
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
