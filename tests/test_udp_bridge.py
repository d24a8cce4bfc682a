"""ADULT over loopback UDP through the bridge into the real broker; accounting, metrics endpoint, CLI, loss bench."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
import uuid

import pytest
from prometheus_client import CollectorRegistry

from stream_anon.bench.udp_loss import format_table, udp_loss_bench
from stream_anon.core.datasets import iter_adult_records
from stream_anon.kafka_io.broker import free_port
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.metrics.endpoint import serve_metrics
from stream_anon.replay.kafka_replay import ensure_topic, read_topic
from stream_anon.replay.udp_sender import send_udp
from stream_anon.service.udp_bridge import KafkaSink, NullSink, UdpBridge, free_udp_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adult_records(adult_path) -> list[dict]:
    return list(iter_adult_records(adult_path))


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("stream_anon_udp_"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_adult_over_udp_into_kafka_accounts_for_every_sequence_number(broker, adult_records) -> None:
    topic = f"udp.raw.{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap_servers, topic, 2)
    n = 3000
    records = adult_records[:n]
    drop = {0, 10, 1234, n - 1}  # first, middle and last records lost
    dup = {20, 21, 1500}
    delay = {100: 3, 200: 40, 2500: 400}  # reordering: late datagrams fill their holes, not duplicates
    metrics = ServiceMetrics(CollectorRegistry())
    mport = free_port()
    serve_metrics(metrics.registry, mport)
    sink = KafkaSink(broker.bootstrap_servers, topic, metrics=metrics)
    bridge = UdpBridge("127.0.0.1", 0, sink, metrics, exit_on_eos=True, eos_grace_s=0.3)
    result: dict = {}
    th = threading.Thread(target=lambda: result.setdefault("report", bridge.serve(max_seconds=60)), daemon=True)
    th.start()
    assert bridge.ready.wait(10)
    stats = send_udp(records, "127.0.0.1", bridge.port, rate=6000, drop_seqs=drop, duplicate_seqs=dup,
                     delay_seqs=delay, stream_id="adult-test")
    th.join(60)
    assert not th.is_alive()
    sink.close()
    report = result["report"]
    s = report.streams[0]
    assert stats.records == n and stats.dropped_by_hook == len(drop) and stats.duplicated_by_hook == len(dup)
    # the accounting identity, whatever UDP did: every sequence number is forwarded or a gap
    assert s.count == n and s.eos_received
    assert s.forwarded + s.gaps == n
    # at 6,000 rec/s on loopback with an 8 MiB buffer nothing else is lost: the hooks' drops are the gaps exactly
    assert s.gaps == len(drop), report.summary()
    assert s.duplicates == len(dup) and s.stale == 0 and report.malformed == 0
    # EOS copies received: at least one; the later ones (up to 850 ms after) may come after the bridge left
    assert 1 <= report.datagrams_received - (n - len(drop) + len(dup)) <= stats.eos_sent
    # what reached Kafka: every record not dropped, exactly once, keyed by id, value = the record
    got = read_topic(broker.bootstrap_servers, topic, expected=n - len(drop))
    keys = sorted(k.decode() for _, _, k, _ in got)
    assert keys == sorted(r["id"] for i, r in enumerate(records) if i not in drop)
    by_id = {r["id"]: r for r in records}
    assert all(json.loads(v) == by_id[k.decode()] for _, _, k, v in got)
    # the same numbers on the Prometheus endpoint (127.0.0.1)
    scraped = _scrape(mport)
    assert scraped["stream_anon_udp_records_forwarded_total"] == n - len(drop)
    assert scraped["stream_anon_udp_gaps_total"] == len(drop)
    assert scraped["stream_anon_udp_duplicates_total"] == len(dup)
    assert scraped["stream_anon_udp_malformed_total"] == 0
    assert scraped["stream_anon_udp_datagrams_received_total"] == report.datagrams_received
    print(f"\n{stats.summary()}\n{report.summary()}")


def test_cli_udp_bridge_exits_on_eos_and_prints_a_json_report(broker, adult_records) -> None:
    topic = f"udp.cli.{uuid.uuid4().hex[:8]}"
    port = free_udp_port()
    mport = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "stream_anon", "udp-bridge", "--listen", f"127.0.0.1:{port}",
                             "--topic", topic, "--bootstrap-servers", broker.bootstrap_servers, "--exit-on-eos",
                             "--eos-grace", "0.2", "--metrics-port", str(mport), "--report-json", "-",
                             "--partitions", "3", "--max-seconds", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        line = ""
        while "listening on" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        assert "listening on" in line, line
        assert f"metrics http://127.0.0.1:{mport}/metrics" in line
        stats = send_udp(adult_records[:1000], "127.0.0.1", port, rate=5000, duplicate_seqs={3})
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    assert report["records_forwarded"] + report["gaps"] == stats.records == 1000
    assert report["duplicates"] == 1
    assert "records forwarded" in err  # human summary on stderr
    got = read_topic(broker.bootstrap_servers, topic, expected=report["records_forwarded"])
    assert len(got) == report["records_forwarded"] and {p for p, *_ in got} <= {0, 1, 2}


def test_idle_close_ends_a_stream_whose_eos_never_came(adult_records) -> None:
    metrics = ServiceMetrics(CollectorRegistry())
    sink = NullSink()
    bridge = UdpBridge("127.0.0.1", 0, sink, metrics, exit_on_eos=True, idle_close_s=0.3)
    result: dict = {}
    th = threading.Thread(target=lambda: result.setdefault("report", bridge.serve(max_seconds=30)), daemon=True)
    th.start()
    assert bridge.ready.wait(10)
    send_udp(adult_records[:500], "127.0.0.1", bridge.port, rate=5000, eos=False, drop_seqs={7})
    th.join(30)
    assert not th.is_alive()
    (s,) = result["report"].streams
    assert s.count is None and not s.eos_received  # no EOS: count unknown
    assert (s.forwarded, s.gaps) == (499, 1) and sink.sent == 499


def test_udp_loss_bench_counts_sent_received_and_lost(adult_records) -> None:
    rows = udp_loss_bench(adult_records[:2000], [5000.0], sink="null")
    (row,) = rows
    assert row.sent == 2000 and row.received + row.lost == row.sent
    assert row.lost == 0  # 2,000 datagrams fit in the 8 MiB receive buffer whatever the bridge's speed
    table = format_table(rows, "null")
    assert "| 5,000 |" in table and "| 2,000 | 2,000 | 0 | 0.00 | 0 |" in table
    print("\n" + table)
