"""UDP bridge logic without sockets or Kafka: sequence accounting, malformed datagrams, streams, metrics."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from replay_tools.udp_sender import eos_datagram, record_datagram
from stream_anon.service.metrics import ServiceMetrics
from stream_anon.service.udp_bridge import SequenceTracker, UdpBridge, parse_listen


class ListSink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []

    def send(self, key: bytes, value: bytes) -> None:
        self.sent.append((key, value))

    def flush(self, timeout_s: float = 30.0) -> None:
        pass

    def close(self) -> None:
        pass


def feed(tracker: SequenceTracker, seqs: list[int]) -> list[str]:
    return [tracker.observe(s) for s in seqs]


# ------------------------------------------------------------------------------------------ SequenceTracker
def test_in_order_stream_has_no_gaps_or_duplicates() -> None:
    t = SequenceTracker(window=16)
    assert set(feed(t, list(range(100)))) == {"new"}
    assert t.close(count=100) == 0
    assert (t.accepted, t.gaps, t.duplicates, t.stale) == (100, 0, 0, 0)


def test_late_datagram_filling_a_hole_is_not_a_duplicate() -> None:
    t = SequenceTracker(window=16)
    assert feed(t, [0, 1, 3, 4, 2]) == ["new", "new", "new", "new", "late"]
    assert t.gaps == 0 and t.duplicates == 0 and t.pending == 0
    assert feed(t, [2, 4]) == ["duplicate", "duplicate"]
    assert t.duplicates == 2 and t.accepted == 5


def test_holes_become_gaps_only_when_they_leave_the_window_or_at_close() -> None:
    t = SequenceTracker(window=8)
    feed(t, [0, 1, 2, 4])  # 3 missing, still inside the window
    assert t.gaps == 0 and t.pending == 1
    feed(t, [9, 10, 11])  # window (11-8, 11] = 4..11: seq 3 left it unseen -> final gap
    assert t.gaps == 1
    assert t.observe(3) == "stale"  # too late: its gap was already counted; dropped
    assert t.pending == 4  # 5, 6, 7, 8 are holes inside the window
    assert t.close(count=14) == 4 + 2  # the holes, and 12, 13 lost after the last datagram received
    assert t.accepted + t.gaps == 14


def test_jump_larger_than_the_window() -> None:
    t = SequenceTracker(window=4)
    feed(t, [0, 1])
    assert t.observe(100) == "new"
    assert t.gaps == 95 and t.pending == 3  # 2..96 left the window (97, 98, 99) unseen: final; 97..99 may come
    assert t.observe(98) == "late"
    assert t.close(count=101) == 2
    assert t.accepted + t.gaps == 101 and t.gaps == 97


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window"):
        SequenceTracker(window=0)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 400), seed=st.integers(0, 2**32 - 1), window=st.sampled_from([8, 64, 1024]))
def test_forwarded_plus_gaps_equals_count_under_drops_duplicates_and_local_reordering(n: int, seed: int,
                                                                                       window: int) -> None:
    import numpy as np

    rng = np.random.default_rng(seed)
    seqs = [s for s in range(n) if rng.random() > 0.1]  # ~10% lost
    dups = [s for s in seqs if rng.random() < 0.05]
    stream = seqs + dups
    # reorder locally: sort by seq + a displacement smaller than the window, so nothing is stale
    keys = [s + rng.integers(0, max(1, window // 4)) for s in stream]
    order = [s for _, s in sorted(zip(keys, stream, strict=True), key=lambda t: t[0])]
    t = SequenceTracker(window=window)
    verdicts = feed(t, order)
    t.close(count=n)
    assert t.accepted == len(seqs)  # every received seq forwarded exactly once
    assert t.accepted + t.gaps == n
    assert t.duplicates == len(dups) and t.stale == 0
    assert verdicts.count("new") + verdicts.count("late") == len(seqs)


# ------------------------------------------------------------------------------------------ UdpBridge.handle
@pytest.fixture
def bridge() -> Iterator[tuple[UdpBridge, ListSink, ServiceMetrics]]:
    metrics = ServiceMetrics(CollectorRegistry())
    sink = ListSink()
    b = UdpBridge("127.0.0.1", 0, sink, metrics, window=32)
    yield b, sink, metrics
    b.sock.close()


def metric(metrics: ServiceMetrics, name: str) -> float:
    v = metrics.registry.get_sample_value(name)
    return 0.0 if v is None else v


def rec(i: int) -> dict:
    return {"id": f"adult-{i:05d}", "age": 30 + i % 10, "income": "<=50K"}


def test_bridge_forwards_records_keyed_by_id_and_counts_everything(bridge) -> None:
    b, sink, m = bridge
    sent = [record_datagram(i, rec(i), "s1") for i in range(10)]
    for i in (0, 1, 2, 4, 5, 3, 5, 7, 8, 9):  # 6 lost, 3 late, 5 duplicated
        b.handle(sent[i])
    b.handle(eos_datagram(10, "s1"))
    b.handle(eos_datagram(10, "s1"))  # repeated EOS: ignored
    b._close_current()
    b.flush_metrics()
    assert [k for k, _ in sink.sent] == [f"adult-{i:05d}".encode() for i in (0, 1, 2, 4, 5, 3, 7, 8, 9)]
    assert json.loads(sink.sent[0][1]) == rec(0)  # the record itself, compact JSON
    s = b.report.streams[0]
    assert (s.count, s.forwarded, s.gaps, s.duplicates, s.eos_received) == (10, 9, 1, 1, True)
    assert s.forwarded + s.gaps == s.count
    assert metric(m, "stream_anon_udp_datagrams_received_total") == 12
    assert metric(m, "stream_anon_udp_records_forwarded_total") == 9
    assert metric(m, "stream_anon_udp_gaps_total") == 1
    assert metric(m, "stream_anon_udp_duplicates_total") == 1
    assert metric(m, "stream_anon_udp_malformed_total") == 0


@pytest.mark.parametrize(("data", "why"), [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"record": {"id": "a"}}', "seq"),
    (b'{"seq": -1, "record": {"id": "a"}}', "seq"),
    (b'{"seq": true, "record": {"id": "a"}}', "seq"),
    (b'{"seq": 1.5, "record": {"id": "a"}}', "seq"),
    (b'{"seq": 0, "stream": 5, "record": {"id": "a"}}', "stream"),
    (b'{"seq": 0}', "record"),
    (b'{"seq": 0, "record": {"age": 3}}', "id"),
    (b'{"seq": 0, "eos": true, "count": "x"}', "count"),
    (b"", "not JSON"),
])
def test_malformed_datagrams_are_counted_not_forwarded(bridge, data: bytes, why: str, caplog) -> None:
    b, sink, m = bridge
    b.handle(data)
    assert sink.sent == [] and b.report.malformed == 1
    assert metric(m, "stream_anon_udp_malformed_total") == 1
    assert why in caplog.text


def test_new_stream_closes_the_previous_one_and_late_datagrams_of_a_closed_stream_are_dropped(bridge) -> None:
    b, sink, m = bridge
    for i in range(5):
        b.handle(record_datagram(i, rec(i), "A"))
    for i in range(3):  # stream B starts: A is closed without EOS (count unknown, holes only)
        b.handle(record_datagram(i, rec(100 + i), "B"))
    b.handle(record_datagram(5, rec(5), "A"))  # late datagram of closed stream A
    b.handle(eos_datagram(3, "B"))
    b._close_current()
    b.flush_metrics()
    a, bb = b.report.streams
    assert (a.stream, a.count, a.forwarded, a.gaps, a.late_after_close) == ("A", None, 5, 0, 1)
    assert (bb.stream, bb.count, bb.forwarded, bb.gaps) == ("B", 3, 3, 0)
    assert len(sink.sent) == 8 and b.report.records_forwarded == 8 and b.report.late_after_close == 1
    assert metric(m, "stream_anon_udp_records_forwarded_total") == 8


def test_record_bytes_are_sliced_only_in_the_senders_exact_layout() -> None:
    r = {"id": "x", "note": 'a ,"record": b', "nested": {"record": 1}}
    data = record_datagram(0, r, 'str"eam')
    value = UdpBridge._record_bytes(data, json.loads(data), r)
    assert json.loads(value) == r
    # another layout (extra nested key before the record): re-encoded, never mis-sliced
    odd = json.dumps({"x": {"a": 1, "record": 2}, "seq": 0, "record": r}, separators=(",", ":")).encode()
    assert json.loads(UdpBridge._record_bytes(odd, json.loads(odd), r)) == r
    spaced = json.dumps({"seq": 0, "record": r}).encode()  # default separators with spaces
    assert json.loads(UdpBridge._record_bytes(spaced, json.loads(spaced), r)) == r


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9999") == ("127.0.0.1", 9999)
    assert parse_listen("[::1]:5000") == ("::1", 5000)
    assert parse_listen(":5000") == ("127.0.0.1", 5000)
    for bad in ("127.0.0.1", "host:port", "h:70000"):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen(bad)


def test_record_datagram_rejects_oversized_records() -> None:
    with pytest.raises(ValueError, match="65507"):
        record_datagram(0, {"id": "big", "blob": "x" * 70_000})
