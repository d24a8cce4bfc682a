"""Probe what a Tansu broker keeps across a restart and how Kafka clients behave across one (docs/tansu.md).

Run from the project root:  PYTHONPATH=$PWD python scripts/tansu_restart_probe.py [--storage memory s3]
[--restart hard soft] [--mid-produce-runs 3] [--timing-runs 5] [--json OUT]

Scenario ``restart`` (per storage x restart kind, one fresh broker each):
  before: topic ``probe`` created with 2 partitions, 1,000 keyed records from a long-lived kafka-python
  idempotent producer (acks=all), 200 from a long-lived confluent-kafka idempotent producer, a kafka-python
  consumer in group ``g`` reads 600 and commits them synchronously (it stays in the group).
  restart: ``kill -9`` (hard) or SIGTERM (soft), then a new broker process on the same port and storage.
  after, in this order: topic list via a metadata request that does not auto-create; committed offsets of
  ``g`` (admin API); the old kafka-python producer sends 100 more; the old confluent producer sends 100 more;
  a fresh kafka-python producer sends 100; topic id and partition count again (the sends may have auto-created
  the topic); the old consumer keeps polling (first offsets it gets after the restart); every record in the
  topic is read back and compared with what was acknowledged.
Scenario ``mid-produce``: a kafka-python idempotent producer sends continuously (futures tracked) and the
  broker is killed with SIGKILL while batches are in flight; after the restart the old producer's fate is
  recorded, a fresh producer sends 500 more, and every acknowledged record must be in the topic.
Scenario ``timing``: seconds from the restart (new process spawned) until a metadata request is answered and
  until a fresh producer's first record is acknowledged.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError as CKError
from confluent_kafka import Producer as CKProducer
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from stream_anon.kafka_io.broker import EmbeddedBroker, S3rver, find_s3rver, free_port, node_binary

TOPIC, GROUP, PARTITIONS = "probe", "g", 2


class KafkaLogCapture(logging.Handler):
    """Counts kafka-python's WARNING+ log lines (first 110 characters) while installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        # strip connection/producer reprs so that equal messages count together
        for marker in ("<KafkaConnection", "<KafkaProducer", "<Sender"):
            if marker in msg:
                msg = msg[:msg.find(marker)] + "<...>" + msg[msg.find(">:", msg.find(marker)) + 1:]
        self.lines[f"{record.levelname} {record.name}: {msg[:110]}"] += 1


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - t0


def kp_producer(bs: str, idempotent: bool = True, **extra: Any) -> KafkaProducer:
    return KafkaProducer(bootstrap_servers=bs, enable_idempotence=idempotent, acks="all", linger_ms=5,
                         request_timeout_ms=5000, delivery_timeout_ms=20000, retry_backoff_ms=100,
                         reconnect_backoff_max_ms=1000, **extra)


def kp_send(producer: KafkaProducer, start: int, n: int, timeout_s: float = 25.0) -> dict[str, Any]:
    """Send records ``start..start+n`` and wait for each future; returns counts of outcomes."""
    outcome: Counter[str] = Counter()
    acked: list[tuple[int, int, bytes]] = []
    futures = []
    for i in range(start, start + n):
        try:
            futures.append((i, producer.send(TOPIC, key=b"k%d" % i, value=b"v%d" % i)))
        except Exception as e:  # send() itself refused
            outcome[f"send() raised {type(e).__name__}: {str(e)[:80]}"] += 1
    deadline = time.monotonic() + timeout_s
    for i, f in futures:
        try:
            md = f.get(timeout=max(0.1, deadline - time.monotonic()))
            outcome["acked"] += 1
            acked.append((md.partition, md.offset, b"v%d" % i))
        except Exception as e:
            outcome[f"future failed {type(e).__name__}: {str(e)[:90]}"] += 1
    tm = producer._transaction_manager  # noqa: SLF001 - the probe reports the client's internal state
    state = {"fatal": bool(tm.has_fatal_error()) if tm else None,
             "producer_id_epoch": str(tm.producer_id_and_epoch) if tm else None}
    return {"outcome": dict(outcome), "acked": acked, "state": state}


class _CallbackHandler(logging.Handler):
    def __init__(self, callback: Callable[[str], None]) -> None:
        super().__init__(logging.DEBUG)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        self.callback(record.getMessage())


class CKProbe:
    """A long-lived confluent-kafka idempotent producer; records delivery reports and error callbacks."""

    def __init__(self, bs: str) -> None:
        self.errors: Counter[str] = Counter()
        self.fatal: list[str] = []
        self.epoch_bumps = 0  # librdkafka's own (client-side) epoch bumps, from its "eos" debug log
        self.last_pid = ""
        log = logging.getLogger(f"rdkafka.{id(self)}")
        log.propagate = False
        log.setLevel(logging.DEBUG)
        log.addHandler(_CallbackHandler(self._on_log))
        self.producer = CKProducer({"bootstrap.servers": bs, "enable.idempotence": True, "acks": "all",
                                    "linger.ms": 5, "message.timeout.ms": 20000, "error_cb": self._on_error,
                                    "reconnect.backoff.max.ms": 1000, "debug": "eos", "logger": log})

    def _on_log(self, msg: str) -> None:
        if "bumped epoch to" in msg:
            self.epoch_bumps += 1
            self.last_pid = msg.rsplit("bumped epoch to", 1)[1].strip()

    def _on_error(self, err: CKError) -> None:
        key = f"{err.name()} fatal={err.fatal()}: {err.str()[:100]}"
        self.errors[key] += 1
        if err.fatal():
            self.fatal.append(key)

    def send(self, start: int, n: int, timeout_s: float = 25.0) -> dict[str, Any]:
        outcome: Counter[str] = Counter()
        acked: list[tuple[int, int, bytes]] = []

        def report(err: CKError | None, msg: Any) -> None:
            if err is None:
                outcome["acked"] += 1
                acked.append((msg.partition(), msg.offset(), msg.value()))
            else:
                outcome[f"delivery failed {err.name()} fatal={err.fatal()}"] += 1

        for i in range(start, start + n):
            try:
                self.producer.produce(TOPIC, key=b"c%d" % i, value=b"c%d" % i, on_delivery=report)
            except Exception as e:
                outcome[f"produce() raised {type(e).__name__}: {str(e)[:80]}"] += 1
        remaining = self.producer.flush(timeout_s)
        if remaining:
            outcome["still queued after flush"] += remaining
        return {"outcome": dict(outcome), "acked": acked, "error_cb": dict(self.errors), "fatal": list(self.fatal),
                "epoch_bumps_so_far": self.epoch_bumps, "last_bump": self.last_pid}


def topic_meta(bs: str) -> dict[str, Any]:
    """Topic id and partition count from a metadata request that does not auto-create the topic."""
    admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=5000)
    try:
        if TOPIC not in admin.list_topics():
            return {"exists": False}
        d = admin.describe_topics([TOPIC])[0]
        return {"exists": True, "topic_id": str(d["topic_id"]), "partitions": len(d["partitions"])}
    finally:
        admin.close()


def committed(bs: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=5000)
    try:
        offsets = admin.list_group_offsets({GROUP: None})[GROUP]
        return {tp.partition: int(om.offset) for tp, om in offsets.items() if tp.topic == TOPIC}
    finally:
        admin.close()


def read_all(bs: str, partitions: int, timeout_s: float = 30.0) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition, read until each position reaches the fetched highwater."""
    c = KafkaConsumer(bootstrap_servers=bs, enable_auto_commit=False, auto_offset_reset="earliest",
                      allow_auto_create_topics=False, fetch_max_wait_ms=200)
    try:
        tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)  # not seek_to_beginning(): Tansu's ListOffsets answers are not reliable
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for tp, recs in c.poll(500).items():
                out[tp.partition] += [(r.offset, r.value) for r in recs]
            hw = [c.highwater(tp) for tp in tps]
            if all(h is not None and c.position(tp) >= h for tp, h in zip(tps, hw, strict=True)):
                return out
        raise TimeoutError(f"read_all: positions {[c.position(tp) for tp in tps]} highwater {hw}")
    finally:
        c.close()


def consumer(bs: str) -> KafkaConsumer:
    return KafkaConsumer(TOPIC, bootstrap_servers=bs, group_id=GROUP, enable_auto_commit=False,
                         auto_offset_reset="earliest", session_timeout_ms=6000, heartbeat_interval_ms=1000,
                         request_timeout_ms=7000, max_poll_records=100, fetch_max_wait_ms=200,
                         reconnect_backoff_max_ms=1000)


@contextlib.contextmanager
def plain_s3rver(workdir: Path) -> Iterator[None]:
    """Unpatched s3rver 3.7.1 (no conditional writes) with Tansu's AWS_* variables set in this process."""
    port = free_port()
    data = workdir / "plain-s3"
    data.mkdir()
    proc = subprocess.Popen([node_binary(), str(find_s3rver() / "bin" / "s3rver.js"), "-d", str(data), "-a",
                             "127.0.0.1", "-p", str(port), "--silent", "--configure-bucket", "tansu"],
                            start_new_session=True, stdout=subprocess.DEVNULL)
    probe = S3rver(data, port=port)
    saved = dict(os.environ)
    try:
        wait_for(probe._bucket_answers, 30, "plain s3rver")  # noqa: SLF001
        os.environ.update(probe.aws_env())
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        proc.terminate()
        proc.wait()


@contextlib.contextmanager
def broker_for(storage: str, workdir: Path) -> Iterator[EmbeddedBroker]:
    """``memory``, ``s3`` (EmbeddedBroker's s3rver, with conditional writes) or ``s3-plain`` (unpatched s3rver)."""
    log = workdir / "tansu.log"
    if storage == "memory":
        with EmbeddedBroker(log_path=log) as b:
            yield b
    elif storage == "s3":
        with EmbeddedBroker(storage="s3", data_dir=workdir / "s3", log_path=log) as b:
            yield b
    else:
        with plain_s3rver(workdir), EmbeddedBroker(storage="s3://tansu/", log_path=log) as b:
            yield b


def scenario_restart(storage: str, hard: bool, workdir: Path) -> dict[str, Any]:
    cap = KafkaLogCapture()
    res: dict[str, Any] = {"scenario": "restart", "storage": storage, "restart": "kill -9" if hard else "SIGTERM"}
    with broker_for(storage, workdir) as b:
        bs = b.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        old_kp = kp_producer(bs)
        before_kp = kp_send(old_kp, 0, 1000)
        ck = CKProbe(bs)
        before_ck = ck.send(0, 200)
        cons = consumer(bs)
        got = 0
        deadline = time.monotonic() + 60
        while got < 600 and time.monotonic() < deadline:
            got += sum(len(v) for v in cons.poll(500, max_records=min(100, 600 - got)).values())
        cons.commit()
        res["before"] = {"topic": topic_meta(bs), "committed": committed(bs),
                         "kafka_python_acked": before_kp["outcome"], "confluent_acked": before_ck["outcome"]}
        records_before = read_all(bs, PARTITIONS)
        res["before"]["records"] = {p: len(v) for p, v in records_before.items()}

        logging.getLogger("kafka").addHandler(cap)
        res["restart_to_metadata_s"] = round(b.restart(hard=hard), 3)
        res["after"] = {"topic_before_any_client_request": topic_meta(bs)}
        res["after"]["committed"] = committed(bs)
        kp_after = kp_send(old_kp, 1000, 100)
        res["after"]["old_kafka_python_producer"] = {k: v for k, v in kp_after.items() if k != "acked"}
        # a later send on the same producer: does it ever recover?
        time.sleep(2)  # a pause before probing again, not an assertion
        kp_later = kp_send(old_kp, 1100, 10, timeout_s=10)
        res["after"]["old_kafka_python_producer_2s_later"] = {k: v for k, v in kp_later.items() if k != "acked"}
        ck_after = ck.send(200, 100)
        res["after"]["old_confluent_producer"] = {k: v for k, v in ck_after.items() if k != "acked"}
        ck_later = ck.send(300, 10, timeout_s=10)
        res["after"]["old_confluent_producer_later"] = {k: v for k, v in ck_later.items() if k != "acked"}
        fresh = kp_producer(bs)
        fresh_after = kp_send(fresh, 2000, 100)
        res["after"]["fresh_kafka_python_producer"] = {k: v for k, v in fresh_after.items() if k != "acked"}
        fresh_ck = CKProbe(bs)
        fresh_ck_after = fresh_ck.send(1000, 100)
        res["after"]["fresh_confluent_producer"] = {k: v for k, v in fresh_ck_after.items() if k != "acked"}
        meta_after = topic_meta(bs)
        res["after"]["topic_after_clients"] = meta_after
        # the old consumer: does it rejoin and resume from the committed offset?
        first: dict[int, int] = {}
        t0 = time.monotonic()
        deadline = t0 + 40
        while time.monotonic() < deadline and len(first) < meta_after.get("partitions", PARTITIONS):
            for tp, recs in cons.poll(500).items():
                if recs and tp.partition not in first:
                    first[tp.partition] = recs[0].offset
        res["after"]["old_consumer"] = {"first_offset_per_partition": first,
                                        "assignment": sorted(tp.partition for tp in cons.assignment()),
                                        "seconds_to_records": round(time.monotonic() - t0, 2)}
        cons.close()
        # every acknowledged record present?
        parts = meta_after.get("partitions", PARTITIONS)
        records_after = read_all(bs, parts)
        present = {(p, o, v) for p, recs in records_after.items() for o, v in recs}
        acked_before = {(p, o, v) for p, o, v in before_kp["acked"] + before_ck["acked"]}
        acked_after = {(p, o, v) for p, o, v in kp_after["acked"] + kp_later["acked"] + ck_after["acked"]
                       + ck_later["acked"] + fresh_after["acked"] + fresh_ck_after["acked"]}
        values = Counter(v for recs in records_after.values() for _o, v in recs)
        res["after"]["records"] = {p: len(v) for p, v in records_after.items()}
        res["after"]["acked_before_restart_present"] = f"{len(acked_before & present)}/{len(acked_before)}"
        res["after"]["acked_after_restart_present"] = f"{len(acked_after & present)}/{len(acked_after)}"
        res["after"]["duplicated_values"] = sum(1 for n in values.values() if n > 1)
        old_kp.close(timeout=5)
        fresh.close(timeout=5)
    logging.getLogger("kafka").removeHandler(cap)
    res["kafka_python_log_lines"] = dict(cap.lines.most_common(12))
    return res


def _ranges(values: list[int]) -> list[str]:
    out: list[str] = []
    for v in values:
        if out and int(out[-1].split("-")[-1]) == v - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{v}"
        else:
            out.append(str(v))
    return out[:10]


def scenario_mid_produce(storage: str, workdir: Path, idempotent: bool = True) -> dict[str, Any]:
    """kill -9 while a kafka-python producer has batches in flight; then a fresh producer."""
    cap = KafkaLogCapture()
    res: dict[str, Any] = {"scenario": "mid-produce kill -9", "storage": storage, "idempotent": idempotent}
    with broker_for(storage, workdir) as b:
        bs = b.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        old = kp_producer(bs, idempotent)
        acked: list[tuple[int, int, bytes]] = []
        failed: Counter[str] = Counter()
        stop = threading.Event()
        lock = threading.Lock()

        def on_ok(i: int) -> Callable[[Any], None]:
            def cb(md: Any) -> None:
                with lock:
                    acked.append((md.partition, md.offset, b"v%d" % i))
            return cb

        def on_err(e: Exception) -> None:
            with lock:
                failed[f"{type(e).__name__}: {str(e)[:90]}"] += 1

        def pump() -> None:
            i = 0
            while not stop.is_set():
                try:
                    old.send(TOPIC, key=b"k%d" % i, value=b"v%d" % i).add_callback(on_ok(i)).add_errback(on_err)
                except Exception as e:
                    on_err(e)
                    time.sleep(0.05)
                i += 1
                if i % 50 == 0:
                    time.sleep(0.01)  # ~ a few thousand records/s

        logging.getLogger("kafka").addHandler(cap)
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        wait_for(lambda: len(acked) >= 2000, 60, "2,000 acknowledged records")
        with lock:
            acked_at_kill = len(acked)
            acked_before = set(acked)
        res["restart_to_metadata_s"] = round(b.restart(hard=True), 3)
        time.sleep(8)  # let the old producer run into whatever it runs into (observation window)
        stop.set()
        t.join()
        try:
            old.flush(timeout=25)
        except Exception as e:
            failed[f"flush raised {type(e).__name__}"] += 1
        tm = old._transaction_manager  # noqa: SLF001
        res["old_producer"] = {"acked_before_kill": acked_at_kill, "acked_total": len(acked),
                               "acked_after_kill": len(acked) - acked_at_kill, "failed": dict(failed),
                               "fatal": bool(tm.has_fatal_error()) if tm else None,
                               "state": str(tm.producer_id_and_epoch) if tm else None}
        fresh = kp_producer(bs, idempotent)
        fr = kp_send(fresh, 10_000_000, 500)
        res["fresh_producer"] = {k: v for k, v in fr.items() if k != "acked"}
        parts = topic_meta(bs).get("partitions", PARTITIONS)
        records = read_all(bs, parts)
        present = {(p, o, v) for p, recs in records.items() for o, v in recs}
        all_acked = set(acked) | set(fr["acked"])
        values = Counter(v for recs in records.values() for _o, v in recs)
        offsets_ok = all(recs[i][0] < recs[i + 1][0] for recs in records.values() for i in range(len(recs) - 1))
        gaps = {p: sum(1 for i in range(len(recs) - 1) if recs[i + 1][0] != recs[i][0] + 1)
                for p, recs in records.items()}
        present_values = {v for _p, _o, v in present}
        missing = sorted(int(v[1:]) for _p, _o, v in all_acked if v not in present_values)
        meta_file = workdir / "s3" / "tansu" / "clusters" / "tansu_cluster" / "meta.json._S3rver_object"
        if meta_file.exists() and idempotent:  # Tansu's own record of producer 1's sequences vs what it stored
            seqs = json.loads(meta_file.read_text())["producers"]["1"]["sequences"]["0"][TOPIC]
            stored = Counter(p for p, _o, v in present if int(v[1:]) < 10_000_000)
            res["old_producer_sequence_minus_stored"] = {int(p): n - stored[int(p)] for p, n in seqs.items()}
        res["check"] = {"acked_present": f"{len(all_acked & present)}/{len(all_acked)}",
                        "acked_values_missing": len(missing),
                        "acked_before_kill_missing": sum(1 for t in acked_before if t[2] not in present_values),
                        "acked_at_other_offset": sum(1 for t in all_acked - present if t[2] in present_values),
                        "acks_with_offset_below_0": sum(1 for t in all_acked if t[1] < 0),
                        "missing_with_ack_offset_below_0": sum(1 for t in all_acked
                                                               if t[2] not in present_values and t[1] < 0),
                        "missing_value_ranges": _ranges(missing),
                        "records_in_topic": len(present), "duplicated_values": sum(1 for n in values.values() if n > 1),
                        "offsets_increasing": offsets_ok, "offset_gaps_per_partition": gaps}
        old.close(timeout=5)
        fresh.close(timeout=5)
    logging.getLogger("kafka").removeHandler(cap)
    res["kafka_python_log_lines"] = dict(cap.lines.most_common(10))
    return res


def scenario_pid_reuse(storage: str, workdir: Path) -> dict[str, Any]:
    """An idle old producer and a fresh one after the restart: does the fresh one get the old producer id, and
    what happens to the old producer's next records (DUPLICATE_SEQUENCE_NUMBER counts as success)?"""
    res: dict[str, Any] = {"scenario": "producer-id reuse", "storage": storage}
    with broker_for(storage, workdir) as b:
        bs = b.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        old = kp_producer(bs)
        kp_send(old, 0, 500)
        b.restart(hard=True)
        fresh = kp_producer(bs)
        fr = kp_send(fresh, 10_000, 2000)
        od = kp_send(old, 500, 100)
        res["old_producer"] = od["state"]["producer_id_epoch"]
        res["fresh_producer"] = fr["state"]["producer_id_epoch"]
        res["old_producer_after"] = od["outcome"]
        parts = topic_meta(bs).get("partitions", PARTITIONS)
        present = {(p, o, v) for p, recs in read_all(bs, parts).items() for o, v in recs}
        res["old_producer_acked_present"] = f"{len(set(od['acked']) & present)}/{len(od['acked'])}"
        res["fresh_producer_acked_present"] = f"{len(set(fr['acked']) & present)}/{len(fr['acked'])}"
        old.close(timeout=5)
        fresh.close(timeout=5)
    return res


def scenario_auto_create(workdir: Path) -> dict[str, Any]:
    """Which clients recreate a missing topic through their metadata requests, and with how many partitions."""
    res: dict[str, Any] = {"scenario": "auto-create", "storage": "memory"}
    with broker_for("memory", workdir) as b:
        bs = b.bootstrap_servers
        c = KafkaConsumer("t-consumer-flag-off", bootstrap_servers=bs, group_id="ac", allow_auto_create_topics=False,
                          session_timeout_ms=6000)
        c.poll(1000)
        c.close()
        res["kafka_python_consumer allow_auto_create_topics=False"] = topic_meta_of(bs, "t-consumer-flag-off")
        c = KafkaConsumer(bootstrap_servers=bs, group_id="ac2", session_timeout_ms=6000)
        c._client.cluster.config["allow_auto_create_topics"] = False  # noqa: SLF001 - the workaround
        c.subscribe(["t-consumer-patched"])
        c.poll(1000)
        c.close()
        res["kafka_python_consumer cluster.config patched"] = topic_meta_of(bs, "t-consumer-patched")
        p = KafkaProducer(bootstrap_servers=bs, allow_auto_create_topics=False, max_block_ms=1500)
        with contextlib.suppress(Exception):
            p.send("t-producer-flag-off", b"x").get(timeout=5)
        p.close()
        res["kafka_python_producer allow_auto_create_topics=False"] = topic_meta_of(bs, "t-producer-flag-off")
        p = KafkaProducer(bootstrap_servers=bs, max_block_ms=1500)
        p._metadata.config["allow_auto_create_topics"] = False  # noqa: SLF001 - the workaround
        with contextlib.suppress(Exception):
            p.send("t-producer-patched", b"x").get(timeout=5)
        p.close()
        res["kafka_python_producer _metadata.config patched"] = topic_meta_of(bs, "t-producer-patched")
        ck = CKProducer({"bootstrap.servers": bs})
        ck.produce("t-confluent-producer-default", b"x")
        ck.flush(5)
        res["confluent_producer default"] = topic_meta_of(bs, "t-confluent-producer-default")
        ck = CKProducer({"bootstrap.servers": bs, "allow.auto.create.topics": False, "message.timeout.ms": 3000})
        ck.produce("t-confluent-producer-off", b"x")
        ck.flush(5)
        res["confluent_producer allow.auto.create.topics=false"] = topic_meta_of(bs, "t-confluent-producer-off")
    return res


def topic_meta_of(bs: str, topic: str) -> str:
    admin = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=5000)
    try:
        if topic not in admin.list_topics():
            return "not created"
        return f"created with {len(admin.describe_topics([topic])[0]['partitions'])} partitions"
    finally:
        admin.close()


def scenario_throughput(storage: str, workdir: Path, n: int) -> dict[str, Any]:
    """Records/s of an idempotent kafka-python producer (acks=all) and of reading the topic back, per storage."""
    with broker_for(storage, workdir) as b:
        bs = b.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        p = kp_producer(bs)
        payload = b"x" * 200
        t0 = time.monotonic()
        for i in range(n):
            p.send(TOPIC, key=b"%d" % i, value=payload)
        p.flush(timeout=300)
        produce_s = time.monotonic() - t0
        p.close(timeout=5)
        t0 = time.monotonic()
        got = sum(len(v) for v in read_all(bs, PARTITIONS, timeout_s=600).values())
        read_s = time.monotonic() - t0
        objects = (sum(1 for _ in (workdir / "s3").rglob("*.batch._S3rver_object"))
                   if storage == "s3" else None)  # s3-plain keeps its files elsewhere
    return {"scenario": "throughput", "storage": storage, "records": n, "read_back": got,
            "produce_records_per_s": round(n / produce_s), "read_records_per_s": round(got / read_s),
            "batch_objects": objects}


def scenario_consumer_positions(storage: str, workdir: Path) -> dict[str, Any]:
    """A kafka-python group member that consumed and committed everything stays alive across the restart; then
    400 new records are produced: which does it get, and what do its positions, highwaters and topic id say?"""
    res: dict[str, Any] = {"scenario": "consumer positions", "storage": storage}
    with broker_for(storage, workdir) as b:
        bs = b.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        kp_send(kp_producer(bs), 0, 200)
        c = consumer(bs)
        n = 0
        deadline = time.monotonic() + 60
        while n < 200 and time.monotonic() < deadline:
            n += sum(len(v) for v in c.poll(500).values())
        c.commit()
        cluster = c._client.cluster  # noqa: SLF001 - the topic id kafka-python caches
        res["before"] = {"topic_id": str(cluster.topic_id(TOPIC)),
                         "position": {tp.partition: c.position(tp) for tp in c.assignment()}}
        b.restart(hard=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 8:
            c.poll(300)
        tps = sorted(c.assignment())
        res["after_restart"] = {"topic_id": str(cluster.topic_id(TOPIC)), "assignment": [tp.partition for tp in tps],
                                "committed": {tp.partition: c.committed(tp) for tp in tps},
                                "position": {tp.partition: c.position(tp) for tp in tps},
                                "highwater": {tp.partition: c.highwater(tp) for tp in tps}}
        kp_send(kp_producer(bs), 1000, 400)
        got: list[tuple[int, int]] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 8:
            got += [(tp.partition, r.offset) for tp, recs in c.poll(300).items() for r in recs]
        tps = sorted(c.assignment())
        res["after_400_new_records"] = {"received": len(got),
                                        "first_offset": {p: min(o for q, o in got if q == p) for p in {q for q, _ in got}},
                                        "highwater": {tp.partition: c.highwater(tp) for tp in tps}}
        c.close()
    return res


def scenario_timing(storage: str, workdir: Path, runs: int) -> dict[str, Any]:
    """Seconds from spawning the restarted broker until metadata, and until a fresh producer's first ack."""
    to_meta, to_ack = [], []
    with broker_for(storage, workdir) as b:
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap_servers)
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)])
        admin.close()
        for _ in range(runs):
            t0 = time.monotonic()
            to_meta.append(b.restart(hard=True))
            p = kp_producer(b.bootstrap_servers)
            p.send(TOPIC, key=b"t", value=b"t").get(timeout=30)
            to_ack.append(time.monotonic() - t0)
            p.close(timeout=5)
    return {"scenario": "timing", "storage": storage, "runs": runs,
            "restart_to_metadata_s": [round(x, 3) for x in to_meta],
            "restart_to_first_ack_s": [round(x, 3) for x in to_ack]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--storage", nargs="+", default=["memory", "s3"], choices=["memory", "s3", "s3-plain"])
    ap.add_argument("--restart", nargs="+", default=["hard", "soft"], choices=["hard", "soft"])
    ap.add_argument("--mid-produce-runs", type=int, default=3)
    ap.add_argument("--mid-produce-idempotence", nargs="+", default=["on", "off"], choices=["on", "off"])
    ap.add_argument("--timing-runs", type=int, default=5)
    ap.add_argument("--only", nargs="+",
                    default=["restart", "mid-produce", "pid-reuse", "consumer-positions", "timing", "auto-create",
                             "throughput"])
    ap.add_argument("--throughput-records", type=int, default=32_561)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--workdir", type=Path, help="keep logs and data here (default: a temporary directory)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    results = []
    for storage_name in args.storage:
        storage = storage_name
        with tempfile.TemporaryDirectory(prefix="tansu-probe-") as tmp_dir:
            tmp = args.workdir / storage_name if args.workdir else Path(tmp_dir)
            tmp.mkdir(parents=True, exist_ok=True)
            if "restart" in args.only:
                for kind in args.restart:
                    work = Path(tmp) / f"restart-{kind}"
                    work.mkdir()
                    results.append(scenario_restart(storage, kind == "hard", work))
                    print(json.dumps(results[-1], default=str), flush=True)
            if "mid-produce" in args.only:
                for idem in args.mid_produce_idempotence:
                    for run in range(args.mid_produce_runs):
                        work = Path(tmp) / f"mid-{idem}-{run}"
                        work.mkdir()
                        results.append(scenario_mid_produce(storage, work, idem == "on"))
                        print(json.dumps(results[-1], default=str), flush=True)
            if "pid-reuse" in args.only:
                work = Path(tmp) / "pid-reuse"
                work.mkdir()
                results.append(scenario_pid_reuse(storage, work))
                print(json.dumps(results[-1], default=str), flush=True)
            if "consumer-positions" in args.only:
                work = Path(tmp) / "consumer-positions"
                work.mkdir()
                results.append(scenario_consumer_positions(storage, work))
                print(json.dumps(results[-1], default=str), flush=True)
            if "throughput" in args.only:
                work = Path(tmp) / "throughput"
                work.mkdir()
                results.append(scenario_throughput(storage, work, args.throughput_records))
                print(json.dumps(results[-1], default=str), flush=True)
            if "timing" in args.only and args.timing_runs:
                work = Path(tmp) / "timing"
                work.mkdir()
                results.append(scenario_timing(storage, work, args.timing_runs))
                print(json.dumps(results[-1], default=str), flush=True)
    if "auto-create" in args.only:
        with tempfile.TemporaryDirectory(prefix="tansu-probe-") as tmp_dir:
            results.append(scenario_auto_create(Path(tmp_dir)))
            print(json.dumps(results[-1], default=str), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
