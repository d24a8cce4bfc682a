"""The ledger outbox of the main path: steps 1-3 of the protocol (:mod:`stream_anon.service.ledger`).

1. a finished batch's ledger entries go to the ledger (:meth:`LedgerOutbox.write`), without waiting (an entry
   larger than the output bound as its chunks: :meth:`~stream_anon.service.ledger.LedgerEntry.ledger_messages`);
2. as soon as a batch's entries are acknowledged (learnt without blocking: :meth:`LedgerOutbox.send_acknowledged`),
   its outputs go to anon / suppressed / dlq, in batch order;
3. before a checkpoint (:meth:`LedgerOutbox.settle`): every entry acknowledged, every remaining output sent and
   acknowledged, and each partition's outbox learns where its outputs landed.

The outbox talks to the producers through :class:`Producers` (the ledger producer and the output producer, which
the loop may recreate) and to the owned partitions through the :class:`~stream_anon.service.partitions.PartitionTable`;
no Kafka client type appears here, so the crash-at-every-point test drives this class against its simulated
broker (``tests/test_ledger.py``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from stream_anon.formats.messages import OutputMessage, Receipt
from stream_anon.formats.release import EncodedMessage
from stream_anon.service.ledger import LedgerEntry
from stream_anon.service.partitions import OwnedPartition, PartitionTable

log = logging.getLogger(__name__)

LEDGER_WAIT_SECONDS = 0.05
"""When a poll brought no input, how long the loop waits for ledger acknowledgements of unsent outputs."""


class Sender(Protocol):
    """The producer interface the protocol needs (:class:`~stream_anon.kafka_io.producer.OutputProducer`)."""

    def send(self, messages: Iterable[OutputMessage]) -> Receipt: ...

    def poll(self, timeout_s: float = 0.0) -> int: ...

    def flush(self) -> int: ...

    def partition_for(self, topic: str, src_partition: int) -> int: ...


class Producers(Protocol):
    """The ledger producer and the output producer (both may be replaced when they are recreated)."""

    @property
    def ledger(self) -> Sender: ...

    @property
    def outputs(self) -> Sender: ...


@dataclass(frozen=True)
class Topics:
    """The main path's topics: the input, the ledger and the output topic of each role."""

    input: str
    ledger: str
    roles: Mapping[str, str]  # role (anon, suppressed, dlq) -> topic
    max_message_bytes: int | None = None  # the output bound (ledger entries larger than it go out in chunks)
    role_of: Mapping[str, str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "role_of", {t: r for r, t in self.roles.items()})

    def output(self, partition: int, m: EncodedMessage) -> OutputMessage:
        """The message of an output of input partition ``partition`` (no headers; its own Kafka timestamp)."""
        return OutputMessage(m.role, self.roles[m.role], partition, m.key, m.value, timestamp_ms=m.timestamp_ms)

    def ledger_message(self, partition: int, key: bytes | None, value: bytes | None) -> OutputMessage:
        """A ledger message (entry, checkpoint, or tombstone when ``value`` is None) of input partition
        ``partition``."""
        return OutputMessage("ledger", self.ledger, partition, key, value)


@dataclass
class _Unsent:
    """The ledger entries of one finished batch: sent to the ledger, their outputs not sent yet (step 2 waits for
    ``receipt``)."""

    owned: OwnedPartition
    entries: list[LedgerEntry]
    receipt: Receipt


class LedgerOutbox:
    """Steps 1-3 for the owned partitions of ``table`` (see the module docstring).  ``on_answer`` is called
    whenever the broker acknowledged something (evidence that it answers)."""

    def __init__(self, table: PartitionTable, producers: Producers, topics: Topics, *,
                 on_answer: Callable[[], None] = lambda: None) -> None:
        self.table = table
        self.producers = producers
        self.topics = topics
        self.on_answer = on_answer
        self._unsent: deque[_Unsent] = deque()  # step 2 waits for their ledger acknowledgements
        self._sent: list[tuple[OwnedPartition, Receipt]] = []  # outputs sent since the last settle

    @property
    def waiting(self) -> bool:
        """Outputs wait for their entries' acknowledgement (the loop then polls without waiting)."""
        return bool(self._unsent)

    def write(self, partition: int, entries: list[LedgerEntry]) -> None:
        """Step 1: ``entries`` of a finished batch of ``partition`` -> the ledger (not waited for)."""
        owned = self.table.get(partition)
        if owned is None:  # revoked meanwhile: not written, so not published; the new owner processes them again
            log.debug("partition %d: %d ledger entries of a dropped partition not written", partition, len(entries))
            return
        messages = []
        for e in entries:
            parts = e.ledger_messages(self.topics.max_message_bytes)  # one, or the chunks of a large entry
            owned.outbox.record(e, [key for key, _ in parts])
            messages += [self.topics.ledger_message(partition, key, value) for key, value in parts]
        receipt = self.producers.ledger.send(messages)
        owned.dirty = True
        self._unsent.append(_Unsent(owned, entries, receipt))

    def send_acknowledged(self, *, wait: bool = False) -> None:
        """Step 2: send the outputs of every batch whose ledger entries are acknowledged (in batch order).
        ``wait``: wait up to ``LEDGER_WAIT_SECONDS`` for acknowledgements (nothing else to do)."""
        if not self._unsent:
            return
        if self.producers.ledger.poll(LEDGER_WAIT_SECONDS if wait else 0.0):
            self.on_answer()
        while self._unsent and self._unsent[0].receipt.acknowledged:
            self._send_outputs(self._unsent.popleft())

    def _send_outputs(self, unsent: _Unsent) -> None:
        p = unsent.owned.partition
        msgs = [self.topics.output(p, m) for e in unsent.entries for m in e.outputs]
        if msgs:
            self._sent.append((unsent.owned, self.producers.outputs.send(msgs)))

    def settle(self) -> None:
        """Steps 1-3 for everything written: every entry and every output acknowledged; the outboxes learn the
        output offsets."""
        if self.producers.ledger.flush():
            self.on_answer()
        while self._unsent:
            self._send_outputs(self._unsent.popleft())
        if self.producers.outputs.flush():
            self.on_answer()
        for owned, receipt in self._sent:
            if self.table.current(owned):
                for d in receipt.deliveries():
                    owned.outbox.acked(self.topics.role_of[d.topic], d.offset)
        self._sent.clear()

    def abandon(self) -> None:
        """Forget what waits (the producers that hold it are being closed: the ledger recovery re-sends it)."""
        self._unsent.clear()
        self._sent.clear()
