"""Every Prometheus metric stream-anon exports, defined in one place against an injected registry.

Names are ``stream_anon_*``.  The deploy rules, the Grafana dashboard and the tests cross-check
against :data:`METRIC_NAMES`, and against a live ``/metrics`` scrape of the running service.

Histograms are :class:`BulkHistogram` collectors (prometheus_client's public custom-collector API): the service
observes a whole batch of values at once (one ``numpy`` pass, not one call per value).

Each process exports only its own metrics: :class:`ServiceMetrics` registers the metrics of the parts it is given
(:data:`MAIN`, :data:`SIDE`, :data:`UDP`; the few both paths update, :data:`SHARED`, with either of them) and
keeps the others unregistered (they can still be updated; nothing exports them).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

DELAY_ARRIVAL_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 750, 900, 1000, 1500, 2000, 3000, 5000, 10000)
DELAY_SECONDS_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
LOSS_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
CLASS_SIZE_BUCKETS = (2, 3, 5, 10, 15, 20, 30, 50, 100, 200, 500)
PROCESSING_BUCKETS = (1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2, 0.1)


class BulkHistogram:
    """A label-less histogram observed in bulk, registered as a custom collector (``registry`` None: not
    registered).

    ``observe_many(values)`` counts exactly what ``prometheus_client.Histogram.observe`` would for each value
    (a value equal to a bound falls in that bound's bucket; NaN adds NaN to the sum and to no bucket, as
    ``observe`` does), with one ``searchsorted`` over the batch; ``observe_repeated(value, count)`` as
    ``count`` observations of ``value``.
    """

    def __init__(self, name: str, documentation: str, *, buckets: Sequence[float],
                 registry: CollectorRegistry | None) -> None:
        bounds = sorted(float(b) for b in buckets)
        if bounds[-1] != float("inf"):
            bounds.append(float("inf"))
        self.name = name
        self.documentation = documentation
        self._bounds = np.asarray(bounds, dtype=np.float64)
        self._counts = np.zeros(len(bounds), dtype=np.int64)  # per bucket (made cumulative when collected)
        self._sum = 0.0
        self._created = time.time()
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many((value,))

    def observe_repeated(self, value: float, count: int) -> None:
        """``count`` observations of ``value`` (one bucket lookup)."""
        if count <= 0:
            return
        idx = int(np.searchsorted(self._bounds, np.float64(value), side="left"))
        with self._lock:
            if idx < len(self._bounds):
                self._counts[idx] += count
            self._sum += float(value) * count

    def observe_many(self, values: Sequence[float] | np.ndarray) -> None:
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        if arr.size == 0:
            return
        idx = np.searchsorted(self._bounds, arr, side="left")  # NaN sorts last: index len(bounds), no bucket
        counts = np.bincount(idx[idx < len(self._bounds)], minlength=len(self._bounds))
        total = float(arr.sum())
        with self._lock:
            self._counts += counts
            self._sum += total

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            cumulative = np.cumsum(self._counts)
            total = self._sum
        fam = HistogramMetricFamily(self.name, self.documentation)
        fam.add_metric([], [(floatToGoString(b), float(c)) for b, c in zip(self._bounds.tolist(), cumulative.tolist(), strict=True)],
                       total)
        fam.add_sample(f"{self.name}_created", {}, self._created)
        yield fam


MAIN = "main"
SIDE = "side"
UDP = "udp"
ALL_PARTS: frozenset[str] = frozenset({MAIN, SIDE, UDP})
SHARED = ("records_dead_lettered", "produce_errors", "broker_reconnects")
"""Metrics both paths update: registered with :data:`MAIN` or :data:`SIDE` (``produce_errors`` also with
:data:`UDP`: the bridge produces too)."""


@dataclass
class ServiceMetrics:
    """The service's metrics.  ``ServiceMetrics(registry)`` registers every metric (tests pass a fresh
    ``CollectorRegistry``); ``ServiceMetrics(registry, parts=frozenset({MAIN}))`` only the main path's (and the
    shared ones): what one process exports."""

    registry: CollectorRegistry
    parts: frozenset[str] = ALL_PARTS

    def __post_init__(self) -> None:
        unknown = set(self.parts) - ALL_PARTS
        if unknown:
            raise ValueError(f"ServiceMetrics parts: expected some of {sorted(ALL_PARTS)}, got {sorted(unknown)}")
        main = self.registry if MAIN in self.parts else None
        side = self.registry if SIDE in self.parts else None
        udp = self.registry if UDP in self.parts else None
        shared = self.registry if self.parts & {MAIN, SIDE} else None
        producing = self.registry if self.parts else None  # produce_errors: every part that produces
        r = main
        # -- flow (every input record ends in exactly one of released / suppressed / dead-lettered)
        self.records_consumed = Counter("stream_anon_records_consumed", "Records consumed from an input topic",
                                        ["topic"], registry=r)
        self.records_released = Counter("stream_anon_records_released", "Records published k-anonymous",
                                        ["topic"], registry=r)
        self.records_suppressed = Counter("stream_anon_records_suppressed", "Records suppressed (not released)",
                                          ["reason"], registry=r)
        self.records_dead_lettered = Counter("stream_anon_records_dead_lettered",
                                             "Inputs sent to the dead-letter topic", ["reason"], registry=shared)
        self.records_duplicate_skipped = Counter("stream_anon_records_duplicate_skipped",
                                                 "Re-consumed records skipped because already released (recovery)",
                                                 ["topic"], registry=r)
        # -- delay
        self.release_delay_arrivals = BulkHistogram("stream_anon_release_delay_arrivals",
                                                "Arrivals a record waited before its release", buckets=DELAY_ARRIVAL_BUCKETS,
                                                registry=r)
        self.release_delay_seconds = BulkHistogram("stream_anon_release_delay_seconds",
                                               "Seconds from ingest to release", buckets=DELAY_SECONDS_BUCKETS,
                                               registry=r)
        self.delay_bound_arrivals = Gauge("stream_anon_delay_bound_arrivals", "Configured delay bound delta (arrivals)",
                                          registry=r)
        # -- information loss and classes
        self.class_information_loss = BulkHistogram("stream_anon_class_information_loss",
                                                "Goldberger-Tassa loss of each released class (mean over QIs)",
                                                buckets=LOSS_BUCKETS, registry=r)
        self.gt_loss = Gauge("stream_anon_gt_loss", "Running Goldberger-Tassa loss of everything released so far",
                             registry=r)
        self.class_size = BulkHistogram("stream_anon_class_size", "Records per released equivalence class",
                                    buckets=CLASS_SIZE_BUCKETS, registry=r)
        self.k_anonymity_violations = Counter("stream_anon_k_anonymity_violations",
                                              "Classes the pre-publish gate refused (below k or l, or a member outside "
                                              "the generalization): suppressed, not published", registry=r)
        self.k_parameter = Gauge("stream_anon_k", "Configured k", registry=r)
        # -- buffer
        self.open_clusters = Gauge("stream_anon_open_clusters", "Clusters not yet released", ["partition"], registry=r)
        self.buffered_records = Gauge("stream_anon_buffered_records", "Records consumed but not yet released",
                                      ["partition"], registry=r)
        # -- Kafka position
        self.consumer_lag = Gauge("stream_anon_consumer_lag", "Broker highwater minus consumed position (committed "
                                  "offset for a partition not started), read by a thread independent of the loop",
                                  ["topic", "partition"], registry=r)
        self.seconds_since_progress = Gauge("stream_anon_seconds_since_progress",
                                            "Seconds since a consumed position or committed offset last moved while "
                                            "there was lag or the broker did not answer (0 when there is nothing to "
                                            "do)", registry=r)
        self.broker_unanswered_seconds = Gauge("stream_anon_broker_unanswered_seconds",
                                               "Seconds since the broker last answered the lag monitor (0 while it "
                                               "answers; the lag is then the last one read)", registry=r)
        self.commit_watermark = Gauge("stream_anon_commit_watermark",
                                      "Committed offset: lowest offset still buffered", ["topic", "partition"], registry=r)
        self.internal_errors = Counter("stream_anon_internal_errors",
                                       "Bugs caught by the pipeline's guard (the message dead-lettered as "
                                       "internal_error, or the release suppressed), by stage", ["stage"], registry=r)
        self.outputs_resent = Counter("stream_anon_outputs_resent",
                                      "Outputs the ledger promised and recovery found missing, re-sent byte for byte",
                                      ["topic"], registry=r)
        self.processing_seconds = BulkHistogram(
            "stream_anon_processing_seconds", "Pipeline time per record (decode, validate, engine, encode): one "
            "observation per record, its chunk's time divided by the chunk's records (a poll goes to the pipeline in "
            "chunks of at most 500)", buckets=PROCESSING_BUCKETS,
            registry=r)
        self.produce_errors = Counter("stream_anon_produce_errors", "Produce requests that failed and were retried",
                                      ["topic"], registry=producing)
        self.broker_reconnects = Counter("stream_anon_broker_reconnects", "Broker connection retries with backoff",
                                         registry=shared)
        # -- local differential privacy side paths
        r = side
        self.epsilon_per_record = Gauge("stream_anon_epsilon_per_record",
                                        "Exact eps one record spends on a side topic: the sum over its attributes' "
                                        "mechanisms (k-means: the one window the record is in)", ["topic"],
                                        registry=r)
        self.epsilon_budget_total = Gauge("stream_anon_epsilon_budget_total",
                                          "Lifetime eps budget of a budgeted side output (k-means with "
                                          "side_paths.kmeans.total_epsilon)", ["topic"], registry=r)
        self.epsilon_budget_used = Gauge("stream_anon_epsilon_budget_used",
                                         "Eps used so far of a lifetime budget (persisted across restarts)", ["topic"],
                                         registry=r)
        self.epsilon_budget_remaining = Gauge("stream_anon_epsilon_budget_remaining",
                                              "Eps left of a lifetime budget (total - used)", ["topic"], registry=r)
        self.side_records_published = Counter("stream_anon_side_records_published",
                                              "Perturbed records published on a side topic", ["topic"], registry=r)
        self.side_records_consumed = Counter("stream_anon_side_records_consumed",
                                             "Input records consumed by the LDP side paths", ["topic"], registry=r)
        self.side_records_skipped = Counter("stream_anon_side_records_skipped",
                                            "Input records the side paths skipped (invalid; the main path dead-letters them)",
                                            ["topic", "reason"], registry=r)
        self.side_values_clipped = Counter("stream_anon_side_values_clipped",
                                           "Out-of-domain numeric values the side paths clipped into the schema's "
                                           "public domain", ["topic", "attribute"], registry=r)
        self.side_outputs_refused = Counter("stream_anon_side_outputs_refused",
                                            "Side outputs refused (e.g. privacy budget exhausted)", ["topic", "reason"],
                                            registry=r)
        self.side_lifetime_cap_refusal_probability = Gauge(
            "stream_anon_side_lifetime_cap_refusal_probability",
            "Probability that a record (person) never seen before is refused every side output by the lifetime-cap "
            "sketch, which fills with the distinct records it has charged (side_paths.person_budget.width)",
            ["topic"], registry=r)
        self.estimate_standard_error = Gauge("stream_anon_estimate_standard_error",
                                             "Standard error of a server-side estimate", ["topic", "attribute"],
                                             registry=r)
        self.estimate_abs_error = Gauge("stream_anon_estimate_abs_error",
                                        "Mean absolute error of an estimate against the exact value (demo/testing)",
                                        ["topic", "attribute"], registry=r)
        # -- UDP ingest bridge
        r = udp
        self.udp_datagrams_received = Counter("stream_anon_udp_datagrams_received", "UDP datagrams received",
                                              registry=r)
        self.udp_records_forwarded = Counter("stream_anon_udp_records_forwarded", "UDP records forwarded to Kafka",
                                             registry=r)
        self.udp_gaps = Counter("stream_anon_udp_gaps", "Sequence numbers missing (lost datagrams)", registry=r)
        self.udp_duplicates = Counter("stream_anon_udp_duplicates", "Duplicate sequence numbers dropped", registry=r)
        self.udp_malformed = Counter("stream_anon_udp_malformed", "Datagrams that could not be parsed", registry=r)


# Exported names (counters get ``_total``, histograms ``_bucket/_sum/_count``).
METRIC_NAMES: frozenset[str] = frozenset(
    m.name + ("_total" if m.type == "counter" else "")
    for m in ServiceMetrics(CollectorRegistry()).registry.collect()
)
