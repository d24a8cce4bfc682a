"""The side paths' input decoder: the main path's :class:`~stream_anon.formats.decoding.RecordDecoder`, plus
clipping of out-of-domain numeric values (pure: no Kafka, no metrics).

The main path dead-letters a record with a numeric value outside the schema's public domain (reason
``out_of_domain``).  The side paths, with ``side_paths.out_of_domain: clip`` (the default), instead clip each such
value into the domain and perturb the record: clipping is a function of the record alone, so every mechanism
stays eps-LDP for the original record, and nothing about the outlier leaves the service except through the
mechanisms (an outlier dead-lettered is what an outlier-hunting reader of the DLQ would look for).  With
``skip`` the record is skipped like every other bad input.

Only finite numbers (JSON numbers, or numeric strings, which ``schema.validate`` accepts) outside ``[lo, hi]`` are
clipped, to ``lo`` or ``hi`` (an integer for integer attributes).  A record with any other problem (a wrong type,
a non-integer value inside an integer domain, an unknown category, a missing field) keeps its dead letter.
"""

from __future__ import annotations

import json
import math
from typing import Any

from stream_anon.core.schema import Kind, Schema, SchemaError
from stream_anon.formats.decoding import DeadLetter, RecordDecoder

Decoded = tuple[dict[str, Any] | DeadLetter, tuple[str, ...]]
"""A validated record (or why not) and the attributes whose values were clipped."""


def _parse_int(literal: str) -> int | float:
    """JSON integers as Python ints, except literals too long for ``int()`` (Python limits conversions to 4,300
    digits): those are far beyond any domain and read as a float (infinity: never clipped, the dead letter
    stands)."""
    return int(literal) if len(literal) <= 4000 else float(literal)


class SideDecoder:
    """Bytes -> validated record (clipped into the public domain when ``out_of_domain == "clip"``), or the main
    path's :class:`DeadLetter`."""

    def __init__(self, schema: Schema, max_message_bytes: int, *, out_of_domain: str = "clip") -> None:
        self.schema = schema
        self.records = RecordDecoder(schema, max_message_bytes)
        self.clip = out_of_domain == "clip"
        self._numeric = [(a.name, float(a.lo), float(a.hi), a.integer) for a in schema.attributes
                         if a.kind is Kind.NUMERIC and a.lo is not None and a.hi is not None]

    def decode(self, value: bytes | None) -> Decoded:
        rec = self.records.decode(value)
        if not (self.clip and isinstance(rec, DeadLetter) and rec.reason == "out_of_domain"):
            return rec, ()
        assert value is not None  # an out_of_domain dead letter had a JSON object
        try:  # the decoder accepted the bytes as one JSON object within the depth limit; parse them the same way
            obj = json.loads(value.decode("utf-8-sig"), parse_int=_parse_int)
            clipped = self.clip_values(obj)
            if not clipped:
                return rec, ()
            return self.schema.validate(obj), clipped
        except SchemaError:  # another problem remains: the main path's reason stands
            return rec, ()
        except Exception:  # noqa: BLE001 - never let one message stop the side paths: the dead letter stands
            return rec, ()

    def clip_values(self, obj: dict[str, Any]) -> tuple[str, ...]:
        """Clip, in place, every finite numeric value outside its public domain; returns the attributes clipped."""
        out = []
        for name, lo, hi, integer in self._numeric:
            v = obj.get(name)
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                continue
            try:
                x = float(v)
            except ValueError:
                continue
            if not math.isfinite(x) or lo <= x <= hi:
                continue
            bound = lo if x < lo else hi
            obj[name] = int(bound) if integer else bound
            out.append(name)
        return tuple(out)
