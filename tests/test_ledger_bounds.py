"""Bounded messages (issue 18 item 1), pure: no valid record, class or dead letter makes a message over the output
bound.  Property tests over class sizes, id lengths and bounds: every output message and every ledger message fits;
a large entry's chunks reassemble to it in any order, and without one of them it counts for nothing."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_anon.formats.messages import MESSAGE_FRAMING_BYTES, message_size
from stream_anon.formats.release import ClassEncoder, decode_dead_letter, decode_suppressed
from stream_anon.kafka_io.limits import FALLBACK_MESSAGE_MAX_BYTES, output_bound
from stream_anon.service.accounting import LedgerAccounting
from stream_anon.service.ledger import (
    EntryChunk,
    EntryFactory,
    LedgerEntry,
    LedgerRecord,
    decode_ledger_value,
)
from stream_anon.service.ledger_state import ChunkAssembler
from stream_anon.service.recovery import LedgerScan

TOPIC = "adult.raw"
INCOMES = ("<=50K", ">50K")

ids = st.one_of(
    st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", "\u00e9", "\u4e2d", "\U0001f600", "\"", "\\", "\x01"]),
              st.integers(min_value=1, max_value=25_000)),
    st.text(min_size=1, max_size=40),
)


def make_factory(bound: int, *, include_ids: bool = False) -> EntryFactory:
    enc = ClassEncoder(qis=["age"], sensitive=["income"], k=2, include_record_ids=include_ids,
                       new_class_id=lambda: "c" * 32)
    return EntryFactory(input_topic=TOPIC, partition=3, incarnation="inc", classes=enc, secret=b"s" * 32,
                        dlq_payload="raw", max_message_bytes=bound)


def ledger_messages(entries: list[LedgerEntry], bound: int) -> list[tuple[bytes, bytes]]:
    return [kv for e in entries for kv in e.ledger_messages(bound)]


def assert_fits(entries: list[LedgerEntry], bound: int) -> list[tuple[bytes, bytes]]:
    """Every output message and every ledger message of ``entries`` within ``bound``."""
    for e in entries:
        for m in e.outputs:
            assert message_size(m.key, m.value) <= bound, (e.kind, len(m.value), bound)
    msgs = ledger_messages(entries, bound)
    for k, v in msgs:
        assert message_size(k, v) <= bound, (len(k), len(v), bound)
    return msgs


def reassemble(msgs: list[tuple[bytes, bytes]], order: list[int]) -> list[LedgerEntry]:
    assembler = ChunkAssembler()
    out = []
    for i in order:
        item = decode_ledger_value(msgs[i][1])
        if isinstance(item, EntryChunk):
            whole = assembler.add(i, item)
            if whole is not None:
                out.append(whole[0])
        else:
            assert isinstance(item, LedgerEntry)
            out.append(item)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(size=st.integers(min_value=1, max_value=400), rid=ids, bound=st.integers(min_value=16_384, max_value=300_000),
       include_ids=st.booleans(), seed=st.integers(min_value=0, max_value=2 ** 32))
def test_a_class_of_any_size_and_id_length_fits_the_bound_whole_or_in_chunks(size: int, rid: Any, bound: int,
                                                                            include_ids: bool, seed: int) -> None:
    rng = random.Random(seed)
    offsets = rng.sample(range(10 * size + 10), size)
    rids = [rid if isinstance(rid, int) else f"{rid}{i}" for i in range(size)] if not isinstance(rid, int) \
        else [rid - i if rid > 0 else rid + i for i in range(size)]
    members = [{"age": 30, "income": INCOMES[i % 2]} for i in range(size)]
    f = make_factory(bound, include_ids=include_ids)
    entries, _ = f.released_class(offsets=offsets, record_ids=rids, members=members, generalized={"age": "[20-40]"},
                                  size=size, loss=0.1, horizon=max(offsets))
    msgs = assert_fits(entries, bound)
    assert sorted(o for e in entries for o in e.offsets) == sorted(offsets)  # every record in exactly one entry
    if entries[0].kind == "class":
        assert len(entries) == 1 and list(entries[0].record_ids) == [rids[i] for i in
                                                                       sorted(range(size), key=offsets.__getitem__)]
    else:  # only a class message listing its members can outgrow the bound
        assert include_ids and {e.reason for e in entries} == {"oversized"}
        for e in entries:
            body = decode_suppressed(e.outputs[0].value)
            assert body["offsets"] == list(e.offsets) and len(body["record_ids"]) == len(e.offsets)
    # the ledger messages reassemble to the entries in ledger order, backwards, and shuffled
    for order in (list(range(len(msgs))), list(reversed(range(len(msgs)))), rng.sample(range(len(msgs)), len(msgs))):
        assert sorted(reassemble(msgs, order), key=lambda e: e.offsets) == sorted(entries, key=lambda e: e.offsets)
    # accounting: every offset once
    acc = LedgerAccounting(TOPIC)
    acc.add(3, [LedgerRecord(i, k, v) for i, (k, v) in enumerate(msgs)])
    rep = acc.report()
    assert not rep.duplicates and not rep.corrupt and not rep.incomplete and rep.accounted == size


@pytest.mark.slow  # (CI's full suite; not in the fast tier, for its time budget)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(min_value=1, max_value=300), id_len=st.integers(min_value=1, max_value=60_000),
       bound=st.integers(min_value=16_384, max_value=200_000), reason=st.sampled_from(["delay_bound", "gate"]),
       detail=st.one_of(st.none(), st.text(max_size=5000)))
def test_a_suppression_of_any_size_is_split_into_messages_that_fit(size: int, id_len: int, bound: int, reason: str,
                                                                  detail: str | None) -> None:
    f = make_factory(bound)
    offsets = list(range(100, 100 + 3 * size, 3))
    rids = [f"{i:06d}" + "\u00e9" * id_len for i in range(size)]
    entries = f.suppressed(offsets=offsets, record_ids=rids, reason=reason, horizon=10_000, detail=detail)
    assert_fits(entries, bound)
    assert [o for e in entries for o in e.offsets] == offsets  # in order, each once
    for e in entries:
        body = decode_suppressed(e.outputs[0].value)
        assert body["offsets"] == list(e.offsets) and body["release"] == e.release_id
        for got, want in zip(body["record_ids"], e.record_ids, strict=True):
            if isinstance(got, dict):  # a single id too long for the bound alone
                assert len(e.offsets) == 1 and want.startswith(got["id_prefix"]) and got["id_length"] == len(want)
            else:
                assert got == want
        assert len(e.record_ids) == len(e.offsets)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value_len=st.integers(min_value=0, max_value=3_000_000), key_len=st.one_of(st.none(), st.integers(
       min_value=0, max_value=4_000_000)), bound=st.integers(min_value=16_384, max_value=2_000_000),
       error_len=st.integers(min_value=0, max_value=20_000))
def test_a_raw_dead_letter_is_cut_to_the_bound_and_says_so(value_len: int, key_len: int | None, bound: int,
                                                          error_len: int) -> None:
    value = (b"v\x00\xff" * (value_len // 3 + 1))[:value_len]
    key = None if key_len is None else (b"k\"\\" * (key_len // 3 + 1))[:key_len]
    e = make_factory(bound).dead_letter(offset=7, reason="oversized", field="f" * 300, error="\u00e9" * error_len,
                                        value=value, key=key, horizon=7)
    assert_fits([e], bound)
    body = decode_dead_letter(e.outputs[0].value)
    kept_v = base64.b64decode(body["value_b64"])
    assert value.startswith(kept_v) and body["truncated"] == (len(kept_v) < len(value))
    assert body["value_length"] == len(value)
    if key is None:
        assert body["key_b64"] is None and body["key_length"] is None
    else:
        kept_k = base64.b64decode(body["key_b64"])
        assert key.startswith(kept_k) and body.get("key_truncated", False) == (len(kept_k) < len(key))
        assert body["key_length"] == len(key)
    # what fits is kept: a cut to the bound (not to service.dlq_max_bytes) leaves under 4 KiB of it unused
    if len(kept_v) < min(len(value), 1_000_000) or body.get("key_truncated"):
        assert bound - message_size(e.outputs[0].key, e.outputs[0].value) < 4096


def test_the_crash_loop_case_3000_records_with_20_kb_ids_fits_kafkas_default_limit() -> None:
    """The issue's case, pure: CASTLE merged up to 756 records with 20 KB ids into one class; its entry and the
    suppressions of such records, at Kafka's default limit, are chunked and split instead of refused."""
    bound = output_bound(broker=None, topics={}, max_request_size=4_194_304).bytes
    assert bound == FALLBACK_MESSAGE_MAX_BYTES
    f = make_factory(bound)
    rids = [f"{i:05d}" + "x" * 20_000 for i in range(756)]
    members = [{"age": 30, "income": INCOMES[i < 5]} for i in range(756)]
    [cls], _ = f.released_class(offsets=list(range(756)), record_ids=rids, members=members,
                                generalized={"age": "*"}, size=756, loss=0.9, horizon=2999)
    msgs = assert_fits([cls], bound)
    assert len(msgs) >= 15 and len(cls.encode()) > 15_000_000
    sup = f.suppressed(offsets=list(range(1000, 1448)), record_ids=rids[:448], reason="delay_bound", horizon=2999)
    assert_fits(sup, bound)
    assert len(sup) >= 9 and sum(len(e.offsets) for e in sup) == 448
    # a backward recovery scan of these chunks finds the class whole, and a crash after half of them nothing
    scan = LedgerScan(TOPIC, 3, None)
    scan.add_chunk([LedgerRecord(i, k, v) for i, (k, v) in enumerate(msgs)])
    plan = scan.finish()
    assert plan.accounted == frozenset(range(756)) and [e.class_id for e in plan.pending] == [cls.class_id]
    assert {k for _, k in plan.seen_entries} == {k for k, _ in msgs}  # every chunk key tombstoned later
    half = LedgerScan(TOPIC, 3, None)
    half.add_chunk([LedgerRecord(i, k, v) for i, (k, v) in enumerate(msgs[: len(msgs) // 2])])
    plan = half.finish()
    assert not plan.accounted and not plan.pending and len(plan.seen_entries) == len(msgs) // 2


def test_a_chunk_that_contradicts_its_entry_is_corrupt_not_counted() -> None:
    f = make_factory(16_384)
    [cls], _ = f.released_class(offsets=list(range(40)), record_ids=[f"r{i}" + "y" * 1000 for i in range(40)],
                                members=[{"age": 1, "income": INCOMES[i % 2]} for i in range(40)],
                                generalized={"age": "*"}, size=40, loss=0.0, horizon=40)
    msgs = cls.ledger_messages(16_384)
    assert len(msgs) > 2
    body = json.loads(msgs[1][1])
    body["data"] = base64.b64encode(b"x" + base64.b64decode(body["data"])[1:]).decode()  # one byte changed
    bad = [*msgs[:1], (msgs[1][0], json.dumps(body).encode()), *msgs[2:]]
    acc = LedgerAccounting(TOPIC)
    acc.add(3, [LedgerRecord(i, k, v) for i, (k, v) in enumerate(bad)])
    rep = acc.report()
    assert rep.accounted == 0 and len(rep.corrupt) == 1 and "do not add up" in rep.corrupt[0][2]
    assert MESSAGE_FRAMING_BYTES == 512
