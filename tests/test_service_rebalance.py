"""Scale-out: a second member joins the consumer group mid-stream; the rebalance moves a whole partition
(revoke: checkpoint and commit the watermark, drop the state; assign: recover from the ledger, skip what it
accounts for).  Every record is still accounted for exactly once in the ledger, every promised output is published
exactly once, and every class is k-anonymous."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import pytest
from config_support import hermetic_config
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry
from waiting import wait_for

from stream_anon.core.datasets import iter_adult_records
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.kafka_io.settings import CONSUMER_CLIENTS
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.replay.kafka_replay import ensure_topic
from stream_anon.service.app import MainPath
from stream_anon.service.audit import collect_outputs, send_flush_markers

K = 5


SETUPS = [("tansu", client) for client in CONSUMER_CLIENTS] + [("apache-kafka", CONSUMER_CLIENTS[0])]
"""(broker, kafka.consumer_client): both clients on Tansu, the default one on one Apache Kafka node (issue 17 item 2)."""


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("setup", SETUPS, ids=[f"{b}-{c}" for b, c in SETUPS])
def test_second_member_takes_over_a_partition_without_loss_or_duplicates(setup: tuple[str, str], adult_path: Path,
                                                                         request: pytest.FixtureRequest) -> None:
    kind, consumer_client = setup
    broker = request.getfixturevalue("broker" if kind == "tansu" else "apache_kafka")
    bs = broker.bootstrap_servers
    prefix = f"reb{uuid.uuid4().hex[:6]}"
    overrides = {
        "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000, "kafka.max_poll_records": 200,
        "topics.input": f"{prefix}.raw", "topics.anon": f"{prefix}.anon",
        "topics.suppressed": f"{prefix}.suppressed", "topics.dlq": f"{prefix}.dlq", "topics.partitions": 2,
        "anonymization.k": K, "anonymization.delta": 300, "anonymization.seed": 3,
        "service.commit_interval_ms": 100, "side_paths.enabled": False,
        "kafka.consumer_client": consumer_client,
    }
    ensure_topic(bs, f"{prefix}.raw", 2)
    records = [r for i, r in zip(range(8000), iter_adult_records(adult_path), strict=False)]
    producer = KafkaProducer(bootstrap_servers=bs, linger_ms=5)

    def send(recs: list[dict[str, object]]) -> None:
        for r in recs:
            producer.send(f"{prefix}.raw", key=str(r["id"]).encode(), value=json.dumps(r).encode(),
                          partition=int(str(r["id"])[-1]) % 2)
        producer.flush()

    members: list[tuple[MainPath, threading.Thread]] = []

    def start() -> MainPath:
        m = MainPath(hermetic_config(bs, overrides), metrics=ServiceMetrics(CollectorRegistry()))
        th = threading.Thread(target=m.run, daemon=True)
        th.start()
        members.append((m, th))
        return m

    send(records[:4000])
    a = start()
    wait_for(lambda: a.totals.consumed >= 2000, 60, "the first member mid-stream (2,000 records consumed)",
             interval=0.05)
    b = start()  # joins: the group rebalances while A is mid-stream
    assert b.assigned.wait(60)
    send(records[4000:])
    send_flush_markers(producer, f"{prefix}.raw", [0, 1])
    producer.close()

    monitor = KafkaConsumer(bootstrap_servers=bs, group_id=f"{prefix}-main", enable_auto_commit=False)
    ends = {0: 4001, 1: 4001}  # ids end in 0..9: even/odd split, 4000 records + 1 marker per partition
    wait_for(lambda: {p: monitor.committed(TopicPartition(f"{prefix}.raw", p)) for p in (0, 1)} == ends, 90,
             f"both partitions committed to their ends {ends}", interval=0.2,
             context=lambda: f"{[m.totals for m, _ in members]}")
    monitor.close()
    owned_a, owned_b = set(a.states), set(b.states)
    for m, th in members:
        m.stop_event.set()
        th.join(30)
    assert owned_a and owned_b and owned_a.isdisjoint(owned_b)  # each member owns one partition
    assert a.totals.recoveries + b.totals.recoveries >= 3  # A: 2 at start (+ re-assigned one), B: 1

    s = adult_schema()
    qis = [x.name for x in s.qis]
    snap = collect_outputs(bs, input_topic=f"{prefix}.raw", anon=f"{prefix}.anon", suppressed=f"{prefix}.suppressed",
                           dlq=f"{prefix}.dlq", qis=qis, sensitive=["income"], input_ends=ends)
    assert snap.ok, (snap.accounting.duplicates[:5], snap.accounting.missing[:5], snap.published, snap.problems)
    df = snap.records
    assert len(df) == len(records) and df.record_id.is_unique
    assert set(df.record_id) == {r["id"] for r in records}
    released = df[df.outcome == "released"]
    rep = verify_release_frame(released[["record_id", "class_id", *qis]], qis, K)
    assert rep.ok, str(rep)
    rep = verify_release_frame(snap.public, qis, K, 2, "income", record_id=None)
    assert rep.ok and rep.records == len(released), str(rep)
    assert int(df.delay.max()) <= 300
