"""One producer for every output of the service: the main path's classes, suppressions and dead letters, and the
side paths' copies, estimates and k-means releases.

:class:`OutputProducer` sends messages to a topic partition (``source partition mod the topic's partition count``)
and, on :meth:`~OutputProducer.flush`, waits until every message sent so far is acknowledged (``acks=all``,
idempotent producer).  One retry policy: a message whose delivery failed is re-sent, in its original order, once
nothing else is in flight, with exponential backoff (``kafka.retry_backoff_max_seconds``); it is never dropped.
While the broker does not answer, ``flush`` keeps waiting for the messages in flight (the client retries them;
re-sending one that is still in flight could duplicate it) and logs one line per ``kafka.request_timeout_ms``.
One error type per failure (:mod:`stream_anon.kafka_io.errors`): :class:`BrokerUnavailableError` (stopped while
messages were unacknowledged), :class:`ProducerFatalError` (the client cannot go on: close it and
:meth:`~OutputProducer.reopen`; also raised for an acknowledgement without an offset, :class:`UnconfirmedDelivery`),
:class:`ProducerStuckError` (a subclass: with ``stuck_after_s``, nothing acknowledged for that long although
messages wait; the client may never recover by itself), :class:`MessageRejectedError` (re-sending cannot succeed).

**Acknowledged without an offset.**  On Tansu's durable storage an idempotent producer that spans a broker
``kill -9`` can be answered ``DUPLICATE_SEQUENCE_NUMBER`` for records that were never stored; both clients count
that as a success with offset -1 (docs/tansu.md).  Such a delivery is *not* acknowledged here: it is an
:class:`UnconfirmedDelivery` failure, and since re-sending it through the same client could publish it twice (the
offset -1 may also be a true duplicate), :meth:`~OutputProducer.flush` raises :class:`ProducerFatalError`: the
caller recreates the producer and re-sends from its own state what is missing (the main path: from the ledger).

Every send returns a :class:`Receipt`: once acknowledged, each message's topic, partition and offset
(:class:`Delivery`).  :meth:`~OutputProducer.poll` learns acknowledgements without blocking (the main path's
outbox sends a batch's outputs as soon as its ledger entries are acknowledged, without waiting for a flush).

Transports (``kafka.producer_client``): ``confluent-kafka`` (default: librdkafka batches, compresses and sends in
its own threads, outside the GIL; measured 5-8 times the messages/s of kafka-python on Tansu, see
docs/service.md) or ``kafka-python`` (``KafkaProducer.send``, public API).  Both through the same interface.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, cast

import confluent_kafka
import kafka.errors as kafka_errors
from kafka import KafkaProducer

from stream_anon.formats.messages import Delivery, OutputMessage
from stream_anon.kafka_io.clients import (
    backoff_delays,
    client_options,
    librdkafka_client_config,
    no_auto_create,
    retry,
)
from stream_anon.kafka_io.errors import (
    BrokerUnavailableError,
    MessageRejectedError,
    ProducerFatalError,
    ProducerStuckError,
)
from stream_anon.kafka_io.lifecycle import LOOP_REQUEST_TIMEOUT_MS, wait_unless
from stream_anon.kafka_io.settings import KafkaSettings

log = logging.getLogger(__name__)

Headers = list[tuple[str, bytes]]
Outcome = Literal["retry", "fatal", "rejected"]
"""What a failed delivery means: re-send it, the client is broken, or re-sending cannot succeed."""

FLUSH_SLICE_SECONDS = 1.0
""":meth:`OutputProducer.flush` waits in slices of at most this long: after each it looks at its ``stop``, checks
``stuck_after_s`` and calls ``watchdog``."""


class UnconfirmedDelivery(Exception):
    """The broker acknowledged a message without an offset (-1): it may not be stored (see the module
    docstring)."""


class OutgoingBatch:
    """Messages to one topic partition, in send order, and what became of each (the transport fills
    ``offsets``: -1 until acknowledged, and ``errors``: index -> error of a failed delivery).  Headers: the same
    ``headers`` for every message, or ``per_message[i]`` for message ``i``.  ``timestamp_ms``: the Kafka timestamp
    of every message (None: the client's send time)."""

    __slots__ = ("topic", "partition", "keys", "values", "headers", "per_message", "offsets", "errors",
                 "resolved", "handles", "root", "root_index", "seq", "timestamp_ms")

    def __init__(self, topic: str, partition: int, keys: list[bytes | None], values: list[bytes | None],
                 headers: Headers | None = None, per_message: list[Headers] | None = None,
                 timestamp_ms: int | None = None) -> None:
        self.timestamp_ms = timestamp_ms
        self.topic = topic
        self.partition = partition
        self.keys = keys
        self.values = values
        self.headers: Headers = headers if headers is not None else []
        self.per_message = per_message
        self.offsets = [-1] * len(values)
        self.errors: dict[int, BaseException | confluent_kafka.KafkaError] = {}
        self.resolved = 0  # outcomes known (acknowledged or failed)
        self.handles: list[Any] = []  # transport-specific (kafka-python futures)
        self.root: OutgoingBatch = self  # a re-send batch reports its offsets to the batch it re-sends
        self.root_index: list[int] | None = None
        self.seq = 0  # send order (set by the producer)

    def __len__(self) -> int:
        return len(self.values)

    def headers_of(self, i: int) -> Headers:
        return self.headers if self.per_message is None else self.per_message[i]

    @property
    def settled(self) -> bool:
        return self.resolved >= len(self.values)

    def subset(self, indices: Sequence[int]) -> OutgoingBatch:
        """A new batch of the messages at ``indices`` (a re-send), reporting back to this batch's root."""
        per_message = None if self.per_message is None else [self.per_message[i] for i in indices]
        b = OutgoingBatch(self.topic, self.partition, [self.keys[i] for i in indices],
                          [self.values[i] for i in indices], self.headers, per_message, self.timestamp_ms)
        b.root = self.root
        b.root_index = [self.root_index[i] for i in indices] if self.root_index is not None else list(indices)
        return b

    def report_to_root(self) -> None:
        """Copy the offsets of the acknowledged messages of a re-send batch to the batch it re-sent."""
        if self.root_index is None:
            return
        root = self.root
        for j, i in enumerate(self.root_index):
            if self.offsets[j] >= 0:
                root.offsets[i] = self.offsets[j]


class Receipt:
    """The messages of one send call: :meth:`deliveries` tells, once acknowledged, where each was stored (in the
    order they were given)."""

    def __init__(self, parts: list[tuple[OutgoingBatch, range | list[int]]]) -> None:
        self._parts = parts

    def __len__(self) -> int:
        return sum(len(idx) for _b, idx in self._parts)

    @property
    def acknowledged(self) -> bool:
        return all(b.offsets[i] >= 0 for b, idx in self._parts for i in idx)

    def deliveries(self) -> list[Delivery]:
        """Topic, partition and offset of every message; raises ``ValueError`` if one is not acknowledged yet."""
        out = []
        for b, idx in self._parts:
            for i in idx:
                off = b.offsets[i]
                if off < 0:
                    raise ValueError(f"message {i} to {b.topic}[{b.partition}] is not acknowledged yet")
                out.append(Delivery(b.topic, b.partition, off))
        return out


class Transport(Protocol):
    """One Kafka producer client behind :class:`OutputProducer`."""

    name: str

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` (from the broker's metadata)."""
        ...

    def submit(self, batch: OutgoingBatch) -> None:
        """Hand every message of ``batch`` to the client; outcomes are recorded on the batch as they arrive."""
        ...

    def wait(self, timeout_s: float) -> None:
        """Send what is buffered and wait up to ``timeout_s`` for outcomes (delivery reports are served here)."""
        ...

    def collect(self, batch: OutgoingBatch) -> None:
        """Record on ``batch`` the outcomes known now (no-op for a transport that records them as they come)."""
        ...

    def classify(self, error: BaseException | confluent_kafka.KafkaError) -> Outcome:
        ...

    def close(self, timeout_s: float) -> None:
        """Close the client; messages not acknowledged within ``timeout_s`` are abandoned (never blocks longer)."""
        ...


# ================================================================================================ transports
class ConfluentTransport:
    """librdkafka through confluent-kafka: ``produce`` per message with one delivery callback per batch (delivery
    reports of one partition arrive in produce order: the idempotent producer keeps the order, and without it at
    most one request per connection is in flight)."""

    name = "confluent-kafka"

    _E = confluent_kafka.KafkaError  # (codes with a leading underscore are librdkafka's local errors: public API)
    REJECTED = frozenset({_E.MSG_SIZE_TOO_LARGE, _E.INVALID_MSG_SIZE, _E.INVALID_RECORD, _E.RECORD_LIST_TOO_LARGE,
                          _E.TOPIC_AUTHORIZATION_FAILED, _E.CLUSTER_AUTHORIZATION_FAILED, _E.TOPIC_EXCEPTION,
                          _E._INVALID_ARG, _E._UNKNOWN_PARTITION})

    def __init__(self, kafka: KafkaSettings) -> None:
        self.kafka = kafka
        self.fatal: confluent_kafka.KafkaError | None = None
        self.config = librdkafka_config(kafka)
        self.producer = confluent_kafka.Producer({**self.config, "error_cb": self._on_error,
                                                  "logger": logging.getLogger("librdkafka")})

    def _on_error(self, err: confluent_kafka.KafkaError) -> None:
        if err.fatal():
            self.fatal = err
            log.error("producer: fatal client error %s: %s", err.name(), err.str())
        else:
            log.debug("producer: client error %s: %s", err.name(), err.str())

    def partition_count(self, topic: str) -> int:
        try:
            md = self.producer.list_topics(topic, timeout=max(1.0, self.kafka.request_timeout_ms / 1000.0))
        except confluent_kafka.KafkaException as e:
            raise kafka_errors.KafkaTimeoutError(f"no metadata for topic {topic!r}: {e}") from e
        t = md.topics.get(topic)
        if t is None or t.error is not None or not t.partitions:
            raise kafka_errors.KafkaTimeoutError(f"no metadata for topic {topic!r}: {t.error if t else 'missing'}")
        return len(t.partitions)

    def submit(self, batch: OutgoingBatch) -> None:
        offsets, errors = batch.offsets, batch.errors

        def delivered(err: confluent_kafka.KafkaError | None, msg: confluent_kafka.Message) -> None:
            i = batch.resolved
            batch.resolved = i + 1
            offset = msg.offset()
            if err is None and offset is not None and offset >= 0:
                offsets[i] = offset
            else:
                errors[i] = err or UnconfirmedDelivery(f"{msg.topic()}[{msg.partition()}]: acknowledged with offset "
                                                       f"{offset}")

        produce, topic, partition = self.producer.produce, batch.topic, batch.partition
        keys, values, n = batch.keys, batch.values, len(batch.values)
        ts = batch.timestamp_ms or 0  # 0: librdkafka stamps the send time
        i = 0
        while i < n:
            try:
                # (confluent-kafka's stub types headers as list[tuple[str, str | bytes | None]]: lists are invariant)
                if batch.per_message is None:
                    h: Any = batch.headers
                    while i < n:
                        produce(topic, values[i], keys[i], partition, delivered, timestamp=ts, headers=h)
                        i += 1
                else:
                    hs: Any = batch.per_message
                    while i < n:
                        produce(topic, values[i], keys[i], partition, delivered, timestamp=ts, headers=hs[i])
                        i += 1
            except BufferError:  # the client's queue is full: serve delivery reports, then go on
                self.producer.poll(0.05)
            except confluent_kafka.KafkaException as e:
                err = e.args[0] if e.args and isinstance(e.args[0], confluent_kafka.KafkaError) else None
                if err is not None and err.fatal():
                    raise ProducerFatalError(f"producer: {err.name()}: {err.str()}") from e
                raise MessageRejectedError(f"producer refused a message to {topic}[{partition}]: {e}") from e
        self.producer.poll(0)

    def wait(self, timeout_s: float) -> None:
        if timeout_s > 0:
            self.producer.flush(timeout_s)
        else:  # flush(0) returns before serving a single delivery report: poll(0) serves those that arrived
            self.producer.poll(0)
        if self.fatal is not None:
            raise ProducerFatalError(f"producer: fatal client error {self.fatal.name()}: {self.fatal.str()}; "
                                     f"it must be closed and created anew")

    def collect(self, batch: OutgoingBatch) -> None:
        return None

    def classify(self, error: BaseException | confluent_kafka.KafkaError) -> Outcome:
        if isinstance(error, confluent_kafka.KafkaError):
            if error.fatal():
                return "fatal"
            if error.code() in self.REJECTED:
                return "rejected"
        return "retry"

    def close(self, timeout_s: float) -> None:
        left = self.producer.flush(timeout_s)
        if left:
            self.producer.purge(in_queue=True, in_flight=True, blocking=False)
            self.producer.poll(0)
        self.producer.close()


def librdkafka_config(k: KafkaSettings) -> dict[str, Any]:
    """The librdkafka properties of the ``kafka`` options (security options translated; ``acks=all``, idempotence,
    ``kafka.request_timeout_ms`` for every request as the group consumer has it)."""
    conf: dict[str, Any] = {
        **librdkafka_client_config(k), "acks": "all",
        "enable.idempotence": k.enable_idempotence, "linger.ms": k.linger_ms, "batch.size": k.batch_size,
        "message.max.bytes": k.max_request_size, "request.timeout.ms": k.request_timeout_ms,
        # every other request (metadata too) also gives up after the request timeout, not librdkafka's 60 s: a hung
        # (not dead) leader held the producer 61 s on a three-node Apache Kafka cluster, 11 s with this (docs/deploy.md)
        "socket.timeout.ms": max(10, k.request_timeout_ms),
        "queue.buffering.max.messages": 1_000_000,
        "allow.auto.create.topics": False,  # a topic that is gone stays gone until the broker guard sees it
    }
    if not k.enable_idempotence:
        conf["max.in.flight.requests.per.connection"] = 1  # keep each partition's order across retries
    if k.compression_type:
        conf["compression.type"] = k.compression_type
    return conf


class _FailedSend:
    """A kafka-python send that failed before it was queued (e.g. no metadata within ``max_block_ms``): reported as a
    failed delivery (re-sent, with the producer's backoff, once nothing else is in flight)."""

    is_done = True
    value = None

    def __init__(self, error: BaseException) -> None:
        self.exception = error

    def succeeded(self) -> bool:
        return False


class KafkaPythonTransport:
    """kafka-python's ``KafkaProducer.send`` per message (public API only); outcomes read from the futures."""

    name = "kafka-python"

    FATAL = (kafka_errors.OutOfOrderSequenceNumberError, kafka_errors.UnknownProducerIdError,
             kafka_errors.ProducerFencedError, kafka_errors.InvalidProducerEpochError,
             kafka_errors.InvalidProducerIdMappingError, kafka_errors.ClusterAuthorizationFailedError,
             kafka_errors.IllegalStateError)
    REJECTED = (kafka_errors.MessageSizeTooLargeError, kafka_errors.RecordListTooLargeError,
                kafka_errors.TopicAuthorizationFailedError, kafka_errors.InvalidTopicError)

    def __init__(self, k: KafkaSettings) -> None:
        # max_block_ms: a send waits at most this long for a topic's metadata (a topic that is gone, and is never
        # auto-created, would hold the loop for kafka-python's default 60 s); it then fails like a delivery
        opts: dict[str, Any] = dict(acks="all", linger_ms=k.linger_ms, batch_size=k.batch_size,
                                    max_request_size=k.max_request_size, enable_idempotence=k.enable_idempotence,
                                    max_block_ms=min(k.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS))
        if k.compression_type:
            opts["compression_type"] = k.compression_type
        self.producer = no_auto_create(KafkaProducer(**client_options(k), **opts))

    def partition_count(self, topic: str) -> int:
        parts = self.producer.partitions_for(topic)
        return len(parts) if parts else 1

    def submit(self, batch: OutgoingBatch) -> None:
        topic, partition, ts = batch.topic, batch.partition, batch.timestamp_ms
        no_metadata: list[BaseException] = []

        def send(value: bytes | None, key: bytes | None, headers: Headers) -> Any:
            if no_metadata:  # the batch's topic had no metadata: the rest of the batch fails at once
                return _FailedSend(no_metadata[0])
            try:
                return self.producer.send(topic, value=value, key=key, partition=partition, headers=headers,
                                          timestamp_ms=ts)
            except kafka_errors.KafkaTimeoutError as e:  # no metadata within max_block_ms (the topic is gone?)
                no_metadata.append(e)
                return _FailedSend(e)

        try:
            if batch.per_message is None:
                h = batch.headers
                batch.handles = [send(v, k, h) for k, v in zip(batch.keys, batch.values, strict=True)]
            else:
                batch.handles = [send(v, k, h)
                                 for k, v, h in zip(batch.keys, batch.values, batch.per_message, strict=True)]
        except self.FATAL as e:
            raise ProducerFatalError(f"producer: {e!r}") from e
        except self.REJECTED as e:
            raise MessageRejectedError(f"producer refused a message to {topic}[{partition}]: {e!r}") from e

    def wait(self, timeout_s: float) -> None:
        try:
            self.producer.flush(timeout=timeout_s)
        except kafka_errors.KafkaTimeoutError as e:  # not everything acknowledged within timeout_s
            log.debug("producer flush: %r", e)

    def collect(self, batch: OutgoingBatch) -> None:
        if batch.settled:
            return
        offsets, errors = batch.offsets, batch.errors
        resolved = 0
        for i, f in enumerate(batch.handles):
            if offsets[i] >= 0 or i in errors:
                resolved += 1
            elif f.is_done:
                resolved += 1
                if f.succeeded() and f.value.offset >= 0:
                    offsets[i] = f.value.offset
                elif f.succeeded():
                    errors[i] = UnconfirmedDelivery(f"{batch.topic}[{batch.partition}]: acknowledged with offset "
                                                    f"{f.value.offset}")
                else:
                    errors[i] = f.exception
        batch.resolved = resolved

    def classify(self, error: BaseException | confluent_kafka.KafkaError) -> Outcome:
        if isinstance(error, self.FATAL):
            return "fatal"
        if isinstance(error, self.REJECTED):
            return "rejected"
        return "retry"

    def close(self, timeout_s: float) -> None:
        self.producer.close(timeout=timeout_s)


def make_transport(kafka: KafkaSettings) -> Transport:
    """A new client of the configured kind (``kafka.producer_client``)."""
    if kafka.producer_client == "kafka-python":
        return KafkaPythonTransport(kafka)
    return ConfluentTransport(kafka)


# ================================================================================================ the producer
class OutputProducer:
    """Sends output messages and waits for their acknowledgement; see the module docstring.

    Args:
        kafka: the ``kafka`` options (client, timeouts, backoff).
        transport_factory: makes the client (default :func:`make_transport`); :meth:`reopen` calls it again.
        partition_counts: topic -> partitions, when known (else asked from the broker once per topic).
        on_error: called with the topic of every batch whose delivery failed (then re-sent).
        stop: when it returns true, :meth:`flush` gives up waiting (:class:`BrokerUnavailableError`).
        label: what the log lines call the messages (``output``, ``side``).
        stuck_after_s: when set, :meth:`flush` raises :class:`ProducerStuckError` once messages have waited this
            long without any acknowledgement (None: wait as long as the broker takes).
        watchdog: called at least every ``FLUSH_SLICE_SECONDS`` while :meth:`flush` waits; may raise to end the wait
            (the main path checks there whether the broker lost its data).
    """

    def __init__(self, kafka: KafkaSettings, *, transport_factory: Callable[[], Transport] | None = None,
                 partition_counts: dict[str, int] | None = None, on_error: Callable[[str], None] | None = None,
                 stop: Callable[[], bool] | None = None, label: str = "output", stuck_after_s: float | None = None,
                 watchdog: Callable[[], None] | None = None) -> None:
        self.kafka = kafka
        self.stuck_after_s = stuck_after_s
        self.watchdog = watchdog
        self._waiting_since = time.monotonic()  # since when messages wait without any acknowledgement
        self._factory = transport_factory or (lambda: make_transport(kafka))
        self.transport = self._factory()
        self.partition_counts = dict(partition_counts or {})
        self.on_error = on_error
        self.stop = stop
        self.label = label
        self._open: list[OutgoingBatch] = []  # sent, not settled
        self._failed: list[tuple[OutgoingBatch, list[int]]] = []  # settled with failures: (batch, failed indices)
        self._unchecked: list[OutgoingBatch] = []  # settled with failures learnt by poll(), not classified yet
        self._pending = 0
        self._seq = 0

    # ------------------------------------------------------------------ sending
    def partition_for(self, topic: str, src_partition: int) -> int:
        """The output partition of a message from input partition ``src_partition``: mod the topic's partitions."""
        n = self.partition_counts.get(topic)
        if n is None:
            n = self.partition_counts[topic] = self.transport.partition_count(topic)
        return src_partition % n

    def send(self, messages: Iterable[OutputMessage]) -> Receipt:
        """Send ``messages`` (each to ``partition_for(m.topic, m.src_partition)``, with its own headers and Kafka
        timestamp)."""
        groups: dict[tuple[str, int, int | None], tuple[OutgoingBatch, list[Headers]]] = {}
        parts: list[tuple[OutgoingBatch, range | list[int]]] = []
        for m in messages:
            key = (m.topic, self.partition_for(m.topic, m.src_partition), m.timestamp_ms)
            g = groups.get(key)
            if g is None:
                per_message: list[Headers] = []
                g = groups[key] = (OutgoingBatch(key[0], key[1], [], [], per_message=per_message,
                                                 timestamp_ms=key[2]), per_message)
            batch, headers = g
            parts.append((batch, [len(batch.values)]))
            batch.keys.append(m.key)
            batch.values.append(m.value)
            headers.append(list(m.headers))
        for batch, _ in groups.values():
            batch.offsets = [-1] * len(batch.values)
            self._submit(batch)
        return Receipt(parts)

    def send_values(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: Headers, *, timestamp_ms: int | None = None) -> Receipt:
        """Send ``values[i]`` with key ``keys[i]``, all with the same ``headers`` (not copied) and Kafka timestamp
        (None: the send time), to ``topic``'s partition of ``src_partition``: the bulk path of the side copies."""
        b = OutgoingBatch(topic, self.partition_for(topic, src_partition), keys, cast(list[bytes | None], values),
                          headers, timestamp_ms=timestamp_ms)
        if values:
            self._submit(b)
        return Receipt([(b, range(len(values)))])

    def _submit(self, batch: OutgoingBatch) -> None:
        if not self._pending:
            self._waiting_since = time.monotonic()
        self._seq += 1
        batch.seq = self._seq
        self.transport.submit(batch)
        self._open.append(batch)
        self._pending += len(batch)

    @property
    def pending(self) -> int:
        """Messages sent and not yet acknowledged."""
        return self._pending

    @property
    def settled(self) -> bool:
        """Nothing in flight and nothing failed: every message sent so far is acknowledged."""
        return not self._open and not self._failed and not self._unchecked

    # ------------------------------------------------------------------ acknowledgement
    def poll(self, timeout_s: float = 0.0) -> int:
        """Learn the outcomes that arrived (waiting at most ``timeout_s``, less once everything sent is
        acknowledged); returns how many messages were newly acknowledged.  Never re-sends and never raises for a
        failed delivery: :meth:`flush` re-sends failures (and raises what cannot be re-sent)."""
        if not self._open:
            return 0
        self.transport.wait(timeout_s)
        return self._settle(raise_errors=False)

    def _settle(self, *, raise_errors: bool) -> int:
        """Move the batches whose outcomes are all known out of ``_open``; failed messages go to ``_failed``.
        Returns the messages acknowledged."""
        acked = 0
        waiting: list[OutgoingBatch] = []
        for i, b in enumerate(self._open):
            self.transport.collect(b)
            if not b.settled:
                waiting.append(b)
                continue
            acked += len(b) - len(b.errors)
            self._pending -= len(b) - len(b.errors)
            b.report_to_root()
            if b.errors:
                if not raise_errors:
                    self._unchecked.append(b)
                    continue
                try:
                    self._failed.append((b, self._failures(b)))
                except (ProducerFatalError, MessageRejectedError):
                    self._failed.append((b, sorted(b.errors)))
                    self._open = waiting + self._open[i + 1:]  # what is left stays with the producer (reopen)
                    raise
        self._open = waiting
        if acked:
            self._waiting_since = time.monotonic()
        return acked

    def _check_stuck(self) -> None:
        """:class:`ProducerStuckError` if messages waited ``stuck_after_s`` without any acknowledgement."""
        if self.stuck_after_s is None or not self._pending:
            return
        waited = time.monotonic() - self._waiting_since
        if waited > self.stuck_after_s:
            raise ProducerStuckError(f"{self.label} producer: {self._pending} message(s) waiting, none acknowledged "
                                     f"for {waited:.0f} s (service.producer_recovery_seconds = "
                                     f"{self.stuck_after_s:g}); it must be closed and created anew")

    def flush(self) -> int:
        """Block until every message sent so far is acknowledged; returns how many were.  See the module
        docstring for the retry policy and the errors."""
        k = self.kafka
        delays = backoff_delays(k.retry_backoff_max_seconds)
        wait_s = max(1.0, k.request_timeout_ms / 1000.0)
        t0 = time.monotonic()
        next_log = t0 + wait_s
        stalled = False
        acked = 0
        unchecked, self._unchecked = self._unchecked, []
        for i, b in enumerate(unchecked):  # failures learnt by poll(): classify them now (may raise)
            try:
                self._failed.append((b, self._failures(b)))
            except (ProducerFatalError, MessageRejectedError):
                self._failed.extend((x, sorted(x.errors)) for x in unchecked[i:])
                raise
        while self._open or self._failed:
            if self.stop is not None and self.stop():  # stopping and its grace is over: not one more slice
                acked += self._settle(raise_errors=False)
                n_left = sum(len(b) - b.resolved for b in self._open) + sum(len(i) for _b, i in self._failed)
                if n_left or self._unchecked:
                    raise BrokerUnavailableError(f"{n_left} {self.label} messages not acknowledged at shutdown")
                break
            if self._open:  # short slices: a stop, a stuck client, the watchdog are noticed within a slice
                self.transport.wait(min(wait_s, FLUSH_SLICE_SECONDS))
            acked += self._settle(raise_errors=True)
            waiting = self._open
            n_waiting = sum(len(b) - b.resolved for b in waiting)
            n_failed = sum(len(idx) for _b, idx in self._failed)
            if (waiting or self._failed) and self.stop is not None and self.stop():
                raise BrokerUnavailableError(f"{n_waiting + n_failed} {self.label} messages not acknowledged "
                                             f"at shutdown")
            if waiting or self._failed:
                if self.watchdog is not None:
                    self.watchdog()
                self._check_stuck()
            if waiting and time.monotonic() >= next_log:  # one line per kafka.request_timeout_ms
                next_log = time.monotonic() + wait_s
                stalled = True
                log.warning("broker %s has not acknowledged %d %s message(s) for %.0f s (unreachable or stalled): "
                            "waiting, the producer retries them%s", k.bootstrap_servers, n_waiting, self.label,
                            time.monotonic() - t0, "; watermarks are not committed until they are acknowledged"
                            if self.label == "output" else "")
            elif self._failed:  # re-sent in their order once nothing else is in flight
                d = next(delays)
                log.warning("%d %s messages not acknowledged; re-sending in %.1f s", n_failed, self.label, d)
                if wait_unless(d, self.stop):  # a stop cuts the backoff short (its grace is over)
                    raise BrokerUnavailableError(f"{n_failed} {self.label} messages not acknowledged at shutdown "
                                                 f"(waiting to re-send them)")
                failed, self._failed = self._failed, []
                for b, idx in failed:
                    self._submit(b.subset(idx))  # (then the count: a re-send does not restart the stuck clock)
                    self._pending -= len(idx)
        if stalled:
            log.warning("broker %s acknowledged the held %s messages after %.0f s: resuming", k.bootstrap_servers,
                        self.label, time.monotonic() - t0)
        return acked

    def _failures(self, b: OutgoingBatch) -> list[int]:
        """Indices of ``b``'s failed messages, after checking that re-sending them can succeed."""
        idx = sorted(b.errors)
        first = b.errors[idx[0]]
        unconfirmed = [i for i in idx if isinstance(b.errors[i], UnconfirmedDelivery)]
        if unconfirmed:
            raise ProducerFatalError(f"producer: {len(unconfirmed)} message(s) to {b.topic}[{b.partition}] acknowledged "
                                     f"without an offset (maybe not stored: {b.errors[unconfirmed[0]]}); the "
                                     f"producer must be closed and created anew, the caller re-sends what is missing")
        kind = self.transport.classify(first)
        detail = first.str() if isinstance(first, confluent_kafka.KafkaError) else repr(first)
        if kind == "fatal":
            raise ProducerFatalError(f"producer: fatal error on {b.topic}[{b.partition}]: {detail}; it must be "
                                     f"closed and created anew")
        if kind == "rejected":
            raise MessageRejectedError(f"{len(idx)} message(s) to {b.topic}[{b.partition}] refused: {detail}")
        log.warning("produce of %d message(s) to %s[%d] failed (%s); will retry", len(idx), b.topic, b.partition,
                    detail)
        if self.on_error is not None:
            self.on_error(b.topic)
        return idx

    # ------------------------------------------------------------------ lifecycle
    def reopen(self) -> int:
        """Close the client (abandoning what it holds) and create a new one; every message not acknowledged yet is
        sent again through it, in its order.  Returns how many were re-sent.  A message the old client delivered
        but whose acknowledgement was lost is then stored twice: callers that must never publish twice resend from
        their own state instead."""
        old = sorted([(b, [i for i in range(len(b)) if b.offsets[i] < 0]) for b in self._open] + self._failed
                     + [(b, sorted(b.errors)) for b in self._unchecked], key=lambda item: item[0].seq)
        self._open, self._failed, self._unchecked = [], [], []
        try:
            self.transport.close(0.0)
        except Exception as e:  # a broken client may fail to close: it is abandoned either way
            log.debug("close of the old producer failed: %r", e)
        self.transport = self._factory()
        self._pending = 0
        n = 0
        for b, idx in old:
            if idx:
                self._submit(b.subset(idx))
                n += len(idx)
        return n

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the client: waits at most ``timeout_s`` for messages still in flight (call :meth:`flush` first)."""
        try:
            self.transport.close(timeout_s)
        except Exception as e:  # closing a client of a dead broker: nothing left to do
            log.debug("producer close failed: %r", e)


def open_producer(kafka: KafkaSettings, *, partition_counts: dict[str, int] | None = None,
                  on_error: Callable[[str], None] | None = None, stop: Callable[[], bool] | None = None,
                  label: str = "output", stuck_after_s: float | None = None,
                  watchdog: Callable[[], None] | None = None) -> OutputProducer:
    """An :class:`OutputProducer` with a client of the configured kind, created with the start-up retry policy."""
    return OutputProducer(kafka, transport_factory=lambda: retry("producer", lambda: make_transport(kafka), kafka,
                                                                  stop=stop),
                          partition_counts=partition_counts, on_error=on_error, stop=stop, label=label,
                          stuck_after_s=stuck_after_s, watchdog=watchdog)
