"""The ledger really compacted on Apache Kafka (issue 17 item 4): recovery after compaction stays exact, and the
ledger's size stays bounded under a long run.

One Apache Kafka node whose log cleaner wakes every second (``log.cleaner.backoff.ms=1000``); the ledger topic is
created by the test, before the service starts, compacted with small segments: ``segment.ms`` 2 s,
``min.cleanable.dirty.ratio`` 0.01, ``delete.retention.ms`` 1 s (tombstones removed 1 s after a cleaning), and
``min.compaction.lag.ms`` 5 s (the test's mirror, below, copies every ledger record before it may be compacted).

ADULT is replayed twice over (65,122 records with distinct ids) at a steady rate into 2 partitions while
``stream-anon run`` processes it.  Once the broker's cleaner has compacted the ledger, the service is killed
(``kill -9``) and started again, twice; then the end-of-stream markers, and the service drains everything.

- **Exact.**  ``stream-anon audit`` can only account for what compaction keeps (docs/service.md): the test
  therefore copies the ledger, record by record and partition by partition, into an uncompacted mirror topic
  while it is written (the copy checks that it saw every offset: nothing was compacted before it was copied),
  and runs ``stream-anon audit --set topics.ledger=<mirror>``: every input offset accounted once, every promised
  output published once on its topic, nothing else there (0 lost, 0 duplicated on the anon topic); every ADULT id
  once, k and l verified.  The recoveries themselves read the real, compacted ledger.
- **Bounded.**  Every few seconds: the ledger's bytes on disk (its partitions' segment files), and the records
  written (end offsets); at the end the records it still holds (read back).  Written grows with the stream; the
  bytes on disk do not: their least-squares slope against records written is at most a quarter of what a record
  costs uncompacted (the mirror's bytes per record).
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from apache_kafka_support import KafkaCluster, ServiceProcess, start_cluster, wait_for
from durable_broker import child_env
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka_service_support import (
    PARTITIONS,
    K,
    L,
    adult_rows,
    committed_total,
    drained,
    service_cmd,
    topic_flags,
)

from stream_anon.core.datasets import read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.replay.kafka_replay import replay_records
from stream_anon.service.audit import collect_outputs, partition_ends, send_flush_markers

LEDGER_CONFIG = {"cleanup.policy": "compact", "segment.ms": "2000", "min.cleanable.dirty.ratio": "0.01",
                 "delete.retention.ms": "1000", "min.compaction.lag.ms": "5000"}
RATE = 700.0  # records/s of the replay: about 90 s of stream


class LedgerMirror:
    """Copies every record of the ledger (partition p -> mirror partition p, in order, key, value and headers)
    into an uncompacted topic as it is written, and checks the offsets it copies are contiguous from 0."""

    def __init__(self, bs: str, ledger: str, mirror: str) -> None:
        self.bs, self.ledger, self.mirror = bs, ledger, mirror
        self.copied = 0
        self.gaps: list[tuple[int, int, int]] = []  # (partition, expected offset, got)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LedgerMirror:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            consumer = KafkaConsumer(bootstrap_servers=self.bs, enable_auto_commit=False, fetch_max_wait_ms=50)
            producer = KafkaProducer(bootstrap_servers=self.bs, acks="all", enable_idempotence=True, linger_ms=5)
            tps = [TopicPartition(self.ledger, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, 0)
            nxt = {p: 0 for p in range(PARTITIONS)}
            while True:
                batch = consumer.poll(timeout_ms=100, max_records=5000)
                for tp, recs in batch.items():
                    for r in recs:
                        if r.offset != nxt[tp.partition]:
                            self.gaps.append((tp.partition, nxt[tp.partition], r.offset))
                        nxt[tp.partition] = r.offset + 1
                        producer.send(self.mirror, key=r.key, value=r.value, partition=tp.partition,
                                      headers=list(r.headers or []))
                        self.copied += 1
                if not batch and self._stop.is_set():
                    hw = [consumer.highwater(tp) for tp in tps]
                    if all(h is not None and consumer.position(tp) >= h for tp, h in zip(tps, hw, strict=True)):
                        break
            producer.flush()
            producer.close()
            consumer.close()
        except BaseException as e:  # reported by stop()
            self.error = e

    def stop(self, timeout_s: float = 120) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the ledger mirror did not catch up"
        assert self.error is None, repr(self.error)
        assert not self.gaps, f"the mirror missed ledger offsets (compacted before copied): {self.gaps[:5]}"


def ledger_bytes(cluster: KafkaCluster, ledger: str) -> int:
    """Bytes of the ledger's segment files on the node's disk (all partitions)."""
    data = cluster.node(1).data_dir
    return sum(f.stat().st_size for p in range(PARTITIONS) for f in (data / f"{ledger}-{p}").glob("*.log")
               if f.exists())


def cleanings(cluster: KafkaCluster, ledger: str) -> int:
    """How many cleanings of the ledger's partitions the broker logged."""
    text = cluster.node(1).log_path.read_text(errors="replace")
    return sum(text.count(f"cleaning of log {ledger}-{p}") for p in range(PARTITIONS))


def cleaner_caught_up(cluster: KafkaCluster, ledger: str) -> bool:
    """Whether the cleaner has cleaned every ledger partition up to its active segment, all it can clean: its
    checkpoint (``cleaner-offset-checkpoint``: version, count, then ``topic partition offset`` lines) at the active
    (newest) segment's base offset.  The active segment is never cleaned, and it rolls only when a record is appended
    after ``segment.ms``: once the service stopped, a cleaning that had already reached it was the last one."""
    data = cluster.node(1).data_dir
    ckpt = data / "cleaner-offset-checkpoint"
    cleaned: dict[int, int] = {}
    for line in (ckpt.read_text().splitlines()[2:] if ckpt.exists() else []):
        fields = line.split()
        if len(fields) == 3 and fields[0] == ledger:
            cleaned[int(fields[1])] = int(fields[2])
    for p in range(PARTITIONS):
        bases = [int(f.name.removesuffix(".log")) for f in (data / f"{ledger}-{p}").glob("*.log")]
        if not bases or cleaned.get(p, -1) < max(bases):
            return False
    return True


def retained(bs: str, topic: str) -> int:
    """Records the topic holds now (read from its beginning to its end)."""
    consumer = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, fetch_max_wait_ms=50)
    try:
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        n = 0
        deadline = time.monotonic() + 120
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            n += sum(len(v) for v in consumer.poll(timeout_ms=200, max_records=20000).values())
            assert time.monotonic() < deadline, "reading the ledger back took more than 120 s"
        return n
    finally:
        consumer.close()


@pytest.fixture
def compacting_kafka(tmp_path: Path) -> Iterator[KafkaCluster]:
    """One Apache Kafka node whose log cleaner looks for work every second."""
    cluster = start_cluster(tmp_path / "kafka", 1, extra_config={"log.cleaner.backoff.ms": "1000"})
    try:
        yield cluster
    finally:
        cluster.stop(timeout_s=15)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_compacted_ledger_recovers_exactly_and_stays_bounded(compacting_kafka: KafkaCluster, adult_path: Path,
                                                               tmp_path: Path) -> None:
    cluster = compacting_kafka
    bs = cluster.bootstrap_servers
    prefix = f"lc{uuid.uuid4().hex[:6]}"
    group, topic, ledger, mirror = f"{prefix}-main", f"{prefix}.raw", f"{prefix}.raw.ledger", f"{prefix}.mirror"
    admin = KafkaAdminClient(bootstrap_servers=bs)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1), NewTopic(mirror, PARTITIONS, 1),
                         NewTopic(ledger, PARTITIONS, 1, topic_configs=dict(LEDGER_CONFIG))])
    admin.close()
    lmirror = LedgerMirror(bs, ledger, mirror).start()
    adult = read_adult(adult_path)
    rows = adult_rows(adult)
    replayed: dict[str, Any] = {}
    replay = threading.Thread(target=lambda: replayed.setdefault(
        "stats", replay_records(rows, topic, bs, partitions=PARTITIONS, rate=RATE, loop=2)), daemon=True)
    samples: list[tuple[float, int, int]] = []  # (seconds, records written to the ledger, bytes on disk)
    t_start = time.monotonic()

    def sample() -> None:
        written = sum(partition_ends(bs, ledger).values())
        samples.append((round(time.monotonic() - t_start, 1), written, ledger_bytes(cluster, ledger)))

    kills = []
    logs = iter(tmp_path / f"service-{i}.log" for i in range(3))
    service = ServiceProcess(service_cmd(bs, prefix), next(logs))
    try:
        wait_for("the service subscribed", lambda: "main path: consuming" in service.text(), service, 120)
        replay.start()
        total = 2 * len(rows)
        for fraction in (0.35, 0.65):
            def ready(f: float = fraction) -> bool:
                if not samples or time.monotonic() - t_start - samples[-1][0] >= 3:
                    sample()
                return cleanings(cluster, ledger) > 0 and committed_total(bs, group, topic) >= f * total
            wait_for(f"the ledger compacted and {fraction:.0%} committed", ready, service, 300, interval_s=0.5)
            before = committed_total(bs, group, topic)
            service.kill()  # kill -9, after the cleaner compacted the ledger
            kills.append((before, cleanings(cluster, ledger)))
            service = ServiceProcess(service_cmd(bs, prefix), next(logs))
        while replay.is_alive():
            service.assert_alive()
            if time.monotonic() - t_start - samples[-1][0] >= 3:
                sample()
            replay.join(0.5)
        stats = replayed["stats"]
        assert stats.records_acked == total
        producer = KafkaProducer(bootstrap_servers=bs)
        send_flush_markers(producer, topic, list(range(PARTITIONS)))
        producer.close()
        ends = partition_ends(bs, topic)
        assert sum(ends.values()) == total + PARTITIONS
        wait_for("every partition drained", lambda: drained(bs, group, topic, ends), service, 300)
        sample()
        assert service.stop() == 0, service.text()[-5000:]
    finally:
        if service.proc.poll() is None:
            service.proc.kill()
    # the cleaner has to catch up with the tail before the last measurement.  Waited for as its checkpoint reaching
    # the active segments (until 2026-11-28: one more cleaning after the stop, which never came when a cleaning during
    # the stop had reached them already: nothing is appended afterwards, so no segment rolls; 120 s, then a failure)
    wait_for("the cleaner caught up with the ledger's tail", lambda: cleaner_caught_up(cluster, ledger), None, 120,
             interval_s=0.5)
    sample()
    lmirror.stop()
    kept = retained(bs, ledger)
    written = sum(partition_ends(bs, ledger).values())

    # exact: stream-anon audit on the mirror (the whole history of the ledger)
    res = subprocess.run([sys.executable, "-m", "stream_anon", "audit", "--bootstrap-servers", bs, *topic_flags(prefix),
                          "--set", f"topics.ledger={mirror}"], capture_output=True, text=True, timeout=300,
                         env=child_env())
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"(total {total + PARTITIONS:,})" in res.stdout, res.stdout
    s = adult_schema()
    qis = [a.name for a in s.qis]
    snap = collect_outputs(bs, input_topic=topic, ledger=mirror, anon=f"{prefix}.anon",
                           suppressed=f"{prefix}.suppressed", dlq=f"{prefix}.dlq", qis=qis,
                           sensitive=[a.name for a in s.sensitive], input_ends=ends, timeout_s=120)
    assert snap.ok and snap.published["anon"].exactly_once == snap.published["anon"].expected
    out = snap.records
    assert len(out) == total and out.record_id.is_unique  # every ADULT id of both passes once
    released = out[out.outcome == "released"]
    rep = verify_release_frame(snap.public, qis, K, L, "income", record_id=None, schema=s)
    assert rep.ok and rep.records == len(released), str(rep)
    # the recoveries read the compacted ledger: never an offset range taken as a gap (docs/tansu.md)
    for log in tmp_path.glob("service-*.log"):
        assert "hold no records" not in log.read_text(errors="replace"), log.name
    # what the real, compacted ledger still lets the audit see
    real = subprocess.run([sys.executable, "-m", "stream_anon", "audit", "--bootstrap-servers", bs,
                           *topic_flags(prefix)], capture_output=True, text=True, timeout=300, env=child_env())
    assert "ACCOUNTED TWICE" not in real.stdout, real.stdout

    # bounded: the ledger's bytes on disk do not grow with what is written.  The least-squares slope of bytes on disk
    # against records written (every sample) is compared with what a record costs uncompacted: the mirror's bytes per
    # record (the same records, never compacted).  Growth without compaction gives a slope of that cost; compaction
    # to a bounded state, a slope near 0 (6 % of it, standard error 3 %, in the CI run of 2026-11-27).  The test
    # compared the means of the two halves of the samples before (at most 1.5 times): means of a sawtooth (each
    # cleaning drops the size by up to 95 %) whose first half holds the ramp before the first cleaning, which failed
    # that run at 1.53 with the slope at 6 %.
    raw_per_record = ledger_bytes(cluster, mirror) / max(1, lmirror.copied)
    xs = np.array([w for _, w, _ in samples], dtype=float)
    ys = np.array([b for _, _, b in samples], dtype=float)
    slope = float(np.polyfit(xs, ys, 1)[0])
    first = [b for _, w, b in samples if 0 < w < samples[-1][1] / 2]
    second = [b for _, w, b in samples if w >= samples[-1][1] / 2]
    mean_first, mean_second = sum(first) / max(1, len(first)), sum(second) / max(1, len(second))
    print(f"\nApache Kafka {cluster.version}, compacted ledger: {total:,} records + {PARTITIONS} markers, killed at "
          f"committed {[k[0] for k in kills]} after {[k[1] for k in kills]} cleanings; mirror copied "
          f"{lmirror.copied:,} ledger records, audit on it OK; ledger at the end: {written:,} records written, "
          f"{kept:,} kept ({kept / written:.1%}), {samples[-1][2]:,} bytes on disk; bytes on disk per record "
          f"written: {slope:,.1f} (least-squares slope) against {raw_per_record:,.1f} uncompacted (the mirror); "
          f"mean over the first half of what was written {mean_first:,.0f}, over the second {mean_second:,.0f}; "
          f"(s, written, bytes) samples: {samples}\n"
          f"real ledger audit: "
          f"{[ln for ln in real.stdout.splitlines() if ln.startswith(('ledger:', 'NOT', 'anon:', 'OK'))]}")
    assert len(samples) >= 6, samples
    assert slope <= 0.25 * raw_per_record, (slope, raw_per_record)
    assert kept < 0.25 * written
