"""The earlier binary64 bounded Laplace sampler, kept as its own class for comparisons: NOT eps-DP as computed.

The sampler draws the continuous bounded Laplace (Holohan et al. 2020; :mod:`.theory`) by a binary64 inverse
CDF from one uniform double.  That is eps-DP only for the ideal real-valued mechanism: in binary64 the set of
reachable outputs depends on the input (I. Mironov, "On significance of the least significant bits for
differential privacy", CCS 2012), and a share of the outputs of one input cannot be produced from a
neighbouring input (``stream_anon.bench.reachability``: 14 % of the outputs of age 38 are unreachable from 39),
so its ``exact_epsilon`` is infinite.  No default uses it; :class:`~stream_anon.privacy.bounded_laplace.
mechanism.BoundedLaplace` (the grid) is the mechanism to deploy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stream_anon.core.validation import require_float
from stream_anon.privacy.base import PrivacyParameterError, parameter_error
from stream_anon.privacy.bounded_laplace.mechanism import BoundedLaplaceBase, Calibration, OutOfBounds
from stream_anon.privacy.bounded_laplace.theory import (
    actual_epsilon,
    bounded_laplace_scale,
    unit_bias,
    unit_cdf,
    unit_variance,
)

__all__ = [
    "FloatModel",
    "UnsafeFloatBoundedLaplace",
    "sample_unit_from_uniform",
]


def sample_unit_from_uniform(q: np.ndarray, b: float, uniform: np.ndarray) -> np.ndarray:
    """The binary64 map (input q, uniform u in [0, 1)) -> output on [-1, 1] of the unsafe sampler (deterministic).

    The mass left of q is (1 - exp(-(q+1)/b)) / 2, right of q (1 - exp(-(1-q)/b)) / 2.  A uniform u scaled to the
    total picks the side and, rescaled within it, the quantile w of a truncated exponential on [0, a]:
    distance d = -b log(1 - w (1 - exp(-a/b))).  Exact for real numbers; in binary64 the set of reachable
    outputs depends on q (Mironov 2012).
    """
    m_left = -np.expm1(-(q + 1.0) / b)
    m_right = -np.expm1(-(1.0 - q) / b)
    u = uniform * (m_left + m_right)
    left = u < m_left
    w_m = np.where(left, u, u - m_left)  # = w * (1 - exp(-a/b)), w uniform on [0, 1) within the chosen side
    d = -b * np.log1p(-w_m)
    y = np.where(left, q - d, q + d)
    clipped: np.ndarray = np.clip(y, -1.0, 1.0)
    return clipped


class FloatModel:
    """The binary64 sampler and the continuous closed forms, in data units (normalized scale ``b`` on [-1, 1])."""

    def __init__(self, lower: float, upper: float, normalized_scale: float, snap_bits: int | None) -> None:
        self.lower, self.upper = lower, upper
        self.width = upper - lower
        self.b = normalized_scale
        self.snap_bits = snap_bits

    def to_unit(self, x: np.ndarray) -> np.ndarray:
        return np.clip((x - self.lower) * (2.0 / self.width) - 1.0, -1.0, 1.0)

    def from_unit(self, y: np.ndarray) -> np.ndarray:
        return np.clip(self.lower + (y + 1.0) * (self.width / 2.0), self.lower, self.upper)

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One uniform double per value (``rng.random``), through :func:`sample_unit_from_uniform`."""
        q = self.to_unit(x)
        y = sample_unit_from_uniform(q, self.b, rng.random(q.shape))
        if self.snap_bits is not None:
            step = 2.0 ** -self.snap_bits
            y = np.clip(np.round(y / step) * step, -1.0, 1.0)
        return self.from_unit(y)

    def expected_output(self, x: np.ndarray) -> np.ndarray:
        q = self.to_unit(x)
        return self.from_unit(q + unit_bias(q, self.b))

    def variance(self, x: np.ndarray) -> np.ndarray:
        return unit_variance(self.to_unit(x), self.b) * (self.width / 2.0) ** 2

    def inverse_expected_output(self, y: np.ndarray) -> np.ndarray:
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        lo = np.full(yn.shape, -1.0)
        hi = np.full(yn.shape, 1.0)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            below = mid + unit_bias(mid, self.b) < yn
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return self.from_unit(0.5 * (lo + hi))

    def slope(self, x: float) -> float:
        q = float(self.to_unit(np.asarray([x]))[0])
        h = 1e-5
        lo, hi = max(-1.0, q - h), min(1.0, q + h)
        g = np.asarray([lo, hi]) + unit_bias(np.asarray([lo, hi]), self.b)
        return float(g[1] - g[0]) / (hi - lo)

    def cdf(self, y: np.ndarray, x: float) -> np.ndarray:
        q = self.to_unit(np.asarray([x], dtype=np.float64))
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        return unit_cdf(yn, q, self.b)

    def transform_values(self, perturbed: Any, boundary_width: float) -> np.ndarray:
        """The continuous boundary-corrected transform (see ``docs/privacy-numeric.md``)."""
        w, b = boundary_width, self.b
        yn = (np.asarray(perturbed, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        c_edge = -0.5 * math.expm1(-2.0 / b)
        spike = b * c_edge / math.expm1(w / b)
        hn = yn - b * (np.exp(-(yn + 1.0) / b) - np.exp(-(1.0 - yn) / b))
        hn = hn - spike * (yn <= -1.0 + w) + spike * (yn >= 1.0 - w)
        values: np.ndarray = self.lower + (hn + 1.0) * (self.width / 2.0)
        return values

    def max_transform_bias(self, boundary_width: float) -> float:
        return 0.5 * self.b * -math.expm1(-boundary_width / self.b) * self.width / 2.0


class UnsafeFloatBoundedLaplace(BoundedLaplaceBase):
    """The continuous bounded Laplace sampled in binary64 (module docstring): for comparisons only.

    Parameters (keyword-only): as :class:`~stream_anon.privacy.bounded_laplace.mechanism.BoundedLaplace` without
    the grid ones; ``calibration="exact"`` is the Holohan scale (:func:`.theory.bounded_laplace_scale`, with
    ``delta``), ``"patent"`` b = sensitivity / epsilon; ``snap_bits`` rounds outputs to multiples of
    2^-snap_bits on [-1, 1].  ``epsilon`` is the ideal real-valued mechanism's; ``exact_epsilon`` is ``inf``.
    ``model`` is the sampler (:class:`FloatModel`; ``stream_anon.bench.reachability`` drives it directly).
    """

    def __init__(
        self,
        *,
        epsilon: float | None = None,
        lower: float,
        upper: float,
        sensitivity: float | None = None,
        calibration: Calibration = "exact",
        scale: float | None = None,
        delta: float = 0.0,
        out_of_bounds: OutOfBounds = "error",
        snap_bits: int | None = None,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        super().__init__(epsilon=epsilon, lower=lower, upper=upper, sensitivity=sensitivity,
                         calibration=calibration, scale=scale, delta=delta, out_of_bounds=out_of_bounds,
                         snap_bits=snap_bits, rng=rng)
        if scale is not None:
            b = require_float("scale", scale, low=0.0, low_open=True, error=parameter_error)
            self.epsilon = actual_epsilon(b, self.sensitivity, self.width) - math.log1p(-self.delta)
        else:
            assert self.target_epsilon is not None
            b = (self.sensitivity / self.target_epsilon if self.calibration == "patent" else
                 bounded_laplace_scale(epsilon=self.target_epsilon, sensitivity=self.sensitivity,
                                       width=self.width, delta=self.delta))
            self.epsilon = self.target_epsilon
        self.scale = b
        self.normalized_scale = 2.0 * b / self.width
        self.model = FloatModel(self.lower, self.upper, self.normalized_scale, self.snap_bits)
        self.naive_scale = self.sensitivity / self.target_epsilon if self.target_epsilon else math.nan

    def __repr__(self) -> str:
        return (f"UnsafeFloatBoundedLaplace(epsilon={self.epsilon!r}, lower={self.lower}, upper={self.upper}, "
                f"sensitivity={self.sensitivity}, scale={self.scale:.6g})")

    @property
    def exact_epsilon(self) -> float:
        """``inf``: binary64 outputs reachable from one input but not from its neighbour (module docstring)."""
        return math.inf

    def _model(self) -> FloatModel:
        return self.model

    def unbiased_transform(self, perturbed: Any, *, boundary_width: float = 0.1) -> np.ndarray:
        """The continuous boundary-corrected transform: E[h(M(x))] = x for x at least ``boundary_width``
        (normalized, > 0) from both bounds, for the ideal real-valued mechanism."""
        w = self._boundary_width(boundary_width)
        if w == 0.0:
            raise PrivacyParameterError("boundary_width: must be > 0 for the unsafe float mechanism")
        return self.model.transform_values(perturbed, w)

    def max_transform_bias(self, *, boundary_width: float = 0.1) -> float:
        """Largest |E[h(M(x))] - x| of ``unbiased_transform`` over the domain, in data units."""
        return self.model.max_transform_bias(self._boundary_width(boundary_width))
