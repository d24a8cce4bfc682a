"""What the main path did, counted: the running totals of this process (:class:`MainPathTotals`, read by the demo
and the tests) and the metrics, both updated from each finished batch (:class:`BatchAccounting`), which also logs
what an operator must see (dead letters, gate refusals, internal errors)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.service.partitions import OwnedPartition
from stream_anon.service.pipeline import BatchStats
from stream_anon.service.workers import PartitionResult

log = logging.getLogger(__name__)


@dataclass
class MainPathTotals:
    """Running totals of this process (the demo and tests read them; metrics carry the same numbers)."""

    consumed: int = 0
    released: int = 0
    suppressed: int = 0
    dead_lettered: int = 0
    skipped: int = 0
    control: int = 0
    classes: int = 0
    loss_sum: float = 0.0  # sum over released records of their class loss
    recoveries: int = 0
    resent: int = 0  # outputs re-sent by recoveries
    gate_refusals: int = 0  # classes the pre-publish gate refused
    internal_errors: int = 0
    producer_recreations: int = 0  # producers closed and created anew (each followed by a recovery of every partition)
    dead_letter_reasons: dict[str, int] = field(default_factory=dict)
    suppressed_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def gt_loss(self) -> float:
        """Goldberger-Tassa loss of what this process released: (sum |C| loss(C) + #suppressed) / N."""
        n = self.released + self.suppressed
        return (self.loss_sum + self.suppressed) / n if n else 0.0


def _what_follows(stage: str) -> str:
    if stage in ("decode", "engine", "flush"):
        return "the message is dead-lettered (internal_error), the partition goes on"
    return "its records are suppressed (gate)" if stage == "encode" else "the partition goes on"


class BatchAccounting:
    """Counts each finished batch into ``totals`` and ``metrics`` (``input_topic``/``anon_topic`` label them)."""

    def __init__(self, totals: MainPathTotals, metrics: ServiceMetrics, *, input_topic: str, anon_topic: str) -> None:
        self.totals = totals
        self.metrics = metrics
        self.input_topic = input_topic
        self.anon_topic = anon_topic

    def record(self, res: PartitionResult, owned: OwnedPartition | None) -> None:
        s, m = res.stats, self.metrics
        self._outcomes(res.partition, s)
        self._problems(res.partition, s)
        m.release_delay_arrivals.observe_many(s.delays)
        m.release_delay_seconds.observe_many(s.ingest_latency_seconds)
        m.class_information_loss.observe_many(s.class_losses)
        m.class_size.observe_many(s.class_sizes)
        if s.released or s.suppressed:
            m.gt_loss.set(self.totals.gt_loss)
        if res.n_messages:
            # issue 20: one observation per message (the batch's mean), not one per batch
            m.processing_seconds.observe_repeated(res.elapsed / res.n_messages, res.n_messages)
        if owned is not None:
            m.buffered_records.labels(partition=str(owned.partition)).set(owned.buffered)
            m.open_clusters.labels(partition=str(owned.partition)).set(owned.open_clusters)

    def _outcomes(self, partition: int, s: BatchStats) -> None:
        t, m, topic = self.totals, self.metrics, self.input_topic
        t.consumed += s.consumed
        t.released += s.released
        t.skipped += s.skipped
        t.control += s.control
        t.classes += len(s.class_sizes)
        t.loss_sum += s.released_loss_sum
        if s.consumed:
            m.records_consumed.labels(topic=topic).inc(s.consumed)
        if s.released:
            m.records_released.labels(topic=self.anon_topic).inc(s.released)
        for reason, n in s.suppressed.items():
            t.suppressed += n
            t.suppressed_reasons[reason] = t.suppressed_reasons.get(reason, 0) + n
            m.records_suppressed.labels(reason=reason).inc(n)
        if s.skipped:
            m.records_duplicate_skipped.labels(topic=topic).inc(s.skipped)
        for reason, n in s.dead_letters.items():
            t.dead_lettered += n
            t.dead_letter_reasons[reason] = t.dead_letter_reasons.get(reason, 0) + n
            m.records_dead_lettered.labels(reason=reason).inc(n)
            log.warning("partition %d: %d message(s) dead-lettered (%s)", partition, n, reason)

    def _problems(self, partition: int, s: BatchStats) -> None:
        t, m = self.totals, self.metrics
        for release, n, detail in s.gate_refusals:
            t.gate_refusals += 1
            m.k_anonymity_violations.inc()
            log.error("partition %d: the pre-publish gate refused class %s (%d records, suppressed with reason gate, "
                      "not published): %s", partition, release, n, detail)
        for stage, offset, line in s.internal_errors:
            t.internal_errors += 1
            m.internal_errors.labels(stage=stage).inc()
            where = f"offset {offset}" if offset is not None else "no single message"
            log.error("partition %d: internal error in %s at %s: %s; %s", partition, stage, where, line,
                      _what_follows(stage))

    def recovered(self, partition: int, resent: tuple[str, ...]) -> None:
        """A partition recovered from the ledger, re-sending outputs to ``resent`` (one topic per output)."""
        self.totals.recoveries += 1
        self.totals.resent += len(resent)
        for topic in resent:
            self.metrics.outputs_resent.labels(topic=topic).inc()

    def revoked(self, partition: int) -> None:
        self.metrics.buffered_records.labels(partition=str(partition)).set(0)
        self.metrics.open_clusters.labels(partition=str(partition)).set(0)
