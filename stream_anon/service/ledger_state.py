"""The ledger's state per partition (pure): :class:`PartitionOutbox`, the writer side of one ledger partition
(acknowledged output ends, checkpoint numbering, keys to tombstone once committed past), and :class:`RecoveryPlan`,
what a partition's recovery read from the ledger, and :class:`ChunkAssembler`, which reassembles chunked entries
(entries and formats: :mod:`stream_anon.service.ledger`).
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stream_anon.service.ledger import (
    Checkpoint,
    EntryChunk,
    LedgerEntry,
    LedgerFormatError,
    decode_ledger_value,
)


# ---------------------------------------------------------------------------------------------- writer state
class PartitionOutbox:
    """The writer side of one ledger partition (pure state; the Kafka loop sends what it returns).

    Tracks the output end offsets as acknowledged (:meth:`acked`), numbers the checkpoints, and remembers
    which ledger keys may be tombstoned once the consumer offset is committed past them.
    """

    def __init__(self, topic: str, partition: int, *, incarnation: str, ends: Mapping[str, int] | None = None,
                 horizon: int = -1, group: str = "") -> None:
        self.topic = topic
        self.partition = partition
        self.incarnation = incarnation
        self.group = group
        self._ends: dict[str, int] = {r: int(e) for r, e in (ends or {}).items()}
        self.horizon = horizon
        self._seq = 0
        self._entries: list[tuple[int, bytes]] = []  # heap of (last offset, key)
        self._checkpoints: list[tuple[int, bytes]] = []  # (horizon, key), in ledger order
        self.last_checkpoint: Checkpoint | None = None

    @classmethod
    def from_recovery(cls, plan: RecoveryPlan, *, incarnation: str, ends: Mapping[str, int] | None = None,
                      group: str = "") -> PartitionOutbox:
        """The outbox of a new incarnation after recovery: ends = the plan's checkpoint ends raised by ``ends``
        (e.g. the output partitions' highwater read during the re-send scan); remembers the keys the scan saw
        so that they are tombstoned too."""
        merged = dict(plan.scan_from or {})
        for r, e in (ends or {}).items():
            merged[r] = max(merged.get(r, 0), int(e))
        box = cls(plan.topic, plan.partition, incarnation=incarnation, ends=merged, horizon=plan.horizon, group=group)
        for last, key in plan.seen_entries:
            heapq.heappush(box._entries, (last, key))
        box._checkpoints = list(plan.seen_checkpoints)
        return box

    @property
    def ends(self) -> dict[str, int]:
        return dict(self._ends)

    def record(self, entry: LedgerEntry, keys: Sequence[bytes] | None = None) -> None:
        """Remember an entry written to this ledger partition under ``keys`` (default its key; a chunked entry: the
        keys of its chunks) for tombstones; raises the horizon."""
        for key in (entry.key,) if keys is None else keys:
            heapq.heappush(self._entries, (entry.last_offset, key))
        if entry.horizon > self.horizon:
            self.horizon = entry.horizon

    def acked(self, role: str, offset: int) -> None:
        """An output message of ``role`` was acknowledged at ``offset`` of its output partition."""
        if offset + 1 > self._ends.get(role, 0):
            self._ends[role] = offset + 1

    def checkpoint(self, watermark: int, horizon: int | None = None) -> Checkpoint:
        """The next checkpoint (send it after the flush of step 3; commit ``watermark`` once it is acknowledged)."""
        h = max(self.horizon, watermark - 1) if horizon is None else max(horizon, self.horizon, watermark - 1)
        self.horizon = h
        self._seq += 1
        ck = Checkpoint(self.topic, self.partition, watermark, h, tuple(sorted(self._ends.items())), self._seq,
                        self.incarnation, self.group)
        self._checkpoints.append((ck.horizon, ck.key))
        self.last_checkpoint = ck
        return ck

    def tombstones(self, committed: int) -> list[bytes]:
        """Ledger keys that no recovery can need once ``committed`` is the group's committed offset: entries
        wholly below it, and checkpoints older than the newest checkpoint whose horizon is below it (that one
        still stops a later scan).  Each key is returned once."""
        out = []
        heap = self._entries
        while heap and heap[0][0] < committed:
            out.append(heapq.heappop(heap)[1])
        cps = self._checkpoints
        stop = -1
        for i, (h, _) in enumerate(cps):
            if h < committed:
                stop = i
        if stop > 0:
            out.extend(k for _, k in cps[:stop])
            self._checkpoints = cps[stop:]
        return out


# ---------------------------------------------------------------------------------------------- recovery plan
@dataclass(frozen=True)
class RecoveryPlan:
    """What the backward scan of one ledger partition found.

    Attributes:
        start_offset: where the new incarnation consumes from: max(committed offset, last checkpoint's
            watermark); None when neither exists (then: the consumer's reset position, e.g. earliest).
        accounted: offsets >= start_offset already in the ledger (skip them).
        horizon: highest input offset consumed by any earlier incarnation (>= start_offset - 1).
        checkpoint: the last checkpoint (None: none in the ledger partition).
        pending: entries after the last checkpoint not wholly below the committed offset, in ledger order: their
            outputs may be missing.
        scan_from: role -> output offset where the presence scan starts (the checkpoint's ends; None without
            a checkpoint: scan the output partitions from their beginning).
        conflicts: (input offset, ledger offsets) held by two different entries (a broken invariant).
        corrupt: (ledger offset, what is wrong) of messages that are not ledger records of this partition.
        records_read, tombstones: counts.
        seen_entries / seen_checkpoints: (last offset, key) / (horizon, key) of what was read (tombstones).
        foreign_groups: consumer groups other than the scan's own that wrote checkpoints read by the scan: the
            ledger is shared by two services, a configuration error (the plan must not be used).
    """

    topic: str
    partition: int
    start_offset: int | None
    accounted: frozenset[int]
    horizon: int
    checkpoint: Checkpoint | None
    pending: tuple[LedgerEntry, ...]
    scan_from: dict[str, int] | None
    conflicts: tuple[tuple[int, tuple[int, ...]], ...] = ()
    corrupt: tuple[tuple[int, str], ...] = ()
    records_read: int = 0
    tombstones: int = 0
    seen_entries: tuple[tuple[int, bytes], ...] = ()
    seen_checkpoints: tuple[tuple[int, bytes], ...] = ()
    foreign_groups: tuple[str, ...] = ()


class ChunkAssembler:
    """Reassembles chunked entries from ledger records read in any order (forward or backward scans).

    :meth:`add` returns the whole entry once its last missing chunk arrives (with the ledger keys of all its
    chunks and the highest ledger offset among them), else None; identical copies of a chunk (a producer retry)
    count once.  :meth:`incomplete` lists the entries still missing chunks: a crash between chunks, they count for
    nothing."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, tuple[int, EntryChunk]]] = {}
        self._done: set[str] = set()

    def add(self, ledger_offset: int, chunk: EntryChunk) -> tuple[LedgerEntry, list[bytes], int] | None:
        """Raises :class:`LedgerFormatError` for a chunk that contradicts its siblings or whose whole is not an
        entry of its own header."""
        if chunk.entry_id in self._done:
            return None  # a re-sent copy of a chunk of an entry already complete
        parts = self._parts.setdefault(chunk.entry_id, {})
        old = parts.get(chunk.index)
        if old is not None:
            if old[1] != chunk:
                raise LedgerFormatError(f"chunk {chunk.index} of entry {chunk.entry_id} written twice, differently")
            return None
        if parts and next(iter(parts.values()))[1].count != chunk.count:
            raise LedgerFormatError(f"entry {chunk.entry_id}: chunks disagree on their count")
        parts[chunk.index] = (ledger_offset, chunk)
        if len(parts) < chunk.count:
            return None
        del self._parts[chunk.entry_id]
        self._done.add(chunk.entry_id)
        ordered = [parts[i][1] for i in range(chunk.count)]
        value = b"".join(c.data for c in ordered)
        if hashlib.sha256(value).hexdigest()[:32] != chunk.entry_id:
            raise LedgerFormatError(f"entry {chunk.entry_id}: its chunks do not add up to it")
        entry = decode_ledger_value(value)
        if not isinstance(entry, LedgerEntry) or (entry.kind, entry.topic, entry.partition, entry.offsets[0],
                                                  entry.last_offset) != (chunk.kind, chunk.topic, chunk.partition,
                                                                         chunk.first, chunk.last):
            raise LedgerFormatError(f"entry {chunk.entry_id}: its chunks hold another entry than their header says")
        return entry, [c.key for c in ordered], max(lo for lo, _ in parts.values())

    def incomplete(self) -> list[tuple[str, EntryChunk, int]]:
        """(entry id, one of its chunks, chunks present) of every entry still missing chunks."""
        return [(eid, next(iter(p.values()))[1], len(p)) for eid, p in sorted(self._parts.items())]
