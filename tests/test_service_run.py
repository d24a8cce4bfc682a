"""``stream-anon run``: embedded broker by default (stopped on exit), metrics endpoint on 127.0.0.1,
broker unreachable at start -> retries with backoff and a clear error, never a crash loop."""

from __future__ import annotations

import json
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
from config_support import hermetic_config
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry, Histogram
from waiting import Deadline, wait_for

from stream_anon.core.datasets import iter_adult_records
from stream_anon.kafka_io.broker import free_port
from stream_anon.metrics.definitions import BulkHistogram, ServiceMetrics
from stream_anon.runtime.run import start_metrics
from stream_anon.service.app import MainPath
from stream_anon.service.audit import send_flush_markers


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_run_without_bootstrap_servers_starts_and_stops_an_embedded_broker(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "-m", "stream_anon", "run", "--metrics-port", "0", "--no-side-paths"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115

    def embedded_port() -> int | None:
        m = re.search(r"embedded Tansu broker on 127\.0\.0\.1:(\d+)", log.read_text())
        return int(m.group(1)) if m and "main path: consuming" in log.read_text() else None

    port = wait_for(embedded_port, 60, "the embedded broker and the main path consuming",
                    alive=lambda: proc.poll() is None, context=log.read_text)
    assert _port_open(port)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, log.read_text()[-2000:]
    assert not _port_open(port)  # the broker was stopped on exit


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_unreachable_broker_retries_with_backoff_then_fails_clearly(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "stream_anon", "run", "--bootstrap-servers", f"127.0.0.1:{port}",
                          "--metrics-port", "0", "--no-side-paths", "--set", "kafka.startup_retry_seconds=6",
                          "--set", "kafka.connect_timeout_ms=1000",
                          "--set", "kafka.retry_backoff_max_seconds=1"],
                         capture_output=True, text=True, timeout=50)
    elapsed = time.monotonic() - t0
    text = out.stdout + out.stderr
    assert out.returncode == 3, text[-2000:]
    assert text.count("unreachable") >= 3  # one clear line per attempt
    assert "retrying in" in text and "Traceback" not in text
    assert 3.0 <= elapsed < 40


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_metrics_endpoint_on_loopback_reports_the_flow(broker, adult_path: Path) -> None:
    bs = broker.bootstrap_servers
    prefix = f"met{uuid.uuid4().hex[:6]}"
    port = free_port()
    cfg = hermetic_config(bs, {
        "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "topics.input": f"{prefix}.raw", "topics.anon": f"{prefix}.anon", "topics.suppressed": f"{prefix}.suppressed",
        "topics.dlq": f"{prefix}.dlq", "anonymization.k": 5, "anonymization.delta": 200, "anonymization.seed": 2,
        "service.metrics_port": port, "service.commit_interval_ms": 100, "side_paths.enabled": False})
    registry = CollectorRegistry()
    start_metrics(cfg, registry)
    main = MainPath(cfg, metrics=ServiceMetrics(registry))
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    assert main.ready.wait(30)
    producer = KafkaProducer(bootstrap_servers=bs)
    n = 2000
    for i, rec in enumerate(iter_adult_records(adult_path)):
        if i == n:
            break
        producer.send(cfg.topics.input, key=rec["id"].encode(), value=json.dumps(rec).encode())
    producer.send(cfg.topics.input, value=b"{not json")
    send_flush_markers(producer, cfg.topics.input, [0])
    producer.close()
    deadline = Deadline(60, "the records and both markers committed, and the position gauges following")
    wait_for(lambda: main.committed.get(0) == n + 2, deadline.remaining, "every record and marker committed",
             alive=th.is_alive, context=lambda: f"{main.totals}")
    topic = cfg.topics.input
    position = (f'stream_anon_commit_watermark{{partition="0",topic="{topic}"}} {float(n + 2)}',
                f'stream_anon_consumer_lag{{partition="0",topic="{topic}"}} 0.0')
    # the position gauges follow the commit once per commit interval: scrape until they show it (or the deadline)
    while True:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        if all(line in body.splitlines() for line in position) or deadline.expired():
            break
        time.sleep(0.05)
    main.stop_event.set()
    th.join(30)

    def value(name: str, labels: str = "") -> float:
        m = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", body, re.M)
        assert m, f"{name}{labels} not in /metrics"
        return float(m.group(1))

    assert value("stream_anon_records_consumed_total", f'{{topic="{topic}"}}') == n + 1
    released = value("stream_anon_records_released_total", f'{{topic="{cfg.topics.anon}"}}')
    suppressed = value("stream_anon_records_suppressed_total", '{reason="delay_bound"}')
    assert released + suppressed == n
    assert value("stream_anon_records_dead_lettered_total", '{reason="malformed_json"}') == 1
    assert value("stream_anon_commit_watermark", f'{{partition="0",topic="{topic}"}}') == n + 2
    assert value("stream_anon_consumer_lag", f'{{partition="0",topic="{topic}"}}') == 0
    assert value("stream_anon_release_delay_arrivals_count") == n
    assert value("stream_anon_release_delay_arrivals_bucket", '{le="250.0"}') == n  # delta = 200 <= 250
    assert value("stream_anon_class_size_count") > 0 and 0 < value("stream_anon_gt_loss") < 1
    assert value("stream_anon_processing_seconds_count") > 0
    assert value("stream_anon_buffered_records", '{partition="0"}') == 0
    assert value("stream_anon_k") == 5 and value("stream_anon_delay_bound_arrivals") == 200
    # loopback only: not reachable on another local address of this host
    host_ip = socket.gethostbyname(socket.gethostname())
    if not host_ip.startswith("127."):
        with pytest.raises(OSError):
            socket.create_connection((host_ip, port), timeout=1).close()


def test_bulk_histogram_counts_what_observe_counts() -> None:
    """BulkHistogram.observe_many (one numpy pass, public custom-collector API) exports exactly what
    prometheus_client's Histogram.observe does value by value: bounds inclusive, NaN in the sum and in no bucket."""
    a_reg, b_reg = CollectorRegistry(), CollectorRegistry()
    a = Histogram("h", "h", buckets=(1, 5, 10, 25), registry=a_reg)
    b = BulkHistogram("h", "h", buckets=(1, 5, 10, 25), registry=b_reg)
    values = [*np.random.default_rng(0).uniform(0, 40, 1000).tolist(), 1.0, 5.0, 10.0, 25.0, 0.0, 99.0, -3.0]
    for v in values:
        a.observe(v)
    b.observe_many(values)
    b.observe_many([])
    b.observe(7.0)
    a.observe(7.0)

    def samples(r: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {(s.name, s.labels.get("le", "")): float(s.value) for m in r.collect() for s in m.samples
                if not s.name.endswith("_created")}

    sa, sb = samples(a_reg), samples(b_reg)
    assert sa.keys() == sb.keys() and len(sa) == 7
    for key, val in sa.items():
        assert sb[key] == pytest.approx(val, rel=1e-12)
    a.observe(math.nan)  # NaN: observe() adds it to the sum and to no bucket; observe_many([nan]) the same
    b.observe_many([math.nan])
    sa, sb = samples(a_reg), samples(b_reg)
    assert math.isnan(sa[("h_sum", "")]) and math.isnan(sb[("h_sum", "")])
    assert {k: v for k, v in sa.items() if k[0] != "h_sum"} == {k: v for k, v in sb.items() if k[0] != "h_sum"}


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("workers", [0, 1])
def test_idle_flush_releases_a_quiet_partition(broker, adult_path: Path, workers: int) -> None:
    bs = broker.bootstrap_servers
    prefix = f"idle{uuid.uuid4().hex[:6]}"
    cfg = hermetic_config(bs, {
        "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "topics.input": f"{prefix}.raw", "topics.anon": f"{prefix}.anon", "topics.suppressed": f"{prefix}.suppressed",
        "topics.dlq": f"{prefix}.dlq", "anonymization.k": 5, "anonymization.delta": 500, "anonymization.seed": 2,
        "service.idle_flush_seconds": 0.5, "service.workers": workers, "side_paths.enabled": False})
    main = MainPath(cfg)
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    assert main.ready.wait(30)
    producer = KafkaProducer(bootstrap_servers=bs)
    n = 120  # far fewer than delta: nothing would be released without the idle flush
    for i, rec in enumerate(iter_adult_records(adult_path)):
        if i == n:
            break
        producer.send(cfg.topics.input, key=rec["id"].encode(), value=json.dumps(rec).encode())
    producer.close()
    t = main.totals
    deadline = Deadline(60, "the idle flush")
    wait_for(lambda: t.released + t.suppressed >= n, deadline.remaining,
             "every record released or suppressed", alive=th.is_alive, context=lambda: f"{t}")
    assert t.released + t.suppressed == n and t.released >= 5
    wait_for(lambda: main.committed.get(0) == n, deadline.remaining, "every record committed",
             context=lambda: f"{main.committed}")
    main.stop_event.set()
    th.join(30)
