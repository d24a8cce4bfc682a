"""The pre-publish gate, the pipeline's guard and unreadable records through the REAL service loop and a real broker.

* A faulty engine (classes split below k, or generalizations that do not cover their members) is injected into
  ``MainPath``: nothing below k or uncovered reaches the public topic, the refused classes are suppressed with
  reason ``gate``, ``stream_anon_k_anonymity_violations_total`` counts them and an ERROR line names each one.
* An engine that throws on some records: each is dead-lettered as ``internal_error`` (the exception's last line
  in the log), ``stream_anon_internal_errors_total`` counts them, the partition goes on, every input is accounted.
* A record whose header key is not UTF-8 (kafka-python raises ``CorruptRecordError`` inside ``poll()`` and would
  spin on it forever; confluent-kafka cannot convert its headers): dead-lettered as ``corrupt_record`` by position,
  the loop moves past it and goes on (with either consumer client); a control header on a record with a value is
  dead-lettered, not taken as a flush.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from config_support import hermetic_config
from faulty_engines import NarrowingEngine, RaisingEngine, SplitClassesEngine  # type: ignore[import-not-found]
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry
from waiting import wait_for

from stream_anon.config.settings import Config
from stream_anon.core.datasets import iter_adult_records, read_adult
from stream_anon.core.engine import Engine
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.formats.decoding import CONTROL_HEADER
from stream_anon.formats.release import decode_class_message
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.service.app import MainPath
from stream_anon.service.audit import (
    OutputSnapshot,
    collect_outputs,
    partition_ends,
    read_topic_with_headers,
    send_flush_markers,
)
from stream_anon.service.wiring import load_schema

K = 5


def config(bs: str, prefix: str, consumer_client: str = "confluent-kafka") -> Config:
    return hermetic_config(bs, {"kafka.consumer_client": consumer_client,
        "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "topics.input": f"{prefix}.raw", "topics.anon": f"{prefix}.anon", "topics.suppressed": f"{prefix}.suppressed",
        "topics.dlq": f"{prefix}.dlq", "topics.partitions": 2, "anonymization.k": K, "anonymization.delta": 100,
        "anonymization.l": "null", "anonymization.t_closeness": "null", "anonymization.seed": 1,
        "service.commit_interval_ms": 200, "side_paths.enabled": False, "service.workers": 0})


def run_main(cfg: Config, produce: Callable[[KafkaProducer], int], *,
             engine: Callable[[Engine], EngineLike] | None = None) -> tuple[MainPath, CollectorRegistry]:
    """Run ``MainPath`` (with ``engine`` wrapping the real engine) until every input sent by ``produce`` (which
    returns how many records it sent) is accounted for, then stop it."""
    registry = CollectorRegistry()
    schema = load_schema(cfg)
    factory = make_engine_factory(cfg, engine) if engine is not None else None
    main = MainPath(cfg, metrics=ServiceMetrics(registry), schema=schema, engine_factory=factory)
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    assert main.ready.wait(30)
    producer = KafkaProducer(bootstrap_servers=cfg.kafka.bootstrap_servers, linger_ms=0)
    n = produce(producer)
    send_flush_markers(producer, cfg.topics.input, [0, 1])
    producer.close()
    t = main.totals
    wait_for(lambda: t.released + t.suppressed + t.dead_lettered >= n and t.control >= 2, 90,
             "every record accounted and both end markers", alive=th.is_alive, context=lambda: f"{t}")
    time.sleep(0.5)  # a commit interval: the service keeps running
    assert th.is_alive()
    main.stop_event.set()
    th.join(30)
    return main, registry


def make_engine_factory(cfg: Config, wrap: Callable[[Engine], EngineLike]) -> Callable[[int], EngineLike]:
    schema = load_schema(cfg)
    a = cfg.anonymization
    return lambda p: wrap(Engine(schema, a.engine_config(seed=a.seed + p if a.seed is not None else None)))


def snapshot(bs: str, cfg: Config) -> OutputSnapshot:
    t, s = cfg.topics, adult_schema()
    return collect_outputs(bs, input_topic=t.input, anon=t.anon, suppressed=t.suppressed, dlq=t.dlq,
                           qis=[a.name for a in s.qis], sensitive=["income"], input_ends=partition_ends(bs, t.input))


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def send_adult(adult_path: Path, topic: str, n: int) -> Callable[[KafkaProducer], int]:
    def produce(producer: KafkaProducer) -> int:
        for i, rec in enumerate(iter_adult_records(adult_path)):
            if i == n:
                break
            producer.send(topic, value=json.dumps(rec).encode(), partition=i % 2)
        producer.flush()
        return n
    return produce


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("faulty", [SplitClassesEngine, NarrowingEngine])
def test_a_faulty_engine_never_gets_a_class_below_k_or_uncovered_onto_the_public_topic(
        broker: Any, adult_path: Path, faulty: type, caplog: pytest.LogCaptureFixture) -> None:
    bs = broker.bootstrap_servers
    cfg = config(bs, f"gate{uuid.uuid4().hex[:6]}")
    caplog.set_level(logging.ERROR, logger="stream_anon.service.app")
    main, registry = run_main(cfg, send_adult(adult_path, cfg.topics.input, 2000), engine=faulty)
    snap = snapshot(bs, cfg)
    assert snap.ok, (snap.accounting, snap.published, snap.problems)
    gated = snap.records[(snap.records.outcome == "suppressed") & (snap.records.reason == "gate")]
    refusals = main.totals.gate_refusals
    assert refusals > 0 and len(gated) > 0
    assert metric(registry, "stream_anon_k_anonymity_violations_total") == refusals
    assert metric(registry, "stream_anon_records_suppressed_total", reason="gate") == len(gated)
    lines = [r.getMessage() for r in caplog.records if "pre-publish gate refused class" in r.getMessage()]
    assert len(lines) == refusals
    assert all(f"{cfg.topics.input}/" in line for line in lines)  # the internal release id names the class
    schema = adult_schema()
    qis = [a.name for a in schema.qis]
    rep = verify_release_frame(snap.public, qis, K, record_id=None, schema=schema)
    assert rep.ok and rep.min_class_size >= K, str(rep)
    released = snap.records[snap.records.outcome == "released"]
    rep = verify_release_frame(released[["record_id", "class_id", *qis]], qis, K, schema=schema,
                               original=read_adult(adult_path), original_id="id")
    assert rep.ok, str(rep)  # every published member covered by its class's generalization


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_the_guard_dead_letters_what_the_engine_throws_on_and_the_partition_goes_on(
        broker: Any, adult_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bs = broker.bootstrap_servers
    cfg = config(bs, f"guard{uuid.uuid4().hex[:6]}")
    caplog.set_level(logging.ERROR, logger="stream_anon.service.app")
    ages = frozenset({27, 61})
    main, registry = run_main(cfg, send_adult(adult_path, cfg.topics.input, 2000),
                              engine=lambda e: RaisingEngine(e, ages))
    snap = snapshot(bs, cfg)
    assert snap.ok, (snap.accounting, snap.published, snap.problems)
    n_hit = sum(1 for i, r in zip(range(2000), iter_adult_records(adult_path), strict=False) if r["age"] in ages)
    assert snap.dlq_reasons == {"internal_error": n_hit} and n_hit > 0
    assert metric(registry, "stream_anon_internal_errors_total", stage="engine") == n_hit
    # the failing pushes also lost releases: the sweep suppressed those records (counted, logged), none is lost
    assert metric(registry, "stream_anon_internal_errors_total", stage="sweep") >= 1
    assert metric(registry, "stream_anon_records_dead_lettered_total", reason="internal_error") == n_hit
    lines = [r.getMessage() for r in caplog.records if "internal error in engine" in r.getMessage()]
    assert len(lines) == n_hit and all("KeyError" in line and "injected failure" in line for line in lines)
    assert main.totals.consumed == 2000


class RawKey(str):
    """A header key that kafka-python's producer writes as the given raw bytes (``str.encode`` overridden): the
    only way to produce a record whose header key is not UTF-8 through its public ``send``."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawKey:
        key = super().__new__(cls, "k")
        key.raw = raw
        return key

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


@pytest.mark.integration
@pytest.mark.timeout(180)
@pytest.mark.parametrize("consumer_client", ["confluent-kafka", "kafka-python"])
def test_an_unreadable_record_is_dead_lettered_by_position_and_skipped(broker: Any, adult_path: Path,
                                                                       consumer_client: str) -> None:
    bs = broker.bootstrap_servers
    cfg = config(bs, f"corrupt{uuid.uuid4().hex[:6]}", consumer_client)
    topic = cfg.topics.input
    recs = [r for _, r in zip(range(400), iter_adult_records(adult_path), strict=False)]
    sent: dict[int, list[str]] = {0: [], 1: []}  # per partition: what each offset is

    def produce(producer: KafkaProducer) -> int:
        def send(p: int, value: bytes, kind: str, headers: list[tuple[str, bytes]] | None = None) -> None:
            producer.send(topic, value=value, partition=p, headers=headers or [])
            sent[p].append(kind)

        for i, r in enumerate(recs):
            p = i % 2
            if i == 101:  # alone in its producer batch
                producer.flush()
                send(p, b'{"x": 1}', "corrupt", [(RawKey(b"\xff\xfe"), b"1")])
                producer.flush()
            if i == 251:  # first of a producer batch: kafka-python cannot read the rest of that batch either
                producer.flush()
                batcher = KafkaProducer(bootstrap_servers=bs, linger_ms=500)
                batcher.send(topic, value=b'{"x": 2}', partition=p, headers=[(RawKey(b"\xc3\x28"), b"1")])
                for j in range(3):
                    batcher.send(topic, value=json.dumps(recs[j]).encode(), partition=p)
                batcher.flush()
                batcher.close()
                sent[p].extend(["corrupt"] * 4 if consumer_client == "kafka-python" else ["corrupt"] + ["record"] * 3)
            if i == 300:
                send(p, json.dumps(r).encode(), "control_on_record", [(CONTROL_HEADER, b"flush")])
                continue
            send(p, json.dumps(r).encode(), "record")
        producer.flush()
        return sum(len(v) for v in sent.values())

    main, registry = run_main(cfg, produce)
    snap = snapshot(bs, cfg)
    assert snap.ok, (snap.accounting, snap.published, snap.problems)
    n_corrupt = sum(k == "corrupt" for v in sent.values() for k in v)
    assert snap.dlq_reasons == {"corrupt_record": n_corrupt, "control_header_on_record": 1}
    bad = {(d["partition"], d["offset"]) for d in snap.dead_letters if d["reason"] == "corrupt_record"}
    assert bad == {(p, o) for p, kinds in sent.items() for o, k in enumerate(kinds) if k == "corrupt"}
    assert all(d["value_length"] is None for d in snap.dead_letters if d["reason"] == "corrupt_record")
    assert main.totals.control == 2  # only the two end-of-stream markers flushed
    assert metric(registry, "stream_anon_records_dead_lettered_total", reason="corrupt_record") == n_corrupt


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_record_ids_on_anon_only_by_opt_in_with_a_warning_and_one_ledger_per_group(
        broker: Any, adult_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    bs = broker.bootstrap_servers
    prefix = f"optin{uuid.uuid4().hex[:6]}"
    cfg = config(bs, prefix).with_options({"release.include_record_ids": True})
    caplog.set_level(logging.WARNING, logger="stream_anon.service.app")
    run_main(cfg, send_adult(adult_path, cfg.topics.input, 600))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("release.include_record_ids is true" in w and "OUTSIDE the threat model" in w for w in warnings)
    assert any("release.secret not set: generated a random secret" in w for w in warnings)
    snap = snapshot(bs, cfg)
    assert snap.ok and snap.classes > 0
    members = {m[0] for c in read_topic_with_headers(bs, cfg.topics.anon)
               for m in decode_class_message(c.value).members or ()}
    assert members == set(snap.records[snap.records.outcome == "released"].record_id)
    # a second service (another consumer group, other outputs) on the same input and the same ledger: refused
    other = cfg.with_options({"kafka.group_id": f"{prefix}-other", "topics.anon": f"{prefix}.anon2",
                              "topics.suppressed": f"{prefix}.suppressed2", "topics.dlq": f"{prefix}.dlq2"})
    caplog.clear()
    caplog.set_level(logging.ERROR, logger="stream_anon.service.app")
    rc = MainPath(other, metrics=ServiceMetrics(CollectorRegistry())).run()
    assert rc == 2
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(e.startswith(f"topics.ledger: {cfg.topics.ledger_topic()} holds checkpoints of consumer group(s) "
                            f"['{prefix}-main']") for e in errors), errors
