"""Unit tests of the service's pure stream logic: lists in, lists out (no broker)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from stream_anon.core.datasets import iter_adult_records
from stream_anon.core.engine import Engine, EngineConfig
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.service.decoding import CONTROL_FLUSH, CONTROL_HEADER, RecordDecoder
from stream_anon.service.pipeline import (
    H_HORIZON,
    H_REASON,
    H_SRC_OFFSET,
    InputMessage,
    OutputMessage,
    PartitionPipeline,
    PipelineSettings,
    ReadBackScan,
    class_rows,
    output_offsets,
)

K, DELTA = 5, 60
SETTINGS = PipelineSettings(input_topic="adult.raw", anon_topic="adult.anon", suppressed_topic="adult.suppressed",
                            dlq_topic="adult.dlq", k=K, delta=DELTA, max_message_bytes=2048, dlq_max_bytes=100)


@pytest.fixture(scope="module")
def adult_messages(adult_path: Path) -> list[InputMessage]:
    out = []
    for i, rec in enumerate(iter_adult_records(adult_path)):
        if i == 600:
            break
        out.append(InputMessage(i, json.dumps(rec).encode(), rec["id"].encode()))
    return out


def make_pipeline(start: int = 0, released: Iterable[int] = (), horizon: int = -1, seed: int = 3,
                  incarnation: str = "a") -> PartitionPipeline:
    schema = adult_schema()
    engine = Engine(schema, EngineConfig(k=K, delta=DELTA, beta=10, mu=10, seed=seed))
    return PartitionPipeline(0, schema, engine, SETTINGS, incarnation=incarnation, start_offset=start,
                             already_released=released, horizon=horizon)


def accounted(outputs: Sequence[OutputMessage]) -> list[int]:
    offs: list[int] = []
    for m in outputs:
        offs.extend(output_offsets(m.value, dict(m.headers)))
    return offs


def test_every_record_accounted_once_and_watermark_is_lowest_buffered(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    outputs: list[OutputMessage] = []
    for i in range(0, len(adult_messages), 50):
        res = p.process(adult_messages[i:i + 50], now=1000.0 + i)
        outputs += res.outputs
        done = set(accounted(outputs))
        pending = [m.offset for m in adult_messages[:i + 50] if m.offset not in done]
        assert p.buffered == len(pending)
        assert p.watermark == (min(pending) if pending else i + 50)
        assert p.watermark >= i + 50 - DELTA - 1  # nothing older than delta arrivals stays buffered
    outputs += p.flush(now=5000.0).outputs
    assert p.buffered == 0 and p.watermark == len(adult_messages)
    offs = accounted(outputs)
    assert sorted(offs) == list(range(len(adult_messages)))


def test_class_messages_are_k_anonymous_and_carry_fields(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    outputs = p.process(adult_messages, now=0.0).outputs + p.flush(now=1.0).outputs
    schema = adult_schema()
    qis = [a.name for a in schema.qis]
    rows = []
    for m in outputs:
        h = dict(m.headers)
        body = json.loads(m.value)
        assert body["src_partition"] == 0 and int(h[H_SRC_OFFSET]) == min(r["src_offset"] for r in body["records"])
        assert body["release_id"] == f"adult.raw/0/{h[H_SRC_OFFSET].decode()}"
        if m.kind == "anon":
            assert body["k"] == K and body["delta"] == DELTA and 0.0 <= body["loss"] <= 1.0
            assert body["class_id"].startswith("p0-a-")
            assert all(r["delay"] <= DELTA for r in body["records"])
            rows += class_rows(body, qis, ["income"])
        else:
            assert m.kind == "suppressed" and "generalized" not in body  # no QI values of suppressed records
    import pandas as pd

    df = pd.DataFrame(rows)
    original = pd.DataFrame([json.loads(m.value or b"") for m in adult_messages])
    rep = verify_release_frame(df, qis, K, schema=schema, original=original, original_id="id")
    assert rep.ok, str(rep)


def test_release_ids_are_deterministic(adult_messages: list[InputMessage]) -> None:
    a = make_pipeline(seed=1, incarnation="x").process(adult_messages[:300], now=0.0).outputs
    b = make_pipeline(seed=1, incarnation="y").process(adult_messages[:300], now=0.0).outputs
    ids_a = [r["release_id"] for m in a for r in json.loads(m.value)["records"]]
    ids_b = [r["release_id"] for m in b for r in json.loads(m.value)["records"]]
    assert ids_a == ids_b and len(set(ids_a)) == len(ids_a)


def readback(outputs: Sequence[OutputMessage], threshold: int, chunk: int = 7) -> ReadBackScan:
    scan = ReadBackScan("adult.raw", 0, threshold)
    by_topic: dict[str, list[OutputMessage]] = {}
    for m in outputs:
        by_topic.setdefault(m.topic, []).append(m)
    released: set[int] = set()
    horizon = -1
    for msgs in by_topic.values():
        s = ReadBackScan("adult.raw", 0, threshold)
        hi = len(msgs)
        while hi > 0:
            lo = max(0, hi - chunk)
            if s.add_chunk([(m.value, m.headers) for m in msgs[lo:hi]]):
                break
            hi = lo
        released |= s.released
        horizon = max(horizon, s.horizon)
    scan.released, scan.horizon = released, horizon
    return scan


@pytest.mark.parametrize("crash_after", [130, 333, 599])
def test_recovery_from_watermark_releases_nothing_twice(adult_messages: list[InputMessage], crash_after: int) -> None:
    # incarnation 1 processes up to the crash; its last committed watermark is W
    p1 = make_pipeline(incarnation="one")
    out1: list[OutputMessage] = []
    w = 0
    for i in range(0, crash_after, 40):
        out1 += p1.process(adult_messages[i:min(i + 40, crash_after)], now=0.0).outputs
        if i % 80 == 0:
            w = p1.watermark  # "commit" (outputs so far acknowledged)
    assert w < crash_after
    # incarnation 2: re-consume from W, skip what the outputs already hold
    scan = readback(out1, w)
    expected = {o for o in accounted(out1) if o >= w}
    assert scan.released == expected
    p2 = make_pipeline(start=w, released=scan.released, horizon=scan.horizon, incarnation="two")
    res = p2.process(adult_messages[w:], now=0.0)
    out2 = res.outputs + p2.flush(now=1.0).outputs
    assert res.stats.skipped == len(expected)
    offs = accounted(out1) + accounted(out2)
    assert sorted(offs) == list(range(len(adult_messages)))  # each exactly once
    # horizon of every message of incarnation 2 dominates everything incarnation 1 consumed
    assert min(int(dict(m.headers)[H_HORIZON]) for m in out2) >= crash_after - 1
    cids1 = {json.loads(m.value).get("class_id") for m in out1} - {None}
    cids2 = {json.loads(m.value).get("class_id") for m in out2} - {None}
    assert not cids1 & cids2


def test_readback_stops_at_first_message_below_threshold() -> None:
    def msg(horizon: int, offs: list[int], partition: int = 0) -> tuple[bytes, list[tuple[str, bytes]]]:
        body = json.dumps({"records": [{"src_offset": o} for o in offs]}).encode()
        return body, [("src.topic", b"adult.raw"), ("src.partition", str(partition).encode()),
                      ("src.horizon", str(horizon).encode()), ("kind", b"anon")]

    scan = ReadBackScan("adult.raw", 0, threshold=100)
    # forward order: old message (horizon 90) then newer ones; other partition's messages are ignored
    assert not scan.add_chunk([msg(120, [101, 110]), msg(500, [400], partition=1), msg(130, [95, 125])])
    assert scan.released == {101, 110, 125} and scan.horizon == 130
    assert scan.add_chunk([msg(80, [70]), msg(99, [98, 99])])  # horizon 99 < 100: done
    assert scan.released == {101, 110, 125}


def test_flush_marker_releases_everything_buffered(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    res = p.process(adult_messages[:40], now=0.0)
    assert p.buffered > 0
    marker = InputMessage(40, b"", None, [(CONTROL_HEADER, CONTROL_FLUSH)])
    res2 = p.process([marker], now=1.0)
    assert p.buffered == 0 and p.watermark == 41 and res2.stats.control == 1 and res2.stats.consumed == 0
    offs = accounted(res.outputs + res2.outputs)
    assert sorted(offs) == list(range(40))
    assert all(json.loads(m.value)["release_offset"] == 40 for m in res2.outputs)


def good() -> dict[str, object]:
    return {"id": "x-1", "age": 39, "workclass": "State-gov", "fnlwgt": 77516, "education": "Bachelors",
            "education-num": 13, "marital-status": "Never-married", "occupation": "Adm-clerical",
            "relationship": "Not-in-family", "race": "White", "sex": "Male", "capital-gain": 2174,
            "capital-loss": 0, "hours-per-week": 40, "native-country": "United-States", "income": "<=50K"}


BAD_INPUTS: list[tuple[str, bytes | None]] = [
    ("empty", b""),
    ("empty", None),
    ("oversized", json.dumps({**good(), "pad": "x" * 4000}).encode()),
    ("malformed_json", b'{"id": "x", "age": '),
    ("malformed_json", b"\xff\xfe\x00garbage"),
    ("not_an_object", b"[1, 2, 3]"),
    ("missing_field", json.dumps({k: v for k, v in good().items() if k != "age"}).encode()),
    ("bad_record_id", json.dumps({k: v for k, v in good().items() if k != "id"}).encode()),
    ("bad_record_id", json.dumps({**good(), "id": 1.5}).encode()),
    ("extra_field", json.dumps({**good(), "ssn": "123"}).encode()),
    ("wrong_type", json.dumps({**good(), "age": "thirty"}).encode()),
    ("wrong_type", json.dumps({**good(), "sex": 1}).encode()),
    ("out_of_domain", json.dumps({**good(), "age": 150}).encode()),
    ("out_of_domain", json.dumps({**good(), "race": "Martian"}).encode()),
]


@pytest.mark.parametrize(("reason", "value"), BAD_INPUTS)
def test_decoder_names_the_reason(reason: str, value: bytes | None) -> None:
    d = RecordDecoder(adult_schema(), max_message_bytes=2048).decode(value)
    assert not isinstance(d, dict)
    assert d.reason == reason, d.error


def test_dead_letters_keep_original_bytes_and_do_not_stop_the_partition(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    msgs: list[InputMessage] = []
    off = 0
    bad_offsets: dict[int, tuple[str, bytes | None]] = {}
    for i, m in enumerate(adult_messages[:200]):
        if i % 20 == 5:
            reason, value = BAD_INPUTS[(i // 20) % len(BAD_INPUTS)]
            bad_offsets[off] = (reason, value)
            msgs.append(InputMessage(off, value, b"k"))
            off += 1
        msgs.append(InputMessage(off, m.value, m.key))
        off += 1
    res = p.process(msgs, now=0.0)
    outs = res.outputs + p.flush(now=1.0).outputs
    dlq = [m for m in outs if m.kind == "dlq"]
    assert len(dlq) == len(bad_offsets)
    for d in dlq:
        h = dict(d.headers)
        reason, value = bad_offsets[int(h[H_SRC_OFFSET])]
        assert h[H_REASON].decode() == reason
        original = value or b""
        assert d.value == original[:SETTINGS.dlq_max_bytes]  # truncated beyond dlq_max_bytes, flagged
        assert (len(original) > SETTINGS.dlq_max_bytes) == ("dlq.original-length" in h)
    assert sorted(accounted(outs)) == list(range(off))
    assert sum(res.stats.dead_letters.values()) == len(bad_offsets)


def test_vectorized_encoding_gives_the_same_releases_as_per_record_push(adult_messages: list[InputMessage]) -> None:
    """One engine.encode_many per run + push_encoded (the default) releases exactly what push() per record does."""
    schema = adult_schema()
    fast = make_pipeline(seed=9, incarnation="z")
    assert fast.settings.encode_in_batches  # the default
    per_record = dataclasses.replace(SETTINGS, encode_in_batches=False)
    slow = PartitionPipeline(0, schema, Engine(schema, EngineConfig(k=K, delta=DELTA, beta=10, mu=10, seed=9)),
                             per_record, incarnation="z", start_offset=0)
    a = [m.value for i in range(0, 600, 97) for m in fast.process(adult_messages[i:i + 97], now=0.0).outputs]
    b = [m.value for i in range(0, 600, 97) for m in slow.process(adult_messages[i:i + 97], now=0.0).outputs]
    assert a == b and len(a) > 10


def test_recovery_skips_dead_letters_already_written(adult_messages: list[InputMessage]) -> None:
    # every 9th message is bad: its DLQ entry before the crash must not be written again after it
    msgs = [InputMessage(m.offset, b"{broken" if m.offset % 9 == 4 else m.value, m.key) for m in adult_messages]
    p1 = make_pipeline(incarnation="one")
    out1 = p1.process(msgs[:250], now=0.0).outputs
    w = p1.watermark
    out1 += p1.process(msgs[250:400], now=0.0).outputs  # released after the last "commit", then crash
    scan = readback(out1, w)
    dlq_above = {int(dict(m.headers)[H_SRC_OFFSET]) for m in out1 if m.kind == "dlq"} - set(range(w))
    assert dlq_above and dlq_above <= scan.released
    p2 = make_pipeline(start=w, released=scan.released, horizon=scan.horizon, incarnation="two")
    out2 = p2.process(msgs[w:], now=0.0).outputs + p2.flush(now=1.0).outputs
    assert sorted(accounted(out1) + accounted(out2)) == list(range(len(msgs)))
    assert sum(m.kind == "dlq" for m in out1 + out2) == sum(1 for m in msgs if m.offset % 9 == 4)
