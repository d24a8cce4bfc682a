"""Recovery of one input partition from the ledger (no Kafka client, no Prometheus): steps a-e of the outbox
protocol in :mod:`stream_anon.service.ledger` (its docstring states the protocol and the invariants I1-I4).

:class:`LedgerScan` reads the ledger partition backwards in chunks until a checkpoint proves nothing older is
needed and plans the start (:class:`RecoveryPlan`); :class:`OutputPresence` holds what the output partitions
hold after the checkpoint; :func:`outputs_to_resend` names the promised outputs that are missing, in order,
byte-identical.  :class:`PartitionRecovery` runs the steps against a reader (:class:`PartitionReading`: the
service's :class:`~stream_anon.kafka_io.reader.PartitionReader`, or the simulated broker of
``tests/test_ledger.py``) and the producers.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from stream_anon.formats.messages import Receipt
from stream_anon.formats.release import EncodedMessage, message_digest
from stream_anon.service.ledger import (
    Checkpoint,
    EntryChunk,
    LedgerEntry,
    LedgerFormatError,
    LedgerRecord,
    decode_ledger_value,
)
from stream_anon.service.ledger_state import ChunkAssembler, PartitionOutbox, RecoveryPlan
from stream_anon.service.outbox import Producers, Topics
from stream_anon.service.partitions import OwnedPartition, PartitionTable

log = logging.getLogger(__name__)

T = TypeVar("T")


class LedgerScan:
    """Backward scan of one ledger partition (recovery step b).

    Feed ``add_chunk`` with chunks in backward order (each chunk in forward offset order) until it returns True
    or the partition's beginning is reached, then call :meth:`finish`.  Stops at the first checkpoint (from the
    end) whose horizon is below the threshold max(committed, last checkpoint's watermark): by I3 everything
    before it holds only offsets below the threshold.  Only checkpoints stop the scan (they follow a flush, so a
    re-sent entry that landed out of order cannot end it early).  Foreign or corrupt messages are reported in
    ``corrupt`` and skipped; identical re-writes of one entry count once.  A chunked entry counts once all its
    chunks are read (they are written in one send, with no checkpoint between them); one that misses chunks (a
    crash between them) counts for nothing: its records are processed again and its chunks are tombstoned later.
    """

    def __init__(self, topic: str, partition: int, committed: int | None, *, group: str = "") -> None:
        self.topic = topic
        self.partition = partition
        self.committed = committed
        self.group = group
        self.foreign_groups: set[str] = set()
        self.done = False
        self.records_read = 0
        self.tombstones = 0
        self.checkpoint: Checkpoint | None = None
        self._threshold: int | None = None
        self._entries: list[tuple[int, LedgerEntry, bytes]] = []  # backward order (ledger offset, entry, value)
        self._n_after = 0  # how many of _entries precede (in scan order) the last checkpoint
        self._checkpoints: list[tuple[int, bytes]] = []
        self._corrupt: list[tuple[int, str]] = []
        self._horizon = -1
        self._chunks = ChunkAssembler()
        self._chunk_keys: list[tuple[int, bytes]] = []  # (entry's last offset, key) of every chunk read
        self._chunked: set[bytes] = set()  # keys of the entries that were read as chunks (they have no own key)

    def add_chunk(self, chunk: Sequence[LedgerRecord]) -> bool:
        if self.done:
            return True
        for rec in reversed(chunk):
            self.records_read += 1
            if rec.value is None:
                self.tombstones += 1
                continue
            try:
                item = decode_ledger_value(rec.value)
            except LedgerFormatError as e:
                self._corrupt.append((rec.offset, str(e)))
                continue
            if item.topic != self.topic or item.partition != self.partition:
                self._corrupt.append((rec.offset, f"foreign: a record of {item.topic}/{item.partition}"))
                continue
            self._horizon = max(self._horizon, item.horizon)
            if isinstance(item, EntryChunk):
                self._chunk_keys.append((item.last, item.key))
                try:
                    whole = self._chunks.add(rec.offset, item)
                except LedgerFormatError as e:
                    self._corrupt.append((rec.offset, str(e)))
                    continue
                if whole is not None:
                    entry, _keys, last_offset = whole
                    self._chunked.add(entry.key)
                    self._entries.append((last_offset, entry, entry.encode()))
                continue
            if isinstance(item, Checkpoint):
                if self.group and item.group and item.group != self.group:
                    self.foreign_groups.add(item.group)
                self._checkpoints.append((item.horizon, item.key))
                if self.checkpoint is None:
                    self.checkpoint = item
                    self._n_after = len(self._entries)
                    self._threshold = item.watermark if self.committed is None else max(self.committed,
                                                                                        item.watermark)
                assert self._threshold is not None
                if item.horizon < self._threshold:
                    self.done = True
                    return True
                continue
            self._entries.append((rec.offset, item, rec.value))
        return False

    def finish(self) -> RecoveryPlan:
        ck = self.checkpoint
        candidates = [x for x in (self.committed, ck.watermark if ck else None) if x is not None]
        start = max(candidates) if candidates else None
        by_offset: dict[int, int] = {}
        seen_values: dict[bytes, bytes] = {}
        conflicts: dict[int, list[int]] = {}
        unique: list[tuple[int, LedgerEntry]] = []
        for lo, e, value in reversed(self._entries):  # ledger order
            prev = seen_values.get(e.key)
            if prev is not None and prev == value:
                continue  # the same entry written twice (a producer retry): one entry
            seen_values[e.key] = value
            unique.append((lo, e))
            for o in e.offsets:
                if o in by_offset:
                    conflicts.setdefault(o, [by_offset[o]]).append(lo)
                else:
                    by_offset[o] = lo
        accounted = frozenset(o for o in by_offset if start is None or o >= start)
        after_offsets = {lo for lo, _, _ in self._entries[: self._n_after]} if ck is not None \
            else {lo for lo, _, _ in self._entries}
        pending = tuple(e for lo, e in unique if lo in after_offsets
                        and (self.committed is None or e.last_offset >= self.committed))
        horizon = self._horizon if start is None else max(self._horizon, start - 1)
        return RecoveryPlan(
            topic=self.topic, partition=self.partition, start_offset=start, accounted=accounted, horizon=horizon,
            checkpoint=ck, pending=pending, scan_from=ck.ends_map if ck is not None else None,
            conflicts=tuple((o, tuple(los)) for o, los in sorted(conflicts.items())),
            corrupt=tuple(self._corrupt), records_read=self.records_read, tombstones=self.tombstones,
            seen_entries=tuple((e.last_offset, e.key) for _, e in unique if e.key not in self._chunked)
            + tuple(self._chunk_keys),
            seen_checkpoints=tuple(reversed(self._checkpoints)), foreign_groups=tuple(sorted(self.foreign_groups)))


class OutputPresence:
    """The output messages found in the output partitions from ``plan.scan_from`` on (recovery step d)."""

    def __init__(self) -> None:
        self._digests: dict[bytes, int] = {}

    def add(self, role: str, key: bytes | None, value: bytes | None) -> None:
        d = message_digest(role, key, value)
        self._digests[d] = self._digests.get(d, 0) + 1

    def add_many(self, role: str, messages: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        for key, value in messages:
            self.add(role, key, value)

    def __contains__(self, digest: object) -> bool:
        return digest in self._digests

    def count(self, message: EncodedMessage) -> int:
        return self._digests.get(message.digest(), 0)

    @property
    def digests(self) -> Collection[bytes]:
        return self._digests.keys()


def outputs_to_resend(pending: Sequence[LedgerEntry], present: Collection[bytes] | OutputPresence
                      ) -> list[EncodedMessage]:
    """The promised outputs of ``pending`` that are not in ``present`` (digests of the messages found), in
    ledger order.  Re-send them as they are: same role, key and value bytes, no headers."""
    out = []
    for e in pending:
        for m in e.outputs:
            if m.digest() not in present:
                out.append(m)
    return out


# ---------------------------------------------------------------------------------------------- the steps
def fence_key(topic: str, partition: int) -> bytes:
    """The ledger key of the tombstone a recovery writes after its first scan (:meth:`PartitionRecovery._fence`);
    no entry, chunk or checkpoint key has this form."""
    return f"{topic}/{partition}/fence".encode("utf-8", "backslashreplace")


class LedgerConflictError(RuntimeError):
    """The ledger holds checkpoints of another consumer group: two services (two sets of output topics) share one
    ledger, which would make each skip the other's records.  A configuration error: ``run`` exits 2."""


class LedgerLostError(RuntimeError):
    """The broker holds less than the ledger says this service wrote: a ledger partition without any checkpoint
    although the group committed an offset (every commit follows a checkpoint, and compaction keeps the newest one:
    the ledger was deleted or recreated), or an output partition that ends below the end the ledger's last
    checkpoint recorded (the output topic was deleted or recreated).  Going on would publish over the loss and
    account for records that are gone: ``run`` exits 4, on every start, until the operator acts
    (docs/service.md, "A topic that was deleted or recreated")."""


class PartitionReading(Protocol):
    """The reads recovery needs (:class:`~stream_anon.kafka_io.reader.PartitionReader`)."""

    def bounds(self, topic: str, partition: int, timeout_s: float | None = None) -> tuple[int, int]: ...

    def read_backward(self, topic: str, partition: int, chunk: int,
                      consume: Callable[[list[tuple[int, bytes | None, bytes | None]]], bool], *,
                      min_end: int = 0) -> int: ...

    def read_forward(self, topic: str, partition: int, start: int | None,
                     chunk: int) -> tuple[list[tuple[bytes | None, bytes | None]], int]: ...


class Retry(Protocol):
    """Calls ``fn`` until the broker answers it (``what`` names it in the log); the service's retries only stop
    when the service is told to stop."""

    def __call__(self, what: str, fn: Callable[[], T]) -> T: ...


def call_once(what: str, fn: Callable[[], T]) -> T:
    """A :class:`Retry` that does not retry (a simulated broker always answers)."""
    return fn()


@dataclass(frozen=True)
class Recovered:
    """A recovered partition: its table entry, the plan it started from, its start offset, and the topic of
    every output re-sent."""

    owned: OwnedPartition
    plan: RecoveryPlan
    start: int
    resent: tuple[str, ...]

    @property
    def accounted(self) -> tuple[int, ...]:
        """Offsets at or after the start the ledger already accounts for (the pipeline skips them)."""
        return tuple(sorted(self.plan.accounted))


class PartitionRecovery:
    """Recovery steps a-e of one input partition (see the module docstring of :mod:`stream_anon.service.ledger`).

    :meth:`plan`: the backward scan of its ledger partition (a-c); :meth:`recover`: the presence scan of its output
    partitions, the byte-identical re-send of what the ledger promised and is missing, the new incarnation's first
    checkpoint (d-e), and its entry in the partition table.

    Args:
        group: the consumer group (checkpoints carry it; another group's checkpoints are a conflict).
        chunk: records read per step (``service.readback_chunk``).
        retry: how reads are retried (:class:`Retry`).
        on_ledger: called with the receipt of the acknowledged first checkpoint (the data-loss check's floors).
        confirm_seconds: a partition that looks lost (an output partition ending below its checkpoint's end, a
            ledger without the checkpoint of a committed offset) is read again for this long before
            :class:`LedgerLostError` (a replicated cluster's new leader can report a lower highwater for a moment:
            ``broker_guard.HIGHWATER_CONFIRM_SECONDS`` in the service; 0 by default).
    """

    def __init__(self, table: PartitionTable, producers: Producers, reader: PartitionReading, topics: Topics, *,
                 group: str, chunk: int, retry: Retry = call_once,
                 on_ledger: Callable[[Receipt], None] = lambda _: None, confirm_seconds: float = 0.0) -> None:
        self.confirm_seconds = confirm_seconds
        self.table = table
        self.producers = producers
        self.reader = reader
        self.topics = topics
        self.group = group
        self.chunk = chunk
        self.retry = retry
        self.on_ledger = on_ledger

    def plan(self, partition: int, committed: int | None) -> RecoveryPlan:
        """Steps a-c: the backward scan of the partition's ledger partition, from the committed offset.

        The scan is checked against a fence (:meth:`_fence`), written after it so that a ledger that is lost (or
        another service's) gets no write at all: when the fence does not land right at the end the scan read
        from, records lie beyond that end (a stale end, or writes of another member sharing the ledger
        partition), and the scan is done again from an end of at least the fence's."""
        topic = self.topics.ledger
        lp = self.producers.ledger.partition_for(topic, partition)

        def scan(min_end: int = 0) -> tuple[RecoveryPlan, int]:
            def read() -> tuple[LedgerScan, int]:
                s = LedgerScan(self.topics.input, partition, committed, group=self.group)
                end = self.reader.read_backward(topic, lp, self.chunk,
                                                lambda recs: s.add_chunk([LedgerRecord(*r) for r in recs]),
                                                min_end=min_end)
                return s, end

            done, end = self.retry(f"partition {partition}: ledger scan", read)
            return done.finish(), end

        plan, end = scan()
        deadline = time.monotonic() + self.confirm_seconds
        while committed is not None and plan.checkpoint is None and time.monotonic() < deadline:
            time.sleep(0.2)  # a new leader's highwater may hide the checkpoint for a moment: read again
            plan, end = scan()
        if committed is not None and plan.checkpoint is None:
            raise LedgerLostError(
                f"ledger {topic}[{lp}] holds no checkpoint, yet group {self.group!r} committed offset {committed} of "
                f"{self.topics.input}[{partition}]: the ledger was deleted or recreated (or topics.ledger names "
                f"another one); nothing is consumed or published over it")
        self._refuse_foreign(plan)
        fence = self._fence(partition)
        if fence > end + 1:  # records beyond the end read: read again from the fence
            log.info("partition %d: ledger %s[%d] read to offset %d, its fence landed at %d: read again", partition,
                     topic, lp, end, fence - 1)
            plan, end = scan(fence)
            self._refuse_foreign(plan)
        if plan.conflicts:
            log.error("partition %d: ledger %s holds offsets in two different entries (first: %s): accounted once "
                      "here, the audit reports them", partition, topic, plan.conflicts[:3])
        if plan.corrupt:
            log.warning("partition %d: %d ledger record(s) are not entries of this partition (first: %s); skipped",
                        partition, len(plan.corrupt), plan.corrupt[0])
        return plan

    def _refuse_foreign(self, plan: RecoveryPlan) -> None:
        if plan.foreign_groups:
            raise LedgerConflictError(
                f"topics.ledger: {self.topics.ledger} holds checkpoints of consumer group(s) "
                f"{list(plan.foreign_groups)}, this service is group {self.group!r}: each service (consumer group, "
                f"set of output topics) needs its own ledger; set topics.ledger (default <input>.ledger)")

    def _fence(self, partition: int) -> int:
        """A tombstone written to the partition's ledger partition; returns the end a scan must reach (the
        tombstone's acknowledged offset + 1).  Every entry acknowledged before it lies below it, so a ledger end
        read below it is stale, not the end: a replicated cluster's new leader can answer fetches with a
        highwater behind its predecessor's for a moment (Apache Kafka 4.4, three nodes: 129,148 after 145,148 for
        1.45 s), which would have hidden the newest entries and made their offsets be processed again.  The key
        (:func:`fence_key`) names no entry (the scan, the audit and compaction skip tombstones)."""
        ledger = self.producers.ledger
        receipt = ledger.send([self.topics.ledger_message(partition, fence_key(self.topics.input, partition), None)])
        ledger.flush()
        self.on_ledger(receipt)
        return max(d.offset for d in receipt.deliveries()) + 1

    def recover(self, partition: int, plan: RecoveryPlan, start: int) -> Recovered:
        """Steps d-e: complete what the ledger promised, write the new incarnation's first checkpoint, own the
        partition from ``start``."""
        t0 = time.monotonic()
        presence, ends = self._scan_outputs(partition, plan)
        incarnation = secrets.token_hex(4)
        box = PartitionOutbox.from_recovery(plan, incarnation=incarnation, ends=ends, group=self.group)
        resend = outputs_to_resend(plan.pending, presence)
        resent: list[str] = []
        if resend:
            outputs = self.producers.outputs
            receipt = outputs.send([self.topics.output(partition, m) for m in resend])
            outputs.flush()
            for d in receipt.deliveries():
                box.acked(self.topics.role_of[d.topic], d.offset)
                resent.append(d.topic)
        ck = box.checkpoint(start, plan.horizon)
        ledger = self.producers.ledger
        ck_receipt = ledger.send([self.topics.ledger_message(partition, ck.key, ck.encode())])
        ledger.flush()
        self.on_ledger(ck_receipt)
        horizon = max(plan.horizon, start - 1)
        owned = OwnedPartition(partition, box, watermark=start, next_offset=start, horizon=horizon)
        self.table.add(owned)
        log.info("partition %d: starting at offset %d (incarnation %s); ledger scan read %d records: %d offsets at or "
                 "after it already accounted (will be skipped), %d entries after the last checkpoint, %d outputs "
                 "re-sent, horizon %d; %.2f s", partition, start, incarnation, plan.records_read, len(plan.accounted),
                 len(plan.pending), len(resend), horizon, time.monotonic() - t0)
        return Recovered(owned, plan, start, tuple(resent))

    def _scan_outputs(self, partition: int, plan: RecoveryPlan) -> tuple[OutputPresence, dict[str, int]]:
        """Step d's reads: which promised outputs are in the output partitions (when any is pending), and where
        this incarnation's outputs will land at the earliest.  An output partition that ends below the end the
        last checkpoint recorded lost what this service wrote there: :class:`LedgerLostError`."""
        presence = OutputPresence()
        ends: dict[str, int] = {}
        for role, topic in self.topics.roles.items():
            op = self.producers.outputs.partition_for(topic, partition)
            since = (plan.scan_from or {}).get(role)

            def scan(t: str = topic, o: int = op, s: int | None = since) -> tuple[list[tuple[bytes | None,
                                                                                            bytes | None]], int]:
                return self.reader.read_forward(t, o, s, self.chunk)

            def end(t: str = topic, o: int = op) -> int:
                return self.reader.bounds(t, o)[1]

            msgs: list[tuple[bytes | None, bytes | None]] = []
            deadline = time.monotonic() + self.confirm_seconds
            while True:
                if plan.pending:
                    msgs, ends[role] = self.retry(f"partition {partition}: scan of {topic}", scan)
                else:
                    ends[role] = self.retry(f"partition {partition}: end of {topic}", end)
                if since is None or ends[role] >= since or time.monotonic() >= deadline:
                    break
                time.sleep(0.2)  # a new leader's highwater may lag for a moment: read (and scan) again
            presence.add_many(role, msgs)
            if since is not None and ends[role] < since:
                lp = self.producers.ledger.partition_for(self.topics.ledger, partition)
                raise LedgerLostError(
                    f"{topic}[{op}] ends at offset {ends[role]}, below offset {since} that the last checkpoint of "
                    f"ledger partition {self.topics.ledger}[{lp}] recorded: the output topic was deleted or "
                    f"recreated; nothing is re-sent or published over it")
        return presence, ends
