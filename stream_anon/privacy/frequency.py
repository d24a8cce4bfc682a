"""Frequency estimates recovered from locally randomized reports, with their standard errors.

Every categorical mechanism of this package (k-RR, FRAPP random substitution, l-extended substitution,
discretized bounded Laplace) ends in a :class:`FrequencyEstimate`: unbiased count estimates
``counts`` (they may be negative or exceed ``n``: that is the price of unbiasedness), their standard
errors, and the number of reporting records ``n``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from stream_anon.privacy.base import PrivacyParameterError


@dataclass(frozen=True, eq=False)
class FrequencyEstimate:
    """Unbiased category counts estimated from randomized reports.

    ``counts[i]`` estimates how many of the ``n`` records hold ``categories[i]``; ``std_errors[i]`` is
    the standard error of that estimate (the closed-form variance with the estimate plugged in for the
    unknown true count, see each mechanism).  ``epsilon`` is the privacy each record spent on it.
    """

    categories: tuple[Any, ...]
    counts: np.ndarray
    std_errors: np.ndarray
    n: int
    epsilon: float | None = None
    mechanism: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        counts = np.asarray(self.counts, dtype=float)
        ses = np.asarray(self.std_errors, dtype=float)
        if counts.shape != (len(self.categories),) or ses.shape != counts.shape:
            raise PrivacyParameterError(
                f"FrequencyEstimate: counts {counts.shape} and std_errors {ses.shape} must both have shape "
                f"({len(self.categories)},), one entry per category")
        object.__setattr__(self, "categories", tuple(self.categories))
        object.__setattr__(self, "counts", counts)
        object.__setattr__(self, "std_errors", ses)
        object.__setattr__(self, "n", int(self.n))

    @property
    def frequencies(self) -> np.ndarray:
        """Estimated relative frequencies ``counts / n`` (unbiased; may leave [0, 1])."""
        return self.counts / self.n if self.n > 0 else np.zeros_like(self.counts)

    @property
    def frequency_std_errors(self) -> np.ndarray:
        return self.std_errors / self.n if self.n > 0 else np.zeros_like(self.std_errors)

    def projected_frequencies(self) -> np.ndarray:
        """Frequencies clipped at 0 and renormalized to sum 1 (a valid distribution, but BIASED).

        This is what multi-freq-ldpy returns; use it for display only, never for unbiased totals.
        """
        f = np.clip(self.frequencies, 0.0, None)
        s = f.sum()
        return f / s if s > 0 else np.full_like(f, 1.0 / len(f))

    def as_dict(self) -> dict[str, float]:
        return {str(c): float(v) for c, v in zip(self.categories, self.counts, strict=True)}

    def compare(self, true_counts: Sequence[float] | np.ndarray) -> dict[str, float]:
        """Errors of the estimated distribution against the true counts (same category order).

        ``max_abs_count_error``; ``max_abs_frequency_error``; ``total_variation`` = 1/2 sum |f_hat - f|
        (on the unprojected estimate); ``relative_l2_error`` = ||X_hat - X||_2 / ||X||_2 (the
        "standard error" of Agrawal & Haritsa / Dowd et al.).
        """
        x = np.asarray(true_counts, dtype=float)
        if x.shape != self.counts.shape:
            raise PrivacyParameterError(f"true_counts: expected {self.counts.shape[0]} counts, got shape {x.shape}")
        n_true = x.sum()
        diff = self.counts - x
        f_true = x / n_true if n_true > 0 else x
        f_diff = self.frequencies - f_true
        norm = float(np.linalg.norm(x))
        return {
            "max_abs_count_error": float(np.max(np.abs(diff))),
            "max_abs_frequency_error": float(np.max(np.abs(f_diff))),
            "total_variation": float(0.5 * np.abs(f_diff).sum()),
            "relative_l2_error": float(np.linalg.norm(diff) / norm) if norm > 0 else math.nan,
            "within_2se_share": float(np.mean(np.abs(diff) <= 2 * self.std_errors + 1e-12)),
        }

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mechanism": self.mechanism,
            "epsilon": self.epsilon,
            "n": self.n,
            "categories": [str(c) for c in self.categories],
            "counts": [float(v) for v in self.counts],
            "std_errors": [float(v) for v in self.std_errors],
            "frequencies": [float(v) for v in self.frequencies],
            "frequency_std_errors": [float(v) for v in self.frequency_std_errors],
        }
        if self.extra:
            out["extra"] = self.extra
        return out


class CategoryCodec:
    """Maps category labels to integer codes 0..k-1 and back, vectorized (pandas hash index)."""

    def __init__(self, categories: Sequence[Any] | np.ndarray, *, name: str = "categories"):
        cats = list(categories)
        if len(cats) < 2:
            raise PrivacyParameterError(f"{name}: need at least 2 categories, got {len(cats)} ({cats!r})")
        index = pd.Index(cats)
        if not index.is_unique:
            dup = index[index.duplicated()].tolist()
            raise PrivacyParameterError(f"{name}: categories must be distinct, duplicated: {dup!r}")
        self.categories: tuple[Any, ...] = tuple(cats)
        self.k = len(cats)
        self._index = index
        self._labels = np.empty(self.k, dtype=object)
        self._labels[:] = cats

    def describe(self) -> str:
        shown = ", ".join(repr(c) for c in self.categories[:12]) + (", ..." if self.k > 12 else "")
        return f"one of {self.k} categories ({shown})"

    def encode(self, values: Any) -> np.ndarray:
        """Codes of the values; -1 where a value is outside the domain."""
        arr = np.asarray(values, dtype=object) if not isinstance(values, np.ndarray) else values
        if arr.ndim == 0:
            arr = arr.reshape(1)
        flat = arr.reshape(-1)
        codes = self._index.get_indexer(pd.Index(flat))
        return np.asarray(codes, dtype=np.int64).reshape(arr.shape)

    def encode_strict(self, values: Any, *, what: str = "value") -> np.ndarray:
        codes = self.encode(values)
        bad = codes < 0
        if bad.any():
            arr = np.asarray(values, dtype=object).reshape(-1)
            first = arr[int(np.flatnonzero(bad.reshape(-1))[0])]
            raise PrivacyParameterError(
                f"{what}: {first!r} is outside the domain; expected {self.describe()} "
                f"({int(bad.sum())} of {bad.size} values out of domain)")
        return codes

    def decode(self, codes: np.ndarray) -> np.ndarray:
        labels: np.ndarray = self._labels[codes]
        return labels


def counts_of_codes(codes: np.ndarray, k: int) -> np.ndarray:
    """Histogram of integer codes 0..k-1 (all of ``codes``, any shape)."""
    return np.bincount(np.asarray(codes, dtype=np.int64).reshape(-1), minlength=k).astype(float)


class SingleReportEstimator:
    """Shared estimate entry points of one-report-per-record frequency oracles (k-RR, FRAPP).

    The mechanism sets ``_codec`` (a :class:`CategoryCodec`) and provides ``estimate_from_counts(counts, n)``.
    """

    _codec: CategoryCodec

    @property
    def categories(self) -> tuple[Any, ...]:
        """The category domain, in code order."""
        return self._codec.categories

    @property
    def k(self) -> int:
        """Domain size (k of k-RR, N of FRAPP)."""
        return self._codec.k

    def estimate_from_counts(self, counts: Any, n: int | None = None) -> FrequencyEstimate:  # pragma: no cover
        raise NotImplementedError

    def estimate_counts(self, reports: Any) -> FrequencyEstimate:
        """Unbiased category counts from an array of reported labels (every report must be in the domain)."""
        codes = self._codec.encode_strict(reports, what="report")
        return self.estimate_from_counts(counts_of_codes(codes, self.k), n=int(codes.size))

    def estimate_counts_from_codes(self, codes: np.ndarray) -> FrequencyEstimate:
        """The same from integer report codes ``0..k-1``."""
        c = np.asarray(codes, dtype=np.int64)
        if c.size and (c.min() < 0 or c.max() >= self.k):
            raise PrivacyParameterError(f"report codes must be in 0..{self.k - 1}, got range "
                                        f"[{int(c.min())}, {int(c.max())}]")
        return self.estimate_from_counts(counts_of_codes(c, self.k), n=int(c.size))
