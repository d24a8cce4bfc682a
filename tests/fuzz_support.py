"""Malformed (and valid) input messages for the fuzz tests: seeded, deterministic, every kind of poison.

``malformed_messages(seed, n)`` returns ``n`` :class:`FuzzMessage` ``(kind, value, headers, key, expect,
record)`` drawn round-robin over :data:`KINDS` (``weights`` skews that), each built from a valid record of the
schema with one fault injected.  ``expect`` is what :class:`~stream_anon.formats.decoding.RecordDecoder` must
make of the *value*: ``"valid"``, a dead-letter reason, or None where the outcome is not determined by
construction (random mutations: any outcome but an exception is right).  ``record`` is the record a valid
value decodes to.  Header kinds (``control_header_on_record``, ``garbage_headers``, ``non_utf8_header_key``)
carry a valid value: what they test is the service's handling of the headers (a record with the control
header must still be accounted; kafka-python raises ``CorruptRecordError`` in ``poll()`` on a header key that
is not UTF-8).  :class:`RawHeaderKey` lets kafka-python's producer send such a key.

Used by ``tests/test_fuzz_decoder.py`` (the decoder alone) and the service-level fuzz test (through the real
service process), which sends ``value``, ``key`` and ``headers`` as they are.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from stream_anon.core.schema import Attribute, Kind, Schema, adult_schema
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER, MAX_JSON_DEPTH

VALID = "valid"
BOM = b"\xef\xbb\xbf"
Headers = list[tuple[str, bytes]]


class FuzzMessage(NamedTuple):
    kind: str
    value: bytes | None
    headers: Headers
    key: bytes | None = None
    expect: str | None = None  # "valid", a dead-letter reason, or None (any outcome but an exception)
    record: dict[str, Any] | None = None  # what a valid value decodes to


class RawHeaderKey(str):
    """A header key that kafka-python's producer writes as the given raw bytes (it calls ``key.encode("utf-8")``),
    e.g. bytes that are not UTF-8."""

    raw: bytes

    def __new__(cls, raw: bytes) -> RawHeaderKey:
        obj = super().__new__(cls, raw.decode("latin-1"))
        obj.raw = raw
        return obj

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return self.raw


def encode(record: Mapping[str, Any], **dumps: Any) -> bytes:
    """A record as the replay tools send it (compact UTF-8 JSON) unless ``dumps`` options say otherwise."""
    opts: dict[str, Any] = {"separators": (",", ":"), "ensure_ascii": False, **dumps}
    return json.dumps(record, **opts).encode("utf-8", "surrogatepass")


def with_literal(record: Mapping[str, Any], field: str, literal: str) -> bytes:
    """The record's JSON with ``field``'s value replaced by the raw JSON text ``literal`` (placed last)."""
    rest = {k: v for k, v in record.items() if k != field}
    body = encode(rest)
    sep = b"," if rest else b""
    return body[:-1] + sep + json.dumps(field).encode() + b":" + literal.encode("utf-8", "surrogatepass") + b"}"


def schema_records(schema: Schema, n: int, rng: random.Random, *, prefix: str = "r") -> list[dict[str, Any]]:
    """``n`` valid records of ``schema`` (values uniform over each attribute's domain), normalized the way the
    decoder returns them (``Schema.validate``)."""
    out = []
    for i in range(n):
        rec: dict[str, Any] = {}
        if schema.record_id:
            rec[schema.record_id] = f"{prefix}-{i:06d}" if rng.random() < 0.9 else rng.randrange(1, 10**12)
        if schema.person_id and schema.person_id != schema.record_id:
            rec[schema.person_id] = f"p{rng.randrange(50)}"
        for a in schema.attributes:
            rec[a.name] = _valid_value(a, rng)
        out.append(schema.validate(rec))
    return out


def _valid_value(a: Attribute, rng: random.Random) -> Any:
    if a.kind is Kind.NUMERIC:
        lo = a.lo if a.lo is not None else -1e6
        hi = a.hi if a.hi is not None else 1e6
        return rng.randint(math.ceil(lo), math.floor(hi)) if a.integer else rng.uniform(lo, hi)
    values = a.domain_values
    return rng.choice(values) if values else "".join(rng.choice("abcxyz -_é") for _ in range(rng.randrange(1, 12)))


def _numeric_verdict(a: Attribute, x: float) -> str:
    """What the decoder makes of the JSON number ``x`` in numeric attribute ``a``."""
    if not math.isfinite(x) or (a.lo is not None and x < a.lo) or (a.hi is not None and x > a.hi):
        return "out_of_domain"
    if a.integer and not float(x).is_integer():
        return "out_of_domain"
    return VALID


class _Gen:
    """One generator run: a schema, its valid records, a seeded ``random.Random``."""

    def __init__(self, schema: Schema, records: list[dict[str, Any]], rng: random.Random,
                 max_message_bytes: int) -> None:
        self.schema, self.records, self.rng, self.max_bytes = schema, records, rng, max_message_bytes
        self.numeric = [a for a in schema.attributes if a.kind is Kind.NUMERIC]
        self.categorical = [a for a in schema.attributes if a.kind is Kind.CATEGORICAL]
        self.rid = schema.record_id
        self.expected = sorted(set(schema.names) | {f for f in (schema.record_id, schema.person_id) if f})
        self._i = 0
        self._big: dict[int, bytes] = {}

    # -- helpers
    def record(self) -> dict[str, Any]:
        self._i += 1
        return dict(self.records[self._i % len(self.records)])

    def key(self, rec: Mapping[str, Any] | None) -> bytes | None:
        if rec is None or not self.rid or self.rid not in rec:
            return None
        return str(rec[self.rid]).encode("utf-8", "backslashreplace")

    def msg(self, kind: str, value: bytes | None, expect: str | None, *, rec: Mapping[str, Any] | None = None,
            headers: Headers | None = None, valid: dict[str, Any] | None = None) -> FuzzMessage:
        key = self.key(rec)
        if value is None and key is None:
            key = f"tombstone-{self._i}".encode()  # a tombstone is keyed (a producer refuses no key and no value)
            self._i += 1
        return FuzzMessage(kind, value, headers or [], key, expect, valid)

    def field_of(self, kinds: Iterable[Kind]) -> Attribute:
        pool = [a for a in self.schema.attributes if a.kind in set(kinds)]
        return self.rng.choice(pool)

    def any_field(self) -> str:
        return self.rng.choice(self.expected)

    def reason_for_field(self, name: str, numeric: str, categorical: str = "wrong_type") -> str:
        """The reason of a bad value in field ``name``: the record id's, a numeric's or a categorical's."""
        if name == self.rid:
            return "bad_record_id"
        if name == self.schema.person_id:
            return "wrong_type"
        return numeric if self.schema[name].kind is Kind.NUMERIC else categorical

    def nested(self, depth: int, leaf: str = "1", kind: str | None = None) -> str:
        kind = kind or self.rng.choice(["array", "object", "mixed"])
        out = leaf
        for i in range(depth):
            k = kind if kind != "mixed" else ("array" if i % 2 else "object")
            out = f"[{out}]" if k == "array" else f'{{"a":{out}}}'
        return out

    # -- valid values
    def valid(self) -> FuzzMessage:
        r = self.record()
        return self.msg("valid", encode(r), VALID, rec=r, valid=r)

    def valid_formatting(self) -> FuzzMessage:
        r = self.record()
        rng = self.rng
        items = list(r.items())
        rng.shuffle(items)
        opts = rng.choice([{"indent": 2}, {"separators": (", ", ": ")}, {"ensure_ascii": True}, {}])
        body = encode(dict(items), **opts)
        ws = rng.choice([b"", b" ", b"\n", b"\t\r\n "])
        value = ws + body + rng.choice([b"", b" ", b"\n", b"\r\n"])
        return self.msg("valid_formatting", value, VALID, rec=r, valid=r)

    def valid_bom(self) -> FuzzMessage:
        """A leading UTF-8 byte-order mark: accepted (docs/service.md, "Dead-letter reasons")."""
        r = self.record()
        return self.msg("valid_bom", BOM + encode(r), VALID, rec=r, valid=r)

    def valid_integral_floats(self) -> FuzzMessage:
        """Integer fields written as floats (``39.0``): converted, not refused."""
        r = self.record()
        ints = [a for a in self.numeric if a.integer]
        if not ints:
            return self.valid()
        a = self.rng.choice(ints)
        return self.msg("valid_integral_floats", with_literal(r, a.name, f"{float(r[a.name])!r}"), VALID, rec=r,
                        valid=r)

    def duplicate_record_id(self) -> FuzzMessage:
        """A valid record whose id an earlier message already used (the service tracks positions, not ids)."""
        r = self.record()
        if self.rid:
            r[self.rid] = self.records[0][self.rid]
        return self.msg("duplicate_record_id", encode(r), VALID, rec=r, valid=r)

    def control_header_on_record(self) -> FuzzMessage:
        r = self.record()
        value = self.rng.choice([CONTROL_FLUSH, b"FLUSH", b"flush ", b"", b"\xff"])
        return self.msg("control_header_on_record", encode(r), VALID, rec=r, valid=r,
                        headers=[(CONTROL_HEADER, value)])

    def garbage_headers(self) -> FuzzMessage:
        r = self.record()
        rng = self.rng
        headers: Headers = []
        for _ in range(rng.randrange(1, 6)):
            k = "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0x2FF), 0x1F600]))
                        for _ in range(rng.randrange(0, 20)))
            headers.append((k, rng.randbytes(rng.randrange(0, 64))))
        return self.msg("garbage_headers", encode(r), VALID, rec=r, valid=r, headers=headers)

    def non_utf8_header_key(self) -> FuzzMessage:
        r = self.record()
        raw = self.rng.choice([b"\xff\xfe", b"k\x80ey", b"\xed\xa0\x80", b"\xc0\xaf"])
        return self.msg("non_utf8_header_key", encode(r), VALID, rec=r, valid=r,
                        headers=[(RawHeaderKey(raw), b"v")])

    # -- no value, too long
    def empty(self) -> FuzzMessage:
        return self.msg("empty", self.rng.choice([b"", None]), "empty")

    def oversized(self) -> FuzzMessage:
        """A 1 MiB value (or longer than max_message_bytes): a record padded with a long category."""
        size = max(1 << 20, self.max_bytes + 1)
        variant = self._i % 3
        self._i += 1
        if variant not in self._big:
            r = dict(self.records[variant % len(self.records)])
            name = self.categorical[0].name if self.categorical else self.any_field()
            body = encode({**r, name: ""})
            r[name] = "x" * max(0, size - len(body))
            self._big[variant] = encode(r)
        return self.msg("oversized", self._big[variant], "oversized")

    # -- not UTF-8 JSON
    def invalid_utf8(self) -> FuzzMessage:
        r = self.record()
        body = encode(r)
        bad = self.rng.choice([b"\xff", b"\xfe", b"\xc0\x80", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                               b"\xe2\x82", b"\x80"])
        pos = body.index(b'"', 1) + 1  # inside the first key
        return self.msg("invalid_utf8", body[:pos] + bad + body[pos:], "malformed_json", rec=r)

    def other_encoding(self) -> FuzzMessage:
        r = self.record()
        enc = self.rng.choice(["utf-16", "utf-32", "utf-16-le", "utf-16-be"])
        return self.msg("other_encoding", json.dumps(r).encode(enc), "malformed_json", rec=r)

    def truncated(self) -> FuzzMessage:
        r = self.record()
        body = encode(r)
        return self.msg("truncated", body[: self.rng.randrange(1, len(body))], "malformed_json", rec=r)

    def trailing_data(self) -> FuzzMessage:
        r = self.record()
        tail = self.rng.choice([b"x", b"}", b",", b" {}", b"\n" + encode(r), b"\x00"])
        return self.msg("trailing_data", encode(r) + tail, "malformed_json", rec=r)

    def not_json(self) -> FuzzMessage:
        rng = self.rng
        text = rng.choice(["hello", "<xml/>", "{'id': 1}", "{id: 1}", "{\"a\" 1}", "[1,,2]", "{\"a\":1,}",
                           "   ", "\t\n", "undefined", "True", "None", "0x10", "01", ".5", "+1", "'x'"])
        value = text.encode() + bytes(rng.choice(b"abc") for _ in range(rng.randrange(0, 4)))
        return self.msg("not_json", value, "malformed_json")

    def bom_only(self) -> FuzzMessage:
        return self.msg("bom_only", BOM + self.rng.choice([b"", b" ", b"x", BOM]), "malformed_json")

    def control_characters(self) -> FuzzMessage:
        """A raw control character inside a JSON string: not JSON (RFC 8259 section 7)."""
        r = self.record()
        body = encode(r)
        pos = body.index(b'"', 2)  # the end of the first key: inside a string
        return self.msg("control_characters", body[:pos] + bytes([self.rng.randrange(0, 32)]) + body[pos:],
                        "malformed_json", rec=r)

    # -- not a record
    def non_object(self) -> FuzzMessage:
        r = self.record()
        value = self.rng.choice([b"[]", b"[1,2,3]", b'"text"', b"1", b"-0.5", b"1e400", b"null", b"true", b"false",
                                 b'""', b"NaN", b"-Infinity", b"[" + encode(r) + b"]", b"[{}]", b"[[[]]]",
                                 b"9" * 5000])
        return self.msg("non_object", value, "not_an_object", rec=r)

    def deep_nesting(self) -> FuzzMessage:
        """Nesting deeper than MAX_JSON_DEPTH: the whole value, or inside a field, closed or not."""
        rng = self.rng
        depth = rng.choice([MAX_JSON_DEPTH + 1, 100, 999, 1000, 2000, 5000, 30000])
        depth = min(depth, self.max_bytes // 8)
        where = rng.choice(["whole", "field", "unclosed"])
        if where == "whole":
            value = self.nested(depth).encode()
        elif where == "field":
            r = self.record()
            value = with_literal(r, self.any_field(), self.nested(depth))
        else:
            value = (rng.choice(["[", '{"a":']) * depth).encode()
        return self.msg("deep_nesting", value, "too_deep")

    def shallow_nesting(self) -> FuzzMessage:
        """Arrays/objects within the depth limit, as a field's value: the wrong type."""
        r = self.record()
        name = self.any_field()
        depth = self.rng.randrange(1, MAX_JSON_DEPTH)
        return self.msg("shallow_nesting", with_literal(r, name, self.nested(depth)),
                        self.reason_for_field(name, "wrong_type"), rec=r)

    # -- numbers
    def huge_integer(self) -> FuzzMessage:
        """Integer literals of hundreds to tens of thousands of digits (beyond Python's int-string limit)."""
        rng = self.rng
        r = self.record()
        digits = rng.choice([310, 400, 4300, 4301, 5000, 20000])
        literal = rng.choice(["", "-"]) + "9" + "".join(rng.choice("0123456789") for _ in range(digits - 1))
        name = self.any_field()
        return self.msg("huge_integer", with_literal(r, name, literal), self.reason_for_field(name, "out_of_domain"),
                        rec=r)

    def non_finite(self) -> FuzzMessage:
        r = self.record()
        name = self.any_field()
        literal = self.rng.choice(["NaN", "Infinity", "-Infinity", "1e309", "-1e309", "1e99999"])
        return self.msg("non_finite", with_literal(r, name, literal), self.reason_for_field(name, "out_of_domain"),
                        rec=r)

    def huge_float(self) -> FuzzMessage:
        """1e308, the largest float, 1e300 in integer fields, tiny and negative extremes."""
        r = self.record()
        a = self.field_of([Kind.NUMERIC])
        x = self.rng.choice([1e308, -1e308, 1.7976931348623157e308, 1e300, 5e-324, -1e-300, 1e20])
        return self.msg("huge_float", with_literal(r, a.name, repr(x)), _numeric_verdict(a, x), rec=r,
                        valid={**r, a.name: int(x) if a.integer else x} if _numeric_verdict(a, x) == VALID else None)

    def bool_for_number(self) -> FuzzMessage:
        r = self.record()
        a = self.field_of([Kind.NUMERIC])
        return self.msg("bool_for_number", with_literal(r, a.name, self.rng.choice(["true", "false"])), "wrong_type",
                        rec=r)

    def number_as_string(self) -> FuzzMessage:
        r = self.record()
        a = self.field_of([Kind.NUMERIC])
        text = self.rng.choice([str(r[a.name]), f" {r[a.name]} ", "1_000", "nan", "inf", "0x1F", "", "٣٩"])
        return self.msg("number_as_string", with_literal(r, a.name, json.dumps(text)), "wrong_type", rec=r)

    def null_value(self) -> FuzzMessage:
        r = self.record()
        name = self.any_field()
        return self.msg("null_value", with_literal(r, name, "null"), self.reason_for_field(name, "wrong_type"), rec=r)

    def categorical_not_a_string(self) -> FuzzMessage:
        if not self.categorical:
            return self.bool_for_number()
        r = self.record()
        a = self.field_of([Kind.CATEGORICAL])
        literal = self.rng.choice(["1", "-2.5", "true", "[]", "{}", '["Male"]', '{"v":"Male"}'])
        return self.msg("categorical_not_a_string", with_literal(r, a.name, literal), "wrong_type", rec=r)

    def out_of_domain(self) -> FuzzMessage:
        r = self.record()
        rng = self.rng
        bounded = [a for a in self.numeric if a.lo is not None and a.hi is not None]
        cats = [a for a in self.categorical if a.domain_values]
        if bounded and (not cats or rng.random() < 0.5):
            a = rng.choice(bounded)
            assert a.lo is not None and a.hi is not None
            x: float = rng.choice([a.lo - 1, a.hi + 1, a.hi * 10 + 7, -1e9])
            if not a.integer and rng.random() < 0.5:
                x = a.hi + 0.5
            elif a.integer and rng.random() < 0.3:
                x = (a.lo + a.hi) / 2 + 0.25
            return self.msg("out_of_domain", with_literal(r, a.name, repr(x)), _numeric_verdict(a, x), rec=r)
        if not cats:
            return self.valid()
        a = rng.choice(cats)
        text = rng.choice(["Martian", "", "male", "x" * 5000, "\u0000", "Ma\u0301le"])
        return self.msg("out_of_domain", with_literal(r, a.name, json.dumps(text)), "out_of_domain", rec=r)

    # -- fields
    def missing_field(self) -> FuzzMessage:
        r = self.record()
        rng = self.rng
        drop = set(rng.sample(self.expected, rng.randrange(1, len(self.expected) + 1)))
        first = sorted(drop)[0]
        expect = "bad_record_id" if first == self.rid else "missing_field"
        return self.msg("missing_field", encode({k: v for k, v in r.items() if k not in drop}), expect, rec=r)

    def extra_field(self) -> FuzzMessage:
        r = self.record()
        rng = self.rng
        n = rng.choice([1, 1, 2, 50, 3000])
        extra = {f"x{i}-{rng.randrange(10**6)}": rng.choice([1, "s", None, [1], {"a": 1}]) for i in range(n)}
        value = encode({**r, **extra})
        return self.msg("extra_field", value, "oversized" if len(value) > self.max_bytes else "extra_field", rec=r)

    def missing_and_extra(self) -> FuzzMessage:
        """A field renamed: missing wins (the record id's name first: ``bad_record_id``)."""
        r = self.record()
        name = self.any_field()
        value = {(k + "_renamed" if k == name else k): v for k, v in r.items()}
        return self.msg("missing_and_extra", encode(value), "bad_record_id" if name == self.rid else "missing_field",
                        rec=r)

    def duplicate_key(self) -> FuzzMessage:
        """A field twice in one object (same or another value; or inside a nested value): refused."""
        r = self.record()
        rng = self.rng
        name = self.any_field()
        body = encode(r)
        again = json.dumps(name).encode() + b":" + json.dumps(rng.choice([r[name], "other", 1])).encode()
        if rng.random() < 0.2:
            other = self.any_field()
            value = with_literal(r, other, '{"k":1,"k":2}')
        else:
            value = body[:-1] + b"," + again + b"}"
        return self.msg("duplicate_key", value, "duplicate_field", rec=r)

    def lone_surrogate_name(self) -> FuzzMessage:
        """A field name that is a lone surrogate (a JSON escape) or holds one: an extra field, named escaped."""
        r = self.record()
        name = self.rng.choice(["\\ud800", "\\udfff", "a\\ud83d", "\\ud800\\ud800", "\\udc80x"])
        value = encode(r)[:-1] + b',"' + name.encode() + b'":1}'
        return self.msg("lone_surrogate_name", value, "extra_field", rec=r)

    def lone_surrogate_value(self) -> FuzzMessage:
        """A lone surrogate in a categorical value (outside any domain) or in the record id (accepted: ids are
        escaped where they are written)."""
        r = self.record()
        rng = self.rng
        text = rng.choice(["\\ud800", "x\\udfff", "\\ud83d"])
        cats = [a for a in self.categorical if a.domain_values]
        if self.rid and (not cats or rng.random() < 0.3):
            valid = {**r, self.rid: json.loads(f'"{text}"')}
            return self.msg("lone_surrogate_value", with_literal(r, self.rid, f'"{text}"'), VALID, rec=r, valid=valid)
        a = rng.choice(cats) if cats else self.field_of([Kind.CATEGORICAL])
        expect = "out_of_domain" if a.domain_values else VALID
        value = with_literal(r, a.name, f'"{text}"')
        return self.msg("lone_surrogate_value", value, expect, rec=r,
                        valid={**r, a.name: json.loads(f'"{text}"')} if expect == VALID else None)

    def bad_record_id(self) -> FuzzMessage:
        if not self.rid:
            return self.null_value()
        r = self.record()
        literal = self.rng.choice(['""', "1.5", "true", "false", "null", "[]", "{}", '["a"]', "1e3", "NaN"])
        return self.msg("bad_record_id", with_literal(r, self.rid, literal), "bad_record_id", rec=r)

    # -- random damage: any outcome but an exception
    def random_mutation(self) -> FuzzMessage:
        r = self.record()
        rng = self.rng
        body = bytearray(encode(r))
        for _ in range(rng.randrange(1, 6)):
            op = rng.randrange(4)
            pos = rng.randrange(len(body)) if body else 0
            if op == 0 and body:
                body[pos] = rng.randrange(256)
            elif op == 1:
                body.insert(pos, rng.choice(b'{}[]",:\\0-e.9 \xff\xc3'))
            elif op == 2 and body:
                del body[pos]
            else:
                body[pos:pos] = rng.choice([b"NaN", b"1e999", b'"\\ud800"', b"[" * 50, b"9" * 5000, b"\\u0000"])
        return self.msg("random_mutation", bytes(body), None, rec=r)

    def random_bytes(self) -> FuzzMessage:
        rng = self.rng
        return self.msg("random_bytes", rng.randbytes(rng.randrange(1, 300)), None)

    def random_json(self) -> FuzzMessage:
        """Random JSON values (nested lists/objects/scalars, random keys): anything but an exception."""
        rng = self.rng

        def value(depth: int) -> Any:
            c = rng.randrange(8 if depth < 4 else 5)
            if c == 0:
                return rng.choice([None, True, False])
            if c == 1:
                return rng.choice([0, -1, 2**63, rng.randrange(-10**6, 10**6)])
            if c == 2:
                return rng.choice([0.5, -0.0, 1e308, rng.uniform(-1e6, 1e6)])
            if c in (3, 4):
                return "".join(chr(rng.randrange(1, 0x2FF)) for _ in range(rng.randrange(0, 8)))
            if c == 5:
                return [value(depth + 1) for _ in range(rng.randrange(0, 4))]
            keys = [*self.expected, "x", ""]
            return {rng.choice(keys): value(depth + 1) for _ in range(rng.randrange(0, 6))}

        return self.msg("random_json", encode(value(0)), None)


KINDS: tuple[str, ...] = (
    "valid", "valid_formatting", "valid_bom", "valid_integral_floats", "duplicate_record_id",
    "control_header_on_record", "garbage_headers", "non_utf8_header_key",
    "empty", "oversized", "invalid_utf8", "other_encoding", "truncated", "trailing_data", "not_json", "bom_only",
    "control_characters", "non_object", "deep_nesting", "shallow_nesting", "huge_integer", "non_finite",
    "huge_float", "bool_for_number", "number_as_string", "null_value", "categorical_not_a_string", "out_of_domain",
    "missing_field", "extra_field", "missing_and_extra", "duplicate_key", "lone_surrogate_name",
    "lone_surrogate_value", "bad_record_id", "random_mutation", "random_bytes", "random_json",
)
"""Every kind :func:`malformed_messages` draws (the first eight carry a valid value)."""

DEFAULT_WEIGHTS: dict[str, float] = {"oversized": 0.05, "valid": 6.0}
"""Relative frequencies that differ from 1: few 1 MiB values (they are only length-checked); valid records
interleaved throughout (about a seventh of the messages)."""


def malformed_messages(seed: int, n: int, *, schema: Schema | None = None,
                       records: list[dict[str, Any]] | None = None, max_message_bytes: int = 65536,
                       weights: Mapping[str, float] | None = None,
                       kinds: Iterable[str] | None = None) -> list[FuzzMessage]:
    """``n`` messages (kind, value, headers, key, expect, record), deterministic for ``seed``.

    ``schema`` defaults to ADULT; ``records`` (valid, normalized) default to random ones of the schema;
    ``max_message_bytes`` is the decoder's limit (the oversized kind exceeds it; anything longer expects
    ``oversized``).  Kinds are interleaved in a seeded order with frequencies ``weights`` (default
    :data:`DEFAULT_WEIGHTS`).
    """
    rng = random.Random(seed)
    schema = schema or adult_schema()
    records = records or schema_records(schema, 500, random.Random(seed + 1))
    gen = _Gen(schema, records, rng, max_message_bytes)
    chosen = list(kinds) if kinds is not None else list(KINDS)
    unknown = set(chosen) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown kind(s) {sorted(unknown)}; known: {KINDS}")
    w = {**DEFAULT_WEIGHTS, **(weights or {})}
    makers: dict[str, Callable[[], FuzzMessage]] = {k: getattr(gen, k) for k in chosen}
    out: list[FuzzMessage] = []
    kinds_drawn = rng.choices(chosen, weights=[w.get(k, 1.0) for k in chosen], k=n)
    for kind in kinds_drawn:
        m = makers[kind]()
        if m.value is not None and len(m.value) > max_message_bytes and m.expect != "oversized":
            m = m._replace(expect="oversized", record=None)
        out.append(m)
    return out
