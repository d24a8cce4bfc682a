"""The side paths' metrics: the only side-path code that touches Prometheus.

The metrics themselves are defined once, with the service's, in :class:`stream_anon.metrics.definitions.ServiceMetrics`;
this module updates them from what the side app acknowledged (:class:`SideMetrics`), and :func:`side_registry`
gives the registry the side-path process exports: the side paths' metrics only (the main path's gauges would be
exported there at 0 otherwise).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from stream_anon.core.schema import Kind
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.side.encoding import CopyBatch
from stream_anon.side.processor import Out, SidePathProcessor

SIDE_METRICS = ("side_records_consumed", "side_records_skipped", "side_values_clipped", "side_records_published",
                "side_outputs_refused", "epsilon_spent", "epsilon_budget_total", "epsilon_budget_remaining",
                "estimate_standard_error", "estimate_abs_error", "records_dead_lettered", "produce_errors",
                "broker_reconnects")
"""The :class:`ServiceMetrics` attributes the side paths update (and export from their own process)."""


def side_registry(metrics: ServiceMetrics) -> CollectorRegistry:
    """A registry with only the side paths' collectors of ``metrics`` (for the side-path process's endpoint)."""
    registry = CollectorRegistry()
    for name in SIDE_METRICS:
        registry.register(getattr(metrics, name))
    return registry


class SideMetrics:
    """Updates the side-path series of ``metrics`` (label ``topic`` of an estimate = its source side topic)."""

    def __init__(self, metrics: ServiceMetrics, processor: SidePathProcessor, input_topic: str) -> None:
        self.m = metrics
        self.processor = processor
        self.input_topic = input_topic
        for a in processor.schema.attributes:  # a series per clippable attribute from the start (0 until clipped)
            if a.kind is Kind.NUMERIC and a.lo is not None and a.hi is not None:
                metrics.side_values_clipped.labels(topic=input_topic, attribute=a.name)

    def consumed(self, n: int) -> None:
        self.m.side_records_consumed.labels(topic=self.input_topic).inc(n)

    def skipped(self, reason: str, n: int = 1) -> None:
        self.m.side_records_skipped.labels(topic=self.input_topic, reason=reason).inc(n)

    def clipped(self, attribute: str, n: int = 1) -> None:
        """Out-of-domain values of ``attribute`` clipped into the public domain (``side_paths.out_of_domain``)."""
        self.m.side_values_clipped.labels(topic=self.input_topic, attribute=attribute).inc(n)

    def dead_lettered(self, reason: str) -> None:
        self.m.records_dead_lettered.labels(reason=reason).inc()

    def produce_error(self, topic: str) -> None:
        self.m.produce_errors.labels(topic=topic).inc()

    def reconnect(self) -> None:
        self.m.broker_reconnects.inc()

    def budget_refused(self, topic: str) -> None:
        """A k-means window refused because its budget is exhausted."""
        self.m.side_outputs_refused.labels(topic=topic, reason="budget_exhausted").inc()
        self.m.epsilon_budget_remaining.labels(topic=topic).set(self.processor.kmeans_budget()[1])

    def published(self, outputs: Sequence[Out], copies: Sequence[CopyBatch]) -> dict[str, int]:
        """Count acknowledged messages; returns messages per topic.

        ``epsilon_spent{topic}`` adds each per-record copy's ``epsilon_total`` and each k-means window's eps;
        ``estimate_standard_error{topic,attribute}`` = the largest frequency SE over categories (frequency
        estimates) or the SE of the mean; ``estimate_abs_error{topic,attribute}`` (truth tracker only) = mean
        absolute frequency error over categories, or |mean - true mean|.
        """
        m, t = self.m, self.processor.topics
        per_topic: dict[str, int] = {}
        eps: dict[str, float] = {}
        for topic, _key, msg in outputs:
            per_topic[topic] = per_topic.get(topic, 0) + 1
            if topic == t.estimates:
                src, attr = msg["source_topic"], msg["attribute"]
                se = msg.get("standard_error")
                if se is not None and math.isfinite(se):
                    m.estimate_standard_error.labels(topic=src, attribute=attr).set(se)
                truth = msg.get("truth")
                if truth is not None and math.isfinite(truth.get("abs_error", math.nan)):
                    m.estimate_abs_error.labels(topic=src, attribute=attr).set(truth["abs_error"])
            elif topic == t.kmeans:
                eps[topic] = eps.get(topic, 0.0) + float(msg["epsilon"])
            else:
                eps[topic] = eps.get(topic, 0.0) + float(msg["epsilon_total"])
        for c in copies:
            per_topic[c.topic] = per_topic.get(c.topic, 0) + len(c)
            eps[c.topic] = eps.get(c.topic, 0.0) + len(c) * c.epsilon_total
        for topic, count in per_topic.items():
            m.side_records_published.labels(topic=topic).inc(count)
        for topic, e in eps.items():
            m.epsilon_spent.labels(topic=topic).inc(e)
        return per_topic

    def budgets(self) -> None:
        """``epsilon_budget_total/remaining{topic}``: per-record topics show one record's budget (the configured
        split budget, else the sum of its attributes' eps) and what is left of it; k-means shows the stream
        budget (``kmeans.total_epsilon``) or, without one, the per-window budget."""
        p, m = self.processor, self.m
        cfg, t = p.config, p.topics
        configured = {t.krr: cfg.krr.record_epsilon, t.rs: cfg.rs.record_epsilon, t.blap: cfg.blap.record_epsilon}
        for topic, spent in p.epsilon_per_record.items():
            rec = configured.get(topic)
            total = float(rec) if rec is not None else spent
            m.epsilon_budget_total.labels(topic=topic).set(total)
            m.epsilon_budget_remaining.labels(topic=topic).set(max(0.0, total - spent))
        if p.kmeans_enabled:
            total, remaining = p.kmeans_budget()
            m.epsilon_budget_total.labels(topic=t.kmeans).set(total)
            m.epsilon_budget_remaining.labels(topic=t.kmeans).set(remaining)
