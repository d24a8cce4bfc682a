"""Kafka clients of the service (kafka-python): connection with retry/backoff, topics (the ledger compacted), the
consumer, the partition reader recovery uses (ledger backwards, outputs forwards), and the error types of the Kafka
layer.  The producer is :mod:`stream_anon.service.producer`.

Kafka transactions are NOT used (Tansu shows aborted transactional records to ``read_committed`` consumers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import CorruptRecordError, KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from stream_anon.service.config import Config
from stream_anon.service.ledger import LedgerRecord
from stream_anon.service.recovery import LedgerScan

log = logging.getLogger(__name__)

T = TypeVar("T")


class BrokerUnavailableError(RuntimeError):
    """The broker could not be reached within ``kafka.startup_retry_seconds``, or the service was stopped while
    waiting for it (outputs not acknowledged: nothing is committed, a restart re-reads from the watermarks)."""


class ProducerFatalError(RuntimeError):
    """The producer client is in a fatal state (e.g. its idempotent producer id was fenced or could not be
    renewed): it cannot send again; close it and create a new one (``OutputProducer.reopen``)."""


class ProducerStuckError(ProducerFatalError):
    """The producer has not had a message acknowledged for ``service.producer_recovery_seconds`` (the client
    may never recover by itself, e.g. an idempotent producer after a broker restart): close it and create a new
    one."""


class MessageRejectedError(RuntimeError):
    """The broker or the client refused a message for good (too large, topic not authorized ...): re-sending it
    cannot succeed."""


def client_options(cfg: Config) -> dict[str, Any]:
    k = cfg.kafka
    return {"bootstrap_servers": k.bootstrap_servers, "client_id": k.client_id,
            "request_timeout_ms": k.request_timeout_ms, **k.security_options()}


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


def backoff_delays(max_seconds: float, first: float = 0.5) -> Iterator[float]:
    """0.5, 1, 2, 4 ... capped at ``max_seconds`` (exponential backoff)."""
    d = first
    while True:
        yield d
        d = min(max_seconds, d * 2)


def retry(what: str, fn: Callable[[], T], cfg: Config, *, on_retry: Callable[[], None] | None = None,
          stop: Callable[[], bool] | None = None, limit_seconds: float | None = None) -> T:
    """Call ``fn`` until it succeeds, with exponential backoff and one clear log line per attempt.

    Gives up with :class:`BrokerUnavailableError` after ``limit_seconds`` (default
    ``kafka.startup_retry_seconds``; 0 = never) or as soon as ``stop()`` is true.
    """
    limit = cfg.kafka.startup_retry_seconds if limit_seconds is None else limit_seconds
    start = time.monotonic()
    attempt = 0
    for delay in backoff_delays(cfg.kafka.retry_backoff_max_seconds):
        attempt += 1
        try:
            return fn()
        except (KafkaError, OSError, ValueError) as e:
            elapsed = time.monotonic() - start
            if limit and elapsed + delay > limit:
                raise BrokerUnavailableError(
                    f"{what}: broker {cfg.kafka.bootstrap_servers} unreachable after {attempt} attempts over "
                    f"{elapsed:.0f} s (kafka.startup_retry_seconds = {limit:g}): {e!r}") from e
            detail = str(e).removeprefix(f"{type(e).__name__}: ")
            log.warning("%s: broker %s unreachable (%s%s); attempt %d, retrying in %.1f s", what,
                        cfg.kafka.bootstrap_servers, type(e).__name__,
                        f": {detail}" if detail and detail != "None" else "", attempt, delay)
            if on_retry is not None:
                on_retry()
            if stop is not None and stop():
                raise BrokerUnavailableError(f"{what}: stopped while waiting for the broker") from e
            time.sleep(delay)
    raise AssertionError("unreachable")


def connect_admin(cfg: Config, *, on_retry: Callable[[], None] | None = None,
                  stop: Callable[[], bool] | None = None) -> KafkaAdminClient:
    def attempt() -> KafkaAdminClient:
        admin = KafkaAdminClient(**client_options(cfg), bootstrap_timeout_ms=cfg.kafka.connect_timeout_ms)
        admin.list_topics()
        return admin

    return retry("connect", attempt, cfg, on_retry=on_retry, stop=stop)


GAP_SECONDS = 5.0
"""A read that gets no record for this long while the broker answers takes the rest of its range as a gap (see
:meth:`PartitionReader._read`)."""

LEDGER_TOPIC_CONFIG = {"cleanup.policy": "compact"}
"""Topic configuration of the ledger (docs/threat-model.md, "Bounded growth")."""


def ensure_topics(admin: KafkaAdminClient, cfg: Config, names: Sequence[str] | None = None) -> dict[str, int]:
    """Create the missing ones of ``names`` (default: input, ledger, outputs and side topics) when
    ``topics.create``; returns topic -> partition count.

    Output topics and the ledger get at least as many partitions as the input, so output partition = ledger
    partition = input partition; the ledger is created compacted (:data:`LEDGER_TOPIC_CONFIG`).
    """
    t = cfg.topics
    ledger = t.ledger_topic()
    wanted = list(dict.fromkeys(names if names is not None else
                                [t.input, ledger, *t.outputs().values(), *t.side().values()]))
    existing = set(admin.list_topics())
    counts = _partition_counts(admin, [n for n in wanted if n in existing])
    n_input = counts.get(t.input, t.partitions)
    to_create = [NewTopic(n, max(t.partitions, n_input), t.replication_factor,
                          topic_configs=dict(LEDGER_TOPIC_CONFIG) if n == ledger else {})
                 for n in wanted if n not in existing]
    if to_create and t.create:
        try:
            admin.create_topics(to_create)
        except TopicAlreadyExistsError:
            pass
        log.info("created topics %s", ", ".join(f"{nt.name}({nt.num_partitions})" for nt in to_create))
        for nt in to_create:
            counts[nt.name] = nt.num_partitions
    elif to_create:
        log.warning("topics %s do not exist and topics.create is false", [nt.name for nt in to_create])
    return counts


def _partition_counts(admin: KafkaAdminClient, topics: Sequence[str]) -> dict[str, int]:
    if not topics:
        return {}
    out: dict[str, int] = {}
    for desc in admin.describe_topics(list(topics)):
        out[str(desc.get("name", desc.get("topic")))] = len(desc.get("partitions") or ())
    return out


def make_consumer(cfg: Config, *, group_id: str | None) -> KafkaConsumer:
    k = cfg.kafka
    extra: dict[str, Any] = {}
    if k.group_instance_id and group_id is not None:
        extra["group_instance_id"] = k.group_instance_id
    return no_auto_create(KafkaConsumer(**extra,
        **client_options(cfg), group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=k.session_timeout_ms,
        heartbeat_interval_ms=min(k.heartbeat_interval_ms, max(100, k.session_timeout_ms // 3)),
        max_poll_interval_ms=k.max_poll_interval_ms, max_poll_records=k.max_poll_records,
        fetch_max_bytes=k.fetch_max_bytes, max_partition_fetch_bytes=k.max_partition_fetch_bytes,
        fetch_max_wait_ms=k.fetch_max_wait_ms,
    ))


class PartitionReader:
    """Reads single partitions for recovery: the ledger backwards in chunks, output partitions forwards; no
    consumer group (it never disturbs the group's membership).  Also answers ``ping`` (is the broker there?).
    Its waits scale with ``kafka.request_timeout_ms`` (30 s by default: an end offset within one request timeout, a
    read that makes no progress for two), so a caller that must notice a stop quickly gives it a shorter one."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.request_timeout_s = cfg.kafka.request_timeout_ms / 1000.0
        self.consumer = no_auto_create(KafkaConsumer(
            **client_options(cfg), group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            max_partition_fetch_bytes=4 * 1048576, fetch_max_wait_ms=20))

    def close(self) -> None:
        self.consumer.close()

    def ping(self, topic: str, partition: int, timeout_ms: int) -> None:
        """One request the broker must answer (the partition's first offset): raises ``KafkaError`` (e.g.
        ``KafkaTimeoutError``) when it does not within ``timeout_ms``.  This client is in no consumer group,
        so asking never disturbs the group's membership or a rebalance in progress."""
        self.consumer.beginning_offsets([TopicPartition(topic, partition)], timeout_ms=timeout_ms)

    def bounds(self, topic: str, partition: int, timeout_s: float | None = None) -> tuple[int, int]:
        """(first offset, end offset) of a partition (the end from a fresh fetch's highwater: Tansu's
        ``end_offsets()`` is wrong); ``timeout_s`` defaults to the request timeout."""
        timeout_s = self.request_timeout_s if timeout_s is None else timeout_s
        tp = TopicPartition(topic, partition)
        c = self.consumer
        if tp in c.assignment():  # kafka-python keeps a partition's state (and its old highwater) on re-assignment
            c.assign([])
        c.assign([tp])
        begin = int(c.beginning_offsets([tp])[tp] or 0)
        c.seek(tp, begin)
        deadline = time.monotonic() + timeout_s
        while c.highwater(tp) is None:
            c.poll(timeout_ms=200, max_records=1)
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"no fetch response for {tp} within {timeout_s} s")
        return begin, int(c.highwater(tp))  # type: ignore[arg-type]

    def _read(self, tp: TopicPartition, lo: int, hi: int, max_records: int) -> list[Any]:
        """The records of ``tp`` in ``[lo, hi)`` (``hi`` at most the end offset).

        Offsets at the end of a partition can hold no record: Tansu on durable storage killed between writing a
        partition's watermark and the batch leaves such a gap (docs/tansu.md), and a fetch there returns nothing
        until later records are appended.  When no record comes for ``GAP_SECONDS`` while the broker answers
        (a ListOffsets request), the rest of the range is taken as such a gap (logged) instead of waiting forever.
        """
        c = self.consumer
        c.seek(tp, lo)
        got: list[Any] = []
        stall_s = 2 * self.request_timeout_s
        deadline = time.monotonic() + stall_s
        empty_since = time.monotonic()
        while c.position(tp) < hi:
            recs = c.poll(timeout_ms=500, max_records=max_records).get(tp, [])
            got.extend(r for r in recs if lo <= r.offset < hi)
            now = time.monotonic()
            if recs:
                deadline = now + stall_s
                empty_since = now
            elif now - empty_since > GAP_SECONDS and self._answers(tp):
                log.warning("%s: offsets [%d, %d) hold no records (a gap Tansu leaves when killed between writing a "
                            "partition's watermark and its batch): read as empty", tp, c.position(tp), hi)
                break
            elif now > deadline:
                raise KafkaTimeoutError(f"read of {tp} [{lo}, {hi}) made no progress for {stall_s:g} s")
        return got

    def _answers(self, tp: TopicPartition) -> bool:
        """Whether the broker answers a ListOffsets request for ``tp`` now (an empty fetch is then a gap)."""
        try:
            self.consumer.beginning_offsets([tp], timeout_ms=min(self.cfg.kafka.request_timeout_ms, 5000))
        except KafkaError:
            return False
        return True

    def scan_ledger(self, topic: str, partition: int, scan: LedgerScan, chunk: int) -> LedgerScan:
        """Feed ``scan`` with the ledger partition's records, last chunk first, until it is satisfied (recovery
        step b)."""
        tp = TopicPartition(topic, partition)
        begin, end = self.bounds(topic, partition)
        hi = end
        while hi > begin:
            lo = max(begin, hi - chunk)
            recs = self._read(tp, lo, hi, chunk)
            if scan.add_chunk([LedgerRecord(r.offset, r.key, r.value) for r in recs]):
                break
            hi = lo
        return scan

    def read_forward(self, topic: str, partition: int, start: int | None,
                     chunk: int) -> tuple[list[tuple[bytes | None, bytes | None]], int]:
        """(key, value) of every record of the partition from ``start`` (None: its beginning) to its end, and
        the end offset (recovery step d)."""
        tp = TopicPartition(topic, partition)
        begin, end = self.bounds(topic, partition)
        lo = begin if start is None else max(begin, start)
        out: list[tuple[bytes | None, bytes | None]] = []
        while lo < end:
            hi = min(end, lo + chunk)
            out.extend((r.key, r.value) for r in self._read(tp, lo, hi, chunk))
            lo = hi
        return out, end

    def first_readable(self, topic: str, partition: int, offset: int, timeout_s: float = 10.0) -> bool:
        """Whether the record at ``offset`` can be read (False: the client raises CorruptRecordError there).
        Leaves this reader positioned past ``offset`` (a kafka-python fetcher that raised must be moved on)."""
        tp = TopicPartition(topic, partition)
        c = self.consumer
        c.assign([tp])
        c.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                recs = c.poll(timeout_ms=200, max_records=1).get(tp, [])
                if recs:
                    return True
                if c.highwater(tp) is not None and offset >= int(c.highwater(tp)):  # type: ignore[arg-type]
                    return True  # nothing there to read
            return True
        except CorruptRecordError:
            return False
        finally:
            c.seek(tp, offset + 1)
