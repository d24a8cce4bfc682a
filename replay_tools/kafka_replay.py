"""Replay ADULT (or any CSV with a schema, or synthetic records) into a Kafka topic at a given rate.

Messages: value = the record as one compact JSON object (UTF-8), key = the record id (UTF-8).
Record ids are deterministic: ADULT's are ``adult-00000``... (line order of the file); with
``loop=N`` pass ``i >= 1`` re-sends every record with the id suffixed ``#i`` (``adult-00000#1``),
so ids stay unique across passes and pass 0 is byte-identical to a single replay.  ``shuffle``
permutes the records of every pass with a generator seeded by ``seed`` (a fresh permutation per
pass; the same seed gives the same order); ids belong to the records, not to positions.

Rate control: record ``i`` is due at ``start + i/rate`` (``rate=0``: as fast as the producer
goes; ~30k records/s with kafka-python on this machine).  The topic is created with ``partitions``
partitions if it does not exist (KafkaAdminClient); an existing topic is used as it is.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from replay_tools.progress import ProgressBar, RateLimiter

log = logging.getLogger(__name__)

DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    "max_in_flight_requests_per_connection": 5,
}


@dataclass
class ReplayStats:
    """What a replay did: records handed to the producer, acknowledged, failed; time and rates."""

    topic: str
    records_sent: int = 0
    records_acked: int = 0
    errors: int = 0
    seconds: float = 0.0
    target_rate: float = 0.0
    partitions: int = 0
    passes: int = 0
    shuffle_seed: int | None = None
    first_id: str | None = None
    last_id: str | None = None
    partition_counts: dict[int, int] = field(default_factory=dict)

    @property
    def rate_achieved(self) -> float:
        """Acknowledged records per second of wall time (including the final flush)."""
        return self.records_acked / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        target = f"{self.target_rate:,.0f} rec/s" if self.target_rate > 0 else "as fast as possible"
        seed = f", shuffle seed {self.shuffle_seed}" if self.shuffle_seed is not None else ""
        return (f"replayed {self.records_acked:,} records ({self.records_sent:,} sent, {self.errors} errors) to "
                f"{self.topic!r} ({self.partitions} partitions, {self.passes} pass(es){seed}) in {self.seconds:.2f} s: "
                f"{self.rate_achieved:,.0f} rec/s achieved, target {target}")


def loop_record_id(record_id: str, pass_index: int) -> str:
    """Id of a record re-sent on loop pass ``pass_index``: unchanged on pass 0, ``<id>#<i>`` after."""
    return record_id if pass_index == 0 else f"{record_id}#{pass_index}"


def ensure_topic(bootstrap_servers: str, topic: str, partitions: int = 1, *, replication_factor: int = 1,
                 client_config: Mapping[str, Any] | None = None, timeout_s: float = 15.0) -> int:
    """Create ``topic`` with ``partitions`` partitions if missing; return its partition count."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions: expected an integer >= 1, got {partitions!r}")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers, **dict(client_config or {}))
    try:
        if topic not in set(admin.list_topics()):
            try:
                admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor)])
            except TopicAlreadyExistsError:
                pass
        deadline = time.monotonic() + timeout_s
        while True:
            desc = admin.describe_topics([topic])
            parts = desc[0].get("partitions") or [] if desc else []
            if parts or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        if not parts:
            raise RuntimeError(f"topic {topic!r} has no partitions on {bootstrap_servers} after {timeout_s} s")
        if len(parts) != partitions:
            log.warning("topic %r exists with %d partitions (asked for %d); using it as it is",
                        topic, len(parts), partitions)
        return len(parts)
    finally:
        admin.close()


def _passes(records: Iterable[Mapping[str, Any]], loop: int, shuffle: bool,
            rng: np.random.Generator | None) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(pass index, record) for every pass; materializes the records only if several passes or a shuffle need it."""
    if loop == 1 and not shuffle:
        for r in records:
            yield 0, r
        return
    items: Sequence[Mapping[str, Any]] = records if isinstance(records, Sequence) else list(records)
    for p in range(loop):
        if shuffle:
            assert rng is not None
            for i in rng.permutation(len(items)):
                yield p, items[int(i)]
        else:
            for r in items:
                yield p, r


def replay_records(records: Iterable[Mapping[str, Any]], topic: str, bootstrap_servers: str, rate: float = 0.0, *,
                   loop: int = 1, shuffle: bool = False, seed: int | None = None, partitions: int = 1,
                   create_topic: bool = True, id_field: str = "id", limit: int | None = None,
                   progress: bool = False, total: int | None = None, producer: Any = None,
                   producer_config: Mapping[str, Any] | None = None, flush_timeout_s: float = 60.0) -> ReplayStats:
    """Send ``records`` to ``topic`` (JSON value, key = ``record[id_field]``) at ``rate`` records/s (0 = max).

    ``loop`` passes (ids suffixed ``#i`` on pass ``i >= 1``), optional ``shuffle`` with ``seed``
    (``None``: a seed is drawn from OS entropy and reported in the stats), ``limit`` caps the records
    sent in total (useful with an unbounded synthetic iterator).  ``producer`` may be an existing
    KafkaProducer (not closed here); otherwise one is made with ``DEFAULT_PRODUCER_CONFIG`` updated by
    ``producer_config`` (security options pass through to kafka-python).  Returns after a flush:
    ``records_acked`` counts the broker's acknowledgements.
    """
    if not isinstance(loop, int) or isinstance(loop, bool) or loop < 1:
        raise ValueError(f"loop: expected an integer >= 1, got {loop!r}")
    if rate < 0:
        raise ValueError(f"rate: expected records/s >= 0 (0 = as fast as possible), got {rate!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit: expected an integer >= 0, got {limit!r}")
    from kafka import KafkaProducer

    shuffle_seed: int | None = None
    rng = None
    if shuffle:
        shuffle_seed = int(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        rng = np.random.default_rng(shuffle_seed)
    client_config = {k: v for k, v in (producer_config or {}).items()
                     if k.startswith(("security_", "sasl_", "ssl_"))}
    n_partitions = ensure_topic(bootstrap_servers, topic, partitions, client_config=client_config) \
        if create_topic else partitions
    own_producer = producer is None
    if own_producer:
        producer = KafkaProducer(bootstrap_servers=bootstrap_servers,
                                 **{**DEFAULT_PRODUCER_CONFIG, **dict(producer_config or {})})
    stats = ReplayStats(topic=topic, target_rate=float(rate), partitions=n_partitions, shuffle_seed=shuffle_seed)
    if total is None and isinstance(records, Sequence):
        total = len(records) * loop
    if total is not None and limit is not None:
        total = min(total, limit)
    bar = ProgressBar(total, label=f"replay -> {topic}", enabled=progress)
    limiter = RateLimiter(rate)
    counts = stats.partition_counts

    def on_ok(md: Any) -> None:
        stats.records_acked += 1
        counts[md.partition] = counts.get(md.partition, 0) + 1

    def on_error(exc: BaseException) -> None:
        stats.errors += 1
        if stats.errors <= 5:
            log.error("produce to %r failed: %s", topic, exc)

    start = time.perf_counter()
    limiter.start = start
    sent = 0
    last_pass = -1
    try:
        for p, rec in _passes(records, loop, shuffle, rng):
            if limit is not None and sent >= limit:
                break
            last_pass = p
            rid = rec.get(id_field)
            if rid is None:
                raise ValueError(f"record #{sent} has no id field {id_field!r}: {dict(rec)!r}")
            rid = loop_record_id(str(rid), p)
            if p:
                rec = {**rec, id_field: rid}
            limiter.wait(sent)
            value = json.dumps(rec, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
            producer.send(topic, key=rid.encode("utf-8"), value=value).add_callback(on_ok).add_errback(on_error)
            if sent == 0:
                stats.first_id = rid
            stats.last_id = rid
            sent += 1
            if sent & 255 == 0:
                stats.records_sent = sent
                bar.update(stats.records_acked if rate == 0 else sent)
        producer.flush(timeout=flush_timeout_s)
    finally:
        stats.records_sent = sent
        stats.passes = last_pass + 1
        stats.seconds = time.perf_counter() - start
        bar.update(sent)
        bar.close()
        if own_producer:
            producer.close(timeout=10)
    return stats


def read_topic(bootstrap_servers: str, topic: str, *, expected: int | None = None, timeout_s: float = 30.0,
               idle_s: float = 2.0) -> list[tuple[int, int, bytes, bytes]]:
    """Read a topic from the beginning: ``[(partition, offset, key, value), ...]`` (key ``b""`` if none).

    Stops when ``expected`` messages were read, or (without ``expected``) when every partition's
    position reached its ``highwater()`` and nothing arrived for ``idle_s`` (Tansu's ``end_offsets``
    is wrong, so highwater from the fetch responses is used), or at ``timeout_s``.
    """
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False, group_id=None,
                             auto_offset_reset="earliest", fetch_max_bytes=16 * 1024 * 1024)
    try:
        parts = consumer.partitions_for_topic(topic)
        deadline = time.monotonic() + timeout_s
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            raise RuntimeError(f"topic {topic!r} not found on {bootstrap_servers}")
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[tuple[int, int, bytes, bytes]] = []
        last_data = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200, max_records=10000)
            for tp, msgs in batch.items():
                out.extend((tp.partition, m.offset, m.key or b"", m.value) for m in msgs)
            if batch:
                last_data = time.monotonic()
            if expected is not None:
                if len(out) >= expected:
                    break
                continue
            hw = [consumer.highwater(tp) for tp in tps]
            caught_up = all(h is not None and consumer.position(tp) >= h for tp, h in zip(tps, hw, strict=True))
            if caught_up and time.monotonic() - last_data >= idle_s:
                break
        return out
    finally:
        consumer.close()
