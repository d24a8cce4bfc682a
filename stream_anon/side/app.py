"""The side paths' Kafka loop: an independent consumer group on the input topic (a slow side path never delays
the main path), the pure :class:`~stream_anon.side.processor.SidePathProcessor`, one
:class:`~stream_anon.kafka_io.producer.OutputProducer` and the metrics.

Loop: ``poll`` a batch; decode and validate every message with the main path's
:class:`~stream_anon.formats.decoding.RecordDecoder` (same reasons), clipping out-of-domain numeric values into the
schema's public domain (``side_paths.out_of_domain: clip``, :class:`~stream_anon.side.decoding.SideDecoder`);
**commit the batch's offsets first**, then perturb it; if that changed a cumulative budget (the lifetime cap of
each record or person, the k-means window counter and stream budget), **write the budget state to the internal
compacted topic and wait for its acknowledgement** (:mod:`stream_anon.side.budget_store`); only then send the
estimates and k-means releases it triggered, and hand the copies (JSON-encoded column-wise, keyed by the records'
pseudonyms) to the input partition's mixing window (:mod:`stream_anon.side.mixing`), which sends each window's
copies in bulk, shuffled and stamped with the window's release time, once it holds ``side_paths.mixing.records``
records or is ``side_paths.mixing.seconds`` old (``acks=all``; acknowledged at a flush every
``service.commit_interval_ms`` and whenever a poll returns nothing, when the metrics count them).

At start the budget is opened (:meth:`stream_anon.side.budgets.SideBudgets.open`): the state of the INPUT TOPIC is
read from the budget topic and checked against the anchor (a committed offset of the group
``stream-anon-side-budget.<input>``); a state that is missing, tombstoned, older than the anchor or unreadable stops
the side paths with one ERROR line naming the key and ``--new-budget`` (exit code 2, and ``stream-anon run`` stops
too).  A first or deliberately new budget (``new_budget``, logged as a WARNING) is written, and the anchor with it,
before the first record is consumed; the anchor follows the budget's writes at every flush.

Why commit before publishing: a record consumed again after a crash would be randomized a second time with
fresh noise, and two independent reports of the same value spend 2 eps, not the eps printed on them.
Committing first means every record is randomized at most once per consumer group, so the eps on each
message is the eps its record really spent.  The price: a crash between the commit and the producer's
acknowledgement loses the side copies of the batches consumed since the last flush (at most
``service.commit_interval_ms`` worth of records; the main path, which has its own group, loses nothing).  If a
commit fails (e.g. a rebalance moved the partition), the batch is neither randomized nor published: it is
consumed again (seek back), or by the partition's new owner.

Bad input: the main path already dead-letters every bad input message, so the side path only counts and
skips them (reason = the main path's DLQ reason), avoiding double DLQ entries; ``side_paths.dead_letter:
true`` (side paths running without a main path) dead-letters them too, redacted like the main path's
(:func:`~stream_anon.formats.release.dead_letter_message`, ``dlq.payload``).  Control messages (header
``stream-anon-control: flush``, end of stream, one per input partition): once every assigned partition's
latest message is such a control, a final round of estimates is published and a partial k-means window is
released (if it holds at least ``kmeans.min_partial_window`` records).

A record gets a copy on every enabled side topic or on none: every send to a side topic is written ahead to the
internal ``<input>.side-outbox`` and completed at the next start (:mod:`stream_anon.side.outbox`); a clean stop
releases every open window and the final estimates, a crash loses the open windows' copies on every topic alike.

Estimates and the k-means window live in memory: after a restart they cover the records since the restart.  The
pseudonym key is ``release.secret`` (resolved once by the service's parent process); run standalone without one,
a secret is generated for this run and a WARNING says that copies of different runs will not group.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from kafka import KafkaAdminClient
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.config.side_paths import SidePathConfigError, budget_topic
from stream_anon.core.schema import Schema
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER, DeadLetter
from stream_anon.formats.messages import H_KIND, OutputMessage
from stream_anon.formats.release import (
    Pseudonymizer,
    ReleaseOptions,
    ReleaseSecret,
    dead_letter_message,
    resolve_secret,
)
from stream_anon.kafka_io.clients import connect_admin, prepare_topics, retry
from stream_anon.kafka_io.consumers import open_poller
from stream_anon.kafka_io.errors import (
    BrokerUnavailableError,
    CommitFailedError,
    MessageRejectedError,
    ProducerFatalError,
)
from stream_anon.kafka_io.lifecycle import (
    LOOP_REQUEST_TIMEOUT_MS,
    SIDE_STOP_GRACE_SECONDS,
    Closing,
    StopClock,
)
from stream_anon.kafka_io.limits import FALLBACK_MESSAGE_MAX_BYTES, read_output_bound
from stream_anon.kafka_io.poller import PolledRecord, Poller
from stream_anon.kafka_io.producer import OutputProducer, open_producer
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.privacy.display import format_epsilon, format_epsilons
from stream_anon.side.budget_store import (
    AnchorWriter,
    BudgetStore,
    BudgetTopic,
    BudgetTopicError,
    read_anchor,
    side_outputs_found,
)
from stream_anon.side.budgets import BudgetAnchor, SideStateError
from stream_anon.side.decoding import SideDecoder
from stream_anon.side.encoding import CopyBatch, encode_json, json_safe
from stream_anon.side.metrics import SideMetrics
from stream_anon.side.mixing import CopyMixer, MixedWindow
from stream_anon.side.outbox import CopyGroup, RecoveryReport, SideOutbox
from stream_anon.side.outbox_store import OutboxTopic
from stream_anon.side.processor import SKIP_PERSON_BUDGET, Out, SideBatch, SideEvent, SidePathProcessor
from stream_anon.side.status import (
    SideStatus as SideStatus,  # (re-exported: the runtime and tests import it here)
)
from stream_anon.side.status import estimate_summary, startup_warnings

log = logging.getLogger(__name__)


@dataclass
class _Decoded:
    """One polled batch of a partition, decoded (see :meth:`SidePathApp._decode`)."""

    segments: list[tuple[list[dict[str, Any]], bool]] = field(default_factory=lambda: [([], False)])
    dlq: list[OutputMessage] = field(default_factory=list)  # dead letters (side_paths.dead_letter)
    dlq_reasons: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)  # DLQ reasons of the bad input messages
    clipped: list[str] = field(default_factory=list)  # attributes clipped (one entry per value)
    controls: int = 0


def side_group_id(cfg: Config) -> str:
    """The side paths' consumer group: ``side_paths.group_id``, else ``<kafka.group_id>-ldp``."""
    return cfg.side_paths.group_id or f"{cfg.kafka.group_id}-ldp"


class SidePathApp:
    """One side-path member.  ``run()`` until ``stop_event`` is set; returns an exit code.

    The cumulative budgets belong to the input topic (the state keys start with its name), whatever the group: run
    ONE side-path member per input topic (the service starts one).  ``new_budget``: start a new budget generation
    deliberately (``stream-anon run --new-budget``; a WARNING, recorded in the budget topic).
    """

    def __init__(self, cfg: Config, metrics: ServiceMetrics | None = None, stop_event: threading.Event | None = None,
                 *, schema: Schema | None = None, status: SideStatus | None = None,
                 rng: np.random.Generator | int | None = None, new_budget: bool = False) -> None:
        self.new_budget = new_budget
        self.cfg = cfg
        self.side = cfg.side_paths
        self.stop_event = stop_event or threading.Event()
        self.status = status or SideStatus()
        self.schema = schema if schema is not None else cfg.anonymization.load_schema()
        self.topics = cfg.topics.side_topics()
        self.input_topic = cfg.topics.input
        self.group_id = side_group_id(cfg)
        self.status.group_id = self.group_id
        self.secret: ReleaseSecret = resolve_secret(cfg.release.secret)
        self.release = ReleaseOptions(secret=self.secret.text, dlq_payload=cfg.dlq.payload,
                                      dlq_max_payload_bytes=cfg.service.dlq_max_bytes)
        self.processor = SidePathProcessor(self.side, self.schema, topics=self.topics, rng=rng,
                                           pseudonymize=Pseudonymizer(self.secret.value), scope=self.input_topic)
        self.metrics = SideMetrics(metrics if metrics is not None else ServiceMetrics(CollectorRegistry()),
                                   self.processor, self.input_topic)
        self.status.epsilon_per_record = dict(self.processor.epsilon_per_record)
        self.status.epsilon_kmeans_window = self.processor.epsilon_kmeans
        self.status.epsilon_all_side_topics = self.processor.epsilon_all_topics
        self.decoder = SideDecoder(self.schema, cfg.service.max_message_bytes, out_of_domain=self.side.out_of_domain)
        self.budget_topic = BudgetTopic(cfg, budget_topic(self.side, self.input_topic)) \
            if self.processor.budgets.persistent else None
        self.budget_store: BudgetStore | None = self.budget_topic
        self.mixer = CopyMixer(self.side.mixing.records, self.side.mixing.seconds, self.processor.rng)
        self._admin: KafkaAdminClient | None = None  # kept open for the anchor
        self._anchored: BudgetAnchor | None = None  # the anchor as last committed
        self._anchor_writer = AnchorWriter(self.input_topic)
        self._poller: Poller | None = None
        self._bound = FALLBACK_MESSAGE_MAX_BYTES  # the output bound, read from the broker at start
        # the write-ahead of every message to a public side topic (a record's copies on every topic or none)
        self.outbox_topic = OutboxTopic(cfg, self.input_topic)
        self.outbox = SideOutbox(self.outbox_topic.topic, self.input_topic, bound=self._bound)
        self._producer: OutputProducer | None = None
        self._ended: set[int] = set()  # input partitions whose latest message was an end-of-stream control
        self._unacked: list[Out] = []  # sent, not yet acknowledged (counted in metrics at the next flush)
        self._unacked_copies: list[CopyBatch] = []
        self._last_flush = time.monotonic()
        self._next_refusal_log = 1  # person-cap refusals: WARNING at 1, 10, 100, ...
        self._flush_every = max(0.0, cfg.service.commit_interval_ms / 1000.0)
        t = self.topics
        self._per_record_topics = frozenset(self.processor.epsilon_per_record)
        self._kinds = {t.krr: "krr", t.rs: "rs", t.blap: "blap", t.estimates: "estimates", t.kmeans: "kmeans"}
        self._headers = {topic: ((H_KIND, kind.encode()),) for topic, kind in self._kinds.items()}

    def output_topics(self) -> list[str]:
        """The side topics of the paths that run (only those are created): the per-record topics with an
        attribute, the estimates topic when one of them runs, the k-means topic when k-means runs."""
        t, p = self.topics, self.processor
        per_record = [topic for topic in (t.krr, t.rs, t.blap) if topic in p.epsilon_per_record]
        return [*per_record, *([t.estimates] if per_record else []), *([t.kmeans] if p.kmeans_enabled else [])]

    def startup_warnings(self) -> list[str]:
        """Lines logged as WARNING at start (:func:`~stream_anon.side.status.startup_warnings`)."""
        return startup_warnings(self.side, secret_generated=self.secret.generated,
                                epsilon_all_topics=self.processor.epsilon_all_topics)

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> int:
        """Topics, the budget topic, the producer, the persisted budgets, the consumer (the shared start-up of
        :func:`~stream_anon.kafka_io.clients.prepare_topics`); 0, or the exit code of a start that failed."""
        cfg, stop, t, topic = self.cfg, self.stop_event.is_set, self.topics, self.budget_topic
        # side topics get topics.partitions partitions (estimates and k-means windows are not per input partition)
        wanted = [*self.output_topics(), *([t.dlq] if self.side.dead_letter else [])]  # only the paths that run

        anchor: list[BudgetAnchor | None] = [None]
        mark: list[int | None] = [None]

        def ensure_budget_topic(admin: KafkaAdminClient) -> None:
            retry("create the outbox topic", lambda: self.outbox_topic.ensure(admin), cfg.kafka, stop=stop)
            mark[0] = retry("read the outbox read mark", lambda: self.outbox_topic.read_mark(admin), cfg.kafka,
                            stop=stop)
            if topic is not None:
                retry("create the budget topic", lambda: topic.ensure(admin), cfg.kafka, stop=stop)
                anchor[0] = retry("read the budget anchor", lambda: read_anchor(admin, self.input_topic), cfg.kafka,
                                  stop=stop)
            # the output bound (issue 18): dead letters cut to fit, batches never larger
            self._bound = retry("message size limits", lambda: read_output_bound(
                admin, wanted, max_request_size=cfg.kafka.max_request_size,
                configured=cfg.service.max_output_bytes), cfg.kafka, stop=stop).bytes
            self.outbox.bound = self._bound

        try:
            counts = prepare_topics(cfg.kafka, wanted, cfg.topics.layout(), what="create side topics",
                                    on_retry=self.metrics.reconnect, stop=stop, also=ensure_budget_topic)
        except BudgetTopicError as e:
            return self._failed_start(f"not started: {e}", 2)
        # on a stop, the final flush gets the side paths' grace, then its outputs are given up (recomputed next time)
        kafka = dataclasses.replace(cfg.kafka, batch_size=min(cfg.kafka.batch_size, self._bound))
        self._producer = open_producer(kafka, partition_counts=counts, on_error=self.metrics.produce_error,
                                       stop=StopClock(self.stop_event, SIDE_STOP_GRACE_SECONDS).give_up,
                                       label="side")
        store = self.budget_store
        if store is not None:
            spending = [t.krr, t.rs, t.blap, t.kmeans]
            rc = self.restore_budgets(
                store, lambda: retry("read the budget state", store.load, cfg.kafka, stop=stop), anchor=anchor[0],
                outputs_exist=lambda: retry("look for side outputs", lambda: side_outputs_found(cfg, spending),
                                            cfg.kafka, stop=stop))
            if rc:
                return rc
            self._admin = self._connect_admin()  # for the anchor
            self._publish([], 0)  # a first or new budget: its head, then the anchor, before any record
        if self._admin is None:  # for the outbox read mark
            self._admin = self._connect_admin()
        self._recover_outbox(mark[0], counts)
        self._poller = retry("consumer", lambda: open_poller(cfg.kafka, self.input_topic, group_id=self.group_id,
                                                             reader=lambda: PartitionReader(cfg.kafka)),
                             cfg.kafka, stop=stop)
        return 0

    def _connect_admin(self) -> KafkaAdminClient:
        """The admin client of the anchor and the outbox read mark: its requests wait at most
        ``LOOP_REQUEST_TIMEOUT_MS`` (a stalled broker must not hold the loop, nor its stop, longer than that)."""
        k = self.cfg.kafka
        bounded = dataclasses.replace(k, request_timeout_ms=min(k.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS))
        return connect_admin(bounded, on_retry=self.metrics.reconnect, stop=self.stop_event.is_set)

    def _recover_outbox(self, mark: int | None, counts: dict[str, int]) -> RecoveryReport:
        """The outbox's recovery at start (:meth:`OutboxTopic.recover
        <stream_anon.side.outbox_store.OutboxTopic.recover>`), then its read mark."""
        assert self._producer is not None
        partitions = [(t, p) for t in self.output_topics() for p in range(counts.get(t, 1))]
        rep = self.outbox_topic.recover(self.outbox, self._producer, mark=mark, side_partitions=partitions,
                                        stop=self.stop_event.is_set)
        self.status.outbox_recovered = rep.resent
        self._write_read_mark(force=True)
        return rep

    def _write_read_mark(self, *, force: bool = False) -> None:
        if self._admin is not None:
            self.outbox_topic.move_mark(self._admin, self.outbox.read_mark, force=force)

    def run(self) -> int:
        if not self.side.enabled:
            log.info("side paths disabled (side_paths.enabled = false)")
            self.status.finished.set()
            return 0
        for line in self.startup_warnings():
            log.warning("side paths: %s", line)
        try:
            rc = self._start()
        except BrokerUnavailableError as e:
            if self.stop_event.is_set():  # told to stop while still connecting: a clean stop, nothing was read
                log.info("side paths: stopped before they started (%s)", e)
                return self._failed_start(None, 0)
            return self._failed_start(str(e), 3)
        except Exception as e:  # a thread's top: never die silently (the main path goes on without side paths)
            log.exception("side paths: start failed")
            return self._failed_start(repr(e), 1)
        if rc or self._poller is None:
            return rc
        self._poller.subscribe()
        self.metrics.budgets()
        self.metrics.lifetime_cap()
        p, m = self.processor, self.side.mixing
        cap = self.side.person_budget.cap_epsilon
        log.info("side paths: consuming %s as group %r -> %s; each record spends %s over all side outputs (exact eps "
                 "per topic %s, k-means window %s), lifetime cap %s per %s; copies leave in shuffled windows of "
                 "%d records or %g s", self.input_topic, self.group_id, ", ".join(self.output_topics()),
                 format_epsilon(p.epsilon_all_topics), format_epsilons(p.epsilon_per_record),
                 format_epsilon(p.epsilon_kmeans), "none (cap_epsilon: null)" if cap is None else format_epsilon(cap),
                 "person" if self.schema.person_id else "record id", m.records, m.seconds)
        self.status.ready.set()
        rc = 0
        silent = False
        try:
            self._loop()
        except BrokerUnavailableError as e:
            log.error("side paths stopped: %s", e)
            self.status.error = str(e)
            rc = 3
            silent = True
        except Exception as e:  # a thread's top: never die silently; log, record, and let the main path continue
            log.exception("side paths failed: %r", e)
            self.status.error = repr(e)
            rc = 1
        finally:
            self._shutdown(broker_silent=silent)
        return rc

    def restore_budgets(self, store: BudgetStore, load: Callable[[], dict[str, bytes]] | None = None, *,
                        anchor: BudgetAnchor | None = None,
                        outputs_exist: Callable[[], str | None] = lambda: None) -> int:
        """Open the budget of the input topic from ``store`` (``load``: how to read it, default ``store.load``)
        against its ``anchor`` (:meth:`SideBudgets.open <stream_anon.side.budgets.SideBudgets.open>`); 0, or 2
        after one ERROR line naming the store, the key and ``--new-budget`` when the state is refused."""
        state = (load or store.load)()
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        try:
            opening = self.processor.open_budgets(state, anchor=anchor, outputs_exist=outputs_exist,
                                                  new_budget=self.new_budget, when=when, where=store.describe())
        except SideStateError as e:
            return self._failed_start(f"not started: {store.describe()}: {e}", 2)
        self.status.budget_generation = opening.generation
        if opening.kind == "new":
            log.warning("side paths: %s", opening.message)
        else:
            log.info("side paths: %s (%d state records)%s", opening.message, len(state), self._budget_text())
        return 0

    def _budget_text(self) -> str:
        b = self.processor.budgets
        parts = []
        if b.kmeans is not None:
            parts.append(f"; k-means stream budget {b.kmeans.spent:.6g} of {b.kmeans.total_epsilon:g} spent")
        if b.person is not None:
            rate = b.person.fresh_refusal_rate(self.processor.epsilon_all_topics)
            parts.append(f"; lifetime-cap sketch: {b.person.n_spends} spends accepted, {b.person.n_refused} refused, "
                         f"a record never seen would be refused with probability {rate:.2g}")
        if b.kmeans_windows:
            parts.append(f"; next k-means window id {b.next_window}")
        return "".join(parts)

    def _failed_start(self, error: str | None, rc: int) -> int:
        if error is not None:
            log.error("side paths: %s", error)
        if self._producer is not None:
            self._producer.close(0.0)
            self._producer = None
        self._close_admin()
        self.status.error = error
        self.status.finished.set()
        return rc

    def _loop(self) -> None:
        poller = self._poller
        assert poller is not None
        poll_ms = self.cfg.service.poll_timeout_ms
        while not self.stop_event.is_set():
            self.status.tick()  # /healthz of the side-path process
            batch = poller.poll(poll_ms, self._unreadable)
            if not batch:
                self._publish(self.processor.poll(), 0, self.mixer.due())
                self._flush()
                continue
            for partition, recs in batch.items():
                if self.stop_event.is_set():  # the rest of the batch is not committed: consumed again next time
                    break
                if recs:
                    self._process(partition, recs)
            self._publish([], 0, self.mixer.due())  # windows that aged while the batch was processed
            if time.monotonic() - self._last_flush >= self._flush_every:
                self._flush()

    def _unreadable(self, partition: int, offset: int, reason: str, error: str) -> bool:
        """A record the consumer cannot read (found by the poller, as the main path's are: ``corrupt_record``, or
        ``oversized`` when too large to receive): skipped with that reason, the poller moves past it."""
        log.warning("side paths: the record at %s[%d] offset %d cannot be read (%s): skipped as %s",
                    self.input_topic, partition, offset, error[:300], reason)
        self._skip(reason)
        return True

    def _decode(self, partition: int, recs: Sequence[PolledRecord]) -> _Decoded:
        """Validated records in segments (a segment ends at an end-of-stream control), bad input, dead letters."""
        d = _Decoded()
        for r in recs:
            if r.headers and any(k == CONTROL_HEADER and v == CONTROL_FLUSH for k, v in r.headers):
                d.controls += 1
                d.segments[-1] = (d.segments[-1][0], True)
                d.segments.append(([], False))
                continue
            rec, clipped = self.decoder.decode(r.value)
            if isinstance(rec, DeadLetter):
                d.bad.append(rec.reason)
                if self.side.dead_letter:
                    d.dlq.append(self._dead_letter(partition, r, rec))
                    d.dlq_reasons.append(rec.reason)
                continue
            if clipped:
                d.clipped.extend(clipped)
            d.segments[-1][0].append(rec)
        return d

    def _process(self, partition: int, recs: Sequence[PolledRecord]) -> None:
        # decode everything first, then commit (at most one randomization per record), then perturb + publish
        decoded = self._decode(partition, recs)
        if not self._commit_first(partition, recs):
            return
        self._count_input(partition, recs, decoded)
        outputs: list[Out] = []
        windows: list[MixedWindow] = []
        events: list[SideEvent] = []
        for records, flush_after in decoded.segments:
            if records:
                b = self._perturb(partition, records)
                if b is not None:
                    if b.copies:  # all of a record's copies go into the same window
                        self.mixer.add(partition, b.copies, len(b.copies[0]))
                    outputs.extend(b.outputs)
                    events.extend(b.events)
                self._ended.discard(partition)
            if flush_after:
                self._ended.add(partition)
                windows.extend(self.mixer.flush([partition]))  # the end of this partition's stream
                if self._all_partitions_ended():
                    outputs.extend(self.processor.flush())
        outputs.extend(self.processor.poll())  # timer (nothing right after a flush: no new records since)
        windows.extend(self.mixer.due())
        if decoded.dlq:
            assert self._producer is not None
            self._producer.send(decoded.dlq)
            for reason in decoded.dlq_reasons:
                self.metrics.dead_lettered(reason)
        self._publish(outputs, partition, windows, events)

    def _commit_first(self, partition: int, recs: Sequence[PolledRecord]) -> bool:
        """Commit the batch's offsets before anything of it is randomized; False: the commit failed, nothing of the
        batch was randomized, and it is consumed again (seek back) or by the partition's new owner."""
        poller = self._poller
        assert poller is not None
        next_offset = int(recs[-1].offset) + 1
        try:  # bounded: a stalled broker must not hold the side paths (nor their stop) longer than one request
            poller.commit_sync({partition: next_offset},
                               timeout_s=min(self.cfg.kafka.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS) / 1000)
            return True
        except CommitFailedError as e:
            where = f"{self.input_topic}[{partition}]"
            log.warning("side paths: commit of %s@%d failed (%r); the batch of %d messages is not perturbed now and "
                        "will be consumed again (no record is randomized twice)", where, next_offset,
                        e.__cause__ or e, len(recs))
            if self.stop_event.is_set():  # stopping: the batch stays uncommitted for the next start; no seek
                return False  # (a seek right after a commit the broker did not answer can hold for seconds)
            try:
                poller.seek(partition, int(recs[0].offset))
            except ValueError as e2:  # partition revoked: its new owner starts from the committed offset
                log.info("side paths: %s no longer assigned (%r)", where, e2)
            self.stop_event.wait(0.5)
            return False

    def _count_input(self, partition: int, recs: Sequence[PolledRecord], decoded: _Decoded) -> None:
        status, n = self.status, len(recs)
        status.consumed += n
        status.control += decoded.controls
        self.metrics.consumed(n)
        for reason in decoded.bad:
            self._skip(reason)
        for attribute in decoded.clipped:
            status.clipped[attribute] = status.clipped.get(attribute, 0) + 1
            self.metrics.clipped(attribute)
        status.positions[partition] = int(recs[-1].offset) + 1

    def _perturb(self, partition: int, records: list[dict[str, Any]]) -> SideBatch | None:
        """One segment of valid records through the processor (None: it failed, the records are skipped)."""
        try:
            b = self.processor.process_batch_encoded(records)
        except (SidePathConfigError, ValueError, ArithmeticError) as e:  # a bug or a schema mismatch
            log.exception("side paths: %d records of %s[%d] not perturbed: %s", len(records), self.input_topic,
                          partition, e)
            self._skip("side_path_error", len(records))
            return None
        for reason, count in b.skipped.items():
            self._skip(reason, count)
        if b.skipped.get(SKIP_PERSON_BUDGET):
            self._log_person_refusals()
        self.status.processed += len(records) - sum(b.skipped.values())
        return b

    def _log_person_refusals(self) -> None:
        """A WARNING when the count of records refused by the per-person cap reaches 1, 10, 100, ... (never per
        record; the metric counts every one)."""
        n = self.status.skipped.get(SKIP_PERSON_BUDGET, 0)
        if n >= self._next_refusal_log:
            log.warning("side paths: %d record(s) so far got no side output: their %s would exceed its lifetime "
                        "cap side_paths.person_budget.cap_epsilon = %g (each pass of a record spends %r; a replay or "
                        "another consumer group reads records that spent it already)", n,
                        "person" if self.schema.person_id else "record id", self.side.person_budget.cap_epsilon,
                        self.processor.epsilon_all_topics)
            while self._next_refusal_log <= n:
                self._next_refusal_log *= 10

    def _all_partitions_ended(self) -> bool:
        """True when every assigned input partition's latest message is an end-of-stream flush control."""
        assert self._poller is not None
        return self._poller.assignment() <= self._ended

    def _skip(self, reason: str, count: int = 1) -> None:
        self.status.skipped[reason] = self.status.skipped.get(reason, 0) + count
        self.metrics.skipped(reason, count)

    def _dead_letter(self, partition: int, r: PolledRecord, dl: DeadLetter) -> OutputMessage:
        """The dead letter of a bad input as the main path writes it: redacted by default (``dlq.payload``), no
        headers."""
        o = self.release
        msg = dead_letter_message(input_topic=self.input_topic, partition=partition, offset=int(r.offset),
                                  reason=dl.reason, field=dl.field, error=dl.error, value=r.value, key=r.key,
                                  secret=self.secret.value, payload=o.dlq_payload,
                                  max_payload_bytes=o.dlq_max_payload_bytes, max_message_bytes=self._bound)
        return OutputMessage("dlq", self.topics.dlq, partition, msg.key, msg.value)

    def _publish(self, outputs: list[Out], partition: int, windows: Sequence[MixedWindow] = (),
                 events: Sequence[SideEvent] = ()) -> None:
        """Persist the budgets the batch changed (and wait for the acknowledgement; the first write of a run also
        commits the anchor), then send ``outputs`` and the released mixing ``windows`` (each window's copies with
        its timestamp, to its input partition's side partition; acknowledged at the next :meth:`_flush`, which also
        counts them in the metrics)."""
        proc = self.processor
        producer = self._producer
        assert producer is not None
        updates = proc.take_budget_updates()
        if updates:
            assert self.budget_store is not None
            self.budget_store.put(producer, updates)  # BEFORE the outputs that spent them
            if self._anchored is None or self._anchored.generation != proc.budgets.generation:
                self._write_anchor()  # a run's first write: the anchor before anything is published
        events = [*events, *proc.drain_events()]
        groups = [CopyGroup(c.topic, producer.partition_for(c.topic, w.partition), w.timestamp_ms,
                            self._headers[c.topic], tuple(c.keys), tuple(c.payloads))
                  for w in windows for c in w.copies]
        if outputs:  # estimates and k-means releases: one group per side partition, stamped now
            per_record = self._per_record_topics
            now_ms = int(time.time() * 1000)
            by_partition: dict[tuple[str, int], tuple[list[bytes | None], list[bytes]]] = {}
            for topic, key, msg in outputs:
                keys, values = by_partition.setdefault((topic, producer.partition_for(topic, partition)), ([], []))
                keys.append(None if key is None else key.encode())
                values.append(encode_json(msg if topic in per_record else json_safe(msg)))
            groups += [CopyGroup(topic, p, now_ms, self._headers[topic], tuple(keys), tuple(values))
                       for (topic, p), (keys, values) in by_partition.items()]
        if groups:  # written ahead to the outbox (acknowledged), then sent (acknowledged at the next flush)
            self.outbox.publish(producer, groups)
            self.status.outbox_entries = self.outbox.entries_written
            self.status.outbox_wait_seconds = self.outbox.write_seconds
        for w in windows:
            self._unacked_copies.extend(w.copies)
            self.status.mixing_windows += 1
        self._unacked.extend(outputs)
        for ev in events:
            if ev.kind in ("budget_exhausted", "kmeans_skipped"):
                # the processor logged the exhaustion at ERROR; later refused windows once per window here
                if ev.kind == "kmeans_skipped":
                    log.error("%s", ev.detail)
                self.metrics.budget_refused(ev.topic)
        self.status.kmeans_windows = proc.kmeans_windows
        self.status.kmeans_refused = proc.kmeans_refused
        self.status.kmeans_stopped = proc.kmeans_stopped
        if events:
            self.metrics.budgets()

    def _write_anchor(self) -> None:
        """Commit the budget's (generation, write) as its anchor (a refusal is tried again at the next flush: the
        state itself is acknowledged already; :class:`AnchorWriter` logs it)."""
        anchor = self.processor.budgets.anchor
        if self._admin is None or anchor.seq == 0:
            return
        if self._anchor_writer.write(self._admin, anchor):
            self._anchored = anchor

    def _close_admin(self) -> None:
        if self._admin is not None:
            try:
                self._admin.close()
            except (KafkaError, OSError) as e:  # closing a client of a dead broker
                log.debug("admin close failed: %r", e)
            self._admin = None

    def _flush(self) -> None:
        """Wait until every message sent is acknowledged (``acks=all``), then count them (metrics, status); move the
        budget's anchor to its latest write.  The lifetime-cap gauge first (records charged, copies maybe not sent)."""
        self._last_flush = time.monotonic()
        self.metrics.lifetime_cap()
        stopping = self.stop_event.is_set()  # no admin request on the way out: the anchor and the read mark may lag
        if self._anchored is not None and self._anchored < self.processor.budgets.anchor and not stopping:
            self._write_anchor()
        if self._producer is None or not (self._unacked or self._unacked_copies or self.outbox.unsettled):
            return
        self._producer.flush()
        self.outbox.settle(self._producer)  # tombstones of the entries now acknowledged (acknowledged later)
        if not stopping:
            self._write_read_mark()
        outputs, self._unacked = self._unacked, []
        copies, self._unacked_copies = self._unacked_copies, []
        status = self.status
        per_topic = self.metrics.published(outputs, copies)
        for topic, c in per_topic.items():
            status.published[topic] = status.published.get(topic, 0) + c
        t = self.topics
        for topic, _key, msg in outputs:
            if topic == t.estimates:
                status.estimates[f"{msg['mechanism']}/{msg['attribute']}"] = estimate_summary(msg)
        acc = self.processor.kmeans_accountant  # the one lifetime budget (k-means total_epsilon), if any
        if acc is not None:
            status.kmeans_budget = {"total": acc.total_epsilon, "used": acc.spent, "remaining": acc.remaining}

    def _shutdown(self, *, broker_silent: bool = False) -> None:
        """Release every open window and the final estimates, then close; ``broker_silent`` (the loop ended because
        the broker did not acknowledge within the stop grace): nothing more is sent (it could not be acknowledged;
        the open windows' copies are lost on every topic alike, their records were committed before they were
        perturbed) and no client waits for the broker again."""
        closing = Closing()
        if broker_silent:
            closing.broker_silent()
        try:
            if self._producer is not None and self._poller is not None and self.status.ready.is_set() \
                    and not broker_silent:
                # every open window (a record has a copy on every side topic or on none), final estimates
                self._publish(self.processor.flush(partial_kmeans=False), 0, self.mixer.flush())
                self._flush()
                self._producer.flush()  # the outbox tombstones
        except (BrokerUnavailableError, ProducerFatalError, MessageRejectedError, KafkaError) as e:
            log.warning("side paths: final estimates not published: %r", e)  # recomputed next time
            closing.broker_silent()  # the broker did not answer: do not wait for it again
        if self._poller is not None:
            self._poller.close(closing.consumer_seconds)
        if self._producer is not None:
            self._producer.close(closing.producer_seconds)
        self._close_admin()
        self.status.finished.set()
        shown = {k: v for k, v in self.status.summary().items() if k != "estimates"}
        for key in ("epsilon_kmeans_window", "epsilon_all_side_topics"):  # eps at 4 decimals, not 17 digits
            shown[key] = format_epsilon(shown[key])
        shown["epsilon_per_record"] = format_epsilons(shown["epsilon_per_record"])
        log.info("side paths stopped: %s", shown)


def run_side_paths(cfg: Config, metrics: ServiceMetrics | None = None, stop_event: threading.Event | None = None,
                   *, schema: Schema | None = None, status: SideStatus | None = None,
                   rng: np.random.Generator | int | None = None, new_budget: bool = False) -> int:
    """Run the side paths until ``stop_event`` is set (call it in a thread: ``threading.Thread(target=
    run_side_paths, args=(cfg, metrics, stop_event))``).  Pass a :class:`SideStatus` to follow progress
    (``ready``, ``finished``, ``processed``, ``published``, ``estimates``).  Returns 0, or 3 when the broker is
    unreachable, 1 on an unexpected error (logged; the main path is not affected), 2 when the budget is refused: its
    state is missing, tombstoned, older than its anchor or unreadable (one ERROR line naming the topic, the key and
    ``--new-budget``; ``new_budget`` starts a new budget generation instead).  The config was validated when it was
    loaded (the side-path options included); a config built otherwise and found invalid here returns 2 too."""
    try:
        app = SidePathApp(cfg, metrics, stop_event, schema=schema, status=status, rng=rng, new_budget=new_budget)
    except ValueError as e:  # SidePathConfigError, PrivacyParameterError, SchemaError
        log.error("side paths not started: %s", e)
        if status is not None:
            status.error = str(e)
            status.finished.set()
        return 2
    return app.run()
