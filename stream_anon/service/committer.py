"""The committer of the main path: steps 4-6 of the protocol (:mod:`stream_anon.service.ledger`), after the outbox
settled steps 1-3.

4. a checkpoint for each owned partition whose watermark moved or that got ledger entries since its last one,
   sent to the ledger and acknowledged (:meth:`Committer.checkpoint`);
5. the partitions' watermarks committed (:meth:`Committer.commit`: asynchronously in the loop, synchronously on
   the stop path, bounded by what is left of the stop grace);
6. once the broker confirmed a commit: tombstones for the ledger keys no recovery can need
   (:meth:`Committer.write_tombstones`; compaction removes them, nothing waits for their acknowledgement).

The committer talks to the group through :class:`GroupCommits` (the
:class:`~stream_anon.kafka_io.poller.GroupPoller` in the service, a simulated group in ``tests/test_ledger.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stream_anon.formats.messages import Receipt
from stream_anon.kafka_io.errors import CommitFailedError
from stream_anon.service.outbox import LedgerOutbox, Producers, Topics
from stream_anon.service.partitions import PartitionTable

log = logging.getLogger(__name__)

CommitDone = Callable[[dict[int, int], "Exception | None"], None]


class GroupCommits(Protocol):
    """How the committer commits watermarks (partition -> offset) of the input topic for the group."""

    def commit_sync(self, offsets: Mapping[int, int], timeout_s: float | None = None) -> None: ...

    def commit_async(self, offsets: Mapping[int, int], done: CommitDone) -> None: ...


@dataclass
class CommitProgress:
    """Commits that moved a watermark past its highest commit so far (``made``), and those highs; kept for the
    whole run, across recoveries and producer recreations (progress ends a row of producer failures)."""

    made: int = 0
    high: dict[int, int] = field(default_factory=dict)  # partition -> highest watermark committed

    def record(self, offsets: Mapping[int, int]) -> None:
        if any(o > self.high.get(p, -1) for p, o in offsets.items()):
            self.made += 1  # progress: everything below the new watermarks was delivered
        for p, o in offsets.items():
            self.high[p] = max(o, self.high.get(p, -1))


class Committer:
    """Steps 4-6 for the owned partitions of ``table`` (see the module docstring).

    Args:
        on_answer: called when the broker acknowledged a checkpoint (evidence that it answers).
        on_ledger: called with the receipt of every acknowledged checkpoint (the data-loss check's floors).
        on_committed: called with (partition, watermark) of every commit sent (floors, the watermark gauge).
        progress: where the commits that made progress are counted (kept by the caller across runs of the loop).
    """

    def __init__(self, table: PartitionTable, outbox: LedgerOutbox, producers: Producers, group: GroupCommits,
                 topics: Topics, *, on_answer: Callable[[], None] = lambda: None,
                 on_ledger: Callable[[Receipt], None] = lambda _: None,
                 on_committed: Callable[[int, int], None] = lambda p, o: None,
                 progress: CommitProgress | None = None) -> None:
        self.table = table
        self.outbox = outbox
        self.producers = producers
        self.group = group
        self.topics = topics
        self.on_answer = on_answer
        self.on_ledger = on_ledger
        self.on_committed = on_committed
        self.progress = progress if progress is not None else CommitProgress()
        self._confirmed: list[dict[int, int]] = []  # commits confirmed by the broker: tombstones due (step 6)

    def checkpoint(self, partitions: list[int]) -> dict[int, int]:
        """Step 4 for ``partitions`` (after :meth:`LedgerOutbox.settle`): a checkpoint for each that needs one;
        returns the watermarks to commit (step 5)."""
        offsets: dict[int, int] = {}
        checkpoints = []
        for p in partitions:
            owned = self.table.get(p)
            if owned is None:
                continue
            if owned.needs_checkpoint():
                ck = owned.outbox.checkpoint(owned.watermark, owned.horizon)
                checkpoints.append(self.topics.ledger_message(p, ck.key, ck.encode()))
                owned.dirty = False
            if owned.committed != owned.watermark:
                offsets[p] = owned.watermark
        if checkpoints:
            ledger = self.producers.ledger
            receipt = ledger.send(checkpoints)
            if ledger.flush():
                self.on_answer()
            self.on_ledger(receipt)
        return offsets

    def commit(self, *, sync_timeout_s: float | None = None) -> bool:
        """Steps 3-5: everything written acknowledged, checkpoints, then each owned partition's watermark committed
        (asynchronously; synchronously within ``sync_timeout_s`` when given, and then step 6 is due at once).
        False when the group did not take the commit (nothing is lost: the checkpoints are acknowledged).

        The watermarks are those reported with the finished batches whose entries and outputs were just
        acknowledged; batches still in a worker are not covered (their partitions' watermarks stay where they were).
        """
        self.outbox.settle()
        offsets = self.checkpoint(self.table.partitions())
        if not offsets:
            return True
        try:
            if sync_timeout_s is not None:
                self.group.commit_sync(offsets, sync_timeout_s)
                self._confirmed.append(dict(offsets))
            else:
                self.group.commit_async(offsets, self._done)
        except CommitFailedError as e:  # e.g. after a rebalance: the new owner recovers from the ledger
            log.warning("commit of %s failed: %r", offsets, e.__cause__ or e)
            return False
        self.progress.record(offsets)
        for p, o in offsets.items():
            owned = self.table.get(p)
            if owned is not None:
                owned.committed = o
            self.on_committed(p, o)
        return True

    def commit_revoked(self, partitions: list[int]) -> None:
        """A rebalance takes ``partitions`` (finished batches collected): steps 1-4 for them and an asynchronous
        commit of what is safe (no blocking consumer call inside the rebalance)."""
        self.outbox.settle()
        offsets = self.checkpoint(partitions)
        if offsets:
            self.group.commit_async(offsets, self._done)

    def _done(self, offsets: dict[int, int], error: Exception | None) -> None:
        if error is not None:
            log.warning("asynchronous commit failed (%r); the next commit supersedes it", error)
            for p, o in offsets.items():
                owned = self.table.get(p)
                if owned is not None and owned.committed == o:
                    owned.committed = None  # commit it again
            return
        self._confirmed.append(offsets)

    def write_tombstones(self) -> None:
        """Step 6: once a commit is confirmed, tombstones for the ledger keys no recovery can need."""
        if not self._confirmed:
            return
        msgs = []
        for commit in self._confirmed:
            for p, offset in commit.items():
                owned = self.table.get(p)
                if owned is not None:
                    msgs += [self.topics.ledger_message(p, key, None) for key in owned.outbox.tombstones(offset)]
        self._confirmed.clear()
        if msgs:
            self.producers.ledger.send(msgs)
