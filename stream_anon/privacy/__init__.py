"""Local differential privacy mechanisms, estimators and budget accounting (pure library: no I/O).

Categorical: :class:`KRandomizedResponse`, :class:`RandomSubstitution` (FRAPP),
:class:`LExtendedSubstitution`, with :class:`FrequencyEstimate` results; accounting:
:class:`BudgetAccountant`, :class:`WindowedBudget`, :func:`split_budget`, :func:`sequential_composition`.
Numeric: :class:`BoundedLaplace`, :class:`DiscretizedBoundedLaplace`, :class:`QuadTreeKMeans`,
:func:`nicv`, :func:`select_epsilon`.
"""

from __future__ import annotations

from stream_anon.privacy.base import PrivacyParameterError, secure_rng
from stream_anon.privacy.bounded_laplace import BoundedLaplace, DiscretizedBoundedLaplace
from stream_anon.privacy.budget import (
    BudgetAccountant,
    BudgetExhaustedError,
    BudgetSpend,
    WindowedBudget,
    sequential_composition,
    split_budget,
)
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans, nicv
from stream_anon.privacy.epsilon_selection import select_epsilon
from stream_anon.privacy.frequency import FrequencyEstimate
from stream_anon.privacy.randomized_response import KRandomizedResponse
from stream_anon.privacy.substitution import (
    LExtendedSubstitution,
    RandomSubstitution,
    frapp_standard_error_bound,
    gamma_for_epsilon,
    no_repeat_epsilon,
)

__all__ = [
    "BoundedLaplace",
    "BudgetAccountant",
    "BudgetExhaustedError",
    "BudgetSpend",
    "DiscretizedBoundedLaplace",
    "FrequencyEstimate",
    "KRandomizedResponse",
    "LExtendedSubstitution",
    "PrivacyParameterError",
    "QuadTreeKMeans",
    "RandomSubstitution",
    "WindowedBudget",
    "frapp_standard_error_bound",
    "gamma_for_epsilon",
    "nicv",
    "no_repeat_epsilon",
    "secure_rng",
    "select_epsilon",
    "sequential_composition",
    "split_budget",
]
