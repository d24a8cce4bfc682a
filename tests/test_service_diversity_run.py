"""``stream-anon run`` (the real process, a real broker) with a diversity model that is not the default:
recursive (4, 2)-diversity and 0.15-closeness.  Every class message on the public topic states that model and
the reference it was checked against, and satisfies it (recomputed here from the message alone); the gate and the
engine agree on every class (no refusal); every input is accounted once; verify passes the public table."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from stream_anon.core.datasets import iter_adult_records
from stream_anon.core.diversity import DiversityRequirement
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.formats.release import decode_class_message
from stream_anon.service.audit import collect_outputs, read_topic_with_headers, send_flush_markers

N, K, DELTA = 4000, 5, 300
MODEL = DiversityRequirement(model="recursive", c=4, l=2, t=0.15)


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_run_with_recursive_diversity_and_t_closeness(broker: Any, adult_path: Path, tmp_path: Path) -> None:
    bs = broker.bootstrap_servers
    prefix = f"div{uuid.uuid4().hex[:6]}"
    topics = {"input": f"{prefix}.raw", "anon": f"{prefix}.anon", "suppressed": f"{prefix}.suppressed",
              "dlq": f"{prefix}.dlq"}
    producer = KafkaProducer(bootstrap_servers=bs, linger_ms=20)
    for i, rec in enumerate(iter_adult_records(adult_path)):
        if i == N:
            break
        producer.send(topics["input"], value=json.dumps(rec).encode(), partition=0)
    producer.flush()
    send_flush_markers(producer, topics["input"], [0])
    producer.close()

    log = tmp_path / "run.log"
    group = f"{prefix}-main"
    cmd = [sys.executable, "-m", "stream_anon", "--log-level", "INFO", "run", "--bootstrap-servers", bs,
           "--no-side-paths", "--metrics-port", "0", "--group-id", group, "--k", str(K), "--delta", str(DELTA),
           "--seed", "4", "--diversity", "recursive", "--c", "4", "--l", "2", "--t-closeness", "0.15",
           "--set", "service.commit_interval_ms=200", "--set", "kafka.session_timeout_ms=6000"]
    for role, name in topics.items():
        cmd += ["--set", f"topics.{role}={name}"]
    proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    monitor = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + 180
        while (monitor.committed(TopicPartition(topics["input"], 0)) or 0) < N + 1:  # records + the end marker
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        text = log.read_text()
        assert "recursive (4, 2)-diversity and 0.15-closeness (equal distance)" in text  # the start line says it
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        monitor.close()
    assert rc == 0, log.read_text()[-3000:]

    schema = adult_schema()
    qis = [a.name for a in schema.qis]
    snap = collect_outputs(bs, input_topic=topics["input"], anon=topics["anon"], suppressed=topics["suppressed"],
                           dlq=topics["dlq"], qis=qis, sensitive=["income"], input_ends={0: N + 1})
    assert snap.ok, (snap.accounting, snap.problems)
    assert snap.suppressed_reasons.get("gate", 0) == 0  # the engine formed only classes the gate accepts
    released = int((snap.records.outcome == "released").sum())
    assert released > 0.9 * N
    classes = [decode_class_message(m.value) for m in read_topic_with_headers(bs, topics["anon"])]
    assert len(classes) == snap.classes > 100
    for c in classes:
        assert c.requirement() == MODEL and c.l == 2
        ref = c.reference()
        assert ref is not None and sum(ref.values()) % DELTA == 0  # a snapshot (every delta arrivals)
        counts = {v[0]: n for v, n in c.counts}
        assert MODEL.satisfied(counts, ref), (counts, ref)
    rep = verify_release_frame(snap.public, qis, K, None, "income", record_id=None, schema=schema, requirement=MODEL,
                               references=snap.references)
    assert rep.ok, str(rep)
