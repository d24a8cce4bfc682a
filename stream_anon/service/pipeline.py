"""The service's stream logic, pure: messages in, ledger entries out (no Kafka, no clocks, no metrics imports).

One :class:`PartitionPipeline` per input partition holds that partition's engine
(``stream_anon.core.engine.Engine``), the offsets still buffered and the offsets already accounted in the
ledger before a restart.  ``process(messages)`` turns every input message into exactly one outcome, written as
a :class:`~stream_anon.service.ledger.LedgerEntry` (built by an :class:`~stream_anon.service.ledger.EntryFactory`,
which runs the pre-publish gate and builds the output message each entry promises):

* a valid record is pushed through the engine; each release becomes a ``class`` entry (promising ONE public
  class message, :mod:`stream_anon.formats.release`: atomic, so a class is never published in part) or, when
  the gate refuses the class or the engine suppresses records, a ``suppressed`` entry;
* a bad message becomes a ``dlq`` entry (the reason from :class:`~stream_anon.formats.decoding.RecordDecoder`,
  or one of :data:`PIPELINE_DLQ_REASONS`);
* an end-of-stream marker (header ``stream-anon-control: flush`` on a message WITHOUT value) flushes the engine
  and becomes a ``control`` entry, so it is accounted like every other input offset;
* an offset the ledger already accounts for (``accounted``, from recovery) is skipped.

The ledger protocol (send the entries, then their outputs; checkpoints; recovery) is the Kafka loop's job
(:mod:`stream_anon.service.outbox`, :mod:`stream_anon.service.committer`, :mod:`stream_anon.service.ledger`).

**Guard** (no message can stop a partition): decoding, the engine's push and the encoding of one message run
under a guard.  Whatever a bug still throws there dead-letters that message with reason ``internal_error`` and
the exception's last line (:func:`last_line`), and the partition moves on; a release that cannot be encoded is
suppressed with reason ``gate`` (its records are not lost, nothing is published).  A record the engine may still
hold after its push failed is dropped from any later release (it is already dead-lettered), so no offset is
accounted twice.  The failures are reported in :class:`BatchStats` (``internal_errors``) for the log and the
``stream_anon_internal_errors_total`` counter.

The commit watermark of a partition is the lowest offset still buffered (or the next offset to read when
nothing is buffered).
"""

from __future__ import annotations

import heapq
import math
import operator
import traceback
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, NamedTuple

from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.engine.release import Release
from stream_anon.core.schema import Schema
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER, DeadLetter, RecordDecoder
from stream_anon.formats.release import release_id
from stream_anon.service.ledger import KIND_CLASS, EntryFactory, LedgerEntry, Timing

REASON_INTERNAL_ERROR = "internal_error"
"""A bug threw while handling the message (decoding, engine push, encoding): the exception's last line is in the
log and, with ``dlq.payload: raw``, in the dead letter's ``error``."""
REASON_CORRUPT_RECORD = "corrupt_record"
"""The Kafka client could not read the record (e.g. a header key that is not UTF-8): only its position is known."""
REASON_OVERSIZED = "oversized"
"""The message is longer than ``service.max_message_bytes`` (the decoder's reason), or too large for the consumer to
receive at all (``kafka.receive_max_bytes``): then only its position is known."""
REASON_CONTROL_ON_RECORD = "control_header_on_record"
"""A message with a value carries the control header: a flush marker has no value, so it is not a flush."""
REASON_UNKNOWN_CONTROL = "unknown_control"
"""A message without value whose control header is not ``flush``."""
PIPELINE_DLQ_REASONS = (REASON_INTERNAL_ERROR, REASON_CORRUPT_RECORD, REASON_CONTROL_ON_RECORD,
                        REASON_UNKNOWN_CONTROL)
"""Dead-letter reasons the pipeline adds to the decoder's (``decoding.DLQ_REASONS``)."""

MAX_DEAD_HELD = 10_000
"""Offsets remembered as dead-lettered after a failed engine push (dropped from later releases); bounded."""


class InputMessage(NamedTuple):
    """One consumed input message (what the Kafka layer hands the pipeline).  ``corrupt``: the client could not
    read the record at ``offset`` (its error text; the dead-letter reason is ``unreadable_reason``); value, key and
    headers are then unknown."""

    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = ()
    timestamp_ms: int | None = None
    corrupt: str | None = None
    unreadable_reason: str = REASON_CORRUPT_RECORD  # or REASON_OVERSIZED


@dataclass
class BatchStats:
    """What one ``process``/``flush``/``expire`` call did, for metrics and logs (the caller owns both)."""

    consumed: int = 0
    released: int = 0
    suppressed: dict[str, int] = field(default_factory=dict)  # reason -> records
    skipped: int = 0
    control: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    delays: list[int] = field(default_factory=list)
    ingest_latency_seconds: list[float] = field(default_factory=list)
    class_losses: list[float] = field(default_factory=list)
    class_sizes: list[int] = field(default_factory=list)
    released_loss_sum: float = 0.0  # sum over released records of their class loss (GT numerator)
    gate_refusals: list[tuple[str, int, str]] = field(default_factory=list)  # (release id, records, what failed)
    internal_errors: list[tuple[str, int | None, str]] = field(default_factory=list)  # (stage, offset, last line)

    @property
    def suppressed_total(self) -> int:
        return sum(self.suppressed.values())


@dataclass
class BatchResult:
    entries: list[LedgerEntry]
    stats: BatchStats


def last_line(e: BaseException) -> str:
    """The exception's type and message, and where it was raised (innermost frame): ``"KeyError: 'x' (castle.py:
    412 in push)"``; one line, at most 500 characters."""
    msg = " ".join(traceback.format_exception_only(type(e), e)[-1].split())
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({PurePath(tb[-1].filename).name}:{tb[-1].lineno} in {tb[-1].name})" if tb else ""
    return (msg + where)[:500]


# ---------------------------------------------------------------------------------------------- per partition
@dataclass(frozen=True)
class PipelineSettings:
    """What the pure pipeline needs from the configuration."""

    input_topic: str
    k: int
    delta: int
    l: int | None = None  # noqa: E741
    max_message_bytes: int = 65536
    encode_in_batches: bool = True  # one engine.encode_many per run of records; False: engine.push per record
    max_delay: int | None = None  # the engine's longest delay bound in arrivals (delta, or delta_leftover if larger)

    @property
    def orphan_after(self) -> int:
        """Arrivals after which a record the engine should have released long ago is suppressed by the pipeline
        (only a broken engine leaves one): twice the engine's longest bound."""
        return 2 * max(self.delta, self.max_delay or 0)


class PartitionPipeline:
    """The main path of one input partition: decode, validate, dedupe, engine, ledger entries.

    Args:
        partition: the input partition.
        schema: record schema (QIs/sensitive set, record id field; without one the record's identity is its
            source position ``<topic>/<partition>/<offset>``).
        engine: a fresh engine (``Engine(schema, config)``) owned by this partition.
        settings: topic name and limits.
        entries: builds the ledger entries (gate, class message, suppressed message, dead letter).
        start_offset: the first offset this instance will consume.
        accounted: offsets >= start_offset the ledger already accounts for (recovery): skipped.
        horizon: the highest input offset consumed by any earlier incarnation (recovery).
    """

    def __init__(self, partition: int, schema: Schema, engine: EngineLike, settings: PipelineSettings, *,
                 entries: EntryFactory, start_offset: int, accounted: Iterable[int] = (),
                 horizon: int = -1) -> None:
        self.partition = partition
        self.schema = schema
        self.engine = engine
        self.settings = settings
        self.entries = entries
        self.decoder = RecordDecoder(schema, settings.max_message_bytes)
        self.start_offset = start_offset
        self.next_offset = start_offset
        self.horizon = max(horizon, start_offset - 1)
        self.accounted: set[int] = {o for o in accounted if o >= start_offset}
        # offset -> (record id, ingest timestamp s, arrival index in the engine)
        self._buffered: dict[int, tuple[Any, float | None, int]] = {}
        self._heap: list[int] = []
        self._arrivals = 0  # records handed to the engine (the engine's delay counts these, not offsets)
        self._dead: dict[int, None] = {}  # offsets dead-lettered after a failed push (insertion ordered)
        self._id_field = schema.record_id
        self._engine_id = schema.record_id or "id"  # the field the engine tracks records by
        self._qis = [a.name for a in schema.qis]
        self._qi_getter = operator.itemgetter(*self._qis) if len(self._qis) > 1 else (
            lambda rec: (rec[self._qis[0]],))

    # ---------------------------------------------------------------- state
    @property
    def buffered(self) -> int:
        return len(self._buffered)

    @property
    def watermark(self) -> int:
        """Offset safe to commit: the lowest offset still buffered, else the next offset to consume."""
        heap = self._heap
        while heap and heap[0] not in self._buffered:
            heapq.heappop(heap)
        return heap[0] if heap else self.next_offset

    def release_id(self, offset: int) -> str:
        return release_id(self.settings.input_topic, self.partition, offset)

    # ---------------------------------------------------------------- processing
    def process(self, messages: Sequence[InputMessage], now: float | None = None) -> BatchResult:
        """Handle consecutive messages of this partition (offsets ascending).

        Valid records are collected and pushed in runs: one vectorized QI encoding per run
        (``engine.encode_many`` + ``push_encoded``, unless ``settings.encode_in_batches`` is off), in arrival
        order; a control message ends the run before it flushes.
        """
        out: list[LedgerEntry] = []
        stats = BatchStats()
        run: list[tuple[InputMessage, dict[str, Any]]] = []
        decode, buffered, heap, accounted = self.decoder.decode, self._buffered, self._heap, self.accounted
        id_field, engine_id = self._id_field, self._engine_id
        for m in messages:
            offset = m.offset
            if offset < self.next_offset:
                continue  # already handled (duplicate delivery after a seek)
            self.next_offset = offset + 1
            if offset > self.horizon:
                self.horizon = offset
            if not m.headers and m.corrupt is None and offset not in accounted:  # the common case, in one go
                stats.consumed += 1
                try:
                    record = decode(m.value)
                    if isinstance(record, DeadLetter):
                        self._dead_letter(m, record, out, stats)
                        continue
                    rid = record[id_field] if id_field is not None else self.release_id(offset)
                    record[engine_id] = offset  # the engine tracks records by source offset (unique)
                except Exception as e:  # the guard, as below
                    self._internal_error(m, "decode", e, out, stats)
                    continue
                ts = m.timestamp_ms
                buffered[offset] = (rid, ts / 1000.0 if ts is not None else None, self._arrivals)
                self._arrivals += 1
                heapq.heappush(heap, offset)
                run.append((m, record))
                continue
            control = m.corrupt is None and _has_control(m.headers)
            # every message but a genuine end-of-stream marker is a consumed input (a control header on a record,
            # or an unknown control value, is dead-lettered and counted like any other input)
            marker = control and not m.value and _control_value(m.headers) == CONTROL_FLUSH
            if m.offset in self.accounted:
                self.accounted.discard(m.offset)
                stats.skipped += 1
                stats.consumed += not marker
                if marker and self._buffered:  # recovery: records consumed again came before a marker that
                    self._push_run(run, out, stats, now)  # flushed them: it flushes them again (no control entry:
                    run = []  # its offset is accounted), or they would wait for input that never comes
                    self._flush_marker(m, out, stats, now, accounted=True)
                continue
            if not marker:
                stats.consumed += 1
            try:
                rec = self._classify(m, control, out, stats)
                if rec is None:  # accounted already (dead letter)
                    continue
                if rec is _FLUSH:
                    self._push_run(run, out, stats, now)
                    run = []
                    self._flush_marker(m, out, stats, now)
                    continue
                assert isinstance(rec, dict)
                rid = rec[self._id_field] if self._id_field is not None else self.release_id(m.offset)
                rec[self._engine_id] = m.offset  # the engine tracks records by source offset (unique)
            except Exception as e:  # the guard: a bug on this message dead-letters it, the partition goes on
                self._internal_error(m, "decode", e, out, stats)
                continue
            self._buffered[m.offset] = (rid, m.timestamp_ms / 1000.0 if m.timestamp_ms is not None else None,
                                        self._arrivals)
            self._arrivals += 1
            heapq.heappush(self._heap, m.offset)
            run.append((m, rec))
        self._push_run(run, out, stats, now)
        self._sweep_orphans(out, stats)
        return BatchResult(out, stats)

    def _sweep_orphans(self, out: list[LedgerEntry], stats: BatchStats, *, everything: bool = False) -> None:
        """Suppress (reason ``delay_bound``) the records buffered for more than ``orphan_after`` arrivals, or all
        still buffered after the engine's flush (``everything``): a broken engine lost them (e.g. it failed after
        taking their release out of its state).  A correct engine never holds a record that long and holds
        nothing after a flush; if one still releases it later, the release drops it (never accounted twice).
        Arrivals are records handed to the engine, as the engine counts them: dead letters and control messages
        between them are not arrivals (a stream with many dead letters must not make a held record look old).
        Buffered offsets are pushed in arrival order, so the offset heap is in arrival order too."""
        heap, buffered = self._heap, self._buffered
        limit = self._arrivals if everything else self._arrivals - self.settings.orphan_after
        offsets: list[int] = []
        while heap:
            held = buffered.get(heap[0])
            if held is not None and held[2] >= limit:
                break
            off = heapq.heappop(heap)
            if held is not None:
                offsets.append(off)
        if not offsets:
            return
        rids = [buffered.pop(o)[0] for o in offsets]
        out.extend(self.entries.suppressed(offsets=offsets, record_ids=rids, reason="delay_bound",
                                           horizon=self.horizon, detail="the engine did not release it"))
        stats.suppressed["delay_bound"] = stats.suppressed.get("delay_bound", 0) + len(offsets)
        what = "still buffered after the engine's flush" if everything else \
            f"buffered for more than {self.settings.orphan_after} arrivals"
        stats.internal_errors.append(("sweep", offsets[0], f"{len(offsets)} record(s) {what}: suppressed"))

    def _classify(self, m: InputMessage, control: bool, out: list[LedgerEntry],
                  stats: BatchStats) -> dict[str, Any] | object | None:
        """The record of ``m``, or :data:`_FLUSH` for an end-of-stream marker, or None when ``m`` was
        dead-lettered (the entry is in ``out``)."""
        if m.corrupt is not None:
            self._dead_letter(m, DeadLetter(m.unreadable_reason, m.corrupt), out, stats)
            return None
        if control:
            value = _control_value(m.headers)
            if m.value:
                self._dead_letter(m, DeadLetter(REASON_CONTROL_ON_RECORD, f"a message of {len(m.value)} bytes "
                                                f"carries the control header {CONTROL_HEADER!r}: an end-of-stream "
                                                f"marker has no value; not flushed"), out, stats)
                return None
            if value != CONTROL_FLUSH:
                self._dead_letter(m, DeadLetter(REASON_UNKNOWN_CONTROL, f"control header {CONTROL_HEADER!r} = "
                                                f"{value!r}; the only control is {CONTROL_FLUSH!r}"), out, stats)
                return None
            return _FLUSH
        rec = self.decoder.decode(m.value)
        if isinstance(rec, DeadLetter):
            self._dead_letter(m, rec, out, stats)
            return None
        return rec

    def _flush_marker(self, m: InputMessage, out: list[LedgerEntry], stats: BatchStats, now: float | None, *,
                      accounted: bool = False) -> None:
        """An end-of-stream marker: flush the engine, then the marker's ``control`` entry (none when ``accounted``:
        a marker an earlier incarnation accounted for, met again by a recovery that consumes records before it
        again; their entries were lost, e.g. a message the broker acknowledged without storing it)."""
        try:
            releases = self.engine.flush(now)
        except Exception as e:  # the engine keeps what it holds (released later by the delay bound)
            self._internal_error(m, "flush", e, out, stats)
            return
        self._emit(releases, m.offset, out, stats, now)
        self._sweep_orphans(out, stats, everything=True)
        if accounted:
            return
        stats.control += 1
        out.append(self.entries.control(offset=m.offset, horizon=self.horizon))

    def _push_run(self, run: Sequence[tuple[InputMessage, dict[str, Any]]], out: list[LedgerEntry],
                  stats: BatchStats, now: float | None) -> None:
        if not run:
            return
        rows = None
        engine = self.engine
        if self.settings.encode_in_batches and len(run) > 1:
            try:
                getter = self._qi_getter
                cols = zip(*[getter(rec) for _, rec in run], strict=True)
                rows = engine.encode_many(dict(zip(self._qis, cols, strict=True)))
            except Exception:  # fall back to one push per record: the record the engine refuses is dead-lettered
                rows = None
        push, push_encoded = engine.push, engine.push_encoded
        observe = self.entries.observe
        for i, (m, rec) in enumerate(run):
            try:
                observe(rec)  # the gate's own running reference (t-closeness) sees what the engine sees
                releases = push(rec, now) if rows is None else push_encoded(rec, rows[i], now)
            except Exception as e:  # the engine refused or failed on the record: account for it, go on
                del self._buffered[m.offset]
                self._hold_dead(m.offset)
                self._internal_error(m, "engine", e, out, stats)
                continue
            if releases:
                self._emit(releases, m.offset, out, stats, now)

    def flush(self, now: float | None = None) -> BatchResult:
        """Release or suppress everything buffered (idle flush)."""
        out: list[LedgerEntry] = []
        stats = BatchStats()
        try:
            releases = self.engine.flush(now)
        except Exception as e:
            stats.internal_errors.append(("flush", None, last_line(e)))
            return BatchResult(out, stats)
        self._emit(releases, self.next_offset - 1, out, stats, now)
        self._sweep_orphans(out, stats, everything=True)
        return BatchResult(out, stats)

    def expire(self, now: float) -> BatchResult:
        """Apply the engine's wall-clock bound (``max_delay_seconds``) without an arrival."""
        out: list[LedgerEntry] = []
        stats = BatchStats()
        if self._buffered:
            try:
                releases = self.engine.expire(now)
            except Exception as e:
                stats.internal_errors.append(("expire", None, last_line(e)))
                return BatchResult(out, stats)
            self._emit(releases, self.next_offset - 1, out, stats, now)
        return BatchResult(out, stats)

    # ---------------------------------------------------------------- entries
    def _emit(self, releases: Sequence[Release], trigger: int, out: list[LedgerEntry], stats: BatchStats,
              now: float | None) -> None:
        for r in releases:
            try:
                self._emit_one(r, trigger, out, stats, now)
            except Exception as e:  # the release's records are suppressed (nothing published, nothing lost)
                self._unencodable(r, trigger, e, out, stats)

    def _emit_one(self, r: Release, trigger: int, out: list[LedgerEntry], stats: BatchStats,
                  now: float | None) -> None:
        buffered, dead = self._buffered, self._dead
        ids = r.record_ids
        helds = [buffered.get(off) for off in ids]
        if not dead and None not in helds:  # the common case: every record is held, none was dead-lettered
            offsets = [int(off) for off in ids]
            rids = [h[0] for h in helds]  # type: ignore[index]
            members = list(r.records)
            delays = [int(d) for d in r.delays]
            lat_ms: list[int | None] = [None] * len(offsets) if now is None else [
                None if h[1] is None else int((now - h[1] if now > h[1] else 0.0) * 1000.0 + 0.5)  # type: ignore[index]
                for h in helds]
        else:
            offsets, rids, members, delays, lat_ms = self._members(r, now, stats)
        if offsets:
            timing = Timing(trigger, delays, lat_ms if any(v is not None for v in lat_ms) else ())
            out.extend(self._entries(r, offsets, rids, members, timing, stats))
            stats.delays.extend(delays)
            stats.ingest_latency_seconds.extend(v / 1000.0 for v in lat_ms if v is not None)
        for off in ids:  # the entry is built: now the records leave the buffer
            off = int(off)
            if off in dead:
                del dead[off]
            else:
                buffered.pop(off, None)

    def _members(self, r: Release, now: float | None, stats: BatchStats
                 ) -> tuple[list[int], list[Any], list[Any], list[int], list[int | None]]:
        """The records of ``r`` to account for in its entry: not dead-lettered, held (an engine that releases a
        record it does not hold is an internal error: never account an offset twice)."""
        buffered, dead = self._buffered, self._dead
        offsets: list[int] = []
        rids: list[Any] = []
        members: list[Any] = []
        lat_ms: list[int | None] = []
        delays: list[int] = []
        for off, d, rec in zip(r.record_ids, r.delays, r.records, strict=True):
            off = int(off)
            if off in dead:  # dead-lettered when its push failed: accounted there
                continue
            held = buffered.get(off)
            if held is None:  # not buffered: released before (an engine bug); never account an offset twice
                stats.internal_errors.append(("release", off, "the engine released a record it does not hold"))
                continue
            rid, ts, _ = held
            offsets.append(off)
            rids.append(rid)
            members.append(rec)
            delays.append(int(d))
            if ts is not None and now is not None:
                lat_ms.append(int((now - ts if now > ts else 0.0) * 1000.0 + 0.5))
            else:
                lat_ms.append(None)
        return offsets, rids, members, delays, lat_ms

    def _entries(self, r: Release, offsets: list[int], rids: list[Any], members: list[Any], timing: Timing,
                 stats: BatchStats) -> list[LedgerEntry]:
        if r.kind == "class":
            entries, verdict = self.entries.released_class(
                offsets=offsets, record_ids=rids, members=members, generalized=r.generalized, size=int(r.size),
                loss=float(r.loss), horizon=self.horizon, timing=timing)
            if verdict is not None and not verdict.ok:
                stats.gate_refusals.append((entries[0].release_id, len(offsets), verdict.describe()))
                stats.suppressed["gate"] = stats.suppressed.get("gate", 0) + len(offsets)
            elif entries[0].kind != KIND_CLASS:  # its class message would not fit the output bound
                stats.suppressed["oversized"] = stats.suppressed.get("oversized", 0) + len(offsets)
            else:
                loss = float(r.loss)
                stats.released += len(offsets)
                stats.class_losses.append(loss)
                stats.class_sizes.append(len(offsets))
                stats.released_loss_sum += (loss if math.isfinite(loss) else 1.0) * len(offsets)
            return entries
        reason = "leftover" if r.leftover else "delay_bound"
        stats.suppressed[reason] = stats.suppressed.get(reason, 0) + len(offsets)
        return self.entries.suppressed(offsets=offsets, record_ids=rids, reason=reason, horizon=self.horizon,
                                       timing=timing)

    def _unencodable(self, r: Release, trigger: int, e: Exception, out: list[LedgerEntry],
                     stats: BatchStats) -> None:
        """A release whose entry could not be built: its records (those not yet accounted) are suppressed with
        reason ``gate`` and the exception as detail."""
        offsets, rids = [], []
        for off in r.record_ids:
            try:
                off = int(off)
            except (TypeError, ValueError):
                continue
            if off in self._dead:
                del self._dead[off]
                continue
            if off in self._buffered:
                offsets.append(off)
                rids.append(self._buffered.pop(off)[0])
        line = last_line(e)
        stats.internal_errors.append(("encode", min(offsets) if offsets else trigger, line))
        if offsets:
            out.extend(self.entries.suppressed(offsets=offsets, record_ids=rids, reason="gate",
                                               horizon=self.horizon, detail=f"internal error: {line}"))
            stats.suppressed["gate"] = stats.suppressed.get("gate", 0) + len(offsets)

    def _dead_letter(self, m: InputMessage, dl: DeadLetter, out: list[LedgerEntry], stats: BatchStats) -> None:
        out.append(self.entries.dead_letter(offset=m.offset, reason=dl.reason, field=dl.field, error=dl.error,
                                            value=m.value, key=m.key, horizon=self.horizon))
        stats.dead_letters[dl.reason] = stats.dead_letters.get(dl.reason, 0) + 1

    def _internal_error(self, m: InputMessage, stage: str, e: Exception, out: list[LedgerEntry],
                        stats: BatchStats) -> None:
        line = last_line(e)
        stats.internal_errors.append((stage, m.offset, line))
        self._dead_letter(m, DeadLetter(REASON_INTERNAL_ERROR, f"{stage}: {line}"), out, stats)

    def _hold_dead(self, offset: int) -> None:
        dead = self._dead
        dead[offset] = None
        if len(dead) > MAX_DEAD_HELD:
            del dead[next(iter(dead))]


_FLUSH = object()
"""Marker: the message is an end-of-stream flush."""


def _has_control(headers: Sequence[tuple[str, bytes | None]]) -> bool:
    return bool(headers) and any(k == CONTROL_HEADER for k, _ in headers)


def _control_value(headers: Sequence[tuple[str, bytes | None]]) -> bytes | None:
    for k, v in headers:
        if k == CONTROL_HEADER:
            return v
    return None

