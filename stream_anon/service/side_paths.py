"""Local-differential-privacy side paths, pure: validated records in, side-topic messages out.

No Kafka and no Prometheus here (the Kafka loop is :mod:`stream_anon.service.side_app`).  For every input
record :class:`SidePathProcessor` publishes perturbed copies:

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

import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _encode_basestring_ascii
from typing import TYPE_CHECKING, Any

import numpy as np

from stream_anon.core.schema import Kind, Schema, adult_schema
from stream_anon.privacy.base import secure_rng
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.budget import BudgetAccountant, BudgetExhaustedError, WindowedBudget
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans, nicv
from stream_anon.privacy.frequency import CategoryCodec, FrequencyEstimate
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import LExtendedSubstitution, RandomSubstitution, gamma_for_epsilon

if TYPE_CHECKING:  # pragma: no cover
    from stream_anon.service.metrics import ServiceMetrics

log = logging.getLogger(__name__)

Out = tuple[str, str, dict[str, Any]]
"""One side message: (topic, key, JSON-ready value)."""


@dataclass
class CopyBatch:
    """The per-record copies of one batch on one topic, already JSON-encoded: ``payloads[i]`` is the message of
    record ``ids[i]`` (its key), byte for byte ``json.dumps(message, separators=(",", ":"))`` of the message
    :meth:`SidePathProcessor.process_batch` returns; every one spent ``epsilon_total``."""

    topic: str
    ids: list[str]
    payloads: list[bytes]
    epsilon_total: float

    def __len__(self) -> int:
        return len(self.ids)


class SidePathConfigError(ValueError):
    """A side-path option is invalid (the message names the option, the allowed values and the value)."""


# ============================================================================================ configuration
@dataclass
class KRRConfig:
    """k-RR copies on ``adult.krr``: ``epsilon`` per attribute, or ``record_epsilon`` split equally."""

    enabled: bool = True
    attributes: list[str] = field(
        default_factory=lambda: ["sex", "race", "marital-status", "relationship", "workclass"])
    epsilon: float = 1.0
    record_epsilon: float | None = None  # set: every attribute gets record_epsilon / len(attributes)


@dataclass
class RSConfig:
    """Random substitution copies on ``adult.rs``.

    ``epsilon`` is the exact eps per attribute (gamma derived: ``e^eps`` for l = 1, ``e^(eps/l)`` for
    independent l-extended, bisection on the exact eps for ``no-repeat``); ``gamma`` overrides it and the
    honest eps of that gamma is then reported.  ``l`` > 1: l-extended substitution, ``variant``
    ``independent`` | ``no-repeat``.
    """

    enabled: bool = True
    attributes: list[str] = field(default_factory=lambda: ["education", "occupation"])
    epsilon: float = 1.0
    gamma: float | None = None
    l: int = 1  # noqa: E741
    variant: str = "independent"
    record_epsilon: float | None = None


@dataclass
class BLapConfig:
    """Bounded Laplace copies on ``adult.blap``: numeric ``attributes`` (schema public bounds) and
    ``categorical_attributes`` through the discretized bounded Laplace (categories in schema order)."""

    enabled: bool = True
    attributes: list[str] = field(default_factory=lambda: ["age", "hours-per-week", "education-num"])
    categorical_attributes: list[str] = field(default_factory=lambda: ["income"])
    epsilon: float = 1.0
    record_epsilon: float | None = None
    snap_bits: int | None = None  # round outputs to 2^-snap_bits on [-1, 1] (Mironov 2012 mitigation)
    boundary_width: float = 0.1  # of the boundary-corrected mean estimator (normalized units)


@dataclass
class KMeansConfig:
    """Windowed DP k-means on ``adult.kmeans``: ``epsilon`` per tumbling window of ``window`` records.

    ``total_epsilon``: optional stream budget charged ``epsilon`` per window (use it when individuals recur
    across windows); None = each record is in exactly one window (parallel composition).
    """

    enabled: bool = True
    attributes: list[str] = field(default_factory=lambda: ["age", "hours-per-week"])
    n_clusters: int = 3
    epsilon: float = 1.0
    gamma: float = 0.5
    window: int = 5000
    variant: str = "uniquad"
    total_epsilon: float | None = None
    min_partial_window: int = 500  # at an end-of-stream flush, a partial window this large is released


@dataclass
class SidePathConfig:
    """All side-path settings; nest it in the service config as ``side_paths: SidePathConfig``."""

    enabled: bool = True
    group_id: str | None = None  # None: "<kafka.group_id>-ldp"
    krr: KRRConfig = field(default_factory=KRRConfig)
    rs: RSConfig = field(default_factory=RSConfig)
    blap: BLapConfig = field(default_factory=BLapConfig)
    kmeans: KMeansConfig = field(default_factory=KMeansConfig)
    estimates_every: int = 5000  # records between two rounds of estimates (0 = only at flush/timer)
    estimates_every_seconds: float | None = 60.0  # also publish after this long with new records
    total_epsilon: float | None = None  # cap on one record's eps summed over all side topics (None = no cap)
    truth: bool = False  # exact statistics beside the estimates (NOT private: demo/testing only)
    dead_letter: bool = False  # also dead-letter bad input (off: the main path already does; count + skip)
    seed: int | None = None  # None = OS entropy
    sender_processes: int = 3  # child processes producing the side messages; 0 = the side app's own thread

    def check(self, schema: Schema | None = None) -> None:
        """Validate against ``schema`` (default ADULT) at start: raises :class:`SidePathConfigError` (or the
        mechanisms' ``PrivacyParameterError``) naming the option, the allowed values and the value."""
        SidePathProcessor(self, schema, rng=0)

    @classmethod
    def coerce(cls, obj: Any) -> SidePathConfig:
        """A ``SidePathConfig`` from itself, a mapping, or any dataclass with (a subset of) the same fields."""
        if isinstance(obj, SidePathConfig):
            return obj
        if obj is None:
            return cls()
        data = dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) and not isinstance(obj, type) else obj
        if not isinstance(data, Mapping):
            raise SidePathConfigError(f"side_paths: expected a mapping or SidePathConfig, got {type(obj).__name__}")
        return _from_mapping(cls, data, "side_paths")


def _from_mapping(cls: Any, data: Mapping[str, Any], prefix: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in fields:
            raise SidePathConfigError(f"unknown option {prefix}.{name}; {prefix} has {sorted(fields)}")
        default = getattr(cls(), name)
        if dataclasses.is_dataclass(default) and isinstance(value, Mapping):
            kwargs[name] = _from_mapping(type(default), value, f"{prefix}.{name}")
        else:
            kwargs[name] = list(value) if isinstance(value, tuple) else value
    return cls(**kwargs)


@dataclass(frozen=True)
class SideTopics:
    """Side topic names (defaults for input ``adult.raw``)."""

    krr: str = "adult.krr"
    rs: str = "adult.rs"
    blap: str = "adult.blap"
    estimates: str = "adult.estimates"
    kmeans: str = "adult.kmeans"
    dlq: str = "adult.dlq"

    @classmethod
    def from_any(cls, obj: Any) -> SideTopics:
        """From itself, a mapping, or the service's ``TopicSettings`` (attributes krr, rs, ...)."""
        if obj is None:
            return cls()
        if isinstance(obj, SideTopics):
            return obj
        names = [f.name for f in dataclasses.fields(cls)]
        if isinstance(obj, Mapping):
            return cls(**{k: str(obj[k]) for k in names if k in obj})
        return cls(**{k: str(getattr(obj, k)) for k in names if hasattr(obj, k)})


def _err(option: str, allowed: str, value: Any) -> SidePathConfigError:
    return SidePathConfigError(f"option side_paths.{option}: expected {allowed}, got {value!r}")


def _positive(option: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < float(value) < math.inf):
        raise _err(option, "a number in (0, inf)", value)
    return float(value)


def _split(option: str, per_attribute: float, record_epsilon: float | None, n: int) -> float:
    """eps per attribute: ``record_epsilon / n`` when a per-record budget is split, else ``per_attribute``."""
    if record_epsilon is None:
        return _positive(f"{option}.epsilon", per_attribute)
    return _positive(f"{option}.record_epsilon", record_epsilon) / max(n, 1)


# ============================================================================================ channels
class _CategoricalChannel:
    """One categorical attribute through one frequency-oracle mechanism, with its report histogram."""

    def __init__(self, topic: str, mechanism: str, attribute: str, categories: Sequence[str], mech: Any,
                 epsilon: float, reports_per_record: int = 1) -> None:
        self.topic = topic
        self.mechanism = mechanism
        self.attribute = attribute
        self.codec = CategoryCodec(list(categories), name=f"categories of {attribute!r}")
        self.mech = mech
        self.epsilon = float(epsilon)
        self.l = reports_per_record
        self.report_counts = np.zeros(self.codec.k, dtype=np.float64)
        self.n = 0
        self._json = np.empty(self.codec.k, dtype=object)  # category code -> its JSON text
        self._json[:] = [json.dumps(c) for c in categories]

    def perturb(self, values: Sequence[Any]) -> list[Any]:
        """Reported categories: (n,) -> list of labels; (n, l) -> list of lists."""
        return self.codec.decode(self.perturb_codes(values)).tolist()  # type: ignore[no-any-return]

    def perturb_json(self, values: Sequence[Any]) -> list[str]:
        """Reported categories as JSON texts, one per record (``json.dumps`` of :meth:`perturb`'s items)."""
        frag = self._json[self.perturb_codes(values)]
        if frag.ndim == 1:
            return frag.tolist()  # type: ignore[no-any-return]
        return ["[" + ",".join(row) + "]" for row in frag.tolist()]

    def perturb_codes(self, values: Sequence[Any]) -> np.ndarray:
        """Randomize the codes of ``values`` and add the reports to the histogram: (n,) or (n, l) codes."""
        codes = self.codec.encode(np.asarray(values, dtype=object))
        if codes.size and codes.min() < 0:
            bad = np.asarray(values, dtype=object)[codes < 0][0]
            raise SidePathConfigError(f"field {self.attribute!r}: {bad!r} is outside the domain "
                                      f"({self.codec.describe()}); records must be validated first")
        if self.mechanism == "blap-cat":
            rep = self.mech.randomise_indices(codes)
        else:
            rep = self.mech.randomise_codes(codes)
        self.report_counts += np.bincount(rep.reshape(-1), minlength=self.codec.k)
        self.n += int(codes.size)
        return rep  # type: ignore[no-any-return]

    def estimate(self) -> FrequencyEstimate:
        if self.mechanism == "blap-cat":
            return self.mech.estimate_counts_from_report_counts(self.report_counts)  # type: ignore[no-any-return]
        return self.mech.estimate_from_counts(self.report_counts, n=self.n)  # type: ignore[no-any-return]


class _NumericChannel:
    """One numeric attribute through the bounded Laplace; running moments of the unbiased transform."""

    def __init__(self, topic: str, attribute: str, mech: BoundedLaplace, boundary_width: float) -> None:
        self.topic = topic
        self.mechanism = "blap"
        self.attribute = attribute
        self.mech = mech
        self.epsilon = mech.epsilon
        self.boundary_width = boundary_width
        self.n = 0
        self.mean_h = 0.0
        self.m2_h = 0.0  # Chan et al. pairwise merge of (n, mean, M2)

    def perturb(self, values: Sequence[Any]) -> list[float]:
        return self.perturb_array(values).tolist()  # type: ignore[no-any-return]

    def perturb_json(self, values: Sequence[Any]) -> list[str]:
        """Reported values as JSON numbers (``float.__repr__``, what ``json.dumps`` writes for a finite float)."""
        y = self.perturb_array(values)
        if not np.isfinite(y).all():
            raise ValueError(f"field {self.attribute!r}: non-finite bounded Laplace output (not JSON)")
        return list(map(float.__repr__, y.tolist()))

    def perturb_array(self, values: Sequence[Any]) -> np.ndarray:
        x = np.asarray(values, dtype=np.float64)
        y = self.mech.randomise_many(x)
        h = self.mech.unbiased_transform(y, boundary_width=self.boundary_width)
        nb = int(h.size)
        if nb:
            mb = float(h.mean())
            m2b = float(((h - mb) ** 2).sum())
            n = self.n + nb
            d = mb - self.mean_h
            self.mean_h += d * nb / n
            self.m2_h += m2b + d * d * self.n * nb / n
            self.n = n
        return y

    def estimate(self) -> tuple[float, float]:
        """(mean, standard error) of the boundary-corrected estimator: mean of h(y), SE = sd(h)/sqrt(n)."""
        if self.n < 2:
            return (self.mean_h if self.n else math.nan), math.nan
        var = self.m2_h / (self.n - 1)
        return self.mean_h, math.sqrt(max(var, 0.0) / self.n)


class _Truth:
    """Exact statistics of the values seen (NOT private; demo/testing only).  Bounded state."""

    def __init__(self) -> None:
        self.counts: dict[str, np.ndarray] = {}
        self.sums: dict[str, tuple[int, float]] = {}

    def add_categorical(self, attribute: str, codec: CategoryCodec, values: Sequence[Any]) -> None:
        codes = codec.encode(np.asarray(values, dtype=object))
        c = np.bincount(codes[codes >= 0], minlength=codec.k).astype(np.float64)
        self.counts[attribute] = self.counts.get(attribute, np.zeros(codec.k)) + c

    def add_numeric(self, attribute: str, values: Sequence[Any]) -> None:
        n, s = self.sums.get(attribute, (0, 0.0))
        x = np.asarray(values, dtype=np.float64)
        self.sums[attribute] = (n + int(x.size), s + float(x.sum()))

    def mean(self, attribute: str) -> float:
        n, s = self.sums.get(attribute, (0, 0.0))
        return s / n if n else math.nan


@dataclass
class SideEvent:
    """Something the shell must log/count: ``kind`` ``budget_exhausted`` | ``kmeans_released`` |
    ``kmeans_skipped``; ``topic``; ``detail`` (message); ``epsilon``."""

    kind: str
    topic: str
    detail: str
    epsilon: float = 0.0


# ============================================================================================ processor
class SidePathProcessor:
    """Validated records -> perturbed side copies, periodic estimates and windowed DP k-means releases.

    ``process(record)`` / ``process_batch(records)`` return ``[(topic, key, message), ...]``; every mechanism
    runs once per attribute per batch over the whole column (vectorized ``randomise_codes``/``randomise_many``).
    Records must already be validated by ``schema.validate`` (the side app does it).  ``rng``: a
    ``numpy.random.Generator`` (or int seed); default ``config.seed``, else OS entropy.  ``clock``: seconds,
    for ``estimates_every_seconds``.
    """

    def __init__(self, config: SidePathConfig | Any = None, schema: Schema | None = None, *,
                 topics: SideTopics | Mapping[str, str] | Any = None,
                 rng: np.random.Generator | int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = cfg = SidePathConfig.coerce(config)
        self.schema = schema if schema is not None else adult_schema()
        self.topics = SideTopics.from_any(topics)
        self.rng = secure_rng(rng if rng is not None else cfg.seed)
        self.clock = clock
        self.record_id_field = self.schema.record_id or "id"
        if isinstance(cfg.sender_processes, bool) or not isinstance(cfg.sender_processes, int) \
                or not 0 <= cfg.sender_processes <= 8:
            raise _err("sender_processes", "an integer in [0, 8]", cfg.sender_processes)
        self._lock = threading.Lock()
        self._events: list[SideEvent] = []
        self.records_processed = 0
        self.estimate_rounds = 0
        self._since_estimates = 0
        self._last_estimates_at = clock()
        self.truth = _Truth() if cfg.truth else None
        if cfg.truth:
            log.warning("side paths: truth tracker ON: exact statistics are computed and published beside the "
                        "estimates; this is NOT private (demo/testing only)")
        self.krr: list[_CategoricalChannel] = []
        self.rs: list[_CategoricalChannel] = []
        self.blap_num: list[_NumericChannel] = []
        self.blap_cat: list[_CategoricalChannel] = []
        self._build_channels()
        self.epsilon_per_record: dict[str, float] = {}
        for topic, chans in self._topic_channels():
            if chans:
                self.epsilon_per_record[topic] = math.fsum(c.epsilon for c in chans)
        self.epsilon_all_topics = math.fsum(self.epsilon_per_record.values())
        if cfg.total_epsilon is not None and self.epsilon_all_topics > _positive("total_epsilon", cfg.total_epsilon) \
                * (1 + 1e-9):
            detail = ", ".join(f"{t}: {e:g}" for t, e in self.epsilon_per_record.items())
            raise _err("total_epsilon", f"at least the eps one record spends over all side topics "
                                        f"({self.epsilon_all_topics:g} = {detail})", cfg.total_epsilon)
        self._build_kmeans()
        self._templates: dict[tuple[str, tuple[str, ...]], str] = {}

    # ------------------------------------------------------------------ construction
    def _categories(self, option: str, name: str) -> list[str]:
        if name not in self.schema:
            raise _err(option, f"attributes of schema {self.schema.name!r} ({self.schema.names})", name)
        a = self.schema[name]
        if a.kind is not Kind.CATEGORICAL or len(a.domain_values) < 2:
            raise _err(option, "categorical attributes with a declared domain of at least 2 values", name)
        return list(a.domain_values)

    def _build_channels(self) -> None:
        cfg, t = self.config, self.topics
        if cfg.krr.enabled and cfg.krr.attributes:
            eps = _split("krr", cfg.krr.epsilon, cfg.krr.record_epsilon, len(cfg.krr.attributes))
            for a in cfg.krr.attributes:
                cats = self._categories("krr.attributes", a)
                krr = KRandomizedResponse(epsilon=eps, categories=cats, rng=self.rng)
                self.krr.append(_CategoricalChannel(t.krr, "krr", a, cats, krr, krr.epsilon))
        if cfg.rs.enabled and cfg.rs.attributes:
            r = cfg.rs
            if r.variant not in ("independent", "no-repeat"):
                raise _err("rs.variant", "'independent' or 'no-repeat'", r.variant)
            if isinstance(r.l, bool) or not isinstance(r.l, int) or r.l < 1:
                raise _err("rs.l", "an integer >= 1", r.l)
            eps_target = _split("rs", r.epsilon, r.record_epsilon, len(r.attributes))
            for a in r.attributes:
                cats = self._categories("rs.attributes", a)
                gamma = float(r.gamma) if r.gamma is not None else gamma_for_epsilon(len(cats), eps_target, r.l,
                                                                                     r.variant)  # type: ignore[arg-type]
                mech: Any
                if r.l == 1:
                    mech = RandomSubstitution(categories=cats, gamma=gamma, rng=self.rng)
                else:
                    mech = LExtendedSubstitution(categories=cats, gamma=gamma, l=r.l, variant=r.variant,  # type: ignore[arg-type]
                                                 rng=self.rng)
                self.rs.append(_CategoricalChannel(t.rs, "rs" if r.l == 1 else f"rs-l/{r.variant}", a, cats, mech,
                                                   mech.epsilon, reports_per_record=r.l))
        if cfg.blap.enabled and (cfg.blap.attributes or cfg.blap.categorical_attributes):
            b = cfg.blap
            eps = _split("blap", b.epsilon, b.record_epsilon, len(b.attributes) + len(b.categorical_attributes))
            for a in b.attributes:
                if a not in self.schema or self.schema[a].kind is not Kind.NUMERIC:
                    raise _err("blap.attributes", "numeric attributes of the schema", a)
                attr = self.schema[a]
                if attr.lo is None or attr.hi is None:
                    raise _err("blap.attributes", "numeric attributes with a public domain [lo, hi] in the schema", a)
                mech_n = BoundedLaplace(epsilon=eps, lower=attr.lo, upper=attr.hi, snap_bits=b.snap_bits,
                                        rng=self.rng)
                self.blap_num.append(_NumericChannel(t.blap, a, mech_n, b.boundary_width))
            for a in b.categorical_attributes:
                cats = self._categories("blap.categorical_attributes", a)
                mech_c = DiscretizedBoundedLaplace(epsilon=eps, categories=cats, rng=self.rng)
                self.blap_cat.append(_CategoricalChannel(t.blap, "blap-cat", a, cats, mech_c, mech_c.epsilon))

    def _build_kmeans(self) -> None:
        k = self.config.kmeans
        self.kmeans_enabled = bool(k.enabled)
        self.kmeans_stopped = False
        self.kmeans_windows = 0
        self.kmeans_refused = 0
        self._window_fill = 0
        self._window_start = 0
        if not self.kmeans_enabled:
            return
        if len(k.attributes) < 1:
            raise _err("kmeans.attributes", "at least one numeric attribute", k.attributes)
        lo, hi = [], []
        for a in k.attributes:
            if a not in self.schema or self.schema[a].kind is not Kind.NUMERIC or self.schema[a].lo is None \
                    or self.schema[a].hi is None:
                raise _err("kmeans.attributes", "numeric attributes with a public domain in the schema", a)
            lo.append(float(self.schema[a].lo))  # type: ignore[arg-type]
            hi.append(float(self.schema[a].hi))  # type: ignore[arg-type]
        if isinstance(k.window, bool) or not isinstance(k.window, int) or k.window < max(2, k.n_clusters):
            raise _err("kmeans.window", f"an integer >= max(2, n_clusters={k.n_clusters})", k.window)
        if k.variant not in ("quad", "uniquad"):
            raise _err("kmeans.variant", "'quad' or 'uniquad'", k.variant)
        self.kmeans_bounds = (np.asarray(lo), np.asarray(hi))
        # validate the mechanism's parameters once, at start
        QuadTreeKMeans(n_clusters=k.n_clusters, epsilon=_positive("kmeans.epsilon", k.epsilon), bounds=self.kmeans_bounds,
                       gamma=k.gamma, variant=k.variant, rng=self.rng)  # type: ignore[arg-type]
        self.kmeans_window_budget = WindowedBudget(epsilon_per_window=k.epsilon)
        self.kmeans_accountant = (BudgetAccountant(total_epsilon=_positive("kmeans.total_epsilon", k.total_epsilon))
                                  if k.total_epsilon is not None else None)
        self._window = np.empty((k.window, len(k.attributes)), dtype=np.float64)

    # ------------------------------------------------------------------ budget views
    def kmeans_budget(self) -> tuple[float, float]:
        """(total, remaining) eps of the k-means output: the stream budget if configured, else one window's."""
        k = self.config.kmeans
        if not self.kmeans_enabled:
            return 0.0, 0.0
        if self.kmeans_accountant is not None:
            return self.kmeans_accountant.total_epsilon, self.kmeans_accountant.remaining
        return k.epsilon, k.epsilon

    def drain_events(self) -> list[SideEvent]:
        with self._lock:
            ev, self._events = self._events, []
        return ev

    def _event(self, ev: SideEvent) -> None:
        with self._lock:
            self._events.append(ev)

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
        rest = self._run_batch(records, now, lambda topic, ids, chans: self._copy_dicts(copies, topic, ids, chans))
        return copies + rest

    def process_batch_encoded(self, records: Sequence[Mapping[str, Any]],
                              now: float | None = None) -> tuple[list[CopyBatch], list[Out]]:
        """:meth:`process_batch` with the per-record copies already JSON-encoded, one :class:`CopyBatch` per
        per-record topic (the same messages, byte for byte ``json.dumps(..., separators=(",", ":"))``, built
        column-wise from pre-encoded fragments), and the other outputs (k-means, estimates) as ``Out``."""
        copies: list[CopyBatch] = []
        rest = self._run_batch(records, now, lambda topic, ids, chans: copies.append(self._copy_bytes(topic, ids, chans)))
        return copies, rest

    def _run_batch(self, records: Sequence[Mapping[str, Any]], now: float | None,
                   emit: Callable[[str, list[str], list[tuple[Any, list[Any]]]], Any]) -> list[Out]:
        """Perturb every per-record topic's columns (``emit(topic, ids, [(channel, column), ...])`` builds the
        copies), then truth, k-means and estimates; returns the k-means and estimate messages."""
        out: list[Out] = []
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

        for topic, chans in self._topic_channels():
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
        if self.kmeans_enabled:
            out.extend(self._kmeans_add(np.column_stack(
                [np.asarray(column(a), dtype=np.float64) for a in self.config.kmeans.attributes])))
        every = self.config.estimates_every
        if every and self._since_estimates >= every:
            out.extend(self.emit_estimates(now))
        else:
            out.extend(self.poll(now))
        return out

    def _mechanism_name(self, topic: str) -> str:
        return {self.topics.krr: "krr", self.topics.rs: self._rs_name(), self.topics.blap: "blap"}[topic]

    def _copy_dicts(self, out: list[Out], topic: str, ids: list[str], chans: list[tuple[Any, list[Any]]]) -> None:
        mech_name = self._mechanism_name(topic)
        names = [c.attribute for c, _ in chans]
        reported = [c.perturb(col) for c, col in chans]
        eps_map = {c.attribute: c.epsilon for c, _ in chans}
        eps_total = self.epsilon_per_record[topic]
        for i, row in enumerate(zip(*reported, strict=True)):
            out.append((topic, ids[i], {
                "id": ids[i], "mechanism": mech_name, "values": dict(zip(names, row, strict=True)),
                "epsilon": eps_map, "epsilon_total": eps_total,
                "epsilon_all_side_topics": self.epsilon_all_topics,
            }))

    def _copy_template(self, topic: str, chans: list[tuple[Any, list[Any]]]) -> str:
        """``%``-template of one copy's JSON: slots for the id and each attribute's value, constants inline."""
        key = (topic, tuple(c.attribute for c, _ in chans))
        tmpl = self._templates.get(key)
        if tmpl is None:
            def dumps(x: Any) -> str:
                return json.dumps(x, separators=(",", ":"), allow_nan=False).replace("%", "%%")

            slots = ",".join(f"{dumps(c.attribute)}:%s" for c, _ in chans)
            eps_map = {c.attribute: c.epsilon for c, _ in chans}
            tmpl = self._templates[key] = (
                '{"id":%s,"mechanism":' + dumps(self._mechanism_name(topic)) + ',"values":{' + slots + '},"epsilon":'
                + dumps(eps_map) + ',"epsilon_total":' + dumps(self.epsilon_per_record[topic])
                + ',"epsilon_all_side_topics":' + dumps(self.epsilon_all_topics) + "}")
        return tmpl

    def _copy_bytes(self, topic: str, ids: list[str], chans: list[tuple[Any, list[Any]]]) -> CopyBatch:
        tmpl = self._copy_template(topic, chans)
        fragments = [c.perturb_json(col) for c, col in chans]
        id_json = list(map(_json_string, ids))
        payloads = [(tmpl % row).encode() for row in zip(id_json, *fragments, strict=True)]
        return CopyBatch(topic, ids, payloads, self.epsilon_per_record[topic])

    def _topic_channels(self) -> list[tuple[str, list[_CategoricalChannel | _NumericChannel]]]:
        return [(self.topics.krr, list(self.krr)), (self.topics.rs, list(self.rs)),
                (self.topics.blap, [*self.blap_num, *self.blap_cat])]

    def _rs_name(self) -> str:
        r = self.config.rs
        return "rs" if r.l == 1 else f"rs-l/{r.variant}"

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
        out: list[Out] = []
        topic = self.topics.estimates
        base = {"round": self.estimate_rounds, "records_seen": self.records_processed, "additional_epsilon": 0.0}
        for c in [*self.krr, *self.rs, *self.blap_cat]:
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
            out.append((topic, f"{c.mechanism}/{c.attribute}", msg))
        for nc in self.blap_num:
            mean, se = nc.estimate()
            m = nc.mech
            nmsg: dict[str, Any] = {
                "type": "mean", "source_topic": nc.topic, "mechanism": "blap", "attribute": nc.attribute, **base,
                "n": nc.n, "epsilon": nc.epsilon, "mean": _finite(mean), "std_error": _finite(se),
                "standard_error": _finite(se), "method": "boundary-corrected",
                "max_bias": m.max_transform_bias(boundary_width=nc.boundary_width),
                "params": {"lower": m.lower, "upper": m.upper, "scale": m.scale,
                           "boundary_width": nc.boundary_width},
            }
            if self.truth is not None:
                tm = self.truth.mean(nc.attribute)
                nmsg["truth"] = {"mean": tm, "abs_error": abs(mean - tm),
                                 "z": abs(mean - tm) / se if se and se > 0 else math.nan}
            out.append((topic, f"blap/{nc.attribute}", nmsg))
        return out

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
            self._event(SideEvent("kmeans_skipped", topic, f"{topic}: window {index} ({n} records) not released: "
                                                         f"the k-means budget is exhausted"))
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
                self._event(SideEvent("budget_exhausted", topic, text))
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
        self._event(SideEvent("kmeans_released", topic, f"window {index}", km.epsilon))
        return [(topic, f"window-{index}", msg)]


def _json_string(s: str) -> str:
    """JSON text of a string, as ``json.dumps`` writes it (ASCII, escaped)."""
    return _encode_basestring_ascii(s)  # type: ignore[no-any-return]


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# ============================================================================================ metrics + shell hook
def observe(metrics: ServiceMetrics, outputs: Sequence[Out], processor: SidePathProcessor) -> dict[str, int]:
    """Update the side-path metrics for published ``outputs`` (call after they were acknowledged).

    ``epsilon_spent{topic}`` adds each per-record message's ``epsilon_total`` and each k-means window's eps;
    ``estimate_standard_error{topic,attribute}`` = the largest frequency SE over categories (frequency
    estimates) or the SE of the mean; ``estimate_abs_error{topic,attribute}`` (truth tracker only) = mean
    absolute frequency error over categories, or |mean - true mean|.  Label ``topic`` is the source side
    topic (``adult.krr`` ...) for estimates.  Returns messages per topic.
    """
    per_topic: dict[str, int] = {}
    eps: dict[str, float] = {}
    t = processor.topics
    for topic, _key, msg in outputs:
        per_topic[topic] = per_topic.get(topic, 0) + 1
        if topic == t.estimates:
            src, attr = msg["source_topic"], msg["attribute"]
            se = msg.get("standard_error")
            if se is not None and math.isfinite(se):
                metrics.estimate_standard_error.labels(topic=src, attribute=attr).set(se)
            truth = msg.get("truth")
            if truth is not None and math.isfinite(truth.get("abs_error", math.nan)):
                metrics.estimate_abs_error.labels(topic=src, attribute=attr).set(truth["abs_error"])
        elif topic == t.kmeans:
            eps[topic] = eps.get(topic, 0.0) + float(msg["epsilon"])
        else:
            eps[topic] = eps.get(topic, 0.0) + float(msg["epsilon_total"])
    for topic, count in per_topic.items():
        metrics.side_records_published.labels(topic=topic).inc(count)
    for topic, e in eps.items():
        metrics.epsilon_spent.labels(topic=topic).inc(e)
    return per_topic


def observe_copies(metrics: ServiceMetrics, copies: Sequence[CopyBatch]) -> dict[str, int]:
    """:func:`observe` for encoded per-record copies (after they were acknowledged): messages and eps per topic
    (``epsilon_total`` of each copy).  Returns messages per topic."""
    per_topic: dict[str, int] = {}
    eps: dict[str, float] = {}
    for c in copies:
        per_topic[c.topic] = per_topic.get(c.topic, 0) + len(c)
        eps[c.topic] = eps.get(c.topic, 0.0) + len(c) * c.epsilon_total
    for topic, count in per_topic.items():
        metrics.side_records_published.labels(topic=topic).inc(count)
    for topic, e in eps.items():
        metrics.epsilon_spent.labels(topic=topic).inc(e)
    return per_topic


def set_budget_gauges(metrics: ServiceMetrics, processor: SidePathProcessor) -> None:
    """``epsilon_budget_total/remaining{topic}``: per-record topics show one record's budget (the configured
    split budget, else the sum of its attributes' eps) and what is left of it; k-means shows the stream
    budget (``kmeans.total_epsilon``) or, without one, the per-window budget."""
    cfg = processor.config
    for topic, spent in processor.epsilon_per_record.items():
        rec = {processor.topics.krr: cfg.krr.record_epsilon, processor.topics.rs: cfg.rs.record_epsilon,
               processor.topics.blap: cfg.blap.record_epsilon}.get(topic)
        total = float(rec) if rec is not None else spent
        metrics.epsilon_budget_total.labels(topic=topic).set(total)
        metrics.epsilon_budget_remaining.labels(topic=topic).set(max(0.0, total - spent))
    if processor.kmeans_enabled:
        total, remaining = processor.kmeans_budget()
        metrics.epsilon_budget_total.labels(topic=processor.topics.kmeans).set(total)
        metrics.epsilon_budget_remaining.labels(topic=processor.topics.kmeans).set(remaining)


def run_side_paths(cfg: Any, metrics: ServiceMetrics | None = None, stop_event: threading.Event | None = None,
                   **kwargs: Any) -> int:
    """Run the side paths' Kafka loop (:func:`stream_anon.service.side_app.run_side_paths`; imported lazily so
    this module stays free of Kafka)."""
    from stream_anon.service.side_app import run_side_paths as _run

    return _run(cfg, metrics, stop_event, **kwargs)


# ============================================================================================ benchmark
def benchmark(records: Sequence[Mapping[str, Any]], *, batch_size: int = 2000, config: SidePathConfig | None = None,
              seed: int = 0, repeat: int = 1) -> dict[str, float]:
    """Time ``process_batch`` over ``records`` in batches; prints and returns records/s and messages/s."""
    cfg = config or SidePathConfig(estimates_every=5000)
    best = math.inf
    n_out = 0
    for _ in range(max(1, repeat)):
        proc = SidePathProcessor(cfg, rng=seed)
        t0 = time.perf_counter()
        n_out = 0
        for i in range(0, len(records), batch_size):
            n_out += len(proc.process_batch(records[i:i + batch_size]))
        n_out += len(proc.flush())
        best = min(best, time.perf_counter() - t0)
    res = {"records": float(len(records)), "seconds": best, "records_per_s": len(records) / best,
           "messages_per_s": n_out / best, "batch_size": float(batch_size)}
    print(f"side paths (pure): {len(records)} records in {best:.3f} s = {res['records_per_s']:,.0f} records/s, "
          f"{res['messages_per_s']:,.0f} messages/s (batch {batch_size})")
    return res


def estimate_error_table(records: Sequence[Mapping[str, Any]], *, config: SidePathConfig | None = None,
                         seed: int = 0, batch_size: int = 2000) -> list[dict[str, Any]]:
    """Run the side paths over ``records`` with the truth tracker and return, per (mechanism, attribute), the final
    estimate's n, eps, standard error and actual error (mean |f_hat - f| over categories, or |mean_hat - mean|)."""
    cfg = dataclasses.replace(config or SidePathConfig(), truth=True, estimates_every=0, estimates_every_seconds=None)
    cfg.kmeans = dataclasses.replace(cfg.kmeans, enabled=False)
    proc = SidePathProcessor(cfg, rng=seed)
    for i in range(0, len(records), batch_size):
        proc.process_batch(records[i:i + batch_size])
    rows = []
    for _t, _k, m in proc.emit_estimates():
        truth = m.get("truth", {})
        rows.append({"mechanism": m["mechanism"], "attribute": m["attribute"], "n": m["n"], "epsilon": m["epsilon"],
                     "standard_error": m["standard_error"], "abs_error": truth.get("abs_error"),
                     "max_abs_error": truth.get("max_abs_error", truth.get("abs_error")),
                     "max_z": truth.get("max_z", truth.get("z"))})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m stream_anon.service.side_paths [--adult PATH] [--seed S] [--batch N]``: benchmark and
    estimate-error table on ADULT (markdown)."""
    import argparse

    from stream_anon.core.datasets import iter_records, read_adult

    ap = argparse.ArgumentParser(prog="python -m stream_anon.service.side_paths")
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=2000)
    args = ap.parse_args(argv)
    records = list(iter_records(read_adult(args.adult)))
    benchmark(records, batch_size=args.batch, seed=args.seed, repeat=3)
    rows = estimate_error_table(records, seed=args.seed, batch_size=args.batch)
    print(f"\nestimates on all of ADULT (n = {len(records)}, seed {args.seed}): frequency rows give the mean / max "
          f"absolute error of the estimated frequencies over the categories and the largest frequency SE; mean rows "
          f"give |mean_hat - mean| and the SE of the mean; max |z| = largest |estimate - truth| / SE\n")
    print("| mechanism | attribute | eps | SE | abs error | max abs error | max abs z |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['mechanism']} | {r['attribute']} | {r['epsilon']:.3g} | {r['standard_error']:.4f} | "
              f"{r['abs_error']:.4f} | {r['max_abs_error']:.4f} | {r['max_z']:.2f} |")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
