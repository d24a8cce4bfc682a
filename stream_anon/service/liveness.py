"""Liveness that does not depend on the main loop being alive: its heartbeat, the consumer lag and the progress gauge.

- :class:`LoopHeartbeat`: the main loop ticks it on every iteration (and while it waits for the broker: a flush's
  slices, a retry's attempts); ``/healthz`` on the metrics port (:func:`stream_anon.metrics.endpoint.serve_metrics`)
  answers 503 once it has not ticked for ``service.healthz_stall_seconds``, or once the lag monitor has seen no
  progress for that long while there is lag or the broker does not answer.
- :class:`LagMonitor`: a thread with its own Kafka consumer (no group membership) that, every
  :data:`LAG_INTERVAL_SECONDS`, asks the broker for the highwater of every partition assigned to this member and sets
  ``stream_anon_consumer_lag`` = highwater - consumed position.  The consumed position is the loop's (published on
  every tick), or, for a partition the loop has not started, the group's committed offset (0 when none).  The
  highwater comes with a fetch answer (``KafkaConsumer.highwater()`` after a poll); ``end_offsets()`` is wrong on
  Tansu (measured: 102 for a partition holding 150 records) and ``KafkaAdminClient`` has no ``list_offsets`` in
  kafka-python 3.0.  ``stream_anon_seconds_since_progress``: seconds since a consumed position or a committed offset
  last moved, 0 while the broker answers and there is no lag (nothing to do is not a stall).  While the broker does
  not answer, the lag cannot be read: the gauge keeps the last value read, ``stream_anon_broker_unanswered_seconds``
  says for how long the broker has not answered, and the seconds since progress keep growing (an unknown lag is not
  "nothing to do").  Both are computed when scraped, so they move even while a round waits for the broker.
  A partition its fetch does not answer (empty, or a record batch there larger than ``kafka.receive_max_bytes``) gets
  its highwater from a fetch of about one batch that steps past what cannot be received
  (:func:`~stream_anon.kafka_io.oversized.highwater_past`, one WARNING per such offset): the lag counts from the true
  end, whatever the records' size.

Because the thread reads the broker itself, a stuck loop shows as growing lag and growing seconds since progress
(the ``StreamAnonStalled`` alert), where the loop's own numbers would freeze; a stalled broker shows as growing
seconds since progress and seconds unanswered.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError

from stream_anon.config.settings import Config
from stream_anon.kafka_io.clients import client_options, fetch_limits, no_auto_create
from stream_anon.kafka_io.oversized import highwater_past
from stream_anon.metrics.definitions import ServiceMetrics

log = logging.getLogger(__name__)

LAG_INTERVAL_SECONDS = 5.0
"""How often the lag monitor asks the broker for the highwaters."""
MONITOR_REQUEST_TIMEOUT_MS = 5000
"""Request timeout of the monitor's consumer (a stalled broker delays one round, never the service's stop)."""
STALL_LOG_CHECK_SECONDS = 1.0
"""How often the stall log looks at the seconds since progress (as ``/healthz`` does when asked)."""
FETCH_ROUND_SECONDS = 2.0
"""At most this long per round waiting for the fetch answers that carry the highwaters."""


class LoopHeartbeat:
    """The main loop's heartbeat: ``tick()`` on every iteration; ``health()`` for ``/healthz``; ``watch(monitor)``
    adds the lag monitor's view (no progress with lag, or a broker that does not answer)."""

    def __init__(self, stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        self._last = time.monotonic()
        self._monitor: LagMonitor | None = None

    def tick(self) -> None:
        self._last = time.monotonic()

    def watch(self, monitor: LagMonitor | None) -> None:
        self._monitor = monitor

    def age(self) -> float:
        """Seconds since the last tick."""
        return time.monotonic() - self._last

    def health(self) -> tuple[bool, str]:
        """(healthy, one line): unhealthy once the loop has not ticked for ``stall_seconds``, or once no progress was
        made for that long while there is lag or the broker does not answer (what the line says)."""
        age = self.age()
        bound = f"(bound service.healthz_stall_seconds = {self.stall_seconds:g})"
        if age > self.stall_seconds:
            return False, f"stalled: main loop has not ticked for {age:.0f} s {bound}"
        m = self._monitor
        if m is not None and m.seconds_since_progress() > self.stall_seconds:
            silent = m.broker_unanswered_seconds()
            why = (f"the broker has not answered for {silent:.0f} s" if silent > 0
                   else f"lag {sum(m.lag.values())} records")
            return False, f"stalled: no progress for {m.seconds_since_progress():.0f} s, {why} {bound}"
        return True, f"ok: main loop ticked {age:.1f} s ago"


@dataclasses.dataclass(frozen=True)
class LoopView:
    """What the loop publishes for the monitor (a new object per tick: read without locks)."""

    assigned: frozenset[int] = frozenset()
    positions: Mapping[int, int] = dataclasses.field(default_factory=dict)  # partition -> next offset to consume


class LagMonitor:
    """The lag and progress thread (see the module docstring).  ``view()`` returns the loop's latest
    :class:`LoopView`; :meth:`start`, :meth:`stop`."""

    def __init__(self, cfg: Config, metrics: ServiceMetrics, view: Callable[[], LoopView], *,
                 interval: float = LAG_INTERVAL_SECONDS) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.view = view
        self.interval = interval
        self.topic = cfg.topics.input
        self.highwater: dict[int, int] = {}
        self.lag: dict[int, int] = {}
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._assigned: set[int] = set()
        self._last_marks: tuple[tuple[int, int], ...] | None = None
        self._committed: dict[int, int] = {}
        self._too_large: dict[int, set[int]] = {}  # partition -> offsets found too large to receive (logged once)
        self._progress_at = time.monotonic()
        self._answered_at = time.monotonic()  # the last round the broker answered
        self._answering = True  # the last round got its answers
        self._lock = threading.Lock()  # progress is updated by the thread and by scrapes
        self._thread = threading.Thread(target=self._run, name="lag-monitor", daemon=True)
        # the stall log has its own thread: a round can wait for a silent broker longer than a stall lasts
        self._stall_thread = threading.Thread(target=self._watch_stalls, name="stall-log", daemon=True)
        self.rounds = 0
        self.stall_seconds = cfg.service.healthz_stall_seconds
        self._stall_logged = False  # a WARNING was logged for the stall going on (one per stall)
        metrics.seconds_since_progress.set_function(self.seconds_since_progress)  # computed when scraped
        metrics.broker_unanswered_seconds.set_function(self.broker_unanswered_seconds)

    def seconds_since_progress(self) -> float:
        """Seconds since progress (a consumed position or committed offset moved), counted while there is lag or
        the broker does not answer; 0 while it answers and there is nothing to do.  The loop's positions are looked
        at here too (a scrape between two rounds sees a position that moved)."""
        if self._answering and self.rounds and sum(self.lag.values()) == 0:
            return 0.0  # the broker answers and nothing waits: not a stall
        self._set_progress(round_done=False)
        return time.monotonic() - self._progress_at

    def broker_unanswered_seconds(self) -> float:
        """0 while the broker answers the monitor's rounds, else seconds since it last did."""
        return 0.0 if self._answering else time.monotonic() - self._answered_at

    def start(self) -> LagMonitor:
        self._thread.start()
        self._stall_thread.start()
        return self

    def stop(self, timeout: float = 0.5) -> None:
        """Ask the thread to end and wait at most ``timeout`` (a daemon: a round still waiting for a stalled broker
        ends on its own, its consumer closed by the thread; the stop path does not wait for it)."""
        self._stop.set()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._round()
                    self._answering, self._answered_at = True, time.monotonic()
                except (KafkaError, OSError) as e:  # the broker is away: the last lag read stands, unknown since
                    log.debug("lag monitor: %r", e)
                    self._answering = False
                    self._close()
                self._set_progress()
                self._stop.wait(self.interval)
        finally:
            self._close()

    def _open(self) -> KafkaConsumer:
        if self._consumer is None:
            k = self.cfg.kafka
            opts = {**client_options(self.cfg.kafka), "request_timeout_ms": min(k.request_timeout_ms,
                                                                           MONITOR_REQUEST_TIMEOUT_MS)}
            self._consumer = no_auto_create(KafkaConsumer(**opts, group_id=k.group_id, enable_auto_commit=False,
                                                          fetch_max_wait_ms=100, **fetch_limits(k, partition_bytes=1024)))
            self._assigned = set()
        return self._consumer

    def _close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close(autocommit=False, timeout_ms=500)
            except (KafkaError, OSError) as e:
                log.debug("lag monitor: close: %r", e)
            self._consumer = None

    def _round(self) -> None:
        view = self.view()
        c = self._open()
        parts = sorted(view.assigned)
        tps = [TopicPartition(self.topic, p) for p in parts]
        if set(parts) != self._assigned:
            c.assign(tps)
            self._assigned = set(parts)
            for gone in [p for p in self.lag if p not in self._assigned]:
                self.metrics.consumer_lag.remove(self.topic, str(gone))
                self.lag.pop(gone)
                self.highwater.pop(gone, None)
        if not tps:
            self.rounds += 1
            return
        committed: dict[int, int] = {}
        for tp in tps:
            off = c.committed(tp, timeout_ms=MONITOR_REQUEST_TIMEOUT_MS)
            committed[tp.partition] = int(off) if off is not None else 0
        self._committed = committed
        # a fetch from one record before the last highwater answers at once, with the partition's highwater
        c.resume(*tps)
        for tp in tps:
            c.seek(tp, max(0, self.highwater.get(tp.partition, committed[tp.partition]) - 1))
        fresh: dict[int, int] = {}
        deadline = time.monotonic() + FETCH_ROUND_SECONDS
        while len(fresh) < len(tps) and time.monotonic() < deadline:
            got = c.poll(timeout_ms=200, max_records=len(tps) * 10)
            for tp in got:
                hw = c.highwater(tp)
                if hw is not None:
                    fresh[tp.partition] = int(hw)
                    c.pause(tp)
        c.pause(*tps)  # (a fetch that keeps failing is not retried between rounds)
        for tp in tps:  # no answer to this round's fetch: an empty partition, or a batch too large to receive there
            if tp.partition not in fresh:
                self._read_end(tp.partition, committed[tp.partition], fresh)
        if not fresh:  # no fetch answered within the round: the broker does not answer (the lag stays unknown)
            raise KafkaTimeoutError(f"no fetch answer within {FETCH_ROUND_SECONDS:g} s")
        positions = view.positions
        for p, hw in fresh.items():
            self.highwater[p] = hw
            lag = max(0, hw - positions.get(p, committed.get(p, 0)))
            self.lag[p] = lag
            self.metrics.consumer_lag.labels(topic=self.topic, partition=str(p)).set(lag)
        self.rounds += 1

    def _read_end(self, p: int, committed: int, fresh: dict[int, int]) -> None:
        """The end of partition ``p`` from a fetch of about one batch past what cannot be received (kafka-python
        keeps the highwater of its last answered fetch: a message too large to receive would freeze the lag)."""
        start = self.highwater.get(p, committed)
        hw, stepped = highwater_past(self.cfg.kafka, self.topic, p, start, timeout_s=FETCH_ROUND_SECONDS / 2)
        if hw is not None:
            fresh[p] = hw
        if stepped and stepped[0] not in self._too_large.get(p, ()):
            self._too_large[p] = set(stepped)
            log.warning("lag monitor: %s[%d]: the record batch at offset %d is larger than kafka.receive_max_bytes "
                        "(%s bytes): the consumers cannot receive it; highwater read past it: %s", self.topic, p,
                        stepped[0], f"{self.cfg.kafka.receive_max_bytes:,}", "unknown" if hw is None else hw)

    def _watch_stalls(self) -> None:
        while not self._stop.wait(STALL_LOG_CHECK_SECONDS):
            self._log_stall()

    def _log_stall(self) -> None:
        """One WARNING when a stall begins (no progress for ``service.healthz_stall_seconds`` while there is lag or
        the broker does not answer: what ``/healthz`` reports), with every partition's consumed position, committed
        offset, highwater and lag; one INFO when progress is made again."""
        stalled_for = self.seconds_since_progress()
        if stalled_for > self.stall_seconds and not self._stall_logged:
            self._stall_logged = True
            silent = self.broker_unanswered_seconds()
            log.warning("no progress for %.0f s (service.healthz_stall_seconds = %g)%s: %s", stalled_for,
                        self.stall_seconds, f", the broker has not answered for {silent:.0f} s" if silent else "",
                        self.describe())
        elif stalled_for <= self.stall_seconds and self._stall_logged:
            self._stall_logged = False
            log.info("progress again: %s", self.describe())

    def describe(self) -> str:
        """Every assigned partition's consumed position (the loop's, now), committed offset, highwater and lag (as the
        broker last answered)."""
        positions = self.view().positions
        parts = sorted(self._assigned)
        if not parts:
            return f"no partition of {self.topic} assigned"
        read = f"(committed, highwater, lag as the broker last answered, {time.monotonic() - self._answered_at:.0f} s ago)"
        return "; ".join(f"{self.topic}[{p}] position {positions.get(p, '-')}, committed {self._committed.get(p, '-')}"
                         f", highwater {self.highwater.get(p, '-')}, lag {self.lag.get(p, '-')}" for p in parts) + " " + read

    def _set_progress(self, round_done: bool = True) -> None:
        """Progress: a position or committed offset moved, or (after a round) there is nothing to do (the broker
        answered and reported no lag); an unanswered round is neither."""
        with self._lock:
            view = self.view()
            marks = tuple(sorted(view.positions.items())) + tuple(sorted(self._committed.items()))
            nothing_to_do = round_done and self._answering and sum(self.lag.values()) == 0
            if nothing_to_do or marks != self._last_marks:
                self._progress_at = time.monotonic()
            self._last_marks = marks
