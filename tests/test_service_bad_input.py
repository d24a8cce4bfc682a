"""Bad input through the real broker: every bad message reaches the DLQ with its reason (redacted: length, position
and a keyed hash of the original bytes), the service keeps running, and the accounting closes in the ledger
(consumed = released + suppressed + dead-lettered, each offset once, each promised output published once)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from config_support import hermetic_config
from fuzz_support import KINDS, malformed_messages  # type: ignore[import-not-found]
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry
from test_service_pipeline import BAD_INPUTS  # type: ignore[import-not-found]
from waiting import wait_for

from stream_anon.cli import main as cli_main
from stream_anon.config.settings import Config
from stream_anon.core.datasets import iter_adult_records
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.formats.decoding import DeadLetter, RecordDecoder
from stream_anon.formats.release import keyed_hash
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.service.app import MainPath
from stream_anon.service.audit import collect_outputs, partition_ends, send_flush_markers


def service_config(bs: str, prefix: str, **extra: object) -> Config:
    overrides: dict[str, object] = {
        "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "topics.input": f"{prefix}.raw", "topics.anon": f"{prefix}.anon", "topics.suppressed": f"{prefix}.suppressed",
        "topics.dlq": f"{prefix}.dlq", "topics.partitions": 2, "anonymization.k": 5, "anonymization.delta": 100,
        "anonymization.seed": 1, "service.max_message_bytes": 2048, "service.commit_interval_ms": 200,
        "side_paths.enabled": False,
    }
    overrides.update(extra)
    return hermetic_config(bs, overrides)


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_bad_messages_go_to_dlq_and_accounting_closes(broker, adult_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    bs = broker.bootstrap_servers
    prefix = f"bad{uuid.uuid4().hex[:6]}"
    cfg = service_config(bs, prefix)
    registry = CollectorRegistry()
    metrics = ServiceMetrics(registry)
    main = MainPath(cfg, metrics=metrics)
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    assert main.ready.wait(30)

    producer = KafkaProducer(bootstrap_servers=bs, acks="all", max_request_size=4 * 1024 * 1024)
    sent: list[tuple[bytes | None, bytes | None]] = []  # (key, value)
    expected_reasons: dict[str, int] = {}
    for i, rec in enumerate(iter_adult_records(adult_path)):
        if i == 1500:
            break
        if i % 50 == 7:
            reason, value = BAD_INPUTS[(i // 50) % len(BAD_INPUTS)]
            key = f"bad-{i}".encode()
            sent.append((key, value))
            expected_reasons[reason] = expected_reasons.get(reason, 0) + 1
        sent.append((rec["id"].encode(), json.dumps(rec).encode()))
    big: bytes = b'{"id": "huge", "pad": "' + b"x" * 1_500_000 + b'"}'  # oversized, and above dlq_max_bytes
    sent.append((b"huge", big))
    expected_reasons["oversized"] = expected_reasons.get("oversized", 0) + 1
    for msg_key, payload in sent:
        producer.send(cfg.topics.input, key=msg_key, value=payload, partition=int(msg_key[-1]) % 2 if msg_key else 0)
    producer.flush()
    send_flush_markers(producer, cfg.topics.input, [0, 1])
    producer.close()

    n_bad = sum(expected_reasons.values())
    n_good = len(sent) - n_bad
    t = main.totals
    wait_for(lambda: t.released + t.suppressed + t.dead_lettered >= len(sent), 60,
             "every record released, suppressed or dead-lettered", alive=th.is_alive, context=lambda: f"{t}")
    time.sleep(0.5)  # let the commit interval pass: the service keeps running
    assert th.is_alive()
    main.stop_event.set()
    th.join(30)

    assert t.consumed == len(sent)
    assert t.dead_letter_reasons == expected_reasons
    assert t.released + t.suppressed == n_good
    s = adult_schema()
    t = cfg.topics
    snap = collect_outputs(bs, input_topic=t.input, anon=t.anon, suppressed=t.suppressed, dlq=t.dlq,
                           qis=[a.name for a in s.qis], sensitive=["income"], input_ends=partition_ends(bs, t.input))
    assert snap.ok, (snap.accounting, snap.published, snap.problems)
    assert snap.dlq_reasons == expected_reasons
    assert len(snap.records) == len(sent) and snap.control == 2
    assert not snap.records.duplicated(["src_partition", "src_offset"]).any()
    # redacted dead letters: reason, position, length and a keyed hash of the original bytes, never the bytes
    secret = (main.cfg.release.secret or "").encode()
    hashes = {keyed_hash(secret, v): len(v) for _, v in sent if v is not None}
    assert len(snap.dead_letters) == n_bad
    for d in snap.dead_letters:
        assert d["payload"] == "redacted" and "value_b64" not in d and "error" not in d
        assert d["value_hmac"] is None or hashes[d["value_hmac"]] == d["value_length"]
    assert any(d["value_length"] == len(big) for d in snap.dead_letters)
    # stream-anon audit: the same from the command line; a message nobody promised makes it fail
    args = ["audit", "--bootstrap-servers", bs, "--input-topic", t.input, "--set", f"topics.anon={t.anon}",
            "--set", f"topics.suppressed={t.suppressed}", "--set", f"topics.dlq={t.dlq}"]
    assert cli_main(args) == 0
    out = capsys.readouterr().out
    assert "OK: every input offset accounted exactly once" in out and "dead_lettered" in out
    stray = KafkaProducer(bootstrap_servers=bs)
    stray.send(t.anon, key=b"not-a-class", value=b'{"v":1}', partition=0)
    stray.close()
    assert cli_main(args) == 1
    out = capsys.readouterr().out
    assert "UNEXPECTED 1" in out and out.rstrip().endswith("NOT OK")
    # the metrics say the same
    got = {s.labels["reason"]: s.value for m in registry.collect() if m.name == "stream_anon_records_dead_lettered"
           for s in m.samples if s.name.endswith("_total")}
    assert got == {r: float(n) for r, n in expected_reasons.items()}


# header-level poison is decided by the consumer loop and the pipeline, not the decoder: a header key that is not
# UTF-8 makes kafka-python raise CorruptRecordError inside poll() for the rest of its producer batch (so each is sent
# alone in its batch) and is dead-lettered by position as corrupt_record; a record carrying the control header is
# not a flush but a dead letter control_header_on_record
HEADER_REASONS = {"non_utf8_header_key": "corrupt_record", "control_header_on_record": "control_header_on_record"}


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_poison_messages_among_valid_records_are_each_accounted_once(broker, adult_path: Path) -> None:
    """Thousands of malformed messages of every kind (deep nesting, huge integers, NaN, lone surrogates, invalid
    UTF-8, BOMs, duplicate keys, 1 MiB values, tombstones, ...) interleaved with ADULT records through the real
    main path: it never stops; every message is released, suppressed or dead-lettered exactly once, with the
    reason the decoder gives; the released classes are k-anonymous."""
    bs = broker.bootstrap_servers
    prefix = f"fuzz{uuid.uuid4().hex[:6]}"
    max_bytes = 65536
    cfg = service_config(bs, prefix, **{"service.max_message_bytes": max_bytes, "service.dlq_max_bytes": 4096})
    schema = adult_schema()
    adult = [schema.validate(r) for _, r in zip(range(3000), iter_adult_records(adult_path), strict=False)]
    poison = malformed_messages(11, 3000, records=adult[:500], max_message_bytes=max_bytes, kinds=KINDS)
    stream: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = []  # (kind, key, value, headers)
    for i, rec in enumerate(adult):
        stream.append(("adult", rec["id"].encode(), json.dumps(rec).encode(), []))
        stream.append((poison[i].kind, poison[i].key, poison[i].value, poison[i].headers))
    decoder = RecordDecoder(schema, max_bytes)
    verdicts = [decoder.decode(v) for _, _, v, _ in stream]
    expected_reason = [HEADER_REASONS.get(kind, v.reason if isinstance(v, DeadLetter) else None)
                       for (kind, _, _, _), v in zip(stream, verdicts, strict=True)]
    expected = Counter(r for r in expected_reason if r is not None)

    main = MainPath(cfg, metrics=ServiceMetrics(CollectorRegistry()))
    th = threading.Thread(target=main.run, daemon=True)
    th.start()
    assert main.ready.wait(30)
    producer = KafkaProducer(bootstrap_servers=bs, acks="all", max_request_size=4 * 1024 * 1024, linger_ms=5)
    futures = []
    for i, (kind, key, value, headers) in enumerate(stream):
        alone = kind == "non_utf8_header_key"
        if alone:
            producer.flush()
        futures.append(producer.send(cfg.topics.input, key=key, value=value, headers=headers, partition=i % 2))
        if alone:
            producer.flush()
    producer.flush()
    position = {(f.get(30).partition, f.get(30).offset): i for i, f in enumerate(futures)}
    send_flush_markers(producer, cfg.topics.input, [0, 1])
    producer.close()

    t = main.totals
    wait_for(lambda: t.released + t.suppressed + t.dead_lettered >= len(stream), 120,
             "every record released, suppressed or dead-lettered", alive=th.is_alive, context=lambda: f"{t}")
    assert th.is_alive()
    main.stop_event.set()
    th.join(30)

    assert t.consumed == len(stream) and t.dead_letter_reasons == dict(expected)
    assert t.internal_errors == 0  # no sweep, no guard: every outcome is a decision, none a caught bug
    tp = cfg.topics
    snap = collect_outputs(bs, input_topic=tp.input, anon=tp.anon, suppressed=tp.suppressed, dlq=tp.dlq,
                           qis=[a.name for a in schema.qis], sensitive=["income"],
                           input_ends=partition_ends(bs, tp.input))
    assert snap.ok, (snap.accounting, snap.published, snap.problems)  # each input exactly once, outputs once
    assert len(snap.records) == len(stream) and snap.control == 2
    assert not snap.records.duplicated(["src_partition", "src_offset"]).any()
    for d in snap.dead_letters:
        i = position[(d["partition"], d["offset"])]
        assert expected_reason[i] == d["reason"], (stream[i][0], d["reason"])
    report = verify_release_frame(snap.public.astype({"class_id": str}), [a.name for a in schema.qis],
                                  cfg.anonymization.k, record_id=None, schema=schema)
    assert report.ok, report.violations[:5]
    outcomes = Counter(str(o) for o in snap.records.outcome)
    print(f"\nservice fuzz: {len(stream)} messages ({len(adult)} ADULT records + {len(poison)} malformed of "
          f"{len(set(KINDS))} kinds); outcomes {dict(outcomes)}; dead-letter reasons {dict(sorted(expected.items()))}; "
          f"suppressed {dict(t.suppressed_reasons)}; {t.classes} classes")
    kinds = Counter(kind for kind, _, _, _ in stream)
    assert set(kinds) == {"adult", *KINDS}
    assert kinds["non_utf8_header_key"] > 10 and kinds["control_header_on_record"] > 10
