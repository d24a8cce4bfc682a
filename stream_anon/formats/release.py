"""Message formats of the main path, pure (no Kafka, no Prometheus): what is public and what stays internal.

Threat model: ``docs/threat-model.md``.  The attacker knows the QIs and the arrival time of target records and
reads every *public* topic; so a public message carries nothing that singles out a record inside its class.

* **Class message** (public topic ``anon``, one message per equivalence class, no headers)::

      {"v":1,"class":"5f0c...32 hex...","qi":{"age":"[30-39]",...},"k":10,"l":null,"size":10,
       "loss":0.2871,"sensitive":["income"],"counts":[["<=50K",7],[">50K",3]]}

  ``class``: an opaque id, 128 random bits from a CSPRNG (:func:`random_class_id`), derived from nothing a
  reader could invert (no partition, offset, record id or time).  ``qi``: the generalized QIs in schema order.
  ``k``/``l``: the configured parameters; ``size``: distinct individuals in the class; ``loss``: the class's
  per-record loss (mean over QIs; ``null`` if not finite).  ``sensitive``/``counts``: the members' sensitive
  values as counts of their *joint* value tuples (one row ``[v_1, ..., v_m, count]`` per distinct tuple),
  rows sorted by their canonical JSON.  Why counts rather than a shuffled list: the multiset is exactly what a
  class may disclose; counts in a canonical order are that multiset with no order at all (nothing to get wrong
  with a non-cryptographic or seeded shuffle), need no randomness, are byte-deterministic and smaller (ADULT:
  at most 2 rows instead of k values), and keep the joint values when a schema has several sensitive
  attributes.  With a diversity model beyond distinct l the message states it after ``counts`` (only then, so
  the default message is unchanged): ``"diversity":{"model":"entropy","l":1.5}`` (or ``"recursive"`` with
  ``"c"``; ``l`` then holds the distinct values the model guarantees), and with t-closeness
  ``"t_closeness":{"t":0.2,"distance":"equal","reference":[["<=50K",7598],[">50K",2402]]}``: the reference
  distribution the class was checked against (value order; see
  :class:`~stream_anon.core.diversity.RunningReference`), so a reader can recompute the check from the
  message alone.  No record ids, offsets, release ids, delays or latencies; no source headers.  Opt-in
  ``release.include_record_ids`` (outside the threat model) adds ``"members": [[record_id, v_1, ..., v_m],
  ...]`` sorted by the record id's canonical JSON.
  Kafka key: the class id (ASCII).  The bytes are :func:`canonical_json`; the ledger stores them and a
  re-send after a crash sends the stored bytes (byte-identical), so the class id need not be reproducible.

* **Suppressed message** (internal topic ``suppressed``)::

      {"v":1,"release":"adult.raw/0/17","reason":"delay_bound","topic":"adult.raw","partition":0,
       "offsets":[17],"record_ids":["adult-00017"]}

  ``reason``: one of :data:`SUPPRESSION_REASONS`; ``detail`` (optional): e.g. what the gate found.  Key: the
  release id ``<input topic>/<partition>/<first offset>``.  A suppression too large for one message under the
  output bound is written as several (each its own release, split by offset); a single record id too long for
  the bound is written as ``{"id_prefix": <its first characters>, "id_length": <characters>}``.

* **Dead letter** (internal topic ``dlq``), redacted by default::

      {"v":1,"reason":"out_of_domain","field":"age","topic":"adult.raw","partition":0,"offset":17,
       "value_length":143,"value_hmac":"<64 hex: HMAC-SHA256(release secret, original value bytes)>",
       "payload":"redacted"}

  With ``dlq.payload: raw`` also ``"error"`` (the validator's message, which may quote the value; cut at
  :data:`DETAIL_MAX_CHARS`), ``"value_b64"`` (the original bytes, base64, cut at ``max_payload_bytes`` and at what
  fits the output bound; then ``"truncated": true``), ``"key_b64"`` (cut to fit the bound; then
  ``"key_truncated": true``) and ``"key_length"``.  Every text field goes through :func:`safe_text` (a lone surrogate such as ``"\\ud800"`` or
  non-UTF-8 bytes become visible escapes), and nothing goes into headers, so no input can make the encoding
  fail.  Key: the release id of the offset.

* **Side-copy pseudonym** (:func:`record_pseudonym`): ``HMAC-SHA256(secret, canonical JSON of the record id)``,
  hex, truncated to :data:`PSEUDONYM_HEX_CHARS` (128 bits).  Grouping one record's LDP copies by pseudonym
  composes their epsilons (sequential composition); copies of runs with different secrets do not group.

The configuration this module needs is :class:`ReleaseOptions` (``release.*`` and ``dlq.*`` options).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _encode_basestring_ascii
from typing import Any

from stream_anon.core.diversity import DISTANCES, MODELS, DiversityRequirement
from stream_anon.formats.messages import message_size

FORMAT_VERSION = 1
"""``"v"`` of every message this module writes."""

ROLE_ANON = "anon"
ROLE_SUPPRESSED = "suppressed"
ROLE_DLQ = "dlq"
ROLES = (ROLE_ANON, ROLE_SUPPRESSED, ROLE_DLQ)
"""Topic roles of the output messages (``topics.anon``, ``topics.suppressed``, ``topics.dlq``)."""

SUPPRESSION_REASONS = ("delay_bound", "leftover", "gate", "oversized")
"""``delay_bound``: CASTLE suppressed the record when its delay expired (or at the end-of-stream flush);
``leftover``: the leftover cluster's deadline passed below k; ``gate``: the pre-publish gate refused its class;
``oversized``: its class message would exceed the output bound (only with ``release.include_record_ids``, whose
member list grows with the class: one message per class cannot be split)."""
DETAIL_MAX_CHARS = 2000
"""Longest ``detail`` of a suppressed message and ``error`` of a raw dead letter (longer: cut, ``...`` appended)."""

DLQ_PAYLOAD_MODES = ("redacted", "raw")
CLASS_ID_BYTES = 16
"""Random bytes of a class id (128 bits, 32 hex characters)."""
PSEUDONYM_HEX_CHARS = 32
"""Length of a side-copy pseudonym: 32 hex characters = 128 bits of HMAC-SHA256 (birthday collision chance
for 10^9 records: about 1.5e-21)."""
MIN_SECRET_BYTES = 16
GENERATED_SECRET_BYTES = 32


class ReleaseFormatError(ValueError):
    """A message is not in the format this module writes (the message names the field)."""


class ReleaseConfigError(ValueError):
    """A ``release.*``/``dlq.*`` option is invalid: names the option, the allowed values and the value received
    (never a secret's value)."""

    def __init__(self, option: str, allowed: str, received: str):
        super().__init__(f"{option}: must be {allowed}, got {received}")
        self.option = option


# ---------------------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class ReleaseOptions:
    """The options the release formats need (the service's Config carries them; defaults are the safe ones).

    Attributes:
        include_record_ids: ``release.include_record_ids`` (default false).  True adds the members' record ids
            to every public class message: OUTSIDE the threat model (a reader who knows a record id reads its
            sensitive value); the service logs :meth:`startup_warnings` at start.
        secret: ``release.secret`` (default: none, i.e. generated at start, see :func:`resolve_secret`): key of
            the side-copy pseudonyms and of the dead-letter hashes, at least 16 bytes of text.  Set it (config
            file or ``STREAM_ANON_RELEASE_SECRET``) so that pseudonyms and hashes stay stable across restarts.
        dlq_payload: ``dlq.payload``: ``redacted`` (default: reason, field, lengths, position, keyed hash) or
            ``raw`` (also the original bytes, base64, and the validator's message).
        dlq_max_payload_bytes: with ``raw``, original bytes kept per dead letter (longer ones are cut and
            flagged); the service's existing ``service.dlq_max_bytes``.
    """

    include_record_ids: bool = False
    secret: str | None = None
    dlq_payload: str = "redacted"
    dlq_max_payload_bytes: int = 1_000_000

    def __post_init__(self) -> None:
        if not isinstance(self.include_record_ids, bool):
            raise ReleaseConfigError("release.include_record_ids", "true or false", repr(self.include_record_ids))
        if self.secret is not None:
            if not isinstance(self.secret, str):
                raise ReleaseConfigError("release.secret", "a text of at least 16 bytes",
                                         f"a {type(self.secret).__name__}")
            n = len(self.secret.encode("utf-8", "surrogatepass"))
            if n < MIN_SECRET_BYTES:
                raise ReleaseConfigError("release.secret", f"at least {MIN_SECRET_BYTES} bytes of text (e.g. 64 hex "
                                         "characters from `openssl rand -hex 32`)", f"{n} bytes")
        if self.dlq_payload not in DLQ_PAYLOAD_MODES:
            raise ReleaseConfigError("dlq.payload", f"one of {list(DLQ_PAYLOAD_MODES)}", repr(self.dlq_payload))
        m = self.dlq_max_payload_bytes
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ReleaseConfigError("service.dlq_max_bytes", "an integer >= 0", repr(m))

    def startup_warnings(self, *, secret_generated: bool) -> list[str]:
        """Lines the service logs as WARNING at start (empty when the configuration is inside the threat model)."""
        out = []
        if self.include_record_ids:
            out.append("release.include_record_ids is true: every class message on the public anon topic carries "
                       "its members' record ids next to their sensitive values; this is OUTSIDE the threat model "
                       "(docs/threat-model.md): whoever knows a record id reads its sensitive value")
        if self.dlq_payload == "raw":
            out.append("dlq.payload is raw: the dead-letter topic holds original records; restrict it like the "
                       "input topic (docs/threat-model.md)")
        if secret_generated:
            out.append("release.secret not set: generated a random secret for this run; side-copy pseudonyms and "
                       "dead-letter hashes of different runs will not match (set release.secret or "
                       "STREAM_ANON_RELEASE_SECRET to keep them stable)")
        return out


@dataclass(frozen=True)
class ReleaseSecret:
    """The key of pseudonyms and dead-letter hashes: ``text`` (what ``release.secret`` holds) and ``value`` (its
    UTF-8 bytes, the HMAC key); ``generated``: made at start, not configured.  ``repr`` never shows it."""

    text: str
    generated: bool

    @property
    def value(self) -> bytes:
        return self.text.encode("utf-8", "surrogatepass")

    def __repr__(self) -> str:
        return f"ReleaseSecret(<{len(self.value)} bytes>, generated={self.generated})"

    __str__ = __repr__


def resolve_secret(configured: str | None, *, token_hex: Callable[[int], str] = secrets.token_hex) -> ReleaseSecret:
    """The configured ``release.secret``, or 64 hex characters (32 bytes) from the OS CSPRNG when none is
    configured.

    Resolve it ONCE in the parent process and put the text into the configuration the workers and the side-path
    process receive (a per-process secret would give one record different pseudonyms in different processes);
    redact ``release.secret`` wherever the configuration is printed.
    """
    if configured is not None:
        ReleaseOptions(secret=configured)  # validates the length (error names the option, not the value)
        return ReleaseSecret(configured, generated=False)
    return ReleaseSecret(token_hex(GENERATED_SECRET_BYTES), generated=True)


# ---------------------------------------------------------------------------------------------- encoding helpers
def canonical_json(obj: Any) -> bytes:
    """Compact, ASCII-only JSON (``separators=(",", ":")``, ``ensure_ascii``, no NaN): the bytes of every
    message.  Deterministic for a given object (dict order as built; floats in Python's shortest repr)."""
    return json.dumps(obj, ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode("ascii")


def safe_text(value: str | bytes | None) -> str | None:
    """Text that every encoder accepts: lone surrogates (``"\\ud800"``) and undecodable bytes become visible
    backslash escapes; valid text is returned unchanged."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if not isinstance(value, str):
        value = str(value)
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")


def random_class_id() -> str:
    """An opaque class id: 128 bits from the OS CSPRNG (``secrets``), 32 hex characters."""
    return secrets.token_hex(CLASS_ID_BYTES)


def _id_key(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=True)


def release_id(input_topic: str, partition: int, first_offset: int) -> str:
    """Internal id of a release (ledger key, suppressed/dlq key): ``<input topic>/<partition>/<first offset>``."""
    return f"{input_topic}/{partition}/{first_offset}"


@dataclass(frozen=True)
class EncodedMessage:
    """One output message exactly as it is produced: topic role, key and value bytes, no headers, and its Kafka
    timestamp (``timestamp_ms``; None: the producer's send time).  The main path stamps a class message with the
    end of its release tick (``release.tick_seconds``) before its ledger entry is written, so a re-send carries
    the same timestamp; the digest does not cover it (a message found present is present)."""

    role: str
    key: bytes | None
    value: bytes
    timestamp_ms: int | None = None

    def digest(self) -> bytes:
        """SHA-256 over role, key and value (how recovery recognizes the message in an output partition)."""
        return message_digest(self.role, self.key, self.value)


def message_digest(role: str, key: bytes | None, value: bytes | None) -> bytes:
    h = hashlib.sha256(role.encode("ascii"))
    for part in (key, value):
        if part is None:
            h.update(b"\x00")
        else:
            h.update(b"\x01" + len(part).to_bytes(8, "big"))
            h.update(part)
    return h.digest()


# ---------------------------------------------------------------------------------------------- class messages
def sensitive_counts(members: Sequence[Mapping[str, Any]], sensitive: Sequence[str]) -> list[list[Any]]:
    """Rows ``[v_1, ..., v_m, count]`` of the members' joint sensitive values, sorted by canonical JSON."""
    counts: dict[tuple[Any, ...], int] = {}
    if len(sensitive) == 1:
        s0 = sensitive[0]
        for m in members:
            t = (m[s0],)
            counts[t] = counts.get(t, 0) + 1
    else:
        for m in members:
            t = tuple(m[s] for s in sensitive)
            counts[t] = counts.get(t, 0) + 1
    rows = [[*t, n] for t, n in counts.items()]
    rows.sort(key=lambda r: _id_key(r[:-1]))
    return rows


class ClassEncoder:
    """Builds public class messages (see the module docstring) for one schema and configuration.

    Args:
        qis: QI names in the order they are written (the schema's order).
        sensitive: sensitive attribute names (joint values are counted).
        k, l: the configured parameters (written as is; ``l``: the distinct sensitive values every class holds).
        include_record_ids: ``release.include_record_ids``.
        new_class_id: id source (default :func:`random_class_id`; inject a seeded one in tests only).
        requirement: the diversity requirement, stated in the message when it goes beyond distinct l.
    """

    def __init__(self, *, qis: Sequence[str], sensitive: Sequence[str], k: int, l: int | None = None,  # noqa: E741
                 include_record_ids: bool = False, new_class_id: Callable[[], str] = random_class_id,
                 requirement: DiversityRequirement | None = None) -> None:
        self.qis = tuple(qis)
        self.sensitive = tuple(sensitive)
        self.k = int(k)
        self.l = None if l is None else int(l)
        self.include_record_ids = include_record_ids
        self.new_class_id = new_class_id
        self.model_fields = requirement.public_fields() if requirement is not None else {}

    def encode(self, *, generalized: Mapping[str, str], members: Sequence[Mapping[str, Any]], size: int,
               loss: float, record_ids: Sequence[Any] | None = None,
               reference: Sequence[tuple[Any, int]] | None = None) -> EncodedMessage:
        """One class message; ``members``: the original records (sensitive values read from them);
        ``record_ids``: same order, used only with ``include_record_ids``; ``reference``: with t-closeness, the
        reference the class was checked against (``(value, count)`` pairs, from the gate)."""
        class_id = self.new_class_id()
        lossf = float(loss)
        body: dict[str, Any] = {
            "v": FORMAT_VERSION, "class": class_id, "qi": {q: generalized[q] for q in self.qis},
            "k": self.k, "l": self.l, "size": int(size), "loss": lossf if math.isfinite(lossf) else None,
            "sensitive": list(self.sensitive), "counts": sensitive_counts(members, self.sensitive),
        }
        if self.model_fields:
            if "diversity" in self.model_fields:
                body["diversity"] = dict(self.model_fields["diversity"])
            if "t_closeness" in self.model_fields:
                if reference is None:
                    raise ValueError("t-closeness: the class message needs the reference the class was checked on")
                body["t_closeness"] = {**self.model_fields["t_closeness"],
                                       "reference": [[v, int(n)] for v, n in reference]}
        if self.include_record_ids:
            if record_ids is None or len(record_ids) != len(members):
                raise ValueError("include_record_ids: record_ids must give one id per member")
            rows = [[rid, *(m[s] for s in self.sensitive)] for rid, m in zip(record_ids, members, strict=True)]
            rows.sort(key=lambda r: _id_key(r[0]))
            body["members"] = rows
        return EncodedMessage(ROLE_ANON, class_id.encode("ascii"), canonical_json(body))


@dataclass(frozen=True)
class PublicClass:
    """A decoded class message."""

    class_id: str
    qi: dict[str, str]
    k: int
    l: int | None  # noqa: E741
    size: int
    loss: float | None
    sensitive: tuple[str, ...]
    counts: tuple[tuple[tuple[Any, ...], int], ...]
    members: tuple[tuple[Any, ...], ...] | None = None
    diversity: dict[str, Any] | None = None  # {"model", "l"(, "c")} beyond distinct l
    t_closeness: dict[str, Any] | None = None  # {"t", "distance", "reference": [[value, count], ...]}

    def requirement(self) -> DiversityRequirement | None:
        """The diversity requirement the message states (distinct ``l``, the ``diversity`` model, t-closeness);
        None when it states none."""
        d, t = self.diversity or {}, self.t_closeness or {}
        if not d and not t and (self.l is None or self.l <= 1):
            return None
        model = d.get("model", "distinct")
        return DiversityRequirement(model=model, l=d.get("l", self.l if model == "distinct" else None), c=d.get("c"),
                                    t=t.get("t"), distance=t.get("distance", "equal"))

    def reference(self) -> dict[Any, int] | None:
        """The t-closeness reference the message carries (value -> count), or None."""
        if not self.t_closeness:
            return None
        return {v: int(n) for v, n in self.t_closeness["reference"]}

    @property
    def n_records(self) -> int:
        return sum(n for _, n in self.counts)

    def distinct_sensitive(self, attribute: str | None = None) -> int:
        """Distinct values of one sensitive attribute (default the first) among the members."""
        i = 0 if attribute is None else self.sensitive.index(attribute)
        return len({t[i] for t, _ in self.counts})

    def rows(self) -> list[dict[str, Any]]:
        """One row per record (class_id, QIs, sensitive values): the released-records table without ids."""
        out: list[dict[str, Any]] = []
        for values, n in self.counts:
            row: dict[str, Any] = {"class_id": self.class_id, **self.qi}
            row.update(zip(self.sensitive, values, strict=True))
            out.extend(dict(row) for _ in range(n))
        return out


def _need(body: Mapping[str, Any], name: str, types: type | tuple[type, ...], *, nullable: bool = False) -> Any:
    if name not in body:
        raise ReleaseFormatError(f"field {name!r} missing")
    v = body[name]
    if v is None and nullable:
        return None
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ReleaseFormatError(f"field {name!r}: expected {types}, got {v!r}")
    if not isinstance(v, types):
        raise ReleaseFormatError(f"field {name!r}: expected {types}, got {type(v).__name__}")
    return v


def _json_object(value: bytes | None, what: str) -> dict[str, Any]:
    if value is None:
        raise ReleaseFormatError(f"{what}: no value")
    try:
        body = json.loads(value)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ReleaseFormatError(f"{what}: not JSON ({str(e)[:200]})") from None
    if not isinstance(body, dict):
        raise ReleaseFormatError(f"{what}: not a JSON object")
    if body.get("v") != FORMAT_VERSION:
        raise ReleaseFormatError(f"{what}: version {body.get('v')!r}, expected {FORMAT_VERSION}")
    return body


def decode_class_message(value: bytes | None) -> PublicClass:
    """Parse a class message strictly (raises :class:`ReleaseFormatError` naming the field)."""
    body = _json_object(value, "class message")
    qi = _need(body, "qi", dict)
    if not all(isinstance(q, str) and isinstance(g, str) for q, g in qi.items()):
        raise ReleaseFormatError("field 'qi': expected QI name -> generalized string")
    sens = _need(body, "sensitive", list)
    if not all(isinstance(s, str) for s in sens):
        raise ReleaseFormatError("field 'sensitive': expected attribute names")
    counts = []
    for row in _need(body, "counts", list):
        if not isinstance(row, list) or len(row) != len(sens) + 1 or isinstance(row[-1], bool) \
                or not isinstance(row[-1], int) or row[-1] < 1:
            raise ReleaseFormatError(f"field 'counts': row {row!r} is not [{', '.join(sens)}, count >= 1]")
        counts.append((tuple(row[:-1]), int(row[-1])))
    members = None
    if "members" in body:
        ms = _need(body, "members", list)
        if not all(isinstance(m, list) and len(m) == len(sens) + 1 for m in ms):
            raise ReleaseFormatError("field 'members': rows must be [record_id, sensitive values...]")
        members = tuple(tuple(m) for m in ms)
    loss = _need(body, "loss", (int, float), nullable=True)
    cid = _need(body, "class", str)
    diversity = t_closeness = None
    if "diversity" in body:
        diversity = _need(body, "diversity", dict)
        if diversity.get("model") not in MODELS or not _is_number(diversity.get("l")) or \
                ("c" in diversity and not _is_number(diversity["c"])) or set(diversity) - {"model", "l", "c"}:
            raise ReleaseFormatError(f"field 'diversity': expected {{\"model\": one of {list(MODELS)}, \"l\": number"
                                     f"(, \"c\": number)}}, got {diversity!r}"[:300])
    if "t_closeness" in body:
        t_closeness = _need(body, "t_closeness", dict)
        ref = t_closeness.get("reference")
        if not _is_number(t_closeness.get("t")) or t_closeness.get("distance") not in DISTANCES[1:] or \
                not isinstance(ref, list) or not ref or not all(
                    isinstance(r, list) and len(r) == 2 and _is_count(r[1]) for r in ref):
            raise ReleaseFormatError("field 't_closeness': expected {\"t\": number, \"distance\": equal|ordered, "
                                     "\"reference\": [[value, count >= 1], ...]}")
    return PublicClass(class_id=cid, qi=dict(qi), k=_need(body, "k", int), l=_need(body, "l", int, nullable=True),
                       size=_need(body, "size", int), loss=None if loss is None else float(loss),
                       sensitive=tuple(sens), counts=tuple(counts), members=members, diversity=diversity,
                       t_closeness=t_closeness)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


# ---------------------------------------------------------------------------------------------- suppressed
def suppressed_message(*, input_topic: str, partition: int, offsets: Sequence[int], record_ids: Sequence[Any],
                       reason: str, detail: str | None = None,
                       max_message_bytes: int | None = None) -> EncodedMessage:
    """The internal record of a suppression: release id, reason, offsets and record ids (no QI values).

    ``max_message_bytes``: the output bound (:func:`~stream_anon.formats.messages.message_size`).  The caller
    splits a suppression of many records into messages that fit; a single record whose id alone does not fit
    gets its id cut (``{"id_prefix": ..., "id_length": ...}``, see the module docstring)."""
    if reason not in SUPPRESSION_REASONS:
        raise ValueError(f"suppression reason must be one of {list(SUPPRESSION_REASONS)}, got {reason!r}")
    if not offsets or len(record_ids) != len(offsets):
        raise ValueError("suppressed_message: needs one record id per offset, at least one offset")
    order = sorted(range(len(offsets)), key=offsets.__getitem__)
    offs = [int(offsets[i]) for i in order]
    rid = release_id(input_topic, partition, offs[0])
    body: dict[str, Any] = {"v": FORMAT_VERSION, "release": rid, "reason": reason, "topic": safe_text(input_topic),
                            "partition": int(partition), "offsets": offs,
                            "record_ids": [_safe_id(record_ids[i]) for i in order]}
    if detail is not None:
        body["detail"] = cut_text(safe_text(detail), DETAIL_MAX_CHARS)
    key = rid.encode("utf-8", "backslashreplace")
    value = canonical_json(body)
    if max_message_bytes is not None and len(offs) == 1 and message_size(key, value) > max_message_bytes:
        ids = body["record_ids"]
        text = ids[0] if isinstance(ids[0], str) else json.dumps(ids[0], ensure_ascii=True)
        room = max(0, max_message_bytes - (message_size(key, value) - len(canonical_json(ids[0]))) - 64)
        ids[0] = {"id_prefix": _ascii_prefix(text, room), "id_length": len(text)}
        value = canonical_json(body)
    return EncodedMessage(ROLE_SUPPRESSED, key, value)


def _safe_id(rid: Any) -> Any:
    return safe_text(rid) if isinstance(rid, str) else rid


def cut_text(text: str | None, max_chars: int) -> str | None:
    """``text`` cut to ``max_chars`` characters (``...`` appended when cut)."""
    if text is None or len(text) <= max_chars:
        return text
    return text[:max_chars] + "..."


def _ascii_prefix(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose canonical JSON string takes at most ``max_bytes`` bytes."""
    lo, hi = 0, min(len(text), max_bytes)
    while lo < hi:  # binary search: the JSON escape of a character takes 1 to 12 bytes
        mid = (lo + hi + 1) // 2
        if len(_encode_basestring_ascii(text[:mid])) <= max_bytes:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


# ---------------------------------------------------------------------------------------------- dead letters
def keyed_hash(secret: bytes, data: bytes) -> str:
    """HMAC-SHA256 of ``data`` under ``secret``, hex (64 characters).  Keyed, so a reader without the secret
    cannot confirm a guessed record by hashing it (low-entropy records are easy to enumerate)."""
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def dead_letter_message(*, input_topic: str, partition: int, offset: int, reason: str, field: str | None,
                        error: str | None, value: bytes | None, key: bytes | None, secret: bytes,
                        payload: str = "redacted", max_payload_bytes: int = 1_000_000,
                        max_message_bytes: int | None = None) -> EncodedMessage:
    """The internal dead-letter record of one rejected input message (see the module docstring).

    Redacted (default): reason, field, value length, input topic/partition/offset and
    ``value_hmac`` = HMAC-SHA256(secret, original value bytes) (``null`` for a message without value).
    ``payload="raw"`` adds the validator's ``error`` (cut at :data:`DETAIL_MAX_CHARS`), ``value_b64`` (cut at
    ``max_payload_bytes``, ``truncated`` then true), ``key_b64`` and ``key_length``; with ``max_message_bytes``
    (the output bound) the value and the key are cut further until the message fits (``truncated``,
    ``key_truncated``).  Never fails on odd text (lone surrogates, non-UTF-8 bytes).
    """
    if payload not in DLQ_PAYLOAD_MODES:
        raise ValueError(f"dlq payload must be one of {list(DLQ_PAYLOAD_MODES)}, got {payload!r}")
    rid = release_id(input_topic, partition, offset)
    msg_key = rid.encode("utf-8", "backslashreplace")
    body: dict[str, Any] = {
        "v": FORMAT_VERSION, "reason": safe_text(reason), "field": cut_text(safe_text(field), 200),
        "topic": safe_text(input_topic), "partition": int(partition), "offset": int(offset),
        "value_length": None if value is None else len(value),
        "value_hmac": None if value is None else keyed_hash(secret, value), "payload": payload,
    }
    if payload != "raw":
        return EncodedMessage(ROLE_DLQ, msg_key, canonical_json(body))
    body["error"] = cut_text(safe_text(error), DETAIL_MAX_CHARS)
    v_cut = None if value is None else value[:max_payload_bytes]
    k_cut = key
    if max_message_bytes is not None:
        v_cut, k_cut = _fit_payload(body, msg_key, v_cut, key, max_message_bytes)
    if value is not None:
        assert v_cut is not None
        body["value_b64"] = base64.b64encode(v_cut).decode("ascii")
        body["truncated"] = len(v_cut) < len(value)
    body["key_b64"] = None if k_cut is None else base64.b64encode(k_cut).decode("ascii")
    body["key_length"] = None if key is None else len(key)
    if key is not None and k_cut is not None and len(k_cut) < len(key):
        body["key_truncated"] = True
    return EncodedMessage(ROLE_DLQ, msg_key, canonical_json(body))


def _fit_payload(body: Mapping[str, Any], msg_key: bytes, value: bytes | None, key: bytes | None,
                 max_message_bytes: int) -> tuple[bytes | None, bytes | None]:
    """The value and key bytes a raw dead letter keeps so that it fits ``max_message_bytes``: both whole when they
    fit; else each gets at least half of the room (the value first), cut to whole base64 groups."""
    skeleton = dict(body, value_b64="", truncated=True, key_b64="", key_length=len(key or b""), key_truncated=True)
    room = max_message_bytes - message_size(msg_key, canonical_json(skeleton)) - 16
    raw = max(0, room // 4 * 3)  # base64: 4 characters per 3 bytes, no escapes in JSON
    v, k = len(value or b""), len(key or b"")
    if v + k <= raw:
        return value, key
    k_share = min(k, raw // 2) if v > raw // 2 else min(k, raw - v)
    v_share = min(v, raw - k_share)
    k_share = min(k, raw - v_share)
    v_share -= v_share % 3 if v_share < v else 0
    k_share -= k_share % 3 if k_share < k else 0
    return (None if value is None else value[:v_share]), (None if key is None else key[:k_share])


def decode_dead_letter(value: bytes | None) -> dict[str, Any]:
    """Parse a dead-letter message (checks the fields every mode has; raises :class:`ReleaseFormatError`)."""
    body = _json_object(value, "dead letter")
    _need(body, "reason", str)
    _need(body, "partition", int)
    _need(body, "offset", int)
    if body.get("payload") not in DLQ_PAYLOAD_MODES:
        raise ReleaseFormatError(f"field 'payload': expected one of {list(DLQ_PAYLOAD_MODES)}")
    return body


def decode_suppressed(value: bytes | None) -> dict[str, Any]:
    """Parse a suppressed message (raises :class:`ReleaseFormatError`)."""
    body = _json_object(value, "suppressed message")
    if _need(body, "reason", str) not in SUPPRESSION_REASONS:
        raise ReleaseFormatError(f"field 'reason': expected one of {list(SUPPRESSION_REASONS)}")
    offs = _need(body, "offsets", list)
    ids = _need(body, "record_ids", list)
    if not offs or len(offs) != len(ids) or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs):
        raise ReleaseFormatError("fields 'offsets'/'record_ids': expected equal-length lists of offsets and ids")
    return body


# ---------------------------------------------------------------------------------------------- pseudonyms
def canonical_id_bytes(record_id: Any) -> bytes:
    """The bytes a record id is hashed as: its canonical JSON (``"abc"`` and ``12`` differ from ``"12"``);
    lone surrogates are escaped, so every id a JSON decoder can produce is accepted."""
    t = type(record_id)
    if t is str:
        return _encode_basestring_ascii(record_id).encode("ascii")  # what json.dumps(ensure_ascii=True) writes
    if t is int:
        return str(record_id).encode("ascii")
    return json.dumps(record_id, ensure_ascii=True, separators=(",", ":"), sort_keys=True).encode("ascii")


def record_pseudonym(secret: bytes, record_id: Any, hex_chars: int = PSEUDONYM_HEX_CHARS) -> str:
    """``HMAC-SHA256(secret, canonical_id_bytes(record_id))``, hex, first ``hex_chars`` characters."""
    return hmac.new(secret, canonical_id_bytes(record_id), hashlib.sha256).hexdigest()[:hex_chars]


class Pseudonymizer:
    """:func:`record_pseudonym` with the key schedule done once (the side paths call it per record)."""

    def __init__(self, secret: bytes, hex_chars: int = PSEUDONYM_HEX_CHARS) -> None:
        if not 16 <= hex_chars <= 64:
            raise ValueError(f"pseudonym length: must be 16..64 hex characters, got {hex_chars}")
        self._base = hmac.new(secret, digestmod=hashlib.sha256)
        self.hex_chars = hex_chars

    def __call__(self, record_id: Any) -> str:
        h = self._base.copy()
        h.update(canonical_id_bytes(record_id))
        return h.hexdigest()[: self.hex_chars]

    def __repr__(self) -> str:
        return f"Pseudonymizer(hex_chars={self.hex_chars})"
