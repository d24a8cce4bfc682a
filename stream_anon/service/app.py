"""``stream-anon run``: the main path's consume -> anonymize -> produce -> commit loop.

Loop: ``poll`` a batch; for each partition, build its pipeline on first sight (recovery read-back, see
:mod:`stream_anon.service.pipeline`), push the batch, send the outputs; every
``service.commit_interval_ms``: ``flush`` the producer (every output acknowledged, ``acks=all``), then
commit each partition's watermark (lowest offset still buffered).  On revoke: flush, ``commit_async``
the watermarks of the revoked partitions, drop their state (the new owner rebuilds it from the watermark).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema
from stream_anon.service.broker import EmbeddedBroker
from stream_anon.service.config import Config
from stream_anon.service.kafka_io import (
    BrokerUnavailableError,
    MessageRejectedError,
    OutputReader,
    ProducerFatalError,
    backoff_delays,
    connect_admin,
    ensure_topics,
    make_consumer,
    retry,
)
from stream_anon.service.metrics import ServiceMetrics, serve_metrics
from stream_anon.service.pipeline import BatchStats, ReadBackScan
from stream_anon.service.producer import OutputProducer, open_producer
from stream_anon.service.supervisor import SidePaths
from stream_anon.service.wiring import load_schema, make_engine_factory, pipeline_settings
from stream_anon.service.workers import (
    Backend,
    CreatePartition,
    ExpirePartition,
    FlushPartition,
    InlineBackend,
    ProcessBackend,
    ProcessBatch,
    RawMessage,
    WorkerError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

BROKER_CHECK_SECONDS = 2.0
"""With no records polled and no output acknowledged for this long, the loop asks the broker for an input
partition's first offset (``OutputReader.ping``, bounded by ``kafka.request_timeout_ms``, at most 10 s) to tell
an idle stream from a broker outage."""


@dataclass
class MainPathTotals:
    """Running totals of this process (the demo and tests read them; metrics carry the same numbers)."""

    consumed: int = 0
    released: int = 0
    suppressed: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    classes: int = 0
    loss_sum: float = 0.0  # sum over released records of their class loss
    recoveries: int = 0
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def gt_loss(self) -> float:
        """Goldberger-Tassa loss of what this process released: (sum |C| loss(C) + #suppressed) / N."""
        n = self.released + self.suppressed
        return (self.loss_sum + self.suppressed) / n if n else 0.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, main: MainPath) -> None:
        self.main = main

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.main.on_revoked([tp.partition for tp in revoked if tp.topic == self.main.cfg.topics.input])

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("assigned partitions %s", sorted(tp.partition for tp in assigned))
        self.main.assigned.set()


@dataclass
class PartitionStatus:
    """What the Kafka loop knows of a partition's pipeline (it may run in a worker process)."""

    partition: int
    watermark: int
    next_offset: int
    buffered: int = 0
    open_clusters: int = 0


class MainPath:
    """The main path of one service member.  ``run()`` until ``stop_event`` is set; returns an exit code.

    ``service.workers`` = 0 runs the pipelines inline; >= 1 in that many worker processes (needs the default
    engine: a custom ``engine_factory`` forces inline).
    """

    def __init__(self, cfg: Config, *, metrics: ServiceMetrics | None = None, schema: Schema | None = None,
                 engine_factory: Callable[[int], EngineLike] | None = None,
                 stop_event: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics if metrics is not None else ServiceMetrics(CollectorRegistry())
        self.schema = schema if schema is not None else load_schema(cfg)
        self._custom_engine = engine_factory is not None
        self.engine_factory = engine_factory or make_engine_factory(cfg, self.schema)
        self.settings = pipeline_settings(cfg)
        self.stop_event = stop_event or threading.Event()
        self.ready = threading.Event()  # clients connected, subscribed
        self.assigned = threading.Event()  # the group gave this member its partitions (at least once)
        self.states: dict[int, PartitionStatus] = {}
        self.totals = MainPathTotals()
        self.highwater: dict[int, int] = {}
        self.committed: dict[int, int] = {}
        self._last_input: dict[int, float] = {}
        self._seeked: dict[int, int] = {}
        self._producer: OutputProducer | None = None
        self._consumer: KafkaConsumer | None = None
        self._reader: OutputReader | None = None
        self._backend: Backend | None = None
        self._broker_check_at = time.monotonic() + BROKER_CHECK_SECONDS
        self._outage_since: float | None = None  # during an outage: monotonic time of the last answer
        self._outage_delays = backoff_delays(cfg.kafka.retry_backoff_max_seconds)
        m = self.metrics
        m.k_parameter.set(cfg.anonymization.k)
        m.delay_bound_arrivals.set(cfg.anonymization.delta)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        cfg = self.cfg
        stop = self.stop_event.is_set
        try:
            admin = connect_admin(cfg, on_retry=self.metrics.broker_reconnects.inc, stop=stop)
            counts = retry("create topics", lambda: ensure_topics(admin, cfg), cfg, stop=stop)
            admin.close()
            self._producer = open_producer(cfg, partition_counts=counts, stop=stop,
                                           on_error=lambda t: self.metrics.produce_errors.labels(topic=t).inc())
            self._consumer = retry("consumer", lambda: make_consumer(cfg, group_id=cfg.kafka.group_id), cfg, stop=stop)
            self._reader = retry("read-back consumer", lambda: OutputReader(cfg), cfg, stop=stop)
        except BrokerUnavailableError as e:
            log.error("%s", e)
            return 3
        if cfg.service.workers > 0 and not self._custom_engine:
            self._backend = ProcessBackend(cfg, cfg.service.workers)
        else:
            self._backend = InlineBackend(self.schema, self.settings, self.engine_factory)
        self._consumer.subscribe([cfg.topics.input], listener=_Rebalance(self))
        log.info("main path: consuming %s as group %r (k=%d, delta=%d, beta=%d) -> %s, %s, %s",
                 cfg.topics.input, cfg.kafka.group_id, cfg.anonymization.k, cfg.anonymization.delta,
                 cfg.anonymization.beta, cfg.topics.anon, cfg.topics.suppressed, cfg.topics.dlq)
        self.ready.set()
        rc = 0
        try:
            self._loop()
        except (WorkerError, ProducerFatalError, MessageRejectedError) as e:
            log.error("%s; stopping (a restart resumes from the committed watermarks)", e)
            rc = 1
        except BrokerUnavailableError as e:  # stopped while the broker was away: outputs not acknowledged
            log.error("%s; stopping without committing them (a restart re-reads from the committed watermarks)", e)
            rc = 3
        finally:
            if not self._shutdown(clean=rc == 0) and rc == 0:
                rc = 3
        return rc

    def _loop(self) -> None:
        cfg = self.cfg
        consumer, backend = self._consumer, self._backend
        assert consumer is not None and backend is not None
        commit_every = cfg.service.commit_interval_ms / 1000.0
        last_commit = time.monotonic()
        max_records = cfg.kafka.max_poll_records
        while not self.stop_event.is_set():
            batch = consumer.poll(timeout_ms=cfg.service.poll_timeout_ms, max_records=max_records)
            now = time.time()
            if batch:
                self._broker_answered()
            for tp, recs in batch.items():
                if recs:
                    self._submit(tp.partition, recs, now)
            if cfg.anonymization.max_delay_seconds is not None:
                for p, st in self.states.items():
                    if st.buffered:
                        backend.submit(ExpirePartition(p, now))
            if cfg.service.idle_flush_seconds > 0:
                self._idle_flush(now)
            self._collect(wait_all=False)
            if time.monotonic() - last_commit >= commit_every:
                self._commit()
                self._update_position_metrics()
                last_commit = time.monotonic()
            if time.monotonic() >= self._broker_check_at:
                self._check_broker()

    # ------------------------------------------------------------------ broker outages
    def _broker_answered(self) -> None:
        """Evidence that the broker answers (records polled, outputs acknowledged, a check succeeded)."""
        self._broker_check_at = time.monotonic() + BROKER_CHECK_SECONDS
        if self._outage_since is not None:
            log.warning("broker %s answering again after %.0f s: resuming (nothing was committed meanwhile)",
                        self.cfg.kafka.bootstrap_servers, time.monotonic() - self._outage_since)
            self._outage_since = None
            self._outage_delays = backoff_delays(self.cfg.kafka.retry_backoff_max_seconds)

    def _check_broker(self) -> None:
        """Quiet for ``BROKER_CHECK_SECONDS``: an idle stream or a broker outage?  Ask the broker (``ping``);
        while it fails, log one clear line per check, checking again with exponential backoff (the Kafka
        clients reconnect and retry meanwhile; nothing is consumed, produced or committed)."""
        assert self._reader is not None
        quiet_since = self._broker_check_at - BROKER_CHECK_SECONDS
        try:
            self._reader.ping(self.cfg.topics.input, min(self.states) if self.states else 0,
                              min(self.cfg.kafka.request_timeout_ms, 10000))
        except (KafkaError, OSError) as e:
            if self._outage_since is None:
                self._outage_since = quiet_since
            delay = next(self._outage_delays)
            detail = str(e).removeprefix(f"{type(e).__name__}: ")
            log.warning("broker %s not answering for %.0f s (%s%s): nothing is consumed or committed meanwhile, "
                        "unacknowledged outputs are held; the clients keep retrying, checking again in %.1f s",
                        self.cfg.kafka.bootstrap_servers, time.monotonic() - self._outage_since, type(e).__name__,
                        f": {detail}" if detail and detail != "None" else "", delay)
            self._broker_check_at = time.monotonic() + delay
            return
        self._broker_answered()

    def _retry_mid_run(self, what: str, fn: Callable[[], T]) -> T:
        """``retry`` for calls of the running loop: until the broker answers (no time limit), or until stopped
        (then :class:`BrokerUnavailableError`: ``run`` exits 3 without committing)."""
        return retry(what, fn, self.cfg, stop=self.stop_event.is_set, limit_seconds=0)

    def _submit(self, partition: int, recs: Sequence[ConsumerRecord], now: float) -> None:
        if partition not in self.states:
            start = self._start_offset(partition, recs[0].offset)
            if start is None:
                return  # seeked back to the committed watermark: the next poll delivers from there
            recs = [r for r in recs if r.offset >= start]
            if not recs:
                return
            self._recover(partition, start)
        assert self._backend is not None
        msgs: tuple[RawMessage, ...] = tuple((r.offset, r.value, r.key, r.headers, r.timestamp) for r in recs)
        self._backend.submit(ProcessBatch(partition, msgs, now))
        self._last_input[partition] = now

    def _collect(self, *, wait_all: bool) -> None:
        """Produce the outputs of finished batches and take over the partitions' new watermarks."""
        assert self._producer is not None and self._backend is not None
        for res in self._backend.results(wait_all=wait_all):
            self._producer.send(res.outputs)
            st = self.states.get(res.partition)
            if st is not None:
                st.watermark, st.buffered = res.watermark, res.buffered
                st.open_clusters, st.next_offset = res.open_clusters, res.next_offset
            self._account(res.partition, res.stats, res.elapsed, res.n_messages)

    def _idle_flush(self, now: float) -> None:
        for p, st in self.states.items():
            if st.buffered and now - self._last_input.get(p, now) >= self.cfg.service.idle_flush_seconds:
                log.info("partition %d idle for %.1f s: flushing %d buffered records", p,
                         self.cfg.service.idle_flush_seconds, st.buffered)
                assert self._backend is not None
                self._backend.submit(FlushPartition(p, now))
                self._last_input[p] = now

    def _start_offset(self, partition: int, first_offset: int) -> int | None:
        """Where a partition's new state must start: its committed watermark.

        kafka-python keeps the fetch position of a partition that is revoked and assigned again to the same
        member, but the revoke dropped the state (buffered records included), so the position may be past
        the watermark: seek back (returns None; the records come with the next poll).  Offsets below the
        first available one (retention) start at the first available record.
        """
        consumer = self._consumer
        assert consumer is not None
        tp = TopicPartition(self.cfg.topics.input, partition)
        committed = self._retry_mid_run(f"partition {partition}: committed offset", lambda: consumer.committed(
            tp, timeout_ms=self.cfg.kafka.request_timeout_ms))
        if committed is None or first_offset == committed:
            return first_offset
        if first_offset > committed and self._seeked.get(partition) != committed:
            self._seeked[partition] = committed
            log.info("partition %d: position %d is past the committed watermark %d (state dropped at a "
                     "rebalance): seeking back", partition, first_offset, committed)
            consumer.seek(tp, committed)
            return None
        return max(first_offset, committed)

    def _recover(self, partition: int, first_offset: int) -> None:
        """Build partition state starting at ``first_offset``: read back the outputs for already released records."""
        assert self._reader is not None and self._producer is not None and self._backend is not None
        t0 = time.monotonic()
        released: set[int] = set()
        horizon = -1
        n_read = 0
        reader = self._reader
        for topic in (self.cfg.topics.anon, self.cfg.topics.suppressed, self.cfg.topics.dlq):
            scan = ReadBackScan(self.cfg.topics.input, partition, first_offset)
            out_part = self._producer.partition_for(topic, partition)

            def scan_topic(t: str = topic, s: ReadBackScan = scan, op: int = out_part) -> ReadBackScan:
                return reader.scan(t, op, s, self.cfg.service.readback_chunk)

            self._retry_mid_run(f"partition {partition}: read-back of {topic}", scan_topic)
            released |= scan.released
            horizon = max(horizon, scan.horizon)
            n_read += scan.messages_read
        self._backend.create(CreatePartition(partition, first_offset, tuple(sorted(released)), horizon,
                                             secrets.token_hex(3)))
        self.states[partition] = PartitionStatus(partition, watermark=first_offset, next_offset=first_offset)
        self.totals.recoveries += 1
        log.info("partition %d: starting at offset %d; read back %d output messages in %.2f s: %d records at or "
                 "after it already released (will be skipped), horizon %d", partition, first_offset, n_read,
                 time.monotonic() - t0, len(released), horizon)

    # ------------------------------------------------------------------ accounting
    def _account(self, partition: int, s: BatchStats, elapsed: float, n_msgs: int) -> None:
        m, t, topic = self.metrics, self.totals, self.cfg.topics.input
        t.consumed += s.consumed
        t.released += s.released
        t.suppressed += s.suppressed
        t.skipped += s.skipped
        t.classes += len(s.class_sizes)
        t.loss_sum += s.released_loss_sum
        if s.consumed:
            m.records_consumed.labels(topic=topic).inc(s.consumed)
        if s.released:
            m.records_released.labels(topic=self.cfg.topics.anon).inc(s.released)
        if s.suppressed:
            m.records_suppressed.labels(reason="delay_bound").inc(s.suppressed)
        if s.skipped:
            m.records_duplicate_skipped.labels(topic=topic).inc(s.skipped)
        for reason, n in s.dead_letters.items():
            t.dead_lettered += n
            t.dead_letter_reasons[reason] = t.dead_letter_reasons.get(reason, 0) + n
            m.records_dead_lettered.labels(reason=reason).inc(n)
            log.warning("partition %d: %d message(s) dead-lettered (%s)", partition, n, reason)
        m.release_delay_arrivals.observe_many(s.delays)
        m.release_delay_seconds.observe_many(s.ingest_latency_seconds)
        m.class_information_loss.observe_many(s.class_losses)
        m.class_size.observe_many(s.class_sizes)
        if s.released or s.suppressed:
            m.gt_loss.set(t.gt_loss)
        if n_msgs:
            m.processing_seconds.observe(elapsed / n_msgs)
        st = self.states.get(partition)
        if st is not None:
            m.buffered_records.labels(partition=str(partition)).set(st.buffered)
            m.open_clusters.labels(partition=str(partition)).set(st.open_clusters)

    def _update_position_metrics(self) -> None:
        consumer, topic = self._consumer, self.cfg.topics.input
        assert consumer is not None
        for p, st in self.states.items():
            hw = consumer.highwater(TopicPartition(topic, p))
            if hw is not None:
                self.highwater[p] = int(hw)
                self.metrics.consumer_lag.labels(topic=topic, partition=str(p)).set(max(0, int(hw) - st.next_offset))

    # ------------------------------------------------------------------ commits
    def _watermarks(self, partitions: list[int] | None = None) -> dict[TopicPartition, OffsetAndMetadata]:
        topic = self.cfg.topics.input
        out = {}
        for p in partitions if partitions is not None else list(self.states):
            st = self.states.get(p)
            if st is None:
                continue
            if self.committed.get(p) != st.watermark:
                out[TopicPartition(topic, p)] = OffsetAndMetadata(st.watermark, None, -1)
        return out

    def _commit(self, *, sync: bool = False) -> None:
        """Flush (every output of every finished batch acknowledged), then commit each partition's watermark.

        The watermarks are those reported with the finished batches whose outputs were just flushed; batches
        still in a worker are not covered (their partitions' watermarks stay where they were).
        """
        assert self._producer is not None and self._consumer is not None
        if self._producer.flush():
            self._broker_answered()
        offsets = self._watermarks()
        if not offsets:
            return
        try:
            if sync:
                self._consumer.commit(offsets, timeout_ms=self.cfg.kafka.request_timeout_ms)
            else:
                self._consumer.commit_async(offsets, callback=self._commit_done)
        except KafkaError as e:  # e.g. CommitFailedError after a rebalance: the new owner re-reads from its watermark
            log.warning("commit of %s failed: %r", {tp.partition: o.offset for tp, o in offsets.items()}, e)
            return
        for tp, om in offsets.items():
            self.committed[tp.partition] = om.offset
            self.metrics.commit_watermark.labels(topic=tp.topic, partition=str(tp.partition)).set(om.offset)

    def _commit_done(self, offsets: dict[TopicPartition, OffsetAndMetadata], response: object) -> None:
        if isinstance(response, Exception):
            log.warning("asynchronous commit failed (%r); the next commit supersedes it", response)

    def on_revoked(self, partitions: list[int]) -> None:
        """Rebalance: finish in-flight batches, commit what is safe for the revoked partitions (async: no
        blocking consumer call), drop their state."""
        owned = [p for p in partitions if p in self.states]
        if not owned:
            return
        assert self._producer is not None and self._consumer is not None and self._backend is not None
        self._collect(wait_all=True)
        self._producer.flush()
        offsets = self._watermarks(owned)
        if offsets:
            self._consumer.commit_async(offsets, callback=self._commit_done)
        self._backend.drop(owned)
        for p in owned:
            self._seeked.pop(p, None)
            st = self.states.pop(p)
            self.committed.pop(p, None)
            log.info("partition %d revoked: committed watermark %d, dropped %d buffered records (the new owner "
                     "rebuilds them)", p, st.watermark, st.buffered)
            self.metrics.buffered_records.labels(partition=str(p)).set(0)
            self.metrics.open_clusters.labels(partition=str(p)).set(0)

    def _shutdown(self, *, clean: bool = True) -> bool:
        """Finish (when ``clean``: last outputs, final commit) and close; False if the broker was unreachable."""
        ok = True
        try:
            if clean and self._backend is not None:
                self._collect(wait_all=True)
            if clean and self._consumer is not None and self._producer is not None:
                self._commit(sync=True)
        except BrokerUnavailableError as e:
            ok = False
            log.error("%s; stopping without committing them (a restart re-reads from the committed watermarks)", e)
        except (KafkaError, WorkerError, ProducerFatalError, MessageRejectedError) as e:
            log.warning("final commit failed: %r (the next start re-reads from the last committed watermark)", e)
        for closer in (self._consumer, self._reader):
            try:
                if closer is not None:
                    closer.close()
            except (KafkaError, OSError) as e:  # closing on shutdown: nothing left to do
                log.debug("close failed: %r", e)
        if self._producer is not None:
            self._producer.close(timeout_s=10.0)
        if self._backend is not None:
            self._backend.close()
        log.info("main path stopped: consumed %d, released %d, suppressed %d, dead-lettered %d, skipped %d",
                 self.totals.consumed, self.totals.released, self.totals.suppressed, self.totals.dead_lettered,
                 self.totals.skipped)
        return ok


def start_metrics(cfg: Config, registry: CollectorRegistry) -> None:
    if cfg.service.metrics_port:
        serve_metrics(registry, cfg.service.metrics_port, cfg.service.metrics_addr)
        log.info("metrics on http://%s:%d/metrics", cfg.service.metrics_addr, cfg.service.metrics_port)


def run_service(cfg: Config, *, stop_event: threading.Event | None = None,
                registry: CollectorRegistry | None = None) -> int:
    """``stream-anon run``: the main path (and, when enabled, the side paths: :mod:`stream_anon.service.supervisor`),
    with an embedded broker when no ``kafka.bootstrap_servers`` is configured.  Returns the exit code."""
    stop_event = stop_event or threading.Event()
    registry = registry or CollectorRegistry()
    metrics = ServiceMetrics(registry)
    broker: EmbeddedBroker | None = None
    if not cfg.kafka.bootstrap_servers:
        broker = EmbeddedBroker().start()
        cfg = cfg.with_options({"kafka.bootstrap_servers": broker.bootstrap_servers})
        log.info("no kafka.bootstrap_servers given: started an embedded Tansu broker on %s (stopped on exit)",
                 broker.bootstrap_servers)
    try:
        start_metrics(cfg, registry)
        side = SidePaths(cfg, metrics, stop_event)
        try:
            rc = MainPath(cfg, metrics=metrics, stop_event=stop_event).run()
        finally:
            stop_event.set()
            side.stop()
        return rc
    finally:
        if broker is not None:
            broker.stop()
