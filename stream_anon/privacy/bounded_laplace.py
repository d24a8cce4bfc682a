"""Bounded Laplace mechanism with exact inverse-CDF sampling, and its post-processing discretization.

References
----------
* Korean patent KR 10-2456177 (bounded Laplace on [-1, 1] with stochastic discretization for categories).
* N. Holohan, S. Antonatos, S. Braghin, P. Mac Aonghusa, "The Bounded Laplace Mechanism in Differential
  Privacy", Journal of Privacy and Confidentiality 10(1), 2020 (the scale that really gives eps).
* I. Mironov, "On significance of the least significant bits for differential privacy", CCS 2012
  (floating-point caveat; see ``snap_bits``).

Each value x in the public domain [lower, upper] is normalized to q = 2 (x - lower) / (upper - lower) - 1 in
[-1, 1] and replaced by a draw from the Laplace density truncated and renormalized to [-1, 1]:

    f_q(y) = exp(-|y - q| / b) / (2 b C_q),   C_q = 1 - (exp(-(q + 1) / b) + exp(-(1 - q) / b)) / 2.

The scale b is the smallest b with  dQ / b + ln dC(b) <= eps - ln(1 - delta)  (Holohan et al., Thm 4.3), where

    dC(b) = (2 - exp(-dQ / b) - exp(-(D - dQ) / b)) / (1 - exp(-D / b))

is the worst ratio of normalizers C_q' / C_q over neighbouring inputs (D = domain width).  When the sensitivity
equals the domain width (the patent's dQ = 2 on [-1, 1]) dC = 1 and b = dQ / (eps - ln(1 - delta)) = 2 / eps;
otherwise the naive b = dQ / eps under-protects (``actual_epsilon``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, check_int, secure_rng

if TYPE_CHECKING:  # pragma: no cover
    from stream_anon.privacy.frequency import FrequencyEstimate

__all__ = [
    "BoundedLaplace",
    "DiscretizedBoundedLaplace",
    "actual_epsilon",
    "bounded_laplace_scale",
    "normalizer_ratio",
]

OutOfBounds = Literal["error", "clip"]


# ---------------------------------------------------------------------------------------------- scale
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
    _check_positive(scale, "scale")
    dq = min(float(sensitivity), float(width))
    return dq / scale + math.log(normalizer_ratio(scale, dq, width))


def bounded_laplace_scale(*, epsilon: float, sensitivity: float, width: float, delta: float = 0.0) -> float:
    """Smallest scale b with dQ / b + ln dC(b) <= eps - ln(1 - delta) (Holohan et al. 2020, fixed point).

    Solved by bisection to machine precision; the returned value is on the safe side of the fixed point.
    A sensitivity above the width is replaced by the width (no two inputs of the domain differ by more).
    """
    eps = check_epsilon(epsilon)
    _check_positive(sensitivity, "sensitivity")
    _check_positive(width, "width")
    if not (0.0 <= delta < 1.0):
        raise PrivacyParameterError(f"delta: must be in [0, 1), got {delta!r}")
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


def _check_positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise PrivacyParameterError(f"{name}: expected a positive number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not (v > 0) or math.isinf(v):
        raise PrivacyParameterError(f"{name}: must be in (0, inf), got {value!r}")
    return v


def _check_finite(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise PrivacyParameterError(f"{name}: expected a finite number, got {type(value).__name__} {value!r}")
    v = float(value)
    if not math.isfinite(v):
        raise PrivacyParameterError(f"{name}: must be finite, got {value!r}")
    return v


# ------------------------------------------------------------------------------- normalized closed forms
def _normalizer(q: np.ndarray, b: float) -> np.ndarray:
    """C_q = 1 - (exp(-(q+1)/b) + exp(-(1-q)/b)) / 2 on [-1, 1]."""
    return -0.5 * (np.expm1(-(q + 1.0) / b) + np.expm1(-(1.0 - q) / b))


def _bias_n(q: np.ndarray, b: float) -> np.ndarray:
    """E[Y] - q on [-1, 1] (diffprivlib/Holohan closed form with lower=-1, upper=1)."""
    a = np.exp(-(q + 1.0) / b)
    c = np.exp(-(1.0 - q) / b)
    return ((b + 1.0 + q) / 2.0 * a - (b + 1.0 - q) / 2.0 * c) / _normalizer(q, b)


def _variance_n(q: np.ndarray, b: float) -> np.ndarray:
    a = np.exp(-(q + 1.0) / b)
    c = np.exp(-(1.0 - q) / b)
    second = (q * q - (a + c) / 2.0 - b * (a + c) + b * b * (2.0 - a - c)) / _normalizer(q, b)
    mean = q + _bias_n(q, b)
    return np.maximum(second - mean * mean, 0.0)


def _cdf_n(y: np.ndarray, q: np.ndarray, b: float) -> np.ndarray:
    """P(Y <= y | q) on [-1, 1]."""
    y = np.clip(y, -1.0, 1.0)
    left_mass = -0.5 * np.expm1(-(q + 1.0) / b)
    below = np.where(
        y < q,
        0.5 * (np.exp(-(q - y) / b) - np.exp(-(q + 1.0) / b)),
        left_mass - 0.5 * np.expm1(-(y - q) / b),
    )
    return np.clip(below / _normalizer(q, b), 0.0, 1.0)


def _sample_n(q: np.ndarray, b: float, rng: np.random.Generator) -> np.ndarray:
    """Exact inverse-CDF draws from f_q on [-1, 1]; one uniform per value, no rejection, time independent of q.

    The mass left of q is (1 - exp(-(q+1)/b)) / 2, right of q (1 - exp(-(1-q)/b)) / 2.  A uniform u scaled to the
    total picks the side and, rescaled within it, the quantile w of a truncated exponential on [0, a]:
    distance d = -b log(1 - w (1 - exp(-a/b))).
    """
    m_left = -np.expm1(-(q + 1.0) / b)
    m_right = -np.expm1(-(1.0 - q) / b)
    u = rng.random(q.shape) * (m_left + m_right)
    left = u < m_left
    w_m = np.where(left, u, u - m_left)  # = w * (1 - exp(-a/b)), w uniform on [0, 1) within the chosen side
    d = -b * np.log1p(-w_m)
    y = np.where(left, q - d, q + d)
    return np.clip(y, -1.0, 1.0)


# ---------------------------------------------------------------------------------------------- mechanism
class BoundedLaplace:
    """Bounded Laplace mechanism on a public domain [lower, upper] (Holohan et al. 2020; KR 10-2456177).

    Parameters (keyword-only): ``epsilon`` > 0; public bounds ``lower < upper`` (never derived from data);
    ``sensitivity`` (default the domain width, i.e. any two values are neighbours: the patent's dQ = 2 on
    [-1, 1]); ``delta`` in [0, 1); ``out_of_bounds``: ``"error"`` (default) or ``"clip"`` inputs into the domain;
    ``snap_bits``: if set, round outputs to multiples of 2^-snap_bits on the normalized scale [-1, 1]
    (a post-processing mitigation of Mironov's floating-point attack, see docs); ``rng``.

    ``scale`` is b in the data's units; ``normalized_scale`` is b on [-1, 1].
    """

    def __init__(
        self,
        *,
        epsilon: float,
        lower: float,
        upper: float,
        sensitivity: float | None = None,
        delta: float = 0.0,
        out_of_bounds: OutOfBounds = "error",
        snap_bits: int | None = None,
        rng: np.random.Generator | int | None = None,
    ) -> None:
        self.epsilon = check_epsilon(epsilon)
        self.lower = _check_finite(lower, "lower")
        self.upper = _check_finite(upper, "upper")
        if not self.upper > self.lower:
            raise PrivacyParameterError(f"upper: must be greater than lower={self.lower}, got {upper!r}")
        self.width = self.upper - self.lower
        if sensitivity is None:
            sensitivity = self.width
        self.sensitivity = _check_positive(sensitivity, "sensitivity")
        if self.sensitivity > self.width:
            raise PrivacyParameterError(
                f"sensitivity: must be in (0, upper - lower = {self.width}], got {sensitivity!r}")
        if isinstance(delta, bool) or not isinstance(delta, int | float | np.floating) or not 0.0 <= delta < 1.0:
            raise PrivacyParameterError(f"delta: must be in [0, 1), got {delta!r}")
        self.delta = float(delta)
        if out_of_bounds not in ("error", "clip"):
            raise PrivacyParameterError(f"out_of_bounds: must be 'error' or 'clip', got {out_of_bounds!r}")
        self.out_of_bounds: OutOfBounds = out_of_bounds
        self.snap_bits = None if snap_bits is None else check_int(snap_bits, "snap_bits", 1, 52)
        self.rng = secure_rng(rng)
        self.scale = bounded_laplace_scale(epsilon=self.epsilon, sensitivity=self.sensitivity,
                                           width=self.width, delta=self.delta)
        self.normalized_scale = 2.0 * self.scale / self.width
        self.naive_scale = self.sensitivity / self.epsilon

    def __repr__(self) -> str:
        return (f"BoundedLaplace(epsilon={self.epsilon}, lower={self.lower}, upper={self.upper}, "
                f"sensitivity={self.sensitivity}, delta={self.delta}, scale={self.scale:.6g})")

    # ---------------------------------------------------------------- conversions
    def _to_unit(self, x: Any, name: str = "value") -> np.ndarray:
        arr = np.asarray(x, dtype=np.float64)
        if np.isnan(arr).any():
            raise PrivacyParameterError(f"{name}: NaN is not a value in [{self.lower}, {self.upper}]")
        if self.out_of_bounds == "error":
            bad = (arr < self.lower) | (arr > self.upper)
            if bad.any():
                v = float(arr[bad].flat[0])
                raise PrivacyParameterError(
                    f"{name}: must be in the public domain [{self.lower}, {self.upper}], got {v!r} "
                    f"({int(bad.sum())} value(s) outside; pass out_of_bounds='clip' to clip)")
        q = (arr - self.lower) * (2.0 / self.width) - 1.0
        return np.clip(q, -1.0, 1.0)

    def _from_unit(self, y: np.ndarray) -> np.ndarray:
        return np.clip(self.lower + (y + 1.0) * (self.width / 2.0), self.lower, self.upper)

    # ---------------------------------------------------------------- randomisation
    def randomise_many(self, x: Any) -> np.ndarray:
        """Perturb an array of values (vectorized, exact inverse CDF); returns float64 values in [lower, upper]."""
        q = self._to_unit(x)
        y = _sample_n(q, self.normalized_scale, self.rng)
        if self.snap_bits is not None:
            step = 2.0 ** -self.snap_bits
            y = np.clip(np.round(y / step) * step, -1.0, 1.0)
        return self._from_unit(y)

    def randomise(self, x: float) -> float:
        """Perturb one value."""
        return float(self.randomise_many(np.asarray([x], dtype=np.float64))[0])

    # ---------------------------------------------------------------- closed forms (data units)
    def bias(self, x: Any) -> np.ndarray | float:
        """E[M(x)] - x (closed form, Holohan et al. 2020 / diffprivlib)."""
        q = self._to_unit(x)
        return _scalar_or_array(_bias_n(q, self.normalized_scale) * (self.width / 2.0), x)

    def variance(self, x: Any) -> np.ndarray | float:
        """Var[M(x)] (closed form)."""
        q = self._to_unit(x)
        return _scalar_or_array(_variance_n(q, self.normalized_scale) * (self.width / 2.0) ** 2, x)

    def expected_output(self, x: Any) -> np.ndarray | float:
        """g(x) = E[M(x)] = x + bias(x); strictly increasing in x (debiasing helper)."""
        q = self._to_unit(x)
        g = q + _bias_n(q, self.normalized_scale)
        return _scalar_or_array(self.lower + (g + 1.0) * (self.width / 2.0), x)

    def density(self, y: Any, x: float) -> np.ndarray:
        """f_x(y) in data units (0 outside [lower, upper])."""
        q = self._to_unit(np.asarray([x]))
        b = self.normalized_scale
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        dens = np.exp(-np.abs(yn - q) / b) / (2.0 * b * _normalizer(q, b)) * (2.0 / self.width)
        return np.where((yn >= -1.0) & (yn <= 1.0), dens, 0.0)

    def cdf(self, y: Any, x: float) -> np.ndarray:
        """P(M(x) <= y)."""
        q = self._to_unit(np.asarray([x]))
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        return _cdf_n(yn, q, self.normalized_scale)

    # ---------------------------------------------------------------- inverse / estimation
    def _g_n(self, q: np.ndarray) -> np.ndarray:
        return q + _bias_n(q, self.normalized_scale)

    def inverse_expected_output(self, y: Any) -> np.ndarray | float:
        """g^{-1}(y): the input whose expected output is y (vectorized bisection, 60 steps = machine precision).

        Values below g(lower) map to lower, above g(upper) to upper (g's range is narrower than the domain).
        """
        yn = (np.asarray(y, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        lo = np.full(yn.shape, -1.0)
        hi = np.full(yn.shape, 1.0)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            below = self._g_n(mid) < yn
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        return _scalar_or_array(self._from_unit(0.5 * (lo + hi)), y)

    def unbiased_transform(self, perturbed: Any, *, boundary_width: float = 0.1) -> np.ndarray:
        """h(y) with E[h(M(x))] = x exactly for every x at least ``boundary_width`` (normalized) from both bounds.

        On [-1, 1]:  h(y) = y - b (exp(-(y+1)/b) - exp(-(1-y)/b)) - s 1[y <= -1+w] + s 1[y >= 1-w],
        s = b C_{-1} / expm1(w/b),  C_{-1} = (1 - exp(-2/b)) / 2.
        Derivation: E[h(Y)] = q  <=>  int h(y) exp(-|y-q|/b)/(2b) dy = q C_q; applying (1 - b^2 d^2/dq^2), which
        inverts the Laplace kernel, gives the smooth part; the Robin boundary conditions of a Laplace convolution
        require point masses -b^2 C_{-1} at -1 and +b^2 C_{-1} at +1, which no function of one report can carry
        (so no exactly unbiased single-report estimator exists).  The point masses are spread over the strips of
        width w with heights chosen so the result is exact for all q in [-1+w, 1-w]; for q inside a strip the
        bias is at most (b/2)(1 - exp(-w/b)) <= w/2 (normalized units; ``max_transform_bias``).
        """
        w = _check_positive(boundary_width, "boundary_width")
        if w > 1.0:
            raise PrivacyParameterError(f"boundary_width: must be in (0, 1] (normalized units), got {boundary_width!r}")
        b = self.normalized_scale
        yn = (np.asarray(perturbed, dtype=np.float64) - self.lower) * (2.0 / self.width) - 1.0
        c_edge = -0.5 * math.expm1(-2.0 / b)
        spike = b * c_edge / math.expm1(w / b)
        hn = yn - b * (np.exp(-(yn + 1.0) / b) - np.exp(-(1.0 - yn) / b))
        hn = hn - spike * (yn <= -1.0 + w) + spike * (yn >= 1.0 - w)
        return self.lower + (hn + 1.0) * (self.width / 2.0)

    def max_transform_bias(self, *, boundary_width: float = 0.1) -> float:
        """Largest |E[h(M(x))] - x| of ``unbiased_transform`` (attained at x = lower or upper), in data units."""
        w = _check_positive(boundary_width, "boundary_width")
        b = self.normalized_scale
        return 0.5 * b * -math.expm1(-w / b) * self.width / 2.0

    def estimate_mean(self, perturbed: Any, *,
                      method: Literal["boundary-corrected", "aggregate", "per-value"] = "boundary-corrected",
                      boundary_width: float = 0.1) -> tuple[float, float]:
        """Estimate the mean of the true values from perturbed outputs; returns (mean, standard error).

        ``"boundary-corrected"`` (default): mean of ``unbiased_transform`` values; exactly unbiased when no true
        value lies within ``boundary_width`` (normalized, i.e. w * (upper - lower) / 2 in data units) of a bound,
        else biased by at most ``max_transform_bias`` times the share of such values.  SE = sd(h) / sqrt(n)
        (conservative for heterogeneous data).
        ``"aggregate"``: g^{-1}(ybar).  ybar is unbiased for mean_i g(x_i); consistent when all inputs are
        equal, but for heterogeneous data it converges to g^{-1}(mean_i g(x_i)) (``aggregate_target``), which
        differs from the mean through g's curvature (ADULT age, eps = 1: +1.6 years).  SE by the delta method,
        s / sqrt(n) / g'(mean_hat).
        ``"per-value"``: mean of g^{-1}(y_i) (clipped to g's range); SE = sd / sqrt(n); biased.
        """
        y = np.asarray(perturbed, dtype=np.float64).ravel()
        n = y.size
        if n < 2:
            raise PrivacyParameterError(f"perturbed: need at least 2 values to estimate a mean and its SE, got {n}")
        if np.isnan(y).any():
            raise PrivacyParameterError("perturbed: contains NaN")
        if method == "boundary-corrected":
            hv = self.unbiased_transform(y, boundary_width=boundary_width)
            return float(hv.mean()), float(hv.std(ddof=1)) / math.sqrt(n)
        if method == "aggregate":
            ybar = float(y.mean())
            est = float(self.inverse_expected_output(ybar))
            se_y = float(y.std(ddof=1)) / math.sqrt(n)
            return est, se_y / self._g_slope(est)
        if method == "per-value":
            xs = np.asarray(self.inverse_expected_output(y))
            return float(xs.mean()), float(xs.std(ddof=1)) / math.sqrt(n)
        raise PrivacyParameterError(
            f"method: must be 'boundary-corrected', 'aggregate' or 'per-value', got {method!r}")

    def aggregate_target(self, true_values: Any) -> float:
        """g^{-1}(mean_i g(x_i)): the limit of the aggregate mean estimator for these inputs (diagnostic)."""
        return float(self.inverse_expected_output(float(np.mean(self.expected_output(true_values)))))

    def _g_slope(self, x: float) -> float:
        """dg/dx at x (central difference on [-1, 1], step 1e-5; g is smooth)."""
        q = float(self._to_unit(np.asarray([x]))[0])
        h = 1e-5
        lo, hi = max(-1.0, q - h), min(1.0, q + h)
        d = float(self._g_n(np.asarray([hi]))[0] - self._g_n(np.asarray([lo]))[0]) / (hi - lo)
        return d  # slope is unitless: the same in data units and on [-1, 1]


def _scalar_or_array(result: np.ndarray, like: Any) -> np.ndarray | float:
    return float(result.reshape(-1)[0]) if np.ndim(like) == 0 else result


# --------------------------------------------------------------------------------- discretized variant
def _exp_moments(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """I0 = int_0^1 e^{-lam u} du and I1 = int_0^1 u e^{-lam u} du, stable for small |lam| (series)."""
    lam = np.asarray(lam, dtype=np.float64)
    small = np.abs(lam) < 0.5
    safe = np.where(small, 1.0, lam)
    i0 = np.where(small, 0.0, -np.expm1(-safe) / safe)
    i1 = np.where(small, 0.0, (1.0 - np.exp(-safe) * (1.0 + safe)) / (safe * safe))
    s0 = np.zeros_like(lam)
    s1 = np.zeros_like(lam)
    term = np.ones_like(lam)  # (-lam)^n / n!
    for n in range(0, 25):
        s0 = s0 + term / (n + 1)
        s1 = s1 + term / (n + 2)
        term = term * (-lam) / (n + 1)
    return np.where(small, s0, i0), np.where(small, s1, i1)


def discretized_transition_matrix(epsilon: float, m: int) -> np.ndarray:
    """P[i, j] = P(report j | true i) for the bounded Laplace on [-1, 1] (b = 2/eps) + stochastic rounding.

    Category i sits at t_i = -1 + 2 i / (m - 1); an output y in [t_k, t_{k+1}] is reported as k+1 with
    probability (y - t_k)/h, else k (h = 2/(m-1)), i.e. the rounding kernel of j is the hat max(0, 1 - |y-t_j|/h).
    Each P[i, j] is the closed-form integral of the truncated Laplace density against that kernel.
    """
    m = check_int(m, "m", 2)
    eps = check_epsilon(epsilon)
    b = bounded_laplace_scale(epsilon=eps, sensitivity=2.0, width=2.0)
    h = 2.0 / (m - 1)
    t = -1.0 + h * np.arange(m)
    P = np.zeros((m, m))
    for i in range(m):
        q = t[i]
        cq = float(_normalizer(np.asarray(q), b))
        for k in range(m - 1):
            # on [t_k, t_{k+1}], y = t_k + h u; density exp(-|y - q|/b)/(2 b C)
            if k >= i:  # y >= q: exp(-(t_k - q)/b) exp(-(h/b) u)
                amp = math.exp(-(t[k] - q) / b)
                lam = h / b
            else:  # y <= q: exp(-(q - t_k)/b) exp(+(h/b) u)
                amp = math.exp(-(q - t[k]) / b)
                lam = -h / b
            i0, i1 = _exp_moments(np.asarray(lam))
            mass_up = amp * h * float(i1) / (2.0 * b * cq)
            mass_all = amp * h * float(i0) / (2.0 * b * cq)
            P[i, k + 1] += mass_up
            P[i, k] += mass_all - mass_up
    return P


class DiscretizedBoundedLaplace:
    """Bounded Laplace for categorical/ordinal values with post-processing discretization (KR 10-2456177).

    The m categories (in the given order; the order matters for ordinal data) sit on an equally spaced grid
    t_i = -1 + 2 i/(m-1) of [-1, 1] (any [-C, C] gives the same mechanism: the scale 2C/eps scales with it).
    A value is perturbed by ``BoundedLaplace(epsilon, -1, 1)`` (sensitivity = width, b = 2/eps), then
    discretized stochastically: position p = (y + 1)/h, k = floor(p), k+1 with probability p - k, clipped to
    the grid; decoded to the category.  Post-processing preserves eps-LDP.
    """

    def __init__(self, *, epsilon: float, categories: Sequence[Any], rng: np.random.Generator | int | None = None
                 ) -> None:
        self.epsilon = check_epsilon(epsilon)
        cats = list(categories)
        if len(cats) < 2:
            raise PrivacyParameterError(f"categories: need at least 2 categories, got {len(cats)}")
        if len(set(cats)) != len(cats):
            raise PrivacyParameterError(f"categories: must be distinct, got {cats!r}")
        self.categories: tuple[Any, ...] = tuple(cats)
        self.m = len(cats)
        self._index = {c: i for i, c in enumerate(cats)}
        self.rng = secure_rng(rng)
        self._laplace = BoundedLaplace(epsilon=self.epsilon, lower=-1.0, upper=1.0, rng=self.rng)
        self.scale = self._laplace.scale
        self.step = 2.0 / (self.m - 1)
        self._P: np.ndarray | None = None
        self._cat_array = np.empty(self.m, dtype=object)
        self._cat_array[:] = cats

    def __repr__(self) -> str:
        return f"DiscretizedBoundedLaplace(epsilon={self.epsilon}, m={self.m})"

    @property
    def transition_matrix(self) -> np.ndarray:
        """P[i, j] = P(report j | true i), exact (rows sum to 1)."""
        if self._P is None:
            self._P = discretized_transition_matrix(self.epsilon, self.m)
        return self._P.copy()

    @property
    def p_true(self) -> np.ndarray:
        """P(report = true category) per category (diagonal of the transition matrix)."""
        return np.diag(self.transition_matrix).copy()

    def encode(self, values: Any) -> np.ndarray:
        """Category values -> indices 0..m-1; a value outside the domain raises an error naming it."""
        arr = np.asarray(values, dtype=object).ravel()
        try:
            return np.fromiter((self._index[v] for v in arr), dtype=np.int64, count=arr.size)
        except KeyError as e:
            raise PrivacyParameterError(
                f"value: {e.args[0]!r} is not one of the {self.m} categories {list(self.categories)[:12]!r}"
            ) from None
        except TypeError as e:  # unhashable
            raise PrivacyParameterError(f"value: unhashable value in input ({e})") from None

    def randomise_indices(self, indices: Any) -> np.ndarray:
        """Perturb category indices 0..m-1 (vectorized); returns reported indices."""
        idx = np.asarray(indices)
        if idx.size and (not np.issubdtype(idx.dtype, np.integer) or idx.min() < 0 or idx.max() >= self.m):
            raise PrivacyParameterError(f"indices: must be integers in [0, {self.m - 1}], got dtype {idx.dtype} "
                                        f"range [{idx.min()}, {idx.max()}]")
        t = -1.0 + self.step * idx.astype(np.float64)
        y = _sample_n(t, self._laplace.normalized_scale, self.rng)
        pos = (y + 1.0) / self.step
        k = np.floor(pos)
        up = self.rng.random(pos.shape) < (pos - k)
        return np.clip(k + up, 0, self.m - 1).astype(np.int64)

    def randomise_many(self, values: Any) -> np.ndarray:
        """Perturb an array of categories; returns an object array of reported categories."""
        return self._cat_array[self.randomise_indices(self.encode(values))]

    def randomise(self, value: Any) -> Any:
        return self.randomise_many([value])[0]

    def estimate_counts(self, reports: Any) -> FrequencyEstimate:
        """Unbiased counts n_hat = P^{-T} N from reported categories N, with standard errors.

        E[N] = P^T n, so n_hat = solve(P^T, N) is unbiased.  Cov(N) = sum_i n_i (diag(P_i) - P_i P_i^T) is
        estimated by diag(N) - P^T diag(n_hat) P (unbiased); SE = sqrt(diag(P^{-T} Cov P^{-1})).
        """
        counts = np.bincount(self.encode(reports), minlength=self.m).astype(np.float64)
        return self.estimate_counts_from_report_counts(counts)

    def estimate_counts_from_report_counts(self, report_counts: Any) -> FrequencyEstimate:
        from stream_anon.privacy.frequency import FrequencyEstimate

        N = np.asarray(report_counts, dtype=np.float64)
        if N.shape != (self.m,):
            raise PrivacyParameterError(f"report_counts: expected shape ({self.m},), got {N.shape}")
        P = self.transition_matrix
        inv_t = np.linalg.inv(P.T)
        n_hat = inv_t @ N
        cov_n = np.diag(N) - P.T @ np.diag(n_hat) @ P
        cov = inv_t @ cov_n @ inv_t.T
        se = np.sqrt(np.clip(np.diag(cov), 0.0, None))
        return FrequencyEstimate(self.categories, n_hat, se, int(round(N.sum())), epsilon=self.epsilon,
                                 mechanism="discretized-bounded-laplace")
