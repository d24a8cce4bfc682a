"""Bounded Laplace on a public grid with an exact epsilon, its discretization for categories, and the unsafe
binary64 sampler kept for comparisons.

References
----------
* Korean patent KR 10-2456177 (bounded Laplace on [-1, 1], b = 2/eps, stochastic discretization for categories).
* N. Holohan, S. Antonatos, S. Braghin, P. Mac Aonghusa, "The Bounded Laplace Mechanism in Differential
  Privacy", Journal of Privacy and Confidentiality 10(1), 2020 (the normalizer term of eps).
* I. Mironov, "On significance of the least significant bits for differential privacy", CCS 2012 (why the
  textbook floating-point sampler is not eps-DP: the set of reachable doubles depends on the input).
* C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020 and
  OpenDP's discrete Laplace (the test oracle of the grid pmf and of its privacy map).

Modules:

* :mod:`.grid`: the public grid and the integer table of the truncated discrete Laplace (the mechanism as a
  finite table: exact eps, exact sampling), its calibration to a target eps.
* :mod:`.mechanism`: :class:`BoundedLaplace` (the grid mechanism; default everywhere) and the base it shares
  with the unsafe sampler (parameters, inputs, closed forms, mean estimators).
* :mod:`.discretized`: :class:`DiscretizedBoundedLaplace` for ordinal/categorical values (post-processing of
  the bounded Laplace by stochastic rounding, stored as an integer table).
* :mod:`.unsafe_float`: :class:`UnsafeFloatBoundedLaplace`, the earlier binary64 inverse-CDF sampler: eps-DP
  only for the ideal real-valued mechanism; in binary64 a share of its outputs cannot be produced from a
  neighbouring input (``stream_anon.bench.reachability``), so its ``exact_epsilon`` is infinite.
* :mod:`.theory`: the continuous theory (Holohan scale, actual eps of a scale) and its closed forms.
"""

from __future__ import annotations

from stream_anon.privacy.bounded_laplace.discretized import (
    DiscretizedBoundedLaplace,
    calibrate_discretized_scale,
    discretized_epsilon,
    discretized_probabilities,
    discretized_transition_matrix,
)
from stream_anon.privacy.bounded_laplace.grid import (
    DEFAULT_REAL_GRID_INTERVALS,
    MAX_GRID_INTERVALS,
    calibrate_grid_scale,
    grid_epsilon,
    grid_for_domain,
    grid_laplace_probabilities,
    grid_laplace_table,
)
from stream_anon.privacy.bounded_laplace.mechanism import (
    BoundedLaplace,
    BoundedLaplaceBase,
    Calibration,
    OutOfBounds,
)
from stream_anon.privacy.bounded_laplace.theory import actual_epsilon, bounded_laplace_scale, normalizer_ratio
from stream_anon.privacy.bounded_laplace.unsafe_float import UnsafeFloatBoundedLaplace

__all__ = [
    "DEFAULT_REAL_GRID_INTERVALS",
    "MAX_GRID_INTERVALS",
    "OutOfBounds",
    "BoundedLaplace",
    "BoundedLaplaceBase",
    "Calibration",
    "DiscretizedBoundedLaplace",
    "UnsafeFloatBoundedLaplace",
    "actual_epsilon",
    "bounded_laplace_scale",
    "calibrate_discretized_scale",
    "calibrate_grid_scale",
    "discretized_epsilon",
    "discretized_probabilities",
    "discretized_transition_matrix",
    "grid_epsilon",
    "grid_for_domain",
    "grid_laplace_probabilities",
    "grid_laplace_table",
    "normalizer_ratio",
]
