"""Kafka clients of the service (kafka-python): connection with retry/backoff, topics, a producer that
never drops a message, and the backward reader recovery uses.

Producer: ``acks=all`` and the idempotent producer (kafka-python >= 2.1 enables it by default and Tansu
answers InitProducerId; checked by ``tests/test_service_run.py``), so producer retries neither duplicate nor
reorder messages within a partition.  Kafka transactions are NOT used.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from stream_anon.service.config import Config
from stream_anon.service.pipeline import OutputMessage, ReadBackScan

log = logging.getLogger(__name__)


class BrokerUnavailableError(RuntimeError):
    """The broker could not be reached within ``kafka.startup_retry_seconds``."""


def client_options(cfg: Config) -> dict[str, Any]:
    k = cfg.kafka
    return {"bootstrap_servers": k.bootstrap_servers, "client_id": k.client_id,
            "request_timeout_ms": k.request_timeout_ms, **k.security_options()}


def backoff_delays(max_seconds: float, first: float = 0.5) -> Iterator[float]:
    """0.5, 1, 2, 4 ... capped at ``max_seconds`` (exponential backoff)."""
    d = first
    while True:
        yield d
        d = min(max_seconds, d * 2)


def retry(what: str, fn: Callable[[], Any], cfg: Config, *, on_retry: Callable[[], None] | None = None,
          stop: Callable[[], bool] | None = None, limit_seconds: float | None = None) -> Any:
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


def connect_admin(cfg: Config, **kw: Any) -> KafkaAdminClient:
    def attempt() -> KafkaAdminClient:
        admin = KafkaAdminClient(**client_options(cfg), bootstrap_timeout_ms=cfg.kafka.connect_timeout_ms)
        admin.list_topics()
        return admin

    return retry("connect", attempt, cfg, **kw)


def ensure_topics(admin: KafkaAdminClient, cfg: Config, *, side: bool = True) -> dict[str, int]:
    """Create missing topics (when ``topics.create``); returns topic -> partition count.

    Output topics get at least as many partitions as the input, so output partition = input partition.
    """
    t = cfg.topics
    wanted = [t.input, *t.outputs().values(), *(t.side().values() if side else ())]
    existing = set(admin.list_topics())
    counts = _partition_counts(admin, [n for n in wanted if n in existing])
    n_input = counts.get(t.input, t.partitions)
    to_create = [NewTopic(n, max(t.partitions, n_input), t.replication_factor) for n in wanted if n not in existing]
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
    return KafkaConsumer(**extra,
        **client_options(cfg), group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest",
        session_timeout_ms=k.session_timeout_ms,
        heartbeat_interval_ms=min(k.heartbeat_interval_ms, max(100, k.session_timeout_ms // 3)),
        max_poll_interval_ms=k.max_poll_interval_ms, max_poll_records=k.max_poll_records,
        fetch_max_bytes=k.fetch_max_bytes, max_partition_fetch_bytes=k.max_partition_fetch_bytes,
        fetch_max_wait_ms=k.fetch_max_wait_ms,
    )


def make_producer(cfg: Config) -> KafkaProducer:
    k = cfg.kafka
    opts: dict[str, Any] = dict(acks="all", linger_ms=k.linger_ms, batch_size=k.batch_size,
                                max_request_size=k.max_request_size, enable_idempotence=k.enable_idempotence)
    if k.compression_type:
        opts["compression_type"] = k.compression_type
    return KafkaProducer(**client_options(cfg), **opts)


class ReliableProducer:
    """Sends output messages (partition = source partition mod topic partitions) and, on ``flush``, waits
    until every one is acknowledged; failed sends are retried with backoff, never dropped."""

    def __init__(self, producer: KafkaProducer, partition_counts: dict[str, int], cfg: Config,
                 on_error: Callable[[str], None] | None = None, stop: Callable[[], bool] | None = None) -> None:
        self.producer = producer
        self.partition_counts = partition_counts
        self.cfg = cfg
        self.on_error = on_error
        self.stop = stop
        self._pending: list[tuple[OutputMessage, Any]] = []

    def partition_of_topic(self, topic: str, src_partition: int) -> int:
        n = self.partition_counts.get(topic)
        if n is None:
            parts = self.producer.partitions_for(topic)
            n = len(parts) if parts else 1
            self.partition_counts[topic] = n
        return src_partition % n

    def partition_of(self, m: OutputMessage) -> int:
        return self.partition_of_topic(m.topic, m.src_partition)

    def send(self, messages: Sequence[OutputMessage]) -> None:
        send = self.producer.send
        for m in messages:
            fut = send(m.topic, value=m.value, key=m.key, partition=self.partition_of(m), headers=list(m.headers))
            self._pending.append((m, fut))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> int:
        """Block until every message sent so far is acknowledged; returns how many were.

        Waits in slices of ``kafka.request_timeout_ms``: while the broker does not answer (down, stalled,
        network partition) it logs one warning per slice and keeps waiting for the same in-flight messages
        (the producer retries them itself; re-sending a message that is still in flight could duplicate it).
        Messages whose send failed are re-sent with exponential backoff, never dropped.
        """
        delays = backoff_delays(self.cfg.kafka.retry_backoff_max_seconds)
        wait_s = max(1.0, self.cfg.kafka.request_timeout_ms / 1000.0)
        t0 = time.monotonic()
        stalled = False
        acked = 0
        failed: list[OutputMessage] = []
        while self._pending:
            try:
                self.producer.flush(timeout=wait_s)
            except KafkaError as e:  # KafkaTimeoutError: not everything acknowledged within wait_s
                log.debug("producer flush: %r", e)
            waiting: list[tuple[OutputMessage, Any]] = []
            for m, fut in self._pending:
                if not fut.is_done:
                    waiting.append((m, fut))
                elif fut.failed():
                    failed.append(m)
                    log.warning("produce to %s failed (%r); will retry", m.topic, fut.exception)
                    if self.on_error is not None:
                        self.on_error(m.topic)
                else:
                    acked += 1
            self._pending = waiting
            if (waiting or failed) and self.stop is not None and self.stop():
                raise BrokerUnavailableError(f"{len(waiting) + len(failed)} output messages not acknowledged "
                                             f"at shutdown")
            if waiting:
                stalled = True
                log.warning("broker %s has not acknowledged %d output message(s) for %.0f s (unreachable or "
                            "stalled): waiting, the producer retries them; watermarks are not committed until "
                            "they are acknowledged", self.cfg.kafka.bootstrap_servers, len(waiting),
                            time.monotonic() - t0)
            elif failed:  # re-sent in their order once nothing else is in flight
                d = next(delays)
                log.warning("%d output messages not acknowledged; re-sending in %.1f s", len(failed), d)
                time.sleep(d)
                self.send(failed)
                failed = []
        if stalled:
            log.warning("broker %s acknowledged the held output messages after %.0f s: resuming",
                        self.cfg.kafka.bootstrap_servers, time.monotonic() - t0)
        return acked


class OutputReader:
    """Reads output-topic partitions backwards in chunks (recovery read-back); no consumer group."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.consumer = KafkaConsumer(**client_options(cfg), group_id=None, enable_auto_commit=False,
                                      auto_offset_reset="earliest", max_partition_fetch_bytes=4 * 1048576,
                                      fetch_max_wait_ms=20)

    def close(self) -> None:
        self.consumer.close()

    def ping(self, topic: str, partition: int, timeout_ms: int) -> None:
        """One request the broker must answer (the partition's first offset): raises ``KafkaError`` (e.g.
        ``KafkaTimeoutError``) when it does not within ``timeout_ms``.  This client is in no consumer group,
        so asking never disturbs the group's membership or a rebalance in progress."""
        self.consumer.beginning_offsets([TopicPartition(topic, partition)], timeout_ms=timeout_ms)

    def _bounds(self, tp: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
        c = self.consumer
        c.assign([tp])
        begin = int(c.beginning_offsets([tp])[tp] or 0)
        c.seek(tp, begin)
        deadline = time.monotonic() + timeout_s
        while c.highwater(tp) is None:  # Tansu: end_offsets() is wrong; highwater comes with a fetch
            c.poll(timeout_ms=200, max_records=1)
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"read-back: no fetch response for {tp} within {timeout_s} s")
        return begin, int(c.highwater(tp))

    def scan(self, topic: str, out_partition: int, scan: ReadBackScan, chunk: int) -> ReadBackScan:
        """Feed ``scan`` with the partition's messages, last chunk first, until it is satisfied."""
        tp = TopicPartition(topic, out_partition)
        begin, end = self._bounds(tp)
        c = self.consumer
        hi = end
        while hi > begin:
            lo = max(begin, hi - chunk)
            c.seek(tp, lo)
            got: list[tuple[bytes | None, Sequence[tuple[str, bytes]]]] = []
            deadline = time.monotonic() + 60.0
            while True:
                recs = c.poll(timeout_ms=500, max_records=chunk).get(tp, [])
                for r in recs:
                    if lo <= r.offset < hi:
                        got.append((r.value, r.headers or ()))
                if c.position(tp) >= hi:
                    break
                if time.monotonic() > deadline:
                    raise KafkaTimeoutError(f"read-back of {tp} [{lo}, {hi}) made no progress for 60 s")
            if scan.add_chunk(got):
                break
            hi = lo
        return scan
