"""The side paths' write-ahead (pure: no Kafka client): a record's copies reach every enabled side topic or none,
across a stop while the broker stalls, a ``kill -9`` and a restart (issue 18 item 4).

Without it, a stop could leave a window's copies on some side topics and not others: what the producer had not yet
written into a frozen broker's socket was purged at the stop, per topic partition.  Now every message the side
paths send to a public side topic (a released mixing window's copies, a batch's estimates and k-means releases)
goes through :meth:`SideOutbox.publish`:

1. **everything sent before is acknowledged** (``flush``), so the end offset of every side partition is known
   exactly (:attr:`SideOutbox.ends`: what this member last saw acknowledged there, read at start for the others);
2. the **entry** (its messages' exact bytes, grouped per topic, partition and Kafka timestamp, with headers, and the
   end offset of each side partition it writes) goes to the internal compacted outbox topic, in chunks under the
   output bound (:meth:`OutboxEntry.chunks`), and is **acknowledged** before anything else happens;
3. its messages go to the public side topics;
4. once they are all acknowledged (the next ``flush``, :meth:`SideOutbox.settle`) the entry's chunks are
   tombstoned.

At the next start, before anything is consumed, :meth:`SideOutbox.recover` reads the outbox: an entry with a chunk
missing was never acknowledged, so none of its messages was sent: its chunks are tombstoned.  For every whole entry
not tombstoned it reads each side partition the entry writes from the recorded end offset and finds which of the
entry's messages are there (byte equality of key and value, each message found claimed once, the lowest offset
first), sends only the missing ones (the same bytes, headers and timestamp: nothing is perturbed again and no eps
is spent), waits for their acknowledgement and tombstones the entry.

Why this is exact: step 1 means that when an entry is written every message sent before it is stored, so on each
side partition the messages at or after the recorded end are this entry's, those of later entries (only once all of
this entry's were acknowledged) and re-sends of a recovery; the lowest-offset-first claim therefore finds exactly
the entry's own messages (identical copies, possible without pseudonyms, are interchangeable).  A message is never
sent twice, except when a stale connection of the dead process still delivers after the recovery read the side
partitions (a broker frozen with its requests in the socket, thawed after the new process started): that window is
the main path's too (docs/side-paths.md).

The budgets the messages spent are persisted (and acknowledged) before step 2 (:mod:`stream_anon.side.app`), so the
order "budget before any copy leaves" holds; the outbox only ever re-sends what was perturbed and budgeted once.

Chunk format (value): ``SAO1`` + 4-byte big-endian header length + the JSON header (entry id, chunk index and
count, the ends, the group slices it holds) + per message a 4-byte signed key length (-1: no key), the key, a 4-byte
value length and the value.  Key: ``<input>/<entry id>/<chunk>``.
"""

from __future__ import annotations

import json
import logging
import secrets
import struct
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from stream_anon.formats.messages import MESSAGE_FRAMING_BYTES, OutputMessage, Receipt

log = logging.getLogger(__name__)

KIND = "side-outbox"
MAGIC = b"SAO1"
Where = tuple[str, int]
"""(topic, partition) of a public side partition."""
Headers = tuple[tuple[str, bytes], ...]
RawRecord = tuple[int, bytes | None, bytes | None]
"""(offset, key, value)."""

_LEN = struct.Struct(">I")
_KEYLEN = struct.Struct(">i")


class OutboxFormatError(ValueError):
    """A message of the outbox topic that is not an outbox chunk (the reason names what is wrong)."""


@dataclass(frozen=True)
class CopyGroup:
    """Messages to one side ``topic`` ``partition`` (the partition itself, not an input partition) with one Kafka
    timestamp and the same headers: one topic's copies of a released window, or a batch's estimates."""

    topic: str
    partition: int
    timestamp_ms: int
    headers: Headers
    keys: tuple[bytes | None, ...]
    values: tuple[bytes, ...]

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class OutboxEntry:
    """One write-ahead: ``groups`` and, for each side partition they write, its end offset when the entry was
    written (None: unknown, read from the partition's beginning)."""

    entry_id: str
    ends: Mapping[Where, int | None]
    groups: tuple[CopyGroup, ...]

    @property
    def n_messages(self) -> int:
        return sum(len(g) for g in self.groups)

    def chunks(self, input_topic: str, bound: int) -> list[tuple[bytes, bytes]]:
        """(key, value) of the entry's chunks, each message of key + value + framing at most ``bound`` bytes
        (a single message too large for that goes alone in its chunk)."""
        ends = [[t, p, e] for (t, p), e in sorted(self.ends.items())]
        descr = [[i, g.topic, g.partition, g.timestamp_ms, [[k, v.decode("latin-1")] for k, v in g.headers]]
                 for i, g in enumerate(self.groups)]
        key_len = len(input_topic) + len(self.entry_id) + 24
        reserve = len(json.dumps({"entry": self.entry_id, "chunk": 0, "of": 0, "ends": ends, "groups": descr})) + \
            64 + 16 * len(descr)
        budget = max(1, bound - MESSAGE_FRAMING_BYTES - key_len - reserve - len(MAGIC) - _LEN.size)
        bodies: list[tuple[list[tuple[int, int]], list[bytes]]] = []
        slices: list[tuple[int, int]] = []
        parts: list[bytes] = []
        size = 0
        for gi, g in enumerate(self.groups):
            count = 0
            for k, v in zip(g.keys, g.values, strict=True):
                n = 2 * _LEN.size + len(k or b"") + len(v)
                if size and size + n > budget:
                    if count:
                        slices.append((gi, count))
                    bodies.append((slices, parts))
                    slices, parts, size, count = [], [], 0, 0
                parts.append(_KEYLEN.pack(-1 if k is None else len(k)) + (k or b"") + _LEN.pack(len(v)) + v)
                size += n
                count += 1
            if count:
                slices.append((gi, count))
        if parts or not bodies:
            bodies.append((slices, parts))
        out = []
        for i, (sl, body) in enumerate(bodies):
            header = json.dumps({"entry": self.entry_id, "chunk": i, "of": len(bodies), "ends": ends,
                                 "groups": [descr[gi] + [count] for gi, count in sl]},
                                separators=(",", ":")).encode()
            out.append((f"{input_topic}/{self.entry_id}/{i}".encode(),
                        MAGIC + _LEN.pack(len(header)) + header + b"".join(body)))
        return out


@dataclass(frozen=True)
class EntryChunk:
    """One decoded chunk: its entry, index and count, the ends, and its group slices
    (group index, topic, partition, timestamp, headers, keys, values)."""

    entry_id: str
    index: int
    count: int
    ends: Mapping[Where, int | None]
    slices: tuple[tuple[int, str, int, int, Headers, list[bytes | None], list[bytes]], ...]


def decode_chunk(value: bytes) -> EntryChunk:
    """The chunk in ``value`` (:class:`OutboxFormatError` if it is not one)."""
    if not value.startswith(MAGIC) or len(value) < len(MAGIC) + _LEN.size:
        raise OutboxFormatError("not an outbox chunk (no SAO1 header)")
    pos = len(MAGIC)
    (hlen,) = _LEN.unpack_from(value, pos)
    pos += _LEN.size
    try:
        h = json.loads(value[pos:pos + hlen])
        pos += hlen
        ends = {(str(t), int(p)): (None if e is None else int(e)) for t, p, e in h["ends"]}
        slices = []
        for gi, topic, partition, ts, headers, count in h["groups"]:
            keys: list[bytes | None] = []
            values: list[bytes] = []
            for _ in range(int(count)):
                (klen,) = _KEYLEN.unpack_from(value, pos)
                pos += _KEYLEN.size
                if klen >= 0:
                    keys.append(value[pos:pos + klen])
                    pos += klen
                else:
                    keys.append(None)
                (vlen,) = _LEN.unpack_from(value, pos)
                pos += _LEN.size
                values.append(value[pos:pos + vlen])
                pos += vlen
            slices.append((int(gi), str(topic), int(partition), int(ts),
                           tuple((str(k), str(v).encode("latin-1")) for k, v in headers), keys, values))
        chunk = EntryChunk(str(h["entry"]), int(h["chunk"]), int(h["of"]), ends, tuple(slices))
    except (ValueError, KeyError, TypeError, struct.error) as e:
        raise OutboxFormatError(f"unreadable outbox chunk: {e!r}") from e
    if pos != len(value):
        raise OutboxFormatError(f"outbox chunk of {len(value)} bytes holds {len(value) - pos} bytes after its messages")
    if not 0 <= chunk.index < chunk.count:
        raise OutboxFormatError(f"outbox chunk {chunk.index} of {chunk.count}")
    return chunk


@dataclass
class PendingEntries:
    """What the outbox holds, as read at start (:func:`pending_entries`): the whole entries not tombstoned, in
    write order, the keys of each, and the keys of chunks that belong to no whole entry (never acknowledged:
    nothing of theirs was sent) or could not be read."""

    entries: list[OutboxEntry] = field(default_factory=list)
    keys: dict[str, list[bytes]] = field(default_factory=dict)  # entry id -> its chunks' keys
    stray: list[bytes] = field(default_factory=list)
    unreadable: int = 0


@dataclass
class _Assembling:
    topic: str
    partition: int
    timestamp_ms: int
    headers: Headers
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes] = field(default_factory=list)


def pending_entries(records: Iterable[RawRecord]) -> PendingEntries:
    """Assemble the entries of the outbox partition's ``records`` (offset order; the latest value of a key wins, a
    tombstone drops it, as compaction would)."""
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in records:
        if key is not None:
            latest[key] = (offset, value)
    out = PendingEntries()
    chunks: dict[str, dict[int, tuple[int, bytes, EntryChunk]]] = {}
    for key, (offset, value) in sorted(latest.items(), key=lambda kv: kv[1][0]):
        if value is None:
            continue
        try:
            c = decode_chunk(value)
        except OutboxFormatError as e:
            log.warning("side paths: outbox record %r at offset %d skipped: %s", key[:200], offset, e)
            out.unreadable += 1
            out.stray.append(key)
            continue
        chunks.setdefault(c.entry_id, {})[c.index] = (offset, key, c)
    for entry_id, got in sorted(chunks.items(), key=lambda kv: min(o for o, _, _ in kv[1].values())):
        count = next(iter(got.values()))[2].count
        if set(got) != set(range(count)):
            out.stray.extend(k for _, k, _ in got.values())
            continue
        groups: dict[int, _Assembling] = {}
        ends: dict[Where, int | None] = {}
        for i in range(count):
            _, _, c = got[i]
            ends.update(c.ends)
            for gi, topic, partition, ts, headers, keys, values in c.slices:
                g = groups.setdefault(gi, _Assembling(topic, partition, ts, headers))
                g.keys.extend(keys)
                g.values.extend(values)
        out.entries.append(OutboxEntry(entry_id, ends, tuple(
            CopyGroup(g.topic, g.partition, g.timestamp_ms, g.headers, tuple(g.keys), tuple(g.values))
            for g in (groups[gi] for gi in sorted(groups)))))
        out.keys[entry_id] = [got[i][1] for i in range(count)]
    return out


def missing_messages(entries: Sequence[OutboxEntry],
                     found: Mapping[Where, Sequence[RawRecord]]) -> list[list[CopyGroup]]:
    """For each entry (in write order), its messages not found in ``found`` (each side partition's records from the
    smallest recorded end on), grouped as the entry groups them: a record found at or after the entry's recorded
    end with the same key and value is that message (each record claimed once, the lowest offset first)."""
    index: dict[Where, dict[tuple[bytes | None, bytes | None], list[int]]] = {}
    for where, recs in found.items():
        by_bytes = index.setdefault(where, {})
        for offset, key, value in recs:
            by_bytes.setdefault((key, value), []).append(offset)
    for by_bytes in index.values():
        for offsets in by_bytes.values():
            offsets.sort()
    out = []
    for e in entries:
        missing = []
        for g in e.groups:
            where = (g.topic, g.partition)
            end = e.ends.get(where)
            lo = -1 if end is None else end
            by_bytes = index.get(where, {})
            keys: list[bytes | None] = []
            values: list[bytes] = []
            for k, v in zip(g.keys, g.values, strict=True):
                at = by_bytes.get((k, v))
                i = -1 if at is None else bisect_left(at, lo)
                if at is not None and i < len(at):
                    at.pop(i)  # claimed by this message
                else:
                    keys.append(k)
                    values.append(v)
            if values:
                missing.append(CopyGroup(g.topic, g.partition, g.timestamp_ms, g.headers, tuple(keys), tuple(values)))
        out.append(missing)
    return out


# ---------------------------------------------------------------------------------------------- the protocol
class Sender(Protocol):
    """The producer calls the outbox needs (:class:`~stream_anon.kafka_io.producer.OutputProducer`)."""

    def send(self, messages: Iterable[OutputMessage]) -> Receipt: ...

    def send_values(self, topic: str, src_partition: int, keys: list[bytes | None], values: list[bytes],
                    headers: list[tuple[str, bytes]], *, timestamp_ms: int | None = None) -> Receipt: ...

    def flush(self) -> int: ...


class Reading(Protocol):
    """The partition reads of a recovery (:class:`~stream_anon.kafka_io.reader.PartitionReader`)."""

    def read_forward_records(self, topic: str, partition: int, start: int | None,
                             chunk: int) -> tuple[list[RawRecord], int]: ...


@dataclass
class RecoveryReport:
    """What :meth:`SideOutbox.recover` found and did."""

    entries: int = 0  # whole entries not tombstoned (their messages may all be there: a tombstone not acknowledged)
    messages: int = 0  # messages those entries hold
    found: int = 0  # of them already on their side partition
    resent: int = 0  # sent again (the same bytes)
    dropped: int = 0  # chunks of entries never acknowledged (nothing of theirs was sent) or unreadable
    seconds: float = 0.0

    def line(self) -> str:
        return (f"{self.entries} write-ahead entries pending from the last run: {self.messages} messages, "
                f"{self.found} found on their side topics, {self.resent} sent again; {self.dropped} chunk(s) of "
                f"entries never acknowledged tombstoned ({self.seconds:.2f} s)")


@dataclass
class _Sent:
    entry: OutboxEntry
    keys: list[bytes]
    receipts: list[Receipt]
    first_offset: int  # of its first chunk in the outbox partition


class SideOutbox:
    """Steps 1-4 and the recovery of the module docstring for the outbox ``topic`` of ``input_topic``; ``bound``: the
    output bound (chunks stay under it); ``run_id``: names this run's entries (default: time and random bits)."""

    def __init__(self, topic: str, input_topic: str, *, bound: int, run_id: str | None = None) -> None:
        self.topic = topic
        self.input_topic = input_topic
        self.bound = bound
        self.run_id = run_id or f"{int(time.time() * 1000):013d}-{secrets.token_hex(3)}"
        self.ends: dict[Where, int] = {}  # side partition -> end offset as last seen acknowledged
        self._seq = 0
        self._sent: list[_Sent] = []  # entries whose messages were sent, not known to be acknowledged
        self.acked_end: int | None = None  # the outbox partition's end as last seen acknowledged
        self.entries_written = 0
        self.write_seconds = 0.0  # time spent in steps 1-2 (the latency the write-ahead adds)

    def _message(self, key: bytes, value: bytes | None) -> OutputMessage:
        return OutputMessage(KIND, self.topic, 0, key, value)

    def publish(self, producer: Sender, groups: Sequence[CopyGroup]) -> OutboxEntry | None:
        """Steps 1-3 for ``groups``: returns the entry (None: nothing to send).  Raises what the producer raises
        (a stop while the broker stalls): then nothing of the entry was sent unless its write-ahead was
        acknowledged, and the next start completes it."""
        groups = [g for g in groups if len(g)]
        if not groups:
            return None
        t0 = time.monotonic()
        producer.flush()  # step 1: every message sent before is acknowledged, so the ends are exact
        self.settle(producer)
        self._seq += 1
        entry = OutboxEntry(f"{self.run_id}/{self._seq}",
                            {(g.topic, g.partition): self.ends.get((g.topic, g.partition)) for g in groups},
                            tuple(groups))
        chunks = entry.chunks(self.input_topic, self.bound)
        written = producer.send([self._message(k, v) for k, v in chunks])
        producer.flush()  # step 2: the write-ahead is acknowledged before any of its messages leaves
        self.write_seconds += time.monotonic() - t0
        self.entries_written += 1
        offsets = [d.offset for d in written.deliveries()]
        self.acked_end = max(self.acked_end or 0, max(offsets) + 1)
        receipts = [producer.send_values(g.topic, g.partition, list(g.keys), list(g.values), list(g.headers),
                                         timestamp_ms=g.timestamp_ms) for g in groups]  # step 3
        self._sent.append(_Sent(entry, [k for k, _ in chunks], receipts, min(offsets)))
        return entry

    @property
    def read_mark(self) -> int | None:
        """The outbox offset below which every entry is settled (a start may read from there; None: unknown)."""
        if self._sent:
            return min(s.first_offset for s in self._sent)
        return self.acked_end

    def settle(self, producer: Sender) -> int:
        """Step 4 after a flush: the entries whose messages are all acknowledged move the ends and are tombstoned
        (sent, acknowledged at a later flush; one lost is harmless: the recovery finds its messages).  Returns how
        many entries were settled."""
        done = [s for s in self._sent if all(r.acknowledged for r in s.receipts)]
        if not done:
            return 0
        self._sent = [s for s in self._sent if not all(r.acknowledged for r in s.receipts)]
        for s in done:
            for r in s.receipts:
                for d in r.deliveries():
                    where = (d.topic, d.partition)
                    self.ends[where] = max(self.ends.get(where, 0), d.offset + 1)
        producer.send([self._message(k, None) for s in done for k in s.keys])
        return len(done)

    @property
    def unsettled(self) -> int:
        """Entries whose messages were sent and are not known to be acknowledged."""
        return len(self._sent)

    def recover(self, records: Iterable[RawRecord], reader: Reading, producer: Sender, *,
                chunk: int = 5000) -> RecoveryReport:
        """The recovery (module docstring) from the outbox partition's ``records`` (offset order): completes every
        pending entry, tombstones it, and waits for all of it.  Call before anything new is published."""
        t0 = time.monotonic()
        pending = pending_entries(records)
        rep = RecoveryReport(entries=len(pending.entries), dropped=len(pending.stray),
                             messages=sum(e.n_messages for e in pending.entries))
        starts: dict[Where, int | None] = {}
        for e in pending.entries:
            for g in e.groups:
                where = (g.topic, g.partition)
                end = e.ends.get(where)
                if where not in starts:
                    starts[where] = end
                else:
                    prev = starts[where]
                    starts[where] = None if prev is None or end is None else min(prev, end)
        found: dict[Where, list[RawRecord]] = {}
        for (topic, partition), start in sorted(starts.items(), key=lambda kv: kv[0]):
            found[(topic, partition)] = reader.read_forward_records(topic, partition, start, chunk)[0]
        missing = missing_messages(pending.entries, found)
        for groups in missing:
            for g in groups:
                producer.send_values(g.topic, g.partition, list(g.keys), list(g.values), list(g.headers),
                                     timestamp_ms=g.timestamp_ms)
                rep.resent += len(g)
        rep.found = rep.messages - rep.resent
        if rep.resent:
            producer.flush()  # every entry's messages are there now
        keys = [k for e in pending.entries for k in pending.keys[e.entry_id]] + pending.stray
        if keys:
            producer.send([self._message(k, None) for k in keys])
            producer.flush()
        rep.seconds = time.monotonic() - t0
        return rep
