"""Unit tests of the service's pure stream logic: messages in, ledger entries out (no broker)."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from faulty_engines import (  # type: ignore[import-not-found]
    BadLossEngine,
    DuplicatingEngine,
    NarrowingEngine,
    RaisingEngine,
    SplitClassesEngine,
)

from stream_anon.core.datasets import iter_adult_records
from stream_anon.core.engine import Engine, EngineConfig
from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.schema import Schema, adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER, RecordDecoder
from stream_anon.formats.release import ClassEncoder, decode_class_message, decode_dead_letter, keyed_hash
from stream_anon.service.accounting import LedgerAccounting
from stream_anon.service.gate import PrePublishGate
from stream_anon.service.ledger import EntryFactory, LedgerEntry, LedgerRecord
from stream_anon.service.linkage import forbidden_fields
from stream_anon.service.pipeline import InputMessage, PartitionPipeline, PipelineSettings, last_line
from stream_anon.service.recovery import LedgerScan

K, DELTA = 5, 60
TOPIC = "adult.raw"
SECRET = b"pipeline-test-secret-0123456789"
SETTINGS = PipelineSettings(input_topic=TOPIC, k=K, delta=DELTA, max_message_bytes=2048)


@pytest.fixture(scope="module")
def adult_messages(adult_path: Path) -> list[InputMessage]:
    out = []
    for i, rec in enumerate(iter_adult_records(adult_path)):
        if i == 600:
            break
        out.append(InputMessage(i, json.dumps(rec).encode(), rec["id"].encode()))
    return out


def seeded_ids(seed: int) -> Callable[[], str]:
    rng = random.Random(seed)
    return lambda: f"{rng.getrandbits(128):032x}"


def make_factory(schema: Schema, *, incarnation: str = "a", gate: bool = True, payload: str = "redacted",
                 l: int | None = None, id_seed: int | None = None) -> EntryFactory:  # noqa: E741
    enc = ClassEncoder(qis=[a.name for a in schema.qis], sensitive=[a.name for a in schema.sensitive], k=K, l=l,
                       **({} if id_seed is None else {"new_class_id": seeded_ids(id_seed)}))
    return EntryFactory(input_topic=TOPIC, partition=0, incarnation=incarnation, classes=enc, secret=SECRET,
                        dlq_payload=payload, dlq_max_payload_bytes=100,
                        gate=PrePublishGate(schema, k=K, l=l) if gate else None)


def make_pipeline(start: int = 0, accounted: Iterable[int] = (), horizon: int = -1, seed: int = 3,
                  incarnation: str = "a", engine: Callable[[Engine], EngineLike] | None = None,
                  settings: PipelineSettings = SETTINGS, schema: Schema | None = None,
                  **factory_kw: Any) -> PartitionPipeline:
    schema = schema or adult_schema()
    inner = Engine(schema, EngineConfig(k=K, delta=DELTA, beta=10, mu=10, seed=seed, zeta=0))
    return PartitionPipeline(0, schema, engine(inner) if engine else inner, settings,
                             entries=make_factory(schema, incarnation=incarnation, **factory_kw), start_offset=start,
                             accounted=accounted, horizon=horizon)


def offsets_of(entries: Sequence[LedgerEntry]) -> list[int]:
    return [o for e in entries for o in e.offsets]


def run_all(p: PartitionPipeline, msgs: Sequence[InputMessage], step: int = 50) -> list[LedgerEntry]:
    out: list[LedgerEntry] = []
    for i in range(0, len(msgs), step):
        out += p.process(msgs[i:i + step], now=0.0).entries
    return out + p.flush(now=1.0).entries


def test_every_record_accounted_once_and_watermark_is_lowest_buffered(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    entries: list[LedgerEntry] = []
    for i in range(0, len(adult_messages), 50):
        res = p.process(adult_messages[i:i + 50], now=1000.0 + i)
        entries += res.entries
        done = set(offsets_of(entries))
        pending = [m.offset for m in adult_messages[:i + 50] if m.offset not in done]
        assert p.buffered == len(pending)
        assert p.watermark == (min(pending) if pending else i + 50)
        assert p.watermark >= i + 50 - DELTA - 1  # nothing older than delta arrivals stays buffered
        assert all(e.horizon >= max(e.offsets) and e.horizon <= i + 49 for e in res.entries)
    entries += p.flush(now=5000.0).entries
    assert p.buffered == 0 and p.watermark == len(adult_messages)
    assert sorted(offsets_of(entries)) == list(range(len(adult_messages)))


def test_class_messages_are_public_k_anonymous_and_join_the_originals_only_through_the_ledger(
        adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    entries = run_all(p, adult_messages, step=600)
    schema = adult_schema()
    qis = [a.name for a in schema.qis]
    public, internal = [], []
    original = pd.DataFrame([json.loads(m.value or b"") for m in adult_messages])
    ids = set(original["id"])
    for e in entries:
        assert e.release_id == f"{TOPIC}/0/{e.offsets[0]}" and e.key == e.release_id.encode()
        if e.kind != "class":
            assert e.kind == "suppressed" and e.reason in ("delay_bound", "leftover")
            continue
        (msg,) = e.outputs
        assert msg.role == "anon" and msg.key == e.class_id.encode()
        assert forbidden_fields(msg.value) == []  # no record ids, offsets, delays, release ids
        assert not any(rid.encode() in msg.value for rid in ids)
        c = decode_class_message(msg.value)
        assert c.k == K and c.size == len(e.offsets) >= K and c.n_records == len(e.offsets)
        assert 0.0 <= (c.loss or 0.0) <= 1.0
        assert e.delays and all(d <= DELTA for d in e.delays) and e.trigger is not None
        public += c.rows()
        internal += [{"record_id": rid, "class_id": c.class_id, **c.qi} for rid in e.record_ids]
    rep = verify_release_frame(pd.DataFrame(public), qis, K, record_id=None, schema=schema)
    assert rep.ok, str(rep)
    rep = verify_release_frame(pd.DataFrame(internal), qis, K, schema=schema, original=original, original_id="id")
    assert rep.ok, str(rep)


def test_release_ids_are_deterministic_class_ids_are_not(adult_messages: list[InputMessage]) -> None:
    a = make_pipeline(seed=1, incarnation="x").process(adult_messages[:300], now=0.0).entries
    b = make_pipeline(seed=1, incarnation="y").process(adult_messages[:300], now=0.0).entries
    assert [e.key for e in a] == [e.key for e in b] and len({e.key for e in a}) == len(a)
    cids_a = {e.class_id for e in a} - {None}
    assert cids_a and not cids_a & ({e.class_id for e in b} - {None})


def scan(entries: Sequence[LedgerEntry], committed: int | None, chunk: int = 7) -> Any:
    recs = [LedgerRecord(i, e.key, e.encode()) for i, e in enumerate(entries)]
    s = LedgerScan(TOPIC, 0, committed)
    hi = len(recs)
    while hi > 0 and not s.add_chunk(recs[max(0, hi - chunk): hi]):
        hi = max(0, hi - chunk)
    return s.finish()


@pytest.mark.parametrize("crash_after", [130, 333, 599])
def test_recovery_from_the_ledger_accounts_for_nothing_twice(adult_messages: list[InputMessage],
                                                             crash_after: int) -> None:
    # incarnation 1 processes up to the crash; its last committed watermark is W
    p1 = make_pipeline(incarnation="one")
    ledger: list[LedgerEntry] = []
    w = 0
    for i in range(0, crash_after, 40):
        ledger += p1.process(adult_messages[i:min(i + 40, crash_after)], now=0.0).entries
        if i % 80 == 0:
            w = p1.watermark  # "commit" (entries and outputs so far acknowledged)
    assert w < crash_after
    plan = scan(ledger, w)
    expected = {o for o in offsets_of(ledger) if o >= w}
    assert plan.start_offset == w and plan.accounted == expected
    p2 = make_pipeline(start=w, accounted=plan.accounted, horizon=plan.horizon, incarnation="two")
    res = p2.process(adult_messages[w:], now=0.0)
    ledger2 = res.entries + p2.flush(now=1.0).entries
    assert res.stats.skipped == len(expected)
    assert sorted(offsets_of(ledger) + offsets_of(ledger2)) == list(range(len(adult_messages)))  # exactly once
    assert min(e.horizon for e in ledger2) >= crash_after - 1  # horizons never go back across incarnations


def test_flush_marker_releases_everything_and_is_accounted_as_control(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    res = p.process(adult_messages[:40], now=0.0)
    assert p.buffered > 0
    marker = InputMessage(40, b"", None, [(CONTROL_HEADER, CONTROL_FLUSH)])
    res2 = p.process([marker], now=1.0)
    assert p.buffered == 0 and p.watermark == 41 and res2.stats.control == 1 and res2.stats.consumed == 0
    assert res2.entries[-1].kind == "control" and res2.entries[-1].offsets == (40,)
    assert sorted(offsets_of(res.entries + res2.entries)) == list(range(41))
    assert all(e.trigger == 40 for e in res2.entries[:-1])


def test_a_recovery_that_consumes_records_before_an_accounted_marker_again_flushes_them_at_the_marker(
        adult_messages: list[InputMessage]) -> None:
    """The ledger lost the entries of some records (a message acknowledged without being stored) but kept the end
    marker's control entry after them: the recovery consumes those records again, and the marker, skipped as
    accounted, still flushes them (else they wait for input that never comes: CI, 2026-11-28)."""
    p1 = make_pipeline(incarnation="one")
    before = p1.process(adult_messages[:60], now=0.0).entries
    marker = InputMessage(60, b"", None, [(CONTROL_HEADER, CONTROL_FLUSH)])
    flushed = p1.process([marker], now=1.0).entries
    assert sorted(offsets_of(before + flushed)) == list(range(61)) and flushed[-1].kind == "control"
    lost = set(offsets_of(flushed[:-1]))  # the flush's entries are lost, the control entry after them kept
    assert len(lost) >= K
    start = min(lost)
    kept = before + flushed[-1:]
    accounted = {o for o in offsets_of(kept) if o >= start}
    p2 = make_pipeline(start=start, accounted=accounted, horizon=60, incarnation="two")
    res = p2.process([*adult_messages[start:60], marker], now=2.0)
    assert p2.buffered == 0 and p2.watermark == 61  # nothing left waiting
    assert res.stats.skipped == len(accounted) and res.stats.control == 0  # the marker is not accounted twice
    assert all(e.kind != "control" for e in res.entries)
    assert sorted(offsets_of(kept) + offsets_of(res.entries)) == list(range(61))  # every offset exactly once
    # without the marker the same records stay buffered (the delay bound counts arrivals: none come)
    p3 = make_pipeline(start=start, accounted=accounted, horizon=60, incarnation="three")
    p3.process(adult_messages[start:60], now=2.0)
    assert p3.buffered == len(lost)


@pytest.mark.parametrize(("value", "header", "reason"), [
    (b'{"id": "x"}', CONTROL_FLUSH, "control_header_on_record"),
    (None, b"stop", "unknown_control"),
    (b"", None, "unknown_control"),
])
def test_a_control_header_is_a_flush_only_on_an_empty_message_with_value_flush(
        adult_messages: list[InputMessage], value: bytes | None, header: bytes | None, reason: str) -> None:
    p = make_pipeline()
    p.process(adult_messages[:40], now=0.0)
    buffered = p.buffered
    res = p.process([InputMessage(40, value, None, [(CONTROL_HEADER, header)])], now=1.0)  # type: ignore[list-item]
    assert p.buffered == buffered and res.stats.control == 0  # not flushed
    (e,) = res.entries
    assert e.kind == "dlq" and e.reason == reason and e.offsets == (40,)
    assert res.stats.dead_letters == {reason: 1}


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


def _with_bad(adult_messages: list[InputMessage], n: int = 200) -> tuple[list[InputMessage],
                                                                          dict[int, tuple[str, bytes | None]]]:
    msgs: list[InputMessage] = []
    off = 0
    bad: dict[int, tuple[str, bytes | None]] = {}
    for i, m in enumerate(adult_messages[:n]):
        if i % 20 == 5:
            reason, value = BAD_INPUTS[(i // 20) % len(BAD_INPUTS)]
            bad[off] = (reason, value)
            msgs.append(InputMessage(off, value, b"k"))
            off += 1
        msgs.append(InputMessage(off, m.value, m.key))
        off += 1
    return msgs, bad


@pytest.mark.parametrize("payload", ["redacted", "raw"])
def test_dead_letters_are_redacted_by_default_and_do_not_stop_the_partition(adult_messages: list[InputMessage],
                                                                            payload: str) -> None:
    p = make_pipeline(payload=payload)
    msgs, bad = _with_bad(adult_messages)
    res = p.process(msgs, now=0.0)
    entries = res.entries + p.flush(now=1.0).entries
    dlq = [e for e in entries if e.kind == "dlq"]
    assert len(dlq) == len(bad)
    for e in dlq:
        (off,) = e.offsets
        reason, value = bad[off]
        body = decode_dead_letter(e.outputs[0].value)
        assert e.reason == body["reason"] == reason and body["offset"] == off and body["topic"] == TOPIC
        assert body["value_length"] == (None if value is None else len(value))
        assert body["value_hmac"] == (None if value is None else keyed_hash(SECRET, value))
        if payload == "redacted":
            assert "value_b64" not in body and "error" not in body
            assert value is None or len(value) < 8 or value[:8] not in e.outputs[0].value
        else:
            original = value or b""
            if value is not None:
                assert base64.b64decode(body["value_b64"]) == original[:100]  # cut at the configured bytes
                assert body["truncated"] == (len(original) > 100)
    assert sorted(offsets_of(entries)) == list(range(len(msgs)))
    assert sum(res.stats.dead_letters.values()) == len(bad)


def test_many_dead_letters_between_records_do_not_make_held_records_look_old(
        adult_messages: list[InputMessage]) -> None:
    """The engine's delay counts arrivals (records it was given), not offsets: with 3 dead letters per record,
    a record held delta arrivals spans 4 x delta offsets, more than the sweep's 2 x delta.  A correct engine
    must never trip the orphan sweep, however many dead letters the stream carries (a regression: the sweep
    counted offsets and suppressed records the engine still held, reported as internal errors)."""
    p = make_pipeline()
    msgs: list[InputMessage] = []
    for m in adult_messages[:400]:
        for _ in range(3):
            msgs.append(InputMessage(len(msgs), b"{not json", b"k"))
        msgs.append(InputMessage(len(msgs), m.value, m.key))
    entries: list[LedgerEntry] = []
    errors: list[tuple[str, int | None, str]] = []
    for i in range(0, len(msgs), 100):
        res = p.process(msgs[i:i + 100], now=0.0)
        entries += res.entries
        errors += res.stats.internal_errors
    res = p.flush(now=1.0)
    entries += res.entries
    errors += res.stats.internal_errors
    assert errors == []
    assert sorted(offsets_of(entries)) == list(range(len(msgs)))
    assert sum(len(e.offsets) for e in entries if e.kind == "dlq") == 1200


def test_vectorized_encoding_gives_the_same_entries_as_per_record_push(adult_messages: list[InputMessage]) -> None:
    """One engine.encode_many per run + push_encoded (the default) releases exactly what push() per record does."""
    fast = make_pipeline(seed=9, incarnation="z", id_seed=4)
    assert fast.settings.encode_in_batches  # the default
    slow = make_pipeline(seed=9, incarnation="z", id_seed=4,
                         settings=dataclasses.replace(SETTINGS, encode_in_batches=False))
    a = [e.encode() for i in range(0, 600, 97) for e in fast.process(adult_messages[i:i + 97], now=0.0).entries]
    b = [e.encode() for i in range(0, 600, 97) for e in slow.process(adult_messages[i:i + 97], now=0.0).entries]
    assert a == b and len(a) > 10


def test_recovery_skips_dead_letters_already_in_the_ledger(adult_messages: list[InputMessage]) -> None:
    msgs = [InputMessage(m.offset, b"{broken" if m.offset % 9 == 4 else m.value, m.key) for m in adult_messages]
    p1 = make_pipeline(incarnation="one")
    ledger = p1.process(msgs[:250], now=0.0).entries
    w = p1.watermark
    ledger += p1.process(msgs[250:400], now=0.0).entries  # entries after the last "commit", then crash
    plan = scan(ledger, w)
    dlq_above = {e.offsets[0] for e in ledger if e.kind == "dlq"} - set(range(w))
    assert dlq_above and dlq_above <= plan.accounted
    p2 = make_pipeline(start=w, accounted=plan.accounted, horizon=plan.horizon, incarnation="two")
    ledger2 = p2.process(msgs[w:], now=0.0).entries + p2.flush(now=1.0).entries
    assert sorted(offsets_of(ledger + ledger2)) == list(range(len(msgs)))
    assert sum(e.kind == "dlq" for e in ledger + ledger2) == sum(1 for m in msgs if m.offset % 9 == 4)


def test_an_unreadable_record_is_dead_lettered_by_position(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline()
    res = p.process([*adult_messages[:10], InputMessage(10, None, corrupt="CorruptRecordError: bad header key"),
                     *adult_messages[11:20]], now=0.0)
    (e,) = [e for e in res.entries if e.kind == "dlq"]
    assert e.offsets == (10,) and e.reason == "corrupt_record"
    assert decode_dead_letter(e.outputs[0].value)["value_length"] is None
    assert p.next_offset == 20 and p.buffered == 19 - sum(len(x.offsets) for x in res.entries if x.kind != "dlq")


# ---------------------------------------------------------------------------------------------- the gate and the guard
def _accounting(entries: Sequence[LedgerEntry], n: int) -> Any:
    acc = LedgerAccounting(TOPIC)
    acc.add(0, [LedgerRecord(i, e.key, e.encode()) for i, e in enumerate(entries)])
    return acc.report({0: n})


@pytest.mark.parametrize("faulty", [SplitClassesEngine, NarrowingEngine])
def test_the_gate_suppresses_every_faulty_class_and_publishes_only_sound_ones(adult_messages: list[InputMessage],
                                                                              faulty: type) -> None:
    p = make_pipeline(engine=faulty)
    refusals: list[tuple[str, int, str]] = []
    entries: list[LedgerEntry] = []
    for i in range(0, 600, 100):
        res = p.process(adult_messages[i:i + 100], now=0.0)
        entries += res.entries
        refusals += res.stats.gate_refusals
    res = p.flush(now=1.0)
    entries += res.entries
    refusals += res.stats.gate_refusals
    gated = [e for e in entries if e.kind == "suppressed" and e.reason == "gate"]
    assert refusals and len(refusals) == len(gated)
    assert {r for r, _, _ in refusals} == {e.release_id for e in gated}
    for e in gated:
        detail = json.loads(e.outputs[0].value)["detail"]
        assert ("k=5" in detail) if faulty is SplitClassesEngine else ("outside released" in detail)
        for rid in e.record_ids:
            assert str(rid) not in detail  # the detail names positions, never members
    schema = adult_schema()
    qis = [a.name for a in schema.qis]
    original = pd.DataFrame([json.loads(m.value or b"") for m in adult_messages])
    rows = [{"record_id": rid, "class_id": e.class_id, **decode_class_message(e.outputs[0].value).qi}
            for e in entries if e.kind == "class" for rid in e.record_ids]
    assert rows
    rep = verify_release_frame(pd.DataFrame(rows), qis, K, schema=schema, original=original, original_id="id")
    assert rep.ok, str(rep)  # nothing below k, nothing uncovered, reaches the public topic
    rep_acc = _accounting(entries, 600)
    assert rep_acc.ok and rep_acc.suppressed_reasons.get("gate") == sum(len(e.offsets) for e in gated)


def test_the_gate_checks_l_when_l_is_set(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline(engine=SplitClassesEngine, l=2)
    entries = run_all(p, adult_messages, step=100)
    classes = [decode_class_message(e.outputs[0].value) for e in entries if e.kind == "class"]
    assert classes and all(c.distinct_sensitive() >= 2 and c.l == 2 for c in classes)


def test_the_guard_dead_letters_a_message_the_engine_fails_on_and_never_accounts_it_twice(
        adult_messages: list[InputMessage]) -> None:
    ages = frozenset({27, 61})
    p = make_pipeline(engine=lambda e: RaisingEngine(e, ages))
    stats_errors: list[tuple[str, int | None, str]] = []
    entries: list[LedgerEntry] = []
    for i in range(0, 600, 50):
        res = p.process(adult_messages[i:i + 50], now=0.0)
        entries += res.entries
        stats_errors += res.stats.internal_errors
    entries += p.flush(now=1.0).entries
    hit = [m.offset for m in adult_messages if json.loads(m.value or b"")["age"] in ages]
    engine_errors = [(o, line) for stage, o, line in stats_errors if stage == "engine"]
    assert hit and sorted(o for o, _ in engine_errors) == hit
    assert all("KeyError" in line and "injected failure" in line for _, line in engine_errors)
    dead = [e for e in entries if e.kind == "dlq"]
    assert sorted(e.offsets[0] for e in dead) == hit and {e.reason for e in dead} == {"internal_error"}
    # the failing push also lost the releases it had made: the sweep suppresses those records (nothing lost)
    swept = [e for e in entries if e.kind == "suppressed" and b"did not release it" in e.outputs[0].value]
    assert swept and {stage for stage, _, _ in stats_errors} == {"engine", "sweep"}
    rep = _accounting(entries, 600)
    assert rep.ok and not rep.duplicates  # the engine kept the failed records; their release drops them


def test_the_guard_catches_a_bug_in_decoding(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline(payload="raw")
    real = p.decoder.decode

    def buggy(value: bytes | None) -> Any:
        if value is not None and b'"age": 52' in value:
            raise RecursionError("maximum recursion depth exceeded (injected)")
        return real(value)

    p.decoder.decode = buggy  # type: ignore[method-assign]
    entries = run_all(p, adult_messages)
    dead = [e for e in entries if e.kind == "dlq"]
    assert dead and {e.reason for e in dead} == {"internal_error"}
    err = decode_dead_letter(dead[0].outputs[0].value)["error"]
    assert err.startswith("decode: RecursionError: maximum recursion depth exceeded (injected) (test_service_pipeline")
    assert _accounting(entries, 600).ok


def test_an_engine_that_releases_a_record_twice_cannot_account_it_twice(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline(engine=DuplicatingEngine)
    errors: list[tuple[str, int | None, str]] = []
    entries: list[LedgerEntry] = []
    for i in range(0, 600, 50):
        res = p.process(adult_messages[i:i + 50], now=0.0)
        entries += res.entries
        errors += res.stats.internal_errors
    entries += p.flush(now=1.0).entries
    assert errors and all(stage == "release" for stage, _, _ in errors)
    assert _accounting(entries, 600).ok


def test_a_release_that_cannot_be_encoded_is_suppressed_not_lost(adult_messages: list[InputMessage]) -> None:
    p = make_pipeline(engine=BadLossEngine)
    errors: list[tuple[str, int | None, str]] = []
    entries: list[LedgerEntry] = []
    for i in range(0, 600, 50):
        res = p.process(adult_messages[i:i + 50], now=0.0)
        entries += res.entries
        errors += res.stats.internal_errors
    entries += p.flush(now=1.0).entries
    assert errors and {stage for stage, _, _ in errors} == {"encode"}
    gated = [e for e in entries if e.kind == "suppressed" and e.reason == "gate"]
    assert gated and all("internal error: ValueError" in json.loads(e.outputs[0].value)["detail"] for e in gated)
    assert _accounting(entries, 600).ok


def test_a_schema_without_record_id_uses_the_source_position(adult_messages: list[InputMessage]) -> None:
    schema = dataclasses.replace(adult_schema(), record_id=None)
    msgs = [InputMessage(m.offset, json.dumps({k: v for k, v in json.loads(m.value or b"").items() if k != "id"})
                         .encode()) for m in adult_messages[:200]]
    p = make_pipeline(schema=schema)
    entries = run_all(p, msgs)
    assert _accounting(entries, 200).ok
    rel = [e for e in entries if e.kind in ("class", "suppressed")]
    assert rel and all(rid == f"{TOPIC}/0/{o}" for e in rel for rid, o in zip(e.record_ids, e.offsets, strict=True))


def test_last_line_names_the_exception_and_where() -> None:
    def f() -> None:
        raise ValueError("boom\n  second line")

    try:
        f()
    except ValueError as e:
        assert last_line(e) == "ValueError: boom second line (test_service_pipeline.py:" + \
            str(f.__code__.co_firstlineno + 1) + " in f)"
