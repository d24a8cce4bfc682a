"""Honest counts (issue 18 item 6): ``stream-anon audit`` tells offsets that hold no record (gaps the broker left)
from records that were lost, through the real processes, on Tansu and Apache Kafka.

The input is written by a transactional producer: every commit puts a control marker at an offset of its own, which
no consumer ever returns (the same kind of hole a durable Tansu killed between a partition's end and its batch, or a
full disk, leaves).  The service accounts for every record; the audit must say OK and name the offsets without a
record as gaps (before: "NOT ACCOUNTED ... NOT OK").  Then records arrive that the service never processes (it is
stopped): the audit must call those not accounted and say NOT OK.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from reliability_support import ServiceProcess, audit, committed, record_figures, service_cmd, wait_for

from stream_anon.core.datasets import read_adult
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.replay.kafka_replay import ensure_topic, topic_ends

PARTITIONS = 2
TRANSACTIONS = 12
PER_TRANSACTION = 250


def transactional_input(bs: str, topic: str, records: list[dict[str, Any]]) -> int:
    """``records`` in ``TRANSACTIONS`` committed transactions (round-robin over the partitions), then one end
    marker per partition outside any transaction; returns the number of commit markers written."""
    ensure_topic(bs, topic, PARTITIONS)
    p = confluent_kafka.Producer({"bootstrap.servers": bs, "transactional.id": f"audit-{uuid.uuid4().hex[:8]}",
                                  "enable.idempotence": True, "acks": "all"})
    p.init_transactions(30)
    markers = 0
    for t in range(TRANSACTIONS):
        p.begin_transaction()
        touched = set()
        for i, rec in enumerate(records[t * PER_TRANSACTION:(t + 1) * PER_TRANSACTION]):
            part = (t + i) % PARTITIONS
            touched.add(part)
            p.produce(topic, json.dumps(rec).encode(), rec["id"].encode(), part)
        p.commit_transaction(30)
        markers += len(touched)
    plain = confluent_kafka.Producer({"bootstrap.servers": bs, "acks": "all"})
    for part in range(PARTITIONS):
        plain.produce(topic, b"", None, part, headers=[(CONTROL_HEADER, CONTROL_FLUSH)])
    assert plain.flush(30) == 0
    return markers


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_audit_tells_gaps_from_lost_records(any_broker: Any, adult_path: Path, tmp_path: Path) -> None:
    bs = any_broker.bootstrap_servers
    prefix = f"gap{uuid.uuid4().hex[:6]}"
    adult = read_adult(adult_path).head(TRANSACTIONS * PER_TRANSACTION + 100)
    records = [dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
               for row in adult.itertuples(index=False, name=None)]
    markers = transactional_input(bs, f"{prefix}.raw", records)
    ends = topic_ends(bs, f"{prefix}.raw")
    assert sum(ends.values()) == TRANSACTIONS * PER_TRANSACTION + PARTITIONS + markers  # the markers take offsets
    with ServiceProcess(service_cmd(bs, prefix), tmp_path / "run.log") as svc:
        wait_for("drained", lambda: committed(bs, f"{prefix}-main", f"{prefix}.raw", PARTITIONS) == ends, svc, 300)
        rc, stop_s = svc.stop()
    assert rc == 0, svc.text()[-3000:]
    t0 = time.monotonic()
    res = audit(bs, prefix)
    audit_s = time.monotonic() - t0
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert f"no record at {markers} offsets (gaps the broker left" in out, out
    assert "NOT ACCOUNTED" not in out and out.rstrip().endswith("every promised output published exactly once"), out
    # records the service never processed are not gaps: not accounted, NOT OK
    extra = confluent_kafka.Producer({"bootstrap.servers": bs, "acks": "all"})
    for rec in records[-5:]:
        extra.produce(f"{prefix}.raw", json.dumps(rec).encode(), rec["id"].encode(), 0)
    assert extra.flush(30) == 0
    res = audit(bs, prefix)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "NOT ACCOUNTED: 5 offsets hold input records that no ledger entry accounts for" in res.stdout, res.stdout
    assert f"no record at {markers} offsets" in res.stdout and res.stdout.rstrip().endswith("NOT OK")
    record_figures("audit: transaction markers (gaps) and 5 records never processed", any_broker.name,
                   records_in=TRANSACTIONS * PER_TRANSACTION, gaps_reported=markers, not_accounted_reported=5,
                   audit_s=round(audit_s, 1), stop_s=round(stop_s, 1))
