"""The service as a user runs it, for the tests on both brokers (issue 17): its command line, the group's committed
offsets from a fresh client (the broker may be restarting), ``stream-anon audit`` as a subprocess, and the
release check (every input offset once, every promised output once, k and l by the independent verifier)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

from durable_broker import child_env
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.service.audit import OutputSnapshot, collect_outputs, send_flush_markers

K, L, DELTA, PARTITIONS = 5, 2, 300, 2
ROLES = ("anon", "suppressed", "dlq")


def topic_flags(prefix: str) -> list[str]:
    out = ["--input-topic", f"{prefix}.raw"]
    for role in ROLES:
        out += ["--set", f"topics.{role}={prefix}.{role}"]
    return out


def service_cmd(bs: str, prefix: str, extra: tuple[str, ...] = ()) -> list[str]:
    return [sys.executable, "-m", "stream_anon", "--log-level", "INFO", "run", "--bootstrap-servers", bs,
            *topic_flags(prefix), "--group-id", f"{prefix}-main", "--partitions", str(PARTITIONS), "--k", str(K),
            "--delta", str(DELTA), "--seed", "3", "--no-side-paths", "--metrics-port", "0",
            "--set", "kafka.session_timeout_ms=6000", "--set", "kafka.max_poll_interval_ms=20000",
            "--set", "kafka.request_timeout_ms=5000", "--set", "kafka.retry_backoff_max_seconds=2",
            "--set", "kafka.startup_retry_seconds=120", "--set", "service.commit_interval_ms=250",
            "--set", "service.producer_recovery_seconds=10", *extra]


def committed(bs: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets (0 where none), from a fresh client (the broker may be restarting)."""
    c = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False, request_timeout_ms=5000)
    try:
        out = {}
        for p in range(PARTITIONS):
            v = c.committed(TopicPartition(topic, p), timeout_ms=5000)
            out[p] = int(v) if v is not None else 0
        return out
    finally:
        c.close()


def end_markers(bs: str, topic: str, partitions: int = PARTITIONS) -> None:
    """One end-of-stream marker to each of ``topic``'s first ``partitions`` partitions, from a producer of its own."""
    producer = KafkaProducer(bootstrap_servers=bs)
    send_flush_markers(producer, topic, list(range(partitions)))
    producer.close()


def committed_total(bs: str, group: str, topic: str) -> int:
    try:
        return sum(committed(bs, group, topic).values())
    except Exception:  # the broker is restarting: not yet
        return -1


def drained(bs: str, group: str, topic: str, ends: dict[int, int]) -> bool:
    try:
        return committed(bs, group, topic) == ends
    except Exception:
        return False


def audit(bs: str, prefix: str) -> subprocess.CompletedProcess[str]:
    """``stream-anon audit`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "stream_anon", "audit", "--bootstrap-servers", bs,
                           *topic_flags(prefix)], capture_output=True, text=True, timeout=180, env=child_env())


def check_release(bs: str, prefix: str, ends: dict[int, int], adult: Any, *, markers: int = 1) -> OutputSnapshot:
    """Every input offset once, every promised output once, every ADULT id once, k (with coverage of the
    originals) and l verified by the independent verifier; ``markers`` end markers sent to each partition."""
    s = adult_schema()
    qis = [a.name for a in s.qis]
    snap = collect_outputs(bs, input_topic=f"{prefix}.raw", anon=f"{prefix}.anon", suppressed=f"{prefix}.suppressed",
                           dlq=f"{prefix}.dlq", qis=qis, sensitive=[a.name for a in s.sensitive], input_ends=ends)
    assert snap.ok, (snap.accounting.duplicates[:5], snap.accounting.missing[:5], snap.published, snap.problems)
    assert snap.control == markers * PARTITIONS
    out = snap.records
    assert len(out) == len(adult) and out.record_id.is_unique and set(out.record_id) == set(adult["id"])
    released = out[out.outcome == "released"]
    assert len(released) > 0.8 * len(adult)
    rep = verify_release_frame(released[["record_id", "class_id", *qis]].astype({"record_id": str}), qis, K,
                               schema=s, original=adult, original_id="id")
    assert rep.ok and rep.min_class_size >= K, str(rep)
    rep = verify_release_frame(snap.public, qis, K, L, "income", record_id=None, schema=s)
    assert rep.ok and rep.records == len(released), str(rep)
    return snap


def adult_rows(adult: Any) -> list[dict[str, Any]]:
    """The rows of an ADULT frame as plain dicts (what ``replay_records`` sends)."""
    return [dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
            for row in adult.itertuples(index=False, name=None)]
