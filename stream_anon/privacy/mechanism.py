"""What every privacy mechanism of this package answers: its exact epsilon and its public domain.

Accounting (:func:`stream_anon.privacy.accounting.exact_epsilon`, the side paths' plan) asks the mechanism
(:class:`PrivacyMechanism`) instead of knowing each class.  ``exact_epsilon`` is an upper bound (by less than
1e-12 unless the mechanism's docstring says otherwise) of the epsilon the mechanism really spends per value
(per window for k-means), computed from its own output distribution in the arithmetic it runs in: the
2^-53 grid of ``Generator.random()`` for k-RR and FRAPP, the integer table for bounded Laplace, the rational
noise scales for k-means; ``inf`` when no finite bound holds (the unsafe binary64 bounded Laplace).  It may
differ from the *stated* ``epsilon`` a mechanism was built with (k-RR's stated 1 is 1 + 9.1e-13 as sampled).

Local randomisers (:class:`LocalMechanism`, modelled on diffprivlib) add ``randomise(value)`` and the
vectorized ``randomise_many(values)``; parameters are keyword-only and validated, the generator is injected
as ``rng``.  Closed forms (``variance`` and the estimators) stay specific to each mechanism: k-RR's
``variance(true_count, n)`` is the variance of a count estimate, bounded Laplace's ``variance(x)`` that of
one output.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "BoxDomain",
    "CategoricalDomain",
    "Domain",
    "IntervalDomain",
    "LocalMechanism",
    "PrivacyMechanism",
]


@dataclass(frozen=True)
class CategoricalDomain:
    """A finite set of categories, in the mechanism's code order (the order matters for ordinal mechanisms)."""

    categories: tuple[Any, ...]

    def __len__(self) -> int:
        return len(self.categories)


@dataclass(frozen=True)
class IntervalDomain:
    """The public interval [lower, upper] (integers only when ``integer``)."""

    lower: float
    upper: float
    integer: bool = False


@dataclass(frozen=True)
class BoxDomain:
    """The public box prod_j [lower_j, upper_j] of d-dimensional points."""

    lower: tuple[float, ...]
    upper: tuple[float, ...]


Domain = CategoricalDomain | IntervalDomain | BoxDomain


@runtime_checkable
class PrivacyMechanism(Protocol):
    """Anything accounting can charge: the exact epsilon one use spends and the public domain it acts on."""

    @property
    def exact_epsilon(self) -> float: ...

    @property
    def domain(self) -> Domain: ...


class LocalMechanism(ABC):
    """A local randomiser: one report (or a fixed number of reports) per input value, from the injected ``rng``."""

    rng: np.random.Generator

    @property
    @abstractmethod
    def exact_epsilon(self) -> float:
        """Upper bound of the epsilon one value spends, from the output distribution as sampled."""

    @property
    @abstractmethod
    def domain(self) -> Domain:
        """The public input domain."""

    @abstractmethod
    def randomise_many(self, values: Any) -> np.ndarray:
        """Perturb an array of values (vectorized)."""

    def randomise(self, value: Any) -> Any:
        """Perturb one value (``randomise_many`` of a one-element object array)."""
        arr = np.empty(1, dtype=object)
        arr[0] = value
        return self.randomise_many(arr)[0]
