"""Where the pure per-partition pipelines run: in the service's own thread, or in worker processes.

The Kafka loop (``loop.MainLoop``) talks to a :class:`Backend`: ``create`` a partition's pipeline, ``submit`` work
(:class:`ProcessBatch`, :class:`FlushPartition`, :class:`ExpirePartition`), collect :class:`PartitionResult` s in
submission order (per partition), ``drop`` partitions.  With ``service.workers >= 1`` the pipelines (decode,
validate, engine, encode: the CPU-heavy part) run in that many child processes (partition p in worker p mod n), so
they overlap with the Kafka I/O of the main process instead of sharing its GIL; requests and results cross the
pipes as the dataclasses below.  ``service.workers = 0`` runs them inline (same code, same results).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as mp_wait
from multiprocessing.process import BaseProcess
from typing import Protocol

from stream_anon.config.settings import Config
from stream_anon.core.engine import warm_up
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema
from stream_anon.kafka_io.lifecycle import CLOSE_TIMEOUT_SECONDS, as_service_child
from stream_anon.service.ledger import EntryFactory, LedgerEntry
from stream_anon.service.pipeline import (
    BatchResult,
    BatchStats,
    InputMessage,
    PartitionPipeline,
    PipelineSettings,
)
from stream_anon.service.wiring import load_schema, make_engine_factory, make_entry_factory, pipeline_settings

log = logging.getLogger(__name__)

RawMessage = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int | None,
                   tuple[str, str] | None]
"""(offset, value, key, headers, timestamp_ms, unreadable) of one input message (cheap to pickle); ``unreadable``:
(reason, the client's error) for a record it could not read (value, key and headers are then None/empty)."""

IDLE_SLICE_SECONDS = 0.005
"""While the loop waits for a busy worker (backpressure), how often it sends the outputs whose ledger entries were
acknowledged meanwhile: without it they waited for the worker's whole batch (the release-to-publish latency)."""

WORKER_CHUNK_RECORDS = 500
"""The loop hands a poll's records of one partition to its worker in chunks of at most this many, and writes each
chunk's ledger entries (then sends its outputs) as soon as that chunk is processed: a class released early in a
large poll (up to ``kafka.max_poll_records``) does not wait for the rest of the poll to be processed."""

MAX_IN_FLIGHT = 3
"""Requests (chunks of records, mostly) a worker may hold before the loop waits for it (backpressure): after the
wait at most two wait there (up to 1,000 records: work for the worker while the loop commits and polls).  The
loop polls again only then, so what arrives meanwhile comes as one larger chunk, not as many small ones (each
costs a round trip and its own entries)."""

STOP_SLICE_SECONDS = 0.2
"""While the loop waits for a busy worker with nothing else to do, how often it looks whether the service stops."""

EntryFactoryMaker = Callable[[int, str], EntryFactory]
"""(partition, incarnation) -> the partition's :class:`EntryFactory` (``wiring.make_entry_factory``)."""


# ---------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class CreatePartition:
    """Build a partition's pipeline starting at ``start`` (after the recovery scan of its ledger partition)."""

    partition: int
    start: int
    accounted: tuple[int, ...]  # offsets >= start the ledger already accounts for (skipped)
    horizon: int
    incarnation: str


@dataclass(frozen=True)
class ProcessBatch:
    """Consecutive input messages of one partition."""

    partition: int
    messages: tuple[RawMessage, ...]
    now: float


@dataclass(frozen=True)
class FlushPartition:
    """Release or suppress everything the partition buffers (idle flush)."""

    partition: int
    now: float


@dataclass(frozen=True)
class ExpirePartition:
    """Apply the engine's wall-clock bound without an arrival."""

    partition: int
    now: float


@dataclass(frozen=True)
class DropPartitions:
    partitions: tuple[int, ...]


@dataclass(frozen=True)
class StopWorker:
    pass


Work = ProcessBatch | FlushPartition | ExpirePartition
Request = CreatePartition | Work | DropPartitions | StopWorker


@dataclass
class PartitionResult:
    """Outcome of one submitted batch: ledger entries to write (each with the output it promises), stats, and
    the partition's state after it."""

    partition: int
    entries: list[LedgerEntry]
    stats: BatchStats
    elapsed: float
    n_messages: int
    watermark: int
    buffered: int
    open_clusters: int
    next_offset: int
    horizon: int


@dataclass(frozen=True)
class WorkerFailure:
    """A request failed in a worker (the service then stops; a restart recovers from the watermarks)."""

    request: str
    error: str


class WorkerError(RuntimeError):
    """A pipeline worker process failed or died."""


class Backend(Protocol):
    """Where the partition pipelines run (:class:`InlineBackend`, :class:`ProcessBackend`)."""

    @property
    def pending(self) -> int:
        """Work submitted whose result was not collected yet."""
        ...

    @property
    def pending_records(self) -> int:
        """Input messages submitted (:class:`ProcessBatch`) whose results were not collected yet."""
        ...

    def create(self, request: CreatePartition) -> None: ...

    def submit(self, work: Work) -> None: ...

    def results(self, *, wait_all: bool = False, timeout: float | None = None,
                idle: Callable[[], bool] | None = None) -> Iterator[PartitionResult]:
        """Results of finished work, in submission order per partition, each handed out as soon as it is there
        (the caller writes its ledger entries before the next wait); ``wait_all``: of all submitted work;
        ``timeout``: raise :class:`WorkerError` rather than wait longer.  ``idle``: called every
        ``IDLE_SLICE_SECONDS`` while the backpressure wait lasts (the loop sends the outputs whose ledger entries
        were acknowledged meanwhile); it returns whether it still waits for something (else the wait is coarser).
        A result not taken yet when the caller stops iterating stays for the next call."""
        ...

    def wait(self, timeout_s: float, *, idle: Callable[[], bool] | None = None) -> bool:
        """Wait up to ``timeout_s`` for a result of a worker processing records (calling ``idle`` meanwhile, as
        :meth:`results`); False at once when none is.  The loop waits here, not in the consumer's
        poll, when no input came and a worker is busy: a chunk's entries are written as soon as it is done."""
        ...

    def drop(self, partitions: Iterable[int]) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------------------------- executors
class Pipelines:
    """The partition pipelines of one executor (inline or inside a worker process)."""

    def __init__(self, schema: Schema, settings: PipelineSettings, engine_factory: Callable[[int], EngineLike],
                 entry_factory: EntryFactoryMaker) -> None:
        self.schema = schema
        self.settings = settings
        self.engine_factory = engine_factory
        self.entry_factory = entry_factory
        self.pipes: dict[int, PartitionPipeline] = {}
        warm_up()  # the engine's compiled pass loaded now, not while a partition's first records wait (1-2 s)

    def create(self, r: CreatePartition) -> None:
        self.pipes[r.partition] = PartitionPipeline(
            r.partition, self.schema, self.engine_factory(r.partition), self.settings,
            entries=self.entry_factory(r.partition, r.incarnation), start_offset=r.start, accounted=r.accounted,
            horizon=r.horizon)

    def run(self, work: Work) -> PartitionResult:
        pipe = self.pipes[work.partition]
        t0 = time.perf_counter()
        res: BatchResult
        match work:
            case ProcessBatch(messages=msgs, now=now):
                res = pipe.process([InputMessage(o, v, k, h, ts) if bad is None else
                                    InputMessage(o, v, k, h, ts, bad[1], bad[0]) for o, v, k, h, ts, bad in msgs], now)
                n = len(msgs)
            case FlushPartition(now=now):
                res, n = pipe.flush(now), 0
            case ExpirePartition(now=now):
                res, n = pipe.expire(now), 0
        return PartitionResult(work.partition, res.entries, res.stats, time.perf_counter() - t0, n, pipe.watermark,
                               pipe.buffered, pipe.engine.open_clusters, pipe.next_offset, pipe.horizon)

    def drop(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.pipes.pop(p, None)


class InlineBackend:
    """Pipelines in the calling thread (``service.workers = 0``)."""

    def __init__(self, schema: Schema, settings: PipelineSettings, engine_factory: Callable[[int], EngineLike],
                 entry_factory: EntryFactoryMaker) -> None:
        self._p = Pipelines(schema, settings, engine_factory, entry_factory)
        self._ready: deque[PartitionResult] = deque()

    @property
    def pending(self) -> int:
        return len(self._ready)

    @property
    def pending_records(self) -> int:
        return sum(r.n_messages for r in self._ready)

    def create(self, request: CreatePartition) -> None:
        self._p.create(request)

    def submit(self, work: Work) -> None:
        self._ready.append(self._p.run(work))

    def results(self, *, wait_all: bool = False, timeout: float | None = None,
                idle: Callable[[], bool] | None = None) -> Iterator[PartitionResult]:
        while self._ready:
            yield self._ready.popleft()

    def wait(self, timeout_s: float, *, idle: Callable[[], bool] | None = None) -> bool:
        return bool(self._ready)  # inline work is done when submitted

    def drop(self, partitions: Iterable[int]) -> None:
        self._p.drop(partitions)

    def close(self) -> None:
        self._p.pipes.clear()


def _worker_main(cfg: Config, requests: Connection, results: Connection) -> None:
    """Child process: build the schema/engine/entry factories from the config (its ``release.secret`` resolved by
    the parent), then serve requests until :class:`StopWorker` or until the request pipe closes (the parent is
    gone).

    Results go out through a sender thread, so this loop keeps reading requests while a large result is
    being written (two blocking writers on the two pipes could otherwise wait for each other forever).
    """
    parent = mp.parent_process()
    as_service_child(parent.pid if parent is not None else None)  # never outlives the service (kill -9 included)
    outbox: queue.Queue[PartitionResult | WorkerFailure | None] = queue.Queue()

    def sender() -> None:
        while True:
            item = outbox.get()
            if item is None:
                return
            try:
                results.send(item)
            except (OSError, ValueError):
                return

    th = threading.Thread(target=sender, daemon=True)
    th.start()
    schema = load_schema(cfg)
    pipes = Pipelines(schema, pipeline_settings(cfg), make_engine_factory(cfg, schema),
                      make_entry_factory(cfg, schema))
    try:
        while True:
            try:
                req: Request = requests.recv()
            except (EOFError, OSError):
                return
            try:
                match req:
                    case StopWorker():
                        return
                    case CreatePartition():
                        pipes.create(req)
                    case DropPartitions(partitions=ps):
                        pipes.drop(ps)
                    case _:
                        outbox.put(pipes.run(req))
            except Exception as e:  # report any failure to the parent, which stops (a restart recovers)
                log.exception("pipeline worker: %s failed", type(req).__name__)
                outbox.put(WorkerFailure(type(req).__name__, repr(e)))
    finally:
        outbox.put(None)
        th.join(10)


def wait_for_results(conns: Sequence[Connection], *, timeout_s: float | None = None,
                     idle: Callable[[], bool] | None = None, stop: Callable[[], bool] | None = None) -> bool:
    """Wait until a result is on one of ``conns`` (the loop's waits for busy workers), in slices:
    ``IDLE_SLICE_SECONDS`` while ``idle`` (called before each slice) says it still waits for something, else
    ``STOP_SLICE_SECONDS``.  True once a result is there; False as soon as ``stop`` says the service stops, or when
    ``timeout_s`` passed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    busy = idle is not None and idle()
    while True:
        slice_s = IDLE_SLICE_SECONDS if busy else STOP_SLICE_SECONDS
        if deadline is not None:
            slice_s = min(slice_s, deadline - time.monotonic())
            if slice_s <= 0:
                return False
        if mp_wait(conns, slice_s):
            return True
        if stop is not None and stop():
            return False
        busy = idle is not None and idle()


class ProcessBackend:
    """Pipelines in ``n`` worker processes; at most ``max_in_flight`` batches outstanding per worker.

    Requests go to each worker through a sender thread (a queue, then its pipe), so the loop never blocks on a pipe
    that a busy or frozen worker does not read: only :meth:`results` waits for a worker, and that wait looks at
    ``stop`` (a stop is never held by a worker)."""

    def __init__(self, cfg: Config, n: int, max_in_flight: int = MAX_IN_FLIGHT, *,
                 stop: Callable[[], bool] | None = None) -> None:
        ctx = mp.get_context("spawn")
        self.stop = stop  # true: a wait for a busy worker (backpressure) ends at once (the stop path takes over)
        self.n = n
        self.max_in_flight = max_in_flight
        self._conns: list[Connection] = []
        self._procs: list[BaseProcess] = []
        self._in_flight: list[int] = [0] * n
        self._sizes: list[deque[int]] = [deque() for _ in range(n)]  # messages of each request in flight, in order
        self._records_in_flight: list[int] = [0] * n
        self._results: list[Connection] = []
        for i in range(n):
            req_read, req_write = ctx.Pipe(duplex=False)
            res_read, res_write = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker_main, args=(cfg, req_read, res_write), name=f"stream-anon-pipeline-{i}",
                               daemon=True)
            proc.start()
            req_read.close()
            res_write.close()
            self._conns.append(req_write)
            self._results.append(res_read)
            self._procs.append(proc)
        self._outbox: list[queue.Queue[object]] = [queue.Queue() for _ in range(n)]
        for i in range(n):
            threading.Thread(target=self._send_loop, args=(i,), name=f"pipeline-{i}-requests", daemon=True).start()
        log.info("pipelines run in %d worker process(es): %s", n, [p.pid for p in self._procs])

    def _send_loop(self, w: int) -> None:
        """Sender thread of worker ``w``: its requests, in order, into its pipe (ends on None or a broken pipe)."""
        q, conn = self._outbox[w], self._conns[w]
        while True:
            item = q.get()
            if item is None:
                return
            try:
                conn.send(item)
            except (OSError, ValueError):  # the worker is gone: its results pipe tells the loop (WorkerError)
                return

    def _send(self, w: int, request: object) -> None:
        self._outbox[w].put(request)

    def _w(self, partition: int) -> int:
        return partition % self.n

    @property
    def pending(self) -> int:
        return sum(self._in_flight)

    @property
    def pending_records(self) -> int:
        return sum(self._records_in_flight)

    def create(self, request: CreatePartition) -> None:
        self._send(self._w(request.partition), request)

    def submit(self, work: Work) -> None:
        w = self._w(work.partition)
        self._send(w, work)
        self._in_flight[w] += 1
        n = len(work.messages) if isinstance(work, ProcessBatch) else 0
        self._sizes[w].append(n)
        self._records_in_flight[w] += n

    def _recv(self, w: int) -> PartitionResult:
        try:
            msg: PartitionResult | WorkerFailure = self._results[w].recv()
        except (EOFError, OSError) as e:
            raise WorkerError(f"pipeline worker {w} (pid {self._procs[w].pid}) died: {e!r}") from e
        self._in_flight[w] -= 1
        self._records_in_flight[w] -= self._sizes[w].popleft()
        if isinstance(msg, WorkerFailure):
            raise WorkerError(f"pipeline worker {w}: {msg.request}: {msg.error}")
        return msg

    def results(self, *, wait_all: bool = False, timeout: float | None = None,
                idle: Callable[[], bool] | None = None) -> Iterator[PartitionResult]:
        """Results available now, one at a time (:meth:`Backend.results`); with ``wait_all`` every outstanding
        one; otherwise waits only while a worker has ``max_in_flight`` batches outstanding (backpressure), calling
        ``idle`` meanwhile.  ``timeout``: give up waiting after that many seconds (:class:`WorkerError`: a worker
        that does not answer, e.g. on the stop path)."""
        limit = self.max_in_flight - 1
        deadline = None if timeout is None else time.monotonic() + timeout
        for w, conn in enumerate(self._results):
            while self._in_flight[w] and (wait_all or self._in_flight[w] > limit or conn.poll()):
                if deadline is not None and not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise WorkerError(f"pipeline worker {w} (pid {self._procs[w].pid}) did not answer within "
                                      f"{timeout:.0f} s")
                if deadline is None and not wait_all and not wait_for_results([conn], idle=idle, stop=self.stop):
                    return  # stopping while a worker is busy: the stop path collects (bounded)
                yield self._recv(w)

    def wait(self, timeout_s: float, *, idle: Callable[[], bool] | None = None) -> bool:
        conns = [conn for w, conn in enumerate(self._results) if self._records_in_flight[w]]
        return bool(conns) and wait_for_results(conns, timeout_s=timeout_s, idle=idle, stop=self.stop)

    def drop(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._send(self._w(p), DropPartitions((p,)))

    def close(self) -> None:
        """Stop the workers: each finishes the batches it was given, then exits; results nobody collected any more
        are read and dropped meanwhile (a worker blocked on a full result pipe would never see its stop).  A worker
        that does not exit within ``CLOSE_TIMEOUT_SECONDS`` (e.g. frozen) is killed."""
        for w in range(self.n):
            self._send(w, StopWorker())
            self._send(w, None)
        deadline = time.monotonic() + CLOSE_TIMEOUT_SECONDS
        while any(p.is_alive() for p in self._procs) and time.monotonic() < deadline:
            for res in self._results:
                try:
                    while res.poll():
                        res.recv()
                except (EOFError, OSError):
                    pass
            for proc in self._procs:
                proc.join(0.02)
        for proc in self._procs:
            if proc.is_alive():  # it ignores SIGTERM (the parent decides): SIGKILL
                proc.kill()
                proc.join(2)
