"""The side app's batch logic with in-memory stand-ins for the consumer and producer (lists in, lists out):
commit-before-perturb, retry after a failed commit, bad input counted (or dead-lettered), end-of-stream flush."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError
from producer_support import MemoryTransport
from prometheus_client import CollectorRegistry

from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.service.config import Config
from stream_anon.service.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.service.metrics import ServiceMetrics
from stream_anon.service.pipeline import OutputMessage
from stream_anon.service.producer import OutputProducer
from stream_anon.side.app import SidePathApp
from stream_anon.side.config import KMeansConfig, SidePathConfig


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


class Producer(OutputProducer):
    """The real producer over a :class:`MemoryTransport`; ``sent`` lists what reached the transport as
    :class:`OutputMessage` s (kind = the ``kind`` header)."""

    def __init__(self, cfg: Config) -> None:
        self.memory = MemoryTransport(partitions=1)
        super().__init__(cfg, transport_factory=lambda: self.memory)

    @property
    def sent(self) -> list[OutputMessage]:
        return [OutputMessage(dict(m.headers)["kind"].decode(), m.topic, m.partition, m.key, m.value,
                              tuple(m.headers)) for m in self.memory.sent]


@pytest.fixture(scope="module")
def records(adult_path: Path) -> list[dict[str, Any]]:
    return list(iter_records(read_adult(adult_path)))[:600]


def make_app(side: SidePathConfig, consumer: Consumer) -> tuple[SidePathApp, Producer, ServiceMetrics]:
    cfg = dataclasses.replace(Config(), side_paths=side)
    metrics = ServiceMetrics(CollectorRegistry())
    app = SidePathApp(cfg, metrics, rng=0)
    producer = Producer(cfg)
    app._consumer = consumer  # type: ignore[assignment]
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
