"""The options of the Kafka clients (:class:`KafkaSettings`, the ``kafka`` section of the service's configuration)
and how missing topics are created (:class:`TopicLayout`): all the Kafka layer needs from the configuration.

The Kafka layer (:mod:`stream_anon.kafka_io`) takes these, never the whole ``Config``
(:mod:`stream_anon.config.settings`, which holds them as its ``kafka`` section and builds the layout from its
``topics`` section).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PRODUCER_CLIENTS = ("confluent-kafka", "kafka-python")
"""The producer's client libraries (``kafka.producer_client``)."""
CONSUMER_CLIENTS = ("confluent-kafka", "kafka-python")
"""The group consumer's client libraries (``kafka.consumer_client``): the main path's and the side paths'."""

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,252})?")
_FORMAT = "HOST:PORT[,HOST:PORT...] (a port 1-65535; IPv6 as [ADDRESS]:PORT)"


class BootstrapAddressError(ValueError):
    """A bootstrap-servers value that is not a list of ``HOST:PORT`` (one line: what is expected, what was given)."""


def parse_bootstrap_servers(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` as ``[(host, port), ...]``; raises :class:`BootstrapAddressError` naming the entry
    that is not one (``not-a-host:xyz``: the port is not a number)."""
    if not isinstance(text, str) or not text.strip():
        raise BootstrapAddressError(f"expected {_FORMAT}, got {text!r}")
    out = []
    for raw in text.split(","):
        entry = raw.strip()
        if entry.startswith("["):
            host, sep, port_text = entry[1:].partition("]:")
            ok_host = bool(host) and all(c in "0123456789abcdefABCDEF:." for c in host)
        else:
            host, sep, port_text = entry.rpartition(":")
            ok_host = bool(_HOST.fullmatch(host))
        if not sep or not ok_host:
            raise BootstrapAddressError(f"expected {_FORMAT}, got {text!r} (entry {entry!r} is not HOST:PORT)")
        if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
            raise BootstrapAddressError(f"expected {_FORMAT}, got {text!r} (port {port_text!r} of {entry!r} is not "
                                        f"a number 1-65535)")
        out.append((host, int(port_text)))
    return out


DEFAULT_REPLICATION = 3
"""Replicas of a topic the service creates when ``topics.replication_factor`` is unset (fewer on a smaller cluster)."""
DEFAULT_MIN_INSYNC_REPLICAS = 2
"""``min.insync.replicas`` of a created topic with 3 or more replicas when ``topics.min_insync_replicas`` is unset: an
acknowledged write (``acks=all``) is on 2 brokers, so one broker's loss loses nothing and one broker down stops
no write (docs/deploy.md, "On a replicated cluster")."""
FALLBACK_MESSAGE_MAX_BYTES = 1_048_588
"""Apache Kafka's default ``message.max.bytes``: the output bound when the broker does not report its own
(:mod:`stream_anon.kafka_io.limits`)."""
MIN_OUTPUT_BOUND = 16 * 1024
"""The smallest output bound the service runs with (every fixed part of a message, e.g. a dead letter's fields,
fits); ``service.max_output_bytes`` below it is refused."""

COMPACTED_TOPIC_CONFIG: Mapping[str, str] = {"cleanup.policy": "compact"}
"""Topic configuration of a compacted topic (the ledger: docs/threat-model.md, "Bounded growth")."""


@dataclass(frozen=True)
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
    receive_max_bytes: int = 100000000  # the largest fetch response a consumer accepts (kafka.consumer_client's)
    linger_ms: int = 20
    batch_size: int = 262144
    compression_type: str | None = None
    request_timeout_ms: int = 30000
    enable_idempotence: bool = True
    max_request_size: int = 4194304
    connect_timeout_ms: int = 5000  # one connection attempt at start
    startup_retry_seconds: float = 300.0  # give up connecting at start after this long (0 = forever)
    retry_backoff_max_seconds: float = 30.0
    producer_client: str = "confluent-kafka"  # confluent-kafka | kafka-python: the producer's client library
    consumer_client: str = "confluent-kafka"  # confluent-kafka | kafka-python: the group consumers' client library

    def security_options(self) -> dict[str, Any]:
        """The SASL/SSL keyword arguments for kafka-python clients (only those set)."""
        keys = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                "sasl_kerberos_service_name", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password",
                "ssl_crlfile")
        out = {k: getattr(self, k) for k in keys if getattr(self, k) is not None}
        if self.security_protocol in ("SSL", "SASL_SSL"):
            out["ssl_check_hostname"] = self.ssl_check_hostname
        return out


@dataclass(frozen=True)
class TopicLayout:
    """How :func:`~stream_anon.kafka_io.clients.ensure_topics` creates missing topics.

    Attributes:
        create: create missing topics (else a warning names them).
        partitions: partitions of a created topic, at least.
        replication_factor: of a created topic; None: the cluster's broker count, at most
            :data:`DEFAULT_REPLICATION` (1 on a single broker, 3 on a cluster of three or more).
        min_insync_replicas: ``min.insync.replicas`` of a created replicated topic (with the producers' ``acks=all``:
            how many replicas hold an acknowledged write); None: 2 when it has 3 or more replicas, else the broker's
            default.  Never above the replication factor; not set on an unreplicated topic.
        match_partitions_of: a created topic gets at least as many partitions as this topic has when it exists
            and is among the topics asked for (the input: output partition = ledger partition = input partition).
        compacted: topics created with :data:`COMPACTED_TOPIC_CONFIG`.
    """

    create: bool = True
    partitions: int = 1
    replication_factor: int | None = None
    match_partitions_of: str | None = None
    compacted: frozenset[str] = field(default_factory=frozenset)
    min_insync_replicas: int | None = None

    def replication(self, brokers: int) -> int:
        """The replication factor of a topic created on a cluster of ``brokers`` brokers."""
        if self.replication_factor is not None:
            return self.replication_factor
        return max(1, min(brokers, DEFAULT_REPLICATION))

    def replication_config(self, replication: int) -> dict[str, str]:
        """The topic configuration that goes with ``replication`` replicas: ``min.insync.replicas`` (see above)."""
        if replication <= 1:
            return {}
        wanted = self.min_insync_replicas if self.min_insync_replicas is not None else \
            (DEFAULT_MIN_INSYNC_REPLICAS if replication >= DEFAULT_REPLICATION else None)
        return {} if wanted is None else {"min.insync.replicas": str(min(wanted, replication))}

    def topic_config(self, name: str, replication: int = 1) -> dict[str, Any]:
        """The configuration of created topic ``name`` with ``replication`` replicas: compacted (the ledger) and
        ``min.insync.replicas`` (:meth:`replication_config`)."""
        return {**(COMPACTED_TOPIC_CONFIG if name in self.compacted else {}), **self.replication_config(replication)}
