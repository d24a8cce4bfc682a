"""Recovery of one input partition from the ledger, pure (no Kafka, no Prometheus): steps a-e of the outbox
protocol in :mod:`stream_anon.service.ledger` (its docstring states the protocol and the invariants I1-I4).

:class:`LedgerScan` reads the ledger partition backwards in chunks until a checkpoint proves nothing older is
needed and plans the start (:class:`RecoveryPlan`); :class:`OutputPresence` holds what the output partitions
hold after the checkpoint; :func:`outputs_to_resend` names the promised outputs that are missing, in order,
byte-identical.  The Kafka reads are :class:`stream_anon.kafka_io.reader.PartitionReader`'s.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from stream_anon.formats.release import EncodedMessage, message_digest
from stream_anon.service.ledger import (
    Checkpoint,
    LedgerEntry,
    LedgerFormatError,
    LedgerRecord,
    RecoveryPlan,
    decode_ledger_value,
)


class LedgerScan:
    """Backward scan of one ledger partition (recovery step b).

    Feed ``add_chunk`` with chunks in backward order (each chunk in forward offset order) until it returns True
    or the partition's beginning is reached, then call :meth:`finish`.  Stops at the first checkpoint (from the
    end) whose horizon is below the threshold max(committed, last checkpoint's watermark): by I3 everything
    before it holds only offsets below the threshold.  Only checkpoints stop the scan (they follow a flush, so a
    re-sent entry that landed out of order cannot end it early).  Foreign or corrupt messages are reported in
    ``corrupt`` and skipped; identical re-writes of one entry count once.
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
            seen_entries=tuple((e.last_offset, e.key) for _, e in unique),
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
