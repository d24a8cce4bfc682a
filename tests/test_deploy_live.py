"""Live checks: the real service (`stream-anon run` subprocess) on the real Tansu broker, scraped by a real
Prometheus server (Debian's `prometheus` binary) with deploy/prometheus/rules.yml loaded.

One module-scoped stack: the service consumes ADULT records replayed in two batches (so that the counters
increase between scrapes) plus a few malformed messages (so the dead-letter counter has samples).  Then:
* every metric name in rules.yml and in the dashboard's queries exists in the service's live /metrics page;
* Prometheus evaluates every rule without error and the throughput recording rule is > 0;
* every dashboard query is valid PromQL for the real server, and the main panels return data;
* stopping the service turns `up` (the ServiceDown alert's input) to 0.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    PROMETHEUS_SYNTHETIC,
    RULES_YML,
    dashboard_exprs,
    declared_series,
    parse_exposition,
    promql_metric_names,
    recording_rule_names,
    require_tool,
    rule_exprs,
)
from waiting import wait_for

from stream_anon.kafka_io.broker import free_port
from stream_anon.metrics.definitions import METRIC_NAMES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

PREFIX = "deploylive"
INPUT = f"{PREFIX}.raw"
RECORDS_PER_BATCH = 2000
THROUGHPUT_RULE = "job:stream_anon_records_consumed:rate1m"

# Metrics the rules/dashboard use that legitimately have no sample after a plain replay: prometheus_client
# shows a labelled metric only after its first labelled observation.  They are checked against the live
# page's "# TYPE" lines instead (the service declares them), with the reason:
NO_SAMPLE_REASONS = {
    "stream_anon_records_duplicate_skipped_total": "only after a crash/rebalance re-consumes released records",
    "stream_anon_produce_errors_total": "only when a produce request fails",
    "stream_anon_records_suppressed_total": "only when a record reaches the delay bound without a class",
    "stream_anon_estimate_abs_error": "only with the demo's truth tracker (exact values known)",
    "stream_anon_estimate_standard_error": "only after the side paths publish their first periodic estimate",
    "stream_anon_epsilon_budget_remaining": "only with a lifetime budget (side_paths.kmeans.total_epsilon)",
    "stream_anon_epsilon_budget_total": "only with a lifetime budget (side_paths.kmeans.total_epsilon)",
    "stream_anon_epsilon_budget_used": "only with a lifetime budget (side_paths.kmeans.total_epsilon)",
    "stream_anon_side_outputs_refused_total": "only when a privacy budget is exhausted",
    "stream_anon_side_records_skipped_total": "only when the side paths meet an invalid input",
    "stream_anon_internal_errors_total": "only when the pipeline's guard catches a bug on a message",
    "stream_anon_outputs_resent_total": "only when a recovery finds an output the ledger promised missing",
}


@dataclass
class Stack:
    metrics_url: str
    side_metrics_url: str
    prometheus_url: str
    service: subprocess.Popen[bytes]
    service_log: Path
    scrape: str = ""


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def _query(prom: str, expr: str) -> dict[str, Any]:
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        body = _get(url)
    except urllib.error.HTTPError as e:  # 400 with a JSON error for invalid PromQL
        body = e.read()
    return json.loads(body)


def _vector(prom: str, expr: str) -> list[tuple[dict[str, str], float]]:
    res = _query(prom, expr)
    assert res["status"] == "success", (expr, res)
    return [(s["metric"], float(s["value"][1])) for s in res["data"]["result"]]


def _replay(bootstrap: str, records: list[dict[str, Any]]) -> None:
    from stream_anon.replay.kafka_replay import replay_records

    stats = replay_records(records, INPUT, bootstrap, 0.0, partitions=2, progress=False)
    assert stats.records_acked == len(records), stats.summary()


def _send_malformed(bootstrap: str, n: int) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    for i in range(n):
        producer.send(INPUT, key=f"bad-{i}".encode(), value=b"{not json" if i % 2 else b'{"id": "bad", "age": 500}')
    producer.flush(30)
    producer.close()


@pytest.fixture(scope="module")
def stack(broker: Any, adult_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from stream_anon.core.datasets import iter_adult_records

    prometheus_bin = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("deploy-live")
    metrics_port, side_port, prom_port, udp_port = free_port(), free_port(), free_port(), free_port()
    topics = {name: f"{PREFIX}.{name}" for name in ("anon", "suppressed", "dlq", "krr", "rs", "blap", "estimates",
                                                    "kmeans")}
    cmd = [sys.executable, "-m", "stream_anon", "run", "--bootstrap-servers", broker.bootstrap_servers,
           "--metrics-port", str(metrics_port), "--input-topic", INPUT, "--partitions", "2",
           "--group-id", f"{PREFIX}-main", "--k", "5", "--delta", "200", "--seed", "1",
           "--set", f"side_paths.group_id={PREFIX}-side", "--set", "kafka.session_timeout_ms=6000",
           "--set", "side_paths.estimates_every=500", "--set", f"service.side_metrics_port={side_port}"]
    for name, topic in topics.items():
        cmd += ["--set", f"topics.{name}={topic}"]
    service_log = tmp / "service.log"
    service = subprocess.Popen(cmd, stdout=open(service_log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    # the UDP bridge is a process of its own and exports its own metrics (issue 20: the service exports none of
    # them); a null sink: only its metrics matter here
    bridge = subprocess.Popen([sys.executable, "-m", "stream_anon", "udp-bridge", "--sink", "null", "--listen",
                               "127.0.0.1:0", "--metrics-port", str(udp_port)],
                              stdout=open(tmp / "udp-bridge.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    prometheus: subprocess.Popen[bytes] | None = None
    try:
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        side_url = f"http://127.0.0.1:{side_port}/metrics"
        wait_for(lambda: _get(metrics_url), 60, "the service's metrics endpoint", retry_on=(Exception,))
        wait_for(lambda: _get(side_url), 60, "the side paths' metrics endpoint", retry_on=(Exception,))
        udp_url = f"http://127.0.0.1:{udp_port}/metrics"
        wait_for(lambda: _get(udp_url), 60, "the UDP bridge's metrics endpoint", retry_on=(Exception,))

        rules = tmp / "rules.yml"
        shutil.copy(RULES_YML, rules)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(rules)],
                  "scrape_configs": [{"job_name": "stream-anon", "scrape_interval": "1s",
                                      "static_configs": [{"targets": [f"127.0.0.1:{metrics_port}",
                                                                      f"127.0.0.1:{side_port}"]}]},
                                     {"job_name": "stream-anon-udp", "scrape_interval": "1s",
                                      "static_configs": [{"targets": [f"127.0.0.1:{udp_port}"]}]}]}
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
        prometheus = subprocess.Popen(
            [prometheus_bin, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=open(tmp / "prometheus.log", "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
        prom = f"http://127.0.0.1:{prom_port}"
        wait_for(lambda: _get(f"{prom}/-/ready"), 60, "Prometheus ready", retry_on=(Exception,))
        wait_for(lambda: len([v for _, v in _vector(prom, 'up{job="stream-anon"}') if v == 1.0]) == 2, 30,
                 "a successful scrape of both endpoints", retry_on=(Exception,))

        records = [r for _, r in zip(range(2 * RECORDS_PER_BATCH), iter_adult_records(adult_path), strict=False)]
        _replay(broker.bootstrap_servers, records[:RECORDS_PER_BATCH])
        _send_malformed(broker.bootstrap_servers, 6)
        # the first batch must be consumed and scraped before the second, so the counter rises between scrapes
        consumed = f'sum(stream_anon_records_consumed_total{{topic="{INPUT}"}})'
        wait_for(lambda: [v for _, v in _vector(prom, consumed) if v >= RECORDS_PER_BATCH], 60,
                 "first batch consumed (scraped by Prometheus)", retry_on=(Exception,))
        _replay(broker.bootstrap_servers, records[RECORDS_PER_BATCH:])
        wait_for(lambda: [v for _, v in _vector(prom, consumed) if v >= 2 * RECORDS_PER_BATCH + 6], 60,
                 "second batch consumed", retry_on=(Exception,))
        time.sleep(2.5)  # a few more scrapes and rule evaluations
        published = "sum(stream_anon_side_records_published_total)"
        wait_for(lambda: [v for _, v in _vector(prom, published) if v > 0], 60,
                 "the side paths' first published records", retry_on=(Exception,))
        time.sleep(1.5)
        st = Stack(metrics_url=metrics_url, side_metrics_url=side_url, prometheus_url=prom, service=service,
                   service_log=service_log)
        # the three endpoints together are the exposition of the metrics module: each process its own part
        st.scrape = _get(metrics_url).decode() + "\n" + _get(side_url).decode() + "\n" + _get(udp_url).decode()
        yield st
    finally:
        bridge.terminate()
        try:
            bridge.wait(30)
        except subprocess.TimeoutExpired:
            bridge.kill()
        if service.poll() is None:
            service.terminate()
            try:
                service.wait(30)
            except subprocess.TimeoutExpired:
                service.kill()
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(30)
            except subprocess.TimeoutExpired:
                prometheus.kill()


def test_rule_and_dashboard_metrics_exist_in_the_live_exposition(stack: Stack) -> None:
    samples, types = parse_exposition(stack.scrape)
    declared = declared_series(types.items())
    # the running service declares every metric of the metrics module
    for name in METRIC_NAMES:
        assert name in declared or name in types, f"{name} not declared on the live /metrics page"
    records = recording_rule_names()
    missing, declared_only = [], set()
    for where, expr in rule_exprs() + dashboard_exprs():
        for n in promql_metric_names(expr):
            if ":" in n or n in PROMETHEUS_SYNTHETIC:
                assert ":" not in n or n in records, f"{where}: unknown recording rule {n}"
                continue
            if n in samples:
                continue
            if n in declared:
                declared_only.add(n)
            else:
                missing.append(f"{where}: {n}")
    assert not missing, "metrics used but not exported by the live service:\n" + "\n".join(missing)
    print(f"declared on /metrics but without samples after the replay: {sorted(declared_only)}")
    unexplained = declared_only - set(NO_SAMPLE_REASONS)
    assert not unexplained, f"declared but without samples after the replay, and not explained: {unexplained}"
    # the replay exercised the main path and the side paths: these have real samples
    for n in ("stream_anon_epsilon_per_record", "stream_anon_side_records_published_total",
              "stream_anon_side_records_consumed_total", "stream_anon_side_lifetime_cap_refusal_probability",
              "stream_anon_records_consumed_total", "stream_anon_records_released_total",
              "stream_anon_records_dead_lettered_total", "stream_anon_release_delay_arrivals_bucket",
              "stream_anon_class_size_bucket", "stream_anon_consumer_lag", "stream_anon_buffered_records",
              "stream_anon_udp_gaps_total", "stream_anon_delay_bound_arrivals", "stream_anon_seconds_since_progress"):
        assert n in samples, n


def test_prometheus_scrapes_the_service_and_the_throughput_rule_is_positive(stack: Stack) -> None:
    prom = stack.prometheus_url
    result = wait_for(lambda: [v for _, v in _vector(prom, THROUGHPUT_RULE) if v > 0], 30,
                      f"{THROUGHPUT_RULE} > 0", retry_on=(Exception,))
    assert result[0] > 0
    out = _vector(prom, "job:stream_anon_records_released:rate1m")
    assert out and out[0][1] > 0, out
    bound = _vector(prom, "job:stream_anon_delay_bound_arrivals:max")
    assert bound == [({"__name__": "job:stream_anon_delay_bound_arrivals:max", "job": "stream-anon"}, 200.0)]


def test_prometheus_evaluates_every_rule_without_error(stack: Stack) -> None:
    data = json.loads(_get(f"{stack.prometheus_url}/api/v1/rules"))
    assert data["status"] == "success"
    seen = {}
    for group in data["data"]["groups"]:
        for r in group["rules"]:
            seen[r["name"]] = r
            assert r["health"] == "ok", (r["name"], r.get("lastError"))
    expected = {r.get("alert") or r.get("record") for r in yaml.safe_load(RULES_YML.read_text())["groups"][0]["rules"]}
    assert expected <= set(seen)
    # a healthy run fires none of the critical alerts
    for name in ("StreamAnonServiceDown", "StreamAnonKAnonymityViolation", "StreamAnonStalled"):
        assert seen[name]["state"] == "inactive", (name, seen[name]["state"])


def _grafana_to_promql(expr: str) -> str:
    return (expr.replace("$__rate_interval", "1m").replace("$__range", "5m").replace('=~"$job"', '=~".*"'))


def test_dashboard_queries_run_on_the_real_prometheus(stack: Stack) -> None:
    prom = stack.prometheus_url
    empty = []
    for where, expr in dashboard_exprs():
        if where.startswith("variable"):
            res = _query(prom, f"count({expr})")
        else:
            res = _query(prom, _grafana_to_promql(expr))
        assert res["status"] == "success", f"{where}: {expr}: {res.get('error')}"
        if not res["data"]["result"]:
            empty.append(where)
    print(f"dashboard queries without data after the replay: {empty}")
    # the main-path panels show data after the replay (side topics/UDP/loss ratios may legitimately be empty)
    for needle in ("Throughput in / out", "Consumer lag", "Release delay quantiles", "Information loss over time",
                   "Class-size distribution", "Buffered records"):
        hits = [w for w in empty if needle in w and "target A" in w]
        assert not hits, f"main panel without data: {hits}"


def _healthchecks(stack: Stack) -> list[tuple[str, list[str], dict[str, str]]]:
    """The Dockerfile's HEALTHCHECK and the compose service's healthcheck, pointed at the live service's port."""
    import os

    from deploy_support import COMPOSE_YML, DOCKERFILE, load_yaml

    port = stack.metrics_url.split(":")[2].split("/")[0]
    text = DOCKERFILE.read_text(encoding="utf-8").replace("\\\n", " ")
    docker_cmd = json.loads(text[text.index("HEALTHCHECK"):].split("CMD", 1)[1].splitlines()[0].strip())
    env = dict(os.environ, STREAM_ANON_SERVICE_METRICS_PORT=port)
    compose_test = load_yaml(COMPOSE_YML)["services"]["stream-anon"]["healthcheck"]["test"]
    assert compose_test[0] == "CMD"
    compose_cmd = [a.replace(":9108/", f":{port}/") for a in compose_test[1:]]
    return [("Dockerfile HEALTHCHECK", docker_cmd, env), ("compose healthcheck", compose_cmd, dict(os.environ))]


def _run_check(cmd: list[str], env: dict[str, str]) -> int:
    cmd = [sys.executable if c == "python" else c for c in cmd]
    return subprocess.run(cmd, env=env, capture_output=True, timeout=30).returncode


def test_container_healthchecks_pass_against_the_live_service(stack: Stack) -> None:
    for name, cmd, env in _healthchecks(stack):
        assert _run_check(cmd, env) == 0, name


def test_stopping_the_service_sets_up_to_zero(stack: Stack) -> None:
    stack.service.terminate()
    stack.service.wait(30)
    for name, cmd, env in _healthchecks(stack):
        assert _run_check(cmd, env) != 0, f"{name} still passes with the service stopped"
    wait_for(lambda: [v for _, v in _vector(stack.prometheus_url, 'up{job="stream-anon"}')] == [0.0, 0.0], 15,
             "up == 0 for both endpoints after the service stopped", retry_on=(Exception,))
