"""Messages a consumer cannot receive: found by position, so that the paths dead-letter them and go on.

A consumer refuses a fetch response larger than ``kafka.receive_max_bytes`` (librdkafka: ``Receive failed: Invalid
response size``; kafka-python: ``InvalidReceiveError: Invalid frame length``), and both clients then retry the same
fetch forever: every partition fetched in that request stalls, not only the one holding the large message.  Which
message it is, neither says.  :class:`OversizeSearch` finds out, once armed by that report:

1. it reads each assigned partition from the group consumer's position **one record batch per fetch** (a
   group-less kafka-python consumer with ``fetch_max_bytes = 1``: every Kafka broker returns exactly the first
   batch then, and so does Tansu, which otherwise fills a fetch up to ``fetch_max_bytes`` whatever the partition
   limit); the records it reads are handed to the caller like polled ones (on Tansu the group consumer cannot read
   the records just before the large one either: its fetch takes them together);
2. a partition whose next batch does not come within ``batch_timeout_s`` is checked with a fetch of librdkafka,
   which names the failure (:func:`unreceivable`); when that fetch is refused for its size, the batch at that
   position is the one: ``on_unreadable(partition, offset, "oversized", detail)``, and the consumer moves past it.

The search reads at most ``max_records`` records per run; the caller moves the group consumer to where it stopped
(:attr:`Found.next_offsets`).  Its own clients' failures are quiet (:class:`ReceiveLimitLines` keeps the client
libraries from logging one ERROR line per retry: the search logs one line per message found).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from stream_anon.kafka_io.clients import (
    client_options,
    fetch_limits,
    librdkafka_client_config,
    no_auto_create,
)
from stream_anon.kafka_io.reader import records_max_wait_ms
from stream_anon.kafka_io.settings import KafkaSettings

log = logging.getLogger(__name__)

REASON_OVERSIZED = "oversized"
"""The ``on_unreadable`` reason (and dead-letter reason) of a message larger than the consumer can receive."""
BATCH_TIMEOUT_SECONDS = 3.0
"""A one-batch fetch that brings nothing for this long is checked for a size failure (a fetch of one batch answers
within milliseconds when the broker answers)."""
PROBE_SECONDS = 5.0
"""How long :func:`unreceivable` waits for its fetch's outcome."""
_TOO_LARGE = re.compile(r"Invalid response size (\d+)|Invalid frame length: (\d+)")
Unreadable = Callable[[int, int, str, str], bool]


def _response_size(text: str) -> int | None:
    """The response size a client's refusal names (None: it names none)."""
    m = _TOO_LARGE.search(text)
    size = next((g for g in (m.groups() if m else ()) if g), None)
    return None if size is None else int(size)


def is_response_too_large(err: confluent_kafka.KafkaError) -> bool:
    """Whether a librdkafka error report is a fetch response over ``receive.message.max.bytes``."""
    return err.code() == confluent_kafka.KafkaError._BAD_MSG and _TOO_LARGE.search(err.str()) is not None


class RepeatedLines:
    """Log a line at most once a minute per ``key`` (a client that retries forever would log it every time), with
    how many were left out meanwhile."""

    def __init__(self, logger: logging.Logger, every_s: float = 60.0) -> None:
        self.logger = logger
        self.every_s = every_s
        self._last: dict[str, tuple[float, int]] = {}

    def log(self, level: int, msg: str, *args: Any, key: str) -> None:
        now = time.monotonic()
        last, skipped = self._last.get(key, (-1e18, 0))
        if now - last < self.every_s:
            self._last[key] = (last, skipped + 1)
            return
        self._last[key] = (now, 0)
        suffix = f" ({skipped} more like it in the last {self.every_s:.0f} s)" if skipped else ""
        self.logger.log(level, msg + suffix, *args)

    def warning(self, msg: str, *args: Any, key: str) -> None:
        self.log(logging.WARNING, msg, *args, key=key)

    def debug(self, msg: str, *args: Any, key: str) -> None:
        self.log(logging.DEBUG, msg, *args, key=key)


# ---------------------------------------------------------------------------------------------- client reports
_SEARCHES: weakref.WeakSet[OversizeSearch] = weakref.WeakSet()


class ReceiveLimitLines(logging.Filter):
    """On the client libraries' loggers: a line reporting a fetch response over the receive limit (kafka-python
    ``InvalidReceiveError``, librdkafka ``Invalid response size``) arms every kafka-python poller's search (the
    library reports it nowhere else) and is dropped; the search logs what it finds."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "InvalidReceiveError" not in text and "Invalid response size" not in text:
            return True
        for search in list(_SEARCHES):
            if search.listens_to_logs:
                search.arm(text)
        return False


_FILTERED_LOGGERS = ("kafka.consumer.fetcher", "kafka.net.connection", "kafka.net.transport", "kafka.cluster",
                     "kafka.conn", "kafka.client", "librdkafka", "librdkafka.consumer")


def install_receive_limit_lines() -> None:
    """Install :class:`ReceiveLimitLines` on the client libraries' loggers (once per process)."""
    for name in _FILTERED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ReceiveLimitLines) for f in logger.filters):
            logger.addFilter(ReceiveLimitLines())


# ---------------------------------------------------------------------------------------------- probes
def unreceivable(kafka: KafkaSettings, topic: str, partition: int, offset: int,
                 timeout_s: float = PROBE_SECONDS) -> str | None:
    """The client's error when a fetch of ``topic[partition]`` at ``offset`` (about one record batch: librdkafka's
    smallest fetch) is refused for its size, else None (a record came, the partition ends there, or no answer).

    librdkafka names the failure (Tansu may add the next batches of up to 1,000 bytes to such a fetch, so a refusal
    means the batch at ``offset`` or one just after it is too large: :class:`OversizeSearch` asks only after a
    fetch of exactly one batch at ``offset`` brought nothing)."""
    errors: list[confluent_kafka.KafkaError] = []
    c = _probe_consumer(kafka, errors)
    try:
        tp = confluent_kafka.TopicPartition(topic, partition, offset)
        c.assign([tp])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            msgs = c.consume(1, 0.2)
            too_large = [e for e in errors if is_response_too_large(e)]
            if too_large:
                return too_large[0].str()
            if any(m.error() is None for m in msgs):
                return None
            _, hi = c.get_watermark_offsets(tp, cached=True)
            if hi is not None and 0 <= hi <= offset:
                return None  # nothing there to read
        return None
    finally:
        c.close()


def _probe_consumer(kafka: KafkaSettings, errors: list[confluent_kafka.KafkaError]) -> confluent_kafka.Consumer:
    """A group-less librdkafka consumer whose fetches bring about one record batch (its smallest fetch), with the
    service's receive limit; its client errors go to ``errors``."""
    return confluent_kafka.Consumer({
        **librdkafka_client_config(kafka), "group.id": f"{kafka.group_id}.size-probe", "enable.auto.commit": False,
        "fetch.max.bytes": 1000, "max.partition.fetch.bytes": 1, "message.max.bytes": 1000,
        "receive.message.max.bytes": kafka.receive_max_bytes, "fetch.wait.max.ms": 50, "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500, "isolation.level": "read_uncommitted", "allow.auto.create.topics": False,
        "error_cb": errors.append, "logger": logging.getLogger("librdkafka.consumer")})


def highwater_past(kafka: KafkaSettings, topic: str, partition: int, start: int, *, timeout_s: float = 2.0,
                   max_steps: int = 16) -> tuple[int | None, list[int]]:
    """The end offset of ``topic[partition]`` from a fetch at ``start`` (about one record batch: a fetch answer
    carries the partition's highwater), stepping past offsets whose batch is too large to receive; returns (the
    highwater or None when no fetch was answered within ``timeout_s`` a step, the offsets stepped past).  What the
    lag monitor reads when its own fetch does not answer: the lag then counts from the true end, whatever the
    size of the records there."""
    stepped: list[int] = []
    offset = max(0, start)
    for _ in range(max_steps):
        errors: list[confluent_kafka.KafkaError] = []
        c = _probe_consumer(kafka, errors)
        try:
            tp = confluent_kafka.TopicPartition(topic, partition, offset)
            c.assign([tp])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and not any(is_response_too_large(e) for e in errors):
                c.consume(1, 0.1)
                _, hi = c.get_watermark_offsets(tp, cached=True)
                if hi is not None and hi >= 0:  # a fetch was answered (with records or none)
                    return int(hi), stepped
            if not any(is_response_too_large(e) for e in errors):
                return None, stepped
        finally:
            c.close()
        stepped.append(offset)
        offset += 1
    return None, stepped


class BatchReader:
    """Reads one partition one record batch per fetch (kafka-python, group-less, ``fetch_max_bytes = 1``), with the
    service's receive limit."""

    def __init__(self, kafka: KafkaSettings) -> None:
        options = {**client_options(kafka), **fetch_limits(kafka), "fetch_max_bytes": 1,
                   "max_partition_fetch_bytes": 1}
        self.consumer = no_auto_create(KafkaConsumer(**options, group_id=None, enable_auto_commit=False,
                                                     auto_offset_reset="earliest",
                                                     fetch_max_wait_ms=records_max_wait_ms(kafka)))
        self._tp: TopicPartition | None = None

    def start(self, topic: str, partition: int, offset: int) -> None:
        tp = TopicPartition(topic, partition)
        if self._tp != tp:
            self.consumer.assign([tp])
            self._tp = tp
        self.consumer.seek(tp, offset)

    def read(self, max_records: int, timeout_s: float) -> tuple[list[Any], bool]:
        """Records from the current position (at most ``max_records``, until nothing came for ``timeout_s``) and
        whether the partition's end was reached."""
        assert self._tp is not None
        tp, c = self._tp, self.consumer
        got: list[Any] = []
        quiet_since = time.monotonic()
        while len(got) < max_records:
            hw = c.highwater(tp)
            if hw is not None and c.position(tp) >= hw:
                return got, True
            recs = c.poll(timeout_ms=100, max_records=max_records - len(got)).get(tp, [])
            if recs:
                got.extend(recs)
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > timeout_s:
                return got, False
        return got, False

    def position(self) -> int:
        assert self._tp is not None
        return int(self.consumer.position(self._tp))

    def close(self) -> None:
        try:
            self.consumer.close()
        except (KafkaError, OSError) as e:
            log.debug("batch reader close: %r", e)


@dataclass
class Found:
    """What one search run read: readable records by partition (offset order) and where the group consumer goes on
    in each partition it moved."""

    records: dict[int, list[Any]] = field(default_factory=dict)
    next_offsets: dict[int, int] = field(default_factory=dict)


class OversizeSearch:
    """See the module docstring.  ``arm`` (any thread) when a client reports a fetch response too large; the poller
    calls :meth:`run` while :attr:`armed`.

    Args:
        kafka: the ``kafka`` options (receive limit, servers, security).
        max_records: records read per run at most.
        listens_to_logs: armed by the client libraries' log lines too (a kafka-python consumer reports it nowhere
            else).
    """

    def __init__(self, kafka: KafkaSettings, *, max_records: int | None = None, listens_to_logs: bool = False,
                 batch_timeout_s: float = BATCH_TIMEOUT_SECONDS,
                 probe: Callable[[str, int, int], str | None] | None = None) -> None:
        self.kafka = kafka
        self.max_records = max_records if max_records is not None else kafka.max_poll_records
        self.listens_to_logs = listens_to_logs
        self.batch_timeout_s = batch_timeout_s
        self.probe = probe or (lambda t, p, o: unreceivable(kafka, t, p, o))
        self._armed = threading.Event()
        self._detail = ""
        self._reader: BatchReader | None = None
        self._verdicts: dict[int, tuple[int, str]] = {}  # partition -> (offset, detail) found, not handed out yet
        self.found = 0  # messages handed out as oversized
        self._nothing = RepeatedLines(log)
        install_receive_limit_lines()
        _SEARCHES.add(self)

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def arm(self, detail: str) -> None:
        self._detail = detail
        self._armed.set()

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions revoked: what was found there is the next owner's to find."""
        for p in partitions:
            self._verdicts.pop(p, None)

    def run(self, topic: str, positions: Mapping[int, int | None], on_unreadable: Unreadable) -> Found:
        """One search over ``positions`` (partition -> the group consumer's next offset; None: unknown, skipped)."""
        found = Found()
        budget = self.max_records
        try:
            for p, pos in positions.items():
                if pos is None or budget <= 0:
                    continue
                budget -= self._partition(topic, p, pos, budget, on_unreadable, found)
        finally:
            if not found.records and not found.next_offsets and any(pos is not None for pos in positions.values()):
                size = _response_size(self._detail)
                self._nothing.warning("a fetch response of %s bytes was larger than kafka.receive_max_bytes (%s) but "
                                      "no record batch at the consumer's positions is: a fetch of many partitions at "
                                      "once may exceed it (raise kafka.receive_max_bytes or lower "
                                      "kafka.fetch_max_bytes)", "?" if size is None else f"{size:,}",
                                      f"{self.kafka.receive_max_bytes:,}", key="nothing")
            if not self._verdicts:  # (a verdict waits for the records before it: the next run hands it out)
                self._armed.clear()
        return found

    def _partition(self, topic: str, p: int, pos: int, budget: int, on_unreadable: Unreadable, found: Found) -> int:
        """Read partition ``p`` from ``pos``, one batch per fetch; a batch that does not come is checked for its
        size.  Returns the records read."""
        verdict = self._verdicts.pop(p, None)
        if verdict is not None and verdict[0] == pos:
            self._hand_out(topic, p, pos, verdict[1], on_unreadable, found)
            return 0
        reader = self._batch_reader()
        reader.start(topic, p, pos)
        recs, at_end = reader.read(budget, self.batch_timeout_s)
        end = reader.position()
        if recs:
            found.records[p] = recs
        if end > pos:
            found.next_offsets[p] = end
        if at_end or len(recs) >= budget:
            return len(recs)
        detail = self.probe(topic, p, end)
        if detail is not None:
            if recs:  # the records before it first: it is handed out by the next run
                self._verdicts[p] = (end, detail)
            else:
                self._hand_out(topic, p, end, detail, on_unreadable, found)
        return len(recs)

    def _hand_out(self, topic: str, p: int, offset: int, detail: str, on_unreadable: Unreadable,
                  found: Found) -> None:
        size = _response_size(detail)
        error = (f"a fetch of the record batch at this offset is {size:,} bytes, over kafka.receive_max_bytes "
                 f"({self.kafka.receive_max_bytes:,}): the consumer cannot receive it" if size is not None else
                 f"the consumer cannot receive the record batch at this offset ({detail[:200]})")
        log.info("%s[%d]: the message at offset %d is larger than the consumer can receive (%s): handed out by its "
                 "position as %s, the partition goes on", topic, p, offset, error, REASON_OVERSIZED)
        if on_unreadable(p, offset, REASON_OVERSIZED, error):
            found.next_offsets[p] = offset + 1
            self.found += 1
        else:
            found.next_offsets.pop(p, None)  # the caller moved the consumer where it wants it

    def _batch_reader(self) -> BatchReader:
        if self._reader is None:
            self._reader = BatchReader(self.kafka)
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        _SEARCHES.discard(self)
