"""The group-less partition reader: reads single partitions (backwards in chunks, forwards to the end) without
joining a consumer group, answers whether the broker is there (``ping``) and finds records the client cannot
read.  Recovery reads the ledger and the output partitions with it (:mod:`stream_anon.service.recovery`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import CorruptRecordError, KafkaTimeoutError

from stream_anon.kafka_io.clients import client_options, fetch_limits, no_auto_create
from stream_anon.kafka_io.settings import KafkaSettings

log = logging.getLogger(__name__)

RawRecord = tuple[int, bytes | None, bytes | None]
"""(offset, key, value) of one record."""

BOUNDS_POLL_MS = 10
""":meth:`PartitionReader.bounds` polls this long at a time until the fetch response (and its highwater) is in.  An
empty partition's poll returns no record and so blocked for its whole timeout, 200 ms before (an empty ledger's
recovery on Tansu, three output partitions read: 0.83 s with 200 ms polls, 0.35 s with 10 ms)."""

END_AGAIN_SECONDS = 0.05
"""A read whose end is below what it must reach reads the end again after this long."""

READ_MAX_WAIT_MS = 1000
"""The fetch max wait of the reader's record reads (``PartitionReader.records``; capped at a quarter of the request
timeout).  Tansu on S3 lists a partition's batch objects for every fetch and stops listing when the fetch's max wait
has passed: a fetch whose listing takes longer is answered with no record (and the right highwater) although records
are there.  On the storage of a failed CI run (a ledger partition of 105 batch objects, 2,221 entries), every fetch
with a 1 or 20 ms max wait was answered empty, at every offset, for as long as it was repeated; with 200 ms and
1,000 ms the first answer carried records (``tests/test_partition_reader_gap.py``).  A fetch that has records to
return answers as soon as it has them, so the wait costs time only where there is nothing to return: a real gap, or
a fetch sent past the end of a partition (a sequence of recovery reads: 0.11-0.25 s against 0.12 s with 20 ms)."""

def records_max_wait_ms(kafka: KafkaSettings) -> int:
    """The fetch max wait of a client that reads records: ``READ_MAX_WAIT_MS``, at most a quarter of
    ``kafka.request_timeout_ms``."""
    return min(READ_MAX_WAIT_MS, kafka.request_timeout_ms // 4)


BOUNDS_MAX_WAIT_MS = 20
"""The fetch max wait of the reader's end-offset client (``PartitionReader.consumer``: bounds, pings): its fetches
are for their highwater (right in an empty answer too), and a fetch at the end of a partition is answered only once
its max wait has passed."""

GAP_SECONDS = 3.0
"""A read that gets no record for this long asks whether it stands at an end-of-partition gap (see
:meth:`PartitionReader._read`)."""

GAP_PROBE_SECONDS = 0.5
"""After ``GAP_SECONDS`` without a record, a read probes for a gap at most this often."""

GAP_CONFIRMATIONS = 4
"""Probes in a row, all answered with no record below their highwater at the same offset, that make the rest of a
read's range a gap (each probe a fresh fetch with the read's max wait, at least ``GAP_PROBE_SECONDS`` apart): one
empty answer is no proof on Tansu (see ``READ_MAX_WAIT_MS``)."""


def caught_up(consumer: KafkaConsumer, tp: TopicPartition) -> bool:
    """Whether ``consumer``'s position on ``tp`` is at or past the partition's end as of its last fetch (False
    while either is unknown: kafka-python answers None for a highwater before the first fetch, and for a
    position it could not establish)."""
    end = consumer.highwater(tp)
    if end is None:
        return False
    position = consumer.position(tp)
    return position is not None and position >= end


def fetched_ends(consumer: KafkaConsumer, topic: str, timeout_s: float) -> dict[int, int]:
    """Partition -> end offset of ``topic`` from fetch responses' highwaters (Tansu's ``end_offsets()`` is wrong),
    read with ``consumer`` (in no group; its assignment is replaced); empty for a topic it does not know, 0 for a
    partition whose fetch did not come within ``timeout_s``."""
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or set())]
    if not tps:
        return {}
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    deadline = time.monotonic() + timeout_s
    while any(consumer.highwater(tp) is None for tp in tps) and time.monotonic() < deadline:
        consumer.poll(timeout_ms=100, max_records=1)
    return {tp.partition: int(consumer.highwater(tp) or 0) for tp in tps}


def position_before(consumer: KafkaConsumer, tp: TopicPartition, offset: int) -> bool:
    """Whether ``consumer``'s position on ``tp`` is still before ``offset`` (True while the position is
    unknown: not there yet)."""
    position = consumer.position(tp)
    return position is None or position < offset


class PartitionReader:
    """Reads single partitions for recovery: the ledger backwards in chunks, output partitions forwards; no
    consumer group (it never disturbs the group's membership).  Also answers ``ping`` (is the broker there?).
    Its waits scale with ``kafka.request_timeout_ms`` (30 s by default: an end offset within one request timeout, a
    read that makes no progress for two), so a caller that must notice a stop quickly gives it a shorter one.

    Full fetches, no incremental fetch session (KIP-227): the reader reads the same partition again and again (the
    broker guard's ledger ends every 5 s, a loss confirmed by fresh reads), and in a session a broker leaves out of
    its answer a partition whose fetch offset and highwater did not change, so the end of an unchanged partition
    read again never came (Apache Kafka 4.4, an empty partition read back to back: 27 of 30 reads timed out with
    sessions, 0 of 30 without; ``tests/test_apache_kafka_tansu_workarounds.py``)."""

    def __init__(self, kafka: KafkaSettings, *, stop: Callable[[], bool] | None = None) -> None:
        self.kafka = kafka
        self.stop = stop  # true: a read or a wait for an end gives up at once (KafkaTimeoutError)
        self.request_timeout_s = kafka.request_timeout_ms / 1000.0
        self.clock: Callable[[], float] = time.monotonic  # the read's waits (a test's simulated time)
        self.consumer = self._client(BOUNDS_MAX_WAIT_MS)  # ends (bounds), pings
        self.records = self._client(records_max_wait_ms(kafka))  # record reads, probes

    def _client(self, max_wait_ms: int) -> Any:  # a KafkaConsumer (no_auto_create: typed as the stubs do not)
        return no_auto_create(KafkaConsumer(
            **client_options(self.kafka), group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
            fetch_max_wait_ms=max_wait_ms, enable_incremental_fetch_sessions=False,
            **fetch_limits(self.kafka, partition_bytes=4 * 1048576)))

    def close(self) -> None:
        self.consumer.close()
        self.records.close()

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
            c.poll(timeout_ms=BOUNDS_POLL_MS, max_records=1)
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"no fetch response for {tp} within {timeout_s} s")
            self._check_stop(tp)
        return begin, int(c.highwater(tp))

    def _read(self, tp: TopicPartition, lo: int, hi: int, max_records: int) -> list[Any]:
        """The records of ``tp`` in ``[lo, hi)`` (``hi`` at most the end offset), read with ``self.records``.

        Offsets at the end of a partition can hold no record: Tansu on durable storage killed between writing a
        partition's watermark and the batch leaves such a gap (docs/tansu.md): a fetch there is answered with no
        record and a highwater above the fetch offset, until later records are appended.  But Tansu answers the same
        way where records are, when listing the partition's batch objects outlasts the fetch's max wait (see
        ``READ_MAX_WAIT_MS``: a recovery in CI read 1,962 real ledger entries as such a gap, and their records were
        processed twice).  So after ``GAP_SECONDS`` without a record the read probes (:meth:`_fresh_fetch`, at most
        every ``GAP_PROBE_SECONDS``), and only ``GAP_CONFIRMATIONS`` probes in a row answered empty below their
        highwater at the same offset make the rest of the range a gap (logged); a probe that brings records resets
        the count.  A fetch not answered at all (a slow or absent broker) is never a gap: the read waits, up to twice
        the request timeout without progress (``KafkaTimeoutError``).
        """
        c = self.records
        if c.assignment() != {tp}:
            c.assign([tp])
        c.seek(tp, lo)
        got: list[Any] = []
        stall_s = 2 * self.request_timeout_s
        now = self.clock()
        deadline = now + stall_s
        empty_since = next_probe = now
        empty_answers = 0  # probes in a row answered with no record below their highwater
        while c.position(tp) < hi:
            recs = c.poll(timeout_ms=500, max_records=max_records).get(tp, [])
            now = self.clock()
            if not recs and now - empty_since > GAP_SECONDS and now >= next_probe:
                position = c.position(tp)
                answer = self._fresh_fetch(tp, position)
                next_probe = self.clock() + GAP_PROBE_SECONDS
                if answer is not None:
                    recs, highwater = answer
                    if not recs and highwater > position:
                        empty_answers += 1
                        if empty_answers >= GAP_CONFIRMATIONS:
                            log.warning("%s: offsets [%d, %d) hold no records (%d fetches at %d in a row answered none "
                                        "below the highwater %d: the gap Tansu leaves when killed between writing a "
                                        "partition's watermark and its batch): read as empty", tp, position, hi,
                                        empty_answers, position, highwater)
                            break
                now = self.clock()
            got.extend(r for r in recs if lo <= r.offset < hi)
            if recs:
                deadline = now + stall_s
                empty_since = now
                empty_answers = 0
            elif now > deadline:
                raise KafkaTimeoutError(f"read of {tp} [{lo}, {hi}) made no progress for {stall_s:g} s")
            else:
                self._check_stop(tp)
        return got

    def _fresh_fetch(self, tp: TopicPartition, position: int) -> tuple[list[Any], int] | None:
        """One fetch of ``tp`` at ``position`` by ``self.records`` with the partition's kept state dropped, so that a
        highwater says this fetch was answered: (its records, possibly none; its highwater), or None when no answer
        came within the request timeout.  Leaves ``self.records`` assigned to ``tp`` only, past what it returned."""
        c = self.records
        c.assign([])
        c.assign([tp])
        c.seek(tp, position)
        deadline = self.clock() + self.request_timeout_s
        while True:
            recs = c.poll(timeout_ms=BOUNDS_POLL_MS, max_records=1000).get(tp, [])
            highwater = c.highwater(tp)
            if recs or highwater is not None:
                return list(recs), int(highwater) if highwater is not None else position + len(recs)
            if self.clock() > deadline:
                return None
            self._check_stop(tp)

    def _check_stop(self, tp: TopicPartition) -> None:
        if self.stop is not None and self.stop():
            raise KafkaTimeoutError(f"read of {tp} given up: stopping")

    def read_backward(self, topic: str, partition: int, chunk: int,
                      consume: Callable[[list[RawRecord]], bool], *, min_end: int = 0) -> int:
        """Hand ``consume`` the partition's records in chunks of ``chunk`` offsets, last chunk first (each chunk in
        offset order), until it returns true or the partition's beginning is reached (recovery's ledger scan);
        returns the end read from.  ``min_end``: an end below it is stale (a record acknowledged there exists):
        read again until it is not, ``KafkaTimeoutError`` after the request timeout."""
        tp = TopicPartition(topic, partition)
        begin, end = self.bounds(topic, partition)
        deadline = time.monotonic() + self.request_timeout_s
        while end < min_end:
            if time.monotonic() > deadline:
                raise KafkaTimeoutError(f"{tp} ends at {end}, below offset {min_end - 1} acknowledged before this "
                                        f"read, for {self.request_timeout_s:g} s")
            self._check_stop(tp)
            time.sleep(END_AGAIN_SECONDS)
            begin, end = self.bounds(topic, partition)
        hi = end
        while hi > begin:
            lo = max(begin, hi - chunk)
            recs = self._read(tp, lo, hi, chunk)
            if consume([(r.offset, r.key, r.value) for r in recs]):
                break
            hi = lo
        return end

    def read_forward(self, topic: str, partition: int, start: int | None,
                     chunk: int) -> tuple[list[tuple[bytes | None, bytes | None]], int]:
        """(key, value) of every record of the partition from ``start`` (None: its beginning) to its end, and
        the end offset (recovery step d)."""
        begin, end = self.bounds(topic, partition)
        lo = begin if start is None else max(begin, start)
        return [(key, value) for _, key, value in self._read_chunks(topic, partition, lo, end, chunk)], end

    def read_forward_records(self, topic: str, partition: int, start: int | None,
                             chunk: int) -> tuple[list[RawRecord], int]:
        """(offset, key, value) of every record of the partition from ``start`` (None: its beginning) to its end,
        and the end offset (the side paths' outbox recovery: which of a write-ahead's messages landed where)."""
        begin, end = self.bounds(topic, partition)
        lo = begin if start is None else max(begin, start)
        return self._read_chunks(topic, partition, lo, end, chunk), end

    def read_range(self, topic: str, partition: int, lo: int, hi: int, chunk: int = 10000) -> list[RawRecord]:
        """(offset, key, value) of every record of the partition in ``[lo, hi)`` (clipped to its bounds), read as the
        recovery reads: offsets that hold nothing are skipped, and an end-of-partition gap only once confirmed
        (:meth:`_read`); the audit's "is a record at these offsets?" (:func:`stream_anon.service.audit.records_at`)."""
        begin, end = self.bounds(topic, partition)
        return self._read_chunks(topic, partition, max(lo, begin), min(hi, end), chunk)

    def _read_chunks(self, topic: str, partition: int, lo: int, hi: int, chunk: int) -> list[RawRecord]:
        """(offset, key, value) of the records in ``[lo, hi)`` (``hi`` at most the end), read ``chunk`` offsets
        at a time (:meth:`_read`)."""
        tp = TopicPartition(topic, partition)
        out: list[RawRecord] = []
        while lo < hi:
            step = min(hi, lo + chunk)
            out.extend((r.offset, r.key, r.value) for r in self._read(tp, lo, step, chunk))
            lo = step
        return out

    def first_readable(self, topic: str, partition: int, offset: int, timeout_s: float = 10.0) -> bool:
        """Whether the record at ``offset`` can be read (False: the client raises CorruptRecordError there).
        Leaves this reader positioned past ``offset`` (a kafka-python fetcher that raised must be moved on).  Read with
        ``self.records`` (a fetch with a short max wait can be answered empty where records are: ``READ_MAX_WAIT_MS``)."""
        tp = TopicPartition(topic, partition)
        c = self.records
        c.assign([tp])
        c.seek(tp, offset)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                recs = c.poll(timeout_ms=200, max_records=1).get(tp, [])
                if recs:
                    return True
                if c.highwater(tp) is not None and offset >= int(c.highwater(tp)):
                    return True  # nothing there to read
            return True
        except CorruptRecordError:
            return False
        finally:
            c.seek(tp, offset + 1)
