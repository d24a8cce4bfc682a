"""Issue 20, item 4: metrics that mean what their names say.  The eps metrics state one record's eps per topic (a
gauge), never a sum over records; a lifetime budget (k-means total) shows used and remaining; the processing time
is observed once per record; each process exports only its own metrics; both metrics ports answer ``/healthz``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer
from ops_support import running, wait_until
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from stream_anon.config.side_paths import SidePathConfig
from stream_anon.core.datasets import iter_adult_records
from stream_anon.kafka_io.broker import free_port
from stream_anon.metrics.definitions import MAIN, METRIC_NAMES, SIDE, UDP, BulkHistogram, ServiceMetrics
from stream_anon.service.audit import send_flush_markers
from stream_anon.side.processor import SidePathProcessor

N = 1500
KMEANS_WINDOW_EPS = SidePathProcessor(SidePathConfig(), rng=0, pseudonymize=str).epsilon_kmeans  # the default


def _families(registry: CollectorRegistry) -> set[str]:
    return {m.name for m in registry.collect()}


def test_each_part_registers_only_its_own_metrics() -> None:
    every = _families(ServiceMetrics(CollectorRegistry()).registry)
    main = _families(ServiceMetrics(CollectorRegistry(), parts=frozenset({MAIN})).registry)
    side = _families(ServiceMetrics(CollectorRegistry(), parts=frozenset({SIDE})).registry)
    udp = _families(ServiceMetrics(CollectorRegistry(), parts=frozenset({UDP})).registry)
    assert main | side | udp == every
    assert not {m for m in main if m.startswith(("stream_anon_udp_", "stream_anon_side_", "stream_anon_epsilon"))}
    assert not {m for m in side if m.startswith(("stream_anon_udp_", "stream_anon_records_consumed",
                                                 "stream_anon_processing", "stream_anon_class"))}
    assert udp == {m for m in every if m.startswith("stream_anon_udp_")} | {"stream_anon_produce_errors"}
    assert {"stream_anon_epsilon_per_record", "stream_anon_epsilon_budget_used",
            "stream_anon_epsilon_budget_remaining", "stream_anon_epsilon_budget_total"} <= side
    assert "stream_anon_epsilon_spent_total" not in METRIC_NAMES and "stream_anon_epsilon_spent" not in every
    with pytest.raises(ValueError, match="parts"):
        ServiceMetrics(CollectorRegistry(), parts=frozenset({"nope"}))


def test_a_repeated_observation_counts_once_per_record() -> None:
    h = BulkHistogram("h", "doc", buckets=(1e-5, 1e-4, 1e-3), registry=None)  # not registered: still usable
    h.observe_repeated(5e-5, 1000)
    h.observe_repeated(2.0, 3)
    h.observe_repeated(1.0, 0)
    fam = next(iter(h.collect()))
    buckets = {s.labels["le"]: s.value for s in fam.samples if s.name == "h_bucket"}
    assert buckets == {"1e-05": 0.0, "0.0001": 1000.0, "0.001": 1000.0, "+Inf": 1003.0}
    assert next(s.value for s in fam.samples if s.name == "h_sum") == pytest.approx(1000 * 5e-5 + 6.0)


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _healthz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_the_service_processes_export_their_own_metrics_with_meaningful_eps(broker, adult_path: Path,
                                                                            tmp_path: Path) -> None:
    prefix = f"om{uuid.uuid4().hex[:6]}"
    main_port, side_port = free_port(), free_port()
    bs = broker.bootstrap_servers
    args = ["run", "--bootstrap-servers", bs, "--input-topic", f"{prefix}.raw", "--group-id", f"{prefix}-main",
            "--metrics-port", str(main_port), "--set", f"service.side_metrics_port={side_port}",
            "--set", "kafka.session_timeout_ms=6000", "--set", "side_paths.kmeans.total_epsilon=1.25",
            "--set", "side_paths.kmeans.window=500", "--set", "side_paths.estimates_every=500"]
    with running(tmp_path / "run.log", *args) as run:
        wait_until("both paths", lambda: "main path: consuming" in run.text() and "side paths: consuming"
                   in run.text(), 120, proc=run)
        producer = KafkaProducer(bootstrap_servers=bs)
        for i, rec in enumerate(iter_adult_records(adult_path)):
            if i == N:
                break
            producer.send(f"{prefix}.raw", key=rec["id"].encode(), value=json.dumps(rec).encode())
        send_flush_markers(producer, f"{prefix}.raw", [0])
        producer.close()

        def main_done() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            m = _scrape(main_port)
            count = m.get("stream_anon_processing_seconds_count", [({}, 0.0)])[0][1]
            return m if count >= N + 1 else None

        main = wait_until("the main path's processing time of every message", main_done, 120, proc=run)

        def side_done() -> dict[str, list[tuple[dict[str, str], float]]] | None:
            m = _scrape(side_port)
            used = [v for labels, v in m.get("stream_anon_epsilon_budget_used", []) if v >= 3 * KMEANS_WINDOW_EPS - 1e-9]
            return m if used else None

        side = wait_until("the side paths' three k-means windows", side_done, 120, proc=run)
        main_health, side_health = _healthz(main_port), _healthz(side_port)
    # one observation per message (N records and the end-of-stream marker), not one per batch
    assert main["stream_anon_processing_seconds_count"][0][1] == N + 1
    assert main["stream_anon_records_consumed_total"][0][1] == N
    # each endpoint exports its own process's metrics only
    assert not [n for n in main if n.startswith(("stream_anon_udp_", "stream_anon_side_", "stream_anon_epsilon"))]
    assert not [n for n in side if n.startswith(("stream_anon_udp_", "stream_anon_records_consumed",
                                                 "stream_anon_processing_seconds", "stream_anon_consumer_lag"))]
    # eps: one record's exact eps per topic (the processor's own figures), not a sum over the records
    proc = SidePathProcessor(SidePathConfig(), rng=0, pseudonymize=str)
    per_record = {labels["topic"]: v for labels, v in side["stream_anon_epsilon_per_record"]}
    assert per_record == {**{t.replace("adult.", f"{prefix}."): e for t, e in proc.epsilon_per_record.items()},
                          f"{prefix}.kmeans": proc.epsilon_kmeans}
    assert all(v < 6 for v in per_record.values())  # was 162,805 for adult.krr (a sum over records)
    # the lifetime budget of k-means: 3 windows of the default eps 0.4 spent of 1.25 (a fourth would not fit)
    budget = {n: {labels["topic"]: v for labels, v in side[n]} for n in
              ("stream_anon_epsilon_budget_total", "stream_anon_epsilon_budget_used",
               "stream_anon_epsilon_budget_remaining")}
    k = f"{prefix}.kmeans"
    assert (budget["stream_anon_epsilon_budget_total"], budget["stream_anon_epsilon_budget_used"][k],
            budget["stream_anon_epsilon_budget_remaining"][k]) == ({k: 1.25}, pytest.approx(3 * KMEANS_WINDOW_EPS), pytest.approx(1.25 - 3 * KMEANS_WINDOW_EPS))
    # both ports answer /healthz
    assert main_health[0] == 200 and main_health[1].startswith("ok: main loop ticked"), main_health
    assert side_health[0] == 200 and side_health[1].startswith("ok: side paths running"), side_health
