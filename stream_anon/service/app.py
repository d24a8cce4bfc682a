"""``stream-anon run``: the main path's consume -> anonymize -> ledger -> produce -> commit loop.

The internal ledger (``<input>.ledger``, :mod:`stream_anon.service.ledger`) is the source of truth for recovery and
accounting; the public topics are never read back.  The loop keeps the outbox order of that module::

    poll a batch -> the partition's pipeline (inline or in a worker process)
    1. each finished batch's ledger entries -> the ledger (ledger producer, linger 0), without waiting
    2. as soon as a batch's entries are acknowledged (checked without blocking), its outputs -> anon /
       suppressed / dlq (output producer); meanwhile the next batches go on
    every service.commit_interval_ms (everything must be acknowledged here):
    3. flush the ledger, send the remaining outputs, flush the outputs
    4. a checkpoint per partition whose watermark or entries moved -> the ledger; flush it
    5. commit the watermarks (asynchronously)
    6. once a commit is confirmed: tombstones for the ledger keys no recovery can need

A partition's first records start its recovery (:meth:`MainPath._recover`): backward scan of its ledger
partition, forward scan of its output partitions from the last checkpoint, byte-identical re-send of what the
ledger promised and is missing, a first checkpoint, then the pipeline starts at the plan's offset and skips the
offsets the ledger already accounts for.  On revoke: finish in-flight batches, steps 1-4, ``commit_async`` the
revoked partitions' watermarks, drop their state (the new owner recovers from the ledger).

Where errors surface (for whoever changes the loop): producer errors in :meth:`OutputProducer.flush` (steps 3-4,
recovery re-sends, revoke) and :meth:`OutputProducer.poll` (``ProducerFatalError`` only); worker failures in
``Backend.results`` (exit code 1).  A producer that cannot deliver (``ProducerFatalError``: a fatal client
error, an acknowledgement without an offset, or nothing acknowledged for ``service.producer_recovery_seconds``)
is closed and created anew and every owned partition recovers from the ledger
(:meth:`MainPath._recreate_producers`); more than ``PRODUCER_RECREATIONS_MAX`` such failures in a row (no commit
between them: creating the producers anew did not help) while the broker answers, within
``PRODUCER_FAILURE_WINDOW`` x ``service.producer_recovery_seconds``, end the run with exit code 1.
A broker that lost data (:mod:`stream_anon.service.broker_guard`, checked every ``BROKER_DATA_CHECK_SECONDS``,
while a flush waits and before a partition is recovered) ends it with exit code 4, abandoning what the producers
hold.  A record the consumer cannot read (``CorruptRecordError``) is dead-lettered by position (:meth:`MainPath._skip_unreadable`).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
from kafka.errors import CorruptRecordError, KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema
from stream_anon.formats.messages import OutputMessage
from stream_anon.formats.release import EncodedMessage
from stream_anon.kafka_io.clients import backoff_delays, connect_admin, ensure_topics, make_consumer, retry
from stream_anon.kafka_io.errors import BrokerUnavailableError, MessageRejectedError, ProducerFatalError
from stream_anon.kafka_io.lifecycle import (
    CLOSE_TIMEOUT_SECONDS,
    STOP_GRACE_SECONDS,
    StopClock,
)
from stream_anon.kafka_io.producer import OutputProducer, Receipt, open_producer
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.service.broker_guard import EXIT_DATA_LOSS, BrokerDataLossError, BrokerGuard
from stream_anon.service.ledger import LedgerEntry, LedgerRecord, PartitionOutbox, RecoveryPlan
from stream_anon.service.liveness import LagMonitor, LoopHeartbeat, LoopView
from stream_anon.service.recovery import LedgerScan, OutputPresence, outputs_to_resend
from stream_anon.service.wiring import (
    load_schema,
    make_engine_factory,
    make_entry_factory,
    pipeline_settings,
    with_release_secret,
)
from stream_anon.service.workers import (
    Backend,
    CreatePartition,
    ExpirePartition,
    FlushPartition,
    InlineBackend,
    PartitionResult,
    ProcessBackend,
    ProcessBatch,
    RawMessage,
    WorkerError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

BROKER_CHECK_SECONDS = 2.0
"""With no records polled and no output acknowledged for this long, the loop asks the broker for an input
partition's first offset (``PartitionReader.ping``, bounded by ``kafka.request_timeout_ms``, at most 10 s) to tell
an idle stream from a broker outage."""
LOOP_REQUEST_TIMEOUT_MS = 5000
"""Blocking requests of the running loop (the recovery reader's scans and ends, committed offsets) time out after at
most this long and are retried, so that a stop is noticed between two attempts even while the broker stalls."""
LEDGER_WAIT_SECONDS = 0.05
"""When a poll brought no input, how long the loop waits for ledger acknowledgements of unsent outputs."""
BROKER_DATA_CHECK_SECONDS = 5.0
"""How often the loop (and a waiting flush) asks whether the broker lost data (:mod:`~stream_anon.service.broker_guard`):
one metadata request, plus one fetch per owned ledger partition."""
PRODUCER_RECREATIONS_MAX = 3
"""Producer failures (while the broker answers) tolerated in a row within the window below; one more: exit code 1.
A failure after which the service committed progress starts a new row: the recreation helped (broker restarts,
each of which may cost a recreation, are then never counted against the service)."""
PRODUCER_FAILURE_WINDOW = 3.0
"""The window, in multiples of ``service.producer_recovery_seconds`` (at least 60 s)."""


class ConsumerFailedError(RuntimeError):
    """The group consumer's polls kept failing (e.g. fenced) for ``service.producer_recovery_seconds`` while the
    broker answered: ``run`` exits 1 so that a supervisor starts a fresh member."""


class LedgerConflictError(RuntimeError):
    """The ledger holds checkpoints of another consumer group: two services (two sets of output topics) share one
    ledger, which would make each skip the other's records.  A configuration error: ``run`` exits 2."""


@dataclass
class MainPathTotals:
    """Running totals of this process (the demo and tests read them; metrics carry the same numbers)."""

    consumed: int = 0
    released: int = 0
    suppressed: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    control: int = 0
    classes: int = 0
    loss_sum: float = 0.0  # sum over released records of their class loss
    recoveries: int = 0
    resent: int = 0  # outputs re-sent by recoveries
    gate_refusals: int = 0  # classes the pre-publish gate refused
    internal_errors: int = 0
    producer_recreations: int = 0  # producers closed and created anew (each followed by a recovery of every partition)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    suppressed_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def gt_loss(self) -> float:
        """Goldberger-Tassa loss of what this process released: (sum |C| loss(C) + #suppressed) / N."""
        n = self.released + self.suppressed
        return (self.loss_sum + self.suppressed) / n if n else 0.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, main: MainPath) -> None:
        self.main = main

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        gone = {tp.partition for tp in revoked if tp.topic == self.main.cfg.topics.input}
        self.main.view = dataclasses.replace(self.main.view, assigned=self.main.view.assigned - gone)
        self.main.on_revoked([tp.partition for tp in revoked if tp.topic == self.main.cfg.topics.input])

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("assigned partitions %s", sorted(tp.partition for tp in assigned))
        mine = frozenset(tp.partition for tp in assigned if tp.topic == self.main.cfg.topics.input)
        self.main.view = dataclasses.replace(self.main.view, assigned=self.main.view.assigned | mine)
        self.main.assigned.set()


@dataclass
class PartitionStatus:
    """What the Kafka loop knows of a partition's pipeline (it may run in a worker process)."""

    partition: int
    watermark: int
    next_offset: int
    buffered: int = 0
    open_clusters: int = 0
    horizon: int = -1


@dataclass
class _Unsent:
    """The ledger entries of one finished batch: sent to the ledger, their outputs not sent yet (step 2 waits for
    ``receipt``)."""

    partition: int
    entries: list[LedgerEntry]
    receipt: Receipt


@dataclass(frozen=True)
class Unreadable:
    """A record the consumer could not read (``CorruptRecordError``): only its position is known."""

    offset: int
    error: str


class MainPath:
    """The main path of one service member.  ``run()`` until ``stop_event`` is set; returns an exit code.

    ``service.workers`` = 0 runs the pipelines inline; >= 1 in that many worker processes (needs the default
    engine: a custom ``engine_factory`` forces inline).  The release secret must be resolved once for all the
    processes of a service (:func:`~stream_anon.service.wiring.with_release_secret`); when ``cfg`` has none, it is
    generated here (``secret_generated`` then becomes true).
    """

    def __init__(self, cfg: Config, *, metrics: ServiceMetrics | None = None, schema: Schema | None = None,
                 engine_factory: Callable[[int], EngineLike] | None = None,
                 stop_event: threading.Event | None = None, secret_generated: bool = False,
                 heartbeat: LoopHeartbeat | None = None) -> None:
        if cfg.release.secret is None:
            cfg, secret = with_release_secret(cfg)
            secret_generated = secret.generated
        self.cfg = cfg
        self.secret_generated = secret_generated
        self.metrics = metrics if metrics is not None else ServiceMetrics(CollectorRegistry())
        self.schema = schema if schema is not None else load_schema(cfg)
        self._custom_engine = engine_factory is not None
        self.engine_factory = engine_factory or make_engine_factory(cfg, self.schema)
        self.settings = pipeline_settings(cfg)
        self.stop_event = stop_event or threading.Event()
        self._stop_clock = StopClock(self.stop_event)  # the stop path's shared grace for acknowledgements
        self._closing = False  # the final commit is done: a revoke while the consumer closes has nothing to do
        self.ready = threading.Event()  # clients connected, subscribed
        self.assigned = threading.Event()  # the group gave this member its partitions (at least once)
        self.states: dict[int, PartitionStatus] = {}
        self.outboxes: dict[int, PartitionOutbox] = {}
        self.totals = MainPathTotals()
        self.committed: dict[int, int] = {}
        self.commits_made = 0  # commits that moved a watermark past its highest commit so far
        self._commit_high: dict[int, int] = {}  # partition -> highest watermark committed (kept across recoveries)
        self.heartbeat = heartbeat or LoopHeartbeat(cfg.service.healthz_stall_seconds)  # ticked every iteration
        self.view = LoopView()  # for the lag monitor: assigned partitions, consumed positions (replaced, never mutated)
        self.lag_monitor: LagMonitor | None = None
        t = cfg.topics
        self.ledger_topic = t.ledger_topic()
        self._role_topic = {"anon": t.anon, "suppressed": t.suppressed, "dlq": t.dlq}
        self._topic_role = {v: k for k, v in self._role_topic.items()}
        self._last_input: dict[int, float] = {}
        self._seeked: dict[int, int] = {}
        self._plans: dict[int, RecoveryPlan] = {}  # recovery scans waiting for the seek back to their start
        self._unsent: deque[_Unsent] = deque()  # step 2 waits for their ledger acknowledgements
        self._sent: list[tuple[int, Receipt]] = []  # outputs sent since the last checkpoint (partition, receipt)
        self._dirty: set[int] = set()  # partitions with ledger entries since their last checkpoint
        self._confirmed: list[dict[int, int]] = []  # commits confirmed by the broker: tombstones due (step 6)
        self._producer: OutputProducer | None = None
        self._ledger: OutputProducer | None = None
        self._consumer: KafkaConsumer | None = None
        self._reader: PartitionReader | None = None
        self._guard: BrokerGuard | None = None
        self._counts: dict[str, int] = {}
        self._data_check_at = time.monotonic() + BROKER_DATA_CHECK_SECONDS
        self._deferred: BaseException | None = None  # raised in the rebalance listener: re-raised after the poll
        self._abandon = False  # data loss: close the producers without delivering what they hold
        self._poll_failing_since: float | None = None
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
        for line in cfg.release_options().startup_warnings(secret_generated=self.secret_generated):
            log.warning("%s", line)
        try:
            admin = connect_admin(cfg.kafka, on_retry=self.metrics.broker_reconnects.inc, stop=stop)
            counts = retry("create topics", lambda: ensure_topics(admin, cfg.topics.service_topics(), cfg.topics.layout()),
                           cfg.kafka, stop=stop)
            admin.close()
            if self.ledger_topic not in counts:
                log.error("topics.ledger: topic %s does not exist and topics.create is false: create it (compacted, "
                          "with the input's partition count; deploy/kafka/create-topics.sh)", self.ledger_topic)
                return 2
            self._counts = counts
            self._guard = BrokerGuard(cfg, [cfg.topics.input, self.ledger_topic, *self._role_topic.values()])
            retry("topic metadata", self._guard.start, cfg.kafka, stop=stop)
            self._open_producers()
            self._consumer = retry("consumer", lambda: make_consumer(cfg.kafka, group_id=cfg.kafka.group_id), cfg.kafka,
                                   stop=stop)
            reader_kafka = dataclasses.replace(
                cfg.kafka, request_timeout_ms=min(cfg.kafka.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS))
            self._reader = retry("recovery reader", lambda: PartitionReader(reader_kafka), cfg.kafka, stop=stop)
        except BrokerUnavailableError as e:
            log.error("%s", e)
            return 3
        if cfg.service.workers > 0 and not self._custom_engine:
            self._backend = ProcessBackend(cfg, cfg.service.workers)
        else:
            self._backend = InlineBackend(self.schema, self.settings, self.engine_factory,
                                          make_entry_factory(cfg, self.schema))
        self._consumer.subscribe([cfg.topics.input], listener=_Rebalance(self))
        self.lag_monitor = LagMonitor(cfg, self.metrics, lambda: self.view).start()
        a = cfg.anonymization
        log.info("main path: consuming %s as group %r (k=%d, l=%s, delta=%d, beta=%d) -> %s, %s, %s; ledger %s",
                 cfg.topics.input, cfg.kafka.group_id, a.k, a.l, a.delta, a.beta, cfg.topics.anon,
                 cfg.topics.suppressed, cfg.topics.dlq, self.ledger_topic)
        self.ready.set()
        rc = 0
        try:
            self._run_recovering()
        except BrokerDataLossError as e:
            log.error("broker %s lost data this service had committed or acknowledged: %s; stopping without publishing "
                      "over it (exit code %d; docs/service.md, \"A broker that lost its data\")",
                      cfg.kafka.bootstrap_servers, e, EXIT_DATA_LOSS)
            self._abandon = True
            rc = EXIT_DATA_LOSS
        except (WorkerError, ProducerFatalError, MessageRejectedError, ConsumerFailedError) as e:
            log.error("%s; stopping with exit code 1 (a restart recovers from the ledger)", e)
            rc = 1
        except BrokerUnavailableError as e:  # stopped while the broker was away: outputs not acknowledged
            log.error("%s; stopping without committing them (a restart recovers from the ledger)", e)
            rc = 3
        except LedgerConflictError as e:
            log.error("%s", e)
            rc = 2
        finally:
            if not self._shutdown(clean=rc == 0) and rc == 0:
                rc = 3
        return rc

    def _open_producers(self) -> None:
        """The output producer and the ledger producer (the ledger's messages are few and small, and step 2 waits
        for them: no linger)."""
        cfg = self.cfg
        # a flush on the stop path waits for the stop grace, not forever (lifecycle.StopClock)
        on_error: Callable[[str], None] = lambda t: self.metrics.produce_errors.labels(topic=t).inc()  # noqa: E731
        opts: dict[str, Any] = dict(partition_counts=self._counts, stop=self._stop_clock.give_up, on_error=on_error,
                                    stuck_after_s=cfg.service.producer_recovery_seconds, watchdog=self._check_data)
        self._producer = open_producer(cfg.kafka, **opts)
        self._ledger = open_producer(dataclasses.replace(cfg.kafka, linger_ms=0), label="ledger", **opts)

    def _run_recovering(self) -> None:
        """The loop; a producer that cannot deliver is recreated and the partitions recovered from the ledger
        (:meth:`_recreate_producers`), up to ``PRODUCER_RECREATIONS_MAX`` failures in a row within the window
        while the broker answers (an outage never counts: then the recovery waits for the broker; a commit of
        progress after a recreation ends the row: that recreation helped)."""
        window = max(60.0, PRODUCER_FAILURE_WINDOW * self.cfg.service.producer_recovery_seconds)
        failures: deque[float] = deque()
        commits_at_failure = self.commits_made
        error: ProducerFatalError | None = None
        while True:
            try:
                if error is not None:
                    self._recreate_producers(error)
                    error = None
                self._loop()
                return
            except ProducerFatalError as e:
                if self.stop_event.is_set():
                    raise
                now = time.monotonic()
                if self.commits_made != commits_at_failure:  # progress since the last failure: a new row
                    failures.clear()
                commits_at_failure = self.commits_made
                while failures and now - failures[0] > window:
                    failures.popleft()
                if self._check_data(force=True):  # the broker answers (and kept its data): a client failure
                    failures.append(now)
                if len(failures) > PRODUCER_RECREATIONS_MAX:
                    raise ProducerFatalError(f"{e}; {len(failures)} producer failures within {window:.0f} s: "
                                             f"creating the producers anew did not help") from e
                error = e

    def _loop(self) -> None:
        cfg = self.cfg
        backend = self._backend
        assert backend is not None
        commit_every = cfg.service.commit_interval_ms / 1000.0
        last_commit = time.monotonic()
        while not self.stop_event.is_set():
            self.heartbeat.tick()
            batch = self._poll()
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
            self._send_acknowledged()  # step 2 for what was acknowledged meanwhile, before waiting for a worker
            self._collect(wait_all=False)  # step 1 (waits while a worker has too many batches: backpressure)
            self.view = LoopView(self.view.assigned, {p: st.next_offset for p, st in self.states.items()})
            self._send_acknowledged(wait=not batch)  # step 2
            self._write_tombstones()  # step 6 (commits confirmed during the poll)
            if time.monotonic() - last_commit >= commit_every:
                self._commit()  # steps 3-5
                last_commit = time.monotonic()
            if time.monotonic() >= self._broker_check_at:
                self._check_broker()
            self._check_data()

    def _poll(self) -> dict[TopicPartition, list[Any]]:
        """One consumer poll (no wait while outputs wait for ledger acknowledgements); a record the client cannot
        read is dead-lettered and skipped."""
        consumer = self._consumer
        assert consumer is not None
        timeout = 0 if self._unsent else self.cfg.service.poll_timeout_ms
        try:
            batch = consumer.poll(timeout_ms=timeout, max_records=self.cfg.kafka.max_poll_records)
        except CorruptRecordError as e:
            self._skip_unreadable(e)
            return {}
        except KafkaError as e:  # e.g. fenced, a failed join: the next poll rejoins the group
            self._poll_failed(e)
            return {}
        finally:
            deferred, self._deferred = self._deferred, None
            if deferred is not None:  # the rebalance listener failed (kafka-python only logs what it raises)
                raise deferred
        self._poll_failing_since = None
        return batch

    def _poll_failed(self, error: KafkaError) -> None:
        """A poll raised: log it; if polls keep failing for ``service.producer_recovery_seconds`` while the broker
        answers, :class:`ConsumerFailedError` (exit 1: a supervisor starts a fresh member)."""
        now = time.monotonic()
        if self._poll_failing_since is None:
            self._poll_failing_since = now
        failing = now - self._poll_failing_since
        log.warning("consumer poll failed (%r) for %.0f s; polling again (the consumer rejoins its group)", error,
                    failing)
        if failing > self.cfg.service.producer_recovery_seconds and self._check_data(force=True):
            raise ConsumerFailedError(f"the group consumer's polls failed for {failing:.0f} s while the broker "
                                      f"answered (last: {error!r})")
        time.sleep(min(1.0, self.cfg.service.poll_timeout_ms / 1000.0))

    def _skip_unreadable(self, error: CorruptRecordError) -> None:
        """kafka-python raised ``CorruptRecordError`` (e.g. for a header key that is not UTF-8) without naming the
        partition, and its next poll would spin on the same record: find every assigned partition whose record
        at the consumer's position cannot be read (with the recovery reader), dead-letter that offset (reason
        ``corrupt_record``: position only) and seek past it.  If none is found, re-raise (the service stops)."""
        consumer, reader = self._consumer, self._reader
        assert consumer is not None and reader is not None
        text = " ".join(str(error).split())[:500]
        found = False
        for tp in sorted(consumer.assignment()):
            pos = consumer.position(tp)
            if pos is None or reader.first_readable(tp.topic, tp.partition, pos):
                continue
            found = True
            log.error("partition %d: the record at offset %d cannot be read (%s): dead-lettered as corrupt_record, "
                      "skipping it", tp.partition, pos, text)
            if self._submit(tp.partition, [Unreadable(pos, text)], time.time()):
                consumer.seek(tp, pos + 1)
        if not found:
            raise error

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
            self._broker_silent(quiet_since, e)
            return
        self._broker_answered()

    def _broker_silent(self, since: float, error: BaseException) -> None:
        """A request to the broker failed (the ping, or the data check's metadata request): one clear line, and
        the next ping after the next backoff delay.  Whichever request fails first reports the outage, so an
        outage is named even when the loop spent it inside another blocking request."""
        if self._outage_since is None:
            self._outage_since = since
        delay = next(self._outage_delays)
        detail = str(error).removeprefix(f"{type(error).__name__}: ")
        log.warning("broker %s not answering for %.0f s (%s%s): nothing is consumed or committed meanwhile, "
                    "unacknowledged outputs are held; the clients keep retrying, checking again in %.1f s",
                    self.cfg.kafka.bootstrap_servers, time.monotonic() - self._outage_since, type(error).__name__,
                    f": {detail}" if detail and detail != "None" else "", delay)
        self._broker_check_at = time.monotonic() + delay

    # ------------------------------------------------------------------ a broker that lost its data; producer recreation
    def _check_data(self, *, force: bool = False) -> bool:
        """Every ``BROKER_DATA_CHECK_SECONDS`` (or now, with ``force``): did the broker lose data?  Topic ids and
        partition counts against the start, the input highwaters (of the last fetch) against the committed
        offsets, the owned ledger partitions' ends against the ledger messages acknowledged.  Raises
        :class:`BrokerDataLossError`; returns False when the broker did not answer (nothing checked)."""
        now = time.monotonic()
        guard, consumer, reader = self._guard, self._consumer, self._reader
        if (not force and (now < self._data_check_at or self._outage_since is not None)) or guard is None \
                or self.stop_event.is_set():  # (during an outage only the ping asks, with its backoff)
            return True
        self._data_check_at = now + BROKER_DATA_CHECK_SECONDS
        failure = guard.check_topics()
        if failure is not None:
            self._broker_silent(now, failure)
            return False
        problems = []
        if consumer is not None:
            for tp in consumer.assignment():
                problem = guard.floors.check(tp.topic, tp.partition, consumer.highwater(tp))
                if problem:
                    problems.append(problem)
        if reader is not None and self._ledger is not None:
            for p in sorted(self.states):
                lp = self._ledger.partition_for(self.ledger_topic, p)
                try:
                    end = reader.bounds(self.ledger_topic, lp, timeout_s=5.0)[1]
                except (KafkaError, OSError) as e:
                    log.debug("broker data check: end of %s[%d] unknown: %r", self.ledger_topic, lp, e)
                    self._broker_silent(now, e)
                    return False
                problem = guard.floors.check(self.ledger_topic, lp, end)
                if problem:
                    problems.append(problem)
        if problems:
            raise BrokerDataLossError("; ".join(problems))
        return True

    def _note_ledger(self, receipt: Receipt) -> None:
        """The ledger partitions hold at least the acknowledged messages of ``receipt`` (floors of the check)."""
        if self._guard is not None:
            for d in receipt.deliveries():
                self._guard.floors.raise_to(d.topic, d.partition, d.offset + 1, "had acknowledged")

    def _recreate_producers(self, error: BaseException) -> None:
        """A producer cannot deliver: abandon both producers and what they hold, create new ones, and recover
        every owned partition from the ledger now (the outputs it promised and that are missing are re-sent byte
        for byte, records without an acknowledged entry are consumed and processed again)."""
        consumer, backend = self._consumer, self._backend
        assert consumer is not None and backend is not None and self._reader is not None
        t0 = time.monotonic()
        owned = sorted(self.states)
        log.warning("%s: closing the ledger and output producers and creating new ones; partitions %s recover from "
                    "the ledger", error, owned)
        backend.results(wait_all=True)  # abandoned: their records are consumed again
        backend.drop(owned)
        for p in owned:
            self.states.pop(p, None)
            self.outboxes.pop(p, None)
        self._unsent.clear()
        self._sent.clear()
        self._dirty.clear()
        self._plans.clear()
        self._seeked.clear()
        self.committed.clear()
        for producer in (self._producer, self._ledger):
            if producer is not None:
                producer.close(timeout_s=0.0)
        self._open_producers()
        self.totals.producer_recreations += 1
        topic = self.cfg.topics.input
        assigned = {tp.partition for tp in consumer.assignment() if tp.topic == topic}
        for p in owned:
            if p not in assigned:
                continue
            self._recover_now(p)
        log.warning("producers created anew and partitions %s recovered from the ledger in %.2f s", sorted(self.states),
                    time.monotonic() - t0)

    def _recover_now(self, partition: int) -> None:
        """Recover an assigned partition without waiting for its records: plan, seek the consumer to its start."""
        consumer, reader = self._consumer, self._reader
        assert consumer is not None and reader is not None
        topic = self.cfg.topics.input
        tp = TopicPartition(topic, partition)
        committed = self._retry_mid_run(f"partition {partition}: committed offset", lambda: consumer.committed(
            tp, timeout_ms=self.cfg.kafka.request_timeout_ms))
        plan = self._scan_ledger(partition, committed)
        start = plan.start_offset
        if start is None:
            start = self._retry_mid_run(f"partition {partition}: first offset", lambda: reader.bounds(topic, partition)[0])
        consumer.seek(tp, start)
        self._recover(partition, plan, start)

    def _retry_mid_run(self, what: str, fn: Callable[[], T]) -> T:
        """``retry`` for calls of the running loop: until the broker answers (no time limit), or until stopped
        (then :class:`BrokerUnavailableError`: ``run`` exits 3 without committing)."""
        return retry(what, fn, self.cfg.kafka, stop=self.stop_event.is_set, limit_seconds=0)

    # ------------------------------------------------------------------ input
    def _submit(self, partition: int, recs: Sequence[Any], now: float) -> bool:
        """Hand consumed records (``ConsumerRecord`` or :class:`Unreadable`) of one partition to its pipeline,
        recovering the partition first when it is new.  False: they were not taken (the consumer was moved back
        to the partition's start; they come again)."""
        if partition not in self.states:
            start = self._start_offset(partition, recs[0].offset)
            if start is None:
                return False
            recs = [r for r in recs if r.offset >= start]
            if not recs:
                return True
        assert self._backend is not None
        msgs: tuple[RawMessage, ...] = tuple(
            (r.offset, None, None, (), None, r.error) if isinstance(r, Unreadable)
            else (r.offset, r.value, r.key, r.headers, r.timestamp, None) for r in recs)
        self._backend.submit(ProcessBatch(partition, msgs, now))
        self._last_input[partition] = now
        return True

    def _idle_flush(self, now: float) -> None:
        for p, st in self.states.items():
            if st.buffered and now - self._last_input.get(p, now) >= self.cfg.service.idle_flush_seconds:
                log.info("partition %d idle for %.1f s: flushing %d buffered records", p,
                         self.cfg.service.idle_flush_seconds, st.buffered)
                assert self._backend is not None
                self._backend.submit(FlushPartition(p, now))
                self._last_input[p] = now

    # ------------------------------------------------------------------ the outbox (steps 1, 2)
    def _collect(self, *, wait_all: bool, timeout: float | None = None) -> None:
        """Step 1 for the finished batches: their ledger entries go to the ledger; take over the partitions' new
        watermarks.  ``timeout``: a worker that does not answer within it raises :class:`WorkerError`."""
        assert self._backend is not None
        for res in self._backend.results(wait_all=wait_all, timeout=timeout):
            st = self.states.get(res.partition)
            if st is not None:
                st.watermark, st.buffered = res.watermark, res.buffered
                st.open_clusters, st.next_offset, st.horizon = res.open_clusters, res.next_offset, res.horizon
            if res.entries:
                self._write_entries(res.partition, res.entries)
            self._account(res)

    def _write_entries(self, partition: int, entries: list[LedgerEntry]) -> None:
        assert self._ledger is not None
        box = self.outboxes.get(partition)
        if box is None:  # revoked meanwhile: not written, so not published; the new owner processes them again
            log.debug("partition %d: %d ledger entries of a dropped partition not written", partition, len(entries))
            return
        topic = self.ledger_topic
        receipt = self._ledger.send([OutputMessage("ledger", topic, partition, e.key, e.encode()) for e in entries])
        for e in entries:
            box.record(e)
        self._dirty.add(partition)
        self._unsent.append(_Unsent(partition, entries, receipt))

    def _send_acknowledged(self, *, wait: bool = False) -> None:
        """Step 2: send the outputs of every batch whose ledger entries are acknowledged (in batch order).
        ``wait``: wait up to ``LEDGER_WAIT_SECONDS`` for acknowledgements (nothing else to do)."""
        if not self._unsent:
            return
        assert self._ledger is not None
        if self._ledger.poll(LEDGER_WAIT_SECONDS if wait else 0.0):
            self._broker_answered()
        while self._unsent and self._unsent[0].receipt.acknowledged:
            self._send_outputs(self._unsent.popleft())

    def _send_outputs(self, unsent: _Unsent) -> None:
        assert self._producer is not None
        p = unsent.partition
        msgs = [self._output(p, m) for e in unsent.entries for m in e.outputs]
        if msgs:
            self._sent.append((p, self._producer.send(msgs)))

    def _output(self, partition: int, m: EncodedMessage) -> OutputMessage:
        return OutputMessage(m.role, self._role_topic[m.role], partition, m.key, m.value)

    def _settle_outbox(self) -> None:
        """Steps 1-3 for everything collected: every entry and every output acknowledged; the outboxes learn the
        output offsets."""
        assert self._ledger is not None and self._producer is not None
        if self._ledger.flush():
            self._broker_answered()
        while self._unsent:
            self._send_outputs(self._unsent.popleft())
        if self._producer.flush():
            self._broker_answered()
        for p, receipt in self._sent:
            box = self.outboxes.get(p)
            if box is not None:
                for d in receipt.deliveries():
                    box.acked(self._topic_role[d.topic], d.offset)
        self._sent.clear()

    # ------------------------------------------------------------------ recovery
    def _start_offset(self, partition: int, first_offset: int) -> int | None:
        """Recover a new partition and return the offset its pipeline starts at (records below it are already
        accounted), or None after seeking the consumer back to that offset (the records come again).

        The start is the recovery plan's: max(committed offset, last checkpoint's watermark); with neither, the
        consumer's reset position (``first_offset``).  kafka-python keeps the fetch position of a partition
        revoked and assigned again to the same member, but the revoke dropped the state: then the position is
        past the start, so seek back once.  Offsets below the first available one (retention) start at it.
        """
        consumer = self._consumer
        assert consumer is not None
        tp = TopicPartition(self.cfg.topics.input, partition)
        plan = self._plans.pop(partition, None)
        if plan is None:
            self._check_data(force=True)  # a new partition may be the first sign of a recreated topic
            committed = self._retry_mid_run(f"partition {partition}: committed offset", lambda: consumer.committed(
                tp, timeout_ms=min(self.cfg.kafka.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS)))
            self._check_committed(tp, committed)
            plan = self._scan_ledger(partition, committed)
        target = plan.start_offset if plan.start_offset is not None else first_offset
        if first_offset > target and self._seeked.get(partition) != target:
            self._seeked[partition] = target
            self._plans[partition] = plan
            log.info("partition %d: position %d is past the start %d (state dropped at a rebalance): seeking back",
                     partition, first_offset, target)
            consumer.seek(tp, target)
            return None
        start = max(first_offset, target)
        self._recover(partition, plan, start)
        return start

    def _check_committed(self, tp: TopicPartition, committed: int | None) -> None:
        """A partition's recovery: its committed offset must not be gone (when this process saw one) nor lie above
        the partition's highwater (of the fetch that brought its first records)."""
        guard, consumer = self._guard, self._consumer
        if guard is None or consumer is None:
            return
        floor = guard.floors.floor(tp.topic, tp.partition)
        if committed is None and floor:
            raise BrokerDataLossError(f"the committed offset of group {self.cfg.kafka.group_id!r} for "
                                      f"{tp.topic}[{tp.partition}] is gone (it was at least {floor})")
        if committed is not None:
            guard.floors.raise_to(tp.topic, tp.partition, committed, "found committed")
        problem = guard.floors.check(tp.topic, tp.partition, consumer.highwater(tp))
        if problem:
            raise BrokerDataLossError(problem)

    def _scan_ledger(self, partition: int, committed: int | None) -> RecoveryPlan:
        """Recovery steps a-c: the backward scan of the partition's ledger partition."""
        assert self._reader is not None and self._ledger is not None
        reader, topic = self._reader, self.ledger_topic
        lp = self._ledger.partition_for(topic, partition)
        chunk = self.cfg.service.readback_chunk
        group = self.cfg.kafka.group_id

        def read() -> LedgerScan:
            scan = LedgerScan(self.cfg.topics.input, partition, committed, group=group)
            reader.read_backward(topic, lp, chunk, lambda recs: scan.add_chunk([LedgerRecord(*r) for r in recs]))
            return scan

        scan = self._retry_mid_run(f"partition {partition}: ledger scan", read)
        plan = scan.finish()
        if plan.foreign_groups:
            raise LedgerConflictError(
                f"topics.ledger: {topic} holds checkpoints of consumer group(s) {list(plan.foreign_groups)}, this "
                f"service is group {group!r}: each service (consumer group, set of output topics) needs its own "
                f"ledger; set topics.ledger (default <input>.ledger)")
        if plan.conflicts:
            log.error("partition %d: ledger %s holds offsets in two different entries (first: %s): accounted once "
                      "here, the audit reports them", partition, topic, plan.conflicts[:3])
        if plan.corrupt:
            log.warning("partition %d: %d ledger record(s) are not entries of this partition (first: %s); skipped",
                        partition, len(plan.corrupt), plan.corrupt[0])
        return plan

    def _recover(self, partition: int, plan: RecoveryPlan, start: int) -> None:
        """Recovery steps d-e: complete what the ledger promised, write the new incarnation's first checkpoint,
        create the partition's pipeline."""
        assert self._reader is not None and self._producer is not None and self._ledger is not None
        assert self._backend is not None
        t0 = time.monotonic()
        reader, chunk = self._reader, self.cfg.service.readback_chunk
        presence = OutputPresence()
        ends: dict[str, int] = {}
        for role, topic in self._role_topic.items():
            op = self._producer.partition_for(topic, partition)
            since = (plan.scan_from or {}).get(role)

            def scan(t: str = topic, o: int = op, s: int | None = since) -> tuple[list[Any], int]:
                return reader.read_forward(t, o, s, chunk)

            def end(t: str = topic, o: int = op) -> int:
                return reader.bounds(t, o)[1]

            if plan.pending:  # which promised outputs are there (step d)
                msgs, ends[role] = self._retry_mid_run(f"partition {partition}: scan of {topic}", scan)
                presence.add_many(role, msgs)
            elif since is None:  # where this incarnation's outputs will land, at the earliest
                ends[role] = self._retry_mid_run(f"partition {partition}: end of {topic}", end)
        incarnation = secrets.token_hex(4)
        box = PartitionOutbox.from_recovery(plan, incarnation=incarnation, ends=ends, group=self.cfg.kafka.group_id)
        resend = outputs_to_resend(plan.pending, presence)
        if resend:
            receipt = self._producer.send([self._output(partition, m) for m in resend])
            self._producer.flush()
            for d in receipt.deliveries():
                box.acked(self._topic_role[d.topic], d.offset)
                self.metrics.outputs_resent.labels(topic=d.topic).inc()
            self.totals.resent += len(resend)
        ck = box.checkpoint(start, plan.horizon)
        ck_receipt = self._ledger.send([OutputMessage("ledger", self.ledger_topic, partition, ck.key, ck.encode())])
        self._ledger.flush()
        self._note_ledger(ck_receipt)
        horizon = max(plan.horizon, start - 1)
        self._backend.create(CreatePartition(partition, start, tuple(sorted(plan.accounted)), horizon, incarnation))
        self.states[partition] = PartitionStatus(partition, watermark=start, next_offset=start, horizon=horizon)
        self.outboxes[partition] = box
        self.totals.recoveries += 1
        log.info("partition %d: starting at offset %d (incarnation %s); ledger scan read %d records: %d offsets at or "
                 "after it already accounted (will be skipped), %d entries after the last checkpoint, %d outputs "
                 "re-sent, horizon %d; %.2f s", partition, start, incarnation, plan.records_read, len(plan.accounted),
                 len(plan.pending), len(resend), horizon, time.monotonic() - t0)

    # ------------------------------------------------------------------ accounting
    def _account(self, res: PartitionResult) -> None:
        partition, s = res.partition, res.stats
        m, t, topic = self.metrics, self.totals, self.cfg.topics.input
        t.consumed += s.consumed
        t.released += s.released
        t.skipped += s.skipped
        t.control += s.control
        t.classes += len(s.class_sizes)
        t.loss_sum += s.released_loss_sum
        if s.consumed:
            m.records_consumed.labels(topic=topic).inc(s.consumed)
        if s.released:
            m.records_released.labels(topic=self.cfg.topics.anon).inc(s.released)
        for reason, n in s.suppressed.items():
            t.suppressed += n
            t.suppressed_reasons[reason] = t.suppressed_reasons.get(reason, 0) + n
            m.records_suppressed.labels(reason=reason).inc(n)
        if s.skipped:
            m.records_duplicate_skipped.labels(topic=topic).inc(s.skipped)
        for reason, n in s.dead_letters.items():
            t.dead_lettered += n
            t.dead_letter_reasons[reason] = t.dead_letter_reasons.get(reason, 0) + n
            m.records_dead_lettered.labels(reason=reason).inc(n)
            log.warning("partition %d: %d message(s) dead-lettered (%s)", partition, n, reason)
        for release, n, detail in s.gate_refusals:
            t.gate_refusals += 1
            m.k_anonymity_violations.inc()
            log.error("partition %d: the pre-publish gate refused class %s (%d records, suppressed with reason gate, "
                      "not published): %s", partition, release, n, detail)
        for stage, offset, line in s.internal_errors:
            t.internal_errors += 1
            m.internal_errors.labels(stage=stage).inc()
            where = f"offset {offset}" if offset is not None else "no single message"
            log.error("partition %d: internal error in %s at %s: %s; %s", partition, stage, where, line,
                      "the message is dead-lettered (internal_error), the partition goes on"
                      if stage in ("decode", "engine", "flush") else "its records are suppressed (gate)"
                      if stage == "encode" else "the partition goes on")
        m.release_delay_arrivals.observe_many(s.delays)
        m.release_delay_seconds.observe_many(s.ingest_latency_seconds)
        m.class_information_loss.observe_many(s.class_losses)
        m.class_size.observe_many(s.class_sizes)
        if s.released or s.suppressed:
            m.gt_loss.set(t.gt_loss)
        if res.n_messages:  # issue 20: one observation per record (was one per batch)
            m.processing_seconds.observe_repeated(res.elapsed / res.n_messages, res.n_messages)
        st = self.states.get(partition)
        if st is not None:
            m.buffered_records.labels(partition=str(partition)).set(st.buffered)
            m.open_clusters.labels(partition=str(partition)).set(st.open_clusters)

    # ------------------------------------------------------------------ commits (steps 3-6)
    def _checkpoint(self, partitions: list[int]) -> dict[TopicPartition, OffsetAndMetadata]:
        """Step 4 for ``partitions`` (after :meth:`_settle_outbox`): a checkpoint for each whose watermark or
        entries moved; returns the watermarks to commit (step 5)."""
        assert self._ledger is not None
        topic = self.cfg.topics.input
        offsets = {}
        checkpoints = []
        for p in partitions:
            st, box = self.states.get(p), self.outboxes.get(p)
            if st is None or box is None:
                continue
            last = box.last_checkpoint
            if p in self._dirty or last is None or last.watermark != st.watermark:
                ck = box.checkpoint(st.watermark, st.horizon)
                checkpoints.append(OutputMessage("ledger", self.ledger_topic, p, ck.key, ck.encode()))
                self._dirty.discard(p)
            if self.committed.get(p) != st.watermark:
                offsets[TopicPartition(topic, p)] = OffsetAndMetadata(st.watermark, None, -1)
        if checkpoints:
            receipt = self._ledger.send(checkpoints)
            if self._ledger.flush():
                self._broker_answered()
            self._note_ledger(receipt)
        return offsets

    def _commit(self, *, sync: bool = False) -> None:
        """Steps 3-5: everything collected acknowledged, checkpoints, then commit each partition's watermark.

        The watermarks are those reported with the finished batches whose entries and outputs were just
        acknowledged; batches still in a worker are not covered (their partitions' watermarks stay where they
        were).  A synchronous commit (at shutdown) writes its tombstones (step 6) at once.
        """
        assert self._consumer is not None
        self._settle_outbox()
        offsets = self._checkpoint(list(self.states))
        if not offsets:
            return
        try:
            if sync:  # the stop path: bounded by what is left of the stop grace
                timeout_s = min(self.cfg.kafka.request_timeout_ms / 1000.0, max(0.5, self._stop_clock.remaining()))
                self._consumer.commit(offsets, timeout_ms=int(timeout_s * 1000))
                self._confirmed.append({tp.partition: om.offset for tp, om in offsets.items()})
            else:
                self._consumer.commit_async(offsets, callback=self._commit_done)
        except KafkaError as e:  # e.g. CommitFailedError after a rebalance: the new owner recovers from the ledger
            log.warning("commit of %s failed: %r", {tp.partition: o.offset for tp, o in offsets.items()}, e)
            return
        if any(om.offset > self._commit_high.get(tp.partition, -1) for tp, om in offsets.items()):
            self.commits_made += 1  # progress: everything below the new watermarks was delivered
        for tp, om in offsets.items():
            self._commit_high[tp.partition] = max(om.offset, self._commit_high.get(tp.partition, -1))
            self.committed[tp.partition] = om.offset
            if self._guard is not None:  # a watermark never exceeds what was consumed: the input had that many
                self._guard.floors.raise_to(tp.topic, tp.partition, om.offset, "committed")
            self.metrics.commit_watermark.labels(topic=tp.topic, partition=str(tp.partition)).set(om.offset)

    def _commit_done(self, offsets: dict[TopicPartition, OffsetAndMetadata], response: object) -> None:
        if isinstance(response, Exception):
            log.warning("asynchronous commit failed (%r); the next commit supersedes it", response)
            for tp, om in offsets.items():
                if self.committed.get(tp.partition) == om.offset:
                    del self.committed[tp.partition]  # commit it again
            return
        self._confirmed.append({tp.partition: om.offset for tp, om in offsets.items()})

    def _write_tombstones(self) -> None:
        """Step 6: once a commit is confirmed, tombstones for the ledger keys no recovery can need (compaction
        removes them; nothing waits for their acknowledgement)."""
        if not self._confirmed:
            return
        assert self._ledger is not None
        msgs = []
        for commit in self._confirmed:
            for p, offset in commit.items():
                box = self.outboxes.get(p)
                if box is not None:
                    msgs += [OutputMessage("ledger", self.ledger_topic, p, key, None) for key in box.tombstones(offset)]
        self._confirmed.clear()
        if msgs:
            self._ledger.send(msgs)

    def on_revoked(self, partitions: list[int]) -> None:
        """Rebalance: finish in-flight batches, steps 1-4, commit what is safe for the revoked partitions (async:
        no blocking consumer call), drop their state.  What this raises is kept and re-raised after the poll
        (kafka-python only logs what a listener raises); the partitions' state is dropped either way."""
        try:
            self._revoke(partitions)
        except Exception as e:  # re-raised by _poll: ends the loop (recovery or exit) like any other error
            log.warning("partitions %s revoked while %r: their state is dropped without a commit (the next owner "
                        "recovers them from the ledger)", partitions, e)
            self._deferred = e
            self._drop(partitions)

    def _drop(self, partitions: list[int]) -> None:
        owned = [p for p in partitions if p in self.states]
        if self._backend is not None:
            self._backend.drop(owned)
        for p in owned:
            self._seeked.pop(p, None)
            self.states.pop(p)
            self.outboxes.pop(p, None)
            self._dirty.discard(p)
            self.committed.pop(p, None)

    def _revoke(self, partitions: list[int]) -> None:
        owned = [p for p in partitions if p in self.states]
        for p in partitions:
            self._plans.pop(p, None)
        if not owned or self._closing:  # closing: the final commit covered them already
            return
        assert self._consumer is not None and self._backend is not None
        self._collect(wait_all=True)
        self._settle_outbox()
        offsets = self._checkpoint(owned)
        if offsets:
            self._consumer.commit_async(offsets, callback=self._commit_done)
        self._backend.drop(owned)
        for p in owned:
            self._seeked.pop(p, None)
            st = self.states.pop(p)
            self.outboxes.pop(p, None)
            self._dirty.discard(p)
            self.committed.pop(p, None)
            log.info("partition %d revoked: committed watermark %d, dropped %d buffered records (the new owner "
                     "recovers them from the ledger)", p, st.watermark, st.buffered)
            self.metrics.buffered_records.labels(partition=str(p)).set(0)
            self.metrics.open_clusters.labels(partition=str(p)).set(0)

    def _shutdown(self, *, clean: bool = True) -> bool:
        """Finish (when ``clean``: last entries and outputs, checkpoints, final commit) and close; False if the
        broker was unreachable."""
        ok = True
        if self.lag_monitor is not None:
            self.lag_monitor.stop()
        try:
            if clean and self._backend is not None:
                self._collect(wait_all=True, timeout=STOP_GRACE_SECONDS)
            if clean and self._consumer is not None and self._producer is not None:
                self._commit(sync=True)
                self._write_tombstones()
                if self._ledger is not None:
                    self._ledger.flush()
        except BrokerUnavailableError as e:
            ok = False
            log.error("%s; stopping without committing them (a restart recovers from the ledger)", e)
        except (KafkaError, WorkerError, ProducerFatalError, MessageRejectedError) as e:
            log.warning("final commit failed: %r (the next start recovers from the ledger)", e)
        self._closing = True
        close_s = CLOSE_TIMEOUT_SECONDS if ok and clean else 0.5  # the broker did not answer: do not wait again
        try:  # leaves the group: bounded (a stalled broker would otherwise hold it for kafka.request_timeout_ms)
            if self._consumer is not None:
                self._consumer.close(timeout_ms=int(close_s * 1000))
            if self._reader is not None:
                self._reader.close()
        except (KafkaError, OSError) as e:  # closing on shutdown: nothing left to do
            log.debug("close failed: %r", e)
        for producer in (self._producer, self._ledger):
            if producer is not None:
                # never publish over a broker that lost data; a stalled or failed broker gets no more wait
                producer.close(timeout_s=0.0 if self._abandon or not (ok and clean) else close_s)
        if self._guard is not None:
            self._guard.close()
        if self._backend is not None:
            self._backend.close()
        t = self.totals
        log.info("main path stopped: consumed %d, released %d, suppressed %d, dead-lettered %d, skipped %d, "
                 "control %d", t.consumed, t.released, t.suppressed, t.dead_lettered, t.skipped, t.control)
        return ok
