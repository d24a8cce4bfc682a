#!/usr/bin/env python3
"""Probe: what Tansu does to a producer that writes through a topic's deletion (docs/tansu.md, "Deleting a topic
under a producer"; issue 18).

    PYTHONPATH=$PWD python scripts/tansu_topic_deletion_probe.py [--broker memory|s3]

Two scenarios on a fresh embedded broker each, confluent-kafka producers (idempotent, acks=all, no topic
auto-creation):

1. ``clean``: a producer writes 100 records and is flushed; the topic is deleted and created again; a fresh
   idempotent producer and a fresh non-idempotent one each write 100 records into the new topic.
2. ``through``: a producer writes continuously (one record every 2 ms); the topic is deleted under it (3 s), created
   again (5 s more), then the producer is flushed; a fresh idempotent producer and a fresh non-idempotent one write
   into the recreated topic.

Printed per step: acknowledgements (with and without an error), what a reader gets back (records, the highwater),
whose records they are.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from typing import Any

import confluent_kafka
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from stream_anon.kafka_io.broker import DURABLE_STORAGE, MEMORY_STORAGE, EmbeddedBroker

TOPIC = "t"


def producer(bs: str, idempotent: bool = True) -> confluent_kafka.Producer:
    return confluent_kafka.Producer({"bootstrap.servers": bs, "enable.idempotence": idempotent, "acks": "all",
                                     "linger.ms": 5, "allow.auto.create.topics": False, "message.timeout.ms": 15000})


def produce(bs: str, prefix: bytes, n: int, idempotent: bool = True) -> dict[str, Any]:
    acks: dict[str, Any] = {"ok": 0, "error": 0, "last_error": None}

    def cb(err: Any, msg: Any) -> None:
        if err is not None:
            acks["error"] += 1
            acks["last_error"] = err.name()
        else:
            acks["ok"] += 1

    p = producer(bs, idempotent)
    for i in range(n):
        p.produce(TOPIC, b"%s%d" % (prefix, i), callback=cb)
    p.flush(20)
    return acks


def stored(bs: str) -> dict[str, Any]:
    """What a reader gets back from the topic: records (by their writer's prefix) and the highwater."""
    c = KafkaConsumer(bootstrap_servers=bs, group_id=None, auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        if not c.partitions_for_topic(TOPIC):
            return {"topic": "gone"}
        tp = TopicPartition(TOPIC, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        values: list[bytes] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            values += [r.value for r in c.poll(300).get(tp, [])]
        by: dict[str, int] = {}
        for v in values:
            by[v[:1].decode()] = by.get(v[:1].decode(), 0) + 1
        return {"records": len(values), "highwater": c.highwater(tp), "by_writer": by}
    finally:
        c.close()


def clean(bs: str, admin: KafkaAdminClient) -> dict[str, Any]:
    out: dict[str, Any] = {"first producer (a)": produce(bs, b"a", 100), "stored": stored(bs)}
    admin.delete_topics([TOPIC])
    time.sleep(1)
    admin.create_topics([NewTopic(TOPIC, 1, 1)])
    time.sleep(1)
    out["fresh idempotent producer (b)"] = produce(bs, b"b", 100)
    out["fresh non-idempotent producer (c)"] = produce(bs, b"c", 100, idempotent=False)
    out["stored after"] = stored(bs)
    return out


def through(bs: str, admin: KafkaAdminClient) -> dict[str, Any]:
    acks = {"ok": 0, "error": 0}

    def cb(err: Any, msg: Any) -> None:
        acks["error" if err is not None else "ok"] += 1

    p = producer(bs)
    stop = threading.Event()
    sent = [0]

    def run() -> None:
        while not stop.is_set():
            try:
                p.produce(TOPIC, b"v%d" % sent[0], callback=cb)
                sent[0] += 1
            except BufferError:
                pass
            p.poll(0)
            time.sleep(0.002)

    th = threading.Thread(target=run)
    th.start()
    time.sleep(2)
    out: dict[str, Any] = {"before the deletion": {"sent": sent[0], **acks, "stored": stored(bs)}}
    admin.delete_topics([TOPIC])
    time.sleep(3)
    out["3 s after the deletion"] = {"sent": sent[0], **acks, "stored": stored(bs)}
    admin.create_topics([NewTopic(TOPIC, 1, 1)])
    time.sleep(5)
    stop.set()
    th.join()
    p.flush(25)
    out["recreated, the old producer flushed"] = {"sent": sent[0], **acks, "stored": stored(bs)}
    out["fresh idempotent producer (w)"] = produce(bs, b"w", 100)
    out["fresh non-idempotent producer (x)"] = produce(bs, b"x", 100, idempotent=False)
    out["stored after"] = stored(bs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--broker", choices=["memory", "s3"], default="memory")
    args = ap.parse_args()
    for name, scenario in (("clean", clean), ("through", through)):
        storage = MEMORY_STORAGE if args.broker == "memory" else DURABLE_STORAGE
        with EmbeddedBroker(storage=storage) as b:
            admin = KafkaAdminClient(bootstrap_servers=b.bootstrap_servers)
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
            print(json.dumps({"scenario": name, **scenario(b.bootstrap_servers, admin)}, indent=1))
            admin.close()


if __name__ == "__main__":
    main()
