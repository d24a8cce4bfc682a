"""The group consumer of one input topic over confluent-kafka (librdkafka): :class:`ConfluentPoller`, the
:class:`~stream_anon.kafka_io.poller.Poller` the paths use by default (``kafka.consumer_client``).

librdkafka fetches in its own threads, outside the GIL, and hands the application whole batches (``consume``), so
the loop spends its time on the records, not on the client (``stream-anon bench service`` compares both clients).
What it does for its callers, as :class:`~stream_anon.kafka_io.poller.GroupPoller` does over kafka-python:

* **Records** come as :class:`Record` (offset, key, value, headers, timestamp), grouped by partition in offset
  order.  A record whose headers the client cannot decode (a header key that is not UTF-8: confluent-kafka raises
  while converting it) is **unreadable**: ``on_unreadable(partition, offset, "corrupt_record", error)``; its
  neighbours in the same producer batch are read normally (kafka-python cannot read any of them).
* **Messages too large to receive** (a fetch response over ``kafka.receive_max_bytes``: librdkafka reports
  ``Invalid response size`` and retries the same fetch forever, stalling every partition it fetches with it):
  the report arms the poller's :class:`~stream_anon.kafka_io.oversized.OversizeSearch`, which reads the assigned
  partitions one record batch at a time, hands their readable records to the caller and the unreadable batch by
  position (``"oversized"``), then moves the consumer past them.
* **Rebalances** (:meth:`subscribe`): ``on_assigned`` / ``on_revoked`` (a lost assignment is a revoke too) with the
  partitions of the topic; librdkafka calls them inside ``consume``; what they raise is kept and raised after it.
* **Positions**: ``seek`` (an actively fetched partition), ``committed`` (None: none), ``highwater`` (the end offset
  carried by the last fetch response: ``get_watermark_offsets(cached=True)``; Tansu's ListOffsets is wrong).
* **Commits** with optional metadata per partition: synchronous (bounded by ``timeout_s``: a commit not answered in
  time raises :class:`~stream_anon.kafka_io.errors.CommitFailedError`, as a failed one does) or asynchronous (the
  answer is matched to its request by offsets and handed to ``done`` inside a later ``poll`` or ``close``).
  confluent-kafka 2.16 writes the metadata with its C string's terminating NUL byte: a reader strips it (Tansu
  keeps no metadata at all).
* **Failures**: a fatal client error (e.g. a static member fenced by another with the same
  ``kafka.group_instance_id``) raises :class:`~stream_anon.kafka_io.errors.ConsumerFailedError` (exit 1: a
  supervisor starts a fresh member); other client errors are librdkafka's to retry (logged once a minute each).

Errors the callers catch are kafka-python's types (``KafkaError`` / ``KafkaTimeoutError``), as the producer's
confluent transport raises them: the paths handle one family of errors whatever the client.
"""

from __future__ import annotations

import logging
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import confluent_kafka
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from kafka import errors as kafka_errors

from stream_anon.kafka_io.clients import librdkafka_client_config, librdkafka_fetch_limits
from stream_anon.kafka_io.errors import CommitFailedError, ConsumerFailedError
from stream_anon.kafka_io.oversized import OversizeSearch, RepeatedLines, is_response_too_large
from stream_anon.kafka_io.poller import CommitDone, FailingPolls, Unreadable
from stream_anon.kafka_io.settings import KafkaSettings

log = logging.getLogger(__name__)

REASON_CORRUPT = "corrupt_record"
"""``on_unreadable`` reason of a record whose headers the client cannot decode."""
_headers_of = operator.methodcaller("headers")
"""``Message.headers()`` through the generic call path: confluent-kafka 2.16 returns a header with a NULL name and a
pending ``UnicodeDecodeError`` for a name that is not UTF-8, and CPython 3.11's specialized call of a method
descriptor does not check for that (the error then surfaces at some later call, blaming another record); this
path raises it here (``SystemError`` from the ``UnicodeDecodeError``)."""


class Record(NamedTuple):
    """One consumed record (the attributes of :class:`~stream_anon.kafka_io.poller.PolledRecord`)."""

    offset: int
    key: bytes | None
    value: bytes | None
    headers: Any  # list[tuple[str, bytes | None]] or ()
    timestamp: int | None


def consumer_config(k: KafkaSettings, *, group_id: str) -> dict[str, Any]:
    """The librdkafka properties of a group consumer of the ``kafka`` options: never commits by itself, starts at
    the earliest offset when the group has none, reads what is written (no transactions are used: a
    ``read_committed`` consumer would depend on the broker's last stable offset for nothing), the service's fetch
    and receive limits, static membership when ``kafka.group_instance_id`` is set."""
    conf: dict[str, Any] = {
        **librdkafka_client_config(k), **librdkafka_fetch_limits(k), "group.id": group_id,
        "enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": "earliest",
        "isolation.level": "read_uncommitted", "allow.auto.create.topics": False,
        "session.timeout.ms": k.session_timeout_ms,
        "heartbeat.interval.ms": min(k.heartbeat_interval_ms, max(100, k.session_timeout_ms // 3)),
        "max.poll.interval.ms": k.max_poll_interval_ms, "fetch.wait.max.ms": k.fetch_max_wait_ms,
        "socket.timeout.ms": max(10, k.request_timeout_ms), "reconnect.backoff.max.ms": 2000,
    }
    if k.group_instance_id:
        conf["group.instance.id"] = k.group_instance_id
    return conf


def kafka_error(e: BaseException, what: str) -> kafka_errors.KafkaError:
    """A confluent-kafka failure as the kafka-python error the paths catch (a timeout as ``KafkaTimeoutError``)."""
    err = e.args[0] if isinstance(e, KafkaException) and e.args else None
    if isinstance(err, KafkaError) and err.code() in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT):
        return kafka_errors.KafkaTimeoutError(f"{what}: {err.str()}")
    detail = err.str() if isinstance(err, KafkaError) else str(e)
    return kafka_errors.KafkaError(f"{what}: {detail}")


class ConfluentPoller:
    """The group consumer of ``topic`` over confluent-kafka (see the module docstring).

    Args:
        kafka: the ``kafka`` options (servers, security, timeouts, limits, static membership).
        topic: the one topic it consumes.
        group_id: the consumer group.
        max_records: records per poll at most.
        search: finds what a fetch response too large hides (None: one over the ``kafka`` options).
        failures: the bound on failing polls (kept for the interface: librdkafka retries by itself).
    """

    def __init__(self, kafka: KafkaSettings, topic: str, *, group_id: str, max_records: int,
                 search: OversizeSearch | None = None, failures: FailingPolls | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self.max_records = max_records
        self.failures = failures
        self.search = search if search is not None else OversizeSearch(kafka)
        self._deferred: BaseException | None = None
        self._fatal: KafkaError | None = None
        self._pending: deque[tuple[dict[int, int], CommitDone]] = deque()  # asynchronous commits not answered
        self._assigned: set[int] = set()
        self._next: dict[int, int] = {}  # partition -> the offset after the last record handed out (or sought to)
        self._lines = RepeatedLines(log)
        lib_log = logging.getLogger("librdkafka.consumer")
        self.consumer = Consumer({**consumer_config(kafka, group_id=group_id), "error_cb": self._on_error,
                                  "on_commit": self._on_commit, "logger": lib_log})

    def _tp(self, partition: int, offset: int = confluent_kafka.OFFSET_INVALID,
            metadata: str | None = None) -> TopicPartition:
        if metadata is None:
            return TopicPartition(self.topic, partition, offset)
        return TopicPartition(self.topic, partition, offset, metadata)

    # ------------------------------------------------------------------ client callbacks
    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
            log.error("consumer: fatal client error %s: %s", err.name(), err.str())
        elif is_response_too_large(err):
            self.search.arm(err.str())
        else:
            self._lines.debug("consumer: client error %s: %s", err.name(), err.str(), key=err.name())

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        answered = {tp.partition: tp.offset for tp in partitions if tp.topic == self.topic}
        failed = next((tp.error for tp in partitions if tp.error is not None), None)
        error = err or failed
        if not self._pending:
            return
        # matched by offsets (answers may come out of order), else the oldest
        i = next((i for i, (offsets, _) in enumerate(self._pending) if offsets == answered), 0)
        offsets, done = self._pending[i]
        del self._pending[i]
        done(offsets, None if error is None else kafka_errors.CommitFailedError(str(error)))

    # ------------------------------------------------------------------ group
    def subscribe(self, on_assigned: Callable[[set[int]], None] | None = None,
                  on_revoked: Callable[[list[int]], None] | None = None) -> None:
        """Join the group on the topic; the callbacks run inside :meth:`poll` (what they raise is raised after it)."""

        def assigned(_: Consumer, tps: list[TopicPartition]) -> None:
            parts = {tp.partition for tp in tps if tp.topic == self.topic}
            self._assigned |= parts
            if on_assigned is not None:
                self._run_callback(on_assigned, parts)

        def revoked(_: Consumer, tps: list[TopicPartition]) -> None:
            parts = sorted(tp.partition for tp in tps if tp.topic == self.topic)
            if on_revoked is not None:
                self._run_callback(on_revoked, parts)
            self._assigned -= set(parts)
            self.search.forget(parts)
            for p in parts:
                self._next.pop(p, None)

        self.consumer.subscribe([self.topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)

    def _run_callback(self, callback: Callable[[Any], None], partitions: Any) -> None:
        try:
            callback(partitions)
        except Exception as e:  # raised after the poll that ran it (librdkafka must finish its rebalance step)
            self._deferred = e

    def poll(self, timeout_ms: int, on_unreadable: Unreadable) -> dict[int, list[Any]]:
        """One poll: partition -> its records (in offset order); empty after a skipped record."""
        try:
            if self.search.armed:
                return self._search(on_unreadable)
            msgs = self._consume(timeout_ms / 1000.0)
        finally:
            deferred, self._deferred = self._deferred, None
            if deferred is not None:
                raise deferred
        if self._fatal is not None:
            raise ConsumerFailedError(f"the group consumer failed for good: {self._fatal.name()}: "
                                      f"{self._fatal.str()}")
        out: dict[int, list[Any]] = {}
        cut: set[int] = set()  # partitions whose rest of this batch comes again (the consumer was moved back)
        topic = self.topic
        for m in msgs:
            err = m.error()
            if err is not None:
                self._lines.warning("consumer: %s", err.str(), key=err.name())
                continue
            p: int = m.partition()  # type: ignore[assignment]  # (None only on error events)
            offset: int = m.offset()  # type: ignore[assignment]
            if p in cut or m.topic() != topic:
                continue
            try:
                headers = _headers_of(m) or ()
            except Exception as e:  # noqa: BLE001 - a header confluent-kafka cannot convert (e.g. a non-UTF-8 key)
                cause = e.__cause__ or e.__context__ or e
                if self._unreadable(p, offset, f"{type(cause).__name__}: {cause}", on_unreadable, out):
                    cut.add(p)
                continue
            rec = Record(offset, m.key(), m.value(), headers, m.timestamp()[1])
            recs = out.get(p)
            if recs is None:
                out[p] = [rec]
            else:
                recs.append(rec)
        for p, recs in out.items():
            self._next[p] = recs[-1].offset + 1
        if self.failures is not None:
            self.failures.succeeded()
        return out

    def _consume(self, timeout_s: float) -> list[confluent_kafka.Message]:
        """What is there, up to ``max_records``, waiting at most ``timeout_s`` for the first message only
        (librdkafka's ``consume(n, timeout)`` waits until it has ``n`` messages or the timeout passed)."""
        msgs = self.consumer.consume(self.max_records, 0)
        if msgs or timeout_s <= 0:
            return msgs
        first = self.consumer.poll(timeout_s)
        if first is None:
            return []
        return [first, *self.consumer.consume(self.max_records - 1, 0)]

    def _unreadable(self, partition: int, offset: int, error: str, on_unreadable: Unreadable,
                    out: dict[int, list[Any]]) -> bool:
        """A record the client cannot read; True: the rest of the partition's batch comes again.

        The caller sees a partition in order: records before it in this batch go to the caller first and the
        consumer is moved back to it (it comes first in the next poll); otherwise it is handed to the caller now
        (taken: the batch goes on past it; not taken: the caller moved the consumer where it wants it)."""
        if out.get(partition):
            self.seek(partition, offset)
            return True
        if on_unreadable(partition, offset, REASON_CORRUPT, " ".join(error.split())[:500]):
            self._next[partition] = offset + 1
            return False
        return True

    def _search(self, on_unreadable: Unreadable) -> dict[int, list[Any]]:
        """A fetch response was too large: read the assigned partitions past what hides there (see
        :class:`~stream_anon.kafka_io.oversized.OversizeSearch`); the consumer is moved past what was handed out."""
        positions = {p: self._position(p) for p in sorted(self.assignment())}
        found = self.search.run(self.topic, positions, on_unreadable)
        for p, nxt in found.next_offsets.items():
            self.seek(p, nxt)
        return found.records

    def _position(self, partition: int) -> int | None:
        """Where the caller reads ``partition`` next (None: not known yet): after the last record handed out or
        the last seek; before any, the group's committed offset or the partition's first offset."""
        if partition in self._next:
            return self._next[partition]
        timeout_ms = min(self.kafka.request_timeout_ms, 5000)
        try:
            committed = self.committed(partition, timeout_ms)
            if committed is not None:
                return committed
            low, _ = self.consumer.get_watermark_offsets(self._tp(partition), timeout=timeout_ms / 1000.0)
        except (kafka_errors.KafkaError, KafkaException, TypeError):
            return None
        return None if low is None or low < 0 else int(low)  # no committed offset: auto.offset.reset = earliest

    # ------------------------------------------------------------------ positions
    def assignment(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic}

    def seek(self, partition: int, offset: int) -> None:
        """Move the fetch position of an assigned partition; ``ValueError`` when it is not assigned."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.consumer.seek(self._tp(partition, offset))
                self._next[partition] = offset
                return
            except KafkaException as e:
                err = e.args[0] if e.args else None
                if partition not in self.assignment():
                    raise ValueError(f"{self.topic}[{partition}] is not assigned: {e}") from e
                # assigned but its fetcher not started yet (_STATE): it starts within the next polls
                if time.monotonic() > deadline or not (isinstance(err, KafkaError)
                                                       and err.code() == KafkaError._STATE):
                    raise ValueError(f"{self.topic}[{partition}]: seek to {offset} failed: {e}") from e
                time.sleep(0.05)

    def committed(self, partition: int, timeout_ms: int) -> int | None:
        """The group's committed offset of ``partition`` (None: none); raises ``KafkaError`` when not answered."""
        try:
            tps = self.consumer.committed([self._tp(partition)], timeout=timeout_ms / 1000.0)
        except KafkaException as e:
            raise kafka_error(e, f"committed offset of {self.topic}[{partition}]") from e
        tp = tps[0]
        if tp.error is not None:
            raise kafka_errors.KafkaError(f"committed offset of {self.topic}[{partition}]: {tp.error.str()}")
        return None if tp.offset < 0 else int(tp.offset)

    def highwater(self, partition: int) -> int | None:
        """The partition's end offset as of the last fetch (None: no fetch answered yet)."""
        try:
            _, hi = self.consumer.get_watermark_offsets(self._tp(partition), cached=True)
        except (KafkaException, TypeError):
            return None
        return None if hi is None or hi < 0 else int(hi)

    # ------------------------------------------------------------------ commits
    def _offsets(self, offsets: Mapping[int, int], metadata: Mapping[int, str] | None) -> list[TopicPartition]:
        meta = metadata or {}
        return [self._tp(p, o, meta.get(p)) for p, o in offsets.items()]

    def commit_sync(self, offsets: Mapping[int, int], timeout_s: float | None = None, *,
                    metadata: Mapping[int, str] | None = None) -> None:
        """Commit ``offsets`` (with ``metadata`` per partition, when given) and wait for the answer (at most
        ``timeout_s``: not answered in time is a failure); :class:`CommitFailedError`."""
        tps = self._offsets(offsets, metadata)
        if timeout_s is None:
            self._commit_now(tps, offsets)
            return
        outcome: list[BaseException | None] = []
        done = threading.Event()

        def run() -> None:
            try:
                self._commit_now(tps, offsets)
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                outcome.append(e)
            done.set()

        threading.Thread(target=run, name="consumer-commit", daemon=True).start()
        if not done.wait(timeout_s):
            raise CommitFailedError(f"commit of {dict(offsets)} not answered within {timeout_s:g} s")
        if outcome[0] is not None:
            raise outcome[0]

    def _commit_now(self, tps: list[TopicPartition], offsets: Mapping[int, int]) -> None:
        try:
            answered = self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as e:
            raise CommitFailedError(f"commit of {dict(offsets)} failed: {kafka_error(e, 'commit')!r}") from e
        failed = [tp.error for tp in answered or () if tp.error is not None]
        if failed:
            raise CommitFailedError(f"commit of {dict(offsets)} failed: {failed[0].str()}")

    def commit_async(self, offsets: Mapping[int, int], done: CommitDone, *,
                     metadata: Mapping[int, str] | None = None) -> None:
        """Send the commit of ``offsets``; ``done`` is called inside a later poll (or close) with the answer."""
        try:
            self.consumer.commit(offsets=self._offsets(offsets, metadata), asynchronous=True)
        except KafkaException as e:
            raise CommitFailedError(f"commit of {dict(offsets)} failed: {kafka_error(e, 'commit')!r}") from e
        self._pending.append((dict(offsets), done))

    # ------------------------------------------------------------------ end
    def close(self, timeout_s: float) -> None:
        """Leave the group and close, waiting at most ``timeout_s`` (librdkafka's close has no bound of its own: a
        stalled broker would hold it for the session timeout); what it does afterwards is only logged."""
        closed = threading.Event()

        def run() -> None:
            try:
                self.consumer.close()
            except (KafkaException, RuntimeError) as e:
                log.debug("consumer close failed: %r", e)
            closed.set()

        threading.Thread(target=run, name="consumer-close", daemon=True).start()
        if not closed.wait(max(0.0, timeout_s)):
            log.debug("consumer close not done within %.1f s: left to finish in the background", timeout_s)
        self.search.close()
