"""The side paths' Kafka loop: an independent consumer group on the input topic (a slow side path never
delays the main path), the pure :class:`~stream_anon.service.side_paths.SidePathProcessor`, and metrics.

Loop: ``poll`` a batch; decode and validate every message with the main path's
:class:`~stream_anon.service.pipeline.RecordDecoder` (same reasons); **commit the batch's offsets first**, then
perturb it and publish the copies, the estimates and k-means releases it triggered (``acks=all``; acknowledged
at a flush every ``service.commit_interval_ms`` and whenever a poll returns nothing, when the metrics count them).
The copies are JSON-encoded column-wise (:meth:`~stream_anon.service.side_paths.SidePathProcessor.process_batch_encoded`)
and sent in bulk by a :class:`SideSender`, by default in ``side_paths.sender_processes`` child processes
(:class:`ProcessSenders`, one topic per child) so that kafka-python's per-message cost runs beside the consuming,
decoding and perturbing instead of after it.

Why commit before publishing: a record consumed again after a crash would be randomized a second time with
fresh noise, and two independent reports of the same value spend 2 eps, not the eps printed on them.
Committing first means every record is randomized at most once per consumer group, so the eps on each
message is the eps its record really spent.  The price: a crash between the commit and the producer's
acknowledgement loses the side copies of the batches consumed since the last flush (at most
``service.commit_interval_ms`` worth of records; the main path, which has its own group, loses nothing).  If a commit fails (e.g. a rebalance moved the partition), the batch
is neither randomized nor published: it is consumed again (seek back), or by the partition's new owner.

Bad input: the main path already dead-letters every bad input message, so the side path only counts and
skips them (reason = the main path's DLQ reason), avoiding double DLQ entries; ``side_paths.dead_letter:
true`` (side paths running without a main path) dead-letters them too.  Control messages (header
``stream-anon-control: flush``, end of stream, one per input partition): once every assigned partition's
latest message is such a control, a final round of estimates is published and a partial k-means window is
released (if it holds at least ``kmeans.min_partial_window`` records).

Estimates and the k-means window live in memory: after a restart they cover the records since the restart.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka import TopicPartition
from kafka.errors import KafkaError
from kafka.structs import OffsetAndMetadata
from prometheus_client import CollectorRegistry

from stream_anon.core.schema import Schema, adult_schema
from stream_anon.service.metrics import ServiceMetrics
from stream_anon.service.pipeline import (
    CONTROL_FLUSH,
    CONTROL_HEADER,
    H_ERROR,
    H_FIELD,
    H_KIND,
    H_REASON,
    H_SRC_OFFSET,
    H_SRC_PARTITION,
    H_SRC_TOPIC,
    DeadLetter,
    OutputMessage,
    RecordDecoder,
)
from stream_anon.service.side_paths import (
    CopyBatch,
    Out,
    SideEvent,
    SidePathConfig,
    SidePathProcessor,
    SideTopics,
    observe,
    observe_copies,
    set_budget_gauges,
)

log = logging.getLogger(__name__)


@dataclass
class SideStatus:
    """Running totals of the side paths in this process (the demo summary and tests read them)."""

    consumed: int = 0  # input messages consumed by the side group
    processed: int = 0  # valid records perturbed
    control: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (bad input, commit failures)
    published: dict[str, int] = field(default_factory=dict)  # topic -> messages acknowledged
    epsilon_spent: dict[str, float] = field(default_factory=dict)  # topic -> sum of eps published
    epsilon_per_record: dict[str, float] = field(default_factory=dict)
    estimates: dict[str, dict[str, Any]] = field(default_factory=dict)  # "mech/attr" -> latest summary
    kmeans_windows: int = 0
    kmeans_refused: int = 0
    kmeans_stopped: bool = False
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset (committed)
    group_id: str = ""
    ready: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        return {"consumed": self.consumed, "processed": self.processed, "skipped": dict(self.skipped),
                "published": dict(self.published), "epsilon_spent": dict(self.epsilon_spent),
                "epsilon_per_record": dict(self.epsilon_per_record), "estimates": dict(self.estimates),
                "kmeans_windows": self.kmeans_windows, "kmeans_refused": self.kmeans_refused,
                "kmeans_stopped": self.kmeans_stopped, "group_id": self.group_id, "error": self.error}


def side_group_id(cfg: Any, side: SidePathConfig) -> str:
    """The side paths' consumer group: ``side_paths.group_id``, else ``<kafka.group_id>-ldp``."""
    if side.group_id:
        return side.group_id
    base = getattr(getattr(cfg, "kafka", None), "group_id", None) or "stream-anon"
    return f"{base}-ldp"


def encode(msg: dict[str, Any]) -> bytes:
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()


@dataclass
class _Sent:
    """Messages sent to one topic partition by one call, with their futures (checked in bulk at flush)."""

    topic: str
    partition: int
    keys: list[bytes | None]
    values: list[bytes]
    headers: Any  # one shared list of (key, value) headers, or one list per message
    futures: list[Any]


def _accumulator_append(producer: Any) -> Any:
    """A bulk append to kafka-python's record accumulator (what ``KafkaProducer.send`` does after its per-call
    checks), or None when the producer is not a kafka-python 3 ``KafkaProducer`` without transactions.

    ``send`` re-checks per message what is the same for a whole batch (open producer, topic metadata, explicit
    partition, header types, serializers, size); doing those once per batch makes a send about 25-40 % cheaper
    (measured with ``python -m stream_anon.bench.side_kafka``).  The futures, the batching, the idempotent
    sequence numbers and the acknowledgement are kafka-python's own.  Messages the checks would refuse
    (too large, bad types) go through ``send`` and get its errors.
    """
    import inspect

    acc = getattr(producer, "_accumulator", None)
    sender = getattr(producer, "_sender", None)
    config = getattr(producer, "config", None)
    tm = getattr(producer, "_transaction_manager", None)
    if acc is None or sender is None or not isinstance(config, dict) or "max_request_size" not in config:
        return None
    if tm is not None and tm.is_transactional():
        return None
    if config.get("key_serializer") is not None or config.get("value_serializer") is not None:
        return None
    try:
        params = list(inspect.signature(acc.append).parameters)
    except (TypeError, ValueError):
        return None
    if params[:5] != ["tp", "timestamp_ms", "key", "value", "headers"]:
        return None
    append, wakeup = acc.append, sender.wakeup
    max_size = int(config["max_request_size"]) - 1024  # record batch + record overhead, generously

    def bulk_append(topic: str, partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]]) -> list[Any] | None:
        if getattr(producer, "_closed", False) or not all(
                type(k) is str and type(v) is bytes for k, v in headers):
            return None
        hsize = sum(len(k) + len(v) for k, v in headers)
        longest = max(map(len, values)) + max((len(k) for k in keys if k is not None), default=0) + hsize
        if longest > max_size or not all(type(v) is bytes for v in values) or \
                not all(k is None or type(k) is bytes for k in keys):
            return None
        tp = TopicPartition(topic, partition)
        futures = []
        wake = False
        for k, v in zip(keys, values, strict=True):
            fut, full, new, _ = append(tp, None, k, v, headers)
            futures.append(fut)
            wake = wake or full or new
            if full:
                wakeup()
        if wake:
            wakeup()
        return futures

    return bulk_append


class SideSender:
    """The side paths' producer: sends many messages per call with as little Python work per message as
    kafka-python allows (one shared header list per topic, no callbacks, no per-message objects), checks the
    futures in bulk at :meth:`flush` and re-sends failures with backoff, never dropping one.  Partition of an
    output = source partition mod the topic's partition count."""

    def __init__(self, producer: Any, cfg: Any, on_error: Any = None, stop: Any = None) -> None:
        self.producer = producer
        self.cfg = cfg
        self.on_error = on_error
        self.stop = stop
        self.partition_counts: dict[str, int] = {}
        self._sent: list[_Sent] = []
        self._append = _accumulator_append(producer)

    def partition_of_topic(self, topic: str, src_partition: int) -> int:
        n = self.partition_counts.get(topic)
        if n is None:
            parts = self.producer.partitions_for(topic)
            n = self.partition_counts[topic] = len(parts) if parts else 1
        return src_partition % n

    @property
    def pending(self) -> int:
        return sum(len(s.futures) for s in self._sent)

    def send_copies(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]]) -> None:
        """Send ``values[i]`` with key ``keys[i]``, all with the same ``headers`` (not copied: kafka-python only
        reads them), to ``topic``'s partition of ``src_partition``."""
        partition = self.partition_of_topic(topic, src_partition)
        futures: list[Any] | None = None
        if self._append is not None and values:
            futures = self._append(topic, partition, keys, values, headers)
        if futures is None:
            send = self.producer.send
            futures = [send(topic, value=v, key=k, partition=partition, headers=headers)
                       for k, v in zip(keys, values, strict=True)]
        self._sent.append(_Sent(topic, partition, keys, values, headers, futures))

    def send(self, messages: Sequence[OutputMessage]) -> None:
        """Send :class:`OutputMessage` s (estimates, k-means, dead letters: few per batch)."""
        send = self.producer.send
        for m in messages:
            partition = self.partition_of_topic(m.topic, m.src_partition)
            headers = list(m.headers)
            fut = send(m.topic, value=m.value, key=m.key, partition=partition, headers=headers)
            self._sent.append(_Sent(m.topic, partition, [m.key], [m.value], [headers], [fut]))

    def flush(self) -> None:
        """Block until every message sent so far is acknowledged (``acks=all``), re-sending failures."""
        from stream_anon.service.kafka_io import BrokerUnavailableError, backoff_delays

        delays = backoff_delays(self.cfg.kafka.retry_backoff_max_seconds)
        while self._sent:
            try:
                self.producer.flush()
            except KafkaError as e:  # flush itself timed out: check the futures below
                log.warning("side producer flush failed: %r", e)
            failed: list[_Sent] = []
            n_failed = 0
            for s in self._sent:
                if all(f.is_done and f.succeeded() for f in s.futures):
                    continue
                bad = [i for i, f in enumerate(s.futures) if not (f.is_done and f.succeeded())]
                shared = bool(s.headers) and isinstance(s.headers[0], tuple)
                failed.append(_Sent(s.topic, s.partition, [s.keys[i] for i in bad], [s.values[i] for i in bad],
                                    s.headers if shared else [s.headers[i] for i in bad], []))
                n_failed += len(bad)
                exc = next((f.exception for f in s.futures if f.is_done and f.failed()), None)
                log.warning("produce of %d messages to %s[%d] failed (%r); will retry", len(bad), s.topic,
                            s.partition, exc)
                if self.on_error is not None:
                    self.on_error(s.topic)
            self._sent = []
            if failed:
                if self.stop is not None and self.stop():
                    raise BrokerUnavailableError(f"{n_failed} side messages not acknowledged at shutdown")
                d = next(delays)
                log.warning("%d side messages not acknowledged; re-sending in %.1f s", n_failed, d)
                time.sleep(d)
                self._resend(failed)

    def close(self) -> None:
        try:
            self.producer.close(timeout=10)  # everything was flushed; do not hang on a dead broker
        except Exception as e:  # closing a client of a dead broker
            log.debug("close failed: %r", e)

    def _resend(self, failed: list[_Sent]) -> None:
        send = self.producer.send
        for s in failed:
            shared = bool(s.headers) and isinstance(s.headers[0], tuple)
            hs: Any = [s.headers] * len(s.values) if shared else s.headers
            s.futures = [send(s.topic, value=v, key=k, partition=s.partition, headers=h)
                         for k, v, h in zip(s.keys, s.values, hs, strict=True)]
            self._sent.append(s)


def _sender_main(cfg: Any, requests: Any, results: Any, stop: Any) -> None:
    """Child process of :class:`ProcessSender`: a :class:`SideSender` fed over a pipe.  Requests: ``("copies",
    topic, src_partition, keys, values, headers)``, ``("messages", [OutputMessage])``, ``("flush", seq)`` (answered
    ``("flushed", seq, {topic: produce errors})`` once everything sent so far is acknowledged) and ``("stop",)``;
    a failure is answered ``("error", text)``."""
    import os
    import signal

    from stream_anon.service.kafka_io import make_producer, retry

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    errors: dict[str, int] = {}
    parent = os.getppid()

    def stopped() -> bool:  # the side app stops, or died (then nobody waits for the acknowledgements)
        return bool(stop.is_set()) or os.getppid() != parent

    def on_error(topic: str) -> None:
        errors[topic] = errors.get(topic, 0) + 1

    sender: SideSender | None = None
    try:
        sender = SideSender(retry("side producer", lambda: make_producer(cfg), cfg, stop=stopped), cfg,
                            on_error=on_error, stop=stopped)
        while True:
            try:
                req = requests.recv()
            except (EOFError, OSError):
                return
            if req[0] == "copies":
                sender.send_copies(*req[1:])
            elif req[0] == "messages":
                sender.send(req[1])
            elif req[0] == "flush":
                sender.flush()
                results.send(("flushed", req[1], dict(errors)))
                errors.clear()
            elif req[0] == "stop":
                return
            else:
                raise ValueError(f"unknown side sender request {req[0]!r}")
    except Exception as e:  # reported to the parent, which stops the side paths (the main path is not affected)
        log.exception("side sender process failed")
        try:
            results.send(("error", f"{type(e).__name__}: {e}"))
        except (OSError, ValueError):
            pass
    finally:
        if sender is not None:
            sender.close()


def _start_child(proc: Any) -> None:
    """Start ``proc``, also from a daemonic process (``stream-anon run`` starts the side paths in one, and
    multiprocessing refuses children there only so that none outlives a terminated parent).  A sender child
    cannot outlive its parent: it exits when its request pipe closes (EOF), and it is itself daemonic."""
    import multiprocessing as mp

    config = getattr(mp.current_process(), "_config", None)
    if not isinstance(config, dict) or not config.get("daemon"):
        proc.start()
        return
    config["daemon"] = False
    try:
        proc.start()
    finally:
        config["daemon"] = True


class SideSenderError(RuntimeError):
    """The side sender process failed or died."""


class ProcessSender:
    """:class:`SideSender` in a child process (``side_paths.sender_processes`` > 0): the side app only hands it
    encoded bytes, so kafka-python's per-message ``send`` (the bottleneck) runs on the other core, beside
    the consumer, decoding, perturbation and encoding.  Same interface and guarantees as :class:`SideSender`:
    :meth:`flush` returns once every message sent so far is acknowledged (failures re-sent in the child)."""

    def __init__(self, cfg: Any, stop: Any = None, on_error: Any = None) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.stop = stop
        self.on_error = on_error
        self._stop = ctx.Event()
        req_read, self._requests = ctx.Pipe(duplex=False)
        self._results, res_write = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_sender_main, args=(cfg, req_read, res_write, self._stop),
                                 name="stream-anon-side-sender", daemon=True)
        _start_child(self._proc)
        req_read.close()
        res_write.close()
        self._seq = 0
        self._pending = 0
        log.info("side paths: per-record copies are produced by process %d", self._proc.pid)

    @property
    def pending(self) -> int:
        return self._pending

    def send_copies(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]]) -> None:
        self._request(("copies", topic, src_partition, keys, values, headers))
        self._pending += len(values)

    def send(self, messages: Sequence[OutputMessage]) -> None:
        if messages:
            self._request(("messages", list(messages)))
            self._pending += len(messages)

    def _request(self, req: tuple[Any, ...]) -> None:
        try:
            self._requests.send(req)
        except (OSError, ValueError) as e:
            raise SideSenderError(f"side sender process {self._proc.pid} is gone: {self._failure(e)}") from e

    def _failure(self, e: BaseException) -> str:
        try:
            if self._results.poll():
                msg = self._results.recv()
                if msg[0] == "error":
                    return str(msg[1])
        except (EOFError, OSError):
            pass
        return repr(e)

    def flush(self) -> None:
        """Block until the child acknowledges every message sent so far (``acks=all``)."""
        self.request_flush()
        self.wait_flush()

    def request_flush(self) -> None:
        self._seq += 1
        self._request(("flush", self._seq))

    def wait_flush(self) -> None:
        """Wait for the answer to the last :meth:`request_flush`."""
        from stream_anon.service.kafka_io import BrokerUnavailableError

        while True:
            if self.stop is not None and self.stop():
                self._stop.set()  # the child gives up re-sending (BrokerUnavailableError) instead of retrying
            try:
                if not self._results.poll(0.1):
                    if not self._proc.is_alive():
                        raise SideSenderError(f"side sender process {self._proc.pid} died "
                                              f"(exit code {self._proc.exitcode})")
                    continue
                msg = self._results.recv()
            except (EOFError, OSError) as e:
                raise SideSenderError(f"side sender process {self._proc.pid} died: {e!r}") from e
            if msg[0] == "error":
                if "BrokerUnavailableError" in msg[1]:
                    raise BrokerUnavailableError(msg[1])
                raise SideSenderError(f"side sender process: {msg[1]}")
            _, seq, errors = msg
            if self.on_error is not None:
                for topic, count in errors.items():
                    for _ in range(count):
                        self.on_error(topic)
            if seq == self._seq:
                self._pending = 0
                return

    def close(self) -> None:
        try:
            self._requests.send(("stop",))
        except (OSError, ValueError):
            pass
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(2)


class ProcessSenders:
    """``n`` :class:`ProcessSender` children (``side_paths.sender_processes``); each topic always goes to the same
    child (so the order of a topic partition's messages is kept), topics are spread round-robin in order of
    first use; :meth:`flush` flushes all children concurrently and returns when all acknowledged."""

    def __init__(self, cfg: Any, n: int, stop: Any = None, on_error: Any = None) -> None:
        self.children: list[ProcessSender] = []
        try:
            for _ in range(n):
                self.children.append(ProcessSender(cfg, stop=stop, on_error=on_error))
        except BaseException:
            self.close()
            raise
        self._route: dict[str, ProcessSender] = {}

    def _child(self, topic: str) -> ProcessSender:
        child = self._route.get(topic)
        if child is None:
            child = self._route[topic] = self.children[len(self._route) % len(self.children)]
        return child

    @property
    def pending(self) -> int:
        return sum(c.pending for c in self.children)

    def send_copies(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]]) -> None:
        self._child(topic).send_copies(topic, src_partition, keys, values, headers)

    def send(self, messages: Sequence[OutputMessage]) -> None:
        by_child: dict[int, list[OutputMessage]] = {}
        for m in messages:
            by_child.setdefault(id(self._child(m.topic)), []).append(m)
        for c in self.children:
            if id(c) in by_child:
                c.send(by_child[id(c)])

    def flush(self) -> None:
        busy = [c for c in self.children if c.pending]
        for c in busy:
            c.request_flush()
        for c in busy:
            c.wait_flush()

    def close(self) -> None:
        for c in self.children:
            c.close()


class SidePathApp:
    """One side-path member.  ``run()`` until ``stop_event`` is set; returns an exit code."""

    def __init__(self, cfg: Any, metrics: ServiceMetrics | None = None, stop_event: threading.Event | None = None,
                 *, schema: Schema | None = None, status: SideStatus | None = None, rng: Any = None) -> None:
        self.cfg = cfg
        self.side = SidePathConfig.coerce(cfg.side_paths)
        self.metrics = metrics if metrics is not None else ServiceMetrics(CollectorRegistry())
        self.stop_event = stop_event or threading.Event()
        self.status = status or SideStatus()
        if schema is None:
            from stream_anon.service.app import load_schema

            schema = load_schema(cfg) if hasattr(cfg, "anonymization") else adult_schema()
        self.schema = schema
        self.topics = SideTopics.from_any(cfg.topics)
        self.input_topic: str = cfg.topics.input
        self.group_id = side_group_id(cfg, self.side)
        self.status.group_id = self.group_id
        self.processor = SidePathProcessor(self.side, schema, topics=self.topics, rng=rng)
        self.status.epsilon_per_record = dict(self.processor.epsilon_per_record)
        max_bytes = getattr(getattr(cfg, "service", None), "max_message_bytes", 65536)
        self.decoder = RecordDecoder(schema, max_bytes)
        self._consumer: Any = None
        self._producer: Any = None
        self._ended: set[int] = set()  # input partitions whose latest message was an end-of-stream control
        self._unacked: list[Out] = []  # sent, not yet acknowledged (counted in metrics at the next flush)
        self._unacked_copies: list[CopyBatch] = []
        self._last_flush = time.monotonic()
        commit_ms = getattr(getattr(cfg, "service", None), "commit_interval_ms", 500)
        self._flush_every = max(0.0, float(commit_ms) / 1000.0)
        t = self.topics
        self._per_record_topics = frozenset(self.processor.epsilon_per_record)
        self._kinds = {t.krr: "krr", t.rs: "rs", t.blap: "blap", t.estimates: "estimates", t.kmeans: "kmeans"}
        self._headers = {topic: ((H_KIND, kind.encode()),) for topic, kind in self._kinds.items()}
        self._copy_headers = {topic: [(H_KIND, kind.encode())] for topic, kind in self._kinds.items()}
        m = self.metrics
        self._consumed_metric = m.side_records_consumed  # separate from the main path's records_consumed
        self._consumed_label = self.input_topic

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> int:
        from stream_anon.service.kafka_io import (
            BrokerUnavailableError,
            connect_admin,
            make_consumer,
            make_producer,
            retry,
        )

        cfg = self.cfg
        stop = self.stop_event.is_set
        if not self.side.enabled:
            log.info("side paths disabled (side_paths.enabled = false)")
            self.status.finished.set()
            return 0
        try:
            admin = connect_admin(cfg, on_retry=self.metrics.broker_reconnects.inc, stop=stop)
            retry("create side topics", lambda: self._ensure_side_topics(admin), cfg, stop=stop)
            admin.close()

            def on_error(topic: str) -> None:
                self.metrics.produce_errors.labels(topic=topic).inc()

            # partition counts are looked up per topic (outputs: input partition mod topic partitions)
            if self.side.sender_processes > 0:
                self._producer = ProcessSenders(cfg, self.side.sender_processes, stop=stop, on_error=on_error)
            else:
                producer = retry("producer", lambda: make_producer(cfg), cfg, stop=stop)
                self._producer = SideSender(producer, cfg, on_error=on_error, stop=stop)
            self._consumer = retry("consumer", lambda: make_consumer(cfg, group_id=self.group_id), cfg, stop=stop)
        except BrokerUnavailableError as e:
            log.error("side paths: %s", e)
            self._close_producer()
            self.status.error = str(e)
            self.status.finished.set()
            return 3
        except Exception as e:  # never die silently in a thread
            log.exception("side paths: start failed: %r", e)
            self._close_producer()
            self.status.error = repr(e)
            self.status.finished.set()
            return 1
        self._consumer.subscribe([self.input_topic])
        set_budget_gauges(self.metrics, self.processor)
        log.info("side paths: consuming %s as group %r -> %s; eps per record %s (all side topics %g)",
                 self.input_topic, self.group_id,
                 ", ".join(t for t in (self.topics.krr, self.topics.rs, self.topics.blap, self.topics.estimates,
                                       self.topics.kmeans)),
                 {t: round(e, 6) for t, e in self.processor.epsilon_per_record.items()},
                 self.processor.epsilon_all_topics)
        self.status.ready.set()
        rc = 0
        try:
            self._loop()
        except BrokerUnavailableError as e:
            log.error("side paths stopped: %s", e)
            self.status.error = str(e)
            rc = 3
        except Exception as e:  # never die silently: log, record, and let the main path continue
            log.exception("side paths failed: %r", e)
            self.status.error = repr(e)
            rc = 1
        finally:
            self._shutdown()
        return rc

    def _close_producer(self) -> None:
        """Close the producer (and stop sender processes) after a failed start."""
        if self._producer is not None and hasattr(self._producer, "close"):
            try:
                self._producer.close()
            except Exception as e:  # closing a client of a dead broker
                log.debug("close failed: %r", e)
            self._producer = None

    def _ensure_side_topics(self, admin: Any) -> None:
        """Create the missing side topics (``topics.create``) with ``topics.partitions`` partitions."""
        from kafka.admin import NewTopic
        from kafka.errors import TopicAlreadyExistsError

        t = getattr(self.cfg, "topics", None)
        if t is not None and not getattr(t, "create", True):
            return
        wanted = [self.topics.krr, self.topics.rs, self.topics.blap, self.topics.estimates, self.topics.kmeans]
        if self.side.dead_letter:
            wanted.append(self.topics.dlq)
        existing = set(admin.list_topics())
        missing = [n for n in dict.fromkeys(wanted) if n not in existing]
        if missing:
            parts = int(getattr(t, "partitions", 1) or 1)
            repl = int(getattr(t, "replication_factor", 1) or 1)
            try:
                admin.create_topics([NewTopic(n, parts, repl) for n in missing])
            except TopicAlreadyExistsError:
                pass
            log.info("side paths: created topics %s", missing)

    def _loop(self) -> None:
        cfg = self.cfg
        consumer = self._consumer
        poll_ms = getattr(getattr(cfg, "service", None), "poll_timeout_ms", 200)
        max_records = getattr(getattr(cfg, "kafka", None), "max_poll_records", 5000)
        while not self.stop_event.is_set():
            batch = consumer.poll(timeout_ms=poll_ms, max_records=max_records)
            if not batch:
                self._publish(self.processor.poll(), 0)
                self._flush()
                continue
            for tp, recs in batch.items():
                if recs:
                    self._process(tp, recs)
            if time.monotonic() - self._last_flush >= self._flush_every:
                self._flush()

    def _process(self, tp: TopicPartition, recs: Sequence[Any]) -> None:
        status, proc = self.status, self.processor
        n = len(recs)
        # decode everything first, then commit (at most one randomization per record), then perturb + publish
        segments: list[tuple[list[dict[str, Any]], bool]] = [([], False)]
        dlq: list[OutputMessage] = []
        bad: list[str] = []
        controls = 0
        for r in recs:
            if r.headers and any(k == CONTROL_HEADER and v == CONTROL_FLUSH for k, v in r.headers):
                controls += 1
                segments[-1] = (segments[-1][0], True)
                segments.append(([], False))
                continue
            rec = self.decoder.decode(r.value)
            if isinstance(rec, DeadLetter):
                bad.append(rec.reason)
                if self.side.dead_letter:
                    dlq.append(self._dead_letter(tp.partition, r, rec))
                continue
            segments[-1][0].append(rec)
        next_offset = int(recs[-1].offset) + 1
        try:
            self._consumer.commit({tp: OffsetAndMetadata(next_offset, None, -1)})
        except KafkaError as e:
            # nothing of this batch was randomized yet: re-read it (or let the partition's new owner do it)
            log.warning("side paths: commit of %s@%d failed (%r); the batch of %d messages is not perturbed now and "
                        "will be consumed again (no record is randomized twice)", tp, next_offset, e, n)
            try:
                self._consumer.seek(tp, int(recs[0].offset))
            except Exception as e2:  # partition revoked: its new owner starts from the committed offset
                log.info("side paths: %s no longer assigned (%r)", tp, e2)
            time.sleep(0.5)
            return
        status.consumed += n
        status.control += controls
        self._consumed_metric.labels(topic=self._consumed_label).inc(n)
        for reason in bad:
            self._skip(reason)
        status.positions[tp.partition] = next_offset
        outputs: list[Out] = []
        copies: list[CopyBatch] = []
        for records, flush_after in segments:
            if records:
                try:
                    seg_copies, seg_outputs = proc.process_batch_encoded(records)
                    copies.extend(seg_copies)
                    outputs.extend(seg_outputs)
                    status.processed += len(records)
                except (ValueError, ArithmeticError) as e:  # a bug or a schema/config mismatch: log, count, go on
                    log.exception("side paths: %d records of %s not perturbed: %s", len(records), tp, e)
                    self._skip("side_path_error", len(records))
            if records:
                self._ended.discard(tp.partition)
            if flush_after:
                self._ended.add(tp.partition)
                if self._all_partitions_ended():
                    outputs.extend(proc.flush())
        outputs.extend(proc.poll())  # timer (nothing right after a flush: no new records since)
        if dlq:
            assert self._producer is not None
            self._producer.send(dlq)
            self.metrics_dead_lettered(dlq)
        self._publish(outputs, tp.partition, copies)

    def _all_partitions_ended(self) -> bool:
        """True when every assigned input partition's latest message is an end-of-stream flush control."""
        try:
            assigned = {tp.partition for tp in self._consumer.assignment() if tp.topic == self.input_topic}
        except Exception:  # assignment unknown (rebalancing): flush on this partition's control alone
            assigned = set()
        return assigned <= self._ended

    def metrics_dead_lettered(self, dlq: Sequence[OutputMessage]) -> None:
        for m in dlq:
            reason = dict(m.headers).get(H_REASON, b"unknown").decode()
            self.metrics.records_dead_lettered.labels(reason=reason).inc()

    def _skip(self, reason: str, count: int = 1) -> None:
        self.status.skipped[reason] = self.status.skipped.get(reason, 0) + count
        skipped = getattr(self.metrics, "side_records_skipped", None)
        if skipped is not None:
            skipped.labels(topic=self.input_topic, reason=reason).inc(count)

    def _dead_letter(self, partition: int, r: Any, dl: DeadLetter) -> OutputMessage:
        headers: list[tuple[str, bytes]] = [(H_SRC_TOPIC, self.input_topic.encode()),
                                            (H_SRC_PARTITION, str(partition).encode()),
                                            (H_SRC_OFFSET, str(r.offset).encode()), (H_KIND, b"dlq"),
                                            (H_REASON, dl.reason.encode()), (H_ERROR, dl.error.encode()[:2000])]
        if dl.field is not None:
            headers.append((H_FIELD, str(dl.field).encode()))
        return OutputMessage("dlq", self.topics.dlq, partition, r.key, r.value or b"", tuple(headers))

    def _publish(self, outputs: list[Out], partition: int, copies: Sequence[CopyBatch] = ()) -> None:
        """Send the encoded per-record ``copies`` and ``outputs`` (acknowledged at the next :meth:`_flush`, which
        also counts them in the metrics)."""
        proc = self.processor
        events = proc.drain_events()
        if copies:
            assert self._producer is not None
            for c in copies:
                self._producer.send_copies(c.topic, partition, list(map(str.encode, c.ids)), c.payloads,
                                           self._copy_headers[c.topic])
            self._unacked_copies.extend(copies)
        if outputs:
            assert self._producer is not None
            kinds = self._kinds
            per_record = self._per_record_topics
            msgs = [OutputMessage(kinds.get(topic, "side"), topic, partition, key.encode(),
                                  encode(msg if topic in per_record else _clean(msg)), self._headers[topic])
                    for topic, key, msg in outputs]
            self._producer.send(msgs)
            self._unacked.extend(outputs)
        for ev in events:
            self._on_event(ev)
        self.status.kmeans_windows = proc.kmeans_windows
        self.status.kmeans_refused = proc.kmeans_refused
        self.status.kmeans_stopped = proc.kmeans_stopped
        if events:
            set_budget_gauges(self.metrics, proc)

    def _flush(self) -> None:
        """Wait until every message sent is acknowledged (``acks=all``), then count them (metrics, status)."""
        self._last_flush = time.monotonic()
        if self._producer is None or not (self._unacked or self._unacked_copies):
            return
        self._producer.flush()
        outputs, self._unacked = self._unacked, []
        copies, self._unacked_copies = self._unacked_copies, []
        status = self.status
        per_topic = observe(self.metrics, outputs, self.processor)
        for topic, c in observe_copies(self.metrics, copies).items():
            per_topic[topic] = per_topic.get(topic, 0) + c
        for topic, c in per_topic.items():
            status.published[topic] = status.published.get(topic, 0) + c
        t = self.topics
        for topic, _key, msg in outputs:
            if topic == t.estimates:
                status.estimates[f"{msg['mechanism']}/{msg['attribute']}"] = _estimate_summary(msg)
            elif topic == t.kmeans:
                status.epsilon_spent[topic] = status.epsilon_spent.get(topic, 0.0) + float(msg["epsilon"])
        for topic in self._per_record_topics:
            if topic in per_topic:
                status.epsilon_spent[topic] = status.epsilon_spent.get(topic, 0.0) + \
                    per_topic[topic] * self.processor.epsilon_per_record[topic]

    def _on_event(self, ev: SideEvent) -> None:
        refused = getattr(self.metrics, "side_outputs_refused", None)
        if ev.kind in ("budget_exhausted", "kmeans_skipped"):
            # the processor already logged the exhaustion at ERROR; later refused windows once per window
            if ev.kind == "kmeans_skipped":
                log.error("%s", ev.detail)
            if refused is not None:
                refused.labels(topic=ev.topic, reason="budget_exhausted").inc()
            self.metrics.epsilon_budget_remaining.labels(topic=ev.topic).set(self.processor.kmeans_budget()[1])

    def _shutdown(self) -> None:
        try:
            if self._producer is not None and self._consumer is not None and self.status.ready.is_set():
                self._publish(self.processor.flush(partial_kmeans=False), 0)  # final estimates, no budget spent
                self._flush()
        except Exception as e:  # broker gone at shutdown: the estimates are recomputed next time
            log.warning("side paths: final estimates not published: %r", e)
        for client in (self._consumer, self._producer):
            if client is not None and hasattr(client, "close"):
                try:
                    client.close()
                except Exception as e:  # closing a client of a dead broker
                    log.debug("close failed: %r", e)
        self.status.finished.set()
        log.info("side paths stopped: %s", {k: v for k, v in self.status.summary().items() if k != "estimates"})


def _clean(obj: Any) -> Any:
    """JSON-safe: non-finite floats become null (strict JSON has no NaN/Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def _estimate_summary(msg: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"source_topic": msg["source_topic"], "type": msg["type"], "n": msg["n"],
                           "epsilon": msg["epsilon"], "standard_error": msg.get("standard_error"),
                           "round": msg["round"]}
    if msg["type"] == "mean":
        out["mean"] = msg["mean"]
    truth = msg.get("truth")
    if truth is not None:
        out["abs_error"] = truth.get("abs_error")
    return out


def run_side_paths(cfg: Any, metrics: ServiceMetrics | None = None, stop_event: threading.Event | None = None,
                   *, schema: Schema | None = None, status: SideStatus | None = None, rng: Any = None) -> int:
    """Run the side paths until ``stop_event`` is set (call it in a thread: ``threading.Thread(target=
    run_side_paths, args=(cfg, metrics, stop_event))``).  ``cfg`` is the service ``Config`` (sections
    ``kafka``, ``topics``, ``service``, ``anonymization`` and ``side_paths``: a :class:`SidePathConfig` or any
    dataclass/mapping with its fields).  Pass a :class:`SideStatus` to follow progress (``ready``,
    ``finished``, ``processed``, ``published``, ``estimates``).  Returns 0, or 3 when the broker is unreachable,
    1 on an unexpected error (logged; the main path is not affected).
    """
    t0 = time.monotonic()
    try:
        app = SidePathApp(cfg, metrics, stop_event, schema=schema, status=status, rng=rng)
    except (ValueError, KeyError) as e:  # SidePathConfigError, PrivacyParameterError, SchemaError
        log.error("side paths not started: %s", e)
        if status is not None:
            status.error = str(e)
            status.finished.set()
        return 2
    rc = app.run()
    log.debug("side paths ran %.1f s", time.monotonic() - t0)
    return rc

