"""Where the pure per-partition pipelines run: in the service's own thread, or in worker processes.

The Kafka loop (``app.MainPath``) talks to a *backend*: ``create`` a partition's pipeline, ``submit`` batches,
collect :class:`PartitionResult` s in submission order (per partition), ``drop`` partitions.  With
``service.workers >= 1`` the pipelines (decode, validate, engine, encode: the CPU-heavy part) run in that many
child processes (partition p in worker p mod n), so they overlap with the Kafka I/O of the main process
instead of sharing its GIL; results come back in order over a pipe.  ``service.workers = 0`` runs them
inline (same code, same results).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stream_anon.service.pipeline import (
    BatchResult,
    BatchStats,
    EngineLike,
    InputMessage,
    OutputMessage,
    PartitionPipeline,
    PipelineSettings,
)

log = logging.getLogger(__name__)

RawMessage = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes]], int | None]
"""(offset, value, key, headers, timestamp_ms) of one input message (cheap to pickle)."""


@dataclass
class PartitionResult:
    """Outcome of one submitted batch: outputs to produce, stats, and the partition's state after it."""

    partition: int
    outputs: list[OutputMessage]
    stats: BatchStats
    elapsed: float
    n_messages: int
    watermark: int
    buffered: int
    open_clusters: int
    next_offset: int


def _result(partition: int, pipe: PartitionPipeline, res: BatchResult, elapsed: float, n: int) -> PartitionResult:
    return PartitionResult(partition, res.outputs, res.stats, elapsed, n, pipe.watermark, pipe.buffered,
                           int(getattr(pipe.engine, "open_clusters", 0)), pipe.next_offset)


class _Pipelines:
    """The partition pipelines of one executor (inline or inside a worker process)."""

    def __init__(self, schema: Any, settings: PipelineSettings, engine_factory: Callable[[int], EngineLike]) -> None:
        self.schema = schema
        self.settings = settings
        self.engine_factory = engine_factory
        self.pipes: dict[int, PartitionPipeline] = {}

    def create(self, partition: int, start: int, released: Iterable[int], horizon: int, incarnation: str) -> None:
        self.pipes[partition] = PartitionPipeline(partition, self.schema, self.engine_factory(partition), self.settings,
                                                  incarnation=incarnation, start_offset=start,
                                                  already_released=released, horizon=horizon)

    def run(self, op: str, partition: int, msgs: Sequence[RawMessage], now: float) -> PartitionResult:
        pipe = self.pipes[partition]
        t0 = time.perf_counter()
        if op == "process":
            res = pipe.process([InputMessage(o, v, k, h, ts) for o, v, k, h, ts in msgs], now)
        elif op == "flush":
            res = pipe.flush(now)
        elif op == "expire":
            res = pipe.expire(now)
        else:
            raise ValueError(f"unknown pipeline operation {op!r}")
        return _result(partition, pipe, res, time.perf_counter() - t0, len(msgs))

    def drop(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self.pipes.pop(p, None)


class InlineBackend:
    """Pipelines in the calling thread (``service.workers = 0``)."""

    def __init__(self, schema: Any, settings: PipelineSettings, engine_factory: Callable[[int], EngineLike]) -> None:
        self._p = _Pipelines(schema, settings, engine_factory)
        self._ready: deque[PartitionResult] = deque()

    @property
    def pending(self) -> int:
        return len(self._ready)

    def create(self, partition: int, start: int, released: Iterable[int], horizon: int, incarnation: str) -> None:
        self._p.create(partition, start, released, horizon, incarnation)

    def submit(self, op: str, partition: int, msgs: Sequence[RawMessage], now: float) -> None:
        self._ready.append(self._p.run(op, partition, msgs, now))

    def results(self, *, wait_all: bool = False, max_pending: int = 0) -> list[PartitionResult]:
        out = list(self._ready)
        self._ready.clear()
        return out

    def drop(self, partitions: Iterable[int]) -> None:
        self._p.drop(partitions)

    def close(self) -> None:
        self._p.pipes.clear()


def _worker_main(cfg: Any, requests: Any, results: Any) -> None:
    """Child process: build the schema/engine factory from the config, then serve requests until 'stop'.

    Results go out through a sender thread, so this loop keeps reading requests while a large result is
    being written (two blocking writers on the two pipes could otherwise wait for each other forever).
    """
    import queue
    import signal
    import threading

    from stream_anon.service.app import load_schema, make_engine_factory, pipeline_settings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides

    outbox: queue.Queue[Any] = queue.Queue()

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
    pipes = _Pipelines(schema, pipeline_settings(cfg), make_engine_factory(cfg, schema))
    try:
        while True:
            try:
                req = requests.recv()
            except (EOFError, OSError):
                return
            cmd = req[0]
            try:
                if cmd == "stop":
                    return
                if cmd == "create":
                    pipes.create(*req[1:])
                elif cmd == "drop":
                    pipes.drop(req[1])
                else:
                    outbox.put(("ok", pipes.run(cmd, req[1], req[2], req[3])))
            except Exception as e:  # report to the parent, which stops (a restart recovers from the watermark)
                log.exception("pipeline worker: %s failed", cmd)
                outbox.put(("error", f"{cmd}: {e!r}"))
    finally:
        outbox.put(None)
        th.join(10)


class WorkerError(RuntimeError):
    """A pipeline worker process failed or died."""


class ProcessBackend:
    """Pipelines in ``n`` worker processes; at most ``max_in_flight`` batches outstanding per worker."""

    def __init__(self, cfg: Any, n: int, max_in_flight: int = 2) -> None:
        ctx = mp.get_context("spawn")
        self.n = n
        self.max_in_flight = max_in_flight
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._in_flight: list[int] = [0] * n
        self._results: list[Any] = []
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
        log.info("pipelines run in %d worker process(es): %s", n, [p.pid for p in self._procs])

    def _w(self, partition: int) -> int:
        return partition % self.n

    @property
    def pending(self) -> int:
        return sum(self._in_flight)

    def create(self, partition: int, start: int, released: Iterable[int], horizon: int, incarnation: str) -> None:
        self._conns[self._w(partition)].send(("create", partition, start, list(released), horizon, incarnation))

    def submit(self, op: str, partition: int, msgs: Sequence[RawMessage], now: float) -> None:
        w = self._w(partition)
        self._conns[w].send((op, partition, list(msgs), now))
        self._in_flight[w] += 1

    def _recv(self, w: int) -> PartitionResult:
        try:
            status, payload = self._results[w].recv()
        except (EOFError, OSError) as e:
            raise WorkerError(f"pipeline worker {w} (pid {self._procs[w].pid}) died: {e!r}") from e
        self._in_flight[w] -= 1
        if status != "ok":
            raise WorkerError(f"pipeline worker {w}: {payload}")
        return payload  # type: ignore[no-any-return]

    def results(self, *, wait_all: bool = False, max_pending: int | None = None) -> list[PartitionResult]:
        """Results available now; with ``wait_all`` every outstanding one; otherwise waits only while a worker
        has more than ``max_pending`` (default ``max_in_flight - 1``) batches outstanding (backpressure)."""
        limit = self.max_in_flight - 1 if max_pending is None else max_pending
        out: list[PartitionResult] = []
        for w, conn in enumerate(self._results):
            while self._in_flight[w] and (wait_all or self._in_flight[w] > limit or conn.poll()):
                out.append(self._recv(w))
        return out

    def drop(self, partitions: Iterable[int]) -> None:
        for p in partitions:
            self._conns[self._w(p)].send(("drop", [p]))

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, ValueError):
                pass
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(2)
