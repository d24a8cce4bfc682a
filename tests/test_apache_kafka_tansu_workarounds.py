"""What the service's Tansu workarounds meet on Apache Kafka (issue 17 item 4; docs/tansu.md, "On Apache Kafka").

- Offset -1 acknowledgements: Tansu answers a re-sent idempotent batch with ``DUPLICATE_SEQUENCE_NUMBER`` (offset
  -1, which the clients count as success).  Apache Kafka answers a batch re-sent with the sequence of one of the
  producer's last 5 batches with that batch's own offset (nothing stored twice), and an older one with
  ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (an error): never an offset -1.
- ``end_offsets()``: wrong on Tansu, so the service takes a partition's end from a fresh fetch's highwater; on
  Apache Kafka both give the same end.
- The broker guard's offset floors: a fresh fetch's highwater below an offset the service committed or saw
  acknowledged is taken as data loss (exit 4).  On a three-node cluster the leader is killed (``kill -9``) under
  a steady stream of ``acks=all`` writes while a prober reads the highwater with a fresh assignment again and
  again (as ``PartitionReader.bounds`` does).  A new leader's highwater can lag behind what was seen or acknowledged
  before for a moment (seen in CI: 2,348 after 25,200), so the service confirms a loss with fresh reads for
  ``HIGHWATER_CONFIRM_SECONDS``: every such dip must end within half of that.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from apache_kafka_support import KafkaCluster, TestBroker
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import OutOfOrderSequenceNumberError

from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.kafka_io.settings import KafkaSettings
from stream_anon.service.broker_guard import HIGHWATER_CONFIRM_SECONDS


def create(bs: str, topic: str, partitions: int, replicas: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        admin.create_topics([NewTopic(topic, partitions, replicas)])
    finally:
        admin.close()


def read_values(bs: str, tp: TopicPartition) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, fetch_max_wait_ms=50)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        out: list[bytes] = []
        deadline = time.monotonic() + 60
        while consumer.position(tp) < end:
            for recs in consumer.poll(timeout_ms=200).values():
                out.extend(r.value for r in recs)
            assert time.monotonic() < deadline
        return out
    finally:
        consumer.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_resent_idempotent_batch_gets_its_offset_or_an_error_never_offset_minus_1(apache_kafka: KafkaCluster,
                                                                                   tmp_path: Path) -> None:
    bs = apache_kafka.bootstrap_servers
    topic = f"dup{time.monotonic_ns()}"
    create(bs, topic, 1, 1)
    tp = TopicPartition(topic, 0)
    outcomes = {}
    for back in (1, 5, 6):
        producer = KafkaProducer(bootstrap_servers=bs, enable_idempotence=True, acks="all", linger_ms=0,
                                 max_in_flight_requests_per_connection=1)
        try:
            offsets = [producer.send(topic, b"r%d" % i, partition=0).get(30).offset for i in range(8)]
            tm = producer._transaction_manager
            # the next batch carries the sequence of the batch sent `back` batches ago (one record each)
            tm.set_sequence_number(tp, tm.sequence_number(tp) - back)
            try:
                outcomes[back] = ("offset", producer.send(topic, b"again", partition=0).get(30).offset,
                                  offsets[8 - back])
            except OutOfOrderSequenceNumberError:
                outcomes[back] = ("out of order", None, offsets[8 - back])
        finally:
            producer.close(timeout=5)
    assert outcomes[1][0] == "offset" and outcomes[1][1] == outcomes[1][2]  # the original batch's own offset
    assert outcomes[5][0] == "offset" and outcomes[5][1] == outcomes[5][2]
    assert outcomes[6][0] == "out of order"  # beyond the 5 batches the broker keeps: an error, not a success
    values = read_values(bs, tp)
    assert len(values) == 24 and b"again" not in values  # nothing stored twice, the re-sends not stored at all
    print(f"\nApache Kafka {apache_kafka.version}: a batch re-sent with the sequence of the batch 1, 5, 6 back: {outcomes}")


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_end_offsets_and_the_fetch_highwater_agree(apache_kafka: KafkaCluster) -> None:
    bs = apache_kafka.bootstrap_servers
    topic = f"hw{time.monotonic_ns()}"
    create(bs, topic, 2, 1)
    producer = KafkaProducer(bootstrap_servers=bs, acks="all")
    for i in range(300):
        producer.send(topic, b"v%d" % i, partition=i % 2)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, fetch_max_wait_ms=50)
    try:
        tps = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + 30
        while any(consumer.highwater(tp) is None for tp in tps):
            consumer.poll(timeout_ms=100, max_records=1)
            assert time.monotonic() < deadline
        assert {tp.partition: consumer.highwater(tp) for tp in tps} == \
            {tp.partition: e for tp, e in consumer.end_offsets(tps).items()} == {0: 150, 1: 150}
    finally:
        consumer.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_reader_reads_an_unchanged_partitions_end_again_and_again(any_broker: TestBroker) -> None:
    """``PartitionReader.bounds`` of the same partition back to back, nothing written in between (the broker guard's
    ledger ends, a loss confirmed by fresh reads).  With kafka-python's incremental fetch sessions the broker left
    the unchanged partition out of its answers and 27 of 30 such reads of an empty partition timed out on Apache
    Kafka 4.4; the reader now sends full fetches."""
    bs = any_broker.bootstrap_servers
    topic = f"rr{time.monotonic_ns()}"
    create(bs, topic, 2, 1)
    producer = KafkaProducer(bootstrap_servers=bs, acks="all")
    for i in range(20):
        producer.send(topic, b"v%d" % i, partition=1)
    producer.flush()
    producer.close()
    reader = PartitionReader(KafkaSettings(bootstrap_servers=bs))
    try:
        ends = [reader.bounds(topic, p, timeout_s=10.0) for p in (0, 0, 0, 0, 0, 1, 1, 1, 0, 0, 1, 1)]
    finally:
        reader.close()
    assert ends == [(0, 0)] * 5 + [(0, 20)] * 3 + [(0, 0)] * 2 + [(0, 20)] * 2, ends


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_highwater_dip_after_a_leader_kill_ends_within_the_confirmation_window(kafka_cluster: KafkaCluster) -> None:
    cluster = kafka_cluster
    bs = cluster.bootstrap_servers
    create(bs, "hwk", 1, 3)
    cluster.wait_in_sync(["hwk"])
    tp = TopicPartition("hwk", 0)
    stop = threading.Event()
    acked = [0]

    def produce() -> None:
        producer = KafkaProducer(bootstrap_servers=bs, acks="all", linger_ms=5, request_timeout_ms=5000)
        while not stop.is_set():
            futures = [producer.send("hwk", b"x" * 100) for _ in range(200)]
            producer.flush()
            for f in futures:
                if f.succeeded():
                    acked[0] = max(acked[0], f.value.offset + 1)
        producer.close(timeout=10)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    # metadata at most 1 s old: after the leader's death the prober asks the new leader within a second (with kafka-python's
    # default of 5 minutes it kept asking the dead one: 1 probe in 15 s on a loaded machine)
    prober = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, fetch_max_wait_ms=20,
                           metadata_max_age_ms=1000)
    results = []
    try:
        for kill_no in range(2):
            deadline = time.monotonic() + 60
            while acked[0] < 2000 + (results[-1][2] if results else 0):  # a stream is flowing
                assert time.monotonic() < deadline and writer.is_alive()
                time.sleep(0.05)
            leader = cluster.leader_of("hwk", 0)
            floor = acked[0]
            cluster.kill(leader)
            t0, lowest, probes = time.monotonic(), None, 0
            below_since: float | None = None  # a dip below the floor: when it was first seen
            longest = 0.0  # the longest dip, seconds from its first probe below to the first probe back
            while time.monotonic() - t0 < 15 or below_since is not None:  # the election and after
                assert time.monotonic() - t0 < 60, f"the end stayed below {floor} from {below_since}"
                prober.assign([])
                prober.assign([tp])
                prober.seek(tp, 0)
                hw, d = None, time.monotonic() + 2
                while hw is None and time.monotonic() < d:
                    prober.poll(timeout_ms=50, max_records=1)
                    hw = prober.highwater(tp)
                if hw is not None:
                    probes += 1
                    if hw < floor:
                        lowest = hw if lowest is None else min(lowest, hw)
                        below_since = time.monotonic() if below_since is None else below_since
                    else:
                        if below_since is not None:
                            longest = max(longest, time.monotonic() - below_since)
                            below_since = None
                        floor = hw
            results.append((leader, probes, floor, lowest, round(longest, 2)))
            if kill_no == 0:  # back in sync for the second kill (3 replicas again); after it nothing follows: its
                # restart (~20 s under the stream) and resync measured nothing
                cluster.start_node(leader)
                cluster.wait_in_sync(["hwk"])
    finally:
        stop.set()
        writer.join(30)
        prober.close()
    print(f"\nApache Kafka, leader of hwk[0] killed twice under acks=all writes: (leader, probes in 15 s, highest end "
          f"seen, lowest end below it, longest dip in s) = {results}")
    assert all(r[1] > 10 for r in results), results  # the prober did see the partition during the election
    # a new leader's highwater may lag behind what was acknowledged for a moment (seen: 2,348 after 25,200), so the
    # service confirms a loss with fresh reads for HIGHWATER_CONFIRM_SECONDS: every dip must end well within that
    assert all(r[4] < HIGHWATER_CONFIRM_SECONDS / 2 for r in results), results
