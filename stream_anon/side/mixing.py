"""Side copies that cannot be placed by position or time: windows of copies, shuffled and stamped together (pure).

Without mixing, a side copy leaves right after its record arrives, at the same offset as its input record (one copy
per record per topic, in input order) and ~30 ms later: an attacker who knows when a target's record arrived (the
threat model's attacker) reads its copies by position, without the pseudonym secret.  :class:`CopyMixer` holds the
copies of each input partition in a **window** until the window holds ``records`` records or its first record is
``seconds`` old (whichever comes first), then releases it: each topic's copies of the window in an independent,
uniformly random order (a permutation drawn from the side paths' noise generator, ChaCha20), all stamped with the
window's release time (the Kafka timestamp of every copy of the window; the input's timestamp is never used).

So within a side partition the copies of one window occupy one contiguous block of offsets, in a uniformly random
order, with one timestamp: a copy's offset and timestamp tell which window it is in, and nothing about its record's
position inside the window.  Given a target's input offset, the chance that the copy at the same side offset is the
target's is at most 1/n for a window of n records (the expected fraction and its variance under a random
permutation: :func:`stream_anon.service.linkage.permutation_match_moments`).  A window keeps the partition of its
records (copies of input partition p go to side partition p mod the side topic's partitions).

All copies of a record are in the same window, on every topic: a window is released on all topics or kept on all
(a record has a copy on every enabled side topic or on none, also at a clean stop, when every window is released).
The cost is latency: a copy waits up to ``seconds`` (or until ``records`` records of its partition arrived);
measured in docs/side-paths.md.  A window smaller than ``records`` (a quiet partition, the end of a stream, a stop)
is still released: its anonymity set is the records it holds, down to one record alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from stream_anon.side.encoding import CopyBatch


@dataclass
class MixedWindow:
    """A released window of one input ``partition``: ``records`` records, each topic's copies shuffled
    (``copies``: one :class:`CopyBatch` per topic), all to be sent with Kafka timestamp ``timestamp_ms``."""

    partition: int
    records: int
    timestamp_ms: int
    copies: list[CopyBatch]
    opened_at: float  # clock time of its first record
    reason: str  # "records" | "seconds" | "flush"


@dataclass
class _Open:
    opened_at: float
    records: int = 0
    topics: dict[str, CopyBatch] = field(default_factory=dict)


class CopyMixer:
    """Windows of side copies per input partition (module docstring).

    ``records`` (>= 1) and ``seconds`` (> 0): when a window is released; ``rng``: the permutations; ``clock``:
    monotonic seconds (the windows' age); ``wall``: epoch seconds (the release timestamp).
    """

    def __init__(self, records: int, seconds: float, rng: np.random.Generator, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if isinstance(records, bool) or not isinstance(records, int) or records < 1:
            raise ValueError(f"records: expected an integer >= 1, got {records!r}")
        if not seconds > 0:
            raise ValueError(f"seconds: expected a number > 0, got {seconds!r}")
        self.records = records
        self.seconds = float(seconds)
        self.rng = rng
        self.clock = clock
        self.wall = wall
        self._open: dict[int, _Open] = {}
        self.windows_released = 0

    @property
    def pending_records(self) -> int:
        """Records whose copies wait in an open window."""
        return sum(w.records for w in self._open.values())

    def seconds_to_next(self, now: float | None = None) -> float | None:
        """Seconds until the oldest open window is due by age (None: no open window)."""
        if not self._open:
            return None
        t = self.clock() if now is None else now
        return max(0.0, min(w.opened_at for w in self._open.values()) + self.seconds - t)

    def add(self, partition: int, copies: Sequence[CopyBatch], n_records: int, now: float | None = None) -> None:
        """Hold one batch's copies of ``n_records`` records of ``partition`` (``copies``: one batch per topic, each
        of ``n_records`` copies, record i's copies at index i on every topic)."""
        if n_records <= 0:
            return
        for c in copies:
            if len(c) != n_records:
                raise ValueError(f"{c.topic}: {len(c)} copies for {n_records} records (every record needs one copy "
                                 f"on every topic of its window)")
        w = self._open.get(partition)
        if w is None:
            w = self._open[partition] = _Open(self.clock() if now is None else now)
        w.records += n_records
        for c in copies:
            held = w.topics.get(c.topic)
            if held is None:
                w.topics[c.topic] = CopyBatch(c.topic, list(c.keys), list(c.payloads), c.epsilon_total)
            else:
                held.keys.extend(c.keys)
                held.payloads.extend(c.payloads)

    def due(self, now: float | None = None) -> list[MixedWindow]:
        """Release every window that holds ``records`` records or is ``seconds`` old."""
        t = self.clock() if now is None else now
        out = []
        for partition in sorted(self._open):
            w = self._open[partition]
            if w.records >= self.records:
                out.append(self._release(partition, "records"))
            elif t - w.opened_at >= self.seconds:
                out.append(self._release(partition, "seconds"))
        return out

    def flush(self, partitions: Iterable[int] | None = None) -> list[MixedWindow]:
        """Release the open windows of ``partitions`` (None: all), whatever their size (end of a partition's
        stream, a clean stop)."""
        wanted = sorted(self._open) if partitions is None else sorted(set(partitions) & set(self._open))
        return [self._release(p, "flush") for p in wanted]

    def _release(self, partition: int, reason: str) -> MixedWindow:
        w = self._open.pop(partition)
        copies = []
        for topic, c in w.topics.items():  # an independent permutation per topic: positions do not join topics
            perm = self.rng.permutation(len(c.payloads)).tolist()
            copies.append(CopyBatch(topic, [c.keys[i] for i in perm], [c.payloads[i] for i in perm],
                                    c.epsilon_total))
        self.windows_released += 1
        return MixedWindow(partition, w.records, int(self.wall() * 1000), copies, w.opened_at, reason)
