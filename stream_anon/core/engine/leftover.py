"""The leftover cluster (``leftover="leftover"``): the ADULT stream paper's alternative to suppression.

Lee, Joo, Yun, Kim (2023) collect the records that cannot meet k in their cluster into an independent leftover
cluster instead of suppressing them (docs/castle.md, "Extensions"). Here every record that
delay_constraint would suppress is handed to :meth:`LeftoverCluster.take` with a deadline of
``delta_leftover`` further arrivals. When the oldest one reaches its deadline (:meth:`after_arrival`):

* if the leftover cluster holds >= k individuals (and >= l sensitive values), *all* of it is released, split
  into several classes of >= k when it holds >= 2k individuals;
* otherwise each record whose deadline has passed is released under a covering Omega cluster, or suppressed.

:meth:`flush` does the same at end of stream for everything left. Leftover classes update neither tau nor
Omega. A leftover record waits at most delta + delta_leftover arrivals.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from stream_anon.core.engine.tally import Tally


class LeftoverCluster:
    """Records CASTLE would suppress, waiting for enough company.

    The engine supplies three actions: ``split`` (its KNN split / split_l), ``release`` (emit one leftover
    class) and ``reuse_or_suppress`` (Omega reuse, else suppression, of one record).
    """

    def __init__(self, *, k: int, l: int | None, delta_leftover: int, persons: bool,  # noqa: E741
                 split: Callable[[list[int]], list[list[int]]], release: Callable[[list[int]], object],
                 reuse_or_suppress: Callable[[int], None]):
        self.k = k
        self.l = l
        self.delta_leftover = delta_leftover
        self.queue: deque[tuple[int, int, Any, Any]] = deque()  # (ring slot, deadline position, person, value)
        self.tally = Tally(persons=persons, values=l is not None)
        self._split = split
        self._release = release
        self._reuse_or_suppress = reuse_or_suppress

    def take(self, slot: int, person: Any, value: Any, p: int) -> None:
        """The record in ``slot`` (arrived before position ``p``) would be suppressed: it waits here instead."""
        self.queue.append((slot, p + self.delta_leftover, person, value))
        self.tally.add(person, value)

    def after_arrival(self, p: int) -> None:
        """Arrival at position ``p``: act when the oldest leftover record has reached its deadline."""
        if self.queue and self.queue[0][1] <= p:
            self._expire(p)

    def flush(self) -> None:
        """End of stream: release everything as classes of >= k, else reuse or suppress record by record."""
        if self.queue:
            self._expire(None)

    def _expire(self, p: int | None) -> None:
        if self.tally.meets(self.k, self.l):
            self._release_all()
            return
        queue = self.queue
        while queue and (p is None or queue[0][1] <= p):
            slot, _, person, value = queue.popleft()
            self.tally.remove(person, value)
            self._reuse_or_suppress(slot)

    def _release_all(self) -> None:
        members = [slot for slot, _, _, _ in self.queue]
        individuals = self.tally.individuals
        self.queue.clear()
        self.tally.clear()
        groups = self._split(members) if individuals >= 2 * self.k else [members]
        for grp in groups:
            self._release(grp)
