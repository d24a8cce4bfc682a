"""The side-path process exports only the side paths' metrics (issue 11: it exported the main path's gauges at 0),
and every metric the side paths update is among them."""

from __future__ import annotations

import dataclasses
import json
import threading
import urllib.request
import uuid
from typing import Any

import numpy as np
import pytest
from config_support import hermetic_config
from prometheus_client import CollectorRegistry, generate_latest
from test_side_app import Consumer, Msg, make_app, messages
from waiting import wait_for

from stream_anon.config.side_paths import KMeansConfig, PersonBudgetConfig, SidePathConfig
from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.kafka_io.broker import free_port
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.runtime.supervisor import SidePaths
from stream_anon.side.metrics import side_registry

MAIN_ONLY = ("stream_anon_gt_loss", "stream_anon_k ", "stream_anon_delay_bound_arrivals",
             "stream_anon_records_consumed_total", "stream_anon_open_clusters", "stream_anon_consumer_lag")


def _names(registry: CollectorRegistry) -> set[str]:
    return {m.name for m in registry.collect()}


def test_side_registry_holds_every_metric_the_side_paths_update_and_nothing_else(adult_path: Any) -> None:
    records = list(iter_records(read_adult(adult_path)))[:400]
    side = SidePathConfig(estimates_every=100, estimates_every_seconds=None, dead_letter=True,
                          kmeans=KMeansConfig(window=100, total_epsilon=1.5))
    app, _, metrics = make_app(side, Consumer())
    bad = [Msg(400, b"{oops"), Msg(401, json.dumps({**records[0], "age": 500}).encode())]
    app._process(0, messages(records) + bad)
    app._flush()
    app.metrics.reconnect()
    app.metrics.produce_error("adult.krr")
    exported = _names(side_registry(metrics))
    touched = {m.name for m in metrics.registry.collect()  # labelled series exist once updated (histograms:
               if m.type != "histogram" and any(s.labels for s in m.samples)}  # the main path's, "le" always)
    touched.add("stream_anon_broker_reconnects")
    assert touched <= exported, touched - exported
    assert {"stream_anon_side_values_clipped", "stream_anon_side_outputs_refused", "stream_anon_epsilon_per_record",
            "stream_anon_epsilon_budget_used", "stream_anon_records_dead_lettered"} <= touched
    text = generate_latest(side_registry(metrics)).decode()
    assert not [n for n in MAIN_ONLY if n in text]


def test_the_lifetime_cap_gauge_says_how_full_the_sketch_is(adult_path: Any) -> None:
    """``stream_anon_side_lifetime_cap_refusal_probability{topic=<input>}`` follows the sketch as it fills: 0 when
    empty, then the product over its rows of the share of counters charged (each record charges 3.9 of the cap
    of 4, so a charged counter refuses a new record), rising with every flush; a small sketch (2 x 256) fills
    within 600 records."""
    records = list(iter_records(read_adult(adult_path)))[:600]
    side = SidePathConfig(estimates_every=0, estimates_every_seconds=None, kmeans=KMeansConfig(enabled=False),
                          person_budget=PersonBudgetConfig(width=256, depth=2))
    app, _, metrics = make_app(side, Consumer())

    def gauge() -> float | None:
        return metrics.registry.get_sample_value("stream_anon_side_lifetime_cap_refusal_probability",
                                                 {"topic": "adult.raw"})

    app.metrics.lifetime_cap()  # (at start)
    assert gauge() == 0.0
    seen = []
    for lo, hi in ((0, 100), (100, 300), (300, 600)):
        app._process(0, messages(records[lo:hi], start=lo))
        app._flush()
        sketch = app.processor.budgets.person
        assert sketch is not None
        charged = np.count_nonzero(sketch.counters > 0, axis=1) / sketch.width
        assert gauge() == pytest.approx(float(np.prod(charged)), rel=1e-12)
        seen.append(gauge())
    assert 0.0 < seen[0] < seen[1] < seen[2] < 1.0, seen


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_the_side_process_endpoint_exports_only_side_metrics(broker: Any) -> None:
    tag = f"sm{uuid.uuid4().hex[:6]}"
    port = free_port()
    options: dict[str, Any] = {"kafka.group_id": f"{tag}-main", "kafka.session_timeout_ms": 6000,
                               "service.side_metrics_port": port}
    for name in ("input", "anon", "krr", "rs", "blap", "estimates", "kmeans", "dlq", "suppressed"):
        options[f"topics.{name}"] = f"{tag}.{name}"
    cfg = hermetic_config(broker, options)
    cfg = dataclasses.replace(cfg, side_paths=dataclasses.replace(cfg.side_paths, estimates_every_seconds=None))
    stop = threading.Event()
    side = SidePaths(cfg, ServiceMetrics(CollectorRegistry()), stop)
    try:

        def exported() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                text = r.read().decode()
            return text if "stream_anon_epsilon_budget_total" in text else ""  # once the side paths consume

        text = wait_for(exported, 60, "the side-path endpoint to export the budget", alive=lambda: side.alive,
                        retry_on=(OSError,))
        names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
        ours = {n for n in names if n.startswith("stream_anon_")}
        assert ours and all(n.startswith(("stream_anon_side_", "stream_anon_epsilon_", "stream_anon_estimate_",
                                          "stream_anon_records_dead_lettered", "stream_anon_produce_errors",
                                          "stream_anon_broker_reconnects")) for n in ours), ours
        assert not [n for n in MAIN_ONLY if n in text]
    finally:
        stop.set()
        side.stop(timeout=30)
    assert side.exit_code == 0
