"""Is the broker there, and did it keep its data?  The main path's view of its broker (issues 9 and 12).

**Outages.**  Whatever the broker answers (records polled, outputs acknowledged, a check that succeeded) is
evidence that it is there (:meth:`BrokerHealth.answered`).  After ``BROKER_CHECK_SECONDS`` without any, the loop
asks it for an input partition's first offset (:meth:`BrokerHealth.check_broker`, a group-less request bounded by
``kafka.request_timeout_ms``, at most 3 s) to tell an idle stream from an outage.  While requests fail, one clear
line per check, checking again with exponential backoff; whichever request fails first (the ping, or the data
check's metadata request) names the outage, and the broker's return is named too.

**Data loss** (:mod:`stream_anon.service.broker_guard`).  Every ``BROKER_DATA_CHECK_SECONDS`` (and while a flush
waits, and before a partition is recovered: :meth:`BrokerHealth.check_data` with ``force``): topic ids and partition
counts against the start, the input highwaters (of the last fetch) against the committed offsets, the owned ledger
partitions' ends against the ledger messages acknowledged.  A loss raises
:class:`~stream_anon.service.broker_guard.BrokerDataLossError` (``run`` exits 4).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from kafka.errors import KafkaError

from stream_anon.formats.messages import Receipt
from stream_anon.kafka_io.clients import backoff_delays
from stream_anon.kafka_io.lifecycle import LOOP_REQUEST_TIMEOUT_MS
from stream_anon.kafka_io.poller import Poller
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.kafka_io.settings import KafkaSettings
from stream_anon.service.broker_guard import HIGHWATER_CONFIRM_SECONDS, BrokerDataLossError, BrokerGuard

log = logging.getLogger(__name__)

BROKER_CHECK_SECONDS = 2.0
"""With no records polled and no output acknowledged for this long, the loop asks the broker for an input
partition's first offset (``PartitionReader.ping``, bounded by ``kafka.request_timeout_ms``, at most
``PING_TIMEOUT_MS``) to tell an idle stream from a broker outage."""
PING_TIMEOUT_MS = LOOP_REQUEST_TIMEOUT_MS
"""Longest the ping may wait for its answer (a stop is noticed after it at the latest)."""
BROKER_DATA_CHECK_SECONDS = 5.0
"""How often the loop (and a waiting flush) asks whether the broker lost data (:mod:`~stream_anon.service.broker_guard`):
one metadata request, plus one fetch per owned ledger partition."""


class BrokerHealth:
    """Outage detection and data-loss checks of one main-path member (see the module docstring).

    Args:
        guard: the topic-identity check and the offsets' floors.
        poller: the group consumer (assigned partitions and their highwaters).
        reader: the group-less reader (ping, ledger ends).
        ledger_partition: input partition -> its ledger partition.
        owned: the owned input partitions.
        stopping: true once the service is stopping (no data check then).
    """

    def __init__(self, guard: BrokerGuard, poller: Poller, reader: PartitionReader, *, kafka: KafkaSettings,
                 input_topic: str, ledger_topic: str, ledger_partition: Callable[[int], int],
                 owned: Callable[[], Iterable[int]], stopping: Callable[[], bool],
                 confirm_seconds: float = HIGHWATER_CONFIRM_SECONDS) -> None:
        self.guard = guard
        self.poller = poller
        self.reader = reader
        self.kafka = kafka
        self.input_topic = input_topic
        self.ledger_topic = ledger_topic
        self.ledger_partition = ledger_partition
        self.owned = owned
        self.stopping = stopping
        self.confirm_seconds = confirm_seconds
        now = time.monotonic()
        self.outage_since: float | None = None  # during an outage: monotonic time of the last answer
        self._check_at = now + BROKER_CHECK_SECONDS
        self._data_check_at = now + BROKER_DATA_CHECK_SECONDS
        self._delays = backoff_delays(kafka.retry_backoff_max_seconds)

    # ------------------------------------------------------------------ outages
    def answered(self) -> None:
        """Evidence that the broker answers (records polled, outputs acknowledged, a check succeeded)."""
        self._check_at = time.monotonic() + BROKER_CHECK_SECONDS
        if self.outage_since is not None:
            log.warning("broker %s answering again after %.0f s: resuming (nothing was committed meanwhile)",
                        self.kafka.bootstrap_servers, time.monotonic() - self.outage_since)
            self.outage_since = None
            self._delays = backoff_delays(self.kafka.retry_backoff_max_seconds)

    def check_broker_when_due(self) -> None:
        """Quiet for ``BROKER_CHECK_SECONDS`` (or the backoff delay during an outage): ask the broker (``ping``)."""
        if time.monotonic() < self._check_at or self.stopping():
            return
        quiet_since = self._check_at - BROKER_CHECK_SECONDS
        owned = list(self.owned())
        try:
            self.reader.ping(self.input_topic, min(owned) if owned else 0,
                             min(self.kafka.request_timeout_ms, PING_TIMEOUT_MS))
        except (KafkaError, OSError) as e:
            self.silent(quiet_since, e)
            self._check_topics_in_outage()
            return
        self.answered()

    def _check_topics_in_outage(self) -> None:
        """A failed ping may be a broker that answers but lost the topic: kafka-python's offsets request for an
        unknown topic only times out, and during an outage the data check waits for the ping (CI: a memory broker
        restarted, 60 s of "not answering" and no exit 4).  So a failed ping is followed by the topic check (one
        metadata request, at most every ``BROKER_DATA_CHECK_SECONDS``), which raises on a loss."""
        now = time.monotonic()
        if now < self._data_check_at or self.stopping():
            return
        self._data_check_at = now + BROKER_DATA_CHECK_SECONDS
        self.guard.check_topics()  # raises BrokerDataLossError; an error returned is the outage going on

    def silent(self, since: float, error: BaseException) -> None:
        """A request to the broker failed: one clear line, and the next ping after the next backoff delay (the
        Kafka clients reconnect and retry meanwhile; nothing is consumed, produced or committed)."""
        if self.outage_since is None:
            self.outage_since = since
        delay = next(self._delays)
        detail = str(error).removeprefix(f"{type(error).__name__}: ")
        log.warning("broker %s not answering for %.0f s (%s%s): nothing is consumed or committed meanwhile, "
                    "unacknowledged outputs are held; the clients keep retrying, checking again in %.1f s",
                    self.kafka.bootstrap_servers, time.monotonic() - self.outage_since, type(error).__name__,
                    f": {detail}" if detail and detail != "None" else "", delay)
        self._check_at = time.monotonic() + delay

    # ------------------------------------------------------------------ data loss
    def check_data(self, *, force: bool = False) -> bool:
        """Every ``BROKER_DATA_CHECK_SECONDS`` (or now, with ``force``): did the broker lose data?  Raises
        :class:`BrokerDataLossError`; returns False when the broker did not answer (nothing checked)."""
        now = time.monotonic()
        if not self._data_check_due(now, force):
            return True
        self._data_check_at = now + BROKER_DATA_CHECK_SECONDS
        failure = self.guard.check_topics()
        if failure is not None:
            self.silent(now, failure)
            return False
        floors = self.guard.floors
        suspects = {(self.input_topic, p) for p in self.poller.assignment()
                    if floors.check(self.input_topic, p, self.poller.highwater(p))}
        ledger = self._ledger_problems(now)
        if ledger is None:
            return False
        suspects |= set(ledger)
        found = self.confirmed_below_floor(suspects)
        if found:
            raise BrokerDataLossError("; ".join(found))
        return True

    def confirmed_below_floor(self, suspects: Iterable[tuple[str, int]]) -> list[str]:
        """The partitions among ``suspects`` (topic, partition) whose end stays below its floor: fresh reads until
        each is at or above it, for at most ``service.loss_confirm_seconds`` (a replicated cluster's new leader can
        report a lower highwater for a moment, docs/tansu.md); one line per loss left (none while stopping)."""
        floors = self.guard.floors
        pending: dict[tuple[str, int], str] = {tp: "" for tp in suspects}
        if not pending:
            return []
        t0 = time.monotonic()
        while True:
            for topic, partition in sorted(pending):
                try:
                    end = self.reader.bounds(topic, partition, timeout_s=LOOP_REQUEST_TIMEOUT_MS / 1000)[1]
                except (KafkaError, OSError) as e:
                    log.debug("broker data check: end of %s[%d] unknown: %r", topic, partition, e)
                    continue
                problem = floors.check(topic, partition, end)
                if problem is None:
                    del pending[(topic, partition)]
                    log.warning("%s[%d]: its end was below offset %s for up to %.1f s, then back (a new leader's "
                                "highwater catching up, not a loss)", topic, partition,
                                floors.floor(topic, partition), time.monotonic() - t0)
                else:
                    pending[(topic, partition)] = problem
            if not pending or self.stopping():
                return []
            if time.monotonic() - t0 >= self.confirm_seconds:
                return [problem or f"{topic}[{partition}] unreadable" for (topic, partition), problem
                        in sorted(pending.items())]
            time.sleep(0.2)

    def _data_check_due(self, now: float, force: bool) -> bool:
        """Forced, or its time came and the broker answers (during an outage only the ping asks, with its
        backoff); never while stopping."""
        return not self.stopping() and (force or (now >= self._data_check_at and self.outage_since is None))

    def _ledger_problems(self, now: float) -> list[tuple[str, int]] | None:
        """The owned ledger partitions whose end is below the ledger messages acknowledged (None: not answered)."""
        problems = []
        for p in sorted(self.owned()):
            if self.stopping():  # the stop path does not wait for checks
                return None
            lp = self.ledger_partition(p)
            try:
                end = self.reader.bounds(self.ledger_topic, lp, timeout_s=LOOP_REQUEST_TIMEOUT_MS / 1000)[1]
            except (KafkaError, OSError) as e:
                log.debug("broker data check: end of %s[%d] unknown: %r", self.ledger_topic, lp, e)
                self.silent(now, e)
                return None
            if self.guard.floors.check(self.ledger_topic, lp, end):
                problems.append((self.ledger_topic, lp))
        return problems

    def note_ledger(self, receipt: Receipt) -> None:
        """The ledger partitions hold at least the acknowledged messages of ``receipt`` (floors of the check)."""
        for d in receipt.deliveries():
            self.guard.floors.raise_to(d.topic, d.partition, d.offset + 1, "had acknowledged")

    def note_committed(self, partition: int, offset: int) -> None:
        """A watermark was committed (it never exceeds what was consumed: the input had that many records)."""
        self.guard.floors.raise_to(self.input_topic, partition, offset, "committed")

    def check_committed(self, partition: int, committed: int | None, group: str) -> None:
        """A partition's recovery: its committed offset must not be gone (when this process saw one) nor lie above
        the partition's highwater (of the fetch that brought its first records)."""
        floors = self.guard.floors
        floor = floors.floor(self.input_topic, partition)
        if committed is None and floor:
            raise BrokerDataLossError(f"the committed offset of group {group!r} for {self.input_topic}[{partition}] "
                                      f"is gone (it was at least {floor})")
        if committed is not None:
            floors.raise_to(self.input_topic, partition, committed, "found committed")
        if floors.check(self.input_topic, partition, self.poller.highwater(partition)):
            found = self.confirmed_below_floor([(self.input_topic, partition)])
            if found:
                raise BrokerDataLossError("; ".join(found))
