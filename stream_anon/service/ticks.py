"""Class releases on ticks: the public timestamp and position of a class say which tick it was formed in, nothing
more (issue 19 item 4; pure: no Kafka, no clock of its own).

Without ticks a class message leaves as soon as its ledger entry is acknowledged: its Kafka timestamp comes tens of
milliseconds after the arrival that released it, and CASTLE releases a class when its oldest record is delta
arrivals old, so the record that arrived delta arrivals before the latest arrival preceding the timestamp is a
member of the class (almost always), and the order of classes on the anon partition is the order of their
triggers.  An attacker who knows the arrival times and QIs (docs/threat-model.md) pins that member.

:class:`ReleaseTicks` cuts wall-clock time into ticks of ``release.tick_seconds`` (aligned to the epoch, so the
boundaries never depend on arrivals).  A class entry the pipeline produced is *held* (in the partition's
:class:`~stream_anon.service.partitions.OwnedPartition`: :class:`~stream_anon.service.partitions.HeldClasses`)
until the end of the tick in which the loop received it; then every class held for that tick, partition by partition, is shuffled with the injected generator
(ChaCha20 from OS entropy by default) and written to the ledger in that order, each output stamped with the tick's
end as its Kafka timestamp (recorded in the entry, so a re-send after a crash carries the same timestamp and comes
in the same shuffled order: the ledger order).  Every class of a tick thus has one timestamp, and their offsets are
a uniformly random order of the tick's classes: a class message tells which tick it was formed in, never which
arrival in the tick released it.

The ledger protocol is unchanged: a held class is not in the ledger yet, so for recovery it is like a record still
in the engine, and the partition's commit watermark stays at or below the first offset of every held class
(:meth:`~stream_anon.service.partitions.HeldClasses.cap`): a crash before the tick ends loses nothing (the records
are consumed and anonymized again), a commit never covers a held class.  Suppressions and dead letters are written at once (their topics are
internal); an end-of-stream marker that comes while classes are held waits with them and is written after them
(:meth:`ReleaseTicks.hold`).

When a partition leaves this member (a revoke, a clean stop) its held classes are released at once, stamped with
the end of their tick (which may be up to one tick ahead): the group of a tick stays one shuffled block with one
timestamp.  A producer recreation or a failed revoke drops them with the partition (they are formed again).
``release.tick_seconds: 0`` publishes each class at once (the behaviour before ticks).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from stream_anon.core.validation import require_float
from stream_anon.service.ledger import KIND_CLASS, KIND_CONTROL, LedgerEntry
from stream_anon.service.partitions import OwnedPartition, PartitionTable

MAX_TICK_SECONDS = 3600.0
"""The longest release tick (``release.tick_seconds``): an hour."""


def stamped(entry: LedgerEntry, timestamp_ms: int) -> LedgerEntry:
    """``entry`` with every output's Kafka timestamp set to ``timestamp_ms``."""
    return dataclasses.replace(entry, outputs=tuple(dataclasses.replace(m, timestamp_ms=timestamp_ms)
                                                    for m in entry.outputs))


class ReleaseTicks:
    """Wall-clock ticks of ``seconds`` (0: off, every class leaves at once) and the shuffle of each tick's classes
    (``rng``: the injected generator).  Times are epoch seconds (the loop's ``time.time()``): the Kafka timestamp
    of a tick's classes is its end in epoch milliseconds."""

    def __init__(self, seconds: float, rng: np.random.Generator) -> None:
        allowed = f"0 or a number of seconds in [0.001, {MAX_TICK_SECONDS:g}]"
        t = require_float("release.tick_seconds", seconds, low=0.0, high=MAX_TICK_SECONDS, allowed=allowed)
        if 0 < t < 0.001:
            require_float("release.tick_seconds", t, low=0.001, allowed=allowed)
        self.tick_ms = int(round(t * 1000))
        self.rng = rng

    @property
    def enabled(self) -> bool:
        return self.tick_ms > 0

    def tick_end_ms(self, now: float) -> int:
        """The end (epoch ms) of the tick that contains ``now`` (epoch s): the next multiple of the tick after it."""
        return (math.floor(now * 1000) // self.tick_ms + 1) * self.tick_ms

    def hold(self, owned: OwnedPartition | None, entries: list[LedgerEntry], now: float) -> list[LedgerEntry]:
        """A finished batch's entries of ``owned``'s partition: the class entries are held until the end of the
        tick of ``now`` (the partition's watermark capped below them); returns the entries to write now.

        While the partition holds classes, an end-of-stream marker (``control`` entry) is held too and written
        after them: a restart skips a marker the ledger accounts for, so the ledger must never hold a marker
        without the classes its flush released (they would wait in the engine of the next incarnation)."""
        if not self.enabled or owned is None:
            return entries
        classes = [e for e in entries if e.kind == KIND_CLASS]
        if not classes and not owned.held.ticks:
            return entries
        markers = [e for e in entries if e.kind == KIND_CONTROL]
        owned.held.add(self.tick_end_ms(now), classes, markers)
        owned.watermark = owned.held.cap(owned.watermark)
        return [e for e in entries if e.kind not in (KIND_CLASS, KIND_CONTROL)]

    def due(self, owned: Iterable[OwnedPartition], now: float | None) -> list[tuple[OwnedPartition,
                                                                                 list[LedgerEntry]]]:
        """For each partition of ``owned`` with a tick that ended by ``now`` (None: every tick, at once: a stop or
        a revoke), its classes of those ticks, each tick's in a uniformly random order, stamped with the tick's
        end; the partition's watermark is raised to what the pipeline reported, capped by what is still held."""
        until = None if now is None else math.floor(now * 1000)
        out = []
        for o in owned:
            first = o.held.next_end_ms()
            if first is None or (until is not None and first > until):
                continue
            entries: list[LedgerEntry] = []
            for end, held in o.held.take(until):
                entries.extend(stamped(held.classes[i], end) for i in self.rng.permutation(len(held.classes)))
                entries.extend(held.markers)
            o.watermark = o.held.cap(o.pipeline_watermark)
            out.append((o, entries))
        return out

    def seconds_to_next(self, table: PartitionTable, now: float) -> float | None:
        """Seconds until the earliest held tick ends (None: nothing held)."""
        ends = [e for o in table if (e := o.held.next_end_ms()) is not None]
        return None if not ends else max(0.0, min(ends) / 1000.0 - now)
