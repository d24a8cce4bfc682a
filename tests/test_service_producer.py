"""The one producer of the service: retry policy, errors, receipts (in memory), and both clients against Tansu."""

from __future__ import annotations

import threading
import time
import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from producer_support import MemoryTransport, Refused

from stream_anon.config.settings import Config
from stream_anon.formats.messages import OutputMessage
from stream_anon.kafka_io.clients import KAFKA_PYTHON_METADATA_MAX_AGE_MS, client_options
from stream_anon.kafka_io.errors import BrokerUnavailableError, ProducerFatalError, ProducerStuckError
from stream_anon.kafka_io.producer import (
    ConfluentTransport,
    KafkaPythonTransport,
    OutgoingBatch,
    OutputProducer,
    UnconfirmedDelivery,
    librdkafka_config,
    open_producer,
)
from stream_anon.kafka_io.settings import PRODUCER_CLIENTS

FAST = Config.load(env={}, overrides={"kafka.retry_backoff_max_seconds": 0.01, "kafka.request_timeout_ms": 1000}).kafka


def test_only_the_failed_messages_are_resent_in_order_and_counted_once_per_batch() -> None:
    errors: list[str] = []
    memory = MemoryTransport(partitions=2, fail_once={b"v3", b"v7"})
    producer = OutputProducer(FAST, transport_factory=lambda: memory, on_error=errors.append)
    headers = [("kind", b"krr")]
    keys: list[bytes | None] = [f"k{i}".encode() for i in range(10)]
    copies = producer.send_values("adult.krr", 3, keys, [f"v{i}".encode() for i in range(10)], headers)
    est = producer.send([OutputMessage("estimates", "adult.estimates", 2, b"krr/sex", b"{}", (("kind", b"estimates"),))])
    assert producer.pending == 11
    assert producer.flush() == 11
    assert producer.pending == 0
    values = [m.value for m in memory.sent]
    assert values[:11] == [f"v{i}".encode() for i in range(10)] + [b"{}"]
    assert values[11:] == [b"v3", b"v7"]  # only the failed ones, once more, in their order
    assert {(m.topic, m.partition) for m in memory.sent} == {("adult.krr", 1), ("adult.estimates", 0)}  # src mod 2
    assert all(m.headers == headers for m in memory.sent if m.topic == "adult.krr")
    assert errors == ["adult.krr"]  # one failed batch (two messages) -> one error count
    # every acknowledged message's position, in the order it was given (the re-sent ones at their new offsets)
    assert [(d.topic, d.partition, d.offset) for d in copies.deliveries()] == \
        [("adult.krr", 1, o) for o in (0, 1, 2, 8, 3, 4, 5, 9, 6, 7)]
    assert [d.offset for d in est.deliveries()] == [0] and copies.acknowledged


def test_a_fatal_client_error_is_raised_and_reopen_resends_what_was_not_acknowledged() -> None:
    clients = [MemoryTransport(fatal=True), MemoryTransport()]
    producer = OutputProducer(FAST, transport_factory=lambda: clients.pop(0))
    first = producer.transport
    receipt = producer.send([OutputMessage("anon", "adult.anon", 0, b"c1", b"class-1", ()),
                             OutputMessage("anon", "adult.anon", 1, b"c2", b"class-2", ())])
    with pytest.raises(ProducerFatalError, match="fenced"):
        producer.flush()
    assert not receipt.acknowledged
    with pytest.raises(ValueError, match="not acknowledged"):
        receipt.deliveries()
    assert producer.reopen() == 2
    assert isinstance(first, MemoryTransport) and first.closed
    assert producer.flush() == 2
    assert [m.value for m in producer.transport.sent] == [b"class-1", b"class-2"]  # type: ignore[attr-defined]
    assert [(d.partition, d.offset) for d in receipt.deliveries()] == [(0, 0), (1, 0)]


class Holding(MemoryTransport):
    """Never acknowledges anything (a broker that stopped answering)."""

    def submit(self, batch: OutgoingBatch) -> None:
        pass


def test_stopping_while_the_broker_does_not_answer_gives_up_waiting() -> None:
    stop = threading.Event()
    producer = OutputProducer(FAST, transport_factory=Holding, stop=stop.is_set)
    producer.send_values("adult.krr", 0, [b"k"], [b"v"], [])
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(BrokerUnavailableError, match="1 output messages not acknowledged at shutdown"):
        producer.flush()
    assert time.monotonic() - t0 < 30
    assert producer.pending == 1


def test_an_acknowledgement_without_an_offset_is_not_an_acknowledgement() -> None:
    """Tansu's DUPLICATE_SEQUENCE_NUMBER answer after a restart: "acknowledged" with offset -1, maybe not stored.
    Never counted as delivered, never re-sent through the same client (it could be a true duplicate): fatal."""
    memory = MemoryTransport(unconfirmed={b"v1"})
    producer = OutputProducer(FAST, transport_factory=lambda: memory)
    receipt = producer.send([OutputMessage("anon", "adult.anon", 0, b"k", b"v%d" % i, ()) for i in range(3)])
    with pytest.raises(ProducerFatalError, match="1 message.* acknowledged without an offset"):
        producer.flush()
    assert not receipt.acknowledged
    assert [m.value for m in memory.sent] == [b"v0", b"v1", b"v2"]  # not re-sent
    with pytest.raises(ValueError, match="not acknowledged"):
        receipt.deliveries()


def test_kafka_python_offset_minus_one_becomes_an_unconfirmed_delivery() -> None:
    """kafka-python reports a DUPLICATE_SEQUENCE_NUMBER answer as a succeeded future with offset -1."""
    transport = KafkaPythonTransport.__new__(KafkaPythonTransport)  # no client: only ``collect`` is exercised

    def future(offset: int) -> SimpleNamespace:
        return SimpleNamespace(is_done=True, succeeded=lambda: True, value=SimpleNamespace(offset=offset))

    batch = OutgoingBatch("adult.anon", 0, [b"a", b"b"], [b"1", b"2"])
    batch.handles = [future(7), future(-1)]
    transport.collect(batch)
    assert batch.settled and batch.offsets == [7, -1]
    assert isinstance(batch.errors[1], UnconfirmedDelivery) and 0 not in batch.errors


def test_a_producer_that_acknowledges_nothing_is_stuck_after_the_bound() -> None:
    """``stuck_after_s``: messages waiting with none acknowledged for that long end the wait with
    ``ProducerStuckError`` (a ``ProducerFatalError``: the caller creates the producer anew)."""
    watched: list[float] = []
    producer = OutputProducer(FAST, transport_factory=Holding, stuck_after_s=0.3,
                              watchdog=lambda: watched.append(time.monotonic()))
    producer.send_values("adult.krr", 0, [b"k"], [b"v"], [])
    t0 = time.monotonic()
    with pytest.raises(ProducerStuckError, match=r"1 message\(s\) waiting, none acknowledged"):
        producer.flush()
    assert time.monotonic() - t0 >= 0.3
    assert watched  # the watchdog ran while the flush waited
    assert issubclass(ProducerStuckError, ProducerFatalError)


class FailingAlways(MemoryTransport):
    """Every delivery fails with a retriable error (re-sent again and again, never acknowledged)."""

    attempts = 0

    def submit(self, batch: OutgoingBatch) -> None:
        self.attempts += 1
        for i in range(len(batch)):
            batch.errors[i] = Refused("not leader (test)")
            batch.resolved += 1


def test_deliveries_that_keep_failing_are_stuck_after_the_bound() -> None:
    """A retriable failure is re-sent with backoff; re-sending does not restart the clock: still nothing
    acknowledged after ``stuck_after_s`` ends the wait."""
    client = FailingAlways()
    producer = OutputProducer(FAST, transport_factory=lambda: client, stuck_after_s=0.5)
    producer.send_values("adult.krr", 0, [b"k"], [b"v"], [])
    with pytest.raises(ProducerStuckError, match="1 message.* none acknowledged"):
        producer.flush()
    assert client.attempts >= 2  # sent, then re-sent at least once before giving up


def test_a_stop_cuts_a_long_retry_backoff_short() -> None:
    """Issue 18 item 4: a flush waiting out its re-send backoff (up to ``kafka.retry_backoff_max_seconds``, 30 s by
    default) ended only after the whole sleep (a stop took 31 s); now the stop ends it within a slice."""
    slow = Config.load(env={}, overrides={"kafka.retry_backoff_max_seconds": 30, "kafka.request_timeout_ms": 1000}).kafka
    stop = threading.Event()
    client = FailingAlways()
    producer = OutputProducer(slow, transport_factory=lambda: client, stop=stop.is_set)
    producer.send_values("adult.krr", 0, [b"k"], [b"v"], [])
    errors: list[BaseException] = []

    def flush() -> None:
        try:
            producer.flush()
        except BaseException as e:  # noqa: BLE001  (the test reads it)
            errors.append(e)

    th = threading.Thread(target=flush)
    th.start()
    deadline = time.monotonic() + 30
    while client.attempts < 3:  # sent, re-sent after 0.5 s, after 1 s: now in the 2 s backoff, then 4, 8 ...
        assert time.monotonic() < deadline and th.is_alive()
        time.sleep(0.01)
    t0 = time.monotonic()
    stop.set()
    th.join(30)
    assert not th.is_alive() and time.monotonic() - t0 < 1.0
    assert len(errors) == 1 and isinstance(errors[0], BrokerUnavailableError), errors
    assert "not acknowledged at shutdown" in str(errors[0])


def test_the_watchdog_can_end_a_flush_that_waits() -> None:
    class Lost(RuntimeError):
        pass

    def watchdog() -> None:
        raise Lost("the broker lost its data")

    producer = OutputProducer(FAST, transport_factory=Holding, watchdog=watchdog)
    producer.send_values("adult.krr", 0, [b"k"], [b"v"], [])
    with pytest.raises(Lost):
        producer.flush()


def test_librdkafka_options_carry_the_security_settings() -> None:
    cfg = Config.load(env={}, overrides={
        "kafka.bootstrap_servers": "h:9093", "kafka.security_protocol": "SASL_SSL", "kafka.sasl_mechanism": "PLAIN",
        "kafka.sasl_plain_username": "u", "kafka.sasl_plain_password": "p", "kafka.ssl_cafile": "/ca.pem",
        "kafka.ssl_check_hostname": False, "kafka.compression_type": "zstd"})
    conf = librdkafka_config(cfg.kafka)
    assert conf["acks"] == "all" and conf["enable.idempotence"] is True
    assert conf["security.protocol"] == "sasl_ssl" and conf["sasl.mechanism"] == "PLAIN"
    assert conf["sasl.username"] == "u" and conf["sasl.password"] == "p" and conf["ssl.ca.location"] == "/ca.pem"
    assert conf["ssl.endpoint.identification.algorithm"] == "none" and conf["compression.type"] == "zstd"
    no_idem = librdkafka_config(cfg.with_options({"kafka.enable_idempotence": False}).kafka)
    assert no_idem["max.in.flight.requests.per.connection"] == 1  # order kept across retries


def test_every_client_request_gives_up_after_the_request_timeout_and_metadata_stays_fresh() -> None:
    """A hung broker holds no librdkafka request longer than ``kafka.request_timeout_ms`` (its own default is 60 s),
    and kafka-python clients refresh their metadata every few seconds (kafka-python 3.0 does not after a leader
    change): see tests/test_apache_kafka_cluster_faults.py for what each did on a cluster."""
    cfg = Config.load(env={}, overrides={"kafka.request_timeout_ms": 7000})
    assert librdkafka_config(cfg.kafka)["socket.timeout.ms"] == 7000
    assert client_options(cfg.kafka)["metadata_max_age_ms"] == KAFKA_PYTHON_METADATA_MAX_AGE_MS <= 10000


# ---------------------------------------------------------------------------------------------- real broker
@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("client", PRODUCER_CLIENTS)
def test_idempotent_producer_with_acks_all_on_tansu_reports_every_offset(broker: Any, client: str) -> None:
    """Tansu answers InitProducerId (an idempotent producer sends nothing before it has its producer id), and every
    acknowledged message is where its receipt says it is."""
    cfg = Config.load(env={}, overrides={"kafka.bootstrap_servers": broker.bootstrap_servers,
                                         "kafka.producer_client": client})
    topic = f"idem{uuid.uuid4().hex[:6]}"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)  # the service's producers never create topics
    admin.create_topics([NewTopic(topic, 1, 1)])
    admin.close()
    producer = open_producer(cfg.kafka)
    try:
        t = producer.transport
        if isinstance(t, ConfluentTransport):
            assert t.config["acks"] == "all" and t.config["enable.idempotence"] is True
        else:
            assert isinstance(t, KafkaPythonTransport)
            assert t.producer.config["acks"] in ("all", -1) and t.producer.config["enable_idempotence"] is True
        values = [f"copy-{i}".encode() for i in range(3000)]
        bulk = producer.send_values(topic, 0, [f"k{i}".encode() for i in range(3000)], values, [("kind", b"krr")])
        one = producer.send([OutputMessage("anon", topic, 0, b"class", b"the-class", (("kind", b"anon"),))])
        assert producer.flush() == 3001
    finally:
        producer.close()
    offsets = [d.offset for d in bulk.deliveries()]
    assert offsets == list(range(3000)) and [d.offset for d in one.deliveries()] == [3000]
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 2999)
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 2 and time.monotonic() < deadline:
        got += consumer.poll(timeout_ms=500).get(tp, [])
    consumer.close()
    assert [(r.offset, r.value, r.headers) for r in got[:2]] == [(2999, b"copy-2999", [("kind", b"krr")]),
                                                                (3000, b"the-class", [("kind", b"anon")])]
