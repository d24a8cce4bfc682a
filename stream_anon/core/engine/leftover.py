"""The leftover cluster (``leftover="leftover"``): the ADULT stream paper's alternative to suppression.

Lee, Joo, Yun, Kim (2023) collect the records that cannot meet k in their cluster into an independent leftover
cluster instead of suppressing them (docs/castle.md, "Extensions"). Here every record that
delay_constraint would suppress is handed to :meth:`LeftoverCluster.take` with a deadline of
``delta_leftover`` further arrivals. When the oldest one reaches its deadline (:meth:`after_arrival`):

* if the leftover cluster holds >= k individuals (and satisfies the diversity requirement), *all* of it is
  released, split into several classes of >= k when it holds >= 2k individuals;
* otherwise each record whose deadline has passed is released under a covering Omega cluster, or suppressed.

:meth:`flush` does the same at end of stream for everything left. Leftover classes update neither tau nor
Omega. A leftover record waits at most delta + delta_leftover arrivals.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from stream_anon.core.engine.sensitive import SensitiveCodes
from stream_anon.core.engine.tally import Tally


class LeftoverCluster:
    """Records CASTLE would suppress, waiting for enough company.

    The engine supplies three actions: ``split`` (its KNN split / split_l), ``release`` (emit one leftover
    class) and ``reuse_or_suppress`` (Omega reuse, else suppression, of one record).
    """

    def __init__(self, *, k: int, codes: SensitiveCodes | None, delta_leftover: int, persons: bool,
                 split: Callable[[list[int]], list[list[int]]], release: Callable[[list[int]], object],
                 reuse_or_suppress: Callable[[int], None]):
        self.k = k
        self.codes = codes
        self.delta_leftover = delta_leftover
        self.queue: deque[tuple[int, int, Any, int]] = deque()  # (ring slot, deadline position, person, value code)
        self.tally = Tally(persons=persons, values=False)
        self.counts: np.ndarray | None = np.zeros(codes.width) if codes is not None else None
        self._split = split
        self._release = release
        self._reuse_or_suppress = reuse_or_suppress

    def take(self, slot: int, person: Any, code: int, p: int) -> None:
        """The record in ``slot`` (arrived before position ``p``, sensitive value code ``code``) would be
        suppressed: it waits here instead."""
        self.queue.append((slot, p + self.delta_leftover, person, code))
        self.tally.add(person, None)
        if self.counts is not None:
            self.counts[code] += 1

    def after_arrival(self, p: int) -> None:
        """Arrival at position ``p``: act when the oldest leftover record has reached its deadline."""
        if self.queue and self.queue[0][1] <= p:
            self._expire(p)

    def flush(self) -> None:
        """End of stream: release everything as classes of >= k, else reuse or suppress record by record."""
        if self.queue:
            self._expire(None)

    def _meets(self) -> bool:
        if self.tally.individuals < self.k:
            return False
        return self.codes is None or self.counts is None or self.codes.ok(self.counts)

    def _expire(self, p: int | None) -> None:
        if self._meets():
            self._release_all()
            return
        queue = self.queue
        while queue and (p is None or queue[0][1] <= p):
            slot, _, person, code = queue.popleft()
            self.tally.remove(person, None)
            if self.counts is not None:
                self.counts[code] -= 1
            self._reuse_or_suppress(slot)

    def _release_all(self) -> None:
        members = [slot for slot, _, _, _ in self.queue]
        individuals = self.tally.individuals
        self.queue.clear()
        self.tally.clear()
        if self.counts is not None:
            self.counts[:] = 0.0
        groups = self._split(members) if individuals >= 2 * self.k else [members]
        for grp in groups:
            self._release(grp)
