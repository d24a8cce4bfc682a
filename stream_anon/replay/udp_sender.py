"""Send records over UDP, one record per datagram with a sequence number, then an end-of-stream datagram.

This is the ADULT stream setup of the CASTLE/UBDSA experiments: a sender streams the data set
record by record over UDP to the anonymizer.  Datagram format (one UTF-8 JSON object per datagram)::

    {"stream": "9f2c41d0", "seq": 0, "record": {"id": "adult-00000", "age": 39, ...}}
    {"stream": "9f2c41d0", "seq": 1, "record": {...}}
    ...
    {"stream": "9f2c41d0", "seq": 32561, "eos": true, "count": 32561}

* ``seq`` starts at 0 and increases by one per record; ``count`` in the end-of-stream (EOS)
  datagram is the number of records of the stream (= the EOS datagram's own ``seq``), so a
  receiver knows how many trailing records it lost.
* ``stream`` names one run of the sender (random 8 hex digits unless given); a receiver that sees
  a new stream id closes the previous stream.  It is optional (absent = ``""``).
* The EOS datagram is repeated ``eos_repeats`` times (default 5) with growing pauses (10, 40, 160,
  640 ms: ``eos_interval_s * 4**i``, at most 1 s) because UDP may lose it, and it is lost precisely
  when the receiver's buffer is full after a burst: a later copy arrives once the buffer has drained.
* A datagram must fit in 65,507 bytes (the IPv4 UDP payload limit); an ADULT record is ~330 bytes.

UDP is lossy (no retransmission, no back-pressure): if the receiver's socket buffer fills up the
kernel drops datagrams silently, so the sender knows only what it sent, never what was lost.  The
bridge (``stream-anon udp-bridge``) counts the gaps by sequence number (its report, and the metric
``stream_anon_udp_gaps_total``; ``replay_tools.bridge_metrics`` reads them); see docs/replay.md for
the measured loss on loopback.

Test hooks (deterministic): ``drop_seqs`` are never sent (a simulated loss), ``duplicate_seqs`` are
sent twice, ``delay_seqs={s: d}`` sends seq ``s`` right after seq ``s + d`` (reordering).
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from stream_anon.replay.interrupts import InterruptGuard, ReplayInterrupted
from stream_anon.replay.progress import ProgressBar, RateLimiter

MAX_DATAGRAM_BYTES = 65_507


@dataclass
class UdpSendStats:
    """What the sender did. ``records`` = sequence numbers assigned (= EOS ``count``), including hook drops.

    The sender cannot know how many datagrams the network lost: that is the bridge's gap count.
    """

    stream: str
    records: int = 0
    datagrams_sent: int = 0
    dropped_by_hook: int = 0
    duplicated_by_hook: int = 0
    eos_sent: int = 0
    send_errors: int = 0
    seconds: float = 0.0  # sending the records (EOS pauses excluded)
    target_rate: float = 0.0
    interrupted: str | None = None  # the signal that stopped the sender (SIGINT, SIGTERM), if any

    @property
    def rate_achieved(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """What the sender knows: records and datagrams sent.  It says where the loss is counted instead
        of a loss figure (UDP drops silently: a sender-side "0 dropped" would be false)."""
        target = f"{self.target_rate:,.0f} rec/s" if self.target_rate > 0 else "as fast as possible"
        hooks = ""
        if self.dropped_by_hook or self.duplicated_by_hook:
            hooks = (f"; test hooks: {self.dropped_by_hook} sequence numbers not sent, "
                     f"{self.duplicated_by_hook} sent twice")
        errors = (f"; {self.send_errors} send errors (is a receiver listening on the target?)"
                  if self.send_errors else "")
        return (f"UDP stream {self.stream!r}: {self.records:,} records, {self.datagrams_sent:,} datagrams sent "
                f"(including {self.eos_sent} end-of-stream copies) in {self.seconds:.2f} s: "
                f"{self.rate_achieved:,.0f} rec/s achieved, target {target}{hooks}{errors}. "
                "Lost datagrams are invisible to the sender: the bridge counts them (gaps in its report, "
                "stream_anon_udp_gaps_total; give --bridge-metrics URL to print them here)")

    def interrupted_summary(self) -> str:
        """One line for a sender stopped by a signal."""
        eos = (f"end-of-stream (count {self.records:,}) sent {self.eos_sent}x" if self.eos_sent
               else "no end-of-stream sent")
        return (f"UDP sender interrupted by {self.interrupted}: {self.records:,} records, {self.datagrams_sent:,} "
                f"datagrams sent on stream {self.stream!r}; {eos}")


def record_datagram(seq: int, record: Mapping[str, Any], stream: str = "") -> bytes:
    """The datagram carrying ``record`` with sequence number ``seq``."""
    body = json.dumps({"stream": stream, "seq": seq, "record": record}, separators=(",", ":"), ensure_ascii=False)
    data = body.encode("utf-8")
    if len(data) > MAX_DATAGRAM_BYTES:
        raise ValueError(f"record seq={seq} (id {record.get('id')!r}) encodes to {len(data)} bytes; "
                         f"a UDP datagram holds at most {MAX_DATAGRAM_BYTES}")
    return data


def eos_datagram(count: int, stream: str = "") -> bytes:
    """The end-of-stream datagram of a stream of ``count`` records (its ``seq`` is ``count``)."""
    return json.dumps({"stream": stream, "seq": count, "eos": True, "count": count},
                      separators=(",", ":")).encode("utf-8")


def new_stream_id() -> str:
    return os.urandom(4).hex()


def send_udp(records: Iterable[Mapping[str, Any]], host: str, port: int, rate: float = 0.0, *,
             stream_id: str | None = None, limit: int | None = None, eos: bool = True, eos_repeats: int = 5,
             eos_interval_s: float = 0.01, drop_seqs: Collection[int] = (), duplicate_seqs: Collection[int] = (),
             delay_seqs: Mapping[int, int] | None = None, progress: bool = False, total: int | None = None,
             preencode: bool = False, sndbuf_bytes: int = 4 * 1024 * 1024,
             interrupts: InterruptGuard | None = None) -> UdpSendStats:
    """Send ``records`` to ``host:port``, one per datagram, at ``rate`` records/s (0 = as fast as possible).

    ``preencode`` encodes every datagram before the clock starts (the loss benchmark uses it, so the
    sender's JSON encoding does not cap the rate; it holds all datagrams in memory).
    Returns the sender's accounting; the receiver's is the bridge report.  See the module docstring
    for the datagram format and the test hooks.  A :class:`ReplayInterrupted` (the signal handlers of
    ``interrupts``) stops the records; the EOS datagram (``count`` = the records sent so far) still goes out
    so that the bridge closes the stream with the right count (a second signal skips it), and the stats
    come back with ``interrupted`` set.
    """
    if rate < 0:
        raise ValueError(f"rate: expected records/s >= 0 (0 = as fast as possible), got {rate!r}")
    if eos_repeats < 1:
        raise ValueError(f"eos_repeats: expected an integer >= 1, got {eos_repeats!r}")
    stream = stream_id if stream_id is not None else new_stream_id()
    drop = set(drop_seqs)
    dup = set(duplicate_seqs)
    delays = dict(delay_seqs or {})
    if any(d < 1 for d in delays.values()):
        raise ValueError(f"delay_seqs: delays must be >= 1 sequence numbers, got {delays!r}")
    held: dict[int, list[bytes]] = {}  # seq after which to send -> datagrams held back
    stats = UdpSendStats(stream=stream, target_rate=float(rate))
    limiter = RateLimiter(rate)
    bar = ProgressBar(total if limit is None else (min(total, limit) if total else limit),
                      label=f"udp -> {host}:{port}", enabled=progress)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf_bytes)
        sock.connect((host, port))
        send = sock.send

        def emit(data: bytes) -> None:
            try:
                send(data)
                stats.datagrams_sent += 1
            except OSError:  # ENOBUFS / ECONNREFUSED (ICMP port unreachable from an earlier datagram)
                stats.send_errors += 1

        encoded: Iterable[bytes]
        if preencode:
            encoded = [record_datagram(i, rec, stream) for i, rec in enumerate(itertools.islice(records, limit))]
        else:
            encoded = (record_datagram(i, rec, stream) for i, rec in enumerate(itertools.islice(records, limit)))
        start = time.perf_counter()
        seq = 0
        try:
            for data in encoded:
                limiter.wait(seq)
                if interrupts is not None:
                    interrupts.deferring = True  # one sequence number is sent whole or not at all
                if seq in drop:
                    stats.dropped_by_hook += 1
                elif seq in delays:
                    held.setdefault(seq + delays[seq], []).append(data)
                else:
                    emit(data)
                    if seq in dup:
                        emit(data)
                        stats.duplicated_by_hook += 1
                for late in held.pop(seq, ()):
                    emit(late)
                seq += 1
                if interrupts is not None:
                    interrupts.deferring = False
                    interrupts.check()
                if seq & 255 == 0:
                    bar.update(seq)
            for s in sorted(held):  # delays past the end: send before EOS
                for late in held[s]:
                    emit(late)
        except ReplayInterrupted as e:
            if interrupts is not None:
                interrupts.deferring = False
            stats.interrupted = e.signal_name
        stats.records = seq
        stats.seconds = time.perf_counter() - start  # the records' send time (EOS pauses excluded)
        bar.update(seq)
        bar.close()
        if eos:
            data = eos_datagram(seq, stream)
            try:
                for i in range(eos_repeats):
                    if i:
                        time.sleep(min(eos_interval_s * 4 ** (i - 1), 1.0))
                    try:
                        send(data)
                    except OSError:  # refused after a first copy: the receiver left (--exit-on-eos); stop
                        if stats.eos_sent:
                            break
                        stats.send_errors += 1
                        continue
                    stats.datagrams_sent += 1
                    stats.eos_sent += 1
            except ReplayInterrupted as e:
                stats.interrupted = stats.interrupted or e.signal_name
    finally:
        sock.close()
    return stats
