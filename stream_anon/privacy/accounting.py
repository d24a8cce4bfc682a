"""What a configured mechanism spends, asked of the mechanism itself, and what a record spends in total.

:func:`exact_epsilon` returns ``mechanism.exact_epsilon`` for any :class:`~stream_anon.privacy.mechanism.
PrivacyMechanism`: an upper bound (by < 1e-12 unless the mechanism's docstring says otherwise) of its epsilon,
computed from its own output distribution in the arithmetic it runs in (each class documents how: k-RR and
FRAPP on the 2^-53 grid of ``Generator.random()``, l-extended substitution from FRAPP's, bounded Laplace and
its discretization from their integer tables, the unsafe binary64 bounded Laplace ``inf``, k-means from the
rational noise scales of one window).

The result is what one record (or one window, for k-means) spends through that mechanism; a record's total is
the sum over the mechanisms applied to it (:func:`record_epsilon`, sequential composition).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from stream_anon.privacy.base import PrivacyParameterError
from stream_anon.privacy.mechanism import PrivacyMechanism

__all__ = [
    "exact_epsilon",
    "record_epsilon",
]


def exact_epsilon(mechanism: Any) -> float:
    """Upper bound of the exact eps of ``mechanism`` (its ``exact_epsilon``); refuses anything that is not a
    :class:`~stream_anon.privacy.mechanism.PrivacyMechanism`."""
    if not isinstance(mechanism, PrivacyMechanism):
        raise PrivacyParameterError(f"mechanism: no exact epsilon known for {type(mechanism).__name__}")
    return float(mechanism.exact_epsilon)


def record_epsilon(mechanisms: Iterable[Any]) -> float:
    """What one record spends through all of ``mechanisms`` (sequential composition of their exact eps)."""
    values = [exact_epsilon(m) for m in mechanisms]
    if any(math.isinf(v) for v in values):
        return math.inf
    return math.nextafter(math.fsum(values), math.inf)
