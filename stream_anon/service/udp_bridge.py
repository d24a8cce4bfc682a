"""UDP ingest bridge: receive one-record datagrams, forward the records to Kafka, account for every sequence number.

Datagram format (written by ``stream_anon.replay.udp_sender``; one UTF-8 JSON object per datagram)::

    {"stream": "9f2c41d0", "seq": 0, "record": {"id": "adult-00000", ...}}
    {"stream": "9f2c41d0", "seq": 32561, "eos": true, "count": 32561}

Records are forwarded as compact JSON values keyed by their record id (the service then validates
them and dead-letters bad ones).  Accounting, per stream (a new ``stream`` id closes the previous one):

* a sequence number above the highest seen so far opens provisional holes below it;
* a late datagram filling a hole inside the reordering window (``window`` sequence numbers, a bounded
  ring of "seen" flags) is forwarded and is **not** a duplicate;
* a sequence number already seen inside the window is a duplicate (dropped, ``udp_duplicates``);
* a hole becomes a gap (``udp_gaps``, a Prometheus counter, so only final gaps are counted) when it
  falls out of the window, or when the stream closes (EOS, new stream, shutdown); the EOS ``count``
  also reveals records lost after the last one received;
* a datagram older than the window (``stale``) is dropped: its hole was already counted as a gap or it
  is a duplicate, so ``forwarded + gaps == count`` holds in every case.

Malformed datagrams (not JSON, not an object, no integer ``seq >= 0``, no record object with an id)
are counted in ``udp_malformed`` and logged.  UDP itself is lossy: see docs/replay.md for the loss
measured on loopback at several rates.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.producer.future import RecordMetadata

from stream_anon.metrics.definitions import ServiceMetrics

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 65_536
MAX_DATAGRAM = 65_535


# ---------------------------------------------------------------------------------------------- accounting
class SequenceTracker:
    """Gap/duplicate accounting of one stream's sequence numbers with a bounded reordering window.

    ``seen`` is a ring of ``window`` flags: slot ``s % window`` belongs to sequence number ``s`` for
    ``max_seq - window < s <= max_seq``.  Slots start as "seen" so that negative sequence numbers
    never count as gaps.  Memory is O(window) whatever the stream length.
    """

    NEW, LATE, DUPLICATE, STALE = "new", "late", "duplicate", "stale"

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if not isinstance(window, int) or isinstance(window, bool) or window < 1:
            raise ValueError(f"window: expected an integer >= 1, got {window!r}")
        self.window = window
        self.seen = bytearray(b"\x01") * window
        self.max_seq = -1
        self.accepted = 0     # distinct sequence numbers forwarded
        self.gaps = 0         # final gaps (left the window unseen, or missing at close)
        self.duplicates = 0
        self.stale = 0        # older than the window: dropped
        self.closed = False

    def _zeros(self, start: int, n: int) -> int:
        """Unseen flags among ``n`` consecutive slots starting at sequence number ``start``; clears them."""
        w = self.window
        i = start % w
        first = min(n, w - i)
        zeros = self.seen[i:i + first].count(0)
        self.seen[i:i + first] = bytes(first)
        if n > first:
            zeros += self.seen[0:n - first].count(0)
            self.seen[0:n - first] = bytes(n - first)
        return zeros

    def observe(self, seq: int) -> str:
        """Account for one datagram's sequence number: ``new``/``late`` (forward it), ``duplicate``/``stale`` (drop)."""
        m = self.max_seq
        w = self.window
        if seq > m:
            d = seq - m
            if d >= w:
                self.gaps += self.seen.count(0) + (d - w)
                self.seen[:] = bytes(w)
            else:  # slots of m+1..seq held m+1-w..seq-w: those unseen are now final gaps
                self.gaps += self._zeros(m + 1, d)
            self.seen[seq % w] = 1
            self.max_seq = seq
            self.accepted += 1
            return self.NEW
        if seq <= m - w:
            self.stale += 1
            return self.STALE
        slot = seq % w
        if self.seen[slot]:
            self.duplicates += 1
            return self.DUPLICATE
        self.seen[slot] = 1
        self.accepted += 1
        return self.LATE

    @property
    def pending(self) -> int:
        """Holes inside the window not yet final (a late datagram may still fill them)."""
        return self.seen.count(0)

    def close(self, count: int | None = None) -> int:
        """End of stream: every hole is final; with the EOS ``count``, so are seqs ``max_seq+1 .. count-1``.

        Returns the gaps added by closing.
        """
        if self.closed:
            return 0
        added = self.seen.count(0)
        if count is not None and count > self.max_seq + 1:
            added += count - 1 - self.max_seq
        self.seen[:] = b"\x01" * self.window
        self.gaps += added
        self.closed = True
        return added


# ---------------------------------------------------------------------------------------------- sinks
class RecordSink(Protocol):
    def send(self, key: bytes, value: bytes) -> None: ...

    def flush(self, timeout_s: float = 30.0) -> None: ...

    def close(self) -> None: ...


class KafkaSink:
    """Forward to a Kafka topic with kafka-python (acks=all; produce errors counted and logged)."""

    def __init__(self, bootstrap_servers: str, topic: str, *, producer_config: dict[str, Any] | None = None,
                 metrics: ServiceMetrics | None = None) -> None:
        config: dict[str, Any] = {"acks": "all", "linger_ms": 5, "batch_size": 256 * 1024}
        config.update(producer_config or {})
        self.topic = topic
        self.metrics = metrics
        self.errors = 0
        self.acked = 0
        self.producer = KafkaProducer(bootstrap_servers=bootstrap_servers, **config)

    def _ok(self, _md: RecordMetadata) -> None:
        self.acked += 1

    def _error(self, exc: BaseException) -> None:
        self.errors += 1
        if self.metrics is not None:
            self.metrics.produce_errors.labels(topic=self.topic).inc()
        if self.errors <= 5:
            log.error("udp-bridge: produce to %r failed: %s", self.topic, exc)

    def send(self, key: bytes, value: bytes) -> None:
        self.producer.send(self.topic, key=key, value=value).add_callback(self._ok).add_errback(self._error)

    def flush(self, timeout_s: float = 30.0) -> None:
        self.producer.flush(timeout=timeout_s)

    def close(self) -> None:
        self.producer.close(timeout=10)


class NullSink:
    """Count and discard (``--sink null``: measures UDP reception without Kafka)."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, key: bytes, value: bytes) -> None:
        self.sent += 1

    def flush(self, timeout_s: float = 30.0) -> None:
        pass

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------- bridge
@dataclass
class StreamReport:
    """One sender stream's accounting: ``forwarded + gaps == count`` once closed."""

    stream: str
    count: int | None = None  # from the EOS datagram
    forwarded: int = 0
    gaps: int = 0
    duplicates: int = 0
    stale: int = 0
    late_after_close: int = 0
    eos_received: bool = False
    max_seq: int = -1


@dataclass
class BridgeReport:
    listen: str
    datagrams_received: int = 0
    records_forwarded: int = 0
    gaps: int = 0
    duplicates: int = 0
    malformed: int = 0
    stale: int = 0
    late_after_close: int = 0
    produce_errors: int = 0
    seconds: float = 0.0
    rcvbuf_bytes: int = 0
    streams: list[StreamReport] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lines = [f"udp-bridge {self.listen}: {self.datagrams_received:,} datagrams in {self.seconds:.2f} s; "
                 f"{self.records_forwarded:,} records forwarded, {self.gaps:,} gaps (lost), "
                 f"{self.duplicates:,} duplicates, {self.stale:,} stale, {self.malformed:,} malformed, "
                 f"{self.produce_errors} produce errors"]
        for s in self.streams:
            count = f"{s.count:,}" if s.count is not None else "unknown (no EOS)"
            lines.append(f"  stream {s.stream!r}: count {count}, forwarded {s.forwarded:,}, gaps {s.gaps:,}, "
                         f"duplicates {s.duplicates:,}, stale {s.stale}, EOS {'yes' if s.eos_received else 'no'}")
        return "\n".join(lines)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); a clear error otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not (0 <= int(port) <= 65535):
        raise ValueError(f"--listen: expected HOST:PORT with PORT in [0, 65535], got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class UdpBridge:
    """Receive datagrams on ``listen`` and forward records to ``sink``; ``serve()`` runs until stopped.

    ``exit_on_eos``: return once an EOS datagram arrived and ``eos_grace_s`` passed (late datagrams of
    the stream are still taken during the grace period).  ``idle_close_s``: close the open stream after
    that many seconds without a datagram (for senders whose EOS datagrams were all lost; the stream's
    count is then unknown, so losses after its last received datagram are not counted); with
    ``exit_on_eos`` such a close also ends ``serve()``.  ``stop`` (a ``threading.Event``) or
    ``max_seconds`` also end ``serve()``; open streams are then closed (their holes become gaps).
    """

    def __init__(self, host: str, port: int, sink: RecordSink, metrics: ServiceMetrics, *,
                 window: int = DEFAULT_WINDOW, exit_on_eos: bool = False, eos_grace_s: float = 0.5,
                 idle_close_s: float | None = None, rcvbuf_bytes: int = 8 * 1024 * 1024,
                 id_field: str = "id") -> None:
        self.sink = sink
        self.metrics = metrics
        self.window = window
        self.exit_on_eos = exit_on_eos
        self.eos_grace_s = eos_grace_s
        self.idle_close_s = idle_close_s
        self.id_field = id_field
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.rcvbuf_bytes = self._set_rcvbuf(rcvbuf_bytes)
        self.sock.bind((host, port))
        self.host, self.port = self.sock.getsockname()[:2]
        self.ready = threading.Event()
        self.report = BridgeReport(listen=f"{self.host}:{self.port}", rcvbuf_bytes=self.rcvbuf_bytes)
        self._tracker: SequenceTracker | None = None
        self._current: StreamReport | None = None
        self._closed_streams: deque[str] = deque(maxlen=64)
        self._closed_reports: dict[str, StreamReport] = {}
        self._eos_deadline: float | None = None
        self._pushed: tuple[int, int, int, int] = (0, 0, 0, 0)

    def _set_rcvbuf(self, nbytes: int) -> int:
        force = getattr(socket, "SO_RCVBUFFORCE", None)
        try:
            if force is None:
                raise OSError
            self.sock.setsockopt(socket.SOL_SOCKET, force, nbytes)  # root: beyond net.core.rmem_max
        except OSError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, nbytes)
        return int(self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))

    # -------------------------------------------------------------------------------------- streams
    def _open(self, stream: str) -> None:
        self._close_current()
        self._tracker = SequenceTracker(self.window)
        self._current = StreamReport(stream=stream)
        self.report.streams.append(self._current)
        if len(self.report.streams) > 64:  # bounded: keep the last 64 streams' reports
            del self.report.streams[0]

    def _close_current(self) -> None:
        tracker, cur = self._tracker, self._current
        if tracker is None or cur is None:
            return
        tracker.close(cur.count)
        self._sync(cur, tracker)
        r = self.report
        r.records_forwarded += cur.forwarded
        r.gaps += cur.gaps
        r.duplicates += cur.duplicates
        r.stale += cur.stale
        self._closed_streams.append(cur.stream)
        self._closed_reports[cur.stream] = cur
        while len(self._closed_reports) > self._closed_streams.maxlen:  # type: ignore[operator]
            self._closed_reports.pop(next(iter(self._closed_reports)))
        self._tracker = None
        self._current = None
        self._eos_deadline = None
        if cur.count is not None and cur.forwarded + cur.gaps != cur.count:
            log.warning("udp-bridge: stream %r closed with forwarded %d + gaps %d != count %d",
                        cur.stream, cur.forwarded, cur.gaps, cur.count)
        log.info("udp-bridge: stream %r closed: count %s, forwarded %d, gaps %d, duplicates %d",
                 cur.stream, cur.count, cur.forwarded, cur.gaps, cur.duplicates)

    def _sync(self, cur: StreamReport, tracker: SequenceTracker) -> None:
        cur.forwarded = tracker.accepted
        cur.gaps = tracker.gaps
        cur.duplicates = tracker.duplicates
        cur.stale = tracker.stale
        cur.max_seq = tracker.max_seq

    # -------------------------------------------------------------------------------------- datagrams
    def _malformed(self, data: bytes, reason: str) -> None:
        self.report.malformed += 1
        self.metrics.udp_malformed.inc()
        if self.report.malformed <= 20 or self.report.malformed % 1000 == 0:
            log.warning("udp-bridge: malformed datagram #%d (%s): %r", self.report.malformed, reason, data[:120])

    def handle(self, data: bytes) -> None:
        """Account for and forward one datagram (Prometheus counters are updated by ``flush_metrics``)."""
        self.report.datagrams_received += 1
        try:
            msg = json.loads(data)
        except (UnicodeDecodeError, ValueError) as e:
            self._malformed(data, f"not JSON: {e}")
            return
        if not isinstance(msg, dict):
            self._malformed(data, "not a JSON object")
            return
        seq = msg.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
            self._malformed(data, f"'seq' must be an integer >= 0, got {seq!r}")
            return
        stream = msg.get("stream", "")
        if not isinstance(stream, str):
            self._malformed(data, f"'stream' must be a string, got {stream!r}")
            return
        is_eos = msg.get("eos") is True
        record = msg.get("record")
        rid: Any = None
        if not is_eos:
            if not isinstance(record, dict):
                self._malformed(data, "no 'record' object")
                return
            rid = record.get(self.id_field)
            if rid is None or isinstance(rid, bool | float | dict | list) or rid == "":
                self._malformed(data, f"record has no id field {self.id_field!r}")
                return
        if self._current is None or self._current.stream != stream:
            if stream in self._closed_reports:  # late datagram or repeated EOS of a closed stream
                if not is_eos:
                    self._closed_reports[stream].late_after_close += 1
                    self.report.late_after_close += 1
                return
            self._open(stream)
        cur, tracker = self._current, self._tracker
        assert cur is not None and tracker is not None
        if is_eos:
            count = msg.get("count", seq)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                self._malformed(data, f"EOS 'count' must be an integer >= 0, got {count!r}")
                return
            if not cur.eos_received:
                cur.eos_received = True
                cur.count = count
                self._eos_deadline = time.monotonic() + self.eos_grace_s
            return
        verdict = tracker.observe(seq)
        if verdict is SequenceTracker.NEW or verdict is SequenceTracker.LATE:
            self.sink.send(str(rid).encode("utf-8"), self._record_bytes(data, msg, record))

    @staticmethod
    def _record_bytes(data: bytes, msg: dict[str, Any], record: Any) -> bytes:
        """The record's JSON: sliced from the datagram in the sender's exact layout, else re-encoded.

        Slicing is safe only when nothing nested precedes ``"record"``: keys exactly (stream, seq, record)
        or (seq, record) with a string stream and an integer seq (a quote inside a string is escaped, so
        ``,"record":`` cannot occur inside the stream id), compact separators and nothing after the record.
        """
        if data[-2:] == b"}}" and (len(msg) == 2 or (len(msg) == 3 and "stream" in msg)) \
                and next(reversed(msg)) == "record":
            i = data.find(b',"record":')
            if i > 0:
                return data[i + 10:-1]
        return json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    def _live_totals(self) -> tuple[int, int, int, int]:
        r, t = self.report, self._tracker
        return (r.datagrams_received,
                r.records_forwarded + (t.accepted if t is not None else 0),
                r.gaps + (t.gaps if t is not None else 0),
                r.duplicates + (t.duplicates if t is not None else 0))

    def flush_metrics(self) -> None:
        """Bring the Prometheus counters up to date (the loop calls it every 256 datagrams and when idle)."""
        now = self._live_totals()
        counters = (self.metrics.udp_datagrams_received, self.metrics.udp_records_forwarded,
                    self.metrics.udp_gaps, self.metrics.udp_duplicates)
        for counter, value, pushed in zip(counters, now, self._pushed, strict=True):
            if value > pushed:
                counter.inc(value - pushed)
        self._pushed = now

    # -------------------------------------------------------------------------------------- loop
    def serve(self, stop: threading.Event | None = None, max_seconds: float | None = None,
              on_ready: Callable[[UdpBridge], None] | None = None) -> BridgeReport:
        """Receive until EOS (+grace) with ``exit_on_eos``, ``stop`` is set, or ``max_seconds`` passed."""
        start = time.perf_counter()
        end = time.monotonic() + max_seconds if max_seconds is not None else None
        self.sock.settimeout(0.05)
        recv = self.sock.recv
        self.ready.set()
        if on_ready is not None:
            on_ready(self)
        handled = 0
        idle_since: float | None = None
        try:
            while True:
                try:
                    data = recv(MAX_DATAGRAM)
                    idle_since = None
                    self.handle(data)
                    handled += 1
                    if handled & 255:  # look at the clock every 256 datagrams, or when the socket is idle
                        continue
                except TimeoutError:
                    if idle_since is None:
                        idle_since = time.monotonic()
                self.flush_metrics()
                now = time.monotonic()
                if self._eos_deadline is not None and now >= self._eos_deadline:
                    self._close_current()
                    if self.exit_on_eos:
                        break
                if self.idle_close_s is not None and idle_since is not None and self._current is not None \
                        and now - idle_since >= self.idle_close_s:
                    log.warning("udp-bridge: stream %r idle for %.1f s without EOS: closing it",
                                self._current.stream, now - idle_since)
                    self._close_current()
                    if self.exit_on_eos:
                        break
                if (stop is not None and stop.is_set()) or (end is not None and now >= end):
                    break
        finally:
            self._close_current()
            self.flush_metrics()
            self.sink.flush()
            self.report.seconds = time.perf_counter() - start
            self._totals()
            self.sock.close()
        return self.report

    def _totals(self) -> None:
        self.report.produce_errors = int(getattr(self.sink, "errors", 0))

def free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
