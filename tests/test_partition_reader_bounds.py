"""``PartitionReader.bounds`` with a recording consumer: the partition's state is dropped first when it was assigned
(kafka-python keeps an old highwater on re-assignment), and the end comes from a fetch awaited in polls of
``BOUNDS_POLL_MS``, until a deadline that names the partition."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from stream_anon.kafka_io.reader import BOUNDS_POLL_MS, PartitionReader


class RecordingConsumer:
    def __init__(self, begin: int, end: int, fetches_needed: int) -> None:
        self.begin, self.end, self.fetches_needed = begin, end, fetches_needed
        self.assigned: list[TopicPartition] = []
        self.calls: list[tuple[Any, ...]] = []
        self.polls = 0
        self.position_of: dict[TopicPartition, int] = {}

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    def assign(self, tps: list[TopicPartition]) -> None:
        self.calls.append(("assign", list(tps)))
        self.assigned = list(tps)
        self.polls = 0

    def beginning_offsets(self, tps: list[TopicPartition], timeout_ms: int | None = None) -> dict[TopicPartition, int]:
        self.calls.append(("beginning_offsets", list(self.assigned)))
        return {tp: self.begin for tp in tps}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.calls.append(("seek", tp, offset))

    def poll(self, timeout_ms: int, max_records: int) -> dict[Any, Any]:
        self.calls.append(("poll", timeout_ms))
        self.polls += 1
        return {}

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.end if tp in self.assigned and self.polls >= self.fetches_needed else None


def _reader(consumer: RecordingConsumer, timeout_s: float = 30.0) -> PartitionReader:
    reader = PartitionReader.__new__(PartitionReader)
    reader.consumer = consumer  # type: ignore[assignment]
    reader.stop = None
    reader.request_timeout_s = timeout_s
    return reader


def test_bounds_drops_the_old_state_and_polls_until_the_highwater() -> None:
    c = RecordingConsumer(begin=5, end=12, fetches_needed=3)
    c.assigned = [TopicPartition("out", 0)]  # the last call's partition: its state (old highwater) must go
    assert _reader(c).bounds("out", 0) == (5, 12)
    tp = TopicPartition("out", 0)
    assert c.calls[:4] == [("assign", []), ("assign", [tp]), ("beginning_offsets", [tp]), ("seek", tp, 5)]
    polls = [x for x in c.calls if x[0] == "poll"]
    assert len(polls) == 3 and all(p == ("poll", BOUNDS_POLL_MS) for p in polls) and BOUNDS_POLL_MS <= 20  # short polls


def test_bounds_gives_up_at_its_deadline_naming_the_partition() -> None:
    c = RecordingConsumer(begin=0, end=0, fetches_needed=10**9)
    with pytest.raises(KafkaTimeoutError, match=r"no fetch response for TopicPartition\(topic='out', partition=3\)"):
        _reader(c, timeout_s=0.05).bounds("out", 3)
