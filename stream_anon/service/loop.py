"""One run of the main path's loop, with its clients (built by :meth:`stream_anon.service.app.MainPath.run`).

Each iteration: poll a batch -> the partition's pipeline (inline or in a worker process); the finished batches'
ledger entries -> the ledger (step 1) and, once acknowledged, their outputs (step 2: :mod:`~stream_anon.service.
outbox`); every ``service.commit_interval_ms`` steps 3-5 and, once confirmed, step 6
(:mod:`~stream_anon.service.committer`); the broker's health (:mod:`~stream_anon.service.broker_health`).  Class
entries wait for the end of their release tick before step 1 (:mod:`~stream_anon.service.ticks`).

A partition's first records start its recovery (:meth:`MainLoop._start_offset`,
:class:`~stream_anon.service.recovery.PartitionRecovery`).  On revoke: finish in-flight batches, steps 1-4, commit
the revoked partitions' watermarks asynchronously, drop their state (the new owner recovers from the ledger).  A
producer that cannot deliver is closed and created anew and every owned partition recovers from the ledger
(:meth:`MainLoop._recreate_producers`), as long as :class:`~stream_anon.service.failure_policy.ProducerFailurePolicy`
allows.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
from kafka.errors import KafkaError

from stream_anon.config.settings import Config
from stream_anon.core.schema import Schema
from stream_anon.kafka_io.clients import retry
from stream_anon.kafka_io.errors import BrokerUnavailableError, MessageRejectedError, ProducerFatalError
from stream_anon.kafka_io.lifecycle import StopClock
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.service.clients import LOOP_REQUEST_TIMEOUT_MS, MainClients
from stream_anon.service.committer import CommitProgress, Committer
from stream_anon.service.failure_policy import ProducerFailurePolicy
from stream_anon.service.ledger_state import RecoveryPlan
from stream_anon.service.liveness import LagMonitor, LoopHeartbeat, LoopView
from stream_anon.service.outbox import LedgerOutbox
from stream_anon.service.partitions import OwnedPartition, PartitionTable, SeekBack
from stream_anon.service.recovery import PartitionRecovery
from stream_anon.service.ticks import ReleaseTicks
from stream_anon.service.totals import BatchAccounting, MainPathTotals
from stream_anon.service.workers import (
    WORKER_CHUNK_RECORDS,
    Backend,
    CreatePartition,
    ExpirePartition,
    FlushPartition,
    ProcessBatch,
    RawMessage,
    WorkerError,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

FINAL_COLLECT_SECONDS = 0.5
"""On the stop path, at least this long for the pipeline workers to hand back the batches they hold (they are local:
a batch takes milliseconds), even when the stop grace is over."""


class LoopOwner(Protocol):
    """What the loop reads and updates of the main path that runs it (:class:`~stream_anon.service.app.MainPath`):
    the state that outlives one run and what callers watch."""

    cfg: Config
    schema: Schema
    metrics: ServiceMetrics
    table: PartitionTable
    totals: MainPathTotals
    progress: CommitProgress
    heartbeat: LoopHeartbeat
    stop_event: threading.Event
    stop_clock: StopClock
    ready: threading.Event
    assigned: threading.Event
    view: LoopView
    release_rng: np.random.Generator


@dataclass(frozen=True)
class Unreadable:
    """A record the consumer could not read (reason ``corrupt_record``, or ``oversized`` when too large to receive):
    only its position is known."""

    offset: int
    reason: str
    error: str


class MainLoop:
    """The loop of one run (see the module docstring); its clients exist for the whole run."""

    def __init__(self, main: LoopOwner, clients: MainClients, backend: Backend) -> None:
        self.main = main
        self.cfg: Config = main.cfg
        self.clients = clients
        self.backend = backend
        self.table = main.table
        self.poller, self.health, self.producers = clients.poller, clients.health, clients.producers
        topics = clients.topics
        self.outbox = LedgerOutbox(self.table, self.producers, topics, on_answer=self.health.answered)
        self.committer = Committer(self.table, self.outbox, self.producers, self.poller, topics,
                                   on_answer=self.health.answered, on_ledger=self.health.note_ledger,
                                   on_committed=self._committed, progress=main.progress)
        self.recovery = PartitionRecovery(self.table, self.producers, clients.reader, topics,
                                          group=self.cfg.kafka.group_id, chunk=self.cfg.service.readback_chunk,
                                          retry=self._retry, on_ledger=self.health.note_ledger,
                                          confirm_seconds=self.cfg.service.loss_confirm_seconds)
        self.accounting = BatchAccounting(main.totals, main.metrics, input_topic=topics.input, anon_topic=topics.roles[
            "anon"])
        self.lag = LagMonitor(self.cfg, main.metrics, lambda: main.view)
        # an output topic this member never wrote to that is deleted or recreated lost nothing (broker_guard)
        self._written_roles: set[str] = set()
        self.health.guard.unwritten_outputs = frozenset(topics.roles.values())
        self.health.guard.unwritten = self._unwritten
        self.ticks = ReleaseTicks(self.cfg.release.tick_seconds, main.release_rng)
        self.closing_down = False  # the final commit is done: a revoke while the consumer closes has nothing to do
        self.broker_silent = False  # the stop path's commit was not answered: no client waits for the broker again

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        """Until the service is told to stop; raises what ends the run (``MainPath.run`` maps it to an exit code)."""
        self.lag.start()  # (first: the stop path stops it whatever happens next)
        self.main.heartbeat.watch(self.lag)  # /healthz also says when no progress is made (lag, a silent broker)
        self.poller.subscribe(on_assigned=self._on_assigned, on_revoked=self._on_revoked)
        cfg, a = self.cfg, self.cfg.anonymization
        req = a.requirement(self.main.schema)
        log.info("main path: consuming %s as group %r (k=%d, %s, delta=%d, beta=%d) -> %s (%s), %s, %s; ledger %s",
                 cfg.topics.input, cfg.kafka.group_id, a.k, req.describe() if req is not None else "no diversity",
                 a.delta, a.beta, cfg.topics.anon, f"classes released every {cfg.release.tick_seconds:g} s"
                 if self.ticks.enabled else "classes released at once", cfg.topics.suppressed, cfg.topics.dlq,
                 self.clients.topics.ledger)
        self.main.ready.set()
        self._run_recovering()

    def _run_recovering(self) -> None:
        """The loop; a producer that cannot deliver is recreated and the partitions recovered from the ledger, as
        long as the failure policy allows (an outage never counts; a commit of progress starts a new row)."""
        progress = self.main.progress
        policy = ProducerFailurePolicy(progress=progress.made)
        error: ProducerFatalError | None = None
        while True:
            try:
                if error is not None:
                    self._recreate_producers(error)
                    error = None
                self._loop()
                return
            except ProducerFatalError as e:
                if self.main.stop_event.is_set():
                    raise
                answered = self.health.check_data(force=True)  # the broker answers (and kept its data)
                policy.failed(progress=progress.made, broker_answered=answered)
                if policy.exhausted:
                    raise ProducerFatalError(f"{e}; {policy.in_row} producer failures in a row with no progress "
                                             f"committed between them: creating the producers anew did not help") from e
                error = e

    def _loop(self) -> None:
        cfg, main = self.cfg, self.main
        commit_every = cfg.service.commit_interval_ms / 1000.0
        last_commit = time.monotonic()
        while not main.stop_event.is_set():
            main.heartbeat.tick()
            batch = self.poller.poll(self._poll_timeout_ms(), self._on_unreadable)
            now = time.time()
            if batch:
                self.health.answered()
            for p, recs in batch.items():
                if recs:
                    self._submit(p, recs, now)
            self._expire_and_flush(now)
            self.outbox.send_acknowledged()  # step 2 for what was acknowledged meanwhile, before waiting for a worker
            if not batch and self.backend.pending_records:  # no input: wait for the busy worker (the poll did not wait)
                self.backend.wait(cfg.service.poll_timeout_ms / 1000.0, idle=self._send_acknowledged)
            self._collect(wait_all=False)  # step 1 (waits while a worker has too many batches: backpressure)
            self._release_held(self.table, time.time())  # step 1 for the classes of the ticks that ended
            main.view = LoopView(main.view.assigned, self.table.positions())
            self.outbox.send_acknowledged(wait=not batch)  # step 2
            self.committer.write_tombstones()  # step 6 (commits confirmed during the poll)
            if time.monotonic() - last_commit >= commit_every:
                self.committer.commit()  # steps 3-5
                last_commit = time.monotonic()
            self.health.check_broker_when_due()
            self.health.check_data()

    def finish(self, *, clean: bool) -> bool:
        """The stop path: when ``clean``, the last entries and outputs, checkpoints and a final synchronous commit
        (bounded by what is left of the stop grace); False if the broker was unreachable.  The clients are
        closed afterwards, by the stack they were entered into."""
        self.lag.stop()
        self.main.heartbeat.watch(None)
        ok = True
        clock = self.main.stop_clock
        try:
            if clean:
                self._collect(wait_all=True, timeout=max(FINAL_COLLECT_SECONDS, clock.remaining()))
                self._release_held(self.table, None)  # the unfinished tick, at once (stamped with its end)
                if not self.committer.commit(sync_timeout_s=min(self.cfg.kafka.request_timeout_ms / 1000.0,
                                                                max(0.5, clock.remaining()))):
                    self.broker_silent = True  # its checkpoint is acknowledged: the next start begins there
                self.committer.write_tombstones()
                self.producers.ledger.flush()
        except BrokerUnavailableError as e:
            ok = False
            log.error("%s; stopping without committing them (a restart recovers from the ledger)", e)
        except WorkerError as e:  # a worker that does not hand back its batches: nothing more is committed
            ok = False
            log.error("%s; stopping without the final commit (a restart recovers from the ledger)", e)
        except (KafkaError, ProducerFatalError, MessageRejectedError) as e:
            self.broker_silent = True
            log.warning("final commit failed: %r (the next start recovers from the ledger)", e)
        self.closing_down = True
        return ok

    # ------------------------------------------------------------------ input
    def _submit(self, partition: int, recs: Sequence[Any], now: float) -> bool:
        """Hand consumed records (polled records or :class:`Unreadable`) of one partition to its pipeline (in
        chunks of ``WORKER_CHUNK_RECORDS``), recovering the partition first when it is new.  False: they were not
        taken (the consumer was moved back to the partition's start; they come again)."""
        if partition not in self.table:
            start = self._start_offset(partition, recs[0].offset)
            if start is None:
                return False
            recs = [r for r in recs if r.offset >= start]
            if not recs:
                return True
        msgs: tuple[RawMessage, ...] = tuple(
            (r.offset, None, None, (), None, (r.reason, r.error)) if isinstance(r, Unreadable)
            else (r.offset, r.value, r.key, r.headers, r.timestamp, None) for r in recs)
        for i in range(0, len(msgs), WORKER_CHUNK_RECORDS):
            self.backend.submit(ProcessBatch(partition, msgs[i:i + WORKER_CHUNK_RECORDS], now))
        owned = self.table.get(partition)
        if owned is not None:
            owned.last_input = now
        return True

    def _on_unreadable(self, partition: int, offset: int, reason: str, error: str) -> bool:
        """A record the consumer cannot read: dead-lettered by position with ``reason``."""
        log.error("partition %d: the record at offset %d cannot be read (%s): dead-lettered as %s, skipping it",
                  partition, offset, error, reason)
        return self._submit(partition, [Unreadable(offset, reason, error)], time.time())

    def _expire_and_flush(self, now: float) -> None:
        """Time-based releases: the engine's delay in seconds, and the idle flush of a quiet partition."""
        expire = self.cfg.anonymization.max_delay_seconds is not None
        idle = self.cfg.service.idle_flush_seconds
        for owned in self.table:
            if not owned.buffered:
                continue
            if expire:
                self.backend.submit(ExpirePartition(owned.partition, now))
            if idle > 0 and owned.idle_for(now) >= idle:
                log.info("partition %d idle for %.1f s: flushing %d buffered records", owned.partition, idle,
                         owned.buffered)
                self.backend.submit(FlushPartition(owned.partition, now))
                owned.last_input = now

    def _collect(self, *, wait_all: bool, timeout: float | None = None) -> None:
        """Step 1 for the finished batches: their ledger entries go to the ledger; take over the partitions' new
        watermarks.  ``timeout``: a worker that does not answer within it raises :class:`WorkerError`."""
        for res in self.backend.results(wait_all=wait_all, timeout=timeout, idle=self._send_acknowledged):
            owned = self.table.get(res.partition)
            if owned is not None:
                owned.report(watermark=res.watermark, next_offset=res.next_offset, buffered=res.buffered,
                             open_clusters=res.open_clusters, horizon=res.horizon)
            entries = self.ticks.hold(owned, res.entries, time.time()) if res.entries else res.entries
            if entries:
                self.outbox.write(res.partition, entries)
            self.accounting.record(res, owned)

    def _send_acknowledged(self) -> bool:
        """Step 2 while the loop waits for a busy worker; whether outputs still wait for their entries."""
        self.outbox.send_acknowledged()
        return self.outbox.waiting

    def _unwritten(self, topic: str) -> bool:
        """Whether no owned partition ever had an output of ``topic``'s role acknowledged (this incarnation or an
        earlier one, through the checkpoint ends recovery read); sticky once written."""
        role = self.clients.topics.role_of.get(topic)
        if role is None:
            return False
        self._written_roles.update(r for o in self.table for r, end in o.outbox.ends.items() if end > 0)
        return role not in self._written_roles

    def _release_held(self, owned: Iterable[OwnedPartition], now: float | None) -> None:
        """Step 1 for the held classes of the ticks that ended by ``now`` (None: all of them)."""
        for o, entries in self.ticks.due(owned, now):
            self.outbox.write(o.partition, entries)

    def _poll_timeout_ms(self) -> int:
        """No wait while outputs wait for their entries or a worker processes records (the loop waits for it instead);
        else the poll timeout, or less when a tick ends sooner."""
        if self.outbox.waiting or self.backend.pending_records:
            return 0
        timeout = self.cfg.service.poll_timeout_ms
        until_tick = self.ticks.seconds_to_next(self.table, time.time())
        return timeout if until_tick is None else min(timeout, math.ceil(until_tick * 1000))

    def _committed(self, partition: int, offset: int) -> None:
        self.health.note_committed(partition, offset)
        self.main.metrics.commit_watermark.labels(topic=self.clients.topics.input,
                                                  partition=str(partition)).set(offset)

    # ------------------------------------------------------------------ partitions
    def _start_offset(self, partition: int, first_offset: int) -> int | None:
        """Recover a new partition and return the offset its pipeline starts at (records below it are already
        accounted), or None after seeking the consumer back to that offset (the records come again).

        The start is the recovery plan's: max(committed offset, last checkpoint's watermark); with neither, the
        consumer's reset position (``first_offset``).  kafka-python keeps the fetch position of a partition
        revoked and assigned again to the same member, but the revoke dropped the state: then the position is
        past the start, so seek back once.  Offsets below the first available one (retention) start at it.
        """
        seek = self.table.seeking.pop(partition, None)
        plan = seek.plan if seek is not None else self._plan(partition)
        target = plan.start_offset if plan.start_offset is not None else first_offset
        if first_offset > target and (seek is None or seek.target != target):
            self.table.seeking[partition] = SeekBack(plan, target)
            log.info("partition %d: position %d is past the start %d (state dropped at a rebalance): seeking back",
                     partition, first_offset, target)
            self.poller.seek(partition, target)
            return None
        start = max(first_offset, target)
        self._start_partition(partition, plan, start)
        return start

    def _plan(self, partition: int) -> RecoveryPlan:
        log.info("partition %d: recovering from the ledger", partition)
        self.health.check_data(force=True)  # a new partition may be the first sign of a recreated topic
        timeout_ms = min(self.cfg.kafka.request_timeout_ms, LOOP_REQUEST_TIMEOUT_MS)
        committed = self._retry(f"partition {partition}: committed offset",
                                lambda: self.poller.committed(partition, timeout_ms))
        self.health.check_committed(partition, committed, self.cfg.kafka.group_id)
        return self.recovery.plan(partition, committed)

    def _start_partition(self, partition: int, plan: RecoveryPlan, start: int) -> None:
        """Recovery steps d-e, then the partition's pipeline from ``start``."""
        rec = self.recovery.recover(partition, plan, start)
        self.backend.create(CreatePartition(partition, start, rec.accounted, rec.owned.horizon,
                                            rec.owned.incarnation))
        self.accounting.recovered(partition, rec.resent)

    def _recover_now(self, partition: int) -> None:
        """Recover an assigned partition without waiting for its records: plan, seek the consumer to its start."""
        plan = self.recovery.plan(partition, self._committed_offset(partition))
        start = plan.start_offset if plan.start_offset is not None else self._first_offset(partition)
        self.poller.seek(partition, start)
        self._start_partition(partition, plan, start)

    def _committed_offset(self, partition: int) -> int | None:
        return self._retry(f"partition {partition}: committed offset",
                           lambda: self.poller.committed(partition, self.cfg.kafka.request_timeout_ms))

    def _first_offset(self, partition: int) -> int:
        input_topic = self.clients.topics.input
        return self._retry(f"partition {partition}: first offset",
                           lambda: self.clients.reader.bounds(input_topic, partition)[0])

    def _rewind(self, partition: int) -> None:
        """Move an assigned partition that is not started back to where its recovery may begin (the committed
        offset, or the first one): records polled for it may have been dropped when its recovery failed (a
        producer failure raised by the fence's or first checkpoint's flush ends the poll's batch); its next
        records start the recovery again (:meth:`_start_offset` skips what the plan says is accounted)."""
        committed = self._committed_offset(partition)
        self.poller.seek(partition, committed if committed is not None else self._first_offset(partition))

    def _recreate_producers(self, error: BaseException) -> None:
        """A producer cannot deliver: abandon both producers and what they hold, create new ones, and recover
        every owned partition from the ledger now (the outputs it promised and that are missing are re-sent byte
        for byte, records without an acknowledged entry are consumed and processed again); every other assigned
        partition is rewound (:meth:`_rewind`: the one whose recovery the failure interrupted lost its polled
        records)."""
        t0 = time.monotonic()
        owned = self.table.partitions()
        log.warning("%s: closing the ledger and output producers and creating new ones; partitions %s recover from "
                    "the ledger", error, owned)
        for _ in self.backend.results(wait_all=True):
            pass  # abandoned: their records are consumed again
        self.backend.drop(owned)
        self.table.clear()
        self.outbox.abandon()
        self.producers.recreate()
        self.main.totals.producer_recreations += 1
        assigned = self.poller.assignment()
        for p in sorted(assigned):
            if p in owned:
                self._recover_now(p)
            else:
                self._rewind(p)
        log.warning("producers created anew and partitions %s recovered from the ledger in %.2f s",
                    self.table.partitions(), time.monotonic() - t0)

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        """``retry`` for calls of the running loop: until the broker answers (no time limit), or until stopped
        (then :class:`BrokerUnavailableError`: ``run`` exits 3 without committing).  Each failed attempt also asks
        the broker guard: a topic that is gone or was recreated raises :class:`BrokerDataLossError` (exit 4)
        instead of retrying a read of it forever (topics are never auto-created by the service's clients); and
        ticks the loop's heartbeat (alive, waiting for the broker)."""
        guard = self.health.guard

        def on_retry() -> None:
            self.main.heartbeat.tick()
            guard.check_topics()  # raises on a gone or recreated topic; an unanswered request is the retry's

        return retry(what, fn, self.cfg.kafka, stop=self.main.stop_event.is_set, limit_seconds=0,
                     on_retry=on_retry)

    # ------------------------------------------------------------------ rebalances
    def _on_assigned(self, partitions: set[int]) -> None:
        log.info("assigned partitions %s", sorted(partitions))
        view = self.main.view
        self.main.view = dataclasses.replace(view, assigned=view.assigned | frozenset(partitions))
        self.main.assigned.set()

    def _on_revoked(self, partitions: list[int]) -> None:
        """Rebalance: finish in-flight batches, steps 1-4, commit what is safe for the revoked partitions (async:
        no blocking consumer call), drop their state.  What this raises is raised after the poll (it ends the
        loop: recovery or exit); the partitions' state is dropped either way."""
        view = self.main.view
        self.main.view = dataclasses.replace(view, assigned=view.assigned - frozenset(partitions))
        try:
            self._revoke(partitions)
        except Exception as e:
            log.warning("partitions %s revoked while %r: their state is dropped without a commit (the next owner "
                        "recovers them from the ledger)", partitions, e)
            self._drop(partitions)
            raise

    def _revoke(self, partitions: list[int]) -> None:
        owned = self.table.owned_of(partitions)
        for p in partitions:
            self.table.seeking.pop(p, None)
        if not owned or self.closing_down:  # closing: the final commit covered them already
            return
        self._collect(wait_all=True)
        self._release_held([o for o in self.table if o.partition in owned], None)
        self.committer.commit_revoked(owned)
        for o in self._drop(owned):
            log.info("partition %d revoked: committed watermark %d, dropped %d buffered records (the new owner "
                     "recovers them from the ledger)", o.partition, o.watermark, o.buffered)
            self.accounting.revoked(o.partition)

    def _drop(self, partitions: list[int]) -> list[OwnedPartition]:
        dropped = self.table.drop(partitions)
        self.backend.drop([o.partition for o in dropped])
        return dropped
