"""Liveness that does not depend on the main loop being alive: its heartbeat, the consumer lag and the progress gauge.

- :class:`LoopHeartbeat`: the main loop ticks it on every iteration; ``/healthz`` on the metrics port
  (:func:`stream_anon.metrics.endpoint.serve_metrics`) answers 503 once it has not ticked for
  ``service.healthz_stall_seconds``.
- :class:`LagMonitor`: a thread with its own Kafka consumer (no group membership) that, every
  :data:`LAG_INTERVAL_SECONDS`, asks the broker for the highwater of every partition assigned to this member and sets
  ``stream_anon_consumer_lag`` = highwater - consumed position.  The consumed position is the loop's (published on
  every tick), or, for a partition the loop has not started, the group's committed offset (0 when none).  The
  highwater comes with a fetch answer (``KafkaConsumer.highwater()`` after a poll); ``end_offsets()`` is wrong on
  Tansu (measured: 102 for a partition holding 150 records) and ``KafkaAdminClient`` has no ``list_offsets`` in
  kafka-python 3.0.  It also sets ``stream_anon_seconds_since_progress``: seconds since a consumed position or a
  committed offset last moved, 0 while there is no lag (nothing to do is not a stall).

Because the thread reads the broker itself, a stuck loop shows as growing lag and growing seconds since progress
(the ``StreamAnonStalled`` alert), where the loop's own numbers would freeze.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from stream_anon.config.settings import Config
from stream_anon.kafka_io.clients import client_options, no_auto_create
from stream_anon.metrics.definitions import ServiceMetrics

log = logging.getLogger(__name__)

LAG_INTERVAL_SECONDS = 5.0
"""How often the lag monitor asks the broker for the highwaters."""
MONITOR_REQUEST_TIMEOUT_MS = 5000
"""Request timeout of the monitor's consumer (a stalled broker delays one round, never the service's stop)."""
FETCH_ROUND_SECONDS = 2.0
"""At most this long per round waiting for the fetch answers that carry the highwaters."""


class LoopHeartbeat:
    """The main loop's heartbeat: ``tick()`` on every iteration; ``health()`` for ``/healthz``."""

    def __init__(self, stall_seconds: float) -> None:
        self.stall_seconds = stall_seconds
        self._last = time.monotonic()

    def tick(self) -> None:
        self._last = time.monotonic()

    def age(self) -> float:
        """Seconds since the last tick."""
        return time.monotonic() - self._last

    def health(self) -> tuple[bool, str]:
        """(healthy, one line): unhealthy once the loop has not ticked for ``stall_seconds``."""
        age = self.age()
        if age <= self.stall_seconds:
            return True, f"ok: main loop ticked {age:.1f} s ago"
        return False, (f"stalled: main loop has not ticked for {age:.0f} s (bound service.healthz_stall_seconds = "
                       f"{self.stall_seconds:g})")


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
        self._progress_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="lag-monitor", daemon=True)
        self.rounds = 0

    def start(self) -> LagMonitor:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    # ------------------------------------------------------------------ the thread
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self._round()
                except (KafkaError, OSError) as e:  # the broker is away: keep the last numbers, count on
                    log.debug("lag monitor: %r", e)
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
                                                          max_partition_fetch_bytes=1024, fetch_max_wait_ms=100))
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
        for tp in tps:  # an empty partition answers with no record: its highwater is still known
            hw = c.highwater(tp)
            if tp.partition not in fresh and hw is not None:
                fresh[tp.partition] = int(hw)
        positions = view.positions
        for p, hw in fresh.items():
            self.highwater[p] = hw
            lag = max(0, hw - positions.get(p, committed.get(p, 0)))
            self.lag[p] = lag
            self.metrics.consumer_lag.labels(topic=self.topic, partition=str(p)).set(lag)
        self.rounds += 1

    def _set_progress(self) -> None:
        view = self.view()
        marks = tuple(sorted(view.positions.items())) + tuple(sorted(self._committed.items()))
        now = time.monotonic()
        if sum(self.lag.values()) == 0 or marks != self._last_marks:
            self._progress_at = now
        self._last_marks = marks
        self.metrics.seconds_since_progress.set(now - self._progress_at)
