"""Accounting from the internal ledger: ``stream-anon audit``, the demo summary, the tests and the benchmarks.

The ledger (:mod:`stream_anon.service.ledger`) says what became of every input offset; the public topics carry
nothing per record.  :func:`collect_outputs` reads the ledger (whole, forward) into
:class:`~stream_anon.service.ledger.LedgerAccounting`, reads ``anon``, ``suppressed`` and ``dlq`` and checks each
promised output against its topic (exactly once, nothing else there), and flattens the result:

* ``records``: one row per accounted input record (end-of-stream markers are counted apart):
  ``src_partition, src_offset, record_id, outcome`` (``released`` / ``suppressed`` / ``dead_lettered``),
  ``reason``, ``class_id`` and the class's generalized QIs (released records), and the internal timing
  ``delay`` (arrivals waited in the engine), ``release_offset`` (the arrival that released it),
  ``position_delay`` (= release_offset - src_offset), ``latency_s`` (input timestamp to the release, in the
  pipeline) and ``published_ms`` (the class message's Kafka timestamp: when it was produced, after its ledger
  entry was acknowledged).  Internal: it joins record ids to classes, as the ledger does.
* ``public``: the public released table, what a reader of ``anon`` gets: ``class_id``, the QIs and the
  sensitive value(s), one row per record, expanded from each class message's counts.

``send_flush_markers`` appends the end-of-stream control message to every input partition (the service then
releases or suppresses what it still buffers, and accounts for the marker in the ledger).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.formats.release import (
    PublicClass,
    ReleaseFormatError,
    decode_class_message,
    decode_dead_letter,
)
from stream_anon.kafka_io.reader import PartitionReader, caught_up, fetched_ends
from stream_anon.kafka_io.settings import KafkaSettings
from stream_anon.service.accounting import AccountingReport, LedgerAccounting, PublishedCheck
from stream_anon.service.ledger import KIND_CLASS, KIND_CONTROL, LedgerRecord, ledger_topic


def send_flush_markers(producer: KafkaProducer, topic: str, partitions: Sequence[int]) -> None:
    """Append the end-of-stream control message (header ``stream-anon-control: flush``, no value) to each
    partition."""
    for p in partitions:
        producer.send(topic, value=b"", partition=p, headers=[(CONTROL_HEADER, CONTROL_FLUSH)])
    producer.flush()


def _consumer(bootstrap_servers: str, client_options: dict[str, Any] | None) -> KafkaConsumer:
    return KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest", fetch_max_bytes=32 * 1024 * 1024,
                         max_partition_fetch_bytes=8 * 1024 * 1024, **(client_options or {}))


def read_topic_with_headers(bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0, idle_s: float = 1.0,
                            client_options: dict[str, Any] | None = None) -> list[Any]:
    """All messages of ``topic`` (ConsumerRecords, partition by partition in offset order), reading until every
    partition reached its highwater."""
    consumer = _consumer(bootstrap_servers, client_options)
    try:
        deadline = time.monotonic() + timeout_s
        parts = consumer.partitions_for_topic(topic)
        while not parts and time.monotonic() < deadline:
            time.sleep(0.1)
            parts = consumer.partitions_for_topic(topic)
        if not parts:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        by_tp: dict[TopicPartition, list[Any]] = {tp: [] for tp in tps}
        last = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200, max_records=20000)
            for tp, msgs in batch.items():
                by_tp[tp].extend(msgs)
            if batch:
                last = time.monotonic()
            if all(caught_up(consumer, tp) for tp in tps) and time.monotonic() - last >= idle_s:
                break
        return [m for tp in tps for m in by_tp[tp]]
    finally:
        consumer.close()


def partition_ends(bootstrap_servers: str, topic: str, *, timeout_s: float = 30.0,
                   client_options: dict[str, Any] | None = None) -> dict[int, int]:
    """Partition -> end offset (next offset) of ``topic``, from fetch responses (Tansu's ``end_offsets()`` is
    wrong)."""
    consumer = _consumer(bootstrap_servers, client_options)
    try:
        return fetched_ends(consumer, topic, timeout_s)
    finally:
        consumer.close()


SPAN_GAP = 5_000
"""Runs of offsets (of one partition) :func:`offsets_held` looks up at most this many offsets apart are read as one
range: every fetch brings and decodes up to ``kafka.max_partition_fetch_bytes`` of records, whatever the range asked
for, so a run of a few offsets costs a whole fetch (the audit of a compacted ledger, whose compacted entries leave
some 1,000 short runs across the input: 66 s for 65,122 input records, where reading them once takes seconds)."""
SPAN_MAX = 100_000
"""The longest range :func:`offsets_held` reads at once (what it holds in memory)."""


def offsets_held(reader: PartitionReader, topic: str, offsets: Sequence[tuple[int, int]]) -> set[tuple[int, int]]:
    """Which of ``offsets`` ((partition, offset) pairs) hold a record in ``topic``: each run of consecutive offsets
    (runs at most :data:`SPAN_GAP` offsets apart as one range, up to :data:`SPAN_MAX` offsets long) is read with
    ``reader`` (:meth:`~stream_anon.kafka_io.reader.PartitionReader.read_range`: a fetch skips offsets that hold
    nothing; the rest of a range is empty only when fetches answered with no record below the highwater confirm it,
    the gap Tansu's durable storage leaves when killed between a partition's watermark and its batch,
    docs/tansu.md).  A fetch Tansu answers empty because listing the partition's batch objects outlasted its max wait
    is not such a gap: read as one, a lost record would be reported as no record at all."""
    wanted = set(offsets)
    spans: list[tuple[int, int, int]] = []  # (partition, first, end)
    for p, o in sorted(wanted):
        if spans and spans[-1][0] == p and o - spans[-1][2] <= SPAN_GAP and o + 1 - spans[-1][1] <= SPAN_MAX:
            spans[-1] = (p, spans[-1][1], o + 1)
        else:
            spans.append((p, o, o + 1))
    held: set[tuple[int, int]] = set()
    for p, lo, hi in spans:
        held.update((p, offset) for offset, _, _ in reader.read_range(topic, p, lo, hi) if (p, offset) in wanted)
    return held


def records_at(bootstrap_servers: str, topic: str, offsets: Sequence[tuple[int, int]], *, timeout_s: float = 60.0,
               client_options: dict[str, Any] | None = None) -> set[tuple[int, int]]:
    """:func:`offsets_held` with a group-less reader of ``bootstrap_servers``; a run that makes no progress for
    ``timeout_s`` raises ``KafkaTimeoutError`` (never a short answer)."""
    kafka = KafkaSettings(bootstrap_servers=bootstrap_servers, request_timeout_ms=int(timeout_s * 500),
                          **(client_options or {}))
    reader = PartitionReader(kafka)
    try:
        return offsets_held(reader, topic, offsets)
    finally:
        reader.close()


@dataclass
class OutputSnapshot:
    """The ledger and the output topics, checked against each other (see the module docstring)."""

    records: pd.DataFrame
    public: pd.DataFrame
    accounting: AccountingReport
    published: dict[str, PublishedCheck] = field(default_factory=dict)
    classes: int = 0
    control: int = 0
    messages: dict[str, int] = field(default_factory=dict)
    dlq_reasons: dict[str, int] = field(default_factory=dict)
    suppressed_reasons: dict[str, int] = field(default_factory=dict)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)  # decoded dlq messages
    problems: list[str] = field(default_factory=list)  # unreadable anon messages, classes not on the ledger
    references: dict[str, dict[Any, int]] = field(default_factory=dict)  # class id -> its t-closeness reference

    @property
    def ok(self) -> bool:
        """Every input offset accounted once (and none missing, when the input ends were given), every promised
        output on its topic exactly once, nothing else there, every class message readable."""
        return self.accounting.ok and all(c.ok for c in self.published.values()) and not self.problems


def collect_outputs(bootstrap_servers: str, *, input_topic: str, anon: str, suppressed: str, dlq: str,
                    qis: Sequence[str], sensitive: Sequence[str], ledger: str | None = None,
                    input_ends: dict[int, int] | None = None, timeout_s: float = 60.0, idle_s: float = 0.3,
                    client_options: dict[str, Any] | None = None) -> OutputSnapshot:
    """Read the ledger (default ``<input_topic>.ledger``) and the output topics; see the module docstring.
    ``input_ends``: partition -> end offset of the input, to find offsets the ledger does not account for."""
    acc = LedgerAccounting(input_topic, keep_entries=True)
    by_partition: dict[int, list[LedgerRecord]] = {}
    for m in read_topic_with_headers(bootstrap_servers, ledger or ledger_topic(input_topic), timeout_s=timeout_s,
                                     idle_s=idle_s, client_options=client_options):
        by_partition.setdefault(m.partition, []).append(LedgerRecord(m.offset, m.key, m.value))
    for p, recs in sorted(by_partition.items()):
        acc.add(p, recs)
    report = acc.report(input_ends)
    if report.missing:  # an offset in no entry: a record lost, or no record at all (a gap the broker left)?
        report.split_gaps(records_at(bootstrap_servers, input_topic, report.missing, client_options=client_options,
                                     timeout_s=timeout_s))
    snap = OutputSnapshot(records=pd.DataFrame(), public=pd.DataFrame(), accounting=report,
                          dlq_reasons=dict(report.dlq_reasons), suppressed_reasons=dict(report.suppressed_reasons),
                          control=report.outcomes.get("control", 0))
    topics = {"anon": anon, "suppressed": suppressed, "dlq": dlq}
    read = {role: read_topic_with_headers(bootstrap_servers, t, timeout_s=timeout_s, idle_s=idle_s,
                                          client_options=client_options) for role, t in topics.items()}
    for role, msgs in read.items():
        snap.messages[role] = len(msgs)
        snap.published[role] = acc.check_published(role, ((m.key, m.value) for m in msgs))
    classes: dict[str, PublicClass] = {}
    published_ms: dict[str, int] = {}
    public_rows: list[dict[str, Any]] = []
    for m in read["anon"]:
        try:
            pc = decode_class_message(m.value)
        except ReleaseFormatError as err:
            snap.problems.append(f"anon {m.partition}/{m.offset}: {err}")
            continue
        classes[pc.class_id] = pc
        published_ms[pc.class_id] = m.timestamp
        public_rows.extend(pc.rows())
        ref = pc.reference()
        if ref is not None:
            snap.references[pc.class_id] = ref
    snap.classes = len(classes)
    for m in read["dlq"]:
        try:
            snap.dead_letters.append(decode_dead_letter(m.value))
        except ReleaseFormatError as err:
            snap.problems.append(f"dlq {m.partition}/{m.offset}: {err}")
    rows: list[dict[str, Any]] = []
    for p, e in acc.entries:
        if e.kind == KIND_CONTROL:
            continue
        c = classes.get(e.class_id) if e.kind == KIND_CLASS and e.class_id is not None else None
        if e.kind == KIND_CLASS and c is None:
            snap.problems.append(f"class {e.class_id} ({e.release_id}) is on the ledger, not on {anon}")
        for i, off in enumerate(e.offsets):
            lat = e.latency_ms[i] if e.latency_ms else None
            row: dict[str, Any] = {
                "src_partition": p, "src_offset": off, "record_id": e.record_ids[i] if e.record_ids else None,
                "outcome": e.outcome, "reason": e.reason, "class_id": e.class_id,
                "delay": e.delays[i] if e.delays else None, "release_offset": e.trigger,
                "position_delay": e.trigger - off if e.trigger is not None else None,
                "latency_s": lat / 1000.0 if lat is not None else None,
                "published_ms": published_ms.get(e.class_id) if c is not None and e.class_id else None,
            }
            for q in qis:
                row[q] = c.qi.get(q) if c is not None else None
            rows.append(row)
    snap.records = pd.DataFrame(rows, columns=["src_partition", "src_offset", "record_id", "outcome", "reason",
                                               "class_id", "delay", "release_offset", "position_delay", "latency_s",
                                               "published_ms", *qis])
    snap.public = pd.DataFrame(public_rows, columns=["class_id", *qis, *sensitive])
    return snap


# ------------------------------------------------------------------------------------------------ stream-anon audit
def audit_lines(snap: OutputSnapshot) -> list[str]:
    """The audit's report, one finding per line."""
    rep = snap.accounting
    chunked = f", {rep.chunked} of them written in chunks" if rep.chunked else ""
    out = [f"ledger: {rep.entries} entries ({rep.rewrites} identical rewrites{chunked}), {rep.checkpoints} "
           f"checkpoints, {rep.tombstones} tombstones",
           "outcomes: " + ", ".join(f"{k} {v:,}" for k, v in sorted(rep.outcomes.items())) + f" (total "
           f"{rep.accounted:,})",
           f"released in {snap.classes:,} classes; suppressed by reason {dict(sorted(rep.suppressed_reasons.items()))}; "
           f"dead-lettered by reason {dict(sorted(rep.dlq_reasons.items()))}"]
    for role, chk in snap.published.items():
        out.append(f"{role}: {chk.exactly_once:,} of {chk.expected:,} promised messages published exactly once"
                   + ("" if chk.ok else f"; MISSING {len(chk.missing)} (first {chk.missing[:3]}), DUPLICATED "
                      f"{len(chk.duplicated)} (first {chk.duplicated[:3]}), UNEXPECTED {chk.unexpected}"))
    if rep.duplicates:
        out.append(f"ACCOUNTED TWICE: {len(rep.duplicates)} offsets (first {rep.duplicates[:5]})")
    if rep.missing:
        out.append(f"NOT ACCOUNTED: {len(rep.missing)} offsets hold input records that no ledger entry accounts for "
                   f"(lost, or not processed yet) (first {rep.missing[:5]})")
    if rep.gaps:
        out.append(f"no record at {len(rep.gaps)} offsets (gaps the broker left, e.g. a broker killed between "
                   f"writing a partition's end and its records, or a full disk: nothing was lost there, nothing to "
                   f"account for) (first {rep.gaps[:5]})")
    if rep.corrupt:
        out.append(f"CORRUPT ledger records: {len(rep.corrupt)} (first {rep.corrupt[:2]})")
    if rep.incomplete:
        out.append(f"incomplete chunked entries (a crash between their chunks; they count for nothing, their records "
                   f"were processed again): {len(rep.incomplete)} (first {rep.incomplete[:3]})")
    out.extend(f"PROBLEM: {p}" for p in snap.problems[:20])
    out.append("OK: every input offset accounted exactly once, every promised output published exactly once"
               if snap.ok else "NOT OK")
    return out

