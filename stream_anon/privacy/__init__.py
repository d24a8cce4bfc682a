"""Local differential privacy mechanisms, estimators and budget accounting (pure library: no I/O).

Categorical: :class:`KRandomizedResponse`, :class:`RandomSubstitution` (FRAPP),
:class:`LExtendedSubstitution`, with :class:`FrequencyEstimate` results.
Numeric: :class:`BoundedLaplace` (exact eps on a public grid), :class:`DiscretizedBoundedLaplace`,
:class:`UnsafeFloatBoundedLaplace` (the binary64 sampler, for comparisons: ``exact_epsilon`` is inf),
:class:`QuadTreeKMeans`, :func:`nicv`, :func:`select_epsilon`.
Every mechanism answers ``exact_epsilon`` and ``domain`` (:class:`PrivacyMechanism`; local randomisers are
:class:`LocalMechanism`).
Accounting: :func:`exact_epsilon` / :func:`record_epsilon` (what a configured mechanism really spends),
:class:`BudgetAccountant`, :class:`WindowedBudget` (persistable with ``to_dict``/``from_dict``),
:class:`PersonBudgetSketch` (per-person cap in bounded memory), :func:`split_budget`,
:func:`sequential_composition`.
Randomness: :func:`crypto_rng` (ChaCha20 keyed from OS entropy; ``secure_rng`` is its former name),
:func:`seeded_crypto_rng` (reproducible, tests and benchmarks only).
"""

from __future__ import annotations

from stream_anon.privacy.accounting import exact_epsilon, record_epsilon
from stream_anon.privacy.base import (
    PrivacyParameterError,
    crypto_rng,
    is_cryptographic,
    secure_rng,
    seeded_crypto_rng,
)
from stream_anon.privacy.bounded_laplace import (
    BoundedLaplace,
    DiscretizedBoundedLaplace,
    UnsafeFloatBoundedLaplace,
)
from stream_anon.privacy.budget import (
    BudgetAccountant,
    BudgetExhaustedError,
    BudgetSpend,
    BudgetStateError,
    WindowedBudget,
    sequential_composition,
    split_budget,
)
from stream_anon.privacy.dp_kmeans import QuadTreeKMeans, nicv, window_epsilon
from stream_anon.privacy.epsilon_selection import select_epsilon
from stream_anon.privacy.exact import IntegerTable
from stream_anon.privacy.frequency import FrequencyEstimate
from stream_anon.privacy.mechanism import LocalMechanism, PrivacyMechanism
from stream_anon.privacy.person_budget import PersonBudgetSketch
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
    "BudgetStateError",
    "DiscretizedBoundedLaplace",
    "FrequencyEstimate",
    "IntegerTable",
    "KRandomizedResponse",
    "LExtendedSubstitution",
    "LocalMechanism",
    "PersonBudgetSketch",
    "PrivacyMechanism",
    "PrivacyParameterError",
    "QuadTreeKMeans",
    "RandomSubstitution",
    "UnsafeFloatBoundedLaplace",
    "WindowedBudget",
    "crypto_rng",
    "exact_epsilon",
    "frapp_standard_error_bound",
    "gamma_for_epsilon",
    "is_cryptographic",
    "nicv",
    "no_repeat_epsilon",
    "record_epsilon",
    "secure_rng",
    "seeded_crypto_rng",
    "select_epsilon",
    "sequential_composition",
    "split_budget",
    "window_epsilon",
]
