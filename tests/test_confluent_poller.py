"""The group consumer behind the ``Poller`` interface, with either client library (``kafka.consumer_client``):
the same contract on Tansu and on Apache Kafka (records in order with their attributes, highwater, committed
offsets, commits with metadata, asynchronous commit answers, seek, rebalance callbacks), and the confluent-kafka
poller's own parts without a broker (its librdkafka options, a fatal client error ends the run, repeated lines)."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import confluent_kafka
import pytest
from apache_kafka_support import TestBroker
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from stream_anon.config.settings import Config
from stream_anon.kafka_io.confluent_poller import ConfluentPoller, consumer_config
from stream_anon.kafka_io.consumers import open_poller
from stream_anon.kafka_io.errors import ConsumerFailedError
from stream_anon.kafka_io.oversized import RepeatedLines
from stream_anon.kafka_io.reader import PartitionReader

N = 10  # records per partition


def settings(bs: str, **options: Any) -> Any:
    return Config.load(env={}, overrides={"kafka.bootstrap_servers": bs, "kafka.session_timeout_ms": 6000,
                                          **options}).kafka


def test_the_confluent_consumer_gets_the_service_options_in_librdkafka_names() -> None:
    k = settings("127.0.0.1:1", **{"kafka.group_instance_id": "member-1", "kafka.security_protocol": "SASL_SSL",
                                   "kafka.sasl_mechanism": "SCRAM-SHA-512", "kafka.sasl_plain_username": "u",
                                   "kafka.sasl_plain_password": "p", "kafka.ssl_check_hostname": False,
                                   "kafka.fetch_max_bytes": 2_000_000, "kafka.max_partition_fetch_bytes": 500_000,
                                   "kafka.receive_max_bytes": 3_000_000})
    conf = consumer_config(k, group_id="g")
    assert conf["group.instance.id"] == "member-1" and conf["group.id"] == "g"
    assert (conf["security.protocol"], conf["sasl.mechanism"], conf["sasl.username"], conf["sasl.password"]) == (
        "sasl_ssl", "SCRAM-SHA-512", "u", "p")
    assert conf["ssl.endpoint.identification.algorithm"] == "none"
    assert (conf["fetch.max.bytes"], conf["max.partition.fetch.bytes"], conf["receive.message.max.bytes"]) == (
        2_000_000, 500_000, 3_000_000)
    assert conf["enable.auto.commit"] is False and conf["auto.offset.reset"] == "earliest"
    assert conf["allow.auto.create.topics"] is False and conf["isolation.level"] == "read_uncommitted"
    confluent_kafka.Consumer(conf).close()  # librdkafka takes them (it refuses inconsistent limits)


def test_a_fatal_client_error_ends_the_run() -> None:
    poller = ConfluentPoller(settings("127.0.0.1:1"), "t", group_id="g", max_records=10)
    try:
        assert poller.poll(0, lambda *a: True) == {}
        poller._on_error(confluent_kafka.KafkaError(confluent_kafka.KafkaError._FENCED, "fenced by another member",
                                                    fatal=True))
        with pytest.raises(ConsumerFailedError, match="_FENCED"):
            poller.poll(0, lambda *a: True)
    finally:
        poller.close(1.0)


def test_a_line_repeated_by_a_retrying_client_is_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    lines = RepeatedLines(logging.getLogger("test.repeated"), every_s=60.0)
    with caplog.at_level(logging.WARNING, logger="test.repeated"):
        for _ in range(5):
            lines.warning("broker said %s", "no", key="a")
        lines.warning("other", key="b")
    assert [r.getMessage() for r in caplog.records] == ["broker said no", "other"]


def produce(bs: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bs)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    p = KafkaProducer(bootstrap_servers=bs, acks="all")
    for i in range(2 * N):
        p.send(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2, headers=[("h", b"%d" % i)])
    p.flush()
    p.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_poller_contract_on_each_broker_with_each_client(any_broker: TestBroker, consumer_client: str) -> None:
    bs = any_broker.bootstrap_servers
    topic, group = f"poll{uuid.uuid4().hex[:6]}", f"poll{uuid.uuid4().hex[:6]}-g"
    produce(bs, topic)
    k = settings(bs, **{"kafka.consumer_client": consumer_client, "kafka.group_id": group})
    poller = open_poller(k, topic, group_id=group, reader=lambda: PartitionReader(k))
    events: list[tuple[str, Any]] = []
    poller.subscribe(lambda ps: events.append(("assigned", sorted(ps))), lambda ps: events.append(("revoked", ps)))
    got: dict[int, list[Any]] = {0: [], 1: []}
    try:
        deadline = time.monotonic() + 60
        while sum(map(len, got.values())) < 2 * N:
            assert time.monotonic() < deadline, got
            for p, recs in poller.poll(200, lambda *a: True).items():
                got[p].extend(recs)
        assert ("assigned", [0, 1]) in events and poller.assignment() == {0, 1}  # (kafka-python revokes [] first)
        for p in (0, 1):
            assert [r.offset for r in got[p]] == list(range(N))
            assert [r.value for r in got[p]] == [b"v%d" % (2 * o + p) for o in range(N)]
            assert [r.key for r in got[p]] == [b"k%d" % (2 * o + p) for o in range(N)]
            assert [list(r.headers) for r in got[p]] == [[("h", b"%d" % (2 * o + p))] for o in range(N)]
            assert all(isinstance(r.timestamp, int) and r.timestamp > 0 for r in got[p])
            assert poller.highwater(p) == N
        assert poller.committed(0, 5000) is None
        poller.commit_sync({0: 5, 1: 7}, 10.0, metadata={0: "anchor 5"})
        assert (poller.committed(0, 5000), poller.committed(1, 5000)) == (5, 7)
        if any_broker.name == "apache-kafka":  # (Tansu does not keep commit metadata)
            admin = KafkaAdminClient(bootstrap_servers=bs)
            offsets = admin.list_group_offsets({group: [TopicPartition(topic, 0)]})[group]
            admin.close()
            # (confluent-kafka 2.16 sends the metadata with its C string's terminating NUL byte)
            assert offsets[TopicPartition(topic, 0)].metadata.rstrip("\x00") == "anchor 5"
        answers: list[tuple[dict[int, int], Any]] = []
        poller.commit_async({0: 6}, lambda offsets, error: answers.append((offsets, error)))
        poller.seek(0, 2)
        again: list[int] = []
        deadline = time.monotonic() + 30
        while not answers or len(again) < N - 2:
            assert time.monotonic() < deadline, (answers, again)
            again.extend(r.offset for r in poller.poll(200, lambda *a: True).get(0, []))
        assert answers == [({0: 6}, None)] and poller.committed(0, 5000) == 6
        assert again == list(range(2, N))  # from the seek on, in order
    finally:
        poller.close(5.0)
    assert ("revoked", [0, 1]) in events or consumer_client == "kafka-python"  # (kafka-python: no revoke on close)
