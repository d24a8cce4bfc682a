"""The group consumer of one input topic, as both paths use it: poll, skip records the client cannot read, bound
failing polls, plumb the rebalance callbacks, commit offsets.

:class:`GroupPoller` speaks in partitions of its one topic (``int``) and offsets, never in client types, so the
main path and the side paths do not depend on the client library (kafka-python today; a confluent-kafka poller
would keep this interface).  What it does for its callers:

* **Unreadable records.**  kafka-python raises ``CorruptRecordError`` inside ``poll()`` (e.g. for a header key
  that is not UTF-8) without naming the partition, and its next poll would spin on the same record.  The poller
  finds every assigned partition whose record at the consumer's position cannot be read (with a group-less
  :class:`~stream_anon.kafka_io.reader.PartitionReader`, made for the occasion and closed after), tells the caller
  (``on_unreadable(partition, offset, "corrupt_record", error)``: True = taken, seek past it) and returns an empty
  batch; if no such record is found, the error is raised.
* **Messages too large to receive** (a fetch response over ``kafka.receive_max_bytes``: kafka-python logs
  ``InvalidReceiveError`` and retries forever): the log line arms the poller's
  :class:`~stream_anon.kafka_io.oversized.OversizeSearch`, which hands the caller the readable records and the
  unreadable batch by position (``"oversized"``), and the consumer moves past them.
* **Failing polls** (:class:`FailingPolls`, optional): a poll that raises ``KafkaError`` (fenced, a failed join:
  the next poll rejoins) is logged and retried after a pause; when polls keep failing for longer than the bound
  while the broker answers, :class:`~stream_anon.kafka_io.errors.ConsumerFailedError`.  Without a policy the
  error is raised at once.
* **Rebalance callbacks** (:meth:`GroupPoller.subscribe`): called with the partitions of the topic; what a
  callback raises is kept and raised after the poll that ran it (kafka-python only logs what a listener raises).
* **Commits** of ``partition -> offset`` maps, with optional metadata per partition, synchronous or asynchronous
  (the callback gets the offsets and the error or None); a failure is
  :class:`~stream_anon.kafka_io.errors.CommitFailedError`.

The same interface over confluent-kafka: :class:`~stream_anon.kafka_io.confluent_poller.ConfluentPoller`;
:func:`~stream_anon.kafka_io.consumers.open_poller` makes the one ``kafka.consumer_client`` names.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CorruptRecordError, KafkaError
from kafka.structs import OffsetAndMetadata

from stream_anon.kafka_io.errors import CommitFailedError, ConsumerFailedError
from stream_anon.kafka_io.oversized import OversizeSearch
from stream_anon.kafka_io.reader import PartitionReader

log = logging.getLogger(__name__)


class PolledRecord(Protocol):
    """One consumed record (kafka-python's ``ConsumerRecord`` has these attributes)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]]
    timestamp: int | None


Unreadable = Callable[[int, int, str, str], bool]
"""(partition, offset, reason, error) of a record the client cannot read (reason ``"corrupt_record"`` or
``"oversized"``) -> True when the caller took it (the poller moves past it); False: the caller moved the consumer
where it wants it."""
REASON_CORRUPT = "corrupt_record"
CommitDone = Callable[[dict[int, int], "Exception | None"], None]
"""Called once an asynchronous commit is answered: (partition -> offset, the error or None)."""


class Poller(Protocol):
    """What the paths use of their group consumer (:class:`GroupPoller` implements it over kafka-python; another
    client library would implement the same, returning records with the attributes of :class:`PolledRecord`)."""

    failures: FailingPolls | None

    def subscribe(self, on_assigned: Callable[[set[int]], None] | None = None,
                  on_revoked: Callable[[list[int]], None] | None = None) -> None: ...

    def poll(self, timeout_ms: int, on_unreadable: Unreadable) -> dict[int, list[Any]]: ...

    def assignment(self) -> set[int]: ...

    def seek(self, partition: int, offset: int) -> None: ...

    def committed(self, partition: int, timeout_ms: int) -> int | None: ...

    def highwater(self, partition: int) -> int | None: ...

    def commit_sync(self, offsets: Mapping[int, int], timeout_s: float | None = None, *,
                    metadata: Mapping[int, str] | None = None) -> None: ...

    def commit_async(self, offsets: Mapping[int, int], done: CommitDone, *,
                     metadata: Mapping[int, str] | None = None) -> None: ...

    def close(self, timeout_s: float) -> None: ...


class FailingPolls:
    """The bound on failing polls: log each failure, pause ``pause_s``, and raise
    :class:`~stream_anon.kafka_io.errors.ConsumerFailedError` once polls have failed for more than ``limit_s``
    while ``broker_answers()`` (a broker outage is not the consumer's failure)."""

    def __init__(self, limit_s: float, broker_answers: Callable[[], bool], *, pause_s: float = 1.0,
                 limit_option: str = "service.producer_recovery_seconds") -> None:
        self.limit_s = limit_s
        self.broker_answers = broker_answers
        self.pause_s = pause_s
        self.limit_option = limit_option
        self.failing_since: float | None = None

    def succeeded(self) -> None:
        self.failing_since = None

    def failed(self, error: BaseException) -> None:
        now = time.monotonic()
        if self.failing_since is None:
            self.failing_since = now
        failing = now - self.failing_since
        log.warning("consumer poll failed (%r) for %.0f s; polling again (the consumer rejoins its group)", error,
                    failing)
        if failing > self.limit_s and self.broker_answers():
            raise ConsumerFailedError(f"the group consumer's polls failed for {failing:.0f} s while the broker "
                                      f"answered (last: {error!r})")
        time.sleep(self.pause_s)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, poller: GroupPoller, on_assigned: Callable[[set[int]], None],
                 on_revoked: Callable[[list[int]], None]) -> None:
        self.poller = poller
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.poller.run_callback(self.on_revoked, [tp.partition for tp in revoked if tp.topic == self.poller.topic])

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.poller.run_callback(self.on_assigned, {tp.partition for tp in assigned if tp.topic == self.poller.topic})


class GroupPoller:
    """The group consumer of ``topic`` (see the module docstring).

    Args:
        consumer: a kafka-python consumer of the group (``kafka_io.clients.make_consumer``); owned: :meth:`close`.
        topic: the one topic it consumes.
        max_records: records per poll at most.
        reader: makes a group-less reader for finding unreadable records (closed after each use).
        failures: the bound on failing polls (None: a failing poll raises).
    """

    def __init__(self, consumer: KafkaConsumer, topic: str, *, max_records: int,
                 reader: Callable[[], PartitionReader], failures: FailingPolls | None = None,
                 search: OversizeSearch | None = None) -> None:
        self.consumer = consumer
        self.topic = topic
        self.max_records = max_records
        self.reader = reader
        self.failures = failures
        self.search = search
        self._deferred: BaseException | None = None

    def _tp(self, partition: int) -> TopicPartition:
        return TopicPartition(self.topic, partition)

    # ------------------------------------------------------------------ group
    def subscribe(self, on_assigned: Callable[[set[int]], None] | None = None,
                  on_revoked: Callable[[list[int]], None] | None = None) -> None:
        """Join the group on the topic; the callbacks run inside :meth:`poll` (what they raise is raised after it)."""
        if on_assigned is None and on_revoked is None:
            self.consumer.subscribe([self.topic])
            return
        self.consumer.subscribe([self.topic], listener=_Listener(self, on_assigned or (lambda _: None),
                                                                 on_revoked or (lambda _: None)))

    def run_callback(self, callback: Callable[[Any], None], partitions: Any) -> None:
        try:
            callback(partitions)
        except Exception as e:  # kafka-python only logs what a listener raises: raised after the poll instead
            self._deferred = e

    def poll(self, timeout_ms: int, on_unreadable: Unreadable) -> dict[int, list[Any]]:
        """One poll: partition -> its records (in offset order); empty after a failed poll or a skipped record."""
        if self.search is not None and self.search.armed:
            return self._search(self.search, on_unreadable)
        try:
            batch = self.consumer.poll(timeout_ms=timeout_ms, max_records=self.max_records)
        except CorruptRecordError as e:
            self._skip_unreadable(e, on_unreadable)
            return {}
        except KafkaError as e:
            if self.failures is None:
                raise
            self.failures.failed(e)
            return {}
        finally:
            deferred, self._deferred = self._deferred, None
            if deferred is not None:
                raise deferred
        if self.failures is not None:
            self.failures.succeeded()
        return {tp.partition: recs for tp, recs in batch.items() if tp.topic == self.topic}

    def _skip_unreadable(self, error: CorruptRecordError, on_unreadable: Unreadable) -> None:
        text = " ".join(str(error).split())[:500]
        found = False
        reader = self.reader()
        try:
            for tp in sorted(self.consumer.assignment()):
                pos = self.consumer.position(tp)
                if pos is None or reader.first_readable(tp.topic, tp.partition, pos):
                    continue
                found = True
                if on_unreadable(tp.partition, pos, REASON_CORRUPT, text):
                    self.consumer.seek(tp, pos + 1)
        finally:
            reader.close()
        if not found:
            raise error

    def _search(self, search: OversizeSearch, on_unreadable: Unreadable) -> dict[int, list[Any]]:
        """A fetch response was too large: read the assigned partitions past what hides there."""
        positions = {tp.partition: self.consumer.position(tp) for tp in sorted(self.consumer.assignment())
                     if tp.topic == self.topic}
        found = search.run(self.topic, positions, on_unreadable)
        for p, nxt in found.next_offsets.items():
            self.consumer.seek(self._tp(p), nxt)
        return found.records

    # ------------------------------------------------------------------ positions
    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic}

    def seek(self, partition: int, offset: int) -> None:
        self.consumer.seek(self._tp(partition), offset)

    def committed(self, partition: int, timeout_ms: int) -> int | None:
        """The group's committed offset of ``partition`` (None: none); raises ``KafkaError`` when not answered."""
        off = self.consumer.committed(self._tp(partition), timeout_ms=timeout_ms)
        return None if off is None else int(off)

    def highwater(self, partition: int) -> int | None:
        """The partition's end offset as of the last fetch (None: no fetch answered yet)."""
        hw = self.consumer.highwater(self._tp(partition))
        return None if hw is None else int(hw)

    # ------------------------------------------------------------------ commits
    def _offsets(self, offsets: Mapping[int, int],
                 metadata: Mapping[int, str] | None = None) -> dict[TopicPartition, OffsetAndMetadata]:
        meta = metadata or {}
        return {self._tp(p): OffsetAndMetadata(o, meta.get(p), -1) for p, o in offsets.items()}

    def commit_sync(self, offsets: Mapping[int, int], timeout_s: float | None = None, *,
                    metadata: Mapping[int, str] | None = None) -> None:
        """Commit ``offsets`` (with ``metadata`` per partition, when given) and wait for the answer (at most
        ``timeout_s``); :class:`CommitFailedError`."""
        try:
            if timeout_s is None:
                self.consumer.commit(self._offsets(offsets, metadata))
            else:
                self.consumer.commit(self._offsets(offsets, metadata), timeout_ms=int(timeout_s * 1000))
        except KafkaError as e:
            raise CommitFailedError(f"commit of {dict(offsets)} failed: {e!r}") from e

    def commit_async(self, offsets: Mapping[int, int], done: CommitDone, *,
                     metadata: Mapping[int, str] | None = None) -> None:
        """Send the commit of ``offsets``; ``done`` is called inside a later poll (or close) with the answer."""
        def callback(answered: dict[TopicPartition, OffsetAndMetadata], response: object) -> None:
            done({tp.partition: om.offset for tp, om in answered.items()},
                 response if isinstance(response, Exception) else None)

        try:
            self.consumer.commit_async(self._offsets(offsets, metadata), callback=callback)
        except KafkaError as e:
            raise CommitFailedError(f"commit of {dict(offsets)} failed: {e!r}") from e

    # ------------------------------------------------------------------ end
    def close(self, timeout_s: float) -> None:
        """Leave the group and close, waiting at most ``timeout_s`` (a stalled broker would otherwise hold it for
        ``kafka.request_timeout_ms``); errors of a client of a dead broker are only logged."""
        try:
            self.consumer.close(timeout_ms=int(timeout_s * 1000))
        except (KafkaError, OSError) as e:
            log.debug("consumer close failed: %r", e)
        if self.search is not None:
            self.search.close()

