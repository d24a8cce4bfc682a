"""Public and internal message formats: what a public class message holds (and never holds), dead letters that
encode whatever the input was, keyed pseudonyms, the release options, and the linkage-search helpers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import json
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_anon.formats.release import (
    PSEUDONYM_HEX_CHARS,
    ClassEncoder,
    EncodedMessage,
    Pseudonymizer,
    ReleaseConfigError,
    ReleaseFormatError,
    ReleaseOptions,
    canonical_id_bytes,
    canonical_json,
    cut_text,
    dead_letter_message,
    decode_class_message,
    decode_dead_letter,
    decode_suppressed,
    random_class_id,
    record_pseudonym,
    resolve_secret,
    safe_text,
    suppressed_message,
)
from stream_anon.service.linkage import (
    FORBIDDEN_PUBLIC_FIELDS,
    ScannedMessage,
    TokenSearch,
    forbidden_fields,
    join_candidates,
)

QIS = ["age", "sex"]
SECRET = b"0123456789abcdef0123456789abcdef"


def members(n: int = 5) -> list[dict[str, Any]]:
    return [{"id": 100 + i, "age": 30 + i, "sex": "Male", "income": ">50K" if i % 3 == 0 else "<=50K",
             "job": "a" if i < 2 else "b"} for i in range(n)]


def encoder(**kw: Any) -> ClassEncoder:
    ids = iter(f"{i:032x}" for i in itertools.count(1))
    return ClassEncoder(qis=QIS, sensitive=kw.pop("sensitive", ["income"]), k=5, new_class_id=lambda: next(ids),
                        **kw)


def test_class_message_is_the_documented_format() -> None:
    msg = encoder().encode(generalized={"sex": "Male", "age": "[30-34]"}, members=members(), size=5, loss=0.25)
    assert msg.role == "anon" and msg.key == b"0" * 31 + b"1"
    assert msg.value == (b'{"v":1,"class":"00000000000000000000000000000001","qi":{"age":"[30-34]","sex":"Male"},'
                         b'"k":5,"l":null,"size":5,"loss":0.25,"sensitive":["income"],'
                         b'"counts":[["<=50K",3],[">50K",2]]}')
    body = decode_class_message(msg.value)
    assert body.n_records == 5 and body.distinct_sensitive() == 2 and body.size == 5
    assert [r["income"] for r in body.rows()] == ["<=50K"] * 3 + [">50K"] * 2
    assert forbidden_fields(msg.value) == []


def test_class_message_does_not_depend_on_member_order_and_carries_no_member_data() -> None:
    ms = members(7)
    enc = encoder()
    values = set()
    for perm in itertools.islice(itertools.permutations(ms), 50):
        m = enc.encode(generalized={"age": "[30-36]", "sex": "Male"}, members=list(perm), size=7, loss=0.1)
        values.add(m.value.replace(m.key or b"", b"ID"))
    assert len(values) == 1  # the only thing that differs between encodings is the random class id
    v = values.pop()
    for m in ms:  # neither record ids nor exact QI values of the members
        assert str(m["id"]).encode() not in v and f'"age":{m["age"]}'.encode() not in v


def test_joint_sensitive_values_are_counted_jointly_and_sorted() -> None:
    msg = encoder(sensitive=["income", "job"]).encode(generalized={"age": "[30-34]", "sex": "Male"},
                                                      members=members(), size=5, loss=0.5)
    body = decode_class_message(msg.value)
    assert body.counts == ((("<=50K", "a"), 1), (("<=50K", "b"), 2), ((">50K", "a"), 1), ((">50K", "b"), 1))
    assert body.distinct_sensitive("job") == 2


def test_numeric_sensitive_values_and_non_finite_loss() -> None:
    ms = [{"age": 30, "sex": "Male", "pay": x} for x in (2.5, 1, 2.5, 10)]
    body = decode_class_message(encoder(sensitive=["pay"]).encode(
        generalized={"age": "[30-30]", "sex": "Male"}, members=ms, size=4, loss=float("nan")).value)
    assert body.loss is None and dict(body.counts) == {(1,): 1, (2.5,): 2, (10,): 1}


def test_record_ids_only_on_opt_in() -> None:
    enc = encoder(include_record_ids=True)
    ms = members()
    msg = enc.encode(generalized={"age": "[30-34]", "sex": "Male"}, members=ms, size=5, loss=0.2,
                     record_ids=[f"r{i}" for i in (4, 2, 0, 3, 1)])
    body = decode_class_message(msg.value)
    assert body.members is not None and [m[0] for m in body.members] == ["r0", "r1", "r2", "r3", "r4"]
    assert dict((m[0], m[1]) for m in body.members)["r4"] == ">50K"  # r4 was given for member 0
    assert forbidden_fields(msg.value) == ["members"]
    with pytest.raises(ValueError):
        enc.encode(generalized={"age": "[30-34]", "sex": "Male"}, members=ms, size=5, loss=0.2)


def test_class_ids_are_random_128_bit_hex() -> None:
    ids = {random_class_id() for _ in range(2000)}
    assert len(ids) == 2000 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    enc = ClassEncoder(qis=QIS, sensitive=["income"], k=5)
    a = enc.encode(generalized={"age": "[30-34]", "sex": "Male"}, members=members(), size=5, loss=0.1)
    b = enc.encode(generalized={"age": "[30-34]", "sex": "Male"}, members=members(), size=5, loss=0.1)
    assert a.key != b.key  # the same class content twice: unrelated ids


@pytest.mark.parametrize("value", [
    None, b"", b"\xff", b"[]", b'{"v":2}', b'{"v":1}',
    b'{"v":1,"class":"c","qi":{"a":1},"k":5,"l":null,"size":5,"loss":0.1,"sensitive":["s"],"counts":[]}',
    b'{"v":1,"class":"c","qi":{},"k":true,"l":null,"size":5,"loss":0.1,"sensitive":["s"],"counts":[]}',
    b'{"v":1,"class":"c","qi":{},"k":5,"l":null,"size":5,"loss":0.1,"sensitive":["s"],"counts":[["x",0]]}',
    b'{"v":1,"class":"c","qi":{},"k":5,"l":null,"size":5,"loss":0.1,"sensitive":["s"],"counts":[["x"]]}',
    b'{"v":1,"class":"c","qi":{},"k":5,"l":null,"size":5,"loss":"0.1","sensitive":["s"],"counts":[]}',
    b"[" * 50000 + b"]" * 50000,
])
def test_decoding_is_strict_and_raises_one_error_type(value: bytes | None) -> None:
    with pytest.raises(ReleaseFormatError):
        decode_class_message(value)


# ---------------------------------------------------------------------------------------------- suppressed
def test_suppressed_message() -> None:
    m = suppressed_message(input_topic="adult.raw", partition=2, offsets=[9, 4], record_ids=["b", "a"],
                           reason="gate", detail="4 individuals < k=5")
    assert m.role == "suppressed" and m.key == b"adult.raw/2/4"
    body = decode_suppressed(m.value)
    assert body["offsets"] == [4, 9] and body["record_ids"] == ["a", "b"] and body["release"] == "adult.raw/2/4"
    assert body["detail"] == "4 individuals < k=5"
    for bad in ({"reason": "other"}, {"offsets": []}, {"record_ids": ["a"]}):
        with pytest.raises(ValueError):
            suppressed_message(**{"input_topic": "t", "partition": 0, "offsets": [1, 2], "record_ids": ["a", "b"],
                                  "reason": "delay_bound", **bad})


# ---------------------------------------------------------------------------------------------- dead letters
RECORD = json.dumps({"id": "zz-7", "age": 95, "workclass": "Never-worked-XYZZY"}).encode()


def test_dead_letter_is_redacted_by_default() -> None:
    m = dead_letter_message(input_topic="adult.raw", partition=1, offset=17, reason="out_of_domain", field="age",
                            error="field 'age': value 95 outside [17, 90]", value=RECORD, key=b"zz-7", secret=SECRET)
    assert m.role == "dlq" and m.key == b"adult.raw/1/17"
    body = decode_dead_letter(m.value)
    assert body == {"v": 1, "reason": "out_of_domain", "field": "age", "topic": "adult.raw", "partition": 1,
                    "offset": 17, "value_length": len(RECORD),
                    "value_hmac": hmac.new(SECRET, RECORD, hashlib.sha256).hexdigest(), "payload": "redacted"}
    for token in (b"XYZZY", b"zz-7", b"95"):
        assert token not in m.value.replace(body["value_hmac"].encode(), b"")


def test_dead_letter_raw_payload_and_truncation() -> None:
    m = dead_letter_message(input_topic="t", partition=0, offset=3, reason="oversized", field=None, error="big",
                            value=RECORD, key=b"k", secret=SECRET, payload="raw", max_payload_bytes=10)
    body = decode_dead_letter(m.value)
    assert base64.b64decode(body["value_b64"]) == RECORD[:10] and body["truncated"] is True
    assert body["error"] == "big" and base64.b64decode(body["key_b64"]) == b"k"
    full = decode_dead_letter(dead_letter_message(input_topic="t", partition=0, offset=3, reason="empty", field=None,
                                                  error=None, value=None, key=None, secret=SECRET, payload="raw").value)
    assert full["value_length"] is None and full["value_hmac"] is None and "value_b64" not in full
    with pytest.raises(ValueError):
        dead_letter_message(input_topic="t", partition=0, offset=3, reason="x", field=None, error=None, value=None,
                            key=None, secret=SECRET, payload="everything")


@settings(max_examples=300, deadline=None)
@given(field=st.text(), error=st.text(), value=st.binary(max_size=64), raw=st.booleans())
def test_dead_letter_encodes_any_text_and_bytes_as_strict_utf8_json(field: str, error: str, value: bytes,
                                                                     raw: bool) -> None:
    m = dead_letter_message(input_topic="t\udcff", partition=0, offset=1, reason="extra_field", field=field,
                            error=error, value=value, key=value, secret=SECRET, payload="raw" if raw else "redacted")
    m.value.decode("ascii")
    body = json.loads(m.value)
    # no lone surrogate survives into the message (strict JSON parsers reject them)
    assert all(not (0xD800 <= ord(c) <= 0xDFFF) for c in json.dumps(body, ensure_ascii=False))
    assert body["field"] == cut_text(safe_text(field), 200)  # a field name is cut at 200 characters


def test_lone_surrogate_field_name_and_non_utf8_bytes() -> None:
    m = dead_letter_message(input_topic="adult.raw", partition=0, offset=5, reason="extra_field", field="\ud800",
                            error="unexpected field(s) ['\ud800']", value=b'{"\\ud800": 1}', key=b"\xff\xfe",
                            secret=SECRET, payload="raw")
    body = json.loads(m.value)
    assert body["field"] == "\\ud800" and body["error"] == "unexpected field(s) ['\\ud800']"
    assert safe_text(b"a\xffb") == "a\\xffb" and safe_text("ok é") == "ok é" and safe_text(None) is None


# ---------------------------------------------------------------------------------------------- pseudonyms
def test_pseudonym_is_hmac_sha256_of_the_canonical_id() -> None:
    p = record_pseudonym(SECRET, "adult-00017")
    assert p == hmac.new(SECRET, b'"adult-00017"', hashlib.sha256).hexdigest()[:PSEUDONYM_HEX_CHARS]
    assert len(p) == 32 and re.fullmatch(r"[0-9a-f]+", p)
    assert record_pseudonym(SECRET, 12) != record_pseudonym(SECRET, "12")
    assert record_pseudonym(SECRET, "x") != record_pseudonym(b"another secret of 32 bytes......", "x")
    ps = Pseudonymizer(SECRET)
    ids = ["adult-00017", 5, "\ud800", "é"]
    assert [ps(i) for i in ids] == [record_pseudonym(SECRET, i) for i in ids]
    assert "secret" not in repr(ps).lower() or SECRET.decode() not in repr(ps)
    assert len(Pseudonymizer(SECRET, 64)("a")) == 64
    for rid in ["plain", 'q"uote\\', "\ud800", "é", 0, -7, 10**20, True, None, 1.5, ["a"]]:
        assert canonical_id_bytes(rid) == json.dumps(rid, ensure_ascii=True, separators=(",", ":")).encode()
    with pytest.raises(ValueError):
        Pseudonymizer(SECRET, 8)


def test_pseudonyms_do_not_collide_on_adult_sized_id_sets() -> None:
    ps = Pseudonymizer(SECRET)
    ids = [f"adult-{i:05d}" for i in range(32561)]
    assert len({ps(i) for i in ids}) == len(ids)


# ---------------------------------------------------------------------------------------------- options, secret
def test_secret_resolution_and_validation_never_print_the_secret() -> None:
    s = resolve_secret("correct horse battery staple")
    assert s.value == b"correct horse battery staple" and not s.generated
    assert "horse" not in repr(s) and "horse" not in str(s) and "horse" not in f"{s}"
    g = resolve_secret(None, token_hex=lambda n: "ab" * n)
    assert g.generated and g.text == "ab" * 32 and g.value == b"ab" * 32
    r1, r2 = resolve_secret(None), resolve_secret(None)
    assert re.fullmatch(r"[0-9a-f]{64}", r1.text) and r1.text != r2.text
    assert resolve_secret(r1.text).value == r1.value  # the generated text, passed on as configuration
    with pytest.raises(ReleaseConfigError) as e:
        resolve_secret("hunter2")
    assert "release.secret" in str(e.value) and "7 bytes" in str(e.value) and "hunter2" not in str(e.value)


def test_release_options_validate_and_warn() -> None:
    opts = ReleaseOptions()
    assert (opts.include_record_ids, opts.secret, opts.dlq_payload) == (False, None, "redacted")
    assert opts.startup_warnings(secret_generated=False) == []
    warn = ReleaseOptions(include_record_ids=True, dlq_payload="raw").startup_warnings(secret_generated=True)
    assert len(warn) == 3 and "OUTSIDE the threat model" in warn[0] and "release.secret not set" in warn[2]
    with pytest.raises(ReleaseConfigError, match=r"dlq.payload: must be one of \['redacted', 'raw'\], got 'all'"):
        ReleaseOptions(dlq_payload="all")
    with pytest.raises(ReleaseConfigError, match="release.include_record_ids"):
        ReleaseOptions(include_record_ids="yes")  # type: ignore[arg-type]


def test_canonical_json_is_compact_ascii_and_rejects_nan() -> None:
    assert canonical_json({"a": [1, "é"], "b": None}) == b'{"a":[1,"\\u00e9"],"b":null}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("inf")})
    m = EncodedMessage("anon", None, b"v")
    assert m.digest() != EncodedMessage("anon", b"", b"v").digest() != EncodedMessage("dlq", None, b"v").digest()


# ---------------------------------------------------------------------------------------------- linkage helpers
def _msg(value: bytes, key: bytes | None = None, headers: tuple[tuple[str, bytes], ...] = ()) -> ScannedMessage:
    return ScannedMessage("adult.anon", 0, 7, key, value, headers)


def test_token_search_finds_tokens_in_keys_values_and_headers() -> None:
    search = TokenSearch(["adult-00017", "adult-00018", b"\xffid", 4242])
    msgs = [_msg(b'{"x":"adult-00017"}'), _msg(b"{}", key=b"adult-00018"), _msg(b"{}", headers=(("src", b"4242"),)),
            _msg(b'{"counts":[["<=50K",7]]}')]
    hits = search.scan(msgs)
    assert [(h.where, h.token) for h in hits] == [("value", b"adult-00017"), ("key", b"adult-00018"),
                                                  ("header:src", b"4242")]
    bounded = TokenSearch(["adult-1"], word_boundary=True)
    assert bounded.find(b"adult-12 adult-1x") == [] and bounded.find(b"[adult-1]") == [b"adult-1"]
    assert TokenSearch(["17"], word_boundary=True).find(b'"[17-21]"') == [b"17"]  # why offsets need structure
    with pytest.raises(ValueError):
        TokenSearch([""])


def test_token_search_matches_a_naive_search() -> None:
    rng = random.Random(3)
    tokens = [f"r{rng.randrange(10**6)}" for _ in range(300)]
    search = TokenSearch(tokens)
    for _ in range(200):
        data = "".join(rng.choice(["r", "1", "2", "x", ",", *tokens[:5]]) for _ in range(40)).encode()
        assert search.find(data) == sorted({t.encode() for t in tokens if t.encode() in data})


def test_forbidden_fields_flag_the_old_format_and_pass_the_new() -> None:
    old = json.dumps({"kind": "class", "release_id": "adult.raw/0/5", "records": [
        {"record_id": "adult-00005", "src_offset": 5, "delay": 3, "latency_s": 0.1, "income": "<=50K"}]}).encode()
    assert forbidden_fields(old) == ["release_id", "records[0].record_id", "records[0].src_offset",
                                     "records[0].delay", "records[0].latency_s"]
    assert forbidden_fields(b"\xff") == ["<not JSON>"] and forbidden_fields(None) == []
    assert {"record_id", "src_offset", "latency_s", "horizon"} <= FORBIDDEN_PUBLIC_FIELDS


def test_join_candidates_find_a_shared_identifier() -> None:
    pseud = "9f86d081884c7d659a2feaa0c55ad015"
    anon = [_msg(b'{"class":"00000000000000000000000000000001","qi":{"workclass":"Self-emp-not-inc"}}',
                 key=b"00000000000000000000000000000001")]
    side_ok = [ScannedMessage("adult.krr", 0, 1, pseud.encode(), b'{"values":{"workclass":"Self-emp-not-inc"}}')]
    side_bad = [ScannedMessage("adult.krr", 0, 1, b"00000000000000000000000000000001", b"{}")]
    assert join_candidates(anon, side_ok) == set()  # a shared category is no identifier
    assert join_candidates(anon, side_bad) == {b"00000000000000000000000000000001"}
    assert join_candidates(anon, side_bad, ignore=["00000000000000000000000000000001"]) == set()
    ids = [_msg(b'{"record_id":"adult-00017"}')]
    assert join_candidates(ids, [_msg(b'{"id":"adult-00017","v":[1]}')]) == {b"adult-00017"}


# ---------------------------------------------------------------------------------------------- diversity models
def test_class_message_states_a_model_beyond_distinct_l_and_the_reference_it_was_checked_on() -> None:
    from stream_anon.core.diversity import DiversityRequirement

    req = DiversityRequirement(model="entropy", l=1.5, t=0.2)
    msg = encoder(l=2, requirement=req).encode(generalized={"sex": "Male", "age": "[30-34]"}, members=members(),
                                               size=5, loss=0.25, reference=(("<=50K", 760), (">50K", 240)))
    assert msg.value == (b'{"v":1,"class":"00000000000000000000000000000001","qi":{"age":"[30-34]","sex":"Male"},'
                         b'"k":5,"l":2,"size":5,"loss":0.25,"sensitive":["income"],'
                         b'"counts":[["<=50K",3],[">50K",2]],"diversity":{"model":"entropy","l":1.5},'
                         b'"t_closeness":{"t":0.2,"distance":"equal","reference":[["<=50K",760],[">50K",240]]}}')
    body = decode_class_message(msg.value)
    assert body.requirement() == req and body.reference() == {"<=50K": 760, ">50K": 240}
    assert forbidden_fields(msg.value) == []
    # distinct l alone: the message is the v1 message it always was (no new field)
    plain = encoder(l=2, requirement=DiversityRequirement(l=2)).encode(
        generalized={"sex": "Male", "age": "[30-34]"}, members=members(), size=5, loss=0.25)
    assert b"diversity" not in plain.value and b"t_closeness" not in plain.value
    assert decode_class_message(plain.value).requirement() == DiversityRequirement(l=2)
    with pytest.raises(ValueError, match="reference"):
        encoder(requirement=DiversityRequirement(t=0.2)).encode(
            generalized={"sex": "Male", "age": "[30-34]"}, members=members(), size=5, loss=0.25)


@pytest.mark.parametrize("extra", [
    b',"diversity":{"model":"max","l":2}', b',"diversity":{"model":"entropy"}', b',"diversity":[1]',
    b',"diversity":{"model":"recursive","l":2,"c":"3"}', b',"diversity":{"model":"entropy","l":2,"x":1}',
    b',"t_closeness":{"t":0.2,"distance":"equal","reference":[]}',
    b',"t_closeness":{"t":0.2,"distance":"auto","reference":[["a",1]]}',
    b',"t_closeness":{"t":"0.2","distance":"equal","reference":[["a",1]]}',
    b',"t_closeness":{"t":0.2,"distance":"equal","reference":[["a",0]]}',
])
def test_model_fields_are_decoded_strictly(extra: bytes) -> None:
    base = b'{"v":1,"class":"c","qi":{},"k":5,"l":2,"size":5,"loss":0.1,"sensitive":["s"],"counts":[["x",5]]'
    assert decode_class_message(base + b"}").counts == ((("x",), 5),)
    with pytest.raises(ReleaseFormatError):
        decode_class_message(base + extra + b"}")
