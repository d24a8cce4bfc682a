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


def _backward(ends: list[int], min_end: int, timeout_s: float = 30.0) -> tuple[list[tuple[int, int]], int]:
    """read_backward over ends read one after the other (the last repeats): the ranges it read, the ends it read."""
    reader = _reader(RecordingConsumer(begin=0, end=0, fetches_needed=1), timeout_s)
    reads = [0]
    ranges: list[tuple[int, int]] = []

    def bounds(topic: str, partition: int, timeout_s: float | None = None) -> tuple[int, int]:
        reads[0] += 1
        return 0, ends[min(reads[0], len(ends)) - 1]

    def read(tp: TopicPartition, lo: int, hi: int, max_records: int) -> list[Any]:
        ranges.append((lo, hi))
        return []

    reader.bounds = bounds  # type: ignore[method-assign]
    reader._read = read  # type: ignore[method-assign]
    reader.read_backward("ledger", 0, 100, lambda recs: True, min_end=min_end)
    return ranges, reads[0]


def test_a_ledger_end_below_the_fence_is_read_again_until_it_reaches_it() -> None:
    """The recovery's fence was acknowledged at offset 145,147: an end of 129,148 (a new leader's highwater) is
    stale, the scan starts from the end read again."""
    assert _backward([129_148, 129_148, 145_148], min_end=145_148) == ([(145_048, 145_148)], 3)
    assert _backward([145_200], min_end=145_148) == ([(145_100, 145_200)], 1)  # at or past it: read once


def test_a_ledger_end_that_stays_below_the_fence_is_a_timeout() -> None:
    with pytest.raises(KafkaTimeoutError, match=r"ends at 100, below offset 119 acknowledged before this read"):
        _backward([100], min_end=120, timeout_s=0.2)
