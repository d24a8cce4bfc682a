"""One channel per (mechanism, attribute): perturb a column of values, keep the server-side aggregate.

Aggregates are bounded: a report histogram (frequency oracles: k-RR, random substitution, the discretized bounded
Laplace) or running moments of the unbiased transform (bounded Laplace, Chan et al.'s pairwise merge of
(n, mean, M2)).  Estimates from them are post-processing of the reports and spend no eps.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from stream_anon.config.side_paths import CategoricalPlan, NumericPlan, SidePathConfigError
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.frequency import CategoryCodec, FrequencyEstimate


class CategoricalChannel:
    """One categorical attribute through one frequency-oracle mechanism, with its report histogram."""

    def __init__(self, topic: str, plan: CategoricalPlan) -> None:
        self.topic = topic
        self.plan = plan
        self.mechanism = plan.mechanism
        self.attribute = plan.attribute
        self.mech = plan.mech
        self.epsilon = plan.epsilon
        self.l = plan.reports_per_record
        self.codec = CategoryCodec(list(plan.categories), name=f"categories of {plan.attribute!r}")
        self.report_counts = np.zeros(self.codec.k, dtype=np.float64)
        self.n = 0
        self._json = np.empty(self.codec.k, dtype=object)  # category code -> its JSON text
        self._json[:] = [json.dumps(c) for c in plan.categories]

    def perturb(self, values: Sequence[Any]) -> list[Any]:
        """Reported categories: (n,) -> list of labels; (n, l) -> list of lists."""
        return self.codec.decode(self.perturb_codes(values)).tolist()

    def perturb_json(self, values: Sequence[Any]) -> list[str]:
        """Reported categories as JSON texts, one per record (``json.dumps`` of :meth:`perturb`'s items)."""
        frag = self._json[self.perturb_codes(values)]
        if frag.ndim == 1:
            return frag.tolist()
        return ["[" + ",".join(row) + "]" for row in frag.tolist()]

    def perturb_codes(self, values: Sequence[Any]) -> np.ndarray:
        """Randomize the codes of ``values`` and add the reports to the histogram: (n,) or (n, l) codes."""
        codes = self.codec.encode(np.asarray(values, dtype=object))
        if codes.size and codes.min() < 0:
            bad = np.asarray(values, dtype=object)[codes < 0][0]
            raise SidePathConfigError(f"field {self.attribute!r}: {bad!r} is outside the domain "
                                      f"({self.codec.describe()}); records must be validated first")
        mech = self.mech
        rep = mech.randomise_indices(codes) if isinstance(mech, DiscretizedBoundedLaplace) else mech.randomise_codes(codes)
        self.report_counts += np.bincount(rep.reshape(-1), minlength=self.codec.k)
        self.n += int(codes.size)
        return rep

    def estimate(self) -> FrequencyEstimate:
        mech = self.mech
        if isinstance(mech, DiscretizedBoundedLaplace):
            return mech.estimate_counts_from_report_counts(self.report_counts)
        return mech.estimate_from_counts(self.report_counts, n=self.n)


class NumericChannel:
    """One numeric attribute through the bounded Laplace; running moments of the unbiased transform."""

    mechanism = "blap"

    def __init__(self, topic: str, plan: NumericPlan) -> None:
        self.topic = topic
        self.plan = plan
        self.attribute = plan.attribute
        self.mech: BoundedLaplace = plan.mech
        self.epsilon = plan.epsilon
        self.boundary_width = plan.boundary_width
        self.n = 0
        self.mean_h = 0.0
        self.m2_h = 0.0

    def perturb(self, values: Sequence[Any]) -> list[float]:
        return self.perturb_array(values).tolist()

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


Channel = CategoricalChannel | NumericChannel


class TruthTracker:
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
