"""Fuzzing the real :class:`RecordDecoder` with every kind of poison message (``tests/fuzz_support.py``), valid
records interleaved: it never raises, every input gets exactly one outcome (a record, or a dead letter with a
reason of ``DLQ_REASONS``, bounded UTF-8-encodable ``error`` and ``field``), the reason is the one the poison
was built for, and valid records round-trip.  Seeded and bounded: the same messages on every run."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_support import KINDS, VALID, FuzzMessage, encode, malformed_messages, schema_records  # type: ignore[import-not-found]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_anon.core.schema import Schema, adult_schema
from stream_anon.formats.decoding import (
    DLQ_REASON_MEANINGS,
    DLQ_REASONS,
    MAX_ERROR_CHARS,
    MAX_FIELD_CHARS,
    MAX_JSON_DEPTH,
    DeadLetter,
    RecordDecoder,
    json_depth,
)

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 65536  # the default service.max_message_bytes
N_ADULT = 40_000
N_CUSTOM = 10_000


def outcome(decoder: RecordDecoder, m: FuzzMessage) -> tuple[str, dict[str, Any] | DeadLetter]:
    """Decode one message and check the contract every outcome must meet; (outcome name, result)."""
    got = decoder.decode(m.value)  # must not raise: an exception fails the test with the message's kind
    if isinstance(got, DeadLetter):
        assert got.reason in DLQ_REASONS, (m.kind, got)
        assert isinstance(got.error, str) and 0 < len(got.error) <= MAX_ERROR_CHARS, (m.kind, got.reason)
        got.error.encode("utf-8")  # every header writer can encode it
        assert "\n" not in got.error, (m.kind, got.error)
        if got.field is not None:
            assert isinstance(got.field, str) and len(got.field) <= MAX_FIELD_CHARS
            got.field.encode("utf-8")
        return got.reason, got
    assert isinstance(got, dict), (m.kind, type(got))
    return VALID, got


def run_fuzz(decoder: RecordDecoder, messages: list[FuzzMessage]) -> Counter[tuple[str, str]]:
    """Every message's outcome checked against what it was built for; counts by (kind, outcome)."""
    counts: Counter[tuple[str, str]] = Counter()
    for i, m in enumerate(messages):
        name, got = outcome(decoder, m)
        counts[(m.kind, name)] += 1
        if m.expect is not None:
            assert name == m.expect, (i, m.kind, m.expect, got, (m.value or b"")[:300])
        if name == VALID and m.record is not None:
            assert got == m.record, (i, m.kind, got, m.record)  # round trip: the record that was encoded
    assert sum(counts.values()) == len(messages)  # exactly one outcome each
    return counts


def report(title: str, counts: Counter[tuple[str, str]]) -> None:
    """Counts by kind and outcome, printed (``pytest -s`` shows them; the lead's closing note quotes them)."""
    by_kind: dict[str, Counter[str]] = {}
    for (kind, out), n in counts.items():
        by_kind.setdefault(kind, Counter())[out] += n
    print(f"\n{title}: {sum(counts.values()):,} messages", file=sys.stderr)
    for kind in sorted(by_kind, key=KINDS.index):
        outs = ", ".join(f"{o} {n:,}" for o, n in by_kind[kind].most_common())
        print(f"  {kind:<26} {sum(by_kind[kind].values()):>6,}  {outs}", file=sys.stderr)
    totals = Counter[str]()
    for (_, out), n in counts.items():
        totals[out] += n
    print("  outcomes: " + ", ".join(f"{o} {n:,}" for o, n in totals.most_common()), file=sys.stderr)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fuzz_adult_decoder_every_kind() -> None:
    messages = malformed_messages(20261124, N_ADULT, max_message_bytes=MAX_BYTES)
    counts = run_fuzz(RecordDecoder(adult_schema(), MAX_BYTES), messages)
    report("decoder fuzz, ADULT schema", counts)
    kinds = {k for k, _ in counts}
    assert kinds == set(KINDS)  # every kind drawn
    outcomes = {o for _, o in counts}
    # every reason the decoder can give was reached (engine_error/internal_error come from elsewhere or bugs)
    assert outcomes >= {VALID, *DLQ_REASONS} - {"engine_error", "internal_error", "corrupt_record",
                                                    "control_header_on_record", "unknown_control"}, sorted(outcomes)
    assert ("valid", VALID) in counts and counts[("valid", VALID)] > N_ADULT // 10


def _custom_schema(tmp_path: Path) -> Schema:
    """A user's schema: record id ``pid``, a person id, a float attribute without a domain, free text."""
    spec = {"name": "clinic", "record_id": "visit", "person_id": "patient", "attributes": [
        {"name": "age", "role": "quasi_identifier", "type": "numeric", "domain": [0, 120], "integer": True},
        {"name": "weight", "role": "other", "type": "numeric"},
        {"name": "score", "role": "other", "type": "numeric", "integer": True},
        {"name": "note", "role": "other", "type": "categorical"},
        {"name": "diagnosis", "role": "sensitive", "type": "categorical", "values": ["a", "b", "c"]}]}
    path = tmp_path / "clinic.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    return Schema.load(path)


@pytest.mark.slow  # (CI's full suite; not in the fast tier, for its time budget)
@pytest.mark.timeout(300)
def test_fuzz_custom_schema_decoder(tmp_path: Path) -> None:
    schema = _custom_schema(tmp_path)
    records = schema_records(schema, 300, random.Random(5), prefix="v")
    messages = malformed_messages(77, N_CUSTOM, schema=schema, records=records, max_message_bytes=8192)
    counts = run_fuzz(RecordDecoder(schema, 8192), messages)
    report("decoder fuzz, custom schema (record id 'visit', person id, no-domain numbers)", counts)
    assert {k for k, _ in counts} == set(KINDS)


def test_fuzz_is_deterministic() -> None:
    a = malformed_messages(3, 2000)
    b = malformed_messages(3, 2000)
    assert [(m.kind, m.value, m.headers, m.key) for m in a] == [(m.kind, m.value, m.headers, m.key) for m in b]
    assert malformed_messages(4, 200) != malformed_messages(3, 200)


# ------------------------------------------------------------------ each poison of issue 11, pinned
GOOD: dict[str, Any] = {"id": "adult-1", "age": 39, "workclass": "State-gov", "fnlwgt": 77516,
                        "education": "Bachelors", "education-num": 13, "marital-status": "Never-married",
                        "occupation": "Adm-clerical", "relationship": "Not-in-family", "race": "White", "sex": "Male",
                        "capital-gain": 2174, "capital-loss": 0, "hours-per-week": 40,
                        "native-country": "United-States", "income": "<=50K"}


def lit(field: str, literal: str) -> bytes:
    rest = encode({k: v for k, v in GOOD.items() if k != field})
    return rest[:-1] + b',"' + field.encode() + b'":' + literal.encode("utf-8", "surrogatepass") + b"}"


POISON: list[tuple[str, bytes | None, str, str | None]] = [  # (name, value, reason, field)
    ("2000 levels, whole value", b"[" * 2000 + b"]" * 2000, "too_deep", None),
    ("2000 levels of objects", b'{"a":' * 2000 + b"1" + b"}" * 2000, "too_deep", None),
    ("2000 levels in a field", lit("age", "[" * 2000 + "]" * 2000), "too_deep", None),
    ("unclosed 100000 levels", b"[" * 60000, "too_deep", None),
    ("33 levels", b"[" * 33 + b"]" * 33, "too_deep", None),
    ("32 levels: not too deep", b"[" * 32 + b"]" * 32, "not_an_object", None),
    ("5000-digit integer", lit("age", "9" * 5000), "out_of_domain", "age"),
    ("400-digit integer (float overflow)", lit("capital-gain", "9" * 400), "out_of_domain", "capital-gain"),
    ("5000-digit record id", lit("id", "1" * 5000), "bad_record_id", "id"),
    ("2**63 record id", lit("id", str(2**63)), "bad_record_id", "id"),
    ("NaN", lit("age", "NaN"), "out_of_domain", "age"),
    ("Infinity", lit("fnlwgt", "Infinity"), "out_of_domain", "fnlwgt"),
    ("-Infinity", lit("hours-per-week", "-Infinity"), "out_of_domain", "hours-per-week"),
    ("1e308", lit("age", "1e308"), "out_of_domain", "age"),
    ("1e309", lit("age", "1e309"), "out_of_domain", "age"),
    ("huge float in an integer field", lit("fnlwgt", "1.7976931348623157e308"), "out_of_domain", "fnlwgt"),
    ("lone surrogate field name", encode(GOOD)[:-1] + b',"\\ud800":1}', "extra_field", "\\ud800"),
    ("invalid UTF-8", encode(GOOD)[:5] + b"\xff" + encode(GOOD)[5:], "malformed_json", None),
    ("UTF-16", json.dumps(GOOD).encode("utf-16"), "malformed_json", None),
    ("truncated", encode(GOOD)[:40], "malformed_json", None),
    ("array", b"[1,2]", "not_an_object", None),
    ("string", b'"x"', "not_an_object", None),
    ("number", b"42", "not_an_object", None),
    ("null", b"null", "not_an_object", None),
    ("true", b"true", "not_an_object", None),
    ("empty", b"", "empty", None),
    ("tombstone", None, "empty", None),
    ("1 MiB", encode({**GOOD, "income": "x" * (1 << 20)}), "oversized", None),
    ("duplicate key", encode(GOOD)[:-1] + b',"age":90}', "duplicate_field", "age"),
    ("extra field", encode({**GOOD, "ssn": "1"}), "extra_field", "ssn"),
    ("missing field", encode({k: v for k, v in GOOD.items() if k != "sex"}), "missing_field", "sex"),
    ("bool for a number", lit("age", "true"), "wrong_type", "age"),
    ("number as a string", lit("age", '"39"'), "wrong_type", "age"),
]


@pytest.mark.parametrize(("name", "value", "reason", "field"), POISON, ids=[p[0] for p in POISON])
def test_each_poison_message_is_a_dead_letter_with_its_reason(name: str, value: bytes | None, reason: str,
                                                              field: str | None) -> None:
    got = RecordDecoder(adult_schema(), MAX_BYTES).decode(value)
    assert isinstance(got, DeadLetter), got
    assert (got.reason, got.field) == (reason, field), got
    got.error.encode("utf-8")
    assert len(got.error) <= MAX_ERROR_CHARS


def test_a_utf8_bom_is_accepted_and_the_record_is_the_same() -> None:
    d = RecordDecoder(adult_schema(), MAX_BYTES)
    assert d.decode(b"\xef\xbb\xbf" + encode(GOOD)) == d.decode(encode(GOOD)) == GOOD


def test_field_names_and_errors_are_escaped_and_bounded() -> None:
    d = RecordDecoder(adult_schema(), MAX_BYTES)
    long_name = "\udfff" + "n" * 5000
    got = d.decode(encode(GOOD)[:-1] + b',"' + json.dumps(long_name)[1:-1].encode() + b'":1}')
    assert isinstance(got, DeadLetter) and got.reason == "extra_field"
    assert got.field is not None and got.field.startswith("\\udfff") and len(got.field) == MAX_FIELD_CHARS
    many = encode({**GOOD, **{f"extra{i}": i for i in range(3000)}})
    got = d.decode(many)
    assert isinstance(got, DeadLetter) and got.reason == "extra_field" and len(got.error) <= MAX_ERROR_CHARS
    assert "more)" in got.error


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth('{"a":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["}') == 1
    assert json_depth('{"a":"\\"[[[[","b":[[1]]}') == 3
    assert json_depth("[" * 50) == 50
    assert json_depth("1") == 0
    assert MAX_JSON_DEPTH < 100  # far below the parser's recursion limit: the reason never depends on it


def test_an_unexpected_exception_is_an_internal_error_dead_letter(monkeypatch: pytest.MonkeyPatch) -> None:
    d = RecordDecoder(adult_schema(), MAX_BYTES)

    def broken(value: bytes | None) -> Any:
        raise KeyError("\ud800 boom\nsecond line")

    monkeypatch.setattr(d, "_decode", broken)
    got = d.decode(encode(GOOD))
    assert isinstance(got, DeadLetter) and got.reason == "internal_error" and "KeyError" in got.error
    got.error.encode("utf-8")


def test_every_reason_is_documented_in_the_service_docs() -> None:
    docs = (ROOT / "docs" / "service.md").read_text(encoding="utf-8")
    section = docs.split("### Dead-letter reasons", 1)[1].split("\n## ", 1)[0]
    for reason in DLQ_REASONS:
        assert f"| `{reason}` |" in section, f"dead-letter reason {reason!r} not in docs/service.md"
    assert set(DLQ_REASON_MEANINGS) == set(DLQ_REASONS)


# ------------------------------------------------------------------ hypothesis: arbitrary bytes and JSON
SMALL_DECODER = RecordDecoder(adult_schema(), 256)
LARGE_DECODER = RecordDecoder(adult_schema(), 1 << 20)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30)


@settings(max_examples=500, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_hypothesis_any_bytes_give_one_outcome(value: bytes) -> None:
    outcome(SMALL_DECODER, FuzzMessage("hypothesis_bytes", value, []))  # (500 examples; CI's full suite: 1,500)


@pytest.mark.slow
@settings(max_examples=1500, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400))
def test_hypothesis_any_bytes_give_one_outcome_on_more_examples(value: bytes) -> None:
    outcome(SMALL_DECODER, FuzzMessage("hypothesis_bytes", value, []))


@pytest.mark.slow
@settings(max_examples=400, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*GOOD, "x", "\ud800"]), json_values, max_size=20), st.booleans())
def test_hypothesis_any_json_object_gives_one_outcome(obj: dict[str, Any], over_good: bool) -> None:
    if over_good:
        obj = {**GOOD, **obj}
    value = json.dumps(obj).encode()  # allow_nan: NaN/Infinity literals included
    name, got = outcome(LARGE_DECODER, FuzzMessage("hypothesis_json", value, []))
    if name == VALID:
        assert isinstance(got, dict) and set(got) == set(GOOD)
