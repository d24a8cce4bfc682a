"""Local-differential-privacy side paths, pure: validated records in, side messages out (no Kafka, no metrics).

For every input record :class:`SidePathProcessor` publishes perturbed copies:

* ``adult.krr``: k-ary randomized response (Kairouz et al. 2014; Wang et al. 2017) of the configured
  categorical attributes, ``p = e^eps / (e^eps + k - 1)``;
* ``adult.rs``: FRAPP random substitution (Agrawal & Haritsa 2005) with ``gamma = e^eps``, or its
  l-extended form (Kang, Lee & Hong 2009, ``l`` reports per attribute, exact eps of the variant);
* ``adult.blap``: bounded Laplace on the public grid of each numeric attribute's schema domain (Holohan et al.
  2020; KR 10-2456177; the integer grid for integer attributes) and the discretized bounded Laplace for the
  configured ordinal/categorical attributes.

Every copy carries, all COMPUTED from the mechanisms as configured (:mod:`stream_anon.privacy.accounting`) and
rounded up: the exact eps of each attribute, their sum (``epsilon_total``, sequential composition, Dwork & Roth
Thm 3.16) and the record's total over all side outputs (``epsilon_all_side_topics``: the three topics plus the exact
eps of the k-means window the record is in).  A copy's key and ``id`` are the record's keyed pseudonym
(HMAC-SHA256 of the record id under ``release.secret``, :class:`~stream_anon.formats.release.Pseudonymizer`), never
the record id; with ``pseudonyms: false`` there is no key and no ``id``, and each batch's copies of each topic are
published in an independent random order (drawn from the noise generator), so that positions do not join them
across topics.  Grouping one record's copies (by pseudonym, or by position) composes their eps: the per-record
total.

Server-side aggregators keep only report histograms and running moments (bounded state) and every
``estimates_every`` records (or ``estimates_every_seconds``) publish ``adult.estimates``: unbiased frequency
estimates with standard errors (k-RR / RS / discretized bounded Laplace) and boundary-corrected debiased means with
standard errors (bounded Laplace).  Estimates are post-processing of the reports: they spend no additional eps.
``adult.kmeans`` releases DP k-means centroids (QuadkDP / UniQuadkDP, Goo et al. 2018) of each tumbling window of
``window`` records in the schema's public box, calibrated for replace-one neighbours (the window size is public)
and stating the window's exact eps; an optional stream budget (``kmeans.total_epsilon``) is charged per window and,
once exhausted, stops that output with an error log and an event (never silently).

Cumulative budgets (the lifetime cap ``person_budget.cap_epsilon`` of each person, or of each record id when the
schema has no person id, and the k-means stream budget with the window counter) live in
:class:`~stream_anon.side.budgets.SideBudgets`, keyed by the input topic (``scope``):
:meth:`SidePathProcessor.take_budget_updates` gives their changed state, which the shell persists BEFORE it publishes
the batch's outputs, and :meth:`SidePathProcessor.open_budgets` loads it at start.  A record whose person (or id)
would exceed its lifetime cap gets no side output at all (counted in ``skipped``): replaying the same records, or
reading them again under another consumer group, publishes no copy beyond the cap.

All noise (and the shuffle) comes from one injected generator: ChaCha20 keyed from OS entropy by default
(:func:`~stream_anon.privacy.base.crypto_rng`); a seed only in tests and benchmarks.

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

from stream_anon.config.side_paths import (
    SidePathConfig,
    SidePathConfigError,
    SideTopics,
    kmeans_mechanism,
    plan_side_paths,
    with_schema_attributes,
)
from stream_anon.core.schema import Schema, adult_schema
from stream_anon.formats.release import canonical_id_bytes
from stream_anon.privacy.base import crypto_rng
from stream_anon.privacy.budget import BudgetExhaustedError, BudgetSpend, WindowedBudget
from stream_anon.privacy.dp_kmeans import nicv
from stream_anon.side.budgets import BudgetAnchor, BudgetOpening, SideBudgets
from stream_anon.side.channels import CategoricalChannel, Channel, NumericChannel, TruthTracker
from stream_anon.side.encoding import CopyBatch, copy_dict, copy_template, fill_copies

log = logging.getLogger(__name__)

Out = tuple[str, str | None, dict[str, Any]]
"""One side message: (topic, key or None, JSON-ready value)."""

SKIP_PERSON_BUDGET = "person_budget"
"""Skip reason of a record whose person (or record id) would exceed its lifetime cap ``person_budget.cap_epsilon``."""
SKIP_BAD_PERSON_ID = "bad_person_id"
"""Skip reason of a record whose person id is neither an integer nor a non-empty string (the cap cannot count it)."""


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
    per-record topic), the other ``outputs`` (k-means releases, then estimates), the ``events`` and the records
    ``skipped`` by reason (the per-person cap)."""

    copies: list[CopyBatch] = field(default_factory=list)
    outputs: list[Out] = field(default_factory=list)
    events: list[SideEvent] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def _is_person_id(value: Any) -> bool:
    return (type(value) is int) or (type(value) is str and value != "")


class SidePathProcessor:
    """Validated records -> perturbed side copies, periodic estimates and windowed DP k-means releases.

    ``process_batch(records)`` returns ``[(topic, key, message), ...]``; ``process_batch_encoded(records)`` the
    same with the copies JSON-encoded (a :class:`SideBatch`).  Every mechanism runs once per attribute per batch
    over the whole column.  Records must already be validated (the side app decodes them with the main path's
    decoder, :class:`~stream_anon.side.decoding.SideDecoder`).

    ``rng``: a ``numpy.random.Generator`` (or an int seed: a reproducible ChaCha20 stream, tests only); default
    ``config.seed`` (refused at config load unless ``allow_seeded_noise``), else ChaCha20 from OS entropy.
    ``pseudonymize``: record id -> pseudonym, required with ``pseudonyms`` on (the side app passes
    ``stream_anon.formats.release.Pseudonymizer(release secret)``; this module stays pure).  ``scope``: prefix of the
    budget state keys (the input topic: budgets belong to the data).  ``clock``: seconds, for ``estimates_every_seconds``.  Events (k-means releases,
    budget exhaustion) collect until :meth:`drain_events` (``process_batch_encoded`` drains them into its batch).
    """

    def __init__(self, config: SidePathConfig | Mapping[str, Any] | None = None, schema: Schema | None = None, *,
                 topics: SideTopics | None = None, rng: np.random.Generator | int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 pseudonymize: Callable[[Any], str] | None = None, scope: str = "side") -> None:
        self.schema = schema if schema is not None else adult_schema()
        self.config = cfg = with_schema_attributes(SidePathConfig.coerce(config), self.schema)  # lists given or declared
        self.topics = topics if topics is not None else SideTopics()
        self.rng = crypto_rng(rng if rng is not None else cfg.seed)
        self.clock = clock
        self.record_id_field = self.schema.record_id or "id"
        plan = self.plan = plan_side_paths(cfg, self.schema, self.rng)
        t = self.topics
        self.krr = [CategoricalChannel(t.krr, p) for p in plan.krr]
        self.rs = [CategoricalChannel(t.rs, p) for p in plan.rs]
        self.blap_num = [NumericChannel(t.blap, p) for p in plan.blap_numeric]
        self.blap_cat = [CategoricalChannel(t.blap, p) for p in plan.blap_categorical]
        topic_of = t.per_record()
        self.epsilon_per_record: dict[str, float] = {topic_of[r]: e for r, e in plan.epsilon_per_role.items()}
        self.epsilon_kmeans = plan.epsilon_kmeans  # what a record spends through its k-means window
        self.epsilon_all_topics = plan.epsilon_all  # one record's exact eps over all side outputs
        rs_name = "rs" if cfg.rs.l == 1 else f"rs-l/{cfg.rs.variant}"
        self._mechanism_of = {t.krr: "krr", t.rs: rs_name, t.blap: "blap"}
        self._templates: dict[str, str] = {}
        self._events: list[SideEvent] = []
        self._skipped: dict[str, int] = {}  # this batch's skipped records (drained into its SideBatch)
        self.skipped: dict[str, int] = {}  # all skipped records, by reason
        self.records_processed = 0
        self.estimate_rounds = 0
        self._since_estimates = 0
        self._last_estimates_at = clock()
        if cfg.pseudonyms and pseudonymize is None:
            raise SidePathConfigError("side paths: side_paths.pseudonyms is true but no pseudonym function was given "
                                      "(pass pseudonymize=Pseudonymizer(release secret))")
        self.pseudonym = pseudonymize if cfg.pseudonyms else None
        pb = cfg.person_budget
        # the lifetime cap counts per person, else per record id (the key is hashed with the sketch's own secret)
        self.person_field = (self.schema.person_id or self.schema.record_id) if pb.cap_epsilon is not None else None
        self._by_record_id = self.person_field is not None and self.schema.person_id is None
        self.budgets = SideBudgets(scope=scope, kmeans_total=cfg.kmeans.total_epsilon if plan.kmeans else None,
                                   kmeans_windows=plan.kmeans is not None, person_cap=pb.cap_epsilon,
                                   person_width=pb.width, person_depth=pb.depth,
                                   # the sketch's hash key from the injected generator (secure by default, so a
                                   # seeded test's false refusals are reproducible); a restored state brings its own
                                   person_key=self.rng.bytes(32) if pb.cap_epsilon is not None else None)
        self.truth = TruthTracker() if cfg.truth else None
        if cfg.truth:
            log.warning("side paths: truth tracker ON: exact statistics are computed and published beside the "
                        "estimates; this is NOT private (demo/testing only)")
        # k-means: tumbling windows of the configured attributes, exact eps per window (+ an optional stream budget)
        k = cfg.kmeans
        self.kmeans_enabled = plan.kmeans is not None
        self.kmeans_attributes: list[str] = plan.kmeans.attributes if plan.kmeans is not None else []
        self.kmeans_stopped = False
        self.kmeans_windows = 0
        self.kmeans_refused = 0
        self._window_fill = 0
        self._window_start = 0
        if plan.kmeans is not None:
            self.kmeans_bounds = (plan.kmeans.lower, plan.kmeans.upper)
            self.kmeans_window_budget = WindowedBudget(epsilon_per_window=plan.kmeans.epsilon)
            self._window = np.empty((k.window, len(self.kmeans_attributes)), dtype=np.float64)

    # ------------------------------------------------------------------ views
    def topic_channels(self) -> list[tuple[str, list[Channel]]]:
        """Per-record topic -> its channels, in message order."""
        return [(self.topics.krr, list(self.krr)), (self.topics.rs, list(self.rs)),
                (self.topics.blap, [*self.blap_num, *self.blap_cat])]

    @property
    def kmeans_accountant(self) -> Any:
        """The k-means stream budget (a ``BudgetAccountant``), or None."""
        return self.budgets.kmeans

    def kmeans_budget(self) -> tuple[float, float]:
        """(total, remaining) eps of the k-means output for the future: the stream budget if configured, else one
        window's (each window has its own, fresh budget)."""
        if not self.kmeans_enabled:
            return 0.0, 0.0
        acc = self.budgets.kmeans
        if acc is not None:
            return acc.total_epsilon, acc.remaining
        return self.epsilon_kmeans, self.epsilon_kmeans

    def drain_events(self) -> list[SideEvent]:
        ev, self._events = self._events, []
        return ev

    # ------------------------------------------------------------------ budgets
    def restore_budgets(self, records: Mapping[str, bytes]) -> None:
        """Load the persisted state of the cumulative budgets (key -> latest value; no anchor: tests and tools);
        raises :class:`~stream_anon.side.budgets.SideStateError` when it cannot be used.  Call before the first
        batch."""
        self.open_budgets(records)

    def open_budgets(self, records: Mapping[str, bytes], *, anchor: BudgetAnchor | None = None,
                     outputs_exist: Callable[[], str | None] = lambda: None, new_budget: bool = False,
                     when: str = "", where: str = "the budget topic") -> BudgetOpening:
        """:meth:`SideBudgets.open <stream_anon.side.budgets.SideBudgets.open>`: restore, refuse
        (:class:`~stream_anon.side.budgets.BudgetRefusedError`) or start a first or new budget; then stop the
        k-means output when its restored stream budget cannot pay one more window.  Call before the first batch."""
        opening = self.budgets.open(records, anchor=anchor, outputs_exist=outputs_exist, new_budget=new_budget,
                                    when=when, where=where)
        acc = self.budgets.kmeans
        if acc is not None and not acc.can_spend(self.epsilon_kmeans):
            self.kmeans_stopped = True
            log.error("%s: DP k-means output stays STOPPED: the persisted stream budget has %.6g of "
                      "side_paths.kmeans.total_epsilon = %.6g left, less than one window's exact eps %r",
                      self.topics.kmeans, acc.remaining, acc.total_epsilon, self.epsilon_kmeans)
        return opening

    def take_budget_updates(self) -> dict[str, bytes]:
        """State records of the budgets changed since the last call: persist them (and wait for the
        acknowledgement) BEFORE publishing the outputs of the batches processed since."""
        return self.budgets.take_updates()

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

        def as_dicts(topic: str, pseudonyms: list[str] | None, chans: list[tuple[Channel, list[Any]]]) -> None:
            mech = self._mechanism_of[topic]
            names = [c.attribute for c, _ in chans]
            eps = {c.attribute: c.epsilon for c, _ in chans}
            total = self.epsilon_per_record[topic]
            rows = list(zip(*[c.perturb(col) for c, col in chans], strict=True))
            if pseudonyms is None:
                rows = [rows[i] for i in self.rng.permutation(len(rows)).tolist()]
            for i, row in enumerate(rows):
                pid = None if pseudonyms is None else pseudonyms[i]
                copies.append((topic, pid, copy_dict(pid, mech, dict(zip(names, row, strict=True)), eps, total,
                                                     self.epsilon_all_topics)))

        rest = self._run_batch(records, now, as_dicts)
        self._skipped = {}
        return copies + rest

    def process_batch_encoded(self, records: Sequence[Mapping[str, Any]], now: float | None = None) -> SideBatch:
        """:meth:`process_batch` with the per-record copies JSON-encoded (byte for byte ``json.dumps(...,
        separators=(",", ":"))`` of the same messages), one :class:`CopyBatch` per per-record topic; the events
        and skipped records of the batch are drained into it."""
        batch = SideBatch()
        keys: list[bytes | None] = []

        def encoded(topic: str, pseudonyms: list[str] | None, chans: list[tuple[Channel, list[Any]]]) -> None:
            tmpl = self._templates.get(topic)
            if tmpl is None:
                tmpl = self._templates[topic] = copy_template(
                    self._mechanism_of[topic], {c.attribute: c.epsilon for c, _ in chans},
                    self.epsilon_per_record[topic], self.epsilon_all_topics, with_id=pseudonyms is not None)
            payloads = fill_copies(tmpl, pseudonyms, [c.perturb_json(col) for c, col in chans])
            if pseudonyms is None:
                perm = self.rng.permutation(len(payloads)).tolist()
                payloads = [payloads[i] for i in perm]
                batch.copies.append(CopyBatch(topic, [None] * len(payloads), payloads, self.epsilon_per_record[topic]))
                return
            if not keys:
                keys.extend(p.encode() for p in pseudonyms)
            batch.copies.append(CopyBatch(topic, keys, payloads, self.epsilon_per_record[topic]))

        batch.outputs = self._run_batch(records, now, encoded)
        batch.events = self.drain_events()
        batch.skipped, self._skipped = self._skipped, {}
        return batch

    def _skip(self, reason: str, count: int) -> None:
        if count:
            self._skipped[reason] = self._skipped.get(reason, 0) + count
            self.skipped[reason] = self.skipped.get(reason, 0) + count

    def _admit(self, records: Sequence[Mapping[str, Any]]) -> Sequence[Mapping[str, Any]]:
        """The records whose person may still spend one record's total eps (all of them without a per-person
        cap); the others are skipped, never perturbed."""
        pf = self.person_field
        if pf is None or not records:
            return records
        if self._by_record_id:  # validated records have an id: its canonical bytes are the key
            keys: list[Any] = [canonical_id_bytes(r[pf]) for r in records]
        else:
            ok_id = [_is_person_id(r[pf]) for r in records]
            if not all(ok_id):
                self._skip(SKIP_BAD_PERSON_ID, ok_id.count(False))
                records = [r for r, ok in zip(records, ok_id, strict=True) if ok]
            keys = [r[pf] for r in records]
        if not records:
            return records
        mask = self.budgets.spend_person(keys, self.epsilon_all_topics)
        refused = int(mask.size - mask.sum())
        if refused:
            self._skip(SKIP_PERSON_BUDGET, refused)
            records = [r for r, ok in zip(records, mask.tolist(), strict=True) if ok]
        return records

    def _run_batch(self, records: Sequence[Mapping[str, Any]], now: float | None,
                   emit: Callable[[str, list[str] | None, list[tuple[Channel, list[Any]]]], None]) -> list[Out]:
        """Perturb every per-record topic's columns (``emit(topic, pseudonyms, [(channel, column), ...])`` builds
        the copies), then truth, k-means and estimates; returns the k-means and estimate messages."""
        records = self._admit(records)
        n = len(records)
        if n == 0:
            return self.poll(now)
        pseudonyms = None
        if self.pseudonym is not None:
            rid, pseudonym = self.record_id_field, self.pseudonym
            pseudonyms = [pseudonym(r[rid]) for r in records]
        columns: dict[str, list[Any]] = {}

        def column(name: str) -> list[Any]:
            col = columns.get(name)
            if col is None:
                col = columns[name] = [r[name] for r in records]
            return col

        for topic, chans in self.topic_channels():
            if chans:
                emit(topic, pseudonyms, [(c, column(c.attribute)) for c in chans])
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
                [np.asarray(column(a), dtype=np.float64) for a in self.kmeans_attributes])))
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
        index = self.budgets.take_window()  # persisted: ids never repeat across restarts
        n = int(data.shape[0])
        if self.kmeans_stopped:
            self.kmeans_refused += 1
            self._events.append(SideEvent("kmeans_skipped", topic, f"{topic}: window {index} ({n} records) not "
                                                                    f"released: the k-means budget is exhausted"))
            return []
        km = kmeans_mechanism(k, *self.kmeans_bounds, self.rng)
        eps = float(km.exact_epsilon)  # this window's exact eps (replace-one), computed from its noise scales
        stream: BudgetSpend | None = None
        if self.budgets.kmeans is not None:
            try:
                stream = self.budgets.spend_kmeans(eps, f"{topic} window {index}")
            except BudgetExhaustedError as e:
                self.kmeans_stopped = True
                self.kmeans_refused += 1
                text = (f"{topic}: DP k-means output STOPPED at window {index}: {e}. No further windows are "
                        f"released; the spent budget is persisted, so a restart does not reset it (raising "
                        f"side_paths.kmeans.total_epsilon, now {k.total_epsilon:g}, releases more: their eps adds up)")
                log.error(text)
                self._events.append(SideEvent("budget_exhausted", topic, text))
                return []
        # the window's own budget: its tree and its leaf counts (the tree spends nothing when max_depth = 1)
        window: BudgetSpend | None = None
        for part, label in ((km.epsilon_tree, "quadtree"), (km.epsilon_counts, "leaf counts")):
            if part > 0.0:
                window = self.kmeans_window_budget.spend(part, label, window=index)
        assert window is not None
        km.fit(data)
        assert km.cluster_centers_ is not None
        self.kmeans_windows += 1
        budget = ({"scope": "stream", "total": stream.total, "spent": stream.spent_after,
                   "remaining": stream.remaining_after} if stream is not None else
                  {"scope": "window", "total": window.total, "spent": window.spent_after,
                   "remaining": window.remaining_after})
        msg: dict[str, Any] = {
            "type": "kmeans", "window": index, "window_start_record": self._window_start, "n_records": n,
            "attributes": list(self.kmeans_attributes),
            "bounds": {a: [float(lo), float(hi)] for a, lo, hi in zip(self.kmeans_attributes, *self.kmeans_bounds,
                                                                       strict=True)},
            "n_clusters": k.n_clusters, "centroids": km.cluster_centers_.tolist(), "variant": k.variant,
            "gamma": k.gamma, "neighbouring": km.neighbouring, "max_depth": km.max_depth_, "epsilon": eps,
            "epsilon_tree": km.epsilon_tree, "epsilon_counts": km.epsilon_counts,
            "leaves": len(km.leaves_) if km.leaves_ is not None else 0, "fallback": km.fallback_, "budget": budget,
        }
        if self.truth is not None:
            msg["truth"] = {"nicv": nicv(data, km.cluster_centers_)}
        self._events.append(SideEvent("kmeans_released", topic, f"window {index}", eps))
        return [(topic, f"window-{index}", msg)]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
