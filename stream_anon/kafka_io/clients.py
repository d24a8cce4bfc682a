"""Kafka clients (kafka-python): connection with retry/backoff, topic creation, the group consumer.  Everything
takes :class:`~stream_anon.kafka_io.settings.KafkaSettings` (the ``kafka`` options), never the whole configuration.

The rest of the Kafka layer: the producer (:mod:`stream_anon.kafka_io.producer`), the group-less partition reader
(:mod:`stream_anon.kafka_io.reader`), the error types (:mod:`stream_anon.kafka_io.errors`), the embedded broker
(:mod:`stream_anon.kafka_io.broker`) and the stop path's bounds (:mod:`stream_anon.kafka_io.lifecycle`).

Kafka transactions are NOT used (Tansu shows aborted transactional records to ``read_committed`` consumers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from stream_anon.kafka_io.address import PROBE_SLICE_SECONDS, BrokerUnreachableError, wait_for_broker
from stream_anon.kafka_io.errors import BrokerUnavailableError
from stream_anon.kafka_io.lifecycle import wait_unless
from stream_anon.kafka_io.settings import KafkaSettings, TopicLayout

log = logging.getLogger(__name__)

T = TypeVar("T")


KAFKA_PYTHON_METADATA_MAX_AGE_MS = 5000
"""How old a kafka-python client's metadata may get (its default: 5 min).  kafka-python 3.0 does not refresh its
metadata when a ListOffsets request is answered ``NOT_LEADER_OR_FOLLOWER``: it resends to the old leader until the
periodic refresh, so after a leader election (routine on a replicated cluster) the recovery's ledger scan and the
broker probe failed for 5 min (a three-node Apache Kafka cluster, tests/test_apache_kafka_cluster_faults.py).  With 5
s they follow the new leader within seconds; one small metadata request per client per 5 s costs nothing."""


def client_options(k: KafkaSettings) -> dict[str, Any]:
    """The keyword arguments every kafka-python client gets: servers, client id, request timeout, metadata age
    (:data:`KAFKA_PYTHON_METADATA_MAX_AGE_MS`), security."""
    return {"bootstrap_servers": k.bootstrap_servers, "client_id": k.client_id,
            "request_timeout_ms": k.request_timeout_ms, "metadata_max_age_ms": KAFKA_PYTHON_METADATA_MAX_AGE_MS,
            **k.security_options()}


def fetch_limits(k: KafkaSettings, *, partition_bytes: int | None = None) -> dict[str, Any]:
    """The fetch and receive limits of a kafka-python consumer, the same for every consumer of the service:
    ``kafka.fetch_max_bytes`` per fetch, ``kafka.max_partition_fetch_bytes`` per partition (``partition_bytes``:
    another, at most ``kafka.fetch_max_bytes``, e.g. a reader of whole ledger chunks), and ``kafka.receive_max_bytes``
    for a whole response (a larger one is refused, ``InvalidReceiveError``: a message above it cannot be read,
    :mod:`stream_anon.kafka_io.oversized`)."""
    per_partition = k.max_partition_fetch_bytes if partition_bytes is None else min(partition_bytes,
                                                                                    k.fetch_max_bytes)
    return {"fetch_max_bytes": k.fetch_max_bytes, "max_partition_fetch_bytes": per_partition,
            "receive_message_max_bytes": k.receive_max_bytes}


LIBRDKAFKA_SECURITY = {"sasl_mechanism": "sasl.mechanism", "sasl_plain_username": "sasl.username",
                       "sasl_plain_password": "sasl.password",
                       "sasl_kerberos_service_name": "sasl.kerberos.service.name", "ssl_cafile": "ssl.ca.location",
                       "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
                       "ssl_password": "ssl.key.password", "ssl_crlfile": "ssl.crl.location"}
"""The ``kafka`` security options -> librdkafka's property names."""


def librdkafka_client_config(k: KafkaSettings) -> dict[str, Any]:
    """The librdkafka properties every confluent-kafka client gets: servers, client id, timeouts, security
    (translated: ``sasl_plain_username`` -> ``sasl.username``, ``ssl_cafile`` -> ``ssl.ca.location`` ...)."""
    conf: dict[str, Any] = {
        "bootstrap.servers": k.bootstrap_servers, "client.id": k.client_id,
        "socket.connection.setup.timeout.ms": max(1000, k.connect_timeout_ms),
        "security.protocol": k.security_protocol.lower(),
    }
    for option, prop in LIBRDKAFKA_SECURITY.items():
        value = getattr(k, option)
        if value is not None:
            conf[prop] = value
    if k.security_protocol in ("SSL", "SASL_SSL"):
        conf["ssl.endpoint.identification.algorithm"] = "https" if k.ssl_check_hostname else "none"
    return conf


def librdkafka_fetch_limits(k: KafkaSettings, *, partition_bytes: int | None = None) -> dict[str, Any]:
    """:func:`fetch_limits` in librdkafka's names (``receive.message.max.bytes`` is its response limit; its
    ``message.max.bytes`` must not exceed ``fetch.max.bytes``); the local prefetch queue holds about one fetch."""
    lim = fetch_limits(k, partition_bytes=partition_bytes)
    return {"fetch.max.bytes": lim["fetch_max_bytes"], "max.partition.fetch.bytes": lim["max_partition_fetch_bytes"],
            "receive.message.max.bytes": lim["receive_message_max_bytes"],
            "message.max.bytes": max(1000, min(1000000, lim["fetch_max_bytes"])),
            "queued.max.messages.kbytes": max(1024, lim["fetch_max_bytes"] // 1024)}


def backoff_delays(max_seconds: float, first: float = 0.5) -> Iterator[float]:
    """0.5, 1, 2, 4 ... capped at ``max_seconds`` (exponential backoff)."""
    d = first
    while True:
        yield d
        d = min(max_seconds, d * 2)


def retry(what: str, fn: Callable[[], T], k: KafkaSettings, *, on_retry: Callable[[], None] | None = None,
          stop: Callable[[], bool] | None = None, limit_seconds: float | None = None) -> T:
    """Call ``fn`` until it succeeds, with exponential backoff and one clear log line per attempt.

    Gives up with :class:`BrokerUnavailableError` after ``limit_seconds`` (default
    ``kafka.startup_retry_seconds``; 0 = never) or as soon as ``stop()`` is true.
    """
    limit = k.startup_retry_seconds if limit_seconds is None else limit_seconds
    start = time.monotonic()
    attempt = 0
    for delay in backoff_delays(k.retry_backoff_max_seconds):
        attempt += 1
        try:
            return fn()
        except InterruptedError as e:  # wait_for_broker saw the stop
            raise BrokerUnavailableError(f"{what}: stopped while waiting for broker {k.bootstrap_servers}") from e
        except (KafkaError, OSError, ValueError) as e:
            elapsed = time.monotonic() - start
            detail = str(e).removeprefix(f"{type(e).__name__}: ")
            why = e.reason if isinstance(e, BrokerUnreachableError) else \
                type(e).__name__ + (f": {detail}" if detail and detail != "None" else "")
            if limit and elapsed + delay > limit:
                raise BrokerUnavailableError(
                    f"{what}: broker {k.bootstrap_servers} unreachable after {attempt} attempts over "
                    f"{elapsed:.0f} s ({why}; kafka.startup_retry_seconds = {limit:g})") from e
            log.warning("%s: broker %s unreachable (%s); attempt %d, retrying in %.1f s", what,
                        k.bootstrap_servers, why, attempt, delay)
            if on_retry is not None:
                on_retry()
            if wait_unless(delay, stop, PROBE_SLICE_SECONDS):  # a stop cuts the backoff short
                raise BrokerUnavailableError(f"{what}: stopped while waiting for broker {k.bootstrap_servers}") from e
    raise AssertionError("unreachable")


def connect_admin(k: KafkaSettings, *, on_retry: Callable[[], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> KafkaAdminClient:
    def attempt() -> KafkaAdminClient:
        # a TCP probe first: an address nobody listens on fails at once (no client, no client log lines), and a
        # stop is seen within PROBE_SLICE_SECONDS
        wait_for_broker(k.bootstrap_servers or "", k.connect_timeout_ms / 1000.0, stop=stop,
                        option="kafka.connect_timeout_ms", once=True)
        admin = KafkaAdminClient(**client_options(k), bootstrap_timeout_ms=k.connect_timeout_ms)
        admin.list_topics()
        return admin

    return retry("connect", attempt, k, on_retry=on_retry, stop=stop)


def ensure_topics(admin: KafkaAdminClient, names: Sequence[str], layout: TopicLayout) -> dict[str, int]:
    """Create the missing ones of ``names`` as ``layout`` says (when ``layout.create``); returns topic ->
    partition count.

    Created topics get at least as many partitions as ``layout.match_partitions_of`` (the input, when among
    ``names``), so output partition = ledger partition = input partition; ``layout.compacted`` ones (the ledger)
    are created compacted.
    """
    wanted = list(dict.fromkeys(names))
    existing = set(admin.list_topics())
    counts = _partition_counts(admin, [n for n in wanted if n in existing])
    n_input = counts.get(layout.match_partitions_of or "", layout.partitions)
    missing = [n for n in wanted if n not in existing]
    replication = layout.replication(cluster_brokers(admin)) if missing and layout.create else 1
    to_create = [NewTopic(n, max(layout.partitions, n_input), replication,
                          topic_configs=layout.topic_config(n, replication))
                 for n in missing]
    if to_create and layout.create:
        try:
            admin.create_topics(to_create)
        except TopicAlreadyExistsError:
            pass
        isr = layout.replication_config(replication).get("min.insync.replicas", "the broker's default")
        log.info("created topics %s%s", ", ".join(f"{nt.name}({nt.num_partitions})" for nt in to_create),
                 f" (replication factor {replication}, min.insync.replicas {isr})" if replication > 1 else "")
        for nt in to_create:
            counts[nt.name] = nt.num_partitions
    elif to_create:
        log.warning("topics %s do not exist and topics.create is false", [nt.name for nt in to_create])
    return counts


def cluster_brokers(admin: KafkaAdminClient) -> int:
    """How many brokers the cluster has (its metadata's broker list; at least 1)."""
    return max(1, len(admin.describe_cluster().get("brokers") or ()))


def _partition_counts(admin: KafkaAdminClient, topics: Sequence[str]) -> dict[str, int]:
    if not topics:
        return {}
    out: dict[str, int] = {}
    for desc in admin.describe_topics(list(topics)):
        out[str(desc.get("name", desc.get("topic")))] = len(desc.get("partitions") or ())
    return out


def no_auto_create(client: Any) -> Any:
    """Stop a kafka-python client's metadata requests from creating topics: kafka-python 3.0 keeps its
    ``allow_auto_create_topics`` option but never hands it to the metadata object (docs/tansu.md), so a topic that
    is gone (deleted, or a broker that lost its data) would come back empty with the broker's default partition
    count, and the service would write into it before the broker guard sees the change (issue 17).  Returns
    ``client``."""
    for cluster in (getattr(client, "_metadata", None), getattr(client, "_cluster", None),
                    getattr(getattr(client, "_client", None), "cluster", None)):
        if cluster is not None and isinstance(getattr(cluster, "config", None), dict):
            cluster.config["allow_auto_create_topics"] = False
    return client


def make_consumer(k: KafkaSettings, *, group_id: str | None) -> KafkaConsumer:
    """A consumer of group ``group_id`` (None: no group) that never commits by itself and starts at the earliest
    offset when the group has none."""
    extra: dict[str, Any] = {}
    if k.group_instance_id and group_id is not None:
        extra["group_instance_id"] = k.group_instance_id
    return no_auto_create(KafkaConsumer(**extra,
        **client_options(k), group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=k.session_timeout_ms,
        heartbeat_interval_ms=min(k.heartbeat_interval_ms, max(100, k.session_timeout_ms // 3)),
        max_poll_interval_ms=k.max_poll_interval_ms, max_poll_records=k.max_poll_records,
        fetch_max_wait_ms=k.fetch_max_wait_ms, **fetch_limits(k),
    ))


def prepare_topics(k: KafkaSettings, names: Sequence[str], layout: TopicLayout, *, what: str = "create topics",
                   on_retry: Callable[[], None] | None = None, stop: Callable[[], bool] | None = None,
                   also: Callable[[KafkaAdminClient], None] | None = None) -> dict[str, int]:
    """Start-up of a path: connect (retrying), create the missing ones of ``names`` (:func:`ensure_topics`,
    retried as ``what``), run ``also`` with the admin client (e.g. a topic of another shape), close the admin
    client; returns topic -> partition count.  Raises :class:`BrokerUnavailableError` as :func:`retry` does."""
    admin = connect_admin(k, on_retry=on_retry, stop=stop)
    try:
        counts = retry(what, lambda: ensure_topics(admin, names, layout), k, stop=stop)
        if also is not None:
            also(admin)
        return counts
    finally:
        admin.close()
