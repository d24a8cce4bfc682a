"""End-to-end linkage test (issue 8, item 7): the service and its side paths on ALL of ADULT through a real broker.

Record ids are replaced by uuid4 strings (they cannot collide with numbers, QI labels or generalizations, so a byte
search for them has no false positive).  Every public topic (anon, krr, rs, blap, estimates, kmeans) is read
with its keys and headers, and:

* no input record id appears anywhere in a key, value, header name or header value (byte search of all 32,561);
* no public message has a field that carries a record's identity, source position or per-record timing
  (field-name search: an offset or a delay is a short number that also occurs inside generalizations such as
  ``"[17-21]"``, so a byte search cannot tell them apart); side copies may carry their pseudonym as ``id``;
* no identifier-like token (class id, pseudonym, ...) of an anon message occurs in a side message: nothing to
  join an anon message to a side message by;
* every class on anon has at least k members and l distinct sensitive values and passes the independent verifier,
  its members (joined through the ledger's record ids) covered by its generalization;
* the ledger, with the suppressed and dlq topics, accounts for every input offset exactly once, and every output
  it promises is on its topic exactly once;
* side copies cannot be placed by position or time (issue 19 item 3): an attacker who knows a record's input
  offset finds its copy (by pseudonym) at the same side offset, or within +-10, no more often than a uniformly random
  order of each mixing window gives (expected count and variance derived exactly,
  :func:`stream_anon.service.linkage.permutation_match_moments`); every copy's Kafka timestamp is its window's
  release time; and the same without pseudonyms (a second run: the copy at a record's offset reports that record's
  values no more often than the shuffle gives);
* a class message does not name its expiring member (issue 19 item 4): every class carries the end of its release
  tick as its Kafka timestamp, a tick's classes are in a uniformly random order, and no attack from the arrival
  times and QIs pins the expiring member more often than guessing among the candidates of its tick
  (:func:`stream_anon.service.linkage.release_timing_attack`).

Runs on Tansu only (two runs on all of ADULT: too long to run twice in CI).  What it checks is the content, order
and timestamps of what the service publishes, which the service decides whatever the broker (the producer sets
every timestamp; both brokers keep CreateTime and assign offsets in send order).  The accounting of all of ADULT
on Apache Kafka: tests/test_apache_kafka_cluster_faults.py and tests/test_both_brokers.py.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from config_support import hermetic_config
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from waiting import wait_for

from stream_anon.config.settings import Config
from stream_anon.config.side_paths import DEFAULT_MIXING_RECORDS
from stream_anon.core.datasets import read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.formats.release import Pseudonymizer
from stream_anon.replay.kafka_replay import replay_records
from stream_anon.runtime.run import run_service
from stream_anon.service.audit import (
    OutputSnapshot,
    collect_outputs,
    read_topic_with_headers,
    send_flush_markers,
)
from stream_anon.service.linkage import (
    FORBIDDEN_PUBLIC_FIELDS,
    PositionLinkage,
    ScannedMessage,
    TokenSearch,
    forbidden_fields,
    join_candidates,
    offset_linkage,
    offset_windows,
    value_linkage,
)
from stream_anon.service.release_timing import (
    TopicMessage,
    release_timing_attack,
    release_timing_inputs,
    released_records,
)
from stream_anon.side.app import side_group_id

K, L, PARTITIONS = 10, 2, 2
SIDE_FORBIDDEN = FORBIDDEN_PUBLIC_FIELDS - {"id"}  # a side copy's "id" is its pseudonym (checked by the byte search)
SECRET = "linkage-test-release-secret-0123456789"
UNKEYED_ATTRIBUTES = ["sex", "race", "marital-status", "workclass", "education", "occupation", "relationship",
                      "native-country"]
"""The unkeyed run's k-RR attributes (at eps 12 each a copy reports its record's values, which are nearly unique
over these 8 attributes within a window): the attacker's best case for placing a copy by its values."""


@dataclass
class Run:
    cfg: Config
    original: pd.DataFrame
    ids: list[str]
    public: dict[str, list[ScannedMessage]]
    snap: OutputSnapshot
    seconds: float
    side: dict[str, list[Any]]  # krr, rs, blap: ConsumerRecords (offsets, timestamps)
    inputs: list[Any]  # the input topic's ConsumerRecords


def wait_for_copies(bootstrap: str, topics: list[str], n: int, deadline: float) -> None:
    """Until each of ``topics`` holds ``n`` messages (counted by reading them)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      auto_offset_reset="earliest")
    try:
        tps = [TopicPartition(t, q) for t in topics for q in range(PARTITIONS)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        seen = dict.fromkeys(topics, 0)
        while any(v < n for v in seen.values()):
            assert time.monotonic() < deadline, seen
            for tp, msgs in c.poll(timeout_ms=200).items():
                seen[tp.topic] += len(msgs)
    finally:
        c.close()


def committed(consumer: KafkaConsumer, topic: str) -> dict[int, int]:
    return {p: int(consumer.committed(TopicPartition(topic, p)) or 0) for p in range(PARTITIONS)}


@pytest.fixture(scope="module")
def run(broker: Any, adult_path: Path) -> Iterator[Run]:
    yield serve_adult(broker, adult_path, {})


@pytest.fixture(scope="module")
def run_unkeyed(broker: Any, adult_path: Path) -> Iterator[Run]:
    yield serve_adult(broker, adult_path, {
        "side_paths.pseudonyms": False, "side_paths.krr.attributes": UNKEYED_ATTRIBUTES,
        "side_paths.krr.epsilon": 12.0, "side_paths.rs.enabled": False, "side_paths.blap.enabled": False,
        "side_paths.kmeans.enabled": False, "side_paths.person_budget.cap_epsilon": None})


def serve_adult(broker: Any, adult_path: Path, side: dict[str, Any]) -> Run:
    """All of ADULT (uuid ids) through ``run_service`` (main path and side paths, ``side`` options) until both
    groups committed everything; then every output topic read back."""
    bs = broker.bootstrap_servers
    prefix = f"link{uuid.uuid4().hex[:6]}"
    topics = {r: f"{prefix}.{r}" for r in ("anon", "suppressed", "dlq", "krr", "rs", "blap", "estimates", "kmeans")}
    cfg = hermetic_config(bs, {
        "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "topics.input": f"{prefix}.raw", **{f"topics.{r}": t for r, t in topics.items()},
        "topics.partitions": PARTITIONS, "anonymization.seed": 17, "service.commit_interval_ms": 250,
        "release.secret": SECRET, **side})
    assert cfg.anonymization.k == K and cfg.anonymization.l == L and cfg.anonymization.zeta == 0  # the defaults
    adult = read_adult(adult_path)
    rng = random.Random(20261124)
    ids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(len(adult))]
    original = adult.assign(id=ids)
    records = [dict(zip(original.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
               for row in original.itertuples(index=False, name=None)]
    stop = threading.Event()
    rc: list[int] = []
    service = threading.Thread(target=lambda: rc.append(run_service(cfg, stop_event=stop)), daemon=True)
    t0 = time.monotonic()
    service.start()
    stats = replay_records(records, cfg.topics.input, bs, partitions=PARTITIONS)
    assert stats.records_acked == len(records) == 32561
    producer = KafkaProducer(bootstrap_servers=bs)
    send_flush_markers(producer, cfg.topics.input, list(range(PARTITIONS)))
    producer.close()
    ends = {p: stats.partition_counts.get(p, 0) + 1 for p in range(PARTITIONS)}
    main_group = KafkaConsumer(bootstrap_servers=bs, group_id=cfg.kafka.group_id, enable_auto_commit=False)
    side_group = KafkaConsumer(bootstrap_servers=bs, group_id=side_group_id(cfg), enable_auto_commit=False)
    try:
        topic = cfg.topics.input
        wait_for(lambda: committed(main_group, topic) == ends == committed(side_group, topic), 240,
                 f"the main and side groups committed to {ends}", interval=0.2, alive=service.is_alive,
                 context=lambda: f"main {committed(main_group, topic)}, side {committed(side_group, topic)}, "
                                 f"exit {rc}")
        # the side group commits a batch before perturbing it: wait until the copies are on their topics too (the
        # end-of-stream markers released the last windows), so that the stop does not race their acknowledgement
        per_record = [topics[r] for r in ("krr", "rs", "blap") if getattr(cfg.side_paths, r).enabled]
        wait_for_copies(bs, per_record, len(records), time.monotonic() + 240)
        seconds = time.monotonic() - t0
    finally:
        main_group.close()
        side_group.close()
        stop.set()
        service.join(60)
    assert rc == [0]
    public: dict[str, list[ScannedMessage]] = {}
    raw: dict[str, list[Any]] = {}
    # the service creates only the topics of the paths that run (SideApp.output_topics): a path off has no topic,
    # and reading one would wait the read's whole timeout for it to appear (3 minutes of the unkeyed run's setup)
    running = {"anon", "suppressed", "dlq", *(r for r in ("krr", "rs", "blap") if topics[r] in per_record),
               *(["estimates"] if per_record else []), *(["kmeans"] if cfg.side_paths.kmeans.enabled else [])}
    lister = KafkaConsumer(bootstrap_servers=bs)
    try:
        existing = lister.topics()
    finally:
        lister.close()
    assert {r for r in topics if topics[r] in existing} == running, existing
    for role in ("anon", "krr", "rs", "blap", "estimates", "kmeans"):
        msgs = raw[role] = read_topic_with_headers(bs, topics[role], timeout_s=60) if role in running else []
        public[role] = [ScannedMessage(m.topic, m.partition, m.offset, m.key, m.value, tuple(m.headers or ()))
                        for m in msgs]
    schema = adult_schema()
    snap = collect_outputs(bs, input_topic=cfg.topics.input, anon=topics["anon"], suppressed=topics["suppressed"],
                           dlq=topics["dlq"], qis=[a.name for a in schema.qis], sensitive=["income"],
                           input_ends=ends)
    inputs = read_topic_with_headers(bs, cfg.topics.input, timeout_s=60)
    return Run(cfg, original, ids, public, snap, seconds, {r: raw[r] for r in ("krr", "rs", "blap")}, inputs)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_ledger_accounts_for_every_input_once_and_every_class_is_sound(run: Run) -> None:
    snap = run.snap
    rep = snap.accounting
    assert snap.ok, (rep.duplicates[:5], rep.missing[:5], rep.corrupt[:3], snap.published, snap.problems[:5])
    assert rep.accounted == 32561 + PARTITIONS and rep.outcomes["control"] == PARTITIONS
    assert rep.outcomes["released"] + rep.outcomes["suppressed"] + rep.outcomes.get("dead_lettered", 0) == 32561
    assert all(c.ok and c.exactly_once == c.expected for c in snap.published.values())
    out = snap.records
    assert set(out.record_id) == set(run.ids) and out.record_id.is_unique
    schema = adult_schema()
    qis = [a.name for a in schema.qis]
    assert len(run.public["anon"]) == snap.classes > 0
    v = verify_release_frame(snap.public, qis, K, L, "income", record_id=None, schema=schema)
    assert v.ok and v.min_class_size >= K and v.records == rep.outcomes["released"], str(v)
    released = out[out.outcome == "released"]
    v = verify_release_frame(released[["record_id", "class_id", *qis]], qis, K, schema=schema,
                             original=run.original, original_id="id")
    assert v.ok, str(v)
    print(f"linkage test: {rep.accounted:,} input offsets accounted once ({dict(rep.outcomes)}), {snap.classes:,} "
          f"classes verified (k={K}, l={L}); the service and side paths took {run.seconds:.1f} s")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_no_public_message_carries_a_record_id_a_source_position_or_a_timing(run: Run) -> None:
    search = TokenSearch(run.ids)
    assert search.n_tokens == 32561
    hits = {role: search.scan(msgs) for role, msgs in run.public.items()}
    fields = {role: [(m.offset, f) for m in msgs for f in forbidden_fields(
        m.value, FORBIDDEN_PUBLIC_FIELDS if role == "anon" else SIDE_FORBIDDEN)] for role, msgs in run.public.items()}
    headers = {role: sorted({name for m in msgs for name, _ in m.headers}) for role, msgs in run.public.items()}
    counts = {role: len(msgs) for role, msgs in run.public.items()}
    print(f"public messages read: {counts}; header names: {headers}")
    assert all(counts[r] > 0 for r in ("anon", "krr", "rs", "blap")), counts
    found = {r: f"{len(h)} record ids (first {h[0].where}: {h[0].token!r})" for r, h in hits.items() if h}
    found.update({f"{r} fields": f"{len(f)} (first {f[:3]})" for r, f in fields.items() if f})
    assert found == {}
    assert headers["anon"] == []  # class messages carry no headers at all


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_nothing_joins_an_anon_message_to_a_side_message(run: Run) -> None:
    schema = adult_schema()
    labels = {lab for a in schema.attributes if a.hierarchy is not None for lab in a.hierarchy.node_labels}
    side = [m for role in ("krr", "rs", "blap", "estimates", "kmeans") for m in run.public[role]]
    common = join_candidates(run.public["anon"], side, ignore=labels)
    assert common == set(), sorted(common)[:10]


def _percentiles(values: list[float]) -> str:
    q = np.percentile(np.array(values, dtype=float), [50, 99]) if values else [math.nan, math.nan]
    return f"p50 {q[0]:.0f} ms, p99 {q[1]:.0f} ms"


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_side_copies_cannot_be_placed_by_their_offset_or_timestamp(run: Run) -> None:
    """For every record (found by its pseudonym) the attacker's guess is the copy at its input offset (or within
    +-10): the hits are what a uniform shuffle of each window gives, within 4 standard deviations; before mixing,
    all 32,561 copies sat at their input offset.  Every copy carries its window's release time, never its
    record's arrival, and every window holds at least mixing.records records but the last of each partition."""
    pseudonym = Pseudonymizer(SECRET.encode())
    where = {}
    for m in run.inputs:
        if m.value:
            rid = json.loads(m.value)["id"]
            where[pseudonym(rid).encode()] = (m.partition, m.offset, m.timestamp)
    assert len(where) == 32561
    for role, msgs in run.side.items():
        src = [where[m.key] for m in msgs]
        assert all(m.partition == p for m, (p, _o, _t) in zip(msgs, src, strict=True))  # a window keeps its partition
        windows = offset_windows([m.partition for m in msgs], [m.offset for m in msgs], [m.timestamp for m in msgs])
        sizes: dict[int, list[int]] = {}
        for w in windows:
            sizes.setdefault(msgs[w[0]].partition, []).append(len(w))
            # released after its last record arrived: the timestamp says nothing about any one of them
            assert msgs[w[0]].timestamp >= max(src[i][2] for i in w)
        assert all(min(s[:-1], default=DEFAULT_MIXING_RECORDS) >= DEFAULT_MIXING_RECORDS for s in sizes.values()), \
            sizes
        equal = offset_linkage(windows, [m.offset for m in msgs], [o for _p, o, _t in src])
        near = offset_linkage(windows, [m.offset for m in msgs], [o for _p, o, _t in src], distance=10)
        latency = [m.timestamp - t for m, (_p, _o, t) in zip(msgs, src, strict=True)]
        print(f"\n{role}: {len(msgs):,} copies in {equal.windows} windows (sizes {min(equal.sizes)}..{max(equal.sizes)}); "
              f"copy at its record's input offset: {equal}; within +-10: {near}; input-to-copy timestamp "
              f"{_percentiles(latency)}")
        assert len(msgs) == 32561
        for stat in (equal, near):
            assert abs(stat.z) <= 4, (role, str(stat))
        assert equal.expected_fraction < 2 / DEFAULT_MIXING_RECORDS  # ~1/window size


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_without_pseudonyms_a_copys_position_does_not_tell_its_record(run_unkeyed: Run) -> None:
    """Copies without key or id, k-RR at eps 12 on 8 attributes (a copy reports its record's values): the copy at a
    record's input offset carries that record's values no more often than a uniform shuffle of each window gives
    (before mixing: every copy did).  Each window holds exactly the records of one block of input offsets."""
    attrs = UNKEYED_ATTRIBUTES
    truth = {(m.partition, m.offset): tuple(json.loads(m.value)[a] for a in attrs) for m in run_unkeyed.inputs
             if m.value}
    msgs = run_unkeyed.side["krr"]
    assert len(msgs) == 32561 and all(m.key is None for m in msgs)
    windows = offset_windows([m.partition for m in msgs], [m.offset for m in msgs], [m.timestamp for m in msgs])
    values = [tuple(json.loads(m.value)["values"][a] for a in attrs) for m in msgs]
    flips = 0
    for w in windows:  # the window's copies report exactly its block's records (up to k-RR's rare changes)
        got = Counter(values[i] for i in w)
        want = Counter(truth[(msgs[i].partition, msgs[i].offset)] for i in w)
        flips += sum((got - want).values())
    # k-RR changes a value with probability (k - 1) / (e^eps + k - 1): 5.7e-4 per copy over these 8 attributes
    schema = adult_schema()
    p_change = sum((len(schema[a].domain_values) - 1) / (math.exp(12.0) + len(schema[a].domain_values) - 1)
                   for a in attrs)
    expected = len(msgs) * p_change
    assert flips <= expected + 4 * math.sqrt(expected) + 1, (flips, expected)
    stat: PositionLinkage = value_linkage(windows, [(m.partition, m.offset) for m in msgs], values, truth.__getitem__)
    print(f"\nkrr without pseudonyms: the copy at a record's input offset reports its values: {stat}")
    assert abs(stat.z) <= 4, str(stat)
    assert stat.fraction < 0.05


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_class_message_does_not_name_its_expiring_member(run: Run, broker: Any) -> None:
    """CASTLE releases a class when its oldest record is delta arrivals old: without release ticks the record delta
    arrivals before the latest arrival preceding a class's timestamp is a member (1,194 of 1,195 releases in the
    issue's measurement, at a rate the service keeps up with: ``stream-anon bench release-timing``).  With the
    default ticks: every class message's timestamp is the end of a tick, after all its members arrived; within a
    tick the anon order is a uniformly random order of the triggers (Kendall's S within 4 standard deviations of
    0); the position attack names at most one release per tick; and no window of the QI attack pins the expiring
    member correctly more often than the tick's own information allows (guessing among the candidates of the
    release's tick: expected count plus 4 standard deviations; or elimination within the tick)."""
    bs = broker.bootstrap_servers
    tick_ms = round(run.cfg.release.tick_seconds * 1000)
    assert tick_ms > 0  # the default

    def read(topic: str) -> list[TopicMessage]:
        return [TopicMessage(m.partition, m.offset, m.timestamp, m.value)
                for m in read_topic_with_headers(bs, topic, timeout_s=60)]

    inputs = [TopicMessage(m.partition, m.offset, m.timestamp, m.value) for m in run.inputs]
    timing = release_timing_inputs(adult_schema(), inputs, read(run.cfg.topics.anon),
                                   released_records(run.snap.records))
    a = run.cfg.anonymization
    rep = release_timing_attack(timing.classes, timing.arrivals, a.delta,
                                reference_every=a.engine_config(a.seed).effective_t_reference_every)
    print("\nrelease timing (all of ADULT as fast as it can be sent):\n  " +
          "\n  ".join(rep.lines() + timing.latency_lines()))
    assert len(timing.classes) == run.snap.classes and rep.releases > 500
    assert all(c.timestamp_ms % tick_ms == 0 for c in timing.classes)
    assert timing.publish_ms.min() >= 0  # no class is stamped before one of its members arrived
    assert rep.oracle_member >= 0.99 * rep.releases  # the expiring member is there to be found
    assert rep.groups < rep.releases / 5  # ticks pool releases
    assert abs(rep.order.z) <= 4 and rep.order.pairs > 10_000, str(rep.order)
    assert rep.position_member <= rep.groups
    for pin in rep.pins:
        assert pin.correct <= rep.tick_bound, (pin, rep.tick_guess_expected, rep.tick_guess_variance)
