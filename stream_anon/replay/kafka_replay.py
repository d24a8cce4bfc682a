"""Replay ADULT (or any CSV with a schema, or synthetic records) into a Kafka topic at a given rate.

Messages: value = the record as one compact JSON object (UTF-8), key = the record id (UTF-8), read from
the field ``id_field`` (the schema's ``record_id``; ``None`` = the records carry no id: no key).
Record ids are deterministic: ADULT's are ``adult-00000``... (line order of the file); with
``loop=N`` pass ``i >= 1`` re-sends every record with the id suffixed ``#i`` (``adult-00000#1``),
so ids stay unique across passes and pass 0 is byte-identical to a single replay.  ``shuffle``
permutes the records of every pass with a generator seeded by ``seed`` (a fresh permutation per
pass; the same seed gives the same order); ids belong to the records, not to positions.

Rate control: record ``i`` is due at ``start + i/rate`` (``rate=0``: as fast as the producer
goes; ~30k records/s with kafka-python on this machine).  The topic is created with ``partitions``
partitions if it does not exist (KafkaAdminClient); an existing topic is used as it is.

End of stream (``end_of_stream=True``, the command line's ``--flush``): once every record is
acknowledged, the control message of the service (header ``stream-anon-control: flush``, empty value)
is sent to every partition of the topic, so the service releases or suppresses what it still buffers.
It goes out only after the records' acknowledgements, so it is behind every record in its partition.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError, TopicAlreadyExistsError

from stream_anon.core.validation import require_int
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.kafka_io.address import BootstrapAddressError, wait_for_broker
from stream_anon.kafka_io.address import BrokerUnreachableError as AddressUnreachableError
from stream_anon.kafka_io.clients import cluster_brokers
from stream_anon.kafka_io.reader import caught_up, fetched_ends
from stream_anon.kafka_io.settings import TopicLayout
from stream_anon.replay.interrupts import InterruptGuard, ReplayInterrupted
from stream_anon.replay.progress import ProgressBar, RateLimiter

log = logging.getLogger(__name__)

DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 5,
    "batch_size": 256 * 1024,
    "max_in_flight_requests_per_connection": 5,
}
DEFAULT_CONNECT_TIMEOUT_S = 30.0


class BrokerUnreachableError(RuntimeError):
    """No Kafka broker answered at the bootstrap address within the connect timeout, or it stopped answering
    while the topic was being checked or created."""


class ReplayInputError(ValueError):
    """A record cannot be replayed as given (e.g. it lacks the record id field)."""


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
    end_of_stream_partitions: list[int] = field(default_factory=list)  # partitions the flush marker reached
    interrupted: str | None = None  # the signal that stopped the replay (SIGINT, SIGTERM), if any
    flush_timed_out: bool = False  # the final producer flush did not finish in time
    end_of_stream_cut: bool = False  # interrupted while sending the end-of-stream markers
    unconfirmed: int = 0  # "acknowledged" with offset -1: maybe not stored (not counted in records_acked)
    stored: int | None = None  # records of this replay the broker holds, read back (when acks left doubt)

    @property
    def rate_achieved(self) -> float:
        """Acknowledged records per second of wall time (including the final flush)."""
        return self.records_acked / self.seconds if self.seconds > 0 else 0.0

    @property
    def unacknowledged(self) -> int:
        """Records handed to the producer with neither an acknowledgement nor an error."""
        return max(self.records_sent - self.records_acked - self.unconfirmed - self.errors, 0)

    @property
    def complete(self) -> bool:
        """Every record sent is stored: acknowledged with an offset, or (acknowledged without one, or failed)
        found when read back."""
        held = self.stored if self.stored is not None else self.records_acked
        return held == self.records_sent and not self.unacknowledged

    def summary(self) -> str:
        target = f"{self.target_rate:,.0f} rec/s" if self.target_rate > 0 else "as fast as possible"
        seed = f", shuffle seed {self.shuffle_seed}" if self.shuffle_seed is not None else ""
        eos = (f"; end-of-stream flush sent to {len(self.end_of_stream_partitions)} partition(s)"
               if self.end_of_stream_partitions else "")
        late = f"; {self.unacknowledged:,} not acknowledged in time" if self.unacknowledged else ""
        doubt = (f", {self.unconfirmed:,} acknowledged without an offset (maybe not stored)" if self.unconfirmed
                 else "")
        held = self.stored if self.stored is not None else self.records_acked
        back = (f"; read back: the broker holds {self.stored:,} of the {self.records_sent:,} records sent"
                if self.stored is not None else "")
        return (f"replayed {held:,} records ({self.records_sent:,} sent, {self.records_acked:,} acknowledged with an "
                f"offset{doubt}, {self.errors} errors) to {self.topic!r} ({self.partitions} partitions, {self.passes} "
                f"pass(es){seed}) in {self.seconds:.2f} s: {self.rate_achieved:,.0f} rec/s achieved, target "
                f"{target}{eos}{late}{back}")

    def interrupted_summary(self) -> str:
        """One line for a replay stopped by a signal."""
        eos = ("end-of-stream flush cut short: some partitions may have no marker" if self.end_of_stream_cut
               else "no end-of-stream flush sent")
        return (f"replay interrupted by {self.interrupted}: {self.records_sent:,} records sent to {self.topic!r}, "
                f"{self.records_acked:,} acknowledged by the broker, {self.errors} errors ({eos})")


def encode_record(record: Mapping[str, Any]) -> bytes:
    """The message value of a record: one compact JSON object, UTF-8 (non-ASCII characters kept as they are)."""
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def loop_record_id(record_id: str, pass_index: int) -> str:
    """Id of a record re-sent on loop pass ``pass_index``: unchanged on pass 0, ``<id>#<i>`` after."""
    return record_id if pass_index == 0 else f"{record_id}#{pass_index}"


def _unreachable(bootstrap_servers: str, timeout_s: float, e: BaseException) -> BrokerUnreachableError:
    return BrokerUnreachableError(f"no Kafka broker reachable at {bootstrap_servers} within {timeout_s:g} s "
                                  f"({e})")


def reachable(bootstrap_servers: str, connect_timeout_s: float) -> None:
    """The address checked (:class:`ReplayInputError` when malformed: before anything connects) and a broker
    accepting connections there within ``connect_timeout_s`` (:class:`BrokerUnreachableError` otherwise, one line
    naming the address; a Ctrl-C ends the wait at once): :func:`stream_anon.kafka_io.address.wait_for_broker`."""
    try:
        wait_for_broker(bootstrap_servers, connect_timeout_s)
    except BootstrapAddressError as e:
        raise ReplayInputError(f"--bootstrap-servers: {e}") from None
    except AddressUnreachableError as e:
        raise BrokerUnreachableError(str(e)) from None


def make_producer(bootstrap_servers: str, producer_config: Mapping[str, Any] | None = None, *,
                  connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> KafkaProducer:
    """A KafkaProducer with ``DEFAULT_PRODUCER_CONFIG`` updated by ``producer_config``;
    :class:`BrokerUnreachableError` if no broker answers within ``connect_timeout_s``."""
    reachable(bootstrap_servers, connect_timeout_s)
    config = {**DEFAULT_PRODUCER_CONFIG, "bootstrap_timeout_ms": int(connect_timeout_s * 1000),
              **dict(producer_config or {})}
    try:
        return KafkaProducer(bootstrap_servers=bootstrap_servers, **config)
    except (KafkaTimeoutError, KafkaConnectionError) as e:
        raise _unreachable(bootstrap_servers, connect_timeout_s, e) from None


def _admin(bootstrap_servers: str, client_config: Mapping[str, Any] | None,
           connect_timeout_s: float) -> KafkaAdminClient:
    reachable(bootstrap_servers, connect_timeout_s)
    try:
        return KafkaAdminClient(bootstrap_servers=bootstrap_servers,
                                **{"bootstrap_timeout_ms": int(connect_timeout_s * 1000), **dict(client_config or {})})
    except (KafkaTimeoutError, KafkaConnectionError) as e:
        raise _unreachable(bootstrap_servers, connect_timeout_s, e) from None


def topic_exists(bootstrap_servers: str, topic: str, *, client_config: Mapping[str, Any] | None = None,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> bool:
    """Whether ``topic`` exists (:class:`BrokerUnreachableError` if no broker answers)."""
    admin = _admin(bootstrap_servers, client_config, connect_timeout_s)
    try:
        return topic in set(admin.list_topics())
    finally:
        admin.close()


def ensure_topic(bootstrap_servers: str, topic: str, partitions: int = 1, *, replication_factor: int | None = None,
                 client_config: Mapping[str, Any] | None = None, timeout_s: float = 15.0,
                 connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S) -> int:
    """Create ``topic`` with ``partitions`` partitions if missing; return its partition count.

    ``replication_factor`` None: as the service creates its topics (:class:`~stream_anon.kafka_io.settings.TopicLayout`:
    the cluster's broker count up to 3, ``min.insync.replicas`` 2 with 3 replicas).

    :class:`BrokerUnreachableError` if no broker answers within ``connect_timeout_s``, or if it goes away
    before the topic is known (one line for the operator, not a client library's traceback).
    """
    partitions = require_int("partitions", partitions, low=1)
    admin = _admin(bootstrap_servers, client_config, connect_timeout_s)
    try:
        if topic not in set(admin.list_topics()):
            try:
                layout = TopicLayout(replication_factor=replication_factor)
                replication = layout.replication(cluster_brokers(admin))
                admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=replication,
                                              topic_configs=layout.replication_config(replication))])
            except TopicAlreadyExistsError:
                pass
        deadline = time.monotonic() + timeout_s
        while True:
            desc = admin.describe_topics([topic])
            parts = desc[0].get("partitions") or [] if desc else []
            if parts or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    except (KafkaError, OSError) as e:
        raise BrokerUnreachableError(f"the broker at {bootstrap_servers} stopped answering while topic {topic!r} "
                                     f"was checked or created: {type(e).__name__}: {e}") from None
    finally:
        admin.close()
    if not parts:
        raise RuntimeError(f"topic {topic!r} has no partitions on {bootstrap_servers} after {timeout_s} s")
    if len(parts) != partitions:
        log.warning("topic %r exists with %d partitions (asked for %d); using it as it is",
                    topic, len(parts), partitions)
    return len(parts)


def send_end_of_stream(producer: KafkaProducer, topic: str, *, timeout_s: float = 60.0) -> list[int]:
    """Send the service's end-of-stream control message (header ``stream-anon-control: flush``, empty value,
    no key) to every partition of ``topic``; return the partitions, once the broker acknowledged each.

    Call it after the records were acknowledged (``producer.flush()``), so that the marker is behind every
    record in its partition.  Raises ``KafkaTimeoutError`` if the markers are not acknowledged in time, or
    the send's error.
    """
    parts = sorted(producer.partitions_for(topic) or ())
    if not parts:
        raise RuntimeError(f"topic {topic!r} has no partitions: no end-of-stream marker sent")
    futures = [producer.send(topic, value=b"", partition=p, headers=[(CONTROL_HEADER, CONTROL_FLUSH)]) for p in parts]
    producer.flush(timeout=timeout_s)
    for f in futures:
        f.get(timeout=timeout_s)
    return parts


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
                   create_topic: bool = True, id_field: str | None = "id", limit: int | None = None,
                   progress: bool = False, total: int | None = None, producer: Any = None,
                   producer_config: Mapping[str, Any] | None = None, flush_timeout_s: float = 60.0,
                   end_of_stream: bool = False, connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
                   interrupts: InterruptGuard | None = None, interrupt_flush_timeout_s: float = 5.0) -> ReplayStats:
    """Send ``records`` to ``topic`` (JSON value, key = ``record[id_field]``) at ``rate`` records/s (0 = max).

    ``id_field``: the field holding the record id (the schema's ``record_id``); ``None``: the records carry
    no id, they are sent without a key (and loop passes cannot suffix ids).  ``loop`` passes (ids suffixed
    ``#i`` on pass ``i >= 1``), optional ``shuffle`` with ``seed`` (``None``: a seed is drawn from OS
    entropy and reported in the stats), ``limit`` caps the records sent in total (useful with an unbounded
    synthetic iterator).  ``producer`` may be an existing KafkaProducer (not closed here); otherwise one is
    made with ``DEFAULT_PRODUCER_CONFIG`` updated by ``producer_config`` (security options pass through to
    kafka-python).  Returns after a flush: ``records_acked`` counts the broker's acknowledgements.
    ``end_of_stream``: then send the end-of-stream control message to every partition
    (:func:`send_end_of_stream`).

    Errors: :class:`BrokerUnreachableError` (no broker within ``connect_timeout_s``),
    :class:`ReplayInputError` (a record without its id field).  A :class:`ReplayInterrupted` (raised by the
    signal handlers of ``interrupts``, the command line's) stops the replay: what was handed to the producer is
    flushed for at most ``interrupt_flush_timeout_s`` and the stats come back with ``interrupted`` set.
    """
    loop = require_int("loop", loop, low=1)
    if rate < 0:
        raise ValueError(f"rate: expected records/s >= 0 (0 = as fast as possible), got {rate!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit: expected an integer >= 0, got {limit!r}")
    if loop > 1 and id_field is None:
        raise ValueError("loop: passes after the first need a record id to suffix (id_field is None)")

    shuffle_seed: int | None = None
    rng = None
    if shuffle:
        shuffle_seed = int(seed) if seed is not None else int(np.random.SeedSequence().generate_state(1)[0])
        rng = np.random.default_rng(shuffle_seed)
    client_config = {k: v for k, v in (producer_config or {}).items()
                     if k.startswith(("security_", "sasl_", "ssl_"))}
    stats = ReplayStats(topic=topic, target_rate=float(rate), partitions=partitions, shuffle_seed=shuffle_seed)
    if total is None and isinstance(records, Sequence):
        total = len(records) * loop
    if total is not None and limit is not None:
        total = min(total, limit)
    counts = stats.partition_counts

    doubtful: list[bytes | None] = []  # keys of the records acknowledged without an offset or failed

    def on_ok(key: bytes | None, md: Any) -> None:
        if md.offset is None or md.offset < 0:  # Tansu's DUPLICATE_SEQUENCE_NUMBER answer: maybe not stored
            stats.unconfirmed += 1
            doubtful.append(key)
            return
        stats.records_acked += 1
        counts[md.partition] = counts.get(md.partition, 0) + 1

    def on_error(key: bytes | None, exc: BaseException) -> None:
        stats.errors += 1
        doubtful.append(key)
        if stats.errors <= 5:
            log.error("produce to %r failed: %s", topic, exc)

    own_producer = producer is None
    bar: ProgressBar | None = None
    start = time.perf_counter()
    sent = 0
    last_pass = -1
    try:
        if create_topic:
            stats.partitions = ensure_topic(bootstrap_servers, topic, partitions, client_config=client_config,
                                            connect_timeout_s=connect_timeout_s)
        # where this replay's records begin (a read-back after doubtful acknowledgements starts there); with a
        # producer of the caller's, its own bootstrap servers, and the read-back (if any) from the beginning
        read_bs = bootstrap_servers if own_producer else _bootstrap_of(producer)
        before: dict[int, int] = {}
        if own_producer:
            try:
                before = topic_ends(bootstrap_servers, topic, client_config)
            except (KafkaError, OSError) as e:  # (an unreachable broker is reported by the producer just below)
                log.debug("replay: ends of %r not read: %r", topic, e)
        if own_producer:
            producer = make_producer(bootstrap_servers, producer_config, connect_timeout_s=connect_timeout_s)
        bar = ProgressBar(total, label=f"replay -> {topic}", enabled=progress)
        limiter = RateLimiter(rate)
        start = time.perf_counter()
        send = producer.send
        for p, rec in _passes(records, loop, shuffle, rng):
            if limit is not None and sent >= limit:
                break
            last_pass = p
            key: bytes | None = None
            rid: str | None = None
            if id_field is not None:
                raw = rec.get(id_field)
                if raw is None:
                    raise ReplayInputError(f"record #{sent} has no record id field {id_field!r} (fields: "
                                           f"{sorted(rec)}); the id field comes from the schema's record_id")
                rid = loop_record_id(str(raw), p)
                if p:
                    rec = {**rec, id_field: rid}
                key = rid.encode("utf-8")
            limiter.wait(sent)
            value = encode_record(rec)
            if interrupts is not None:
                interrupts.deferring = True  # a signal now is raised after the send: the count stays exact
            send(topic, key=key, value=value).add_callback(on_ok, key).add_errback(on_error, key)
            sent += 1
            if sent == 1:
                stats.first_id = rid
            stats.last_id = rid
            if interrupts is not None:
                interrupts.deferring = False
                interrupts.check()
            if sent & 255 == 0:
                stats.records_sent = sent
                bar.update(stats.records_acked if rate == 0 else sent)
        try:
            producer.flush(timeout=flush_timeout_s)
        except KafkaTimeoutError:
            stats.flush_timed_out = True
            log.error("replay: %d records not acknowledged within %g s", sent - stats.records_acked - stats.errors,
                      flush_timeout_s)
        if doubtful and read_bs:  # acknowledgements without an offset, or failures: what does the broker hold?
            stats.stored = stats.records_acked + found_in(read_bs, topic, before, doubtful, client_config)
        if end_of_stream and not stats.flush_timed_out:
            stats.end_of_stream_cut = True  # until every marker is acknowledged
            stats.end_of_stream_partitions = send_end_of_stream(producer, topic, timeout_s=flush_timeout_s)
            stats.end_of_stream_cut = False
    except ReplayInterrupted as e:
        if interrupts is not None:
            interrupts.deferring = False
        stats.interrupted = e.signal_name
        if producer is not None:
            try:  # deliver what was handed over (bounded); a second signal skips it
                producer.flush(timeout=interrupt_flush_timeout_s)
            except (ReplayInterrupted, KafkaTimeoutError):
                pass
    finally:
        stats.records_sent = sent
        stats.passes = last_pass + 1
        stats.seconds = time.perf_counter() - start
        if bar is not None:
            bar.update(sent)
            bar.close()
        if own_producer and producer is not None:
            try:
                close_producer(producer, interrupt_flush_timeout_s if stats.interrupted else 10)
            except ReplayInterrupted:
                pass
            except KafkaTimeoutError:  # the broker went away: what it did not acknowledge is counted as not acked
                if not stats.flush_timed_out:  # else its line was logged already
                    stats.flush_timed_out = True
                    log.error("replay: broker %s stopped answering: %d records not acknowledged", bootstrap_servers,
                              sent - stats.records_acked - stats.errors)
    return stats


def _bootstrap_of(producer: Any) -> str | None:
    """The bootstrap servers of a kafka-python producer given by the caller (None: not known)."""
    servers = getattr(producer, "config", {}).get("bootstrap_servers") if hasattr(producer, "config") else None
    if isinstance(servers, str):
        return servers
    if isinstance(servers, list | tuple) and servers:
        return ",".join(str(x) for x in servers)
    return None


def topic_ends(bootstrap_servers: str, topic: str, client_config: Mapping[str, Any] | None = None,
               timeout_s: float = 10.0) -> dict[int, int]:
    """Partition -> end offset of ``topic`` (from a fetch's highwater: Tansu's ``end_offsets`` is wrong); empty for
    a topic that does not exist."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                             **dict(client_config or {}))
    try:
        return fetched_ends(consumer, topic, timeout_s)
    finally:
        consumer.close()


def found_in(bootstrap_servers: str, topic: str, before: Mapping[int, int], keys: Sequence[bytes | None],
             client_config: Mapping[str, Any] | None = None, timeout_s: float = 60.0) -> int:
    """How many of ``keys`` (records acknowledged without an offset, or failed) the broker holds after the offsets
    ``before`` (partition -> end before the replay): the records a replay wrote are read back.  Records without a
    key are counted by number: every keyless record in the range counts (the replay is then taken to be the topic's
    only writer)."""
    want: dict[bytes | None, int] = {}
    for k in keys:
        want[k] = want.get(k, 0) + 1
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", **dict(client_config or {}))
    found = 0
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, before.get(tp.partition, 0))
        deadline = time.monotonic() + timeout_s
        idle_since = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200, max_records=10000)
            for recs in batch.values():
                for r in recs:
                    if want.get(r.key, 0) > 0:
                        want[r.key] -= 1
                        found += 1
            if batch:
                idle_since = time.monotonic()
            # (idle for 5 s: an end-of-partition gap, nothing more comes)
            if all(caught_up(consumer, tp) for tp in tps) or time.monotonic() - idle_since > 5.0:
                break
        return found
    finally:
        consumer.close()


def close_producer(producer: KafkaProducer, timeout_s: float) -> None:
    """``producer.close(timeout_s)``, and when it times out (the broker went away) the client is closed anyway.

    kafka-python 3.0.12's ``close`` raises ``KafkaTimeoutError`` from its internal flush and leaves the client open
    (its ``__del__`` then raises again at exit, "Exception ignored ... KafkaTimeoutError").  Then the sender thread
    is stopped without waiting (``force_close``, what ``close`` itself does after its timeout) and the client is
    marked closed, and the error is raised for the caller to report."""
    try:
        producer.close(timeout=timeout_s)
    except KafkaTimeoutError:
        sender = getattr(producer, "_sender", None)  # no public API to abandon what is in flight
        if sender is not None:
            sender.force_close()
        producer._closed = True  # type: ignore[attr-defined]  # (private: not in kafka-python's stubs)
        raise


def read_topic(bootstrap_servers: str, topic: str, *, expected: int | None = None, timeout_s: float = 30.0,
               idle_s: float = 2.0) -> list[tuple[int, int, bytes, bytes]]:
    """Read a topic from the beginning: ``[(partition, offset, key, value), ...]`` (key ``b""`` if none).

    Stops when ``expected`` messages were read, or (without ``expected``) when every partition's
    position reached its ``highwater()`` and nothing arrived for ``idle_s`` (Tansu's ``end_offsets``
    is wrong, so highwater from the fetch responses is used), or at ``timeout_s``.
    """
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
            if all(caught_up(consumer, tp) for tp in tps) and time.monotonic() - last_data >= idle_s:
                break
        return out
    finally:
        consumer.close()
