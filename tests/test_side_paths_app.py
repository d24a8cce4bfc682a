"""The side app's batch logic with in-memory stand-ins for the consumer and producer (lists in, lists out):
commit-before-perturb, retry after a failed commit, bad input counted (or dead-lettered), end-of-stream flush."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.service.config import Config
from stream_anon.service.metrics import ServiceMetrics
from stream_anon.service.pipeline import CONTROL_FLUSH, CONTROL_HEADER, OutputMessage
from stream_anon.service.side_app import SidePathApp
from stream_anon.service.side_paths import KMeansConfig, SidePathConfig


@dataclass
class Msg:
    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


class Consumer:
    def __init__(self, fail_commits: int = 0, partitions: tuple[int, ...] = (0,)) -> None:
        self.fail_commits = fail_commits
        self.commits: list[dict[Any, Any]] = []
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.partitions = partitions

    def commit(self, offsets: dict[Any, Any]) -> None:
        if self.fail_commits:
            self.fail_commits -= 1
            raise KafkaError("commit failed (test)")
        self.commits.append(offsets)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("adult.raw", p) for p in self.partitions}


class Producer:
    def __init__(self) -> None:
        self.sent: list[OutputMessage] = []
        self.flushes = 0

    def send(self, msgs: list[OutputMessage]) -> None:
        self.sent.extend(msgs)

    def send_copies(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]]) -> None:
        kind = dict(headers)["kind"].decode()
        self.sent.extend(OutputMessage(kind, topic, src_partition, k, v, tuple(headers)) for k, v in zip(keys, values, strict=True))

    def flush(self) -> None:
        self.flushes += 1

    @property
    def pending(self) -> int:
        return 0


@pytest.fixture(scope="module")
def records(adult_path: Path) -> list[dict[str, Any]]:
    return list(iter_records(read_adult(adult_path)))[:600]


def make_app(side: SidePathConfig, consumer: Consumer) -> tuple[SidePathApp, Producer, ServiceMetrics]:
    cfg = Config()
    cfg.side_paths = side  # type: ignore[assignment]
    metrics = ServiceMetrics(CollectorRegistry())
    app = SidePathApp(cfg, metrics, rng=0)
    producer = Producer()
    app._consumer = consumer
    app._producer = producer
    return app, producer, metrics


def messages(recs: list[dict[str, Any]], start: int = 0) -> list[Msg]:
    return [Msg(start + i, json.dumps(r).encode(), r["id"].encode()) for i, r in enumerate(recs)]


SIDE = SidePathConfig(estimates_every=0, estimates_every_seconds=None, kmeans=KMeansConfig(window=250))


def test_commit_comes_before_perturbation_and_a_failed_commit_rereads_the_batch(records: list[dict[str, Any]]) -> None:
    consumer = Consumer(fail_commits=1)
    app, producer, metrics = make_app(SIDE, consumer)
    tp = TopicPartition("adult.raw", 0)
    batch = messages(records[:300])
    app._process(tp, batch)
    # failed commit: nothing randomized, nothing sent, the batch will be read again from its first offset
    assert producer.sent == [] and app.processor.records_processed == 0
    assert consumer.seeks == [(tp, 0)] and app.status.consumed == 0
    app._process(tp, batch)
    assert consumer.commits[-1][tp].offset == 300
    assert app.processor.records_processed == 300
    kinds = [m.kind for m in producer.sent]
    assert kinds.count("krr") == kinds.count("rs") == kinds.count("blap") == 300
    assert kinds.count("kmeans") == 1  # window of 250
    app._flush()
    assert metrics.registry.get_sample_value("stream_anon_side_records_published_total",
                                             {"topic": "adult.krr"}) == 300
    assert metrics.registry.get_sample_value("stream_anon_side_records_consumed_total", {"topic": "adult.raw"}) == 300
    assert app.status.epsilon_spent == {"adult.kmeans": 1.0, "adult.krr": 1500.0, "adult.rs": 600.0,
                                        "adult.blap": 1200.0}


def test_bad_input_is_counted_not_dead_lettered_by_default(records: list[dict[str, Any]]) -> None:
    app, producer, _ = make_app(SIDE, Consumer())
    tp = TopicPartition("adult.raw", 0)
    bad = [Msg(10, b"{oops"), Msg(11, json.dumps({**records[0], "age": 500}).encode()),
           Msg(12, json.dumps({k: v for k, v in records[0].items() if k != "sex"}).encode())]
    app._process(tp, messages(records[:10]) + bad)
    assert app.status.skipped == {"malformed_json": 1, "out_of_domain": 1, "missing_field": 1}
    assert all(m.kind != "dlq" for m in producer.sent)
    assert app.processor.records_processed == 10

    side = SidePathConfig(estimates_every=0, estimates_every_seconds=None, dead_letter=True,
                          kmeans=KMeansConfig(enabled=False))
    app2, producer2, metrics2 = make_app(side, Consumer())
    app2._process(tp, bad)
    dlq = [m for m in producer2.sent if m.kind == "dlq"]
    assert [m.value for m in dlq] == [b.value for b in bad]  # the original bytes
    assert [dict(m.headers)["dlq.reason"] for m in dlq] == [b"malformed_json", b"out_of_domain", b"missing_field"]
    assert metrics2.registry.get_sample_value("stream_anon_records_dead_lettered_total",
                                              {"reason": "out_of_domain"}) == 1


def test_end_of_stream_flush_waits_for_every_assigned_partition(records: list[dict[str, Any]]) -> None:
    side = SidePathConfig(estimates_every=0, estimates_every_seconds=None,
                          kmeans=KMeansConfig(window=1000, min_partial_window=100))
    app, producer, _ = make_app(side, Consumer(partitions=(0, 1)))
    ctl = [(CONTROL_HEADER, CONTROL_FLUSH)]
    app._process(TopicPartition("adult.raw", 0), messages(records[:300]) + [Msg(300, b"", headers=ctl)])
    assert not [m for m in producer.sent if m.kind in ("estimates", "kmeans")]  # partition 1 still running
    app._process(TopicPartition("adult.raw", 1), messages(records[300:600]) + [Msg(300, b"", headers=ctl)])
    est = [json.loads(m.value) for m in producer.sent if m.kind == "estimates"]
    km = [json.loads(m.value) for m in producer.sent if m.kind == "kmeans"]
    assert {e["records_seen"] for e in est} == {600} and len(est) == 11
    assert len(km) == 1 and km[0]["n_records"] == 600  # the partial window, released at the end of the stream
    assert app.status.control == 2


# ------------------------------------------------------------------------------------------ side sender
class Future:
    def __init__(self, ok: bool) -> None:
        self.is_done = True
        self.ok = ok
        self.exception = None if ok else KafkaError("not leader (test)")

    def succeeded(self) -> bool:
        return self.ok

    def failed(self) -> bool:
        return not self.ok


class FakeKafkaProducer:
    """kafka-python stand-in: ``send`` fails the messages whose value is in ``fail_once`` the first time."""

    def __init__(self, fail_once: set[bytes]) -> None:
        self.fail_once = set(fail_once)
        self.sent: list[tuple[str, int, bytes | None, bytes, list[tuple[str, bytes]]]] = []
        self.flushes = 0

    def partitions_for(self, topic: str) -> set[int]:
        return {0, 1}

    def send(self, topic: str, value: bytes, key: bytes | None, partition: int,
             headers: list[tuple[str, bytes]]) -> Future:
        self.sent.append((topic, partition, key, value, headers))
        if value in self.fail_once:
            self.fail_once.discard(value)
            return Future(False)
        return Future(True)

    def flush(self) -> None:
        self.flushes += 1


class FakeAccumulator:
    def __init__(self) -> None:
        self.appended: list[tuple[Any, bytes | None, bytes, list[tuple[str, bytes]]]] = []

    def append(self, tp: Any, timestamp_ms: int | None, key: bytes | None, value: bytes,
               headers: list[tuple[str, bytes]], now: float | None = None,
               abort_on_new_batch: bool = False) -> tuple[Future, bool, bool, bool]:
        self.appended.append((tp, key, value, headers))
        return Future(True), len(self.appended) % 4 == 0, len(self.appended) == 1, False


def test_side_sender_resends_only_the_failed_messages_and_counts_errors() -> None:
    from stream_anon.service.side_app import SideSender

    cfg = Config()
    cfg.kafka.retry_backoff_max_seconds = 0.01
    errors: list[str] = []
    kp = FakeKafkaProducer(fail_once={b"v3", b"v7"})
    sender = SideSender(kp, cfg, on_error=errors.append)
    headers = [("kind", b"krr")]
    keys: list[bytes | None] = [f"k{i}".encode() for i in range(10)]
    sender.send_copies("adult.krr", 3, keys, [f"v{i}".encode() for i in range(10)], headers)
    sender.send([OutputMessage("estimates", "adult.estimates", 2, b"krr/sex", b"{}", (("kind", b"estimates"),))])
    assert sender.pending == 11
    sender.flush()
    assert sender.pending == 0
    values = [v for _t, _p, _k, v, _h in kp.sent]
    assert values[:11] == [f"v{i}".encode() for i in range(10)] + [b"{}"]
    assert sorted(values[11:]) == [b"v3", b"v7"]  # only the failed ones, once more
    assert {(t, p) for t, p, *_ in kp.sent} == {("adult.krr", 1), ("adult.estimates", 0)}  # src partition mod 2
    assert all(h == headers for t, _p, _k, _v, h in kp.sent if t == "adult.krr")
    assert errors == ["adult.krr"]  # one failed send call (two messages) -> one error count
    assert kp.flushes == 2


def test_side_sender_bulk_append_goes_to_the_accumulator() -> None:
    from stream_anon.service.side_app import SideSender

    kp = FakeKafkaProducer(fail_once=set())
    acc = FakeAccumulator()
    wakeups: list[int] = []
    kp._accumulator = acc  # type: ignore[attr-defined]
    kp._sender = type("S", (), {"wakeup": lambda self: wakeups.append(1)})()  # type: ignore[attr-defined]
    kp._transaction_manager = None  # type: ignore[attr-defined]
    kp.config = {"max_request_size": 1 << 20, "key_serializer": None, "value_serializer": None}  # type: ignore[attr-defined]
    sender = SideSender(kp, Config())
    keys: list[bytes | None] = [f"k{i}".encode() for i in range(10)]
    sender.send_copies("adult.rs", 1, keys, [f"v{i}".encode() for i in range(10)], [("kind", b"rs")])
    assert [(tp.topic, tp.partition, k, v) for tp, k, v, _h in acc.appended] == \
        [("adult.rs", 1, f"k{i}".encode(), f"v{i}".encode()) for i in range(10)]
    assert kp.sent == [] and wakeups  # not through send; the sender thread was woken
    # a message the checks refuse (too large) goes through send, which raises kafka-python's own error
    sender.send_copies("adult.rs", 1, [b"big"], [b"x" * (1 << 20)], [("kind", b"rs")])
    assert len(kp.sent) == 1 and len(acc.appended) == 10
    sender.flush()
    assert sender.pending == 0


def test_sender_process_failure_reaches_the_side_app(broker: Any) -> None:
    """A failure inside a sender child is reported back: the side app's flush raises (the side app then stops
    with exit code 1, logged) instead of hanging or losing the error; close() ends every child."""
    from stream_anon.service.side_app import ProcessSenders, SideSenderError

    cfg = Config()
    cfg.kafka.bootstrap_servers = broker.bootstrap_servers
    senders = ProcessSenders(cfg, 2)
    try:
        assert len({c._proc.pid for c in senders.children}) == 2
        senders.send_copies("sp-fail.krr", 0, [b"k1"], [b"{}"], [("kind", b"krr")])
        senders.send_copies("sp-fail.rs", 0, [b"k2"], [b"{}"], [("kind", b"rs")])
        assert senders._child("sp-fail.krr") is not senders._child("sp-fail.rs")  # one topic per child
        assert senders.pending == 2
        senders.flush()  # acknowledged by the broker
        assert senders.pending == 0
        senders._child("sp-fail.krr")._request(("no-such-request",))  # the child raises on it
        senders.send_copies("sp-fail.krr", 0, [b"k3"], [b"{}"], [("kind", b"krr")])
        with pytest.raises(SideSenderError, match="no-such-request"):
            senders.flush()
    finally:
        senders.close()
    assert not any(c._proc.is_alive() for c in senders.children)
