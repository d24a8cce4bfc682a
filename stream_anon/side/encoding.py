"""JSON encoding of the side messages.

The per-record copies are built column-wise: one ``%``-template per (topic, attributes) holds the constant parts
(mechanism, eps), and each record's pseudonym and reported values, already JSON text, fill its slots.  The bytes are
exactly ``json.dumps(copy, separators=(",", ":"))`` of the copy as a dict (``tests/test_side_processor.py`` checks
it byte for byte), at a fraction of the cost.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii
from typing import Any


@dataclass
class CopyBatch:
    """The per-record copies of one batch on one topic, encoded: ``payloads[i]`` is one record's message and
    ``keys[i]`` its Kafka key (the record's pseudonym, or None without pseudonyms, when the copies are also in a
    random order); every copy spent ``epsilon_total``."""

    topic: str
    keys: list[bytes | None]
    payloads: list[bytes]
    epsilon_total: float

    def __len__(self) -> int:
        return len(self.payloads)


def copy_dict(pseudonym: str | None, mechanism: str, values: Mapping[str, Any], epsilon: Mapping[str, float],
              epsilon_total: float, epsilon_all_side_topics: float) -> dict[str, Any]:
    """One per-record copy: the record's pseudonym (``id``; left out when None), the mechanism, the reported value
    and the exact eps of each attribute, their sum (``epsilon_total``) and the record's exact eps over all side
    outputs (``epsilon_all_side_topics``)."""
    head: dict[str, Any] = {} if pseudonym is None else {"id": pseudonym}
    return {**head, "mechanism": mechanism, "values": dict(values), "epsilon": dict(epsilon),
            "epsilon_total": epsilon_total, "epsilon_all_side_topics": epsilon_all_side_topics}


def copy_template(mechanism: str, epsilon: Mapping[str, float], epsilon_total: float,
                  epsilon_all_side_topics: float, *, with_id: bool = True) -> str:
    """``%``-template of :func:`copy_dict`'s JSON: a slot for the id (``with_id``) and one per attribute (in
    ``epsilon``'s order), the constants inline."""

    def dumps(x: Any) -> str:
        return json.dumps(x, separators=(",", ":"), allow_nan=False).replace("%", "%%")

    slots = ",".join(f"{dumps(a)}:%s" for a in epsilon)
    return ("{" + ('"id":%s,' if with_id else "") + '"mechanism":' + dumps(mechanism) + ',"values":{' + slots
            + '},"epsilon":' + dumps(dict(epsilon)) + ',"epsilon_total":' + dumps(epsilon_total)
            + ',"epsilon_all_side_topics":' + dumps(epsilon_all_side_topics) + "}")


def fill_copies(template: str, ids: Sequence[str] | None, fragments: Sequence[Sequence[str]]) -> list[bytes]:
    """Each record's copy: ``template`` filled with its id (as a JSON string; ``ids`` None for a template
    without id) and its column fragments."""
    if ids is None:
        return [(template % row).encode() for row in zip(*fragments, strict=True)]
    id_json = list(map(json_string, ids))
    return [(template % row).encode() for row in zip(id_json, *fragments, strict=True)]


def json_string(s: str) -> str:
    """JSON text of a string, as ``json.dumps`` writes it (ASCII, escaped)."""
    return encode_basestring_ascii(s)


def encode_json(msg: Mapping[str, Any]) -> bytes:
    """Compact strict JSON (no NaN/Infinity: use :func:`json_safe` first when values may be non-finite)."""
    return json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()


def json_safe(obj: Any) -> Any:
    """JSON-safe copy: non-finite floats become null (strict JSON has no NaN/Infinity)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_safe(v) for v in obj]
    return obj
