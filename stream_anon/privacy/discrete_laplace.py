"""Exact discrete Laplace noise for integer counts (the geometric mechanism), sampled with integers only.

References
----------
* A. Ghosh, T. Roughgarden, M. Sundararajan, "Universally utility-maximizing privacy mechanisms", STOC 2009
  (the geometric mechanism).
* C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020,
  Algorithms 1 and 2 (exact sampling of Bernoulli(exp(-gamma)) and of the discrete Laplace with rational scale).
  OpenDP's ``make_laplace`` on integers uses the same construction (our test oracle).

The discrete Laplace with scale t/s (positive integers) has pmf

    P(z) = (1 - e^{-s/t}) / (1 + e^{-s/t}) * e^{-|z| s / t},   z in Z,

so adding it to an integer query of L1 sensitivity D gives exactly eps = D s / t: the ratio of the pmfs at
z and z + D is at most e^{D s/t}, attained.  A float scale is first rounded UP to a multiple of 2^-20
(:func:`rational_scale`), so the eps computed from the rational is the eps of what is sampled.

Sampling (:func:`sample_discrete_laplace`) uses only ``rng.integers`` (uniform integers, no floating point), so
the output distribution is the pmf above exactly.  It has rejection loops: the running time depends on the
noise drawn (it is used centrally, once per released window; see docs/privacy-numeric.md on timing).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from stream_anon.core.validation import is_number
from stream_anon.privacy.base import PrivacyParameterError, parameter_error

__all__ = [
    "SCALE_DENOMINATOR_BITS",
    "discrete_laplace_epsilon",
    "discrete_laplace_pmf",
    "fraction_upper",
    "rational_scale",
    "sample_discrete_laplace",
]

SCALE_DENOMINATOR_BITS = 20
_MAX_INT = 2 ** 62


def fraction_upper(value: Fraction) -> float:
    """The smallest double >= ``value`` (an exact rational rounded up)."""
    f = float(value)
    if Fraction(f) < value:
        f = math.nextafter(f, math.inf)
    return f


def rational_scale(scale: float) -> Fraction:
    """``scale`` rounded UP to a multiple of 2^-20 (so the exact eps of the rational is <= that of ``scale``)."""
    if not (isinstance(scale, Fraction) or (is_number(scale) and math.isfinite(scale))):
        raise parameter_error("scale", "a number in (0, 2^30]", scale)
    fr = Fraction(scale)
    if not fr > 0 or fr > 2 ** 30:
        raise parameter_error("scale", "a number in (0, 2^30]", scale)
    den = 1 << SCALE_DENOMINATOR_BITS
    return Fraction(math.ceil(fr * den), den)


def discrete_laplace_epsilon(sensitivity: int, scale: Fraction) -> Fraction:
    """Exact eps of adding discrete Laplace(scale) to an integer query of L1 sensitivity ``sensitivity``."""
    return Fraction(int(sensitivity)) / scale


def discrete_laplace_pmf(z: np.ndarray, scale: Fraction | float) -> np.ndarray:
    """P(Z = z) in float64 (for tests and plots; sampling is exact)."""
    a = 1.0 / float(scale)
    zz = np.abs(np.asarray(z, dtype=np.float64))
    pmf: np.ndarray = np.tanh(a / 2.0) * np.exp(-a * zz)
    return pmf


def _bernoulli_exp_fraction(rng: np.random.Generator, num: np.ndarray, den: int) -> np.ndarray:
    """Bernoulli(exp(-num/den)) per element, num in [0, den] (CKS Algorithm 1: K = 1; while Bernoulli(gamma/K):
    K += 1; return K odd).  Integers only."""
    n = num.shape[0]
    k = np.ones(n, dtype=np.int64)
    active = np.arange(n)
    while active.size:
        high = np.int64(den) * k[active]
        if int(high.max()) >= _MAX_INT:  # pragma: no cover - needs K ~ 2^20 consecutive successes
            raise PrivacyParameterError("discrete Laplace: denominator overflow in Bernoulli(exp(-gamma))")
        success = rng.integers(0, high, dtype=np.int64) < num[active]
        k[active[success]] += 1
        active = active[success]
    odd: np.ndarray = (k & 1) == 1
    return odd


def sample_discrete_laplace(rng: np.random.Generator, scale: Fraction, size: int) -> np.ndarray:
    """``size`` exact draws of the discrete Laplace with rational scale t/s (CKS 2020 Algorithm 2, vectorized).

    repeat: U ~ Uniform{0..t-1}; D ~ Bernoulli(exp(-U/t)), reject if 0; V = number of successes of
    Bernoulli(exp(-1)) before the first failure; X = U + t V; Y = floor(X / s); B ~ Bernoulli(1/2), reject if
    B = 1 and Y = 0; return (1 - 2B) Y.
    """
    t, s = scale.numerator, scale.denominator
    if t >= 2 ** 50:
        raise PrivacyParameterError(f"scale: numerator {t} too large for exact int64 sampling")
    out = np.empty(int(size), dtype=np.int64)
    pending = np.arange(int(size))
    ones = np.ones(0, dtype=np.int64)
    while pending.size:
        m = pending.size
        u = rng.integers(0, t, size=m, dtype=np.int64)
        keep = _bernoulli_exp_fraction(rng, u, t)
        v = np.zeros(m, dtype=np.int64)
        active = np.arange(m)
        while active.size:
            if ones.size < active.size:
                ones = np.ones(active.size, dtype=np.int64)
            success = _bernoulli_exp_fraction(rng, ones[: active.size], 1)
            v[active[success]] += 1
            active = active[success]
        y = (u + np.int64(t) * v) // np.int64(s)
        negative = rng.integers(0, 2, size=m, dtype=np.int64) == 1
        ok = keep & ~(negative & (y == 0))
        out[pending[ok]] = np.where(negative, -y, y)[ok]
        pending = pending[~ok]
    return out
