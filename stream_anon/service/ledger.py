"""The internal ledger of the main path: its entries, checkpoints and writer state, pure (no Kafka, no Prometheus).

Recovery from the ledger is :mod:`stream_anon.service.recovery`, accounting from it
:mod:`stream_anon.service.accounting`; the protocol below is the one they implement with the outbox
(:mod:`stream_anon.service.outbox`, steps 1-3) and the committer (:mod:`stream_anon.service.committer`, steps 4-6).

The ledger is the internal topic ``<input>.ledger`` (:func:`ledger_topic`), ledger partition = input
partition.  It is the source of truth for recovery and accounting: every input offset appears in exactly one
*entry* (``class`` = released, ``suppressed``, ``dlq`` = dead-lettered, ``control`` = an end-of-stream marker),
and each entry carries the exact bytes of the output message it promises (:class:`LedgerEntry`).  Public
topics are never read back.

Outbox protocol (Kafka transactions are not used: on Tansu aborted records stay visible)::

    per batch of pipeline results (one partition or several):
      1. send the batch's ledger entries to <input>.ledger (partition p); WAIT until all are acknowledged
      2. send each entry's output message(s) (anon / suppressed / dlq, partition p), byte for byte as stored;
         each acknowledgement reports its output offset: PartitionOutbox.acked(role, offset)
    every commit (service.commit_interval_ms), per partition whose watermark or horizon moved:
      3. flush: WAIT until every output sent so far is acknowledged
      4. send Checkpoint(watermark, horizon, ends = output end offsets as acknowledged); WAIT for it
      5. commit the consumer offset = that watermark
      6. once the commit is confirmed: send the tombstones PartitionOutbox.tombstones(committed) (compaction)
    recovery of partition p (LedgerScan, then outputs_to_resend):
      a. committed = the group's committed offset of p (None if the group has none)
      b. read <input>.ledger partition p backwards in chunks from its end E into LedgerScan until add_chunk
         returns True (a checkpoint whose horizon is below the threshold) or the beginning is reached; write the
         fence (a tombstone, recovery.fence_key) to it, WAIT for it at F; F > E (a stale end): read again from
         an end of at least F + 1
      c. plan = scan.finish(): start_offset, accounted offsets (skip them), horizon, pending entries (after the
         last checkpoint, not wholly below the committed offset) and scan_from (the checkpoint's output ends)
      d. read each output partition p forward from plan.scan_from[role] to its end, put (role, key, value) of
         every message into OutputPresence; re-send outputs_to_resend(plan.pending, presence) in that order,
         byte-identical; WAIT for their acknowledgements
      e. start the new incarnation: PartitionOutbox.from_recovery(...), write its initial checkpoint
         (watermark = plan.start_offset, ends = max(scan ends, re-sends acknowledged)); WAIT; then consume
         from plan.start_offset, skipping plan.accounted

Invariants the steps keep (proofs in docs/threat-model.md, "Ledger"):

* I1 an output message is sent only after its ledger entry is acknowledged, so every published message has
  an entry; a record without an entry was never published and is processed again from scratch;
* I2 a checkpoint is written only when every entry before it has its outputs acknowledged, and it records
  output end offsets at least as large as theirs, so only entries after the last checkpoint can miss an
  output, and those outputs lie at or after the checkpoint's ends;
* I3 every entry before a checkpoint C has all offsets <= C.horizon (horizons only grow, across
  incarnations too), so a backward scan that meets a checkpoint with horizon < threshold has seen every
  entry holding an offset >= threshold;
* I4 the consumer offset W is committed only after every output of records < W is acknowledged, so an
  entry wholly below W never needs a re-send, and starting at max(W, last checkpoint's watermark) loses nothing.

Hence: nothing lost (every offset >= start is either accounted in the ledger, with its output present or
re-sent, or processed again), no record in two classes (an accounted offset is never processed again; an
unaccounted one was never published), a class published whole and once (one message per class, re-sent only
when absent from the output partition, with the stored bytes).  Residual risks: a *zombie* (an evicted member
still producing after the new owner scanned) and a produce request still queued in the broker while the new
owner scans; both are bounded by the group's session timeout and documented.

Bounded messages: an entry whose encoding does not fit the output bound (the broker's ``message.max.bytes``, read at
start: :mod:`stream_anon.kafka_io.limits`) is written as *chunks* (:meth:`LedgerEntry.ledger_messages`): its
encoding cut into pieces, base64, each in a ``chunk`` message carrying the entry's kind, partition, first and last
offset, horizon, an entry id (a digest of the whole encoding), its index and the number of chunks; one send, in
order, so step 2 waits for all of them.  Readers reassemble them (:class:`~stream_anon.service.ledger_state.ChunkAssembler`): an entry counts only
when every chunk is there (a crash between chunks leaves an incomplete entry that counts for nothing: its output
was never sent, its records are processed again).  Class entries of large classes (a class lists every member's
offset and record id, and l-diversity can merge hundreds of records) are what needs this; the outputs themselves
are bounded where they are made (:class:`EntryFactory`: a suppression is split by offset, a raw dead letter cut,
a class message that cannot fit is suppressed as ``oversized``).

Bounded growth: keys make the ledger compactable (``cleanup.policy=compact``): an entry's key is its release
id, a checkpoint's key is unique per checkpoint, and :meth:`PartitionOutbox.tombstones` names the entries
wholly below the committed offset and the checkpoints older than the newest one that can still stop a scan.
Tansu does not compact (as far as we know): there the ledger grows like every other topic, while the backward
scan keeps recovery bounded.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_anon.formats.messages import message_size
from stream_anon.formats.release import (
    DETAIL_MAX_CHARS,
    DLQ_PAYLOAD_MODES,
    ROLE_ANON,
    ROLE_DLQ,
    ROLE_SUPPRESSED,
    ROLES,
    SUPPRESSION_REASONS,
    ClassEncoder,
    EncodedMessage,
    canonical_json,
    cut_text,
    dead_letter_message,
    release_id,
    safe_text,
    suppressed_message,
)
from stream_anon.service.gate import GateResult, PrePublishGate

LEDGER_VERSION = 1
LEDGER_SUFFIX = ".ledger"

KIND_CLASS = "class"
KIND_SUPPRESSED = "suppressed"
KIND_DLQ = "dlq"
KIND_CONTROL = "control"
ENTRY_KINDS = (KIND_CLASS, KIND_SUPPRESSED, KIND_DLQ, KIND_CONTROL)
OUTCOME_OF_KIND = {KIND_CLASS: "released", KIND_SUPPRESSED: "suppressed", KIND_DLQ: "dead_lettered",
                   KIND_CONTROL: "control"}
"""Accounting outcome of every input offset, by the kind of the entry that holds it."""
_ROLE_OF_KIND = {KIND_CLASS: ROLE_ANON, KIND_SUPPRESSED: ROLE_SUPPRESSED, KIND_DLQ: ROLE_DLQ}


def ledger_topic(input_topic: str) -> str:
    """The ledger topic of an input topic: ``<input>.ledger`` (as many partitions as the input)."""
    return input_topic + LEDGER_SUFFIX


class LedgerFormatError(ValueError):
    """A ledger message is foreign or corrupt (the message says what is wrong)."""


# ---------------------------------------------------------------------------------------------- entries
def _bytes_out(name: str, b: bytes | None, out: dict[str, Any]) -> None:
    if b is None:
        out[name] = None
        return
    try:
        out[name] = b.decode("ascii")
    except UnicodeDecodeError:
        out[name + "_b64"] = base64.b64encode(b).decode("ascii")


def _bytes_in(name: str, d: Mapping[str, Any]) -> bytes | None:
    if name + "_b64" in d:
        v = d[name + "_b64"]
        if not isinstance(v, str):
            raise LedgerFormatError(f"output {name}_b64: expected base64 text")
        try:
            return base64.b64decode(v, validate=True)
        except ValueError as e:
            raise LedgerFormatError(f"output {name}_b64: {e}") from None
    if name not in d:
        raise LedgerFormatError(f"output: {name!r} missing")
    v = d[name]
    if v is None:
        return None
    if not isinstance(v, str):
        raise LedgerFormatError(f"output {name}: expected text")
    try:
        return v.encode("ascii")
    except UnicodeEncodeError:
        raise LedgerFormatError(f"output {name}: not ASCII") from None


@dataclass(frozen=True)
class LedgerEntry:
    """What happened to a set of input offsets, and the output message it promises.

    Attributes:
        kind: ``class`` | ``suppressed`` | ``dlq`` | ``control``.
        topic, partition: the input topic and partition.
        offsets: the input offsets it accounts for, ascending (``dlq``/``control``: one).
        horizon: the highest input offset any incarnation had consumed when the entry was made.
        record_ids: the input record ids, same order as ``offsets`` (``class``/``suppressed``; empty otherwise).
        reason: ``suppressed``: one of ``SUPPRESSION_REASONS``; ``dlq``: the dead-letter reason.
        class_id: ``class``: the public opaque class id (the link ledger -> anon message, internal only).
        outputs: the promised output messages (``class``/``suppressed``/``dlq``: exactly one, of the kind's
            role; ``control``: none), each with its Kafka timestamp when it has one (a class message: the end of
            its release tick, ``ts`` in the entry; a re-send carries it).
        incarnation: tag of the service incarnation that made it (diagnostics).
        trigger: ``class``/``suppressed``: the input offset whose arrival (or end-of-stream marker) released
            the records (None: not recorded, e.g. a wall-clock expiry without arrival).
        delays: ``class``/``suppressed``: arrivals each record waited in the engine, same order as ``offsets``
            (empty: not recorded).
        latency_ms: same order: milliseconds from the input message's timestamp to its release (None where
            the input had no timestamp; empty: not recorded).

    The timing fields are internal (the ledger is an internal topic): the demo summary, the crash test's delay
    check and ``bench service`` read them; the public class message has none of them.
    """

    kind: str
    topic: str
    partition: int
    offsets: tuple[int, ...]
    horizon: int
    record_ids: tuple[Any, ...] = ()
    reason: str | None = None
    class_id: str | None = None
    outputs: tuple[EncodedMessage, ...] = ()
    incarnation: str = ""
    trigger: int | None = None
    delays: tuple[int, ...] = ()
    latency_ms: tuple[int | None, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ENTRY_KINDS:
            raise LedgerFormatError(f"kind: expected one of {list(ENTRY_KINDS)}, got {self.kind!r}")
        offs = self.offsets
        if not offs or any(isinstance(o, bool) or not isinstance(o, int) or o < 0 for o in offs):
            raise LedgerFormatError(f"offsets: expected a non-empty list of integers >= 0, got {offs!r}")
        if any(a >= b for a, b in zip(offs, offs[1:], strict=False)):
            raise LedgerFormatError("offsets: must be strictly ascending")
        if isinstance(self.partition, bool) or not isinstance(self.partition, int) or self.partition < 0:
            raise LedgerFormatError(f"partition: expected an integer >= 0, got {self.partition!r}")
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or self.horizon < offs[-1]:
            raise LedgerFormatError(f"horizon: expected an integer >= the last offset {offs[-1]}, got {self.horizon!r}")
        if self.record_ids and len(self.record_ids) != len(offs):
            raise LedgerFormatError(f"record_ids: {len(self.record_ids)} ids for {len(offs)} offsets")
        if self.kind in (KIND_DLQ, KIND_CONTROL) and len(offs) != 1:
            raise LedgerFormatError(f"{self.kind} entry: exactly one offset, got {len(offs)}")
        want = _ROLE_OF_KIND.get(self.kind)
        roles = [o.role for o in self.outputs]
        if (want is None and roles) or (want is not None and roles != [want]):
            raise LedgerFormatError(f"{self.kind} entry: outputs must be {[want] if want else []}, got {roles}")
        if self.kind == KIND_CLASS and not self.class_id:
            raise LedgerFormatError("class entry: class_id missing")
        if self.kind == KIND_SUPPRESSED and self.reason not in SUPPRESSION_REASONS:
            raise LedgerFormatError(f"suppressed entry: reason must be one of {list(SUPPRESSION_REASONS)}, "
                                    f"got {self.reason!r}")
        if self.kind == KIND_DLQ and not isinstance(self.reason, str):
            raise LedgerFormatError("dlq entry: reason missing")
        t = self.trigger
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 0):
            raise LedgerFormatError(f"trigger: expected an offset >= 0 or null, got {t!r}")
        for name, values, nullable in (("delays", self.delays, False), ("latency_ms", self.latency_ms, True)):
            if values and len(values) != len(offs):
                raise LedgerFormatError(f"{name}: {len(values)} values for {len(offs)} offsets")
            if any(not (nullable and v is None) and (isinstance(v, bool) or not isinstance(v, int) or v < 0)
                   for v in values):
                raise LedgerFormatError(f"{name}: expected integers >= 0{' or null' if nullable else ''}")

    @property
    def release_id(self) -> str:
        return release_id(self.topic, self.partition, self.offsets[0])

    @property
    def key(self) -> bytes:
        """Ledger key (compaction): the release id."""
        return self.release_id.encode("utf-8", "backslashreplace")

    @property
    def last_offset(self) -> int:
        return self.offsets[-1]

    @property
    def outcome(self) -> str:
        return OUTCOME_OF_KIND[self.kind]

    def ledger_messages(self, max_message_bytes: int | None = None) -> list[tuple[bytes, bytes]]:
        """The (key, value) ledger messages of this entry: one, or, when its encoding does not fit
        ``max_message_bytes`` (:func:`~stream_anon.formats.messages.message_size`), its chunks in order (module
        docstring; :class:`EntryChunk`)."""
        value = self.encode()
        if max_message_bytes is None or message_size(self.key, value) <= max_message_bytes:
            return [(self.key, value)]
        return [(c.key, c.encode()) for c in EntryChunk.split(self, value, max_message_bytes)]

    def encode(self) -> bytes:
        outs = []
        for o in self.outputs:
            d: dict[str, Any] = {"role": o.role}
            _bytes_out("key", o.key, d)
            _bytes_out("value", o.value, d)
            if o.timestamp_ms is not None:
                d["ts"] = o.timestamp_ms
            outs.append(d)
        body: dict[str, Any] = {"v": LEDGER_VERSION, "t": self.kind, "topic": self.topic, "p": self.partition,
                                "offsets": list(self.offsets), "horizon": self.horizon}
        if self.record_ids:
            body["ids"] = list(self.record_ids)
        if self.reason is not None:
            body["reason"] = self.reason
        if self.class_id is not None:
            body["class"] = self.class_id
        body["out"] = outs
        body["inc"] = self.incarnation
        if self.trigger is not None:
            body["trig"] = self.trigger
        if self.delays:
            body["delays"] = list(self.delays)
        if self.latency_ms:
            body["lat_ms"] = list(self.latency_ms)
        return canonical_json(body)


@dataclass(frozen=True)
class Checkpoint:
    """Progress of one ledger partition at a commit.

    Attributes:
        watermark: the input offset committed right after this checkpoint (every record below it is accounted
            and its outputs acknowledged).
        horizon: the highest input offset consumed so far (>= watermark - 1).
        ends: output role -> end offset (next offset) of the output partition as acknowledged by the producer
            (a lower bound of where any later output lands).
        seq, incarnation: make the key unique (``<topic>/<partition>/checkpoint/<incarnation>/<seq>``).
        group: the consumer group of the service that wrote it (empty: not recorded).  A ledger belongs to one
            group (one service, one set of output topics): recovery refuses a ledger that holds another group's
            checkpoints (:attr:`RecoveryPlan.foreign_groups`).
    """

    topic: str
    partition: int
    watermark: int
    horizon: int
    ends: tuple[tuple[str, int], ...]
    seq: int
    incarnation: str
    group: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.group, str):
            raise LedgerFormatError(f"checkpoint group: expected text, got {self.group!r}")
        for name in ("partition", "watermark", "seq"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise LedgerFormatError(f"checkpoint {name}: expected an integer >= 0, got {v!r}")
        if isinstance(self.horizon, bool) or not isinstance(self.horizon, int) or self.horizon < self.watermark - 1:
            raise LedgerFormatError(f"checkpoint horizon: expected an integer >= watermark - 1, got {self.horizon!r}")
        for role, end in self.ends:
            if role not in ROLES or isinstance(end, bool) or not isinstance(end, int) or end < 0:
                raise LedgerFormatError(f"checkpoint ends: {role!r} -> {end!r} is not a role -> offset >= 0")

    @property
    def key(self) -> bytes:
        return f"{self.topic}/{self.partition}/checkpoint/{self.incarnation}/{self.seq}".encode(
            "utf-8", "backslashreplace")

    @property
    def ends_map(self) -> dict[str, int]:
        return dict(self.ends)

    def encode(self) -> bytes:
        return canonical_json({"v": LEDGER_VERSION, "t": "checkpoint", "topic": self.topic, "p": self.partition,
                               "watermark": self.watermark, "horizon": self.horizon, "ends": dict(self.ends),
                               "seq": self.seq, "inc": self.incarnation,
                               **({"grp": self.group} if self.group else {})})


MIN_CHUNK_DATA_BYTES = 256
"""Smallest piece of an entry's encoding one chunk carries (an output bound too small for that is refused)."""


@dataclass(frozen=True)
class EntryChunk:
    """One piece of a ledger entry too large for one message (module docstring, "Bounded messages").

    Attributes:
        kind, topic, partition, horizon, incarnation: the entry's.
        first, last: the entry's first and last input offset (its release id, and tombstones of incomplete
            entries, need no reassembly).
        entry_id: the first 16 bytes of SHA-256 over the entry's encoding, hex (chunks of one entry; two entries
            with the same release id, e.g. written by two incarnations, never mix).
        index, count: this chunk's place (0-based) and the number of chunks.
        data: this chunk's piece of the entry's encoding.
    """

    kind: str
    topic: str
    partition: int
    first: int
    last: int
    horizon: int
    incarnation: str
    entry_id: str
    index: int
    count: int
    data: bytes

    def __post_init__(self) -> None:
        if self.kind not in ENTRY_KINDS:
            raise LedgerFormatError(f"chunk kind: expected one of {list(ENTRY_KINDS)}, got {self.kind!r}")
        for name in ("partition", "first", "last", "horizon", "index", "count"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise LedgerFormatError(f"chunk {name}: expected an integer >= 0, got {v!r}")
        if not (self.first <= self.last <= self.horizon and self.index < self.count):
            raise LedgerFormatError(f"chunk: first {self.first} <= last {self.last} <= horizon {self.horizon} and "
                                    f"index {self.index} < count {self.count} expected")

    @property
    def release_id(self) -> str:
        return release_id(self.topic, self.partition, self.first)

    @property
    def key(self) -> bytes:
        """Ledger key: unique per chunk (compaction keeps every chunk of an entry)."""
        return f"{self.release_id}/chunk/{self.entry_id}/{self.index}".encode("utf-8", "backslashreplace")

    def encode(self) -> bytes:
        return canonical_json({"v": LEDGER_VERSION, "t": "chunk", "kind": self.kind, "topic": self.topic,
                               "p": self.partition, "first": self.first, "last": self.last, "horizon": self.horizon,
                               "inc": self.incarnation, "eid": self.entry_id, "i": self.index, "n": self.count,
                               "data": base64.b64encode(self.data).decode("ascii")})

    @classmethod
    def split(cls, entry: LedgerEntry, value: bytes, max_message_bytes: int) -> list[EntryChunk]:
        """``entry`` (encoded as ``value``) in chunks whose messages each fit ``max_message_bytes``."""
        eid = hashlib.sha256(value).hexdigest()[:32]

        def chunk(i: int, n: int, data: bytes) -> EntryChunk:
            return cls(entry.kind, entry.topic, entry.partition, entry.offsets[0], entry.last_offset, entry.horizon,
                       entry.incarnation, eid, i, n, data)

        n = 2
        while True:
            probe = chunk(n - 1, n, b"")  # the largest index and count: the longest key and header
            overhead = message_size(probe.key, probe.encode())
            room = (max_message_bytes - overhead) // 4 * 3  # base64: 4 characters per 3 bytes
            if room < MIN_CHUNK_DATA_BYTES:
                raise ValueError(f"an output bound of {max_message_bytes} bytes leaves {room} bytes per ledger chunk "
                                 f"(at least {MIN_CHUNK_DATA_BYTES} needed)")
            need = -(-len(value) // room)
            if need <= n:
                return [chunk(i, need, value[i * room:(i + 1) * room]) for i in range(need)]
            n = need


def _int(d: Mapping[str, Any], name: str) -> int:
    v = d.get(name)
    if isinstance(v, bool) or not isinstance(v, int):
        raise LedgerFormatError(f"field {name!r}: expected an integer, got {v!r}")
    return v


def _str(d: Mapping[str, Any], name: str, *, nullable: bool = False) -> Any:
    v = d.get(name)
    if v is None and nullable:
        return None
    if not isinstance(v, str):
        raise LedgerFormatError(f"field {name!r}: expected text, got {type(v).__name__}")
    return v


def decode_ledger_value(value: bytes) -> LedgerEntry | Checkpoint | EntryChunk:
    """Parse a ledger message value strictly; anything else raises :class:`LedgerFormatError` (never another
    exception: recovery reports it and goes on).  A chunk of a large entry comes back as an :class:`EntryChunk`
    (reassemble with :class:`~stream_anon.service.ledger_state.ChunkAssembler`)."""
    try:
        body = json.loads(value)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise LedgerFormatError(f"not JSON: {str(e)[:200]}") from None
    try:
        if not isinstance(body, dict):
            raise LedgerFormatError("not a JSON object")
        if body.get("v") != LEDGER_VERSION:
            raise LedgerFormatError(f"version {body.get('v')!r}, expected {LEDGER_VERSION}")
        t = body.get("t")
        if t == "chunk":
            data = body.get("data")
            if not isinstance(data, str):
                raise LedgerFormatError("field 'data': expected base64 text")
            try:
                raw = base64.b64decode(data, validate=True)
            except ValueError as e:
                raise LedgerFormatError(f"field 'data': {e}") from None
            return EntryChunk(kind=_str(body, "kind"), topic=_str(body, "topic"), partition=_int(body, "p"),
                              first=_int(body, "first"), last=_int(body, "last"), horizon=_int(body, "horizon"),
                              incarnation=_str(body, "inc"), entry_id=_str(body, "eid"), index=_int(body, "i"),
                              count=_int(body, "n"), data=raw)
        if t == "checkpoint":
            ends = body.get("ends")
            if not isinstance(ends, dict):
                raise LedgerFormatError("field 'ends': expected an object")
            return Checkpoint(topic=_str(body, "topic"), partition=_int(body, "p"), watermark=_int(body, "watermark"),
                              horizon=_int(body, "horizon"), ends=tuple(sorted(ends.items())), seq=_int(body, "seq"),
                              incarnation=_str(body, "inc"), group=_str(body, "grp") if "grp" in body else "")
        offs = body.get("offsets")
        if not isinstance(offs, list):
            raise LedgerFormatError("field 'offsets': expected a list")
        ids = body.get("ids", [])
        if not isinstance(ids, list):
            raise LedgerFormatError("field 'ids': expected a list")
        outs_raw = body.get("out")
        if not isinstance(outs_raw, list):
            raise LedgerFormatError("field 'out': expected a list")
        outs = []
        for o in outs_raw:
            if not isinstance(o, dict) or o.get("role") not in ROLES:
                raise LedgerFormatError(f"output {o!r}: expected an object with a role in {list(ROLES)}")
            val = _bytes_in("value", o)
            if val is None:
                raise LedgerFormatError("output value: missing")
            ts = o.get("ts")
            if ts is not None and (isinstance(ts, bool) or not isinstance(ts, int) or ts < 0):
                raise LedgerFormatError(f"output ts: expected a Kafka timestamp in ms >= 0, got {ts!r}")
            outs.append(EncodedMessage(o["role"], _bytes_in("key", o), val, ts))
        timing: dict[str, Any] = {}
        if body.get("trig") is not None:
            timing["trigger"] = _int(body, "trig")
        for name, field_name in (("delays", "delays"), ("lat_ms", "latency_ms")):
            v = body.get(name, [])
            if not isinstance(v, list):
                raise LedgerFormatError(f"field {name!r}: expected a list")
            timing[field_name] = tuple(v)
        return LedgerEntry(kind=_str(body, "t"), topic=_str(body, "topic"), partition=_int(body, "p"),
                           offsets=tuple(offs), horizon=_int(body, "horizon"), record_ids=tuple(ids),
                           reason=_str(body, "reason", nullable=True), class_id=_str(body, "class", nullable=True),
                           outputs=tuple(outs), incarnation=_str(body, "inc"), **timing)
    except LedgerFormatError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # any other shape problem: still "corrupt"
        raise LedgerFormatError(f"malformed entry: {e!r}"[:300]) from None


@dataclass(frozen=True)
class LedgerRecord:
    """One consumed ledger message (what the Kafka layer hands the pure code)."""

    offset: int
    key: bytes | None
    value: bytes | None


# ---------------------------------------------------------------------------------------------- entry factory
@dataclass(frozen=True)
class Timing:
    """Internal per-record timing of one release (see :class:`LedgerEntry`): the releasing arrival's offset,
    the arrivals each record waited, and ingest-to-release milliseconds (None: no input timestamp)."""

    trigger: int | None
    delays: Sequence[int] = ()
    latency_ms: Sequence[int | None] = ()


def _ordered_timing(timing: Timing | None, order: Sequence[int]) -> dict[str, Any]:
    if timing is None:
        return {}
    return {"trigger": timing.trigger,
            "delays": tuple(int(timing.delays[i]) for i in order) if timing.delays else (),
            "latency_ms": tuple(timing.latency_ms[i] for i in order) if timing.latency_ms else ()}


class EntryFactory:
    """Builds the ledger entries (with their output messages) of one input partition's decisions (pure).

    One call per engine release / dead letter / control message; the pipeline sets ``horizon`` (highest input
    offset consumed).  With a ``gate``, :meth:`released_class` checks the class first and turns a refused class
    into ``suppressed`` entries with reason ``gate``.

    ``max_message_bytes`` (the output bound, None: unbounded): every output message fits it
    (:func:`~stream_anon.formats.messages.message_size`).  A suppression too large for one message becomes several
    entries (split by offset, each its own release id); a raw dead letter is cut; a class message that does not
    fit (only possible with ``release.include_record_ids``) is not published: its records are suppressed with
    reason ``oversized``.  The ledger side is bounded by chunking (:meth:`LedgerEntry.ledger_messages`).
    """

    def __init__(self, *, input_topic: str, partition: int, incarnation: str, classes: ClassEncoder,
                 secret: bytes, dlq_payload: str = "redacted", dlq_max_payload_bytes: int = 1_000_000,
                 gate: PrePublishGate | None = None, max_message_bytes: int | None = None) -> None:
        if dlq_payload not in DLQ_PAYLOAD_MODES:
            raise ValueError(f"dlq payload must be one of {list(DLQ_PAYLOAD_MODES)}, got {dlq_payload!r}")
        self.topic = input_topic
        self.partition = partition
        self.incarnation = incarnation
        self.classes = classes
        self.secret = secret
        self.dlq_payload = dlq_payload
        self.dlq_max_payload_bytes = dlq_max_payload_bytes
        self.gate = gate
        self.max_message_bytes = max_message_bytes

    def _fits(self, msg: EncodedMessage) -> bool:
        return self.max_message_bytes is None or message_size(msg.key, msg.value) <= self.max_message_bytes

    def released_class(self, *, offsets: Sequence[int], record_ids: Sequence[Any],
                       members: Sequence[Mapping[str, Any]], generalized: Mapping[str, str], size: int, loss: float,
                       horizon: int, timing: Timing | None = None) -> tuple[list[LedgerEntry], GateResult | None]:
        """A ``class`` entry promising the public class message; or, when the gate refused the class,
        ``suppressed`` entries with reason ``gate`` (and the refusing verdict); or, when the class message does not
        fit the output bound, ``suppressed`` entries with reason ``oversized``.  ``offsets``/``record_ids``/
        ``members``: same order, the members' source offsets, INPUT record ids and original records.  With a gate,
        the published ``size`` is the gate's own count of distinct individuals.  ``timing``: internal per-record
        timing (same order)."""
        verdict = None
        reference = None
        if self.gate is not None:
            verdict = self.gate.check(generalized, members, record_ids)
            if not verdict.ok:
                return self.suppressed(offsets=offsets, record_ids=record_ids, reason="gate", horizon=horizon,
                                       detail=verdict.describe(), timing=timing), verdict
            size = verdict.individuals
            reference = verdict.reference
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        msg = self.classes.encode(generalized=generalized, members=members, size=size, loss=loss,
                                  record_ids=record_ids, reference=reference)
        assert msg.key is not None
        if not self._fits(msg):
            detail = (f"the class message of {len(offsets)} records takes {len(msg.value)} bytes, over the output "
                      f"bound of {self.max_message_bytes} (release.include_record_ids lists every member)")
            return self.suppressed(offsets=offsets, record_ids=record_ids, reason="oversized", horizon=horizon,
                                   detail=detail, timing=timing), verdict
        return [LedgerEntry(KIND_CLASS, self.topic, self.partition, tuple(int(offsets[i]) for i in order),
                            horizon, record_ids=tuple(record_ids[i] for i in order), class_id=msg.key.decode("ascii"),
                            outputs=(msg,), incarnation=self.incarnation,
                            **_ordered_timing(timing, order))], verdict

    def observe(self, record: Mapping[str, Any]) -> None:
        """A record about to be pushed to the engine: the gate's running reference (t-closeness) counts it."""
        if self.gate is not None:
            self.gate.observe(record)

    def suppressed(self, *, offsets: Sequence[int], record_ids: Sequence[Any], reason: str, horizon: int,
                   detail: str | None = None, timing: Timing | None = None) -> list[LedgerEntry]:
        """The ``suppressed`` entries of these records: one, or several (split by offset, in offset order) when
        one suppressed message would not fit the output bound."""
        order = sorted(range(len(offsets)), key=offsets.__getitem__)
        pieces = [order] if self.max_message_bytes is None else self._pieces(order, offsets, record_ids, reason,
                                                                             detail)
        out: list[LedgerEntry] = []
        while pieces:
            piece = pieces.pop(0)
            offs = [int(offsets[i]) for i in piece]
            ids = [record_ids[i] for i in piece]
            msg = suppressed_message(input_topic=self.topic, partition=self.partition, offsets=offs, record_ids=ids,
                                     reason=reason, detail=detail, max_message_bytes=self.max_message_bytes)
            if len(piece) > 1 and not self._fits(msg):  # the estimate was short: halve the piece
                pieces[:0] = [piece[:len(piece) // 2], piece[len(piece) // 2:]]
                continue
            out.append(LedgerEntry(KIND_SUPPRESSED, self.topic, self.partition, tuple(offs), horizon,
                                   record_ids=tuple(ids), reason=reason, outputs=(msg,), incarnation=self.incarnation,
                                   **_ordered_timing(timing, piece)))
        return out

    def _pieces(self, order: list[int], offsets: Sequence[int], record_ids: Sequence[Any], reason: str,
                detail: str | None) -> list[list[int]]:
        """``order`` (indices in offset order) cut into runs whose suppressed messages fit the bound: each record
        costs its offset's and its id's JSON plus two commas, on top of the message without records."""
        bound = self.max_message_bytes
        assert bound is not None
        base = message_size(*_suppressed_kv(self.topic, self.partition, int(offsets[order[0]]), reason, detail))
        pieces: list[list[int]] = []
        piece: list[int] = []
        used = base
        for i in order:
            rid = record_ids[i]
            cost = len(str(int(offsets[i]))) + 2 + len(canonical_json(safe_text(rid) if isinstance(rid, str) else rid))
            if piece and used + cost > bound:
                pieces.append(piece)
                piece, used = [], base
            piece.append(i)
            used += cost
        pieces.append(piece)
        return pieces

    def dead_letter(self, *, offset: int, reason: str, field: str | None, error: str | None, value: bytes | None,
                    key: bytes | None, horizon: int) -> LedgerEntry:
        msg = dead_letter_message(input_topic=self.topic, partition=self.partition, offset=offset, reason=reason,
                                  field=field, error=error, value=value, key=key, secret=self.secret,
                                  payload=self.dlq_payload, max_payload_bytes=self.dlq_max_payload_bytes,
                                  max_message_bytes=self.max_message_bytes)
        return LedgerEntry(KIND_DLQ, self.topic, self.partition, (int(offset),), horizon, reason=reason,
                           outputs=(msg,), incarnation=self.incarnation)

    def control(self, *, offset: int, horizon: int) -> LedgerEntry:
        """An end-of-stream marker consumed at ``offset`` (accounted, nothing published)."""
        return LedgerEntry(KIND_CONTROL, self.topic, self.partition, (int(offset),), horizon,
                           incarnation=self.incarnation)


def _suppressed_kv(topic: str, partition: int, first: int, reason: str, detail: str | None) -> tuple[bytes, bytes]:
    """Key and value of a suppressed message without records (offsets and record ids empty), the release id of
    its first offset (a later piece's first offset is longer by a few digits at most: covered by the framing)."""
    rid = release_id(topic, partition, first)
    body: dict[str, Any] = {"v": LEDGER_VERSION, "release": rid, "reason": reason, "topic": safe_text(topic),
                            "partition": partition, "offsets": [], "record_ids": []}
    if detail is not None:
        body["detail"] = cut_text(safe_text(detail), DETAIL_MAX_CHARS)
    return rid.encode("utf-8", "backslashreplace"), canonical_json(body)
