"""UDP bridge logic without Kafka: sequence accounting, malformed datagrams, streams, metrics; the sender's
summary (what it can know) and the loss measured by the bridge, read from its metrics endpoint (loopback)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest, start_http_server

from replay_tools.bridge_metrics import (
    BridgeCounters,
    BridgeMetricsError,
    metrics_url,
    parse_bridge_counters,
    scrape_bridge_counters,
    wait_for_stream_loss,
)
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.replay.udp_sender import UdpSendStats, eos_datagram, record_datagram, send_udp
from stream_anon.service.udp_bridge import NullSink, SequenceTracker, UdpBridge, free_udp_port, parse_listen


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


# ------------------------------------------------------------------------------------------ the sender's view
def test_sender_summary_never_claims_a_loss_figure_it_cannot_know() -> None:
    s = UdpSendStats(stream="s1", records=32_561, datagrams_sent=32_566, eos_sent=5, seconds=1.5)
    text = s.summary()
    assert "dropped" not in text and "0 lost" not in text  # the old "0 dropped" read as a loss count
    assert "32,561 records, 32,566 datagrams sent (including 5 end-of-stream copies)" in text
    assert "invisible to the sender" in text and "stream_anon_udp_gaps_total" in text and "--bridge-metrics" in text
    hooks = UdpSendStats(stream="s1", records=10, datagrams_sent=9, dropped_by_hook=2, duplicated_by_hook=1)
    assert "test hooks: 2 sequence numbers not sent, 1 sent twice" in hooks.summary()


def test_bridge_counters_are_parsed_from_the_exposition_format() -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    metrics.udp_datagrams_received.inc(12)
    metrics.udp_records_forwarded.inc(9)
    metrics.udp_gaps.inc(3)
    metrics.udp_duplicates.inc(1)
    text = generate_latest(metrics.registry).decode()
    assert parse_bridge_counters(text) == BridgeCounters(received=12, forwarded=9, gaps=3, duplicates=1, malformed=0)
    with pytest.raises(BridgeMetricsError, match="stream_anon_udp_gaps_total"):
        parse_bridge_counters("# HELP x y\n# TYPE x counter\nx_total 1.0\n", source="http://h:1/metrics")
    assert metrics_url("127.0.0.1:9466") == "http://127.0.0.1:9466/metrics"
    assert metrics_url("http://h:1/") == "http://h:1/metrics" and metrics_url("http://h:1/m") == "http://h:1/m"


def test_wait_for_stream_loss_stops_when_the_bridge_accounted_for_every_record_or_at_the_deadline() -> None:
    before = BridgeCounters(received=100, forwarded=90, gaps=10, duplicates=0, malformed=0)
    scrapes = iter([BridgeCounters(150, 130, 10, 0, 0), BridgeCounters(200, 180, 12, 1, 0),
                    BridgeCounters(205, 185, 15, 1, 0)])
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s

    loss = wait_for_stream_loss("h:1", before, 100, scrape=lambda url: next(scrapes), clock=lambda: now[0],
                                sleep=sleep, poll_s=0.1)
    assert (loss.forwarded, loss.gaps, loss.duplicates, loss.final) == (95, 5, 1, True)  # 95 + 5 == 100 records
    assert loss.loss_pct == pytest.approx(5.0) and "5 lost (5.00 %" in loss.summary()
    stuck = wait_for_stream_loss("h:1", before, 100, scrape=lambda url: BridgeCounters(150, 130, 10, 0, 0),
                                 clock=lambda: now[0], sleep=sleep, timeout_s=1.0, poll_s=0.1)
    assert not stuck.final and "not final" in stuck.summary()

    def gone(url: str) -> BridgeCounters:
        raise BridgeMetricsError("cannot read the bridge's metrics at http://h:1/metrics: refused")
    exited = wait_for_stream_loss("h:1", before, 100, scrape=gone, clock=lambda: now[0], sleep=sleep)
    assert exited.gone and not exited.final and "its own report has the loss" in exited.summary()


@pytest.fixture
def bridge_with_metrics() -> Iterator[tuple[UdpBridge, str, dict]]:
    """A real bridge (null sink) on loopback, its metrics on an HTTP endpoint, serving in a thread."""
    metrics = ServiceMetrics(CollectorRegistry())
    httpd, _thread = start_http_server(0, addr="127.0.0.1", registry=metrics.registry)
    b = UdpBridge("127.0.0.1", 0, NullSink(), metrics, exit_on_eos=True, eos_grace_s=0.2)
    result: dict = {}
    th = threading.Thread(target=lambda: result.setdefault("report", b.serve(max_seconds=60)), daemon=True)
    th.start()
    assert b.ready.wait(10)
    yield b, f"127.0.0.1:{httpd.server_port}", result
    th.join(60)
    httpd.shutdown()


def test_the_loss_measured_by_the_bridge_is_what_was_lost(bridge_with_metrics) -> None:
    b, url, result = bridge_with_metrics
    before = scrape_bridge_counters(url)
    drop = {0, 17, 250, 299}  # simulated loss: these sequence numbers never leave the sender
    stats = send_udp([rec(i) for i in range(300)], "127.0.0.1", b.port, rate=3000, drop_seqs=drop, stream_id="m")
    loss = wait_for_stream_loss(url, before, stats.records, timeout_s=30)
    assert loss.final and loss.count == 300
    assert loss.gaps == len(drop) and loss.forwarded == 300 - len(drop)  # measured at the bridge, not assumed
    assert f"{300 - len(drop)} of 300 records forwarded, {len(drop)} lost (1.33 %" in loss.summary()


@pytest.mark.integration
def test_cli_udp_with_bridge_metrics_prints_the_bridges_count(bridge_with_metrics) -> None:
    b, url, result = bridge_with_metrics
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "udp", "--synthetic", "200", "--seed", "3",
                           "--rate", "2000", "--target", f"127.0.0.1:{b.port}", "--bridge-metrics", url,
                           "--no-progress"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 2 and "invisible to the sender" in lines[0] and "dropped" not in lines[0]
    assert lines[-1].startswith(f"bridge (http://{url}/metrics): ")
    forwarded = result_wait(result)["records_forwarded"]
    assert f"{forwarded} of 200 records forwarded, {200 - forwarded} lost" in lines[-1]


def result_wait(result: dict) -> dict:
    """The bridge report once its thread returned (exit on EOS); the fixture joins the thread."""
    for _ in range(600):
        if "report" in result:
            return result["report"].to_dict()
        threading.Event().wait(0.05)
    raise AssertionError("the bridge did not finish")


@pytest.mark.integration
def test_cli_udp_with_an_unreadable_metrics_url_fails_before_sending() -> None:
    port = free_udp_port()
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "udp", "--synthetic", "5", "--target",
                           f"127.0.0.1:{port}", "--bridge-metrics", f"127.0.0.1:{port}", "--no-progress"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "cannot read the bridge's metrics" in proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_udp_sender_with_one_line_and_an_eos_of_the_right_count(sig: signal.Signals) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)  # hold all until we read them
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(30)
    port = receiver.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "replay_tools", "udp", "--synthetic", "0", "--seed", "1",
                             "--rate", "300", "--target", f"127.0.0.1:{port}", "--eos-repeats", "1", "--no-progress"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    got: list[dict] = []
    try:
        while len(got) < 20:  # the event: datagrams arriving (an unbounded stream at 300/s)
            got.append(json.loads(receiver.recv(65535)))
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
        receiver.settimeout(0.5)  # the sender has exited: what it sent is in our socket buffer
        while True:
            try:
                got.append(json.loads(receiver.recv(65535)))
            except TimeoutError:
                break
    finally:
        receiver.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig
    assert "Traceback" not in err and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("sending synthetic")
    m = re.fullmatch(rf"UDP sender interrupted by {sig.name}: ([\d,]+) records, ([\d,]+) datagrams sent on stream "
                     r"'(\w+)'; end-of-stream \(count ([\d,]+)\) sent 1x", lines[1])
    assert m, lines[1]
    records, datagrams, count = (int(m.group(i).replace(",", "")) for i in (1, 2, 4))
    assert count == records >= 20 and datagrams == records + 1
    eos = [d for d in got if d.get("eos")]
    assert [d["count"] for d in eos] == [records]  # the bridge would close the stream with the right count
    assert sorted(d["seq"] for d in got if not d.get("eos")) == list(range(records))  # loopback at 300/s: no loss
