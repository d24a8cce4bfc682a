"""The partitions the main path owns: one :class:`OwnedPartition` per owned input partition (what its pipeline
reported, its outbox, its commit state), and the partitions whose recovery waits for the consumer to come back to
their start (:class:`SeekBack`), in one :class:`PartitionTable` (pure state: no Kafka, no clock).

Everything the loop knows of a partition lives in its one object, so dropping a partition (revoke, producer
recreation, a failed revoke) is one call that forgets all of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from stream_anon.service.ledger import LedgerEntry, PartitionOutbox, RecoveryPlan


@dataclass
class HeldTick:
    """What one partition holds for one tick: its class entries (in the order the pipeline made them) and the
    end-of-stream markers that came after them (written after the tick's classes: see
    :meth:`stream_anon.service.ticks.ReleaseTicks.hold`)."""

    classes: list[LedgerEntry] = field(default_factory=list)
    markers: list[LedgerEntry] = field(default_factory=list)


@dataclass
class HeldClasses:
    """The entries of one partition that wait for the end of their tick (tick end in epoch ms -> :class:`HeldTick`)."""

    ticks: dict[int, HeldTick] = field(default_factory=dict)
    low: int | None = None  # the lowest input offset of any held entry

    def __len__(self) -> int:
        return sum(len(t.classes) for t in self.ticks.values())

    def add(self, tick_end_ms: int, classes: Iterable[LedgerEntry], markers: Iterable[LedgerEntry] = ()) -> None:
        held = self.ticks.setdefault(tick_end_ms, HeldTick())
        held.classes.extend(classes)
        held.markers.extend(markers)
        for e in (*held.classes, *held.markers):
            self.low = e.offsets[0] if self.low is None else min(self.low, e.offsets[0])

    def cap(self, watermark: int) -> int:
        """The commit watermark with entries held: never past the first offset of a held entry."""
        return watermark if self.low is None else min(watermark, self.low)

    def take(self, until_ms: int | None) -> list[tuple[int, HeldTick]]:
        """Remove and return the ticks that ended at or before ``until_ms`` (None: all), oldest first."""
        due = sorted(t for t in self.ticks if until_ms is None or t <= until_ms)
        out = [(t, self.ticks.pop(t)) for t in due]
        rest = [e.offsets[0] for t in self.ticks.values() for e in (*t.classes, *t.markers)]
        self.low = min(rest) if rest else None
        return out

    def next_end_ms(self) -> int | None:
        return min(self.ticks) if self.ticks else None


@dataclass
class OwnedPartition:
    """One owned input partition.

    Attributes:
        partition: the input partition.
        outbox: the writer state of its ledger partition (entries for tombstones, output ends, checkpoints).
        watermark: its commit watermark: the lowest offset still buffered as reported with its last finished
            batch (``pipeline_watermark``), capped by the classes held for their tick (``held``).
        next_offset: the next offset its pipeline consumes.
        horizon: the highest input offset consumed by any incarnation.
        buffered, open_clusters: what its engine holds.
        last_input: wall time of its last input (idle flush); None: none since it was recovered.
        dirty: ledger entries were written since its last checkpoint.
        committed: the watermark last committed for it (None: not yet, or the commit failed: commit again).
        held: class entries waiting for the end of their release tick (:mod:`~stream_anon.service.ticks`): not in
            the ledger yet, dropped with the partition.
    """

    partition: int
    outbox: PartitionOutbox
    watermark: int
    next_offset: int
    horizon: int = -1
    buffered: int = 0
    open_clusters: int = 0
    last_input: float | None = None
    dirty: bool = False
    committed: int | None = None
    held: HeldClasses = field(default_factory=HeldClasses)
    pipeline_watermark: int = field(init=False, default=-1)

    def __post_init__(self) -> None:
        self.pipeline_watermark = self.watermark

    @property
    def incarnation(self) -> str:
        return self.outbox.incarnation

    def report(self, *, watermark: int, next_offset: int, buffered: int, open_clusters: int, horizon: int) -> None:
        """Take over what the pipeline reported with a finished batch (the watermark capped by held classes)."""
        self.pipeline_watermark = watermark
        self.watermark, self.next_offset, self.horizon = self.held.cap(watermark), next_offset, horizon
        self.buffered, self.open_clusters = buffered, open_clusters

    def needs_checkpoint(self) -> bool:
        """A checkpoint is due when entries were written since the last one or the watermark moved."""
        last = self.outbox.last_checkpoint
        return self.dirty or last is None or last.watermark != self.watermark

    def idle_for(self, now: float) -> float:
        return 0.0 if self.last_input is None else now - self.last_input


@dataclass(frozen=True)
class SeekBack:
    """A partition whose recovery is planned and whose consumer was sent back to ``target`` (its records before
    the seek are not taken; they come again)."""

    plan: RecoveryPlan
    target: int


class PartitionTable:
    """The owned partitions and the pending seek-backs of one main-path member."""

    def __init__(self) -> None:
        self.owned: dict[int, OwnedPartition] = {}
        self.seeking: dict[int, SeekBack] = {}

    def __contains__(self, partition: object) -> bool:
        return partition in self.owned

    def __iter__(self) -> Iterator[OwnedPartition]:
        return iter(list(self.owned.values()))

    def __len__(self) -> int:
        return len(self.owned)

    def get(self, partition: int) -> OwnedPartition | None:
        return self.owned.get(partition)

    def current(self, owned: OwnedPartition) -> bool:
        """Whether ``owned`` is still the table's object for its partition (not dropped, not recovered anew)."""
        return self.owned.get(owned.partition) is owned

    def add(self, owned: OwnedPartition) -> None:
        self.seeking.pop(owned.partition, None)
        self.owned[owned.partition] = owned

    def partitions(self) -> list[int]:
        return sorted(self.owned)

    def owned_of(self, partitions: Iterable[int]) -> list[int]:
        """Those of ``partitions`` that are owned, in the given order."""
        return [p for p in partitions if p in self.owned]

    def drop(self, partitions: Iterable[int]) -> list[OwnedPartition]:
        """Forget ``partitions`` (owned or seeking back); returns the owned ones dropped."""
        out = []
        for p in partitions:
            self.seeking.pop(p, None)
            owned = self.owned.pop(p, None)
            if owned is not None:
                out.append(owned)
        return out

    def clear(self) -> list[int]:
        """Forget every partition; returns the owned ones."""
        owned = self.partitions()
        self.owned.clear()
        self.seeking.clear()
        return owned

    def committed(self) -> dict[int, int]:
        """partition -> the watermark last committed for it."""
        return {p: o.committed for p, o in self.owned.items() if o.committed is not None}

    def positions(self) -> dict[int, int]:
        """partition -> next offset its pipeline consumes."""
        return {p: o.next_offset for p, o in self.owned.items()}
