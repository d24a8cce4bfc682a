"""Input bytes -> a validated record, or a :class:`DeadLetter` naming why not (pure: no Kafka, no metrics).

:class:`RecordDecoder` is shared by the main path (``service/pipeline.py``) and the side paths (``side/app.py``),
so both refuse the same inputs for the same reasons (:data:`DLQ_REASONS`).  The control header
(:data:`CONTROL_HEADER`) marks end-of-stream messages.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from stream_anon.core.schema import Kind, Schema, SchemaError

CONTROL_HEADER = "stream-anon-control"
"""Input header: value ``flush`` releases or suppresses everything the partition buffers (end of stream)."""
CONTROL_FLUSH = b"flush"

DLQ_REASONS = ("oversized", "empty", "malformed_json", "not_an_object", "bad_record_id", "missing_field",
               "extra_field", "wrong_type", "out_of_domain", "engine_error")


@dataclass(frozen=True)
class DeadLetter:
    reason: str
    error: str
    field: str | None = None


class RecordDecoder:
    """Bytes -> validated record, or a :class:`DeadLetter` naming the reason (one of :data:`DLQ_REASONS`)."""

    def __init__(self, schema: Schema, max_message_bytes: int) -> None:
        self.schema = schema
        self.max_message_bytes = max_message_bytes
        self.expected = set(schema.names) | ({schema.record_id} if schema.record_id else set())
        if schema.person_id:
            self.expected.add(schema.person_id)
        # fast path: (name, lo, hi, integer) for numeric attributes, (name, domain) for categorical ones;
        # any value it does not accept goes through schema.validate (exact error, or a legal conversion)
        self._numeric: list[tuple[str, float, float, bool]] = []
        self._categorical: list[tuple[str, frozenset[str] | None]] = []
        for a in schema.attributes:
            if a.kind is Kind.NUMERIC:
                lo = -math.inf if a.lo is None else a.lo
                hi = math.inf if a.hi is None else a.hi
                self._numeric.append((a.name, lo, hi, a.integer))
            else:
                dom = a.domain_values
                self._categorical.append((a.name, frozenset(dom) if dom else None))
        self._rid = schema.record_id

    def decode(self, value: bytes | None) -> dict[str, Any] | DeadLetter:
        if value is None or len(value) == 0:
            return DeadLetter("empty", "empty message (no value)")
        if len(value) > self.max_message_bytes:
            return DeadLetter("oversized", f"message of {len(value)} bytes exceeds service.max_message_bytes "
                                           f"= {self.max_message_bytes}")
        try:
            obj = json.loads(value)
        except (UnicodeDecodeError, ValueError) as e:
            return DeadLetter("malformed_json", f"not valid UTF-8 JSON: {e}")
        if not isinstance(obj, dict):
            return DeadLetter("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
        keys = obj.keys()
        if keys != self.expected:
            missing = sorted(self.expected - set(keys))
            if missing:
                f = missing[0]
                if f == self.schema.record_id:
                    return DeadLetter("bad_record_id", f"field {f!r} (record id): missing", f)
                return DeadLetter("missing_field", f"field(s) {missing} missing; the schema {self.schema.name!r} "
                                                   f"needs {sorted(self.expected)}", f)
            extra = sorted(set(keys) - self.expected)
            return DeadLetter("extra_field", f"unexpected field(s) {extra}; the schema {self.schema.name!r} "
                                             f"has {sorted(self.expected)}", extra[0])
        fast = self._fast_validate(obj)
        if fast is not None:
            return fast
        try:
            return self.schema.validate(obj)
        except SchemaError as e:
            return DeadLetter(self._classify(e), str(e), e.field)

    def _fast_validate(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        """The common case (well-typed values inside the domain) without exceptions; None = use the slow path."""
        if self._rid is not None:
            rid = obj[self._rid]
            t = type(rid)
            if not ((t is str and rid) or t is int):
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
                if not lo <= v <= hi:  # also rejects NaN
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
        return obj

    def _classify(self, e: SchemaError) -> str:
        if e.field is None:
            return "not_an_object"
        if e.field == self.schema.record_id:
            return "bad_record_id"
        if e.field not in self.schema:
            return "extra_field"
        attr = self.schema[e.field]
        v = e.value
        if attr.kind is Kind.NUMERIC:
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                return "wrong_type"
            if isinstance(v, str):
                try:
                    float(v)
                except ValueError:
                    return "wrong_type"
            return "out_of_domain"
        return "wrong_type" if not isinstance(v, str) else "out_of_domain"
