"""The continuous bounded Laplace (the ideal real-valued mechanism): its scale for a target eps and closed forms.

N. Holohan, S. Antonatos, S. Braghin, P. Mac Aonghusa, "The Bounded Laplace Mechanism in Differential
Privacy", Journal of Privacy and Confidentiality 10(1), 2020.  On the normalized domain [-1, 1], input q,
scale b, the density is f_q(y) = exp(-|y - q| / b) / (2 b C_q) with C_q = 1 - (exp(-(q+1)/b) + exp(-(1-q)/b)) / 2;
its eps for neighbours at distance dQ is dQ / b + ln dC(b) (:func:`actual_epsilon`), so the naive b = dQ / eps
under-protects unless dQ is the whole width.  The grid mechanism calibrates against its own table instead
(:mod:`.grid`); these forms drive the unsafe binary64 sampler (:mod:`.unsafe_float`) and the calibration's
first guess.
"""

from __future__ import annotations

import math

import numpy as np

from stream_anon.core.validation import require_float
from stream_anon.privacy.base import check_epsilon, parameter_error

__all__ = [
    "actual_epsilon",
    "bounded_laplace_scale",
    "normalizer_ratio",
]


def normalizer_ratio(scale: float, sensitivity: float, width: float) -> float:
    """dC(b) of Holohan et al. (2020): max over neighbours of C_q' / C_q (>= 1; 1 when sensitivity == width)."""
    b, dq, w = float(scale), float(sensitivity), float(width)
    num = -math.expm1(-dq / b) - math.expm1(-(w - dq) / b)
    den = -math.expm1(-w / b)
    return num / den


def actual_epsilon(scale: float, sensitivity: float, width: float) -> float:
    """Exact eps of the bounded Laplace with this scale: dQ / b + ln dC(b) (tight for delta = 0).

    The bound is attained at q = lower, q' = lower + dQ, output y = lower (Holohan et al. 2020), e.g.
    sensitivity 1 on [-1, 1] with the naive b = 1 gives 1 + ln dC(1) = 1.38, not 1.
    """
    require_float("scale", scale, low=0.0, low_open=True, error=parameter_error)
    dq = min(float(sensitivity), float(width))
    return dq / scale + math.log(normalizer_ratio(scale, dq, width))


def bounded_laplace_scale(*, epsilon: float, sensitivity: float, width: float, delta: float = 0.0) -> float:
    """Smallest scale b with dQ / b + ln dC(b) <= eps - ln(1 - delta) (Holohan et al. 2020, fixed point).

    Solved by bisection to machine precision; the returned value is on the safe side of the fixed point.
    A sensitivity above the width is replaced by the width (no two inputs of the domain differ by more).
    """
    eps = check_epsilon(epsilon)
    require_float("sensitivity", sensitivity, low=0.0, low_open=True, error=parameter_error)
    require_float("width", width, low=0.0, low_open=True, error=parameter_error)
    require_float("delta", delta, low=0.0, high=1.0, high_open=True, error=parameter_error)
    dq = min(float(sensitivity), float(width))
    budget = eps - math.log1p(-delta)

    def loss(b: float) -> float:
        return dq / b + math.log(normalizer_ratio(b, dq, width))

    lo = dq / budget  # loss(lo) >= budget since ln dC >= 0
    if loss(lo) <= budget:
        return lo
    hi = lo * 2.0
    while loss(hi) > budget:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if loss(mid) > budget:
            lo = mid
        else:
            hi = mid
    return hi


# ------------------------------------------------------- closed forms on [-1, 1] (ideal real-valued mechanism)
def normalizer(q: np.ndarray, b: float) -> np.ndarray:
    """C_q = 1 - (exp(-(q+1)/b) + exp(-(1-q)/b)) / 2 on [-1, 1]."""
    return -0.5 * (np.expm1(-(q + 1.0) / b) + np.expm1(-(1.0 - q) / b))


def unit_bias(q: np.ndarray, b: float) -> np.ndarray:
    """E[Y] - q on [-1, 1] (diffprivlib/Holohan closed form with lower=-1, upper=1)."""
    a = np.exp(-(q + 1.0) / b)
    c = np.exp(-(1.0 - q) / b)
    bias: np.ndarray = ((b + 1.0 + q) / 2.0 * a - (b + 1.0 - q) / 2.0 * c) / normalizer(q, b)
    return bias


def unit_variance(q: np.ndarray, b: float) -> np.ndarray:
    """Var[Y] on [-1, 1]."""
    a = np.exp(-(q + 1.0) / b)
    c = np.exp(-(1.0 - q) / b)
    second = (q * q - (a + c) / 2.0 - b * (a + c) + b * b * (2.0 - a - c)) / normalizer(q, b)
    mean = q + unit_bias(q, b)
    variance: np.ndarray = np.maximum(second - mean * mean, 0.0)
    return variance


def unit_cdf(y: np.ndarray, q: np.ndarray, b: float) -> np.ndarray:
    """P(Y <= y | q) on [-1, 1]."""
    y = np.clip(y, -1.0, 1.0)
    left_mass = -0.5 * np.expm1(-(q + 1.0) / b)
    below = np.where(
        y < q,
        0.5 * (np.exp(-(q - y) / b) - np.exp(-(q + 1.0) / b)),
        left_mass - 0.5 * np.expm1(-(y - q) / b),
    )
    cdf: np.ndarray = np.clip(below / normalizer(q, b), 0.0, 1.0)
    return cdf
