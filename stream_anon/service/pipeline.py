"""The service's stream logic, pure: messages in, messages out (no Kafka, no clocks, no metrics imports).

One :class:`PartitionPipeline` per input partition holds that partition's engine
(``stream_anon.core.engine.Engine``), the offsets still buffered and the set of offsets already released
before a restart.  ``process(messages)`` decodes and validates each input message, sends bad ones to
the dead-letter topic (reason + original bytes), skips the ones already released, pushes the rest
through the engine and turns releases into output messages:

* ``anon``: ONE message per released equivalence class (atomic: a crash can never publish part of a
  class, which could leave a class below k on the topic), JSON with the generalized QIs, the class's
  k/l/delta/loss/size and one entry per record (record id, source offset, sensitive value, delay);
* ``suppressed``: one message per suppression (record ids and source offsets, no QI values);
* ``dlq``: value = the original bytes, reason and source position in headers.

Every output message names its source partition and carries the partition's *horizon* (the highest
input offset any incarnation of the service had consumed when the message was sent).  Recovery reads the
output topics backwards until it meets a message of the partition whose horizon is below the restart
offset: everything before it only holds records below the restart offset (:class:`ReadBackScan`).
Release ids are deterministic: ``<input topic>/<partition>/<offset>`` of each source record.

The commit watermark of a partition is the lowest offset still buffered (or the next offset to read when
nothing is buffered): committing it after the producer acknowledged every output loses nothing.
"""

from __future__ import annotations

import heapq
import json
import math
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stream_anon.core.engine.protocol import EngineLike
from stream_anon.core.engine.release import Release
from stream_anon.core.schema import Schema
from stream_anon.service.decoding import CONTROL_FLUSH, CONTROL_HEADER, DeadLetter, RecordDecoder

# header names on output messages
H_SRC_TOPIC = "src.topic"
H_SRC_PARTITION = "src.partition"
H_SRC_OFFSET = "src.offset"
H_HORIZON = "src.horizon"
H_KIND = "kind"
H_REASON = "dlq.reason"
H_ERROR = "dlq.error"
H_FIELD = "dlq.field"
H_TRUNCATED = "dlq.original-length"


@dataclass(frozen=True)
class InputMessage:
    """One consumed input message (what the Kafka layer hands the pipeline)."""

    offset: int
    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[str, bytes]] = ()
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class OutputMessage:
    """One message to produce; ``kind`` is ``anon`` | ``suppressed`` | ``dlq`` (the topic role)."""

    kind: str
    topic: str
    src_partition: int
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class BatchStats:
    """What one ``process``/``flush`` call did, for metrics (the caller owns the metrics)."""

    consumed: int = 0
    released: int = 0
    suppressed: int = 0
    skipped: int = 0
    control: int = 0
    dead_letters: dict[str, int] = field(default_factory=dict)
    delays: list[int] = field(default_factory=list)
    ingest_latency_seconds: list[float] = field(default_factory=list)
    class_losses: list[float] = field(default_factory=list)
    class_sizes: list[int] = field(default_factory=list)
    released_loss_sum: float = 0.0  # sum over released records of their class loss (GT numerator)
    engine_seconds: float = 0.0


@dataclass
class BatchResult:
    outputs: list[OutputMessage]
    stats: BatchStats


# ---------------------------------------------------------------------------------------------- recovery
@dataclass
class ReadBackScan:
    """Collects, from output messages read *backwards* in chunks, the offsets of one input partition that
    are already released at or above ``threshold`` (the first offset the new owner will consume).

    Feed each output topic separately: ``add_chunk(chunk)`` with chunks in backward order (each chunk in
    forward order) and stop once it returns True (a message of this partition with horizon < threshold
    was seen: everything before it holds only offsets < threshold) or the topic's beginning is reached.
    """

    src_topic: str
    src_partition: int
    threshold: int
    released: set[int] = field(default_factory=set)
    horizon: int = -1
    messages_read: int = 0

    def add_chunk(self, chunk: Sequence[tuple[bytes | None, Sequence[tuple[str, bytes]]]]) -> bool:
        """``chunk``: (value, headers) of consecutive output messages.  Returns True when done."""
        done = False
        for value, headers in chunk:
            self.messages_read += 1
            h = dict(headers)
            try:
                if h.get(H_SRC_TOPIC, b"").decode() != self.src_topic or \
                        int(h.get(H_SRC_PARTITION, b"-1")) != self.src_partition:
                    continue
                horizon = int(h[H_HORIZON])
            except (KeyError, ValueError, UnicodeDecodeError):
                continue  # not written by this service
            self.horizon = max(self.horizon, horizon)
            if horizon < self.threshold:
                done = True
                continue
            for off in output_offsets(value, h):
                if off >= self.threshold:
                    self.released.add(off)
                    self.horizon = max(self.horizon, off)
        return done


def output_offsets(value: bytes | None, headers: Mapping[str, bytes]) -> list[int]:
    """Source offsets an output message accounts for (class/suppressed: every record; DLQ: one)."""
    kind = headers.get(H_KIND, b"").decode()
    if kind == "dlq":
        return [int(headers[H_SRC_OFFSET])]
    if value is None:
        return []
    body = json.loads(value)
    return [int(r["src_offset"]) for r in body.get("records", ())]


# ---------------------------------------------------------------------------------------------- per partition
@dataclass(frozen=True)
class PipelineSettings:
    """What the pure pipeline needs from the configuration."""

    input_topic: str
    anon_topic: str
    suppressed_topic: str
    dlq_topic: str
    k: int
    delta: int
    l: int | None = None  # noqa: E741
    max_message_bytes: int = 65536
    dlq_max_bytes: int = 1000000
    encode_in_batches: bool = True  # one engine.encode_many per run of records; False: engine.push per record


class PartitionPipeline:
    """The main path of one input partition: decode, validate, dedupe, engine, encode.

    Args:
        partition: the input partition.
        schema: record schema (QIs/sensitive set).
        engine: a fresh engine (``Engine(schema, config)``) owned by this partition.
        settings: topic names and limits.
        incarnation: short unique tag of this engine instance; prefixes class ids so classes of different
            incarnations (before and after a restart) never share an id.
        start_offset: the first offset this instance will consume.
        already_released: offsets >= start_offset released before the restart (from :class:`ReadBackScan`).
        horizon: the highest input offset consumed by any earlier incarnation (from the read-back).
    """

    def __init__(self, partition: int, schema: Schema, engine: EngineLike, settings: PipelineSettings, *,
                 incarnation: str, start_offset: int, already_released: Iterable[int] = (), horizon: int = -1,
                 clock: Callable[[], float] | None = None) -> None:
        self.partition = partition
        self.schema = schema
        self.engine = engine
        self.settings = settings
        self.incarnation = incarnation
        self.decoder = RecordDecoder(schema, settings.max_message_bytes)
        self.start_offset = start_offset
        self.next_offset = start_offset
        self.horizon = max(horizon, start_offset - 1)
        self.already_released: set[int] = {o for o in already_released if o >= start_offset}
        self._clock = clock
        self._buffered: dict[int, tuple[Any, float | None]] = {}  # offset -> (record id, ingest timestamp s)
        self._heap: list[int] = []
        self._id_field = schema.record_id or "id"
        self._sensitive = [a.name for a in schema.sensitive]
        self._qis = [a.name for a in schema.qis]
        self._qi_getter = operator.itemgetter(*self._qis) if len(self._qis) > 1 else (
            lambda rec: (rec[self._qis[0]],))
        self._release_prefix = f"{settings.input_topic}/{partition}/"
        self._src_headers = ((H_SRC_TOPIC, settings.input_topic.encode()),
                             (H_SRC_PARTITION, str(partition).encode()))

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
        return f"{self._release_prefix}{offset}"

    # ---------------------------------------------------------------- processing
    def process(self, messages: Sequence[InputMessage], now: float | None = None) -> BatchResult:
        """Handle consecutive messages of this partition (offsets ascending).

        Valid records are collected and pushed in runs: one vectorized QI encoding per run
        (``engine.encode_many`` + ``push_encoded``, unless ``settings.encode_in_batches`` is off), in arrival
        order; a control message ends the run before it flushes.
        """
        out: list[OutputMessage] = []
        stats = BatchStats()
        run: list[tuple[InputMessage, dict[str, Any]]] = []
        for m in messages:
            if m.offset < self.next_offset:
                continue  # already handled (duplicate delivery after a seek)
            self.next_offset = m.offset + 1
            if m.offset > self.horizon:
                self.horizon = m.offset
            if m.headers and _is_flush(m.headers):
                self._push_run(run, out, stats, now)
                run = []
                stats.control += 1
                self._emit(self.engine.flush(now), m.offset, out, stats, now)
                continue
            stats.consumed += 1
            if m.offset in self.already_released:
                self.already_released.discard(m.offset)
                stats.skipped += 1
                continue
            rec = self.decoder.decode(m.value)
            if isinstance(rec, DeadLetter):
                out.append(self._dead_letter(m, rec))
                stats.dead_letters[rec.reason] = stats.dead_letters.get(rec.reason, 0) + 1
                continue
            rid = rec[self._id_field]
            rec[self._id_field] = m.offset  # the engine tracks records by source offset (unique)
            self._buffered[m.offset] = (rid, m.timestamp_ms / 1000.0 if m.timestamp_ms is not None else None)
            heapq.heappush(self._heap, m.offset)
            run.append((m, rec))
        self._push_run(run, out, stats, now)
        return BatchResult(out, stats)

    def _push_run(self, run: Sequence[tuple[InputMessage, dict[str, Any]]], out: list[OutputMessage],
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
        for i, (m, rec) in enumerate(run):
            try:
                releases = push(rec, now) if rows is None else push_encoded(rec, rows[i], now)
            except Exception as e:  # engine refused the record: keep the service running, account for it
                del self._buffered[m.offset]
                out.append(self._dead_letter(m, DeadLetter("engine_error", f"engine rejected the record: {e!r}")))
                stats.dead_letters["engine_error"] = stats.dead_letters.get("engine_error", 0) + 1
                continue
            if releases:
                self._emit(releases, m.offset, out, stats, now)

    def flush(self, now: float | None = None) -> BatchResult:
        """Release or suppress everything buffered (end of stream / idle flush)."""
        out: list[OutputMessage] = []
        stats = BatchStats()
        self._emit(self.engine.flush(now), self.next_offset - 1, out, stats, now)
        return BatchResult(out, stats)

    def expire(self, now: float) -> BatchResult:
        """Apply the engine's wall-clock bound (``max_delay_seconds``) without an arrival."""
        out: list[OutputMessage] = []
        stats = BatchStats()
        if self._buffered:
            self._emit(self.engine.expire(now), self.next_offset - 1, out, stats, now)
        return BatchResult(out, stats)

    # ---------------------------------------------------------------- encoding
    def _emit(self, releases: Sequence[Release], trigger: int, out: list[OutputMessage], stats: BatchStats,
              now: float | None) -> None:
        s = self.settings
        horizon = str(self.horizon).encode()
        pop = self._buffered.pop
        sens = self._sensitive
        prefix = self._release_prefix
        lat_append = stats.ingest_latency_seconds.append
        for r in releases:
            offsets = [int(o) for o in r.record_ids]
            is_class = r.kind == "class"
            entries = []
            for off, d, rec in zip(offsets, r.delays, r.records, strict=True):
                rid, ts = pop(off, (None, None))
                entry: dict[str, Any] = {"record_id": rid, "src_offset": off, "release_id": prefix + str(off),
                                         "delay": int(d), "position_delay": trigger - off}
                if is_class:
                    for name in sens:
                        entry[name] = rec[name]
                if ts is not None and now is not None:
                    lat = now - ts if now > ts else 0.0
                    entry["latency_s"] = round(lat, 4)
                    lat_append(lat)
                entries.append(entry)
            stats.delays.extend(r.delays)
            first = min(offsets) if offsets else trigger
            body: dict[str, Any] = {
                "kind": r.kind,
                "release_id": self.release_id(first),
                "src_topic": s.input_topic, "src_partition": self.partition,
                "release_offset": trigger, "horizon": self.horizon,
                "k": s.k, "l": s.l, "delta": s.delta,
                "leftover": bool(r.leftover),
                "records": entries,
            }
            if r.kind == "class":
                class_id = f"p{self.partition}-{self.incarnation}-{r.class_id}"
                loss = float(r.loss)
                body.update({"class_id": class_id, "generalized": {q: r.generalized[q] for q in self._qis},
                             "loss": loss if math.isfinite(loss) else None, "size": int(r.size),
                             "reused": bool(r.reused)})
                stats.released += len(offsets)
                stats.class_losses.append(loss)
                stats.class_sizes.append(int(r.size))
                stats.released_loss_sum += loss * len(offsets)
                topic, kind, key = s.anon_topic, "anon", class_id.encode()
            else:
                stats.suppressed += len(offsets)
                topic, kind, key = s.suppressed_topic, "suppressed", self.release_id(first).encode()
            value = json.dumps(body, separators=(",", ":")).encode()
            out.append(OutputMessage(kind, topic, self.partition, key, value,
                                     (*self._src_headers, (H_SRC_OFFSET, str(first).encode()),
                                      (H_HORIZON, horizon), (H_KIND, kind.encode()))))

    def _dead_letter(self, m: InputMessage, dl: DeadLetter) -> OutputMessage:
        value = m.value or b""
        headers: list[tuple[str, bytes]] = [*self._src_headers, (H_SRC_OFFSET, str(m.offset).encode()),
                                            (H_HORIZON, str(self.horizon).encode()), (H_KIND, b"dlq"),
                                            (H_REASON, dl.reason.encode()), (H_ERROR, dl.error[:2000].encode())]
        if dl.field is not None:
            headers.append((H_FIELD, str(dl.field).encode()))
        if len(value) > self.settings.dlq_max_bytes:
            headers.append((H_TRUNCATED, str(len(value)).encode()))
            value = value[: self.settings.dlq_max_bytes]
        return OutputMessage("dlq", self.settings.dlq_topic, self.partition, m.key, value, tuple(headers))


def _is_flush(headers: Sequence[tuple[str, bytes]]) -> bool:
    return any(k == CONTROL_HEADER and v == CONTROL_FLUSH for k, v in headers)


def decode_class_message(value: bytes) -> dict[str, Any]:
    """Parse an ``anon``/``suppressed`` output message."""
    body = json.loads(value)
    if not isinstance(body, dict):
        raise ValueError("output message is not a JSON object")
    return body


def class_rows(body: Mapping[str, Any], qis: Sequence[str], sensitive: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of the released-records CSV layout (record_id, class_id, QIs..., sensitive) of one class message."""
    rows = []
    gen = body["generalized"]
    for r in body["records"]:
        row: dict[str, Any] = {"record_id": r["record_id"], "class_id": body["class_id"]}
        for q in qis:
            row[q] = gen[q]
        for s in sensitive:
            row[s] = r.get(s)
        rows.append(row)
    return rows
