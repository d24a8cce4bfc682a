"""Replay into a real broker and consume back (highwater-based: Tansu's end_offsets is wrong).

The replay itself (exact count, ids and values, partitioning, existing topics, the CLI's end-of-stream markers) runs
on Tansu and on one Apache Kafka node (``any_broker``); the rest on Tansu: rate control and shuffling are the
replay's own logic, signals its own process, and acknowledgements without an offset exist only on Tansu."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from replay_support import write_clinic
from waiting import Deadline, wait_for

from stream_anon.core.datasets import iter_adult_records
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.replay.kafka_replay import ensure_topic, read_topic, replay_records
from stream_anon.service.audit import collect_outputs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adult_records(adult_path) -> list[dict]:
    return list(iter_adult_records(adult_path))


def _topic(name: str) -> str:
    return f"replay.{name}.{uuid.uuid4().hex[:8]}"


def test_replay_adult_exact_count_deterministic_ids_and_values(any_broker, adult_records) -> None:
    broker = any_broker  # Tansu and Apache Kafka (issue 17 item 2)
    topic = _topic("adult")
    records = adult_records[:4000]
    stats = replay_records(records, topic, broker.bootstrap_servers, rate=0, partitions=3)
    assert stats.records_sent == stats.records_acked == 4000 and stats.errors == 0
    assert stats.partitions == 3 and sum(stats.partition_counts.values()) == 4000
    assert len(stats.partition_counts) == 3  # keys spread over every partition
    assert stats.first_id == "adult-00000" and stats.last_id == "adult-03999"
    print(f"\nreplay 4,000 ADULT records, max rate: {stats.rate_achieved:,.0f} rec/s")

    got = read_topic(broker.bootstrap_servers, topic)  # until every partition's position reaches highwater
    assert len(got) == 4000  # exactly: nothing lost, nothing duplicated
    keys = [k.decode() for _, _, k, _ in got]
    assert len(set(keys)) == 4000 and set(keys) == {f"adult-{i:05d}" for i in range(4000)}
    by_id = {r["id"]: r for r in records}
    for _, _, key, value in got:
        doc = json.loads(value)
        assert doc == by_id[key.decode()]  # value = the record itself, one JSON object per message
    per_part = {p: sum(1 for q, *_ in got if q == p) for p in range(3)}
    assert per_part == stats.partition_counts
    # the same key always lands on the same partition (default murmur2 partitioner): replaying again is stable
    again = _topic("adult-again")
    replay_records(records[:500], again, broker.bootstrap_servers, partitions=3)
    first = {k: p for p, _, k, _ in got}
    assert all(first[k] == p for p, _, k, _ in read_topic(broker.bootstrap_servers, again, expected=500))


def test_replay_rate_control_is_honoured(broker, adult_records) -> None:
    topic = _topic("rate")
    rate, n = 5000.0, 2500
    stats = replay_records(adult_records[:n], topic, broker.bootstrap_servers, rate=rate)
    assert stats.records_acked == n
    # record n-1 is due at (n-1)/rate = 0.4998 s: the replay cannot be faster than the schedule allows, on any
    # machine (a slow one only makes it slower; the schedule itself is tested with a fake clock in
    # test_replay_units.py)
    assert stats.seconds >= (n - 1) / rate - 0.005
    assert stats.rate_achieved <= 1.02 * rate, stats.summary()
    print(f"\nreplay at target {rate:,.0f} rec/s: achieved {stats.rate_achieved:,.0f} rec/s")


def test_loop_and_shuffle_are_deterministic_with_a_seed(broker, adult_records) -> None:
    records = adult_records[:300]
    orders = []
    for seed in (11, 11, 12):
        topic = _topic("shuffle")
        stats = replay_records(records, topic, broker.bootstrap_servers, loop=2, shuffle=True, seed=seed,
                               partitions=1)
        assert stats.records_acked == 600 and stats.passes == 2 and stats.shuffle_seed == seed
        got = read_topic(broker.bootstrap_servers, topic, expected=600)
        orders.append([k.decode() for _, _, k, _ in sorted(got, key=lambda t: t[1])])  # one partition: offset order
    same_a, same_b, other = orders
    assert same_a == same_b  # same seed, same order
    assert same_a != other  # another seed, another order
    base = [r["id"] for r in records]
    assert same_a[:300] != base  # actually shuffled
    assert sorted(same_a[:300]) == sorted(base)  # pass 0: the original ids, each once
    assert sorted(same_a[300:]) == sorted(f"{i}#1" for i in base)  # pass 1: suffixed ids, each once
    assert len(set(same_a)) == 600


def test_ensure_topic_keeps_an_existing_topic(any_broker) -> None:
    broker = any_broker  # Tansu and Apache Kafka (issue 17 item 2)
    topic = _topic("exists")
    assert ensure_topic(broker.bootstrap_servers, topic, 2) == 2
    assert ensure_topic(broker.bootstrap_servers, topic, 5) == 2  # used as it is (warning logged)
    with pytest.raises(ValueError, match="partitions"):
        ensure_topic(broker.bootstrap_servers, topic, 0)


def test_cli_kafka_replays_and_prints_the_rate(broker, adult_path) -> None:
    topic = _topic("cli")
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--adult", str(adult_path),
                           "--limit", "700", "--topic", topic, "--bootstrap-servers", broker.bootstrap_servers,
                           "--partitions", "2", "--rate", "0", "--no-progress"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "replayed 700 records" in proc.stdout and "rec/s achieved" in proc.stdout and "2 partitions" in proc.stdout
    got = read_topic(broker.bootstrap_servers, topic, expected=702)  # + one end-of-stream marker per partition
    assert sorted(k.decode() for _, _, k, v in got if v) == [f"adult-{i:05d}" for i in range(700)]
    assert sorted(p for p, _, k, v in got if not v and not k) == [0, 1]


def _messages(bootstrap: str, topic: str, *, idle_s: float = 1.0, timeout_s: float = 30.0) -> list[Any]:
    """Every message of ``topic`` with its headers, read from the beginning up to every partition's highwater."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    try:
        deadline = time.monotonic() + timeout_s
        parts = consumer.partitions_for_topic(topic)
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        tps = [TopicPartition(topic, p) for p in sorted(parts or ())]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200)
            for msgs in batch.values():
                out.extend(msgs)
            if batch:
                last = time.monotonic()
            hw = [consumer.highwater(tp) for tp in tps]
            if all(h is not None and consumer.position(tp) >= h for tp, h in zip(tps, hw, strict=True)) \
                    and time.monotonic() - last >= idle_s:
                break
        return out
    finally:
        consumer.close()


def _is_flush_marker(m: Any) -> bool:
    return (CONTROL_HEADER, CONTROL_FLUSH) in list(m.headers or ()) and not m.value and m.key is None


def test_cli_flush_ends_every_partition_with_one_marker_after_the_records(any_broker, adult_path) -> None:
    broker = any_broker  # Tansu and Apache Kafka (issue 17 item 2)
    topic = _topic("flush")
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--adult", str(adult_path), "--limit", "600",
                           "--topic", topic, "--bootstrap-servers", broker.bootstrap_servers, "--partitions", "3",
                           "--no-progress"], capture_output=True, text=True, timeout=60)  # --flush is the default
    assert proc.returncode == 0, proc.stderr
    assert "end-of-stream flush sent to 3 partition(s)" in proc.stdout
    msgs = _messages(broker.bootstrap_servers, topic)
    assert len(msgs) == 603
    for p in range(3):
        part = sorted((m for m in msgs if m.partition == p), key=lambda m: m.offset)
        assert _is_flush_marker(part[-1])  # the marker is the last message: behind every record
        assert not any(_is_flush_marker(m) for m in part[:-1])
    # --no-flush: records only; then the stand-alone `flush` command adds the markers (e.g. after a UDP stream)
    other = _topic("noflush")
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--adult", str(adult_path), "--limit", "50",
                           "--topic", other, "--bootstrap-servers", broker.bootstrap_servers, "--partitions", "2",
                           "--no-flush", "--no-progress"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "end-of-stream" not in proc.stdout
    assert not any(_is_flush_marker(m) for m in _messages(broker.bootstrap_servers, other))
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "flush", "--topic", other, "--bootstrap-servers",
                           broker.bootstrap_servers], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "acknowledged on 2 partition(s)" in proc.stdout
    markers = [m for m in _messages(broker.bootstrap_servers, other) if _is_flush_marker(m)]
    assert sorted(m.partition for m in markers) == [0, 1]
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "flush", "--topic", _topic("absent"),
                           "--bootstrap-servers", broker.bootstrap_servers], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_kafka_replay_with_one_line(broker, sig: signal.Signals) -> None:
    topic = _topic("signal")
    proc = subprocess.Popen([sys.executable, "-m", "replay_tools", "kafka", "--synthetic", "0", "--seed", "1",
                             "--rate", "500", "--topic", topic, "--bootstrap-servers", broker.bootstrap_servers,
                             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        read_topic(broker.bootstrap_servers, topic, expected=50, timeout_s=60)  # the event: records arriving
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + sig
    assert out == "" and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("replaying synthetic"), err
    m = re.fullmatch(rf"replay interrupted by {sig.name}: ([\d,]+) records sent to '{re.escape(topic)}', ([\d,]+) "
                     r"acknowledged by the broker, 0 errors \(no end-of-stream flush sent\)", lines[1])
    assert m, lines[1]
    sent, acked = (int(m.group(i).replace(",", "")) for i in (1, 2))
    assert 50 <= acked <= sent
    got = _messages(broker.bootstrap_servers, topic)
    assert acked <= len(got) <= sent  # acknowledged records are in the topic; never more than were sent
    assert not any(_is_flush_marker(m) for m in got)  # an interrupted replay is not an end of stream


@pytest.fixture
def clinic_service(broker, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """`stream-anon run` on a custom schema whose record id field is `patient_ref` (k=3, delta=100, 2 partitions)."""
    csv_path, schema_path = write_clinic(tmp_path, n=40)
    prefix = f"clinic{uuid.uuid4().hex[:6]}"
    topics = {"input": f"{prefix}.raw", "anon": f"{prefix}.anon", "suppressed": f"{prefix}.suppressed",
              "dlq": f"{prefix}.dlq"}
    log_path = tmp_path / "service.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "stream_anon", "run", "--bootstrap-servers", broker.bootstrap_servers,
             "--schema", str(schema_path), "--input-topic", topics["input"], "--group-id", f"{prefix}-main",
             "--partitions", "2", "--k", "3", "--delta", "100", "--seed", "1", "--no-side-paths",
             "--metrics-port", "0", "--set", f"topics.anon={topics['anon']}",
             "--set", f"topics.suppressed={topics['suppressed']}", "--set", f"topics.dlq={topics['dlq']}",
             "--set", "kafka.session_timeout_ms=6000"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "main path: consuming" in log_path.read_text(errors="replace"), 60,
                 "the service subscribed", alive=lambda: proc.poll() is None,
                 context=lambda: log_path.read_text(errors="replace"))
        yield {"csv": csv_path, "schema": schema_path, "topics": topics, "proc": proc, "log": log_path}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_custom_schema_csv_goes_through_the_service_and_the_flush_releases_it_all(broker, clinic_service) -> None:
    """The record id field is `patient_ref`: nothing dead-lettered, every record released or suppressed once.
    40 records < delta = 100: without the end-of-stream flush nothing would be released yet."""
    topics = clinic_service["topics"]
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--csv", str(clinic_service["csv"]),
                           "--schema", str(clinic_service["schema"]), "--topic", topics["input"],
                           "--bootstrap-servers", broker.bootstrap_servers, "--no-progress"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "key: record id field 'patient_ref'" in proc.stderr and "replayed 40 records" in proc.stdout
    inputs = [m for m in _messages(broker.bootstrap_servers, topics["input"]) if not _is_flush_marker(m)]
    assert sorted(m.key.decode() for m in inputs) == [f"P{i:04d}" for i in range(40)]  # keyed by patient_ref
    accounted: dict[str, str] = {}
    deadline = Deadline(90, "the 40 records accounted in the ledger",
                        context=lambda: clinic_service["log"].read_text(errors="replace"))
    while len(accounted) < 40:  # read from the ledger: the public class carries no record id
        service_log = clinic_service["log"].read_text(errors="replace")
        assert clinic_service["proc"].poll() is None, service_log[-3000:]
        deadline.check(last=accounted)
        snap = collect_outputs(broker.bootstrap_servers, input_topic=topics["input"], anon=topics["anon"],
                               suppressed=topics["suppressed"], dlq=topics["dlq"], qis=["age", "zip"],
                               sensitive=["diagnosis"], timeout_s=20, idle_s=0.3)
        recs = snap.records[snap.records.outcome != "control"]
        assert not recs.record_id.duplicated().any()  # exactly once
        accounted = {str(r.record_id): ("anon" if r.outcome == "released" else r.outcome) for r in recs.itertuples()}
    assert snap.ok, (snap.accounting, snap.published, snap.problems)
    assert (snap.public.groupby("class_id").size() >= 3).all()  # k = 3
    assert sorted(accounted) == [f"P{i:04d}" for i in range(40)]
    assert list(accounted.values()).count("anon") >= 30
    assert _messages(broker.bootstrap_servers, topics["dlq"], idle_s=0.3) == []  # nothing dead-lettered


class _Acked:
    """A delivery report as a replay callback sees it (``offset`` -1: "acknowledged" without an offset)."""

    def __init__(self, partition: int, offset: int) -> None:
        self.partition, self.offset = partition, offset


class _Future:
    """kafka-python's future interface (``add_callback`` / ``add_errback`` with extra arguments), resolved later."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []

    def add_callback(self, fn: Any, *args: Any) -> _Future:
        self.callbacks.append((fn, args))
        return self

    def add_errback(self, fn: Any, *args: Any) -> _Future:
        return self

    def resolve(self, md: Any) -> None:
        for fn, args in self.callbacks:
            fn(*args, md)


class DuplicateSequenceProducer:
    """A real producer whose answers for every 10th record are what Tansu's durable storage gives an idempotent
    producer across a broker ``kill -9`` (docs/tansu.md): "acknowledged" with offset -1; half of those records were
    never stored (dropped here), the other half were (true duplicates)."""

    def __init__(self, bs: str) -> None:
        from kafka import KafkaProducer
        self.inner = KafkaProducer(bootstrap_servers=bs, acks="all")
        self.config = self.inner.config  # (where the replay reads back from)
        self.n = 0
        self.dropped = 0
        self.pending: list[tuple[_Future, Any, bool]] = []

    def send(self, topic: str, key: bytes | None = None, value: bytes | None = None) -> _Future:
        self.n += 1
        fut = _Future()
        if self.n % 20 == 0:  # "acknowledged" with -1, never stored
            self.dropped += 1
            self.pending.append((fut, None, True))
        else:
            self.pending.append((fut, self.inner.send(topic, key=key, value=value), self.n % 20 == 10))
        return fut

    def flush(self, timeout: float | None = None) -> None:
        self.inner.flush(timeout)
        for fut, inner, unconfirmed in self.pending:
            md = inner.get(timeout=30) if inner is not None else None
            fut.resolve(_Acked(md.partition if md else 0, -1 if unconfirmed else md.offset))
        self.pending.clear()

    def partitions_for(self, topic: str) -> Any:
        return self.inner.partitions_for(topic)

    def close(self, timeout: float | None = None) -> None:
        self.inner.close(timeout=timeout)


def test_acknowledgements_without_an_offset_are_not_counted_as_stored_and_are_read_back(broker, adult_records) -> None:
    """Issue 18 item 6: the replay printed "32,561 sent, 0 errors" where 32,549 were stored (14 acknowledged with
    offset -1, unchecked).  Now an acknowledgement without an offset is not an acknowledgement, and the replay reads
    back what the broker holds of those records."""
    topic = _topic("dupseq")
    ensure_topic(broker.bootstrap_servers, topic, 2)
    producer = DuplicateSequenceProducer(broker.bootstrap_servers)
    stats = replay_records(adult_records[:600], topic, broker.bootstrap_servers, producer=producer, partitions=2)
    producer.close()
    held = len(read_topic(broker.bootstrap_servers, topic))
    assert held == 600 - producer.dropped == 570
    assert stats.records_sent == 600 and stats.unconfirmed == 60 and stats.records_acked == 540
    assert stats.stored == held and not stats.complete  # 30 acknowledged "without an offset" are not there
    assert "60 acknowledged without an offset (maybe not stored)" in stats.summary()
    assert "read back: the broker holds 570 of the 600 records sent" in stats.summary()
    assert stats.summary().startswith("replayed 570 records")
