"""The side paths' metrics: the only side-path code that touches Prometheus.

The metrics themselves are defined once, with the service's, in :class:`stream_anon.metrics.definitions.ServiceMetrics`;
this module updates them from what the side app acknowledged (:class:`SideMetrics`).  The side-path process
exports only these (``ServiceMetrics(registry, parts={SIDE})``; :func:`side_registry` for a registry holding every
metric).

eps metrics say what a record spends, never a sum over records (that has no privacy meaning):
``stream_anon_epsilon_per_record{topic}`` is the exact eps of one record on the topic (k-means: the window it is
in); a lifetime budget (k-means with ``side_paths.kmeans.total_epsilon``) shows ``..._budget_total``, ``_used`` and
``_remaining``.  ``stream_anon_side_lifetime_cap_refusal_probability{topic=<input>}`` says how full the lifetime-cap
sketch is: the chance that a record never seen before gets no side output (it fails closed as it fills).
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
                "side_outputs_refused", "epsilon_per_record", "epsilon_budget_total", "epsilon_budget_used",
                "epsilon_budget_remaining", "side_lifetime_cap_refusal_probability",
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
        self.budgets()

    def published(self, outputs: Sequence[Out], copies: Sequence[CopyBatch]) -> dict[str, int]:
        """Count acknowledged messages; returns messages per topic.

        ``estimate_standard_error{topic,attribute}`` = the largest frequency SE over categories (frequency
        estimates) or the SE of the mean; ``estimate_abs_error{topic,attribute}`` (truth tracker only) = mean
        absolute frequency error over categories, or |mean - true mean|.
        """
        m, t = self.m, self.processor.topics
        per_topic: dict[str, int] = {}
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
        for c in copies:
            per_topic[c.topic] = per_topic.get(c.topic, 0) + len(c)
        for topic, count in per_topic.items():
            m.side_records_published.labels(topic=topic).inc(count)
        if any(topic == t.kmeans for topic, _key, _msg in outputs):
            self.budgets()  # a window spent part of a lifetime budget
        return per_topic

    def lifetime_cap(self) -> None:
        """``side_lifetime_cap_refusal_probability{topic=<input>}``: the chance that a record (person) never seen
        before is refused by the lifetime-cap sketch now (:meth:`PersonBudgetSketch.fresh_refusal_rate` at one
        record's eps over all side topics: about 0.5 ms over the default 8 x 2^17 counters); no series without a
        cap (``person_budget.cap_epsilon: null``)."""
        p = self.processor
        person = p.budgets.person
        if person is not None:
            self.m.side_lifetime_cap_refusal_probability.labels(topic=self.input_topic).set(
                person.fresh_refusal_rate(p.epsilon_all_topics))

    def budgets(self) -> None:
        """``epsilon_per_record{topic}``: the exact eps one record spends on each side topic that runs (k-means:
        one window's); ``epsilon_budget_total/used/remaining{topic}``: the k-means stream budget
        (``kmeans.total_epsilon``), the only lifetime budget of a topic (none without it: each record is in one
        window)."""
        p, m = self.processor, self.m
        for topic, eps in p.epsilon_per_record.items():
            m.epsilon_per_record.labels(topic=topic).set(eps)
        if p.kmeans_enabled:
            m.epsilon_per_record.labels(topic=p.topics.kmeans).set(p.epsilon_kmeans)
            acc = p.kmeans_accountant
            if acc is not None:
                m.epsilon_budget_total.labels(topic=p.topics.kmeans).set(acc.total_epsilon)
                m.epsilon_budget_used.labels(topic=p.topics.kmeans).set(acc.spent)
                m.epsilon_budget_remaining.labels(topic=p.topics.kmeans).set(acc.remaining)
