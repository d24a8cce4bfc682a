"""FRAPP random substitution and its l-extended variants, with unbiased reconstruction and exact eps.

**Random substitution** (Agrawal & Haritsa, "A framework for high-accuracy privacy-preserving mining",
ICDE 2005 (FRAPP); Dowd, Xu & Zhang, "Privacy-preserving decision tree mining based on random
substitutions", ETRIMS 2006).  Over a domain of N values the "gamma-diagonal" transition matrix is
``M = x G`` with ``x = 1 / (gamma + N - 1)``, ``G`` = gamma on the diagonal and 1 elsewhere:
a record holding value i reports j with probability ``M[j, i]``.  The reconstruction from report counts
``Y`` of ``n`` records is ``X_hat_i = (gamma + N - 1) / (gamma - 1) * Y_i - n / (gamma - 1)`` (= M^-1 Y),
unbiased, with summed variance ``E||X_hat - X||^2 = n (N-1)(N + 2 gamma - 2) / (gamma - 1)^2`` for any
data.  Its relative L2 error ``||X_hat - X||_2 / ||X||_2`` has RMS at most the standard-error bound
``sqrt(N (N-1) (N + 2 gamma - 2)) / ((gamma - 1) sqrt(n))``, reached exactly for uniform data
(``||X||_2 >= n / sqrt(N)``).  With ``gamma = e^eps`` it *is* k-RR with k = N (same p = gamma x,
q = x, same estimator): eps = ln gamma.

**l-extended random substitution** (Kang, Lee & Hong, KIPS 2009): each record is randomized l times and
the reconstruction is divided by l.  Two variants:

* ``variant="independent"``: l independent draws from the column of M.  The l-fold reconstruction
  divided by l (= the mean of the l single-draw reconstructions) is unbiased; the variance is the
  single-draw variance / l; the exact privacy is ``gamma^l``: ``eps = l ln gamma``.
* ``variant="no-repeat"`` (the paper's): a draw repeating an earlier output is re-drawn (rejection),
  i.e. l draws without replacement with weight gamma for the true value and 1 for the others.  The l
  outputs are emitted SHUFFLED (a set), never in draw order (the first draw is the true value most
  often).  Dividing by l is then BIASED (``estimate_counts_paper``); the unbiased estimator is
  ``(Y_v - n b_l) / (a_l - b_l)`` with the inclusion probabilities
  ``a_l = 1 - prod_{j=0}^{l-1} (N-1-j) / (gamma+N-1-j)`` (true value among the outputs) and
  ``b_l = (l - a_l) / (N - 1)`` (a given other value; the l outputs are distinct so the inclusion
  probabilities sum to l).  Its exact eps (set of outputs) is ``ln(A/B)`` where A, B are the
  probabilities of one l-set containing / not containing the true value:
  ``A/B = (gamma / l) * sum_{k=0}^{l-1} prod_{i=k+1}^{l-1} (gamma+N-1-i) / (N-i)``
  (sum over the position k at which the true value was drawn; verified against enumeration).  In draw
  order it would be ``ln gamma + sum_{j=0}^{l-2} ln((gamma+N-2-j)/(N-1-j))`` (the k = 0 term times l).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from fractions import Fraction
from functools import cached_property
from typing import Any, Literal

import numpy as np

from stream_anon.core.validation import require_choice, require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, crypto_rng, parameter_error
from stream_anon.privacy.exact import LOG_MARGIN, UNIFORM_GRID_BITS, log_ratio_upper
from stream_anon.privacy.frequency import (
    CategoryCodec,
    FrequencyEstimate,
    SingleReportEstimator,
    counts_of_codes,
)
from stream_anon.privacy.mechanism import CategoricalDomain, LocalMechanism

Variant = Literal["independent", "no-repeat"]
VARIANTS: tuple[str, ...] = ("independent", "no-repeat")


# --------------------------------------------------------------------------------------------- closed forms
def _check_gamma(gamma: Any) -> float:
    return require_float("gamma", gamma, low=1.0, low_open=True, error=parameter_error,
                         allowed="in (1, inf) (gamma = 1 reveals nothing and reconstructs nothing)")


def frapp_transition_matrix(n_values: int, gamma: float) -> np.ndarray:
    """``M = x G``, ``x = 1/(gamma+N-1)``; ``M[j, i] = P(report j | true i)`` (columns sum to 1)."""
    n_values = require_int("n_values", n_values, low=2, error=parameter_error)
    g = _check_gamma(gamma)
    m = np.full((n_values, n_values), 1.0)
    np.fill_diagonal(m, g)
    return m / (g + n_values - 1)


def frapp_standard_error_bound(n_values: int, gamma: float, n: int) -> float:
    """Dowd et al.'s bound ``sqrt(N(N-1)(N+2gamma-2)) / ((gamma-1) sqrt(n))`` on the relative L2 error."""
    g = _check_gamma(gamma)
    big_n = float(n_values)
    return math.sqrt(big_n * (big_n - 1) * (big_n + 2 * g - 2)) / ((g - 1) * math.sqrt(n))


def no_repeat_inclusion_probabilities(n_values: int, gamma: float, n_reports: int) -> tuple[float, float]:
    """``(a_l, b_l)``: P(true value among the l distinct outputs), P(a given other value among them).

    Drawing without replacement with weights gamma (true) and 1 (others): the true value is missed iff
    each of the first l draws picks another value: ``prod_{j<l} (N-1-j)/(gamma+N-1-j)``.
    """
    n_values = require_int("n_values", n_values, low=2, error=parameter_error)
    g = _check_gamma(gamma)
    n_reports = require_int("l", n_reports, low=1, high=n_values, error=parameter_error)
    miss = 1.0
    for j in range(n_reports):
        miss *= (n_values - 1 - j) / (g + n_values - 1 - j)
    a = 1.0 - miss
    b = (n_reports - a) / (n_values - 1)
    return a, b


def no_repeat_set_ratio(n_values: int, gamma: float, n_reports: int) -> float:
    """Worst-case likelihood ratio of one shuffled output set: A/B (see module docstring)."""
    n_values = require_int("n_values", n_values, low=2, error=parameter_error)
    g = _check_gamma(gamma)
    n_reports = require_int("l", n_reports, low=1, high=n_values - 1, error=parameter_error)
    w = g + n_values - 1
    total = 0.0
    for k in range(n_reports):
        term = 1.0
        for i in range(k + 1, n_reports):
            term *= (w - i) / (n_values - i)
        total += term
    return g / n_reports * total


def no_repeat_epsilon(n_values: int, gamma: float, n_reports: int) -> float:
    """Exact eps of the no-repeat l-extended substitution with shuffled (set) output: ``ln(A/B)``."""
    return math.log(no_repeat_set_ratio(n_values, gamma, n_reports))


def no_repeat_draw_order_epsilon(n_values: int, gamma: float, n_reports: int) -> float:
    """Exact eps if the l outputs were emitted in draw order (they are not):
    ``ln gamma + sum_{j=0}^{l-2} ln((gamma+N-2-j)/(N-1-j))``."""
    n_values = require_int("n_values", n_values, low=2, error=parameter_error)
    g = _check_gamma(gamma)
    n_reports = require_int("l", n_reports, low=1, high=n_values - 1, error=parameter_error)
    return math.log(g) + sum(math.log((g + n_values - 2 - j) / (n_values - 1 - j)) for j in range(n_reports - 1))


def enumerate_no_repeat_output_probabilities(n_values: int, gamma: float, n_reports: int, true_value: int,
                                             *, ordered: bool = False) -> dict[tuple[int, ...], float]:
    """Exact output distribution by enumeration of all ordered draw sequences (small N only).

    Keys are draw sequences (``ordered=True``) or sorted tuples (the shuffled set).  Used to verify the
    closed forms above; cost ``N! / (N-l)!``.
    """
    n_values = require_int("n_values", n_values, low=2, high=12, error=parameter_error)
    g = _check_gamma(gamma)
    n_reports = require_int("l", n_reports, low=1, high=n_values, error=parameter_error)
    out: dict[tuple[int, ...], float] = {}
    for seq in itertools.permutations(range(n_values), n_reports):
        prob = 1.0
        remaining = g + n_values - 1
        for s in seq:
            w = g if s == true_value else 1.0
            prob *= w / remaining
            remaining -= w
        key = seq if ordered else tuple(sorted(seq))
        out[key] = out.get(key, 0.0) + prob
    return out


def enumerated_epsilon(n_values: int, gamma: float, n_reports: int, *, ordered: bool = False) -> float:
    """max over outputs S and inputs t, t' of ln P(S|t)/P(S|t'), by enumeration (small N)."""
    dists = [enumerate_no_repeat_output_probabilities(n_values, gamma, n_reports, t, ordered=ordered)
             for t in range(n_values)]
    worst = 0.0
    for key in dists[0]:
        probs = [d[key] for d in dists]
        worst = max(worst, math.log(max(probs) / min(probs)))
    return worst


def gamma_for_epsilon(n_values: int, epsilon: float, n_reports: int = 1, variant: Variant = "independent") -> float:
    """The gamma whose exact eps equals ``epsilon`` (independent: ``e^(eps/l)``; no-repeat: bisection)."""
    eps = check_epsilon(epsilon)
    if variant == "independent":
        return math.exp(eps / require_int("l", n_reports, low=1, error=parameter_error))
    require_choice("variant", variant, VARIANTS, error=parameter_error)
    lo, hi = 0.0, eps  # log gamma; eps(no-repeat) >= ln gamma, so ln gamma <= eps
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid <= 0:
            lo = mid
            continue
        if no_repeat_epsilon(n_values, math.exp(mid), n_reports) > eps:
            hi = mid
        else:
            lo = mid
    return math.exp(lo)


# --------------------------------------------------------------------------------------------- sampling
def _frapp_draw(true_codes: np.ndarray, u: np.ndarray, n_values: int, gamma: float) -> np.ndarray:
    """Inverse CDF of column t of M = xG, closed form: on the scale v = u (gamma+N-1), value c < t
    occupies [c, c+1), t occupies [t, t+gamma), c > t occupies [c+gamma-1, c+gamma)."""
    v = u * (gamma + n_values - 1)
    t = true_codes
    low = np.floor(v)
    high = np.floor(v - gamma + 1.0)
    out = np.where(v < t, low, np.where(v < t + gamma, t, high)).astype(np.int64)
    np.clip(out, 0, n_values - 1, out=out)
    return out


# ------------------------------------------------------------------------------ exact eps as sampled (2^-53)
def frapp_sampling_matrix(n_values: int, gamma: float) -> np.ndarray:
    """Integer counts C[t, j] of the 2^53 uniforms u = m 2^-53 that FRAPP's sampler maps from t to j.

    The map is non-decreasing in u, so the first m reaching report >= j is found by binary search (vectorized
    over all (t, j)); C[t, j] = first(t, j + 1) - first(t, j).  Returned as Python ints in an object array.
    """
    grid = 1 << UNIFORM_GRID_BITS
    t = np.repeat(np.arange(n_values, dtype=np.int64), n_values)
    j = np.tile(np.arange(n_values, dtype=np.int64), n_values)
    lo = np.zeros(t.size, dtype=np.int64)  # first m with draw(m) >= j lies in [lo, hi]
    hi = np.full(t.size, grid, dtype=np.int64)
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        draw = _frapp_draw(t, np.minimum(mid, grid - 1).astype(np.float64) / grid, n_values, gamma)
        reached = (draw >= j) & (mid < grid)
        hi = np.where(reached, mid, hi)
        lo = np.where(reached, lo, mid + 1)
    first = lo.reshape(n_values, n_values).astype(object)
    counts = np.empty((n_values, n_values), dtype=object)
    for a in range(n_values):
        for b in range(n_values):
            end = first[a, b + 1] if b + 1 < n_values else grid
            counts[a, b] = int(end) - int(first[a, b])
    return counts


def matrix_ratio(counts: np.ndarray) -> Fraction:
    """max over j, t, t' of C[t, j] / C[t', j] for an integer matrix (0 = infinite: some entry is 0)."""
    c = np.asarray(counts, dtype=object)
    best = Fraction(1)
    for j in range(c.shape[1]):
        col = [int(v) for v in c[:, j]]
        if min(col) == 0:
            return Fraction(0)
        best = max(best, Fraction(max(col), min(col)))
    return best


def frapp_sampling_ratio(n_values: int, gamma: float) -> Fraction:
    """Exact worst likelihood ratio of one FRAPP draw as sampled (from :func:`frapp_sampling_matrix`)."""
    return matrix_ratio(frapp_sampling_matrix(n_values, gamma))


def frapp_sampling_epsilon(n_values: int, gamma: float) -> float:
    """Exact eps of one FRAPP draw as sampled, rounded up (inf if some report is unreachable from some input)."""
    ratio = frapp_sampling_ratio(n_values, gamma)
    return math.inf if ratio == 0 else (0.0 if ratio == 1 else log_ratio_upper(ratio))


def frapp_relative_deviation(n_values: int, gamma: float) -> float:
    """max |P_float(j | t) / P_ideal(j | t) - 1| of one FRAPP draw (exact counts vs the ideal x, gamma x)."""
    counts = frapp_sampling_matrix(n_values, gamma)
    grid = Fraction(1 << UNIFORM_GRID_BITS)
    g = Fraction(gamma)
    x = 1 / (g + n_values - 1)
    worst = Fraction(0)
    for a in range(n_values):
        for b in range(n_values):
            ideal = g * x if a == b else x
            worst = max(worst, abs(Fraction(int(counts[a, b])) / grid / ideal - 1))
    return float(worst) * (1 + 1e-12)


def no_repeat_epsilon_upper(n_values: int, gamma: float, n_reports: int) -> float:
    """Upper bound of the eps of the no-repeat l-extended substitution as sampled: the closed form ln(A/B) of
    the ideal probabilities plus a rigorous margin for the float deviation of each draw (at most delta
    relative, :func:`frapp_relative_deviation`) and for the ties of the shuffle:
    2 (l d/(1-d) + (l-1) d a/(1 - d a)) + 2 t/(1-t), d = delta/(1-delta), a = the largest rejected mass /
    (1 - it), t = l! l(l-1)/2 2^-53 (plus ``LOG_MARGIN``)."""
    delta = frapp_relative_deviation(n_values, gamma)
    d = delta / (1.0 - delta)
    x = 1.0 / (gamma + n_values - 1)
    rejected = (gamma + n_reports - 2) * x  # largest mass already drawn before the last draw
    a = rejected / (1.0 - rejected)
    eta = n_reports * d / (1.0 - d) + (n_reports - 1) * d * a / (1.0 - d * a)
    ties = math.factorial(n_reports) * n_reports * (n_reports - 1) / 2 * 2.0 ** -UNIFORM_GRID_BITS
    shuffle = ties / (1.0 - ties)
    return no_repeat_epsilon(n_values, gamma, n_reports) + 2.0 * eta + 2.0 * shuffle + LOG_MARGIN


class RandomSubstitution(SingleReportEstimator, LocalMechanism):
    """FRAPP random substitution with the gamma-diagonal matrix (``gamma`` or ``epsilon = ln gamma``)."""

    def __init__(self, *, categories: Sequence[Any] | np.ndarray, gamma: float | None = None,
                 epsilon: float | None = None, rng: np.random.Generator | int | None = None):
        if (gamma is None) == (epsilon is None):
            raise PrivacyParameterError(f"give exactly one of gamma or epsilon (epsilon = ln gamma), got "
                                        f"gamma={gamma!r}, epsilon={epsilon!r}")
        self.gamma = _check_gamma(gamma) if gamma is not None else _check_gamma(math.exp(check_epsilon(epsilon)))
        self._codec = CategoryCodec(categories)
        self.rng = crypto_rng(rng)
        self.epsilon = math.log(self.gamma)
        self.x = 1.0 / (self.gamma + self.k - 1)
        self.p = self.gamma * self.x
        self.q = self.x
        self.draws_used = 0

    def __repr__(self) -> str:
        return f"RandomSubstitution(N={self.k}, gamma={self.gamma!r}, epsilon={self.epsilon:.6g})"

    def transition_matrix(self) -> np.ndarray:
        return frapp_transition_matrix(self.k, self.gamma)

    def randomise_codes(self, codes: np.ndarray) -> np.ndarray:
        c = np.asarray(codes, dtype=np.int64)
        if c.size and (c.min() < 0 or c.max() >= self.k):
            raise PrivacyParameterError(f"value codes must be in 0..{self.k - 1} for {self._codec.describe()}")
        u = self.rng.random(c.shape)
        self.draws_used += int(c.size)
        return _frapp_draw(c, u, self.k, self.gamma)

    def randomise_many(self, values: Any) -> np.ndarray:
        codes = self._codec.encode_strict(values, what="value")
        return self._codec.decode(self.randomise_codes(codes))

    @cached_property
    def exact_epsilon(self) -> float:
        """eps as sampled: the inverse-CDF map u -> report is monotone in u, so each transition probability is
        (number of 2^-53-grid uniforms mapped to it) / 2^53, found exactly by binary search
        (:func:`frapp_sampling_matrix`); the max log-ratio of that integer matrix, rounded up.  The stated
        ``epsilon`` is ln gamma."""
        return frapp_sampling_epsilon(self.k, self.gamma)

    @property
    def domain(self) -> CategoricalDomain:
        return CategoricalDomain(self.categories)

    def variance(self, true_count: float | np.ndarray, n: int) -> float | np.ndarray:
        """``[n_i p(1-p) + (n - n_i) q(1-q)] / (p-q)^2`` with p = gamma x, q = x."""
        t = np.asarray(true_count, dtype=float)
        res = (t * self.p * (1 - self.p) + (n - t) * self.q * (1 - self.q)) / (self.p - self.q) ** 2
        return float(res) if np.ndim(res) == 0 else res

    def standard_error_bound(self, n: int) -> float:
        return frapp_standard_error_bound(self.k, self.gamma, n)

    def estimate_from_counts(self, observed_counts: Sequence[float] | np.ndarray,
                             n: int | None = None) -> FrequencyEstimate:
        """``X_hat = (gamma+N-1)/(gamma-1) Y - n/(gamma-1)``."""
        y = np.asarray(observed_counts, dtype=float)
        if y.shape != (self.k,):
            raise PrivacyParameterError(f"observed_counts: expected {self.k} counts, got shape {y.shape}")
        total = int(round(y.sum())) if n is None else int(n)
        g = self.gamma
        est = (g + self.k - 1) / (g - 1) * y - total / (g - 1)
        var = self.variance(np.clip(est, 0.0, total), total)
        return FrequencyEstimate(self.categories, est, np.sqrt(np.maximum(var, 0.0)), total,
                                 epsilon=self.epsilon, mechanism="rs",
                                 extra={"gamma": g, "se_bound": self.standard_error_bound(max(total, 1))})

    def reconstruct_by_inversion(self, observed_counts: Sequence[float] | np.ndarray) -> np.ndarray:
        """``M^-1 Y`` by a linear solve (equals the closed form; kept to check it)."""
        return np.linalg.solve(self.transition_matrix(), np.asarray(observed_counts, dtype=float))



class LExtendedSubstitution(LocalMechanism):
    """l-extended random substitution (Kang, Lee & Hong 2009): each record reported l times.

    ``randomise_many(values)`` returns an ``(n, l)`` array.  ``epsilon`` is exact: ``l ln gamma`` for
    ``"independent"``; ``ln(A/B)`` of the shuffled output set for ``"no-repeat"``
    (``epsilon_draw_order`` is what draw-order output would cost).  ``draws_used`` counts the random
    substitution draws of the last ``randomise_*`` call, rejected re-draws included (``total_draws``:
    since construction); the per-row shuffle of the no-repeat output is not counted.
    """

    def __init__(self, *, categories: Sequence[Any] | np.ndarray, gamma: float, l: int,  # noqa: E741
                 variant: Variant = "independent", rng: np.random.Generator | int | None = None):
        self._codec = CategoryCodec(categories)
        self.gamma = _check_gamma(gamma)
        self.variant: Variant = require_choice("variant", variant, VARIANTS, error=parameter_error)
        n_values = self._codec.k
        if variant == "no-repeat":
            # l = N would always output the whole domain: no information, nothing to reconstruct.
            self.l = require_int("l (no-repeat: at most N-1 distinct outputs)", l, low=1, high=n_values - 1,
                                 error=parameter_error)
        else:
            self.l = require_int("l", l, low=1, error=parameter_error)
        self.rng = crypto_rng(rng)
        self.x = 1.0 / (self.gamma + n_values - 1)
        self.p = self.gamma * self.x
        self.q = self.x
        if variant == "independent":
            self.epsilon = self.l * math.log(self.gamma)
            self.epsilon_draw_order = self.epsilon
            self.a_l, self.b_l = self.p, self.q  # per draw
        else:
            self.epsilon = no_repeat_epsilon(n_values, self.gamma, self.l)
            self.epsilon_draw_order = no_repeat_draw_order_epsilon(n_values, self.gamma, self.l)
            self.a_l, self.b_l = no_repeat_inclusion_probabilities(n_values, self.gamma, self.l)
        self.draws_used = 0
        self.total_draws = 0

    @classmethod
    def for_epsilon(cls, *, categories: Sequence[Any] | np.ndarray, epsilon: float, l: int,  # noqa: E741
                    variant: Variant = "independent",
                    rng: np.random.Generator | int | None = None) -> LExtendedSubstitution:
        """The mechanism whose exact eps (as defined above) equals ``epsilon``."""
        g = gamma_for_epsilon(len(categories), epsilon, l, variant)
        return cls(categories=categories, gamma=g, l=l, variant=variant, rng=rng)

    @property
    def categories(self) -> tuple[Any, ...]:
        return self._codec.categories

    @property
    def k(self) -> int:
        return self._codec.k

    def __repr__(self) -> str:
        return (f"LExtendedSubstitution(N={self.k}, gamma={self.gamma!r}, l={self.l}, variant={self.variant!r}, "
                f"epsilon={self.epsilon:.6g})")

    # ---------------------------------------------------------------- perturbation
    def randomise_codes(self, codes: np.ndarray) -> np.ndarray:
        """``(n, l)`` report codes for true codes ``codes`` (shape (n,))."""
        t = np.asarray(codes, dtype=np.int64).reshape(-1)
        if t.size and (t.min() < 0 or t.max() >= self.k):
            raise PrivacyParameterError(f"value codes must be in 0..{self.k - 1} for {self._codec.describe()}")
        n, n_reports = t.size, self.l
        if self.variant == "independent":
            u = self.rng.random((n, n_reports))
            out = _frapp_draw(t[:, None], u, self.k, self.gamma)
            self.draws_used = n * n_reports
        else:
            out = np.full((n, n_reports), -1, dtype=np.int64)
            draws = 0
            for j in range(n_reports):
                idx = np.arange(n)
                rounds = 0
                while idx.size:
                    cand = _frapp_draw(t[idx], self.rng.random(idx.size), self.k, self.gamma)
                    draws += idx.size
                    if j:
                        clash = (out[idx, :j] == cand[:, None]).any(axis=1)
                        ok = ~clash
                        out[idx[ok], j] = cand[ok]
                        idx = idx[clash]
                    else:
                        out[idx, 0] = cand
                        idx = idx[:0]
                    rounds += 1
                    if rounds > 10_000_000:  # pragma: no cover - probability ~ 0 for any finite gamma
                        raise RuntimeError("no-repeat substitution: rejection sampling did not terminate")
            # emit a set, not the draw order: shuffle each row
            perm = np.argsort(self.rng.random((n, n_reports)), axis=1)
            out = np.take_along_axis(out, perm, axis=1)
            self.draws_used = draws
        self.total_draws += self.draws_used
        return out

    def randomise_many(self, values: Any) -> np.ndarray:
        codes = self._codec.encode_strict(np.asarray(values, dtype=object).reshape(-1), what="value")
        return self._codec.decode(self.randomise_codes(codes))

    @cached_property
    def exact_epsilon(self) -> float:
        """eps as sampled.  ``"independent"``: l times the FRAPP draw's exact eps (the l draws are independent
        and the worst output of one draw can repeat in all l).  ``"no-repeat"``: :func:`no_repeat_epsilon_upper`
        (the closed form plus a rigorous float margin, below 1e-11 above the stated ``epsilon``)."""
        if self.variant == "independent":
            return self.l * frapp_sampling_epsilon(self.k, self.gamma)
        return no_repeat_epsilon_upper(self.k, self.gamma, self.l)

    @property
    def domain(self) -> CategoricalDomain:
        return CategoricalDomain(self.categories)

    # ---------------------------------------------------------------- closed forms
    def variance(self, true_count: float | np.ndarray, n: int) -> float | np.ndarray:
        """Variance of the unbiased estimator for a value with true count ``n_v`` among ``n`` records.

        independent: ``[n_v p(1-p) + (n-n_v) q(1-q)] / (l (p-q)^2)``;
        no-repeat:   ``[n_v a(1-a) + (n-n_v) b(1-b)] / (a-b)^2`` (one Bernoulli inclusion per record).
        """
        t = np.asarray(true_count, dtype=float)
        if self.variant == "independent":
            p, q = self.p, self.q
            res = (t * p * (1 - p) + (n - t) * q * (1 - q)) / (self.l * (p - q) ** 2)
        else:
            a, b = self.a_l, self.b_l
            res = (t * a * (1 - a) + (n - t) * b * (1 - b)) / (a - b) ** 2
        return float(res) if np.ndim(res) == 0 else res

    def standard_error_bound(self, n: int) -> float:
        """Max over data of the RMS relative L2 error of the unbiased estimator (attained for uniform data):
        ``sqrt(N * sum_v Var / n^2)``; for l = 1 this is Dowd et al.'s bound."""
        big_n = self.k
        total_var = float(np.sum(self.variance(np.full(big_n, n / big_n), n)))
        return math.sqrt(big_n * total_var) / n

    @property
    def paper_shrinkage(self) -> float:
        """kappa with E[paper estimate] = n/N + kappa (n_v - n/N): the paper's divide-by-l estimator is the
        unbiased one shrunk toward the uniform count (kappa = 1 for independent draws;
        ``(a_l - b_l)(gamma+N-1) / ((gamma-1) l)`` < 1 for no-repeat)."""
        if self.variant == "independent":
            return 1.0
        return (self.a_l - self.b_l) * (self.gamma + self.k - 1) / ((self.gamma - 1) * self.l)

    def paper_estimate_expectation(self, true_counts: Sequence[float] | np.ndarray) -> np.ndarray:
        """E[estimate_counts_paper] for the given true counts (shows the no-repeat bias in closed form)."""
        x = np.asarray(true_counts, dtype=float)
        n = x.sum()
        if self.variant == "independent":
            ey = self.l * (x * self.p + (n - x) * self.q)
        else:
            ey = x * self.a_l + (n - x) * self.b_l
        g = self.gamma
        expectation: np.ndarray = ((g + self.k - 1) / (g - 1) * ey - n * self.l / (g - 1)) / self.l
        return expectation

    # ---------------------------------------------------------------- estimation
    def _report_counts(self, reports: Any) -> tuple[np.ndarray, int]:
        arr = np.asarray(reports, dtype=object)
        if arr.ndim != 2 or arr.shape[1] != self.l:
            raise PrivacyParameterError(f"reports: expected an (n, {self.l}) array (l = {self.l} reports per "
                                        f"record), got shape {arr.shape}")
        codes = self._codec.encode_strict(arr, what="report")
        return self._counts_from_codes(codes)

    def _counts_from_codes(self, codes: np.ndarray) -> tuple[np.ndarray, int]:
        c = np.asarray(codes, dtype=np.int64)
        if c.ndim != 2 or c.shape[1] != self.l:
            raise PrivacyParameterError(f"report codes: expected shape (n, {self.l}), got {c.shape}")
        if self.variant == "no-repeat" and self.l > 1:
            s = np.sort(c, axis=1)
            if (np.diff(s, axis=1) == 0).any():
                row = int(np.flatnonzero((np.diff(s, axis=1) == 0).any(axis=1))[0])
                raise PrivacyParameterError(f"reports: row {row} repeats a value; no-repeat reports hold "
                                            f"{self.l} distinct values")
        return counts_of_codes(c, self.k), int(c.shape[0])

    def estimate_from_counts(self, observed_counts: Sequence[float] | np.ndarray, n: int) -> FrequencyEstimate:
        """Unbiased counts from ``Y_v`` = number of the n*l reports equal to v, for n records.

        independent: ``(Y_v / l - q n) / (p - q)`` (the mean of the l single-draw reconstructions);
        no-repeat: ``(Y_v - n b_l) / (a_l - b_l)``.
        """
        y = np.asarray(observed_counts, dtype=float)
        if y.shape != (self.k,):
            raise PrivacyParameterError(f"observed_counts: expected {self.k} counts, got shape {y.shape}")
        if self.variant == "independent":
            est = (y / self.l - self.q * n) / (self.p - self.q)
        else:
            est = (y - n * self.b_l) / (self.a_l - self.b_l)
        var = self.variance(np.clip(est, 0.0, n), n)
        return FrequencyEstimate(self.categories, est, np.sqrt(np.maximum(var, 0.0)), n,
                                 epsilon=self.epsilon, mechanism=f"rs-l/{self.variant}",
                                 extra={"gamma": self.gamma, "l": self.l, "a_l": self.a_l, "b_l": self.b_l,
                                        "se_bound": self.standard_error_bound(max(n, 1))})

    def estimate_counts(self, reports: Any) -> FrequencyEstimate:
        y, n = self._report_counts(reports)
        return self.estimate_from_counts(y, n)

    def estimate_counts_from_codes(self, codes: np.ndarray) -> FrequencyEstimate:
        y, n = self._counts_from_codes(codes)
        return self.estimate_from_counts(y, n)

    def paper_estimate_from_counts(self, observed_counts: Sequence[float] | np.ndarray, n: int) -> np.ndarray:
        """The paper's estimator: single-draw reconstruction of all n*l reports, divided by l.
        Unbiased for ``"independent"``; BIASED for ``"no-repeat"`` (kept for comparison)."""
        y = np.asarray(observed_counts, dtype=float)
        g = self.gamma
        return ((g + self.k - 1) / (g - 1) * y - n * self.l / (g - 1)) / self.l

    def estimate_counts_paper(self, reports: Any) -> np.ndarray:
        y, n = self._report_counts(reports)
        return self.paper_estimate_from_counts(y, n)

    def estimate_counts_paper_from_codes(self, codes: np.ndarray) -> np.ndarray:
        y, n = self._counts_from_codes(codes)
        return self.paper_estimate_from_counts(y, n)
