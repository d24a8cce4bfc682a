"""Read the main path's output topics back and account for every input record (demo, tests, benchmarks).

``collect_outputs`` reads ``anon``, ``suppressed`` and ``dlq`` from the beginning and flattens them into
one row per accounted input record (source partition/offset, record id, outcome, class, generalized QIs,
sensitive value, delays).  ``send_flush_markers`` appends the end-of-stream control message to every
input partition (the service then releases or suppresses what it still buffers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from stream_anon.service.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.service.pipeline import H_REASON, H_SRC_OFFSET, H_SRC_PARTITION


def send_flush_markers(producer: KafkaProducer, topic: str, partitions: Sequence[int]) -> None:
    """Append the end-of-stream control message (header ``stream-anon-control: flush``) to each partition."""
    for p in partitions:
        producer.send(topic, value=b"", partition=p, headers=[(CONTROL_HEADER, CONTROL_FLUSH)])
    producer.flush()


@dataclass
class OutputSnapshot:
    """Every output message read, flattened: ``records`` has one row per accounted input record."""

    records: pd.DataFrame
    classes: int = 0
    messages: dict[str, int] = field(default_factory=dict)
    dlq_reasons: dict[str, int] = field(default_factory=dict)
    dlq_values: list[tuple[int, int, str, bytes]] = field(default_factory=list)  # (partition, offset, reason, bytes)


def read_topic_with_headers(bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0, idle_s: float = 1.0,
                            client_options: dict[str, Any] | None = None) -> list[Any]:
    """All messages of ``topic`` (ConsumerRecords), reading until every partition reached its highwater."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_bytes=32 * 1024 * 1024,
                             max_partition_fetch_bytes=8 * 1024 * 1024, **(client_options or {}))
    try:
        deadline = time.monotonic() + timeout_s
        parts = consumer.partitions_for_topic(topic)
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200, max_records=20000)
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


def collect_outputs(bootstrap_servers: str, *, anon: str, suppressed: str, dlq: str, qis: Sequence[str],
                    sensitive: Sequence[str], timeout_s: float = 60.0, idle_s: float = 0.3,
                    client_options: dict[str, Any] | None = None) -> OutputSnapshot:
    rows: list[dict[str, Any]] = []
    snap = OutputSnapshot(records=pd.DataFrame())
    for role, topic in (("anon", anon), ("suppressed", suppressed)):
        msgs = read_topic_with_headers(bootstrap_servers, topic, timeout_s=timeout_s, idle_s=idle_s,
                                       client_options=client_options)
        snap.messages[role] = len(msgs)
        for m in msgs:
            body = json.loads(m.value)
            if role == "anon":
                snap.classes += 1
            gen = body.get("generalized", {})
            for r in body["records"]:
                row: dict[str, Any] = {
                    "src_partition": body["src_partition"], "src_offset": r["src_offset"],
                    "record_id": r["record_id"], "outcome": "released" if role == "anon" else "suppressed",
                    "class_id": body.get("class_id"), "class_loss": body.get("loss"),
                    "class_size": body.get("size"), "delay": r["delay"], "position_delay": r["position_delay"],
                    "release_offset": body["release_offset"], "reused": body.get("reused", False),
                    "latency_s": r.get("latency_s"),
                }
                for q in qis:
                    row[q] = gen.get(q)
                for s in sensitive:
                    row[s] = r.get(s)
                rows.append(row)
    msgs = read_topic_with_headers(bootstrap_servers, dlq, timeout_s=timeout_s, idle_s=idle_s,
                                  client_options=client_options)
    snap.messages["dlq"] = len(msgs)
    for m in msgs:
        h = dict(m.headers or ())
        reason = h.get(H_REASON, b"?").decode()
        snap.dlq_reasons[reason] = snap.dlq_reasons.get(reason, 0) + 1
        part, off = int(h[H_SRC_PARTITION]), int(h[H_SRC_OFFSET])
        snap.dlq_values.append((part, off, reason, m.value))
        rows.append({"src_partition": part, "src_offset": off, "record_id": m.key.decode(errors="replace")
                     if m.key else None, "outcome": "dlq", "class_id": None})
    snap.records = pd.DataFrame(rows)
    return snap
