"""Accounting from the ledger, pure (no Kafka, no Prometheus): every input offset accounted exactly once, every
promised output published exactly once (what ``stream-anon audit``, the demo summary, the tests and the service
benchmark report; :mod:`stream_anon.service.audit` does the Kafka reads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_anon.formats.release import ROLES, message_digest
from stream_anon.service.ledger import (
    KIND_CLASS,
    KIND_DLQ,
    KIND_SUPPRESSED,
    Checkpoint,
    ChunkAssembler,
    EntryChunk,
    LedgerEntry,
    LedgerFormatError,
    LedgerRecord,
    decode_ledger_value,
)


@dataclass
class PublishedCheck:
    """The promised outputs of one role against the messages of its topic."""

    expected: int = 0
    exactly_once: int = 0
    missing: list[str] = field(default_factory=list)  # release ids
    duplicated: list[str] = field(default_factory=list)  # release ids published more than once
    unexpected: int = 0  # messages of the topic promised by no entry

    @property
    def ok(self) -> bool:
        return not self.missing and not self.duplicated and not self.unexpected


@dataclass
class AccountingReport:
    """Every input offset against the ledger: outcome counts and what breaks "exactly once"."""

    outcomes: dict[str, int] = field(default_factory=dict)  # released / suppressed / dead_lettered / control
    suppressed_reasons: dict[str, int] = field(default_factory=dict)
    dlq_reasons: dict[str, int] = field(default_factory=dict)
    classes: int = 0
    entries: int = 0
    checkpoints: int = 0
    tombstones: int = 0
    rewrites: int = 0  # identical copies of an entry (a producer retry), counted once
    duplicates: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) in two entries
    missing: list[tuple[int, int]] = field(default_factory=list)  # (partition, offset) in no entry
    gaps: list[tuple[int, int]] = field(default_factory=list)
    """(partition, offset) in no entry that hold no record in the input (a gap the broker left: nothing to account
    for); filled by :meth:`AccountingReport.split_gaps` from a read of the input"""
    corrupt: list[tuple[int, int, str]] = field(default_factory=list)  # (partition, ledger offset, error)
    chunked: int = 0  # entries read as chunks (a large entry: ledger.EntryChunk)
    incomplete: list[tuple[int, str, int, int]] = field(default_factory=list)
    """(partition, release id, chunks read, chunks written) of chunked entries missing chunks: a crash between
    chunks; they count for nothing (their records were processed again)"""

    @property
    def ok(self) -> bool:
        return not self.duplicates and not self.missing and not self.corrupt

    @property
    def accounted(self) -> int:
        return sum(self.outcomes.values())

    def split_gaps(self, holding: set[tuple[int, int]]) -> None:
        """Of the offsets in no entry, those not in ``holding`` (the offsets where the input holds a record) are
        gaps, not lost records: moved from ``missing`` to ``gaps``."""
        self.gaps = [m for m in self.missing if m not in holding]
        self.missing = [m for m in self.missing if m in holding]


class LedgerAccounting:
    """The accounting view (``audit``, demo summary, verifier, linkage test): read whole ledger partitions
    forward with :meth:`add`, then :meth:`report` (every input offset released, suppressed, dead-lettered or a
    control marker exactly once) and :meth:`check_published` (every promised output on its topic exactly
    once, nothing else there)."""

    def __init__(self, topic: str, *, keep_entries: bool = False) -> None:
        self.topic = topic
        self.keep_entries = keep_entries
        self.entries: list[tuple[int, LedgerEntry]] = []  # (partition, entry), each entry once (keep_entries)
        self._outcome: dict[tuple[int, int], str] = {}
        self._values: dict[bytes, bytes] = {}
        self._report = AccountingReport()
        self._promised: dict[str, dict[bytes, str]] = {r: {} for r in ROLES}
        self.record_ids: dict[tuple[int, int], Any] = {}
        self.class_members: dict[str, tuple[tuple[int, int], ...]] = {}
        self._chunks: dict[int, ChunkAssembler] = {}  # per partition

    def add(self, partition: int, records: Iterable[LedgerRecord]) -> None:
        rep = self._report
        for rec in records:
            if rec.value is None:
                rep.tombstones += 1
                continue
            try:
                item = decode_ledger_value(rec.value)
            except LedgerFormatError as e:
                rep.corrupt.append((partition, rec.offset, str(e)))
                continue
            if item.topic != self.topic or item.partition != partition:
                rep.corrupt.append((partition, rec.offset, f"foreign: a record of {item.topic}/{item.partition}"))
                continue
            if isinstance(item, Checkpoint):
                rep.checkpoints += 1
                continue
            value = rec.value
            if isinstance(item, EntryChunk):
                try:
                    whole = self._chunks.setdefault(partition, ChunkAssembler()).add(rec.offset, item)
                except LedgerFormatError as e:
                    rep.corrupt.append((partition, rec.offset, str(e)))
                    continue
                if whole is None:
                    continue
                item, value = whole[0], whole[0].encode()
                rep.chunked += 1
            self._entry(partition, item, value)

    def _entry(self, partition: int, item: LedgerEntry, value: bytes) -> None:
        rep = self._report
        prev = self._values.get(item.key)
        if prev is not None and prev == value:
            rep.rewrites += 1
            return
        self._values[item.key] = value
        rep.entries += 1
        if self.keep_entries:
            self.entries.append((partition, item))
        outcome = item.outcome
        for i, o in enumerate(item.offsets):
            k = (partition, o)
            if k in self._outcome:
                rep.duplicates.append(k)
                continue
            self._outcome[k] = outcome
            rep.outcomes[outcome] = rep.outcomes.get(outcome, 0) + 1
            if item.record_ids:
                self.record_ids[k] = item.record_ids[i]
        if item.kind == KIND_CLASS:
            rep.classes += 1
            assert item.class_id is not None
            self.class_members[item.class_id] = tuple((partition, o) for o in item.offsets)
        elif item.kind == KIND_SUPPRESSED:
            assert item.reason is not None
            rep.suppressed_reasons[item.reason] = rep.suppressed_reasons.get(item.reason, 0) + len(item.offsets)
        elif item.kind == KIND_DLQ:
            assert item.reason is not None
            rep.dlq_reasons[item.reason] = rep.dlq_reasons.get(item.reason, 0) + 1
        for m in item.outputs:
            self._promised[m.role][m.digest()] = item.release_id

    def outcome(self, partition: int, offset: int) -> str | None:
        return self._outcome.get((partition, offset))

    def report(self, input_ends: Mapping[int, int] | None = None,
               input_begins: Mapping[int, int] | None = None) -> AccountingReport:
        """The report; with ``input_ends`` (partition -> end offset of the input) every offset in
        ``[begin, end)`` (begin default 0) must be accounted, else it is listed in ``missing``."""
        rep = self._report
        rep.missing = []
        rep.incomplete = [(p, c.release_id, have, c.count) for p, a in sorted(self._chunks.items())
                          for _eid, c, have in a.incomplete()]
        for p, end in sorted((input_ends or {}).items()):
            begin = (input_begins or {}).get(p, 0)
            rep.missing.extend((p, o) for o in range(begin, end) if (p, o) not in self._outcome)
        return rep

    def check_published(self, role: str, messages: Iterable[tuple[bytes | None, bytes | None]]) -> PublishedCheck:
        """Compare the promised outputs of ``role`` with the (key, value) of every message of its topic."""
        promised = self._promised[role]
        seen: dict[bytes, int] = {}
        chk = PublishedCheck(expected=len(promised))
        for key, value in messages:
            d = message_digest(role, key, value)
            if d not in promised:
                chk.unexpected += 1
                continue
            seen[d] = seen.get(d, 0) + 1
        for d, rid in promised.items():
            n = seen.get(d, 0)
            if n == 0:
                chk.missing.append(rid)
            elif n > 1:
                chk.duplicated.append(rid)
            else:
                chk.exactly_once += 1
        return chk


# ------------------------------------------------------------------------------------------------ the stop line
@dataclass(frozen=True)
class StopCounts:
    """What one service process did with what it consumed, when it stops (the final line of ``run`` and ``demo``).

    ``consumed`` = ``released`` + ``suppressed`` + ``dead_lettered`` + ``skipped`` (already accounted by an earlier
    run: recovery) + ``left`` (buffered in the engines, not yet released: not committed, so the next start reads
    them again) + ``handed_over`` (buffered in partitions taken away by a rebalance: their new owner reads them
    again).  End-of-stream markers are not records and count in none of them.
    """

    consumed: int
    released: int
    suppressed: int
    dead_lettered: int
    skipped: int
    left: int

    @property
    def handed_over(self) -> int:
        return self.consumed - self.released - self.suppressed - self.dead_lettered - self.skipped - self.left


def stop_line(counts: StopCounts, *, memory_broker: bool = False) -> str:
    """The final line of a stopped service: what it consumed and what became of it, consistent with each other
    (see :class:`StopCounts`).  ``memory_broker``: the records left are lost with the embedded in-memory broker;
    the line says so and how to keep them."""
    c = counts
    parts = [f"consumed {c.consumed:,}", f"released {c.released:,}", f"suppressed {c.suppressed:,}",
             f"dead-lettered {c.dead_lettered:,}"]
    if c.skipped:
        parts.append(f"skipped {c.skipped:,} (accounted by an earlier run)")
    if c.handed_over:
        parts.append(f"handed to other members at rebalances {c.handed_over:,}")
    left = f"left for the next start {c.left:,} (buffered, not yet released"
    if c.left and memory_broker:
        left += ("; LOST with the embedded in-memory broker: to keep them, run against an external broker "
                 "(--bootstrap-servers) or on durable storage, or end the input with an end-of-stream marker "
                 "before stopping")
    return ", ".join(parts) + ", " + left + ")"
