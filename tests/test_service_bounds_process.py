"""The crash loop of issue 18 item 1 through the real process: valid input that used to make messages over the
broker's limit (exit 1 within seconds, again on every restart) now runs through, every input offset accounted.

- 3,000 valid ADULT records with 20 KB record ids and a skewed sensitive value: l-diversity makes CASTLE merge
  hundreds of records into one class, whose ledger entry lists every member's id (15 MB for 756 members).
- ``dlq.payload: raw`` and one bad record with a 3.5 MB key: its dead letter would carry the key whole.

``stream-anon run`` (real subprocess) must not exit; then ``stream-anon audit`` (real subprocess) must say OK.  On
Tansu (which reports no limit: Kafka's default 1,048,588 bytes is used) and on Apache Kafka (its limits read with
DescribeConfigs; the input topic there allows 8 MiB so that the 3.5 MB key gets in, and the dead-letter topic only
256 KiB: the dead letter is cut to that).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from reliability_support import (
    ServiceProcess,
    audit,
    drained,
    outcome,
    record_figures,
    service_cmd,
    wait_for,
)

from stream_anon.core.datasets import read_adult
from stream_anon.service.audit import send_flush_markers

PARTITIONS = 2


def skewed_rows(adult_path: Path, n: int, id_bytes: int) -> list[dict[str, Any]]:
    """``n`` ADULT records with ids of ``id_bytes`` characters and 97 % of them ``<=50K``."""
    adult = read_adult(adult_path).head(n)
    rows = []
    for i, row in enumerate(adult.itertuples(index=False, name=None)):
        rec = dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
        rec["id"] = f"{rec['id']}-" + "x" * (id_bytes - len(rec["id"]) - 1)
        rec["income"] = ">50K" if i % 33 == 0 else "<=50K"
        rows.append(rec)
    return rows


def create(bs: str, topic: str, **configs: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1, topic_configs=configs)])
    finally:
        admin.close()


def send(bs: str, topic: str, messages: list[tuple[bytes | None, bytes]]) -> dict[int, int]:
    """Send (key, value) to ``topic`` (partition by key), then one end marker per partition; the end offsets."""
    from stream_anon.replay.kafka_replay import ensure_topic
    ensure_topic(bs, topic, PARTITIONS)
    p = KafkaProducer(bootstrap_servers=bs, acks="all", max_request_size=8 * 1024 * 1024, linger_ms=20)
    ends: dict[int, int] = {}
    futures = [p.send(topic, key=k, value=v, partition=i % PARTITIONS) for i, (k, v) in enumerate(messages)]
    p.flush()
    for f in futures:
        md = f.get(timeout=60)
        ends[md.partition] = max(ends.get(md.partition, 0), md.offset + 1)
    send_flush_markers(p, topic, list(range(PARTITIONS)))
    p.close()
    return {q: ends.get(q, 0) + 1 for q in range(PARTITIONS)}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_large_classes_of_long_ids_no_longer_crash_loop(any_broker: Any, adult_path: Path, tmp_path: Path) -> None:
    import json
    bs = any_broker.bootstrap_servers
    prefix = f"big{uuid.uuid4().hex[:6]}"
    rows = skewed_rows(adult_path, 3000, 20_000)
    ends = send(bs, f"{prefix}.raw", [(r["id"].encode(), json.dumps(r).encode()) for r in rows])
    # the configuration: l = 2 without t-closeness (the service's default then; with t = 0.2 the largest
    # class of this input has 54 records, 1 MB of ids: still over Kafka's default limit, chunked the same way)
    with ServiceProcess(service_cmd(bs, prefix, "--l", "2", "--set", "anonymization.t_closeness=null"),
                        tmp_path / "run.log") as svc:
        waited = wait_for("the backlog drained", drained(bs, prefix, ends), svc, 600)
        svc.assert_alive()
        rc, stop_s = svc.stop()
    text = svc.text()
    assert rc == 0, text[-3000:]
    assert "MSG_SIZE_TOO_LARGE" not in text and "Traceback" not in text
    res = audit(bs, prefix)
    assert res.returncode == 0 and res.stdout.rstrip().endswith("OK: every input offset accounted exactly once, "
                                                                 "every promised output published exactly once"), \
        res.stdout + res.stderr
    assert "written in chunks" in res.stdout, res.stdout  # the large class entries went to the ledger in chunks
    got = outcome(bs, prefix, ends, k=10, l=2)
    assert (got["lost"], got["duplicated"], got["k_violations"]) == (0, 0, 0)
    assert got["snapshot"].public.groupby("class_id").size().max() > 100  # l-diversity did merge large classes
    reported = ("max.message.bytes 1,048,588 of " if any_broker.name == "apache-kafka"
                else "the broker reports no limit: Kafka's default 1,048,588")
    assert f"every message written stays within 1,048,588 bytes ({reported}" in text, text[:3000]
    record_figures("3,000 records, 20 KB ids, skewed income (l=2)", any_broker.name, records_in=len(rows),
                   lost=got["lost"],
                   duplicated=got["duplicated"], k_violations=got["k_violations"], drained_s=round(waited, 1),
                   exit="none (still running)", stop_s=round(stop_s, 1), audit=res.stdout.splitlines()[:3])


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_raw_dead_letter_of_a_3_5_mb_key_is_cut_to_the_bound(any_broker: Any, adult_path: Path,
                                                              tmp_path: Path) -> None:
    import json
    bs = any_broker.bootstrap_servers
    prefix = f"key{uuid.uuid4().hex[:6]}"
    kafka = any_broker.name == "apache-kafka"
    if kafka:  # the input lets a 3.5 MB key in; the dead-letter topic takes 256 KiB at most
        create(bs, f"{prefix}.raw", **{"max.message.bytes": str(8 * 1024 * 1024)})
        create(bs, f"{prefix}.dlq", **{"max.message.bytes": str(256 * 1024)})
    bound = 256 * 1024 if kafka else 1_048_588
    rows = skewed_rows(adult_path, 200, 12)
    msgs: list[tuple[bytes | None, bytes]] = [(r["id"].encode(), json.dumps(r).encode()) for r in rows]
    msgs.insert(50, (b"K" * 3_500_000, b"not json"))
    ends = send(bs, f"{prefix}.raw", msgs)
    t0 = time.monotonic()
    with ServiceProcess(service_cmd(bs, prefix, "--set", "dlq.payload=raw"), tmp_path / "run.log") as svc:
        waited = wait_for("the input drained", drained(bs, prefix, ends), svc, 240)
        rc, stop_s = svc.stop()
    assert rc == 0, svc.text()[-3000:]
    res = audit(bs, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    got = outcome(bs, prefix, ends, k=10, l=2)
    assert (got["lost"], got["duplicated"], got["k_violations"]) == (0, 0, 0)
    [dl] = got["snapshot"].dead_letters
    assert dl["key_length"] == 3_500_000 and dl["key_truncated"] is True and dl["reason"] == "malformed_json"
    assert bound - 4096 < len(dl["key_b64"]) < bound  # cut to what the dead-letter topic takes
    assert f"every message written stays within {bound:,} bytes" in svc.text(), svc.text()[:3000]
    record_figures("dlq.payload raw, one record with a 3.5 MB key", any_broker.name, records_in=len(msgs),
                   lost=got["lost"],
                   duplicated=got["duplicated"], k_violations=got["k_violations"], drained_s=round(waited, 1),
                   exit="none (still running)", stop_s=round(stop_s, 1), total_s=round(time.monotonic() - t0, 1))
