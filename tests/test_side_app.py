"""The side app's batch logic with in-memory stand-ins for the consumer and producer (lists in, lists out):
commit-before-perturb, retry after a failed commit, bad input counted, clipped (or dead-lettered, redacted),
end-of-stream flush, budgets persisted before the outputs that spend them and restored at start, copies held in
mixing windows (released shuffled, all topics together, one timestamp; at a partition's end and at a clean stop)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError
from producer_support import MemoryTransport
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.config.side_paths import KMeansConfig, MixingConfig, SidePathConfig
from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.formats.messages import OutputMessage
from stream_anon.formats.release import decode_dead_letter, keyed_hash, record_pseudonym
from stream_anon.kafka_io.poller import GroupPoller
from stream_anon.kafka_io.producer import OutputProducer
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.side.app import SidePathApp
from stream_anon.side.budget_store import BudgetTopic

SECRET = "side-app-test-secret-0123456789abcdef"


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

    def commit(self, offsets: dict[Any, Any], timeout_ms: int | None = None) -> None:
        if self.fail_commits:
            self.fail_commits -= 1
            raise KafkaError("commit failed (test)")
        self.commits.append(offsets)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("adult.raw", p) for p in self.partitions}

    def close(self, timeout_ms: int = 0) -> None:
        return None


class Producer(OutputProducer):
    """The real producer over a :class:`MemoryTransport`; ``sent`` lists what reached the transport as
    :class:`OutputMessage` s (kind = the ``kind`` header)."""

    def __init__(self, cfg: Config) -> None:
        self.memory = MemoryTransport(partitions=1)
        super().__init__(cfg.kafka, transport_factory=lambda: self.memory)

    @property
    def sent(self) -> list[OutputMessage]:
        """What reached the transport; ``kind`` = the ``kind`` header, else the topic's last name part."""
        return [OutputMessage(dict(m.headers)["kind"].decode() if m.headers else m.topic.rsplit(".", 1)[-1],
                              m.topic, m.partition, m.key, m.value, tuple(m.headers)) for m in self.memory.sent]

    def timestamps(self, kind: str) -> list[int | None]:
        """The Kafka timestamps of the messages of ``kind`` sent (None: the send time)."""
        return [m.timestamp_ms for m, o in zip(self.memory.sent, self.sent, strict=True) if o.kind == kind]


class MemoryStore(BudgetTopic):
    """The budget topic over the test producer: ``put`` is the real one (send + wait for the acknowledgement), then
    it checks nothing is left unacknowledged; ``load`` reads back what reached the transport (latest per key)."""

    def __init__(self, cfg: Config, producer: Producer, topic: str = "adult.raw.side-budget") -> None:
        super().__init__(cfg, topic)
        self.producer = producer
        self.puts: list[tuple[int, list[str]]] = []  # (messages sent before the put, keys)

    def put(self, producer: OutputProducer, records: Mapping[str, bytes]) -> None:
        before = len(self.producer.memory.sent)
        super().put(producer, records)
        assert producer.pending == 0  # acknowledged before put returns
        self.puts.append((before, sorted(records)))

    def load(self, timeout_s: float = 60.0) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for m in self.producer.memory.sent:
            if m.topic == self.topic and m.key is not None:
                out[m.key.decode()] = m.value
        return out


@pytest.fixture(scope="module")
def records(adult_path: Path) -> list[dict[str, Any]]:
    return list(iter_records(read_adult(adult_path)))[:600]


def _no_reader() -> PartitionReader:
    raise AssertionError("the in-memory consumer has no unreadable record")


def poller(consumer: Consumer) -> GroupPoller:
    """The app's real poller over the in-memory consumer (it commits and seeks through it)."""
    return GroupPoller(consumer, "adult.raw", max_records=500, reader=_no_reader)  # type: ignore[arg-type]


def make_app(side: SidePathConfig, consumer: Consumer, producer: Producer | None = None
             ) -> tuple[SidePathApp, Producer, ServiceMetrics]:
    cfg = dataclasses.replace(Config().with_options({"release.secret": SECRET}), side_paths=side)
    metrics = ServiceMetrics(CollectorRegistry())
    app = SidePathApp(cfg, metrics, rng=0)
    producer = producer or Producer(cfg)
    app._poller = poller(consumer)
    app._producer = producer
    if app.budget_store is not None:
        app.budget_store = MemoryStore(cfg, producer)
    return app, producer, metrics


def messages(recs: list[dict[str, Any]], start: int = 0) -> list[Msg]:
    return [Msg(start + i, json.dumps(r).encode(), r["id"].encode()) for i, r in enumerate(recs)]


SIDE = SidePathConfig(estimates_every=0, estimates_every_seconds=None, kmeans=KMeansConfig(window=250),
                      mixing=MixingConfig(records=1))  # every batch's copies leave with it (windows: tests below)


def test_commit_comes_before_perturbation_and_a_failed_commit_rereads_the_batch(records: list[dict[str, Any]]) -> None:
    consumer = Consumer(fail_commits=1)
    app, producer, metrics = make_app(SIDE, consumer)
    tp = TopicPartition("adult.raw", 0)
    batch = messages(records[:300])
    app._process(tp.partition, batch)
    # failed commit: nothing randomized, nothing sent, the batch will be read again from its first offset
    assert producer.sent == [] and app.processor.records_processed == 0
    assert consumer.seeks == [(tp, 0)] and app.status.consumed == 0
    app._process(tp.partition, batch)
    assert consumer.commits[-1][tp].offset == 300
    assert app.processor.records_processed == 300
    kinds = [m.kind for m in producer.sent]
    assert kinds.count("krr") == kinds.count("rs") == kinds.count("blap") == 300
    assert kinds.count("kmeans") == 1  # window of 250
    app._flush()
    assert metrics.registry.get_sample_value("stream_anon_side_records_published_total",
                                             {"topic": "adult.krr"}) == 300
    assert metrics.registry.get_sample_value("stream_anon_side_records_consumed_total", {"topic": "adult.raw"}) == 300
    eps = app.processor.epsilon_per_record  # exact (tests/test_side_processor.py)
    assert app.status.summary()["epsilon_per_record"] == eps and "epsilon_spent" not in app.status.summary()
    for topic, e in eps.items():  # the gauge: one record's eps (issue 20: no sum over records)
        assert metrics.registry.get_sample_value("stream_anon_epsilon_per_record", {"topic": topic}) == e
    # keys are the pseudonyms, never the record ids (in the window's random order)
    krr = [m for m in producer.sent if m.kind == "krr"]
    assert sorted(m.key for m in krr) == sorted(record_pseudonym(SECRET.encode(), r["id"]).encode()
                                               for r in records[:300])


def test_bad_input_is_counted_not_dead_lettered_by_default(records: list[dict[str, Any]]) -> None:
    """Out-of-domain numeric values are clipped into the public domain (default); other bad input is counted and
    skipped, or with ``dead_letter`` dead-lettered, redacted as the main path does."""
    app, producer, metrics = make_app(SIDE, Consumer())
    tp = TopicPartition("adult.raw", 0)
    bad = [Msg(10, b"{oops"), Msg(11, json.dumps({**records[0], "age": 500, "id": "clipped-1"}).encode()),
           Msg(12, json.dumps({k: v for k, v in records[0].items() if k != "sex"}).encode()),
           Msg(13, json.dumps({**records[0], "sex": "Other"}).encode())]
    app._process(tp.partition, messages(records[:10]) + bad)
    assert app.status.skipped == {"malformed_json": 1, "missing_field": 1, "out_of_domain": 1}  # "Other": a category
    assert app.status.clipped == {"age": 1}
    assert metrics.registry.get_sample_value("stream_anon_side_values_clipped_total",
                                             {"topic": "adult.raw", "attribute": "age"}) == 1
    assert all(m.kind != "dlq" for m in producer.sent)
    assert app.processor.records_processed == 11  # the clipped record is perturbed
    clipped_key = record_pseudonym(SECRET.encode(), "clipped-1").encode()
    assert clipped_key in [m.key for m in producer.sent if m.kind == "blap"]

    skip = dataclasses.replace(SIDE, out_of_domain="skip")
    app_s, _, _ = make_app(skip, Consumer())
    app_s._process(tp.partition, bad)
    assert app_s.status.skipped == {"malformed_json": 1, "missing_field": 1, "out_of_domain": 2}
    assert app_s.status.clipped == {}

    side = SidePathConfig(estimates_every=0, estimates_every_seconds=None, dead_letter=True,
                          kmeans=KMeansConfig(enabled=False), mixing=MixingConfig(records=1))
    app2, producer2, metrics2 = make_app(side, Consumer())
    app2._process(tp.partition, bad)
    dlq = [m for m in producer2.sent if m.topic == "adult.dlq"]
    bodies = [decode_dead_letter(m.value) for m in dlq]
    assert [b["reason"] for b in bodies] == ["malformed_json", "missing_field", "out_of_domain"]
    for m, b, original in zip(dlq, bodies, [bad[0], bad[2], bad[3]], strict=True):
        assert m.headers == () and b["payload"] == "redacted" and b["offset"] == original.offset
        assert b["value_hmac"] == keyed_hash(SECRET.encode(), original.value or b"")
        assert original.value not in m.value and b"Other" not in m.value  # nothing of the record itself
        assert m.key == f"adult.raw/0/{original.offset}".encode()
    assert metrics2.registry.get_sample_value("stream_anon_records_dead_lettered_total",
                                              {"reason": "out_of_domain"}) == 1


def test_end_of_stream_flush_waits_for_every_assigned_partition(records: list[dict[str, Any]]) -> None:
    side = SidePathConfig(estimates_every=0, estimates_every_seconds=None,
                          kmeans=KMeansConfig(window=1000, min_partial_window=100))
    app, producer, _ = make_app(side, Consumer(partitions=(0, 1)))
    ctl = [(CONTROL_HEADER, CONTROL_FLUSH)]
    app._process(0, messages(records[:300]) + [Msg(300, b"", headers=ctl)])
    assert not [m for m in producer.sent if m.kind in ("estimates", "kmeans")]  # partition 1 still running
    app._process(1, messages(records[300:600]) + [Msg(300, b"", headers=ctl)])
    est = [json.loads(m.value) for m in producer.sent if m.kind == "estimates"]
    km = [json.loads(m.value) for m in producer.sent if m.kind == "kmeans"]
    assert {e["records_seen"] for e in est} == {600} and len(est) == 9  # one per attribute
    assert len(km) == 1 and km[0]["n_records"] == 600  # the partial window, released at the end of the stream
    assert app.status.control == 2


# ------------------------------------------------------------------------------------------ mixing windows
MIXED = SidePathConfig(estimates_every=0, estimates_every_seconds=None, kmeans=KMeansConfig(enabled=False),
                       mixing=MixingConfig(records=500, seconds=3600.0))


def test_copies_wait_for_their_window_then_leave_shuffled_with_the_release_time(records: list[dict[str, Any]]) -> None:
    app, producer, _ = make_app(MIXED, Consumer())
    app._process(0, messages(records[:300]))
    assert [m for m in producer.sent if m.kind in ("krr", "rs", "blap")] == []  # 300 < 500: held
    assert app.mixer.pending_records == 300
    app._process(0, messages(records[300:600], start=300))
    assert app.mixer.pending_records == 0 and app.status.mixing_windows == 1
    expected = [record_pseudonym(SECRET.encode(), r["id"]).encode() for r in records[:600]]
    keys = {kind: [m.key for m in producer.sent if m.kind == kind] for kind in ("krr", "rs", "blap")}
    for kind, k in keys.items():
        assert sorted(k) == sorted(expected), kind  # every record once, on every topic
        assert k != expected, kind  # not in arrival order (a uniform permutation of 600 is the identity w.p. 1/600!)
        stamps = producer.timestamps(kind)
        assert len(set(stamps)) == 1 and stamps[0] is not None  # one release time for the window
    assert keys["krr"] != keys["rs"] != keys["blap"]  # an independent order per topic
    # the position of a record's copy says nothing about its arrival: the rank correlation is near 0
    rank = {key: i for i, key in enumerate(expected)}
    pos = np.array([rank[key] for key in keys["krr"]], dtype=float)
    r = float(np.corrcoef(pos, np.arange(600))[0, 1])
    assert abs(r) < 4 / np.sqrt(600), r  # under a uniform permutation r has SD 1/sqrt(n - 1)


def test_a_partition_end_and_a_clean_stop_release_the_open_windows_on_every_topic(
        records: list[dict[str, Any]]) -> None:
    app, producer, _ = make_app(MIXED, Consumer(partitions=(0, 1)))
    ctl = [(CONTROL_HEADER, CONTROL_FLUSH)]
    app._process(0, messages(records[:100]) + [Msg(100, b"", headers=ctl)])
    app._process(1, messages(records[100:130]))
    copies = [m for m in producer.sent if m.kind in ("krr", "rs", "blap")]
    first = {record_pseudonym(SECRET.encode(), r["id"]).encode() for r in records[:100]}
    assert len(copies) == 300 and {m.key for m in copies} == first  # partition 0 ended: its window left
    app.status.ready.set()
    app._shutdown()  # a clean stop: partition 1's window of 30 leaves too, on all three topics
    late = [m for m in producer.sent if m.kind in ("krr", "rs", "blap")][300:]
    assert len(late) == 90
    for kind in ("krr", "rs", "blap"):
        assert sorted(m.key for m in late if m.kind == kind) == \
            sorted(record_pseudonym(SECRET.encode(), r["id"]).encode() for r in records[100:130])
    assert app.mixer.pending_records == 0


def test_a_window_leaves_when_its_first_record_is_old_enough(records: list[dict[str, Any]]) -> None:
    side = dataclasses.replace(MIXED, mixing=MixingConfig(records=10_000, seconds=30.0))
    app, producer, _ = make_app(side, Consumer())
    now = [1000.0]
    app.mixer.clock = lambda: now[0]
    app.mixer.wall = lambda: 1_700_000_000.0 + now[0]
    app._process(0, messages(records[:50]))
    now[0] += 29.0
    app._process(0, messages(records[50:80], start=50))
    assert not [m for m in producer.sent if m.kind == "krr"]
    now[0] += 1.0
    app._publish([], 0, app.mixer.due())  # what the loop does after each poll
    krr = [m for m in producer.sent if m.kind == "krr"]
    assert len(krr) == 80 and set(producer.timestamps("krr")) == {int((1_700_000_000.0 + 1030.0) * 1000)}


def test_an_anchor_the_broker_refuses_is_warned_once_then_at_most_once_a_minute(
        records: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A broker that refuses the budget anchor: tried at every flush (5 a second on an idle input), but one WARNING
    at the first failure and then at most one per ``ANCHOR_WARNING_EVERY_SECONDS`` (with the count); one INFO line
    when it is committed again."""
    import stream_anon.side.budget_store as budget_store

    app, _producer, _metrics = make_app(SIDE, Consumer())
    app._process(0, messages(records[:20]))
    assert app.processor.budgets.anchor.seq > 0
    app._admin = object()  # type: ignore[assignment]
    clock = [1000.0]
    app._anchor_writer.clock = lambda: clock[0]
    refusing = [True]
    written: list[object] = []

    def write(admin: object, topic: str, anchor: object) -> None:
        if refusing[0]:
            raise KafkaError("broker down")
        written.append(anchor)

    monkeypatch.setattr(budget_store, "write_anchor", write)
    caplog.set_level("INFO", logger="stream_anon.side.budget_store")
    for _ in range(300):  # a minute of idle flushes, 0.2 s apart
        app._write_anchor()
        clock[0] += 0.2
    warnings = [r.getMessage() for r in caplog.records if "was not committed" in r.getMessage()]
    assert len(warnings) == 1 and "1 failed tries so far" in warnings[0]
    app._write_anchor()  # 60 s after the first
    warnings = [r.getMessage() for r in caplog.records if "was not committed" in r.getMessage()]
    assert len(warnings) == 2 and "301 failed tries so far" in warnings[1]
    assert app._anchored != app.processor.budgets.anchor
    refusing[0] = False
    app._write_anchor()
    assert written == [app.processor.budgets.anchor] and app._anchored == app.processor.budgets.anchor
    assert any("is committed, after 301 failed tries" in r.getMessage() for r in caplog.records)
