"""A producer transport in memory, for tests of the code above the Kafka client (the real clients are tested against
Tansu in tests/test_service_producer.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import confluent_kafka

from stream_anon.kafka_io.producer import Outcome, OutgoingBatch, UnconfirmedDelivery


@dataclass
class Sent:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp_ms: int | None = None  # None: the send time


class Refused(Exception):
    """The error a :class:`MemoryTransport` reports for a message it fails."""


class MemoryTransport:
    """Accepts every message at once, except that each value in ``fail_once`` fails its first delivery (then the
    producer re-sends it); ``fatal`` makes every delivery a fatal error; each value in ``unconfirmed`` is
    "acknowledged with offset -1" (stored, like Tansu's answer to a duplicate sequence).  Offsets count per topic
    partition."""

    name = "memory"

    def __init__(self, partitions: int = 2, fail_once: set[bytes] | None = None, fatal: bool = False,
                 unconfirmed: set[bytes] | None = None) -> None:
        self.partitions = partitions
        self.unconfirmed = set(unconfirmed or ())
        self.fail_once = set(fail_once or ())
        self.fatal = fatal
        self.sent: list[Sent] = []
        self.waits = 0
        self.closed = False
        self._next: dict[tuple[str, int], int] = {}

    def partition_count(self, topic: str) -> int:
        return self.partitions

    def submit(self, batch: OutgoingBatch) -> None:
        for i, (k, v) in enumerate(zip(batch.keys, batch.values, strict=True)):
            self.sent.append(Sent(batch.topic, batch.partition, k, v, batch.headers_of(i), batch.timestamp_ms))
            if self.fatal:
                batch.errors[i] = confluent_kafka.KafkaError(confluent_kafka.KafkaError._FATAL, "fenced (test)",
                                                             fatal=True)
            elif v in self.unconfirmed:
                batch.errors[i] = UnconfirmedDelivery("acknowledged with offset -1 (test)")
            elif v in self.fail_once:
                self.fail_once.discard(v)
                batch.errors[i] = Refused("not leader (test)")
            else:
                tp = (batch.topic, batch.partition)
                batch.offsets[i] = self._next.get(tp, 0)
                self._next[tp] = batch.offsets[i] + 1
            batch.resolved += 1

    def wait(self, timeout_s: float) -> None:
        self.waits += 1

    def collect(self, batch: OutgoingBatch) -> None:
        return None

    def classify(self, error: BaseException | confluent_kafka.KafkaError) -> Outcome:
        if isinstance(error, confluent_kafka.KafkaError) and error.fatal():
            return "fatal"
        return "retry"

    def close(self, timeout_s: float) -> None:
        self.closed = True


class Fault:
    """Which deliveries the :class:`UnconfirmingTransport` clients of one test spoil: the ``nth`` batch (1-based,
    counted over every client) sent to ``topic``, ``times`` times (then every ``nth`` batch after it)."""

    def __init__(self, topic: str, nth: int, times: int = 1) -> None:
        self.topic = topic
        self.nth = nth
        self.times = times
        self.seen = 0
        self.stored: list[bytes] = []  # acknowledged with offset -1 although stored (re-sending would duplicate)
        self.lost: list[bytes] = []  # acknowledged with offset -1, never stored (not re-sending would lose them)

    def hit(self, batch: OutgoingBatch) -> bool:
        if batch.topic != self.topic or self.times <= 0:
            return False
        self.seen += 1
        if self.seen % self.nth:
            return False
        self.times -= 1
        return True


class UnconfirmingTransport:
    """A real client (``inner``) whose batches chosen by ``fault`` come back "acknowledged with offset -1", as
    Tansu's durable storage answers an idempotent producer that spans a broker ``kill -9``: the even-indexed
    messages of such a batch are never sent (lost), the others are sent and stored."""

    name = "unconfirming"

    def __init__(self, inner: Any, fault: Fault) -> None:
        self.inner = inner
        self.fault = fault
        self._spoiled: dict[int, tuple[OutgoingBatch, OutgoingBatch | None, list[int], list[int]]] = {}

    def partition_count(self, topic: str) -> int:
        return int(self.inner.partition_count(topic))

    def submit(self, batch: OutgoingBatch) -> None:
        if not self.fault.hit(batch):
            self.inner.submit(batch)
            return
        n = len(batch)
        lost = list(range(0, n, 2))
        kept = [i for i in range(n) if i % 2]
        sub = batch.subset(kept) if kept else None
        if sub is not None:
            self.inner.submit(sub)
        self.fault.lost += [batch.values[i] or b"" for i in lost]
        self.fault.stored += [batch.values[i] or b"" for i in kept]
        self._spoiled[id(batch)] = (batch, sub, kept, lost)

    def wait(self, timeout_s: float) -> None:
        self.inner.wait(timeout_s)

    def collect(self, batch: OutgoingBatch) -> None:
        self.inner.collect(batch)
        spoiled = self._spoiled.get(id(batch))
        if spoiled is None:
            return
        _b, sub, kept, lost = spoiled
        if sub is not None:
            self.inner.collect(sub)
            if not sub.settled:
                return
        for j, i in enumerate(kept):
            assert sub is not None
            batch.errors[i] = sub.errors.get(j) or UnconfirmedDelivery("stored, acknowledged with offset -1 (test)")
        for i in lost:
            batch.errors[i] = UnconfirmedDelivery("not stored, acknowledged with offset -1 (test)")
        batch.resolved = len(batch)

    def classify(self, error: BaseException | confluent_kafka.KafkaError) -> Outcome:
        return self.inner.classify(error)  # type: ignore[no-any-return]

    def close(self, timeout_s: float) -> None:
        self.inner.close(timeout_s)
