"""Input bytes -> a validated record, or a :class:`DeadLetter` naming why not (pure: no Kafka, no metrics).

:class:`RecordDecoder` is shared by the main path (``service/pipeline.py``) and the side paths (``side/app.py``),
so both refuse the same inputs for the same reasons (:data:`DLQ_REASONS`, meanings in
:data:`DLQ_REASON_MEANINGS` and docs/service.md "Dead-letter reasons").  The control header
(:data:`CONTROL_HEADER`) marks end-of-stream messages.

``decode`` never raises: every input, however hostile (nesting thousands of levels deep, integer literals of
thousands of digits, NaN/Infinity, lone surrogates, invalid UTF-8, megabytes of brackets), is either a record
or a :class:`DeadLetter` whose ``error`` and ``field`` are bounded, UTF-8-encodable text.  Decisions on inputs
that are not plainly valid or invalid:

- a leading UTF-8 byte-order mark is **accepted** and ignored (RFC 8259 section 8.1 lets a parser ignore it;
  Windows/.NET producers add one); any other encoding (UTF-16/32, with or without a BOM) is ``malformed_json``;
- an object naming a field twice is **refused** (``duplicate_field``): JSON parsers disagree on which value
  wins (Python's keeps the last, others the first), so the record would not be the same for every reader;
- numbers must be JSON numbers: a number in a string (``"39"``) is ``wrong_type``, like ``true``;
- ``NaN``, ``Infinity``, ``-Infinity`` (not JSON, but Python's parser reads them), ``1e309`` (read as infinity)
  and integers beyond the float range are ``out_of_domain`` for a numeric field (no domain holds them);
- nesting deeper than :data:`MAX_JSON_DEPTH` anywhere in the message is ``too_deep`` (a record is one flat
  object), decided on the text so the reason does not depend on the parser's recursion limit.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_anon.core.schema import Attribute, Kind, Schema, SchemaError

CONTROL_HEADER = "stream-anon-control"
"""Input header: value ``flush`` releases or suppresses everything the partition buffers (end of stream)."""
CONTROL_FLUSH = b"flush"

MAX_JSON_DEPTH = 32
"""Deepest nesting of arrays/objects a message may have (a valid record has depth 1); deeper: ``too_deep``."""
MAX_ERROR_CHARS = 1000
"""Longest ``DeadLetter.error`` (values quoted in it are shortened first)."""
MAX_FIELD_CHARS = 200
"""Longest ``DeadLetter.field`` (a field name taken from the input is cut beyond this, marked ``...``)."""

DLQ_REASON_MEANINGS: dict[str, str] = {
    "oversized": "the message is longer than service.max_message_bytes (checked before anything else), or too "
                 "large for the consumer to receive at all (kafka.receive_max_bytes: only its position is known)",
    "empty": "no value: a tombstone (null value) or zero bytes",
    "malformed_json": "not UTF-8 text (a UTF-16/32 encoding included), or not one JSON value: syntax error, "
                      "truncated, trailing data",
    "too_deep": f"arrays/objects nested deeper than {MAX_JSON_DEPTH} levels anywhere in the message",
    "duplicate_field": "an object names the same field twice (parsers disagree on which value wins)",
    "not_an_object": "valid JSON, but not an object (an array, a string, a number, true/false, null)",
    "bad_record_id": "the record id field is missing, or not a non-empty string or an integer in the signed "
                     "64-bit range",
    "missing_field": "a field of the schema (or its person id field) is missing",
    "extra_field": "a field the schema does not have",
    "wrong_type": "a field has the wrong JSON type: a numeric field not a JSON number (a string, true/false, "
                  "null, an array, an object), a categorical field not a string, a person id not a non-empty string "
                  "or a 64-bit integer",
    "out_of_domain": "a number outside the attribute's public domain [lo, hi] (NaN, Infinity and integers beyond "
                     "the float range included), a non-integer in an integer field, or a category not in the "
                     "attribute's domain",
    "engine_error": "the anonymization engine refused a record the decoder accepted (main path only)",
    "internal_error": "a bug: processing the message raised an unexpected exception (the error holds its last "
                      "line); the partition moves on",
    "corrupt_record": "the Kafka client could not read the record (e.g. a header key that is not UTF-8): only "
                      "its position is known (main path)",
    "control_header_on_record": "a message with a value carries the control header: a flush marker has no value, "
                                "so it is not a flush (main path)",
    "unknown_control": "a message without value whose control header is not 'flush' (main path)",
}
DLQ_REASONS: tuple[str, ...] = tuple(DLQ_REASON_MEANINGS)

_BOM = b"\xef\xbb\xbf"
_FLOAT_MAX = sys.float_info.max
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_ID_MIN, _ID_MAX = -(2**63), 2**63 - 1  # integer record/person ids: Kafka's (Java's) long
_ID_ALLOWED = "a non-empty string or an integer in [-2**63, 2**63 - 1]"
_NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")


@dataclass(frozen=True)
class DeadLetter:
    """Why a message is not a valid record: ``reason`` (one of :data:`DLQ_REASONS`), a one-line ``error``
    naming the field, the allowed domain and the value received, and the ``field`` (None if not about one).

    ``error`` and ``field`` are UTF-8-encodable (lone surrogates and other input text are escaped) and bounded
    (:data:`MAX_ERROR_CHARS`, :data:`MAX_FIELD_CHARS`), so every writer can put them in headers as they are.
    """

    reason: str
    error: str
    field: str | None = None


class _DuplicateField(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class _HugeInt:
    """Stands for an integer literal too long for ``int()`` (Python's int-string limit); never a valid value."""

    __slots__ = ("digits",)

    def __init__(self, text: str) -> None:
        self.digits = len(text.lstrip("-"))

    def __repr__(self) -> str:
        return f"an integer of {self.digits:,} digits"


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a dict, or :class:`_DuplicateField` naming the first field given twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateField(name)
            seen.add(name)
    return obj


def _int_or_huge(text: str) -> int | _HugeInt:
    try:
        return int(text)
    except ValueError:
        return _HugeInt(text)


_PARSER = json.JSONDecoder(object_pairs_hook=_object)
_PARSER_HUGE_INTS = json.JSONDecoder(object_pairs_hook=_object, parse_int=_int_or_huge)
_raw_decode = _PARSER.raw_decode
_plain_raw_decode = json.JSONDecoder().raw_decode  # the C scanner alone (no hook): the flat fast path


def safe_text(text: str, limit: int) -> str:
    """``text`` as UTF-8-encodable text (lone surrogates become ``\\udxxx`` escapes), at most ``limit`` characters
    (cut ones end in ``...``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show(value: Any, limit: int = 60) -> str:
    """A short, safe ``repr`` of an input value for an error message."""
    if isinstance(value, str):
        r = repr(value[: limit + 1])
        return r if len(value) <= limit else f"{r[:-1]}...{r[-1]} ({len(value):,} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, list | dict):
        return f"a JSON {'array' if isinstance(value, list) else 'object'} of {len(value)} item(s)"
    return safe_text(repr(value), limit)


def _describe(value: Any) -> str:
    """The JSON type of an input value, and the value, for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, str):
        return f"the string {_show(value)}"
    if isinstance(value, list | dict):
        return _show(value)
    if isinstance(value, _HugeInt):
        return repr(value)
    return f"the number {_show(value)}"


def json_depth(text: str) -> int:
    """Deepest nesting of arrays/objects in JSON ``text`` (brackets inside strings do not count; an unclosed
    bracket counts as open)."""
    if text.count("[") + text.count("{") <= 1:
        return 1 if ("[" in text or "{" in text) else 0
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text))
    if not brackets:
        return 0
    codes = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    steps = np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)
    return int(max(0, np.cumsum(steps).max()))


class RecordDecoder:
    """Bytes -> validated record, or a :class:`DeadLetter` naming the reason (one of :data:`DLQ_REASONS`).

    ``decode`` never raises (see the module docstring for the decisions on BOMs, duplicate fields, numbers in
    strings and non-finite numbers); a valid record is the schema's normalized form (``Schema.validate``).
    """

    def __init__(self, schema: Schema, max_message_bytes: int) -> None:
        self.schema = schema
        self.max_message_bytes = max_message_bytes
        self.expected = set(schema.names) | ({schema.record_id} if schema.record_id else set())
        if schema.person_id:
            self.expected.add(schema.person_id)
        # fast path: (name, lo, hi, integer) for numeric attributes, (name, domain) for categorical ones;
        # any value it does not accept goes through the slow path (exact reason, or a legal conversion).  The
        # bounds are clipped to the float range, so that every value the fast path accepts converts to float.
        self._numeric: list[tuple[str, float, float, bool]] = []
        self._categorical: list[tuple[str, frozenset[str] | None]] = []
        for a in schema.attributes:
            if a.kind is Kind.NUMERIC:
                lo = -_FLOAT_MAX if a.lo is None else max(a.lo, -_FLOAT_MAX)
                hi = _FLOAT_MAX if a.hi is None else min(a.hi, _FLOAT_MAX)
                self._numeric.append((a.name, lo, hi, a.integer))
            else:
                dom = a.domain_values
                self._categorical.append((a.name, frozenset(dom) if dom else None))
        self._rid = schema.record_id
        self._n_categorical = len(self._categorical)  # string values of a valid record, besides the ids

    # ------------------------------------------------------------------ entry point
    def decode(self, value: bytes | None) -> dict[str, Any] | DeadLetter:
        try:
            return self._decode(value)
        except Exception as e:  # a bug here must not stop a partition: dead-letter the message, name the error
            return DeadLetter("internal_error", safe_text(f"decoder: {type(e).__name__}: {_exception_text(e)}",
                                                          MAX_ERROR_CHARS))

    def _decode(self, value: bytes | None) -> dict[str, Any] | DeadLetter:
        if value is None:
            return DeadLetter("empty", "tombstone: the message has no value (null)")
        n = len(value)
        if n == 0:
            return DeadLetter("empty", "empty message (0 bytes)")
        if n > self.max_message_bytes:
            return DeadLetter("oversized", f"message of {n:,} bytes exceeds service.max_message_bytes "
                                           f"= {self.max_message_bytes:,}")
        if value[0] == 0xEF and value[:3] == _BOM:
            value = value[3:]  # a UTF-8 byte-order mark: accepted, ignored (RFC 8259 section 8.1)
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError as e:
            return DeadLetter("malformed_json", _not_utf8(value, e))
        if b"\\" not in value:
            flat = self._flat(text, value)
            if flat is not None:
                return flat
        try:
            obj, end = _raw_decode(text)
            if end != len(text) and text[end:].strip(" \t\n\r"):
                raise ValueError("trailing data")
        except RecursionError:
            return self._too_deep(text, None)
        except _DuplicateField as e:
            return self._duplicate(text, e.name)
        except ValueError:  # not JSON (or whitespace first), or an integer beyond the digit limit: the exact parse
            parsed = self._parse_slowly(text)
            if isinstance(parsed, DeadLetter):
                return parsed
            obj = parsed
        if type(obj) is dict and obj.keys() == self.expected:
            fast = self._fast_validate(obj)
            if fast is not None:
                return fast
        return self._refuse(obj, text)

    def _parse_slowly(self, text: str) -> Any:
        """The exact parse (leading whitespace, error positions, integers beyond the digit limit kept as
        :class:`_HugeInt`), or the dead letter of a text that is not one JSON value."""
        try:
            return _PARSER_HUGE_INTS.decode(text)
        except RecursionError:
            return self._too_deep(text, None)
        except _DuplicateField as e:
            return self._duplicate(text, e.name)
        except json.JSONDecodeError as e:
            depth = json_depth(text)
            if depth > MAX_JSON_DEPTH:
                return self._too_deep(text, depth)
            return DeadLetter("malformed_json", f"not valid JSON: {e.msg} (line {e.lineno} column {e.colno}, "
                                                f"character {e.pos:,} of {len(text):,})")

    # ------------------------------------------------------------------ fast path
    def _flat(self, text: str, value: bytes) -> dict[str, Any] | None:
        """The common case in one pass of the C scanner, without the pairs hook (a third of the decoding time): a
        flat object of exactly the expected fields, written without escapes, with well-typed values in their
        domains.  A field given twice is still found: without escapes every key and every string value is one
        pair of quotes, so the message has more quotes than the object it parsed to.  None: the exact path decides
        (any other input, and the reason of a bad one)."""
        try:
            obj, end = _plain_raw_decode(text)
        except (ValueError, RecursionError):
            return None
        if end != len(text) or type(obj) is not dict or obj.keys() != self.expected:
            return None
        rec = self._fast_validate(obj)
        if rec is None:
            return None
        strings = self._n_categorical
        if self._rid is not None and type(rec[self._rid]) is str:
            strings += 1
        pid = self.schema.person_id
        if pid is not None and pid != self._rid and type(rec[pid]) is str:
            strings += 1
        return rec if value.count(b'"') == 2 * (len(rec) + strings) else None

    def _fast_validate(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The common case (well-typed values inside the domain) without exceptions; None = use the slow path."""
        if self._rid is not None:
            rid = obj[self._rid]
            t = type(rid)
            if not ((t is str and rid) or (t is int and _ID_MIN <= rid <= _ID_MAX)):
                return None
        for name, lo, hi, integer in self._numeric:
            v = obj[name]
            t = type(v)
            if t is int:
                if not lo <= v <= hi:
                    return None
                if not integer:
                    obj[name] = float(v)
            elif t is float:
                if not lo <= v <= hi:  # also rejects NaN and infinities
                    return None
                if integer:
                    if not v.is_integer():
                        return None
                    obj[name] = int(v)
            else:
                return None
        for name, dom in self._categorical:
            v = obj[name]
            if type(v) is not str or (dom is not None and v not in dom):
                return None
        pid = self.schema.person_id
        if pid is not None and pid != self._rid:
            v = obj[pid]
            t = type(v)
            if not ((t is str and v) or (t is int and _ID_MIN <= v <= _ID_MAX)):
                return None
        return obj

    # ------------------------------------------------------------------ slow path: the exact reason
    def _refuse(self, obj: Any, text: str) -> dict[str, Any] | DeadLetter:
        """Anything the fast path did not accept: the reason (in a fixed order), or the normalized record."""
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            return self._too_deep(text, depth)
        if not isinstance(obj, dict):
            what = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
                    type(None): "null", _HugeInt: "a number"}.get(type(obj), type(obj).__name__)
            return DeadLetter("not_an_object", f"expected a JSON object (one record), got {what}")
        schema = self.schema
        keys = obj.keys()
        if keys != self.expected:
            missing = sorted(self.expected - set(keys))
            if missing:
                f = missing[0]
                if f == schema.record_id:
                    return DeadLetter("bad_record_id", f"field {f!r} (record id): missing", f)
                return DeadLetter("missing_field", f"field(s) {_names(missing)} missing; the schema {schema.name!r} "
                                                   f"needs {sorted(self.expected)}", f)
            extra = sorted(set(keys) - self.expected)
            return DeadLetter("extra_field", safe_text(f"unexpected field(s) {_names(extra)}; the schema "
                                                       f"{schema.name!r} has {sorted(self.expected)}",
                                                       MAX_ERROR_CHARS), safe_text(extra[0], MAX_FIELD_CHARS))
        rid = schema.record_id
        if rid is not None and not _is_id(obj[rid]):
            return DeadLetter("bad_record_id", f"field {rid!r} (record id): expected {_ID_ALLOWED}, got "
                                               f"{_describe(obj[rid])}", rid)
        pid = schema.person_id
        if pid is not None and pid != rid and not _is_id(obj[pid]):
            return DeadLetter("wrong_type", f"field {pid!r} (person id): expected {_ID_ALLOWED}, got "
                                            f"{_describe(obj[pid])}", pid)
        for a in schema.attributes:
            dl = _check_type(a, obj[a.name])
            if dl is not None:
                return dl
        try:
            return schema.validate(obj)
        except SchemaError as e:
            return DeadLetter(self._classify(e), safe_text(str(e), MAX_ERROR_CHARS),
                              None if e.field is None else safe_text(e.field, MAX_FIELD_CHARS))

    def _too_deep(self, text: str, depth: int | None) -> DeadLetter:
        if depth is None:
            depth = json_depth(text)
        return DeadLetter("too_deep", f"arrays/objects nested {depth:,} levels deep (at most {MAX_JSON_DEPTH}; a "
                                      f"record is one flat JSON object)")

    def _duplicate(self, text: str, name: str) -> DeadLetter:
        depth = json_depth(text)
        if depth > MAX_JSON_DEPTH:
            return self._too_deep(text, depth)
        return DeadLetter("duplicate_field", safe_text(f"field {_show(name)} appears twice in one object (JSON "
                                                       f"parsers disagree on which value wins)", MAX_ERROR_CHARS),
                          safe_text(name, MAX_FIELD_CHARS))

    def _classify(self, e: SchemaError) -> str:
        """The reason of a SchemaError of ``Schema.validate`` on a record whose types are already right."""
        if e.field is None:
            return "not_an_object"
        if e.field == self.schema.record_id:
            return "bad_record_id"
        if e.field not in self.schema:
            return "extra_field" if e.field not in self.expected else "wrong_type"
        return "out_of_domain"


def _is_id(v: Any) -> bool:
    return (type(v) is str and v != "") or (type(v) is int and _ID_MIN <= v <= _ID_MAX)


def _check_type(a: Attribute, v: Any) -> DeadLetter | None:
    """The dead letter of a value of the wrong JSON type, or a number no domain holds; None if it may be valid."""
    name = a.name
    if a.kind is Kind.NUMERIC:
        t = type(v)
        if t is _HugeInt:
            return DeadLetter("out_of_domain", f"field {name!r}: {v!r} is outside the public domain; expected "
                                               f"{a.describe_domain()}", name)
        if t is not int and t is not float:
            return DeadLetter("wrong_type", f"field {name!r}: expected {a.describe_domain()} as a JSON number, got "
                                            f"{_describe(v)}", name)
        if t is float and not math.isfinite(v):
            return DeadLetter("out_of_domain", f"field {name!r}: {_NON_FINITE.get(repr(v), v)} is not a finite number; expected "
                                               f"{a.describe_domain()}", name)
        if not -_FLOAT_MAX <= v <= _FLOAT_MAX:
            return DeadLetter("out_of_domain", f"field {name!r}: {_show(v)} is beyond the range of a float; expected "
                                               f"{a.describe_domain()}", name)
        return None
    if type(v) is not str:
        return DeadLetter("wrong_type", f"field {name!r}: expected a string, {a.describe_domain()}, got "
                                        f"{_describe(v)}", name)
    return None


def _names(names: list[str], shown: int = 5) -> str:
    """A bounded list of (input) field names for an error message."""
    head = ", ".join(_show(n, 40) for n in names[:shown])
    return f"[{head}{f', ... ({len(names) - shown} more)' if len(names) > shown else ''}]"


def _not_utf8(value: bytes, e: UnicodeDecodeError) -> str:
    if value[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "a UTF-16/32 byte-order mark: messages must be UTF-8 JSON (RFC 8259 section 8.1)"
    return f"not UTF-8 text: byte 0x{value[e.start]:02x} at offset {e.start:,} ({e.reason})"


def _exception_text(e: BaseException) -> str:
    try:
        return str(e).splitlines()[-1] if str(e) else ""
    except Exception:  # a broken __str__
        return "?"
