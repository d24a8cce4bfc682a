"""Exact reachability test of bounded Laplace outputs: which outputs of input x can input x' never produce?

``python -m stream_anon.bench.reachability [--n N] [--seed S] [--epsilon E ...]`` (also a section of
``stream-anon bench ldp-numeric``).

*Before* (the binary64 sampler, now ``UnsafeFloatBoundedLaplace``): numpy's ``Generator.random()``
returns m 2^-53 for m in [0, 2^53), and the sampler is a deterministic function y = f(x, m).  We draw outputs
y = f(x, m) for random m and decide, for each, whether some m' gives f(x', m') == y exactly.  f(x', .) is
non-increasing in m' on the left branch (m' below the branch point) and non-decreasing on the right branch (every
binary64 operation used is monotone; :func:`monotonicity_violations` spot-checks it), so a binary search per
branch finds the only candidates m', and the outputs around them are compared exactly.  An output that no m'
produces has probability 0 under x' and positive probability under x: eps = infinity.

*After* (the grid mechanism): every output has integer weight >= 1 from every input (exactly: the table), so
the unreachable fraction is 0 by construction; :func:`unreachable_fraction_grid` computes it from the table.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence

import numpy as np

from stream_anon.privacy.base import seeded_crypto_rng
from stream_anon.privacy.bounded_laplace import BoundedLaplace
from stream_anon.privacy.bounded_laplace.unsafe_float import (
    UnsafeFloatBoundedLaplace,
    sample_unit_from_uniform,
)

GRID = 1 << 53
PAIRS: tuple[tuple[str, float, float, float, float], ...] = (
    ("age", 17.0, 90.0, 38.0, 39.0),
    ("hours-per-week", 1.0, 99.0, 40.0, 41.0),
    ("education-num", 1.0, 16.0, 9.0, 10.0),
    ("[-1, 1]", -1.0, 1.0, 0.0, 2.0 ** -7),
)


def _float_output(mech: UnsafeFloatBoundedLaplace, x: float, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(output, on-left-branch) of the unsafe sampler for input x and uniforms m * 2^-53 (the library's code)."""
    model = mech.model
    q = model.to_unit(np.full(m.shape, float(x)))
    u = m.astype(np.float64) * (1.0 / GRID)
    m_left = -np.expm1(-(q + 1.0) / model.b)
    m_right = -np.expm1(-(1.0 - q) / model.b)
    left = u * (m_left + m_right) < m_left
    return model.from_unit(sample_unit_from_uniform(q, model.b, u)), left


def _branch_point(mech: UnsafeFloatBoundedLaplace, x: float) -> int:
    """First m on the right branch (the left-branch predicate is monotone in m)."""
    lo, hi = 0, GRID
    while hi - lo > 1:
        mid = (lo + hi) // 2
        _, left = _float_output(mech, x, np.asarray([mid], dtype=np.int64))
        if left[0]:
            lo = mid
        else:
            hi = mid
    _, left0 = _float_output(mech, x, np.asarray([0], dtype=np.int64))
    return hi if left0[0] else 0


def reachable_from(mech: UnsafeFloatBoundedLaplace, x: float, targets: np.ndarray, *, window: int = 4) -> np.ndarray:
    """For each target output, whether some uniform m' in [0, 2^53) makes the unsafe sampler output it from x."""
    n = targets.shape[0]
    split = _branch_point(mech, x)
    found = np.zeros(n, dtype=bool)
    for branch in ("left", "right"):
        a = np.full(n, 0 if branch == "left" else split, dtype=np.int64)
        z = np.full(n, split if branch == "left" else GRID, dtype=np.int64)
        if z[0] <= a[0]:
            continue
        lo_end, hi_end = int(a[0]), int(z[0])
        while np.any(z > a):  # first m with f <= target (left: decreasing) or f >= target (right: increasing)
            active = z > a
            mid = (a + z) // 2
            y, _ = _float_output(mech, x, np.minimum(mid, hi_end - 1))
            hit = (y <= targets) if branch == "left" else (y >= targets)
            z = np.where(active & hit, mid, z)
            a = np.where(active & ~hit, mid + 1, a)
        for off in range(-window, window + 1):
            cand = np.clip(a + off, lo_end, hi_end - 1)
            y, _ = _float_output(mech, x, cand)
            found |= y == targets
    return found


def unreachable_fraction_float(mech: UnsafeFloatBoundedLaplace, x: float, x_neighbour: float, n: int, seed: int
                               ) -> tuple[float, float]:
    """(fraction, standard error) of outputs of x that x_neighbour cannot produce (unsafe sampler, exact test)."""
    rng = seeded_crypto_rng(seed)
    m = rng.integers(0, GRID, size=n, dtype=np.int64)
    y, _ = _float_output(mech, x, m)
    frac = 1.0 - float(reachable_from(mech, x_neighbour, y).mean())
    return frac, math.sqrt(max(frac * (1 - frac), 1e-300) / n)


def unreachable_fraction_grid(mech: BoundedLaplace, x: float, x_neighbour: float) -> float:
    """P(M(x) is an output M(x_neighbour) cannot produce), exactly from the table (0 when every weight >= 1)."""
    p = mech.pmf(x)
    q = mech.pmf(x_neighbour)
    return float(p[q == 0].sum())


def monotonicity_violations(mech: UnsafeFloatBoundedLaplace, x: float, *, windows: int = 20, length: int = 100_000,
                            seed: int = 1) -> int:
    """Spot check: consecutive m on one branch never move the output the wrong way (should be 0)."""
    rng = seeded_crypto_rng(seed)
    bad = 0
    for start in rng.integers(0, GRID - length, size=windows, dtype=np.int64):
        m = np.arange(start, start + length, dtype=np.int64)
        y, left = _float_output(mech, x, m)
        bad += int(np.sum(np.diff(y[left]) > 0)) + int(np.sum(np.diff(y[~left]) < 0))
    return bad


def report(*, epsilons: Sequence[float] = (1.0,), n: int = 200_000, seed: int = 0) -> str:
    """Markdown table of the unreachable fractions before (unsafe float) and after (grid)."""
    lines = ["| attribute | eps | x vs x' | unreachable, float sampler (SE) | unreachable, grid | "
             "monotonicity violations |", "|---|---:|---|---:|---:|---:|"]
    for eps in epsilons:
        for name, lo, hi, x, xn in PAIRS:
            integer = name != "[-1, 1]"
            before = UnsafeFloatBoundedLaplace(epsilon=eps, lower=lo, upper=hi)
            after = BoundedLaplace(epsilon=eps, lower=lo, upper=hi, integer=integer)
            frac, se = unreachable_fraction_float(before, x, xn, n, seed)
            viol = monotonicity_violations(before, xn, windows=5)
            lines.append(f"| {name} | {eps:g} | {x:g} vs {xn:g} | {100 * frac:.2f} % ({100 * se:.2f}) | "
                         f"{100 * unreachable_fraction_grid(after, x, xn):.0f} % | {viol} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m stream_anon.bench.reachability", description=__doc__)
    p.add_argument("--n", type=int, default=200_000, help="outputs drawn per pair (default 200,000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epsilon", type=float, nargs="*", default=[1.0])
    args = p.parse_args(argv if argv is not None else [])
    print(f"## Exact reachability: outputs of x that x' cannot produce (n = {args.n:,} per pair)\n")
    print(report(epsilons=args.epsilon, n=args.n, seed=args.seed))
    print()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main(sys.argv[1:]))
