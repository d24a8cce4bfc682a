"""Broker outage test (real broker, real processes): the broker goes away and comes back WITHOUT losing its data.

A dedicated Tansu broker (memory storage, so it must not be restarted: it would lose its topics) is frozen
with ``SIGSTOP`` for longer than the service's request and session timeouts, then resumed with ``SIGCONT``:
to the service this is a broker that stops answering (requests time out, the group session expires, the
coordinator is lost), exactly like a network partition or a broker stall, and then returns with its data.

Phase 1 (outage while consuming): ADULT records are replayed at a steady pace while ``stream-anon run``
consumes them; the broker is frozen twice mid-stream.  Phase 2 (outage while idle): everything is drained,
the broker is frozen while the service has nothing to do, resumed, and new records are sent.  Phase 3
(stopped during an outage): more records are consumed (some released, the rest buffered), the broker is
frozen and the service gets ``SIGTERM``: it must exit promptly (no hang waiting for the broker), and a
restarted service recovers from the ledger.  Checks (read from the ledger): every input message is accounted for
exactly once, every promised output is published exactly once, every class is k-anonymous and covers its
originals, the service
process never exited before it was told to (no crash loop), and its log names each outage with a retry line
and the broker's return.

Runs on Tansu only (a single Apache Kafka node frozen would be the same fault; it runs once per client library
here).  On Apache Kafka: a node frozen past the session timeout while it coordinates the group and leads every
main-path partition, scenario (c) of tests/test_apache_kafka_cluster_faults.py; broker ``kill -9`` and restart
under the running service: tests/test_both_brokers.py (both brokers).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from waiting import wait_for

from stream_anon.core.datasets import read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.replay.kafka_replay import ensure_topic, replay_records
from stream_anon.service.audit import collect_outputs, send_flush_markers

K, DELTA, PARTITIONS = 10, 1000, 2
PHASE1_RECORDS = 15_000  # replayed while the service consumes (two outages)
PHASE2_RECORDS = 2_000  # sent after the outage while idle
PHASE3_RECORDS = 3_000  # consumed, then the service is stopped while the broker is away, then restarted
CHUNK, TICK_S = 400, 0.2  # replay pace: 2,000 records/s, each chunk acknowledged before the next
FREEZE_S = 8.0  # each outage: longer than the service's request timeout and group session timeout
REQUEST_TIMEOUT_MS = 3000
# 3 s, not 6: librdkafka drops its member id after a session timeout without an answer and rejoins as a new member;
# Tansu then holds the partitions until it expires the gone member, about 15 s with 6 s sessions and 2-10 s with
# 3 s (docs/tansu.md), at each of the four rejoins of the confluent-kafka run (136 s -> ~85 s).  The freeze stays
# well beyond both timeouts, so the outage is the same fault.
SESSION_TIMEOUT_MS = 3000


def service_cmd(bs: str, prefix: str, group: str, consumer_client: str) -> list[str]:
    cmd = [sys.executable, "-m", "stream_anon", "--log-level", "INFO", "run", "--bootstrap-servers", bs,
           "--no-side-paths", "--metrics-port", "0", "--group-id", group, "--k", str(K), "--delta", str(DELTA),
           "--seed", "11", "--set", f"kafka.session_timeout_ms={SESSION_TIMEOUT_MS}",
           "--set", f"kafka.request_timeout_ms={REQUEST_TIMEOUT_MS}", "--set", "kafka.max_poll_interval_ms=20000",
           "--set", "kafka.retry_backoff_max_seconds=2", "--set", "kafka.startup_retry_seconds=60",
           "--set", "service.commit_interval_ms=250", "--set", "kafka.max_poll_records=1000",
           "--set", f"kafka.consumer_client={consumer_client}"]
    for role in ("input", "anon", "suppressed", "dlq"):
        cmd += ["--set", f"topics.{role}={prefix}.{'raw' if role == 'input' else role}"]
    return cmd


class Replayer(threading.Thread):
    """Sends records in chunks of ``CHUNK`` every ``TICK_S``, each chunk acknowledged before the next (so an
    outage pauses the input instead of piling it into the producer); idempotent producer, long timeouts."""

    def __init__(self, records: Sequence[Mapping[str, Any]], topic: str, producer: KafkaProducer,
                 hold_last: threading.Event | None = None) -> None:
        super().__init__(name="replay", daemon=True)
        self.records, self.topic, self.producer = records, topic, producer
        self.hold_last = hold_last  # set: the last chunk may go (it is sent once the test says so)
        self.acked = 0
        self.errors = 0
        self.partition_counts: dict[int, int] = {}
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(0, len(self.records), CHUNK):
                if self.hold_last is not None and i + CHUNK >= len(self.records):
                    self.hold_last.wait(300)
                stats = replay_records(self.records[i:i + CHUNK], self.topic, "unused", partitions=PARTITIONS,
                                       create_topic=False, producer=self.producer, flush_timeout_s=120)
                self.acked += stats.records_acked
                self.errors += stats.errors
                for p, n in stats.partition_counts.items():
                    self.partition_counts[p] = self.partition_counts.get(p, 0) + n
                time.sleep(TICK_S)
        except BaseException as e:  # reported by the test
            self.failure = e


class Service:
    """``stream-anon run`` as a subprocess, its output captured to a file."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"service exited with {self.proc.returncode}:\n{self.text()[-4000:]}"


def committed(monitor: KafkaConsumer, topic: str) -> dict[int, int]:
    out = {}
    for p in range(PARTITIONS):
        c = monitor.committed(TopicPartition(topic, p), timeout_ms=5000)
        out[p] = int(c) if c is not None else 0
    return out


def freeze(broker: EmbeddedBroker, seconds: float, service: Service) -> int:
    """SIGSTOP the broker for ``seconds``, then SIGCONT it; returns the service log's size when it froze."""
    assert broker.process is not None
    start = service.log.stat().st_size
    broker.process.send_signal(signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        broker.process.send_signal(signal.SIGCONT)
    return start


# the service's own lines (not kafka-python's): outage noticed, with retry; broker back
OUTAGE = re.compile(r"WARNING stream_anon\.(service|kafka_io)\.\S+: broker \S+ "
                    r"(not answering for \d+ s .*checking again in"
                    r"|has not acknowledged \d+ (output|ledger) message\(s\) for \d+ s .*the producer retries)")
ALREADY_RELEASED = re.compile(r"(\d+) offsets at or after it already accounted")
BACK = re.compile(r"WARNING stream_anon\.(service|kafka_io)\.\S+: broker \S+ (answering again after"
                  r"|acknowledged the held (output|ledger) messages after)"
                  # or the broker's answer after the freeze was an acknowledgement without an offset (Tansu,
                  # docs/tansu.md): the producers are created anew and the partitions recovered from the ledger
                  r"|WARNING stream_anon\.service\.loop: producers created anew and partitions \S+.* recovered from "
                  r"the ledger in")


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_broker_outage_loses_nothing_and_the_service_keeps_running(adult_path: Path, tmp_path: Path,
                                                                   consumer_client: str) -> None:
    adult = read_adult(adult_path)
    rows = [dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
            for row in adult.itertuples(index=False, name=None)]
    n1, n2, n3 = PHASE1_RECORDS, PHASE1_RECORDS + PHASE2_RECORDS, PHASE1_RECORDS + PHASE2_RECORDS + PHASE3_RECORDS
    phase1, phase2, phase3 = rows[:n1], rows[n1:n2], rows[n2:n3]
    prefix = f"outage{uuid.uuid4().hex[:6]}"
    group, topic = f"{prefix}-main", f"{prefix}.raw"
    t_start = time.monotonic()
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        bs = broker.bootstrap_servers
        ensure_topic(bs, topic, PARTITIONS)
        service = Service(service_cmd(bs, prefix, group, consumer_client), tmp_path / "service.log")
        restarted: Service | None = None
        monitor = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
        producer = KafkaProducer(bootstrap_servers=bs, acks="all", enable_idempotence=True, linger_ms=5,
                                 request_timeout_ms=60000)
        try:
            wait_for(lambda: "assigned partitions [0, 1]" in service.text(), 60,
                     "the service to get its partitions", alive=service.assert_alive, context=service.text)

            # ---- phase 1: two outages while the service consumes a steady stream
            # the stream goes on into the second outage whatever the first one cost (librdkafka rejoins as a new
            # member after a session timeout; Tansu answers it with the gone member as leader until it expires it)
            second_outage = threading.Event()
            replayer = Replayer(phase1, topic, producer, hold_last=second_outage)
            replayer.start()
            progress = [0]

            def done_at_least(n: int) -> Callable[[], bool]:
                def cond() -> bool:
                    progress[0] = sum(committed(monitor, topic).values())
                    return progress[0] >= n
                return cond

            wait_for(done_at_least(2000), 60, "progress before outage 1", alive=service.assert_alive,
                     context=service.text)
            outages = [freeze(broker, FREEZE_S, service)]
            # the service notices the return first; then progress counted from there (a count read before the
            # freeze can be 2,000 behind what the service had committed when it froze: with it, the second
            # outage once began at once, and the first one's segment of the log had no line of the return)
            wait_for(lambda: BACK.search(service.log.read_bytes()[outages[-1]:].decode(errors="replace")), 90,
                     "the service to see the broker back after outage 1", alive=service.assert_alive,
                     context=service.text)
            wait_for(done_at_least(sum(committed(monitor, topic).values()) + 2000), 90, "progress after outage 1",
                     alive=service.assert_alive, context=service.text)
            assert replayer.is_alive(), "the replay finished before the second outage: slow it down"
            second_outage.set()
            outages.append(freeze(broker, FREEZE_S, service))
            replayer.join(120)
            assert not replayer.is_alive() and replayer.failure is None, replayer.failure
            assert replayer.acked == len(phase1) and replayer.errors == 0
            send_flush_markers(producer, topic, list(range(PARTITIONS)))
            counts = dict(replayer.partition_counts)
            end1 = {p: counts.get(p, 0) + 1 for p in range(PARTITIONS)}  # records + flush marker
            wait_for(lambda: committed(monitor, topic) == end1, 90, "phase 1 drained",
                     alive=service.assert_alive, context=service.text)

            # ---- phase 2: outage while idle, then new records
            time.sleep(1.0)  # idle: nothing in flight, the group is stable
            outages.append(freeze(broker, FREEZE_S, service))
            replayer2 = Replayer(phase2, topic, producer)
            replayer2.run()  # in this thread: the broker is back
            assert replayer2.failure is None and replayer2.acked == len(phase2), replayer2.failure
            send_flush_markers(producer, topic, list(range(PARTITIONS)))
            end2 = {p: end1[p] + replayer2.partition_counts.get(p, 0) + 1 for p in range(PARTITIONS)}
            wait_for(lambda: committed(monitor, topic) == end2, 90, "phase 2 drained",
                     alive=service.assert_alive, context=service.text)
            service.assert_alive()  # never exited: no crash loop

            # ---- phase 3: records consumed (some released, the rest buffered), then the service is stopped
            # (SIGTERM) while the broker is away: it must exit (no hang); a restart resumes from the watermarks
            replayer3 = Replayer(phase3, topic, producer)
            replayer3.run()
            assert replayer3.failure is None and replayer3.acked == len(phase3), replayer3.failure
            time.sleep(1.0)  # consumed meanwhile (not a condition of the checks: any state must be safe)
            assert broker.process is not None
            broker.process.send_signal(signal.SIGSTOP)
            try:
                time.sleep(1.0)
                t_stop = time.monotonic()
                service.proc.send_signal(signal.SIGTERM)
                try:
                    stop_rc: int | None = service.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    stop_rc = None
                stop_seconds = time.monotonic() - t_stop
            finally:
                broker.process.send_signal(signal.SIGCONT)
            assert stop_rc in (0, 3), f"SIGTERM during an outage: exit {stop_rc} after {stop_seconds:.1f} s:\n" \
                                      f"{service.text()[-4000:]}"
            restarted = Service(service_cmd(bs, prefix, group, consumer_client), tmp_path / "service-restarted.log")
            wait_for(lambda: "assigned partitions [0, 1]" in restarted.text(), 60,
                     "the restarted service to get its partitions", alive=restarted.assert_alive,
                     context=restarted.text)
            send_flush_markers(producer, topic, list(range(PARTITIONS)))
            end3 = {p: end2[p] + replayer3.partition_counts.get(p, 0) + 1 for p in range(PARTITIONS)}
            wait_for(lambda: committed(monitor, topic) == end3, 90, "phase 3 drained",
                     alive=restarted.assert_alive, context=restarted.text)
        finally:
            producer.close(timeout=10)
            monitor.close()
            for svc in (service, restarted):
                if svc is not None and svc.proc.poll() is None:
                    svc.proc.send_signal(signal.SIGTERM)
                    try:
                        svc.proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        svc.proc.kill()
                        svc.proc.wait()
        assert restarted is not None and restarted.proc.returncode == 0, restarted.text()[-4000:] if restarted else ""

        schema = adult_schema()
        qis = [a.name for a in schema.qis]
        snap = collect_outputs(bs, input_topic=topic, anon=f"{prefix}.anon", suppressed=f"{prefix}.suppressed",
                               dlq=f"{prefix}.dlq", qis=qis, sensitive=[a.name for a in schema.sensitive],
                               input_ends=end3)
        out = snap.records
    elapsed = time.monotonic() - t_start
    text = service.text()

    # 1. exactly once: every input offset once in the ledger, every promised output published once
    assert snap.ok, (snap.accounting.duplicates[:5], snap.accounting.missing[:5], snap.published, snap.problems)
    sent = [r["id"] for r in phase1 + phase2 + phase3]
    assert len(out) == len(sent), f"{len(out)} accounted records for {len(sent)} inputs"
    assert out.record_id.is_unique, out.record_id[out.record_id.duplicated()].head().tolist()
    assert set(out.record_id) == set(sent)
    assert not out.duplicated(["src_partition", "src_offset"]).any()
    assert (out.outcome != "dead_lettered").all()
    # 2. every class k-anonymous and covering its originals (joined through the ledger's record ids)
    released = out[out.outcome == "released"]
    rep = verify_release_frame(released[["record_id", "class_id", *qis]].astype({"record_id": str}),
                               qis, K, schema=schema, original=adult, original_id="id")
    assert rep.ok, str(rep)
    rep = verify_release_frame(snap.public, qis, K, 2, "income", record_id=None, schema=schema)
    assert rep.ok and rep.records == len(released), str(rep)
    assert int(out.dropna(subset=["delay"]).delay.max()) <= DELTA
    # 3. one process all along, and its log names the outage
    assert text.count("main path: consuming") == 1
    assert "Traceback" not in text + restarted.text(), (text + restarted.text())[-4000:]
    raw = service.log.read_bytes()
    segments = [raw[a:b].decode(errors="replace") for a, b in zip(outages, [*outages[1:], len(raw)], strict=True)]
    for i, seg in enumerate(segments):  # each outage: noticed with a retry line, then the broker's return
        assert OUTAGE.search(seg) and BACK.search(seg), f"outage {i + 1}: no clear broker lines in\n{seg[-4000:]}"
    assert re.search(r"broker \S+ not answering for \d+ s", segments[2]), segments[2][-4000:]  # while idle
    assert re.search(r"broker \S+ answering again after", segments[2]), segments[2][-4000:]
    print(f"broker outage test: 3 outages of {FREEZE_S:g} s, stopped during a 4th (exit {stop_rc} after "
          f"{stop_seconds:.1f} s), {len(out)} records accounted once, "
          f"{len(released)} released in {released.class_id.nunique()} classes, "
          f"{(out.outcome == 'suppressed').sum()} suppressed; found already released at the restart: "
          f"{ALREADY_RELEASED.findall(restarted.text())}; {elapsed:.1f} s")
    print("\n".join(line for line in text.splitlines() if "stream_anon." in line and "WARNING" in line))
