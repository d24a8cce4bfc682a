"""The broker-loss guard on Apache Kafka (issue 17 item 5), through the real ``stream-anon run`` process.

Each test starts the service on a backlog of ADULT records (no end-of-stream marker: records stay buffered),
waits until it committed progress, then changes the broker under it:

- a topic deleted and created again (the input, whose consumer then sees new offsets; the anon output, whose
  producer sends into it): a new topic id, or the topic gone;
- the input's partition count raised with CreatePartitions (2 -> 4) and records sent to the new partitions;
- the only broker killed (``kill -9``), its storage wiped and the node started again (formatted anew): every
  topic, record and committed offset gone; the same with all three nodes of a cluster;
- and the opposite: one node of three wiped and started again is *no* loss (its replicas come back from the
  others): the service must go on, exactly once (no false exit 4).

Each time: the service exits with code 4 and one ERROR line, and nothing is published over the change: no ledger
entry for a record sent after it, nothing on an output topic that no ledger entry promised and nothing twice (the
audit's check), and on a wiped broker nothing at all.  The one exception, measured and printed: a recreated
*output* topic receives the outputs its producer still delivers until the guard's next check (each promised by its
ledger entry, once).  Detection times are printed (``-s``).  Every broker here is an
Apache Kafka node of the test's own (the changes are destructive).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from apache_kafka_support import KafkaCluster, ServiceProcess, start_cluster, wait_for
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewPartitions, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka_service_support import (
    PARTITIONS,
    adult_rows,
    audit,
    check_release,
    committed_total,
    drained,
    service_cmd,
)

from stream_anon.core.datasets import read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.replay.kafka_replay import replay_records
from stream_anon.service.audit import collect_outputs, read_topic_with_headers, send_flush_markers
from stream_anon.service.broker_guard import EXIT_DATA_LOSS

OWN_FRAME = re.compile(r'File "[^"]*stream_anon/')
LOSS_LINE = "lost data this service had committed or acknowledged"
ROLES = ("anon", "suppressed", "dlq")


@pytest.fixture
def kafka_node(tmp_path: Path) -> Iterator[KafkaCluster]:
    """One Apache Kafka node of this test's own."""
    cluster = start_cluster(tmp_path / "kafka", 1)
    try:
        yield cluster
    finally:
        cluster.stop(timeout_s=15)


def start_service(bs: str, prefix: str, log: Path, n_backlog: int, adult_path: Path) -> tuple[ServiceProcess, Any]:
    """Preload ``n_backlog`` ADULT records (2 partitions, no end marker), start the service, wait for progress."""
    adult = read_adult(adult_path)
    replay_records(adult_rows(adult.head(n_backlog)), f"{prefix}.raw", bs, partitions=PARTITIONS)
    service = ServiceProcess(service_cmd(bs, prefix, ("--set", "kafka.producer_client=confluent-kafka")), log)
    wait_for("progress committed", lambda: committed_total(bs, f"{prefix}-main", f"{prefix}.raw") >= n_backlog // 3,
             service, 180)
    return service, adult


def expect_exit_4(service: ServiceProcess, t0: float, timeout_s: float = 90) -> tuple[float, str]:
    """The service exits 4 with one ERROR line naming the loss, no traceback of ours; (seconds, the line)."""
    rc = service.wait_exit(timeout_s)
    detected = time.monotonic() - t0
    text = service.text()
    assert rc == EXIT_DATA_LOSS, text[-5000:]
    lines = [ln for ln in text.splitlines() if LOSS_LINE in ln]
    assert len(lines) == 1 and " ERROR " in lines[0] and f"exit code {EXIT_DATA_LOSS}" in lines[0], text[-5000:]
    assert not OWN_FRAME.search(text), text[-5000:]
    return detected, lines[0].split(LOSS_LINE, 1)[1][:300]


def nothing_published_over(bs: str, prefix: str, new_ids: set[str]) -> dict[str, int]:
    """No ledger entry holds a record id sent after the change, and every message on anon, suppressed and dlq
    was promised by a ledger entry (the audit's published check: nothing unexpected, nothing twice).  Returns
    the messages per output topic."""
    s = adult_schema()
    snap = collect_outputs(bs, input_topic=f"{prefix}.raw", anon=f"{prefix}.anon", suppressed=f"{prefix}.suppressed",
                           dlq=f"{prefix}.dlq", qis=[a.name for a in s.qis], sensitive=[a.name for a in s.sensitive])
    ids = set(snap.records.record_id.dropna().astype(str))
    assert not ids & new_ids, f"{len(ids & new_ids)} records sent after the change were processed"
    for role, chk in snap.published.items():
        assert chk.unexpected == 0 and not chk.duplicated, (role, chk.unexpected, chk.duplicated[:3])
    assert not snap.accounting.duplicates and not snap.accounting.corrupt
    return dict(snap.messages)


def recreate(admin: KafkaAdminClient, topic: str, partitions: int, deadline_s: float = 60) -> str:
    """Delete ``topic`` and create it again with ``partitions`` (waiting out the asynchronous deletion); returns
    who created it ("test", or "a client" when a client's metadata request auto-created it first)."""
    admin.delete_topics([topic])
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])
            return "test"
        except TopicAlreadyExistsError:
            pass  # still being deleted, or auto-created by a client meanwhile
        except KafkaError:
            pass
        if time.monotonic() > deadline:
            return "a client"
        time.sleep(0.05)


@pytest.mark.integration
@pytest.mark.timeout(300)
@pytest.mark.parametrize("role", ["raw", "anon"])
def test_a_topic_deleted_and_recreated_is_detected_and_the_service_exits_4(kafka_node: KafkaCluster, adult_path: Path,
                                                                          tmp_path: Path, role: str) -> None:
    bs = kafka_node.bootstrap_servers
    prefix = f"gr{role[0]}{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.{role}"
    service, adult = start_service(bs, prefix, tmp_path / "service.log", 6000, adult_path)
    with service:
        admin = KafkaAdminClient(bootstrap_servers=bs)
        t0 = time.monotonic()
        creator = recreate(admin, topic, PARTITIONS)
        admin.close()
        later = adult.iloc[20000:23000]
        if role == "raw":  # upstream goes on writing into the new topic: none of it may be processed
            replay_records(adult_rows(later), topic, bs, partitions=PARTITIONS)
        detected, line = expect_exit_4(service, t0)
    counts = nothing_published_over(bs, prefix, set(later["id"].astype(str)))
    on_new = len(read_topic_with_headers(bs, topic, timeout_s=20)) if role == "anon" else None
    # a recreated OUTPUT topic: its producer goes on delivering into the new topic until the guard's next check
    # (every 5 s; no client here produces by topic id): those outputs each have their ledger entry and appear
    # once (checked above: nothing unexpected, nothing twice); the bound is one check interval (docs/tansu.md,
    # "On Apache Kafka")
    print(f"\nApache Kafka, {topic} deleted and created again (by {creator}): exit {EXIT_DATA_LOSS} {detected:.1f} s after "
          f"the delete; outputs {counts}; on the new {topic}: {on_new}; {line}")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_partition_count_change_is_detected_and_the_service_exits_4(kafka_node: KafkaCluster, adult_path: Path,
                                                                      tmp_path: Path) -> None:
    bs = kafka_node.bootstrap_servers
    prefix = f"gp{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.raw"
    service, adult = start_service(bs, prefix, tmp_path / "service.log", 6000, adult_path)
    with service:
        admin = KafkaAdminClient(bootstrap_servers=bs)
        t0 = time.monotonic()
        admin.create_partitions({topic: NewPartitions(total_count=4)})
        admin.close()
        later = adult.iloc[20000:21000]
        producer = KafkaProducer(bootstrap_servers=bs)
        for i, row in enumerate(adult_rows(later)):  # into the new partitions only
            producer.send(topic, key=str(row["id"]).encode(), value=json.dumps(row).encode(), partition=2 + i % 2)
        producer.flush()
        producer.close()
        detected, line = expect_exit_4(service, t0)
    assert "has 4 partitions, 2 at start" in line, line
    counts = nothing_published_over(bs, prefix, set(later["id"].astype(str)))
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:  # the service never widened its own topics
        assert {len(d["partitions"]) for d in admin.describe_topics([f"{prefix}.raw.ledger", *(f"{prefix}.{r}" for r in
                                                                                                ROLES)])} == {2}
    finally:
        admin.close()
    print(f"\nApache Kafka, input partitions 2 -> 4: exit {EXIT_DATA_LOSS} {detected:.1f} s after CreatePartitions; "
          f"outputs {counts}; {line}")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_broker_wiped_and_restarted_is_detected_and_the_service_exits_4(kafka_node: KafkaCluster, adult_path: Path,
                                                                          tmp_path: Path) -> None:
    bs = kafka_node.bootstrap_servers
    prefix = f"gw{uuid.uuid4().hex[:6]}"
    service, _adult = start_service(bs, prefix, tmp_path / "service.log", 6000, adult_path)
    with service:
        kafka_node.kill(1)
        kafka_node.wipe_node(1)
        up = kafka_node.start_node(1)  # formatted anew (same cluster id): an empty broker on the same port
        t0 = time.monotonic()
        detected, line = expect_exit_4(service, t0)
    # nothing was published on the emptied broker (a topic a client auto-created is empty)
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    published = {}
    for name in (f"{prefix}.raw.ledger", *(f"{prefix}.{r}" for r in ROLES)):
        published[name] = len(read_topic_with_headers(bs, name, timeout_s=20)) if name in existing else 0
    assert not any(published.values()), f"published on the wiped broker: {published}"
    print(f"\nApache Kafka, the broker wiped and started again (up in {up:.1f} s): exit {EXIT_DATA_LOSS} {detected:.1f} s "
          f"after it answered; topics existing after: {sorted(t for t in existing if t.startswith(prefix))}; {line}")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_three_node_cluster_wiped_and_restarted_is_detected_and_the_service_exits_4(
        kafka_cluster: KafkaCluster, adult_path: Path, tmp_path: Path) -> None:
    """Every node killed, every node's storage wiped, the cluster formatted and started again (same ports)."""
    bs = kafka_cluster.bootstrap_servers
    prefix = f"gc{uuid.uuid4().hex[:6]}"
    adult = read_adult(adult_path)
    replay_records(adult_rows(adult.head(6000)), f"{prefix}.raw", bs, partitions=PARTITIONS)
    cmd = service_cmd(bs, prefix, ("--set", "topics.replication_factor=3"))
    with ServiceProcess(cmd, tmp_path / "service.log") as service:
        wait_for("progress committed", lambda: committed_total(bs, f"{prefix}-main", f"{prefix}.raw") >= 2000,
                 service, 180)
        for node_id in kafka_cluster.members:
            kafka_cluster.kill(node_id)
        for node_id in kafka_cluster.members:
            kafka_cluster.wipe_node(node_id)
        up = kafka_cluster.start()  # formats the wiped storage, starts all three, waits until writable
        t0 = time.monotonic()
        detected, line = expect_exit_4(service, t0)
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        existing = set(admin.list_topics())
    finally:
        admin.close()
    published = {name: len(read_topic_with_headers(bs, name, timeout_s=20)) if name in existing else 0
                 for name in (f"{prefix}.raw.ledger", *(f"{prefix}.{r}" for r in ROLES))}
    assert not any(published.values()), f"published on the wiped cluster: {published}"
    print(f"\nApache Kafka, three nodes wiped and started again (ready in {up:.1f} s): exit {EXIT_DATA_LOSS} "
          f"{detected:.1f} s after it was writable; {line}")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_one_node_of_three_wiped_is_no_loss_and_the_service_goes_on(kafka_cluster: KafkaCluster, adult_path: Path,
                                                                    tmp_path: Path) -> None:
    """The node leading input partition 0 killed and its storage wiped, then started again: its replicas come back
    from the other two (replication factor 3, min ISR 2, unclean election off), so nothing was lost: the guard must
    not stop the service (no false exit 4), and the run stays exact."""
    bs = kafka_cluster.bootstrap_servers
    prefix = f"go{uuid.uuid4().hex[:6]}"
    group, topic = f"{prefix}-main", f"{prefix}.raw"
    adult = read_adult(adult_path).head(12000)
    admin = KafkaAdminClient(bootstrap_servers=bs)
    admin.create_topics([NewTopic(topic, PARTITIONS, 3)])  # replicated: one node's storage is not the input's
    admin.close()
    stats = replay_records(adult_rows(adult), topic, bs, partitions=PARTITIONS)
    producer = KafkaProducer(bootstrap_servers=bs, acks="all")
    send_flush_markers(producer, topic, list(range(PARTITIONS)))
    producer.close()
    ends = {p: stats.partition_counts.get(p, 0) + 1 for p in range(PARTITIONS)}
    # the input known to every node before the service subscribes: kafka-python's group consumer subscribing right
    # after a topic's creation on this cluster got no partitions at all (assigned [], no rebalance) in 2 of 12 probes
    kafka_cluster.wait_in_sync([topic], 60)
    cmd = service_cmd(bs, prefix, ("--set", "topics.replication_factor=3", "--set", "kafka.max_poll_records=500"))
    with ServiceProcess(cmd, tmp_path / "service.log") as service:
        wait_for("30% committed", lambda: committed_total(bs, group, topic) >= 0.3 * len(adult), service, 240)
        victim = kafka_cluster.leader_of(topic, 0)
        before = committed_total(bs, group, topic)
        kafka_cluster.kill(victim)
        kafka_cluster.wipe_node(victim)
        back = kafka_cluster.start_node(victim)
        t0 = time.monotonic()
        kafka_cluster.wait_in_sync([topic, f"{prefix}.raw.ledger", *(f"{prefix}.{r}" for r in ROLES)], 180)
        in_sync = time.monotonic() - t0
        wait_for("every partition drained", lambda: drained(bs, group, topic, ends), service, 300)
        assert service.stop() == 0, service.text()[-5000:]
        text = service.text()
    assert LOSS_LINE not in text
    res = audit(bs, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    snap = check_release(bs, prefix, ends, adult)
    print(f"\nApache Kafka, node {victim} (leader of {topic}[0]) killed at committed {before}, wiped, back in {back:.1f} s, "
          f"replicas in sync {in_sync:.1f} s later: no exit, {len(snap.records)} records accounted once, audit OK; "
          f"producers recreated {text.count('producers created anew')} time(s)")
