"""A producer transport in memory, for tests of the code above the Kafka client (the real clients are tested against
Tansu in tests/test_service_producer.py)."""

from __future__ import annotations

from dataclasses import dataclass

import confluent_kafka

from stream_anon.service.producer import Outcome, OutgoingBatch


@dataclass
class Sent:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


class Refused(Exception):
    """The error a :class:`MemoryTransport` reports for a message it fails."""


class MemoryTransport:
    """Accepts every message at once, except that each value in ``fail_once`` fails its first delivery (then the
    producer re-sends it); ``fatal`` makes every delivery a fatal error.  Offsets count per topic partition."""

    name = "memory"

    def __init__(self, partitions: int = 2, fail_once: set[bytes] | None = None, fatal: bool = False) -> None:
        self.partitions = partitions
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
            self.sent.append(Sent(batch.topic, batch.partition, k, v, batch.headers_of(i)))
            if self.fatal:
                batch.errors[i] = confluent_kafka.KafkaError(confluent_kafka.KafkaError._FATAL, "fenced (test)",
                                                             fatal=True)
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
