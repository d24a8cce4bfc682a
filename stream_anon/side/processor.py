"""Local-differential-privacy side paths, pure: validated records in, side messages out (no Kafka, no metrics).

For every input record :class:`SidePathProcessor` publishes perturbed copies:

* ``adult.krr``: k-ary randomized response (Kairouz et al. 2014; Wang et al. 2017) of the configured
  categorical attributes, ``p = e^eps / (e^eps + k - 1)``;
* ``adult.rs``: FRAPP random substitution (Agrawal & Haritsa 2005) with ``gamma = e^eps``, or its
  l-extended form (Kang, Lee & Hong 2009, ``l`` reports per attribute, exact eps of the variant);
* ``adult.blap``: bounded Laplace on [-1, 1] after normalizing with the schema's PUBLIC bounds (Holohan et al.
  2020; KR 10-2456177) for numeric attributes, and the discretized bounded Laplace for the configured
  ordinal/categorical attributes.

Every message carries the eps each attribute spent and their sum (sequential composition, Dwork & Roth
Thm 3.16), or the equal split of a configured per-record budget.  Server-side aggregators keep only report
histograms and running moments (bounded state) and every ``estimates_every`` records (or
``estimates_every_seconds``) publish ``adult.estimates``: unbiased frequency estimates with standard errors
(k-RR / RS / discretized bounded Laplace) and boundary-corrected debiased means with standard errors
(bounded Laplace).  Estimates are post-processing of the reports: they spend no additional eps.
``adult.kmeans`` releases DP k-means centroids (QuadkDP / UniQuadkDP, Goo et al. 2018) of each tumbling window
of ``window`` records on two numeric attributes in their public box, spending the window's eps; an optional
stream budget (``kmeans.total_epsilon``) is charged per window and, once exhausted, stops that output with an
error log and an event (never silently).

The optional truth tracker (``truth: true``; demo and tests only: it is NOT private) computes the exact
statistics so that each estimate message also carries its actual error.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream_anon.core.schema import Schema, adult_schema
from stream_anon.privacy.base import secure_rng
from stream_anon.privacy.budget import BudgetAccountant, BudgetExhaustedError, WindowedBudget
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans, nicv
from stream_anon.side.channels import CategoricalChannel, Channel, NumericChannel, TruthTracker
from stream_anon.side.config import SidePathConfig, SideTopics, plan_side_paths
from stream_anon.side.encoding import CopyBatch, copy_dict, copy_template, fill_copies

log = logging.getLogger(__name__)

Out = tuple[str, str, dict[str, Any]]
"""One side message: (topic, key, JSON-ready value)."""


@dataclass(frozen=True)
class SideEvent:
    """Something the shell must log/count: ``kind`` ``budget_exhausted`` | ``kmeans_released`` |
    ``kmeans_skipped``; ``topic``; ``detail`` (message); ``epsilon``."""

    kind: str
    topic: str
    detail: str
    epsilon: float = 0.0


@dataclass
class SideBatch:
    """What one batch of records produced: the encoded per-record ``copies`` (one :class:`CopyBatch` per
    per-record topic), the other ``outputs`` (k-means releases, then estimates) and the ``events``."""

    copies: list[CopyBatch] = field(default_factory=list)
    outputs: list[Out] = field(default_factory=list)
    events: list[SideEvent] = field(default_factory=list)


class SidePathProcessor:
    """Validated records -> perturbed side copies, periodic estimates and windowed DP k-means releases.

    ``process_batch(records)`` returns ``[(topic, key, message), ...]``; ``process_batch_encoded(records)`` the
    same with the copies JSON-encoded (a :class:`SideBatch`).  Every mechanism runs once per attribute per batch
    over the whole column.  Records must already be validated (the side app decodes them with the main path's
    decoder).  ``rng``: a ``numpy.random.Generator`` (or int seed); default ``config.seed``, else OS entropy.
    ``clock``: seconds, for ``estimates_every_seconds``.  Events (k-means releases, budget exhaustion) collect
    until :meth:`drain_events` (``process_batch_encoded`` drains them into its batch).
    """

    def __init__(self, config: SidePathConfig | Mapping[str, Any] | None = None, schema: Schema | None = None, *,
                 topics: SideTopics | None = None, rng: np.random.Generator | int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = cfg = SidePathConfig.coerce(config)
        self.schema = schema if schema is not None else adult_schema()
        self.topics = topics if topics is not None else SideTopics()
        self.rng = secure_rng(rng if rng is not None else cfg.seed)
        self.clock = clock
        self.record_id_field = self.schema.record_id or "id"
        plan = plan_side_paths(cfg, self.schema, self.rng)
        t = self.topics
        self.krr = [CategoricalChannel(t.krr, p) for p in plan.krr]
        self.rs = [CategoricalChannel(t.rs, p) for p in plan.rs]
        self.blap_num = [NumericChannel(t.blap, p) for p in plan.blap_numeric]
        self.blap_cat = [CategoricalChannel(t.blap, p) for p in plan.blap_categorical]
        topic_of = t.per_record()
        self.epsilon_per_record: dict[str, float] = {topic_of[r]: e for r, e in plan.epsilon_per_role.items()}
        self.epsilon_all_topics = plan.epsilon_all
        rs_name = "rs" if cfg.rs.l == 1 else f"rs-l/{cfg.rs.variant}"
        self._mechanism_of = {t.krr: "krr", t.rs: rs_name, t.blap: "blap"}
        self._templates: dict[str, str] = {}
        self._events: list[SideEvent] = []
        self.records_processed = 0
        self.estimate_rounds = 0
        self._since_estimates = 0
        self._last_estimates_at = clock()
        self.truth = TruthTracker() if cfg.truth else None
        if cfg.truth:
            log.warning("side paths: truth tracker ON: exact statistics are computed and published beside the "
                        "estimates; this is NOT private (demo/testing only)")
        # k-means: tumbling windows of the configured attributes, eps per window (+ an optional stream budget)
        k = cfg.kmeans
        self.kmeans_enabled = plan.kmeans is not None
        self.kmeans_stopped = False
        self.kmeans_windows = 0
        self.kmeans_refused = 0
        self._window_fill = 0
        self._window_start = 0
        if plan.kmeans is not None:
            self.kmeans_bounds = (plan.kmeans.lower, plan.kmeans.upper)
            self.kmeans_window_budget = WindowedBudget(epsilon_per_window=k.epsilon)
            self.kmeans_accountant = (BudgetAccountant(total_epsilon=k.total_epsilon)
                                      if k.total_epsilon is not None else None)
            self._window = np.empty((k.window, len(k.attributes)), dtype=np.float64)

    # ------------------------------------------------------------------ views
    def topic_channels(self) -> list[tuple[str, list[Channel]]]:
        """Per-record topic -> its channels, in message order."""
        return [(self.topics.krr, list(self.krr)), (self.topics.rs, list(self.rs)),
                (self.topics.blap, [*self.blap_num, *self.blap_cat])]

    def kmeans_budget(self) -> tuple[float, float]:
        """(total, remaining) eps of the k-means output: the stream budget if configured, else one window's."""
        k = self.config.kmeans
        if not self.kmeans_enabled:
            return 0.0, 0.0
        if self.kmeans_accountant is not None:
            return self.kmeans_accountant.total_epsilon, self.kmeans_accountant.remaining
        return k.epsilon, k.epsilon

    def drain_events(self) -> list[SideEvent]:
        ev, self._events = self._events, []
        return ev

    # ------------------------------------------------------------------ processing
    def process(self, record: Mapping[str, Any], now: float | None = None) -> list[Out]:
        """One validated record -> its side messages (plus any estimates/k-means release it triggers)."""
        return self.process_batch([record], now=now)

    def process_batch(self, records: Sequence[Mapping[str, Any]], now: float | None = None) -> list[Out]:
        """Validated records -> side messages, in order: per-record copies, then k-means, then estimates.

        Estimate rounds fire every ``estimates_every`` records; inside a batch the round is taken at the end
        of the batch (the reports of the whole batch are then included).
        """
        copies: list[Out] = []

        def as_dicts(topic: str, ids: list[str], chans: list[tuple[Channel, list[Any]]]) -> None:
            mech = self._mechanism_of[topic]
            names = [c.attribute for c, _ in chans]
            eps = {c.attribute: c.epsilon for c, _ in chans}
            total = self.epsilon_per_record[topic]
            reported = [c.perturb(col) for c, col in chans]
            for i, row in enumerate(zip(*reported, strict=True)):
                copies.append((topic, ids[i], copy_dict(ids[i], mech, dict(zip(names, row, strict=True)), eps, total,
                                                        self.epsilon_all_topics)))

        rest = self._run_batch(records, now, as_dicts)
        return copies + rest

    def process_batch_encoded(self, records: Sequence[Mapping[str, Any]], now: float | None = None) -> SideBatch:
        """:meth:`process_batch` with the per-record copies JSON-encoded (byte for byte ``json.dumps(...,
        separators=(",", ":"))`` of the same messages), one :class:`CopyBatch` per per-record topic; the events
        of the batch are drained into it."""
        batch = SideBatch()

        def encoded(topic: str, ids: list[str], chans: list[tuple[Channel, list[Any]]]) -> None:
            tmpl = self._templates.get(topic)
            if tmpl is None:
                tmpl = self._templates[topic] = copy_template(
                    self._mechanism_of[topic], {c.attribute: c.epsilon for c, _ in chans},
                    self.epsilon_per_record[topic], self.epsilon_all_topics)
            payloads = fill_copies(tmpl, ids, [c.perturb_json(col) for c, col in chans])
            batch.copies.append(CopyBatch(topic, ids, payloads, self.epsilon_per_record[topic]))

        batch.outputs = self._run_batch(records, now, encoded)
        batch.events = self.drain_events()
        return batch

    def _run_batch(self, records: Sequence[Mapping[str, Any]], now: float | None,
                   emit: Callable[[str, list[str], list[tuple[Channel, list[Any]]]], None]) -> list[Out]:
        """Perturb every per-record topic's columns (``emit(topic, ids, [(channel, column), ...])`` builds the
        copies), then truth, k-means and estimates; returns the k-means and estimate messages."""
        n = len(records)
        if n == 0:
            return self.poll(now)
        rid = self.record_id_field
        ids = [str(r[rid]) for r in records]
        columns: dict[str, list[Any]] = {}

        def column(name: str) -> list[Any]:
            col = columns.get(name)
            if col is None:
                col = columns[name] = [r[name] for r in records]
            return col

        for topic, chans in self.topic_channels():
            if chans:
                emit(topic, ids, [(c, column(c.attribute)) for c in chans])
        if self.truth is not None:
            seen: set[str] = set()
            for c in [*self.krr, *self.rs, *self.blap_cat]:
                if c.attribute not in seen:
                    self.truth.add_categorical(c.attribute, c.codec, column(c.attribute))
                    seen.add(c.attribute)
            for nc in self.blap_num:
                self.truth.add_numeric(nc.attribute, column(nc.attribute))
        self.records_processed += n
        self._since_estimates += n
        out: list[Out] = []
        if self.kmeans_enabled:
            out.extend(self._kmeans_add(np.column_stack(
                [np.asarray(column(a), dtype=np.float64) for a in self.config.kmeans.attributes])))
        every = self.config.estimates_every
        if every and self._since_estimates >= every:
            out.extend(self.emit_estimates(now))
        else:
            out.extend(self.poll(now))
        return out

    def poll(self, now: float | None = None) -> list[Out]:
        """Time trigger: estimates when ``estimates_every_seconds`` passed and new records arrived."""
        secs = self.config.estimates_every_seconds
        t = self.clock() if now is None else now
        if secs is not None and self._since_estimates > 0 and t - self._last_estimates_at >= secs:
            return self.emit_estimates(t)
        return []

    def flush(self, now: float | None = None, *, partial_kmeans: bool = True) -> list[Out]:
        """End of stream: a final round of estimates, and the partial k-means window if it is large enough."""
        out: list[Out] = []
        k = self.config.kmeans
        if partial_kmeans and self.kmeans_enabled and self._window_fill >= max(k.min_partial_window, k.n_clusters, 2):
            out.extend(self._kmeans_release(self._window[:self._window_fill]))
            self._window_start += self._window_fill
            self._window_fill = 0
        if self._since_estimates > 0 or self.estimate_rounds == 0:
            out.extend(self.emit_estimates(now))
        return out

    # ------------------------------------------------------------------ estimates
    def emit_estimates(self, now: float | None = None) -> list[Out]:
        """One round of estimates: one message per (mechanism, attribute); spends no eps (post-processing)."""
        self._last_estimates_at = self.clock() if now is None else now
        self._since_estimates = 0
        if self.records_processed == 0:
            return []
        self.estimate_rounds += 1
        topic = self.topics.estimates
        base = {"round": self.estimate_rounds, "records_seen": self.records_processed, "additional_epsilon": 0.0}
        out: list[Out] = [(topic, f"{c.mechanism}/{c.attribute}", self._frequency_message(c, base))
                          for c in [*self.krr, *self.rs, *self.blap_cat]]
        out += [(topic, f"blap/{nc.attribute}", self._mean_message(nc, base)) for nc in self.blap_num]
        return out

    def _frequency_message(self, c: CategoricalChannel, base: dict[str, Any]) -> dict[str, Any]:
        est = c.estimate()
        fse = est.frequency_std_errors
        msg: dict[str, Any] = {
            "type": "frequency", "source_topic": c.topic, "mechanism": c.mechanism, "attribute": c.attribute,
            **base, "n": est.n, "epsilon": c.epsilon, "reports_per_record": c.l,
            "categories": [str(x) for x in est.categories],
            "report_counts": c.report_counts.tolist(),
            "counts": est.counts.tolist(), "std_errors": est.std_errors.tolist(),
            "frequencies": est.frequencies.tolist(), "frequency_std_errors": fse.tolist(),
            "standard_error": float(fse.max()) if fse.size else math.nan,
            "params": {k: v for k, v in est.extra.items() if isinstance(v, int | float)},
        }
        if self.truth is not None:
            true_counts = self.truth.counts.get(c.attribute)
            if true_counts is not None and true_counts.sum() > 0:
                f_true = true_counts / true_counts.sum()
                diff = est.frequencies - f_true
                msg["truth"] = {
                    "frequencies": f_true.tolist(),
                    "abs_error": float(np.mean(np.abs(diff))),
                    "max_abs_error": float(np.max(np.abs(diff))),
                    "max_z": float(np.max(np.abs(est.counts - true_counts) / np.maximum(est.std_errors, 1e-12))),
                }
        return msg

    def _mean_message(self, nc: NumericChannel, base: dict[str, Any]) -> dict[str, Any]:
        mean, se = nc.estimate()
        m = nc.mech
        msg: dict[str, Any] = {
            "type": "mean", "source_topic": nc.topic, "mechanism": "blap", "attribute": nc.attribute, **base,
            "n": nc.n, "epsilon": nc.epsilon, "mean": _finite(mean), "std_error": _finite(se),
            "standard_error": _finite(se), "method": "boundary-corrected",
            "max_bias": m.max_transform_bias(boundary_width=nc.boundary_width),
            "params": {"lower": m.lower, "upper": m.upper, "scale": m.scale, "boundary_width": nc.boundary_width},
        }
        if self.truth is not None:
            tm = self.truth.mean(nc.attribute)
            msg["truth"] = {"mean": tm, "abs_error": abs(mean - tm), "z": abs(mean - tm) / se if se and se > 0 else math.nan}
        return msg

    # ------------------------------------------------------------------ k-means
    def _kmeans_add(self, x: np.ndarray) -> list[Out]:
        out: list[Out] = []
        w = self._window.shape[0]
        i = 0
        while i < x.shape[0]:
            take = min(w - self._window_fill, x.shape[0] - i)
            if not self.kmeans_stopped:
                self._window[self._window_fill:self._window_fill + take] = x[i:i + take]
            self._window_fill += take
            i += take
            if self._window_fill == w:
                out.extend(self._kmeans_release(self._window))
                self._window_start += w
                self._window_fill = 0
        return out

    def _kmeans_release(self, data: np.ndarray) -> list[Out]:
        k = self.config.kmeans
        topic = self.topics.kmeans
        index = self.kmeans_windows + self.kmeans_refused
        n = int(data.shape[0])
        if self.kmeans_stopped:
            self.kmeans_refused += 1
            self._events.append(SideEvent("kmeans_skipped", topic, f"{topic}: window {index} ({n} records) not "
                                                                    f"released: the k-means budget is exhausted"))
            return []
        if self.kmeans_accountant is not None:
            try:
                self.kmeans_accountant.spend(k.epsilon, f"{topic} window {index}")
            except BudgetExhaustedError as e:
                self.kmeans_stopped = True
                self.kmeans_refused += 1
                text = (f"{topic}: DP k-means output STOPPED at window {index}: {e}. No further windows are "
                        f"released; raise side_paths.kmeans.total_epsilon (now {k.total_epsilon:g}) and restart "
                        f"to resume")
                log.error(text)
                self._events.append(SideEvent("budget_exhausted", topic, text))
                return []
        km = QuadTreeKMeans(n_clusters=k.n_clusters, epsilon=k.epsilon, bounds=self.kmeans_bounds, gamma=k.gamma,
                            variant=k.variant, rng=self.rng)  # type: ignore[arg-type]
        # per-window budget: the tree and the leaf counts, both charged to this window
        self.kmeans_window_budget.spend(km.epsilon_tree, "quadtree", window=index)
        self.kmeans_window_budget.spend(km.epsilon_counts, "leaf counts", window=index)
        km.fit(data)
        assert km.cluster_centers_ is not None
        self.kmeans_windows += 1
        total, remaining = self.kmeans_budget()
        msg: dict[str, Any] = {
            "type": "kmeans", "window": index, "window_start_record": self._window_start, "n_records": n,
            "attributes": list(k.attributes),
            "bounds": {a: [float(lo), float(hi)] for a, lo, hi in zip(k.attributes, *self.kmeans_bounds, strict=True)},
            "n_clusters": k.n_clusters, "centroids": km.cluster_centers_.tolist(), "variant": k.variant,
            "gamma": k.gamma, "epsilon": km.epsilon, "epsilon_tree": km.epsilon_tree,
            "epsilon_counts": km.epsilon_counts, "leaves": len(km.leaves_) if km.leaves_ is not None else 0,
            "fallback": km.fallback_,
            "budget": {"scope": "stream" if self.kmeans_accountant is not None else "window",
                       "total": total, "remaining": remaining},
        }
        if self.truth is not None:
            msg["truth"] = {"nicv": nicv(data, km.cluster_centers_)}
        self._events.append(SideEvent("kmeans_released", topic, f"window {index}", km.epsilon))
        return [(topic, f"window-{index}", msg)]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
