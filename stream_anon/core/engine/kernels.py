"""The compiled hot loop of CASTLE's ``best_selection`` (Cao et al., TDSC 2011, Fig. 3): one pass over every open
cluster computing the enlargement of its box by the arriving record, compiled with numba.

For cluster c with box ``B[c]`` (layout of :class:`~stream_anon.core.engine.clusters.QIEncoder`:
``[min x (jn) | min A (jc) | -max x (jn) | -max b (jc)]``) and record vector ``v``:

* the union box ``U = min(B[c], v)`` (elementwise);
* its scoring loss ``L(U) = sum_t (U[t] + U[J+t]) * (-1/(U_t - L_t))`` over numeric QIs (Goldberger-Tassa's
  normalized width, Iyengar's LM for numbers) plus ``sum_t T[U[jn+t] - U[J+jn+t]]`` over categorical QIs (the
  loss table indexed by (lowest leaf, highest leaf): :meth:`QIEncoder.score_rows`);
* the enlargement ``E[c] = wnew[c] * L(U) - base[c]`` (``- (p - oldest[c]) * age_coef[c]`` with UBDSA's age
  pressure).

The same operations, in the same order, as the numpy formula of ``QIEncoder.score_rows``: each product rounded
before it is summed (numba compiles without fast-math, so nothing is contracted into a fused multiply-add), and
each sum over QIs in numpy's order (:func:`numpy_order_sum`: sequential below 8 terms, eight interleaved partial
sums from 8 on).  So the releases are bit-identical to the numpy formula's, on every CPU
(``tests/test_engine_kernels.py`` compares them; the pinned streams of ``tests/test_engine_adult.py`` did not
change).  Cost: one call per record instead of a dozen numpy calls (``stream-anon bench engine``).
"""

from __future__ import annotations

import numba
import numpy as np

MAX_TERMS = 128
"""numpy sums up to 128 terms (``PW_BLOCKSIZE``) with one set of partial sums, more by halving recursively; the
kernel covers the first case (a schema with more numeric or categorical QIs scores with numpy)."""


@numba.njit(cache=True, nogil=True)
def numpy_order_sum(a: np.ndarray, n: int) -> float:  # pragma: no cover - compiled (tested through the engine)
    """``a[:n].sum()`` in numpy's order for ``n <= MAX_TERMS`` (``pairwise_sum`` of numpy's loops_utils)."""
    if n < 8:
        res = 0.0
        for i in range(n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[0], a[1], a[2], a[3]
    r4, r5, r6, r7 = a[4], a[5], a[6], a[7]
    i = 8
    last = n - (n % 8)
    while i < last:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[i]
        i += 1
    return float(res)


@numba.njit(cache=True, nogil=True, inline="always")
def _minimum(a: float, b: float) -> float:  # pragma: no cover - compiled
    """``numpy.minimum(a, b)`` for numbers that are not NaN: ``b`` when they are equal (so -0.0 and 0.0 come out
    as numpy's do)."""
    return a if a < b else b


@numba.njit(cache=True, nogil=True)
def union_enlargements(box: np.ndarray, v: np.ndarray, jn: int, jc: int, neg_inv_range: np.ndarray,
                       table: np.ndarray, wnew: np.ndarray, base: np.ndarray, age: bool, p: int,
                       oldest: np.ndarray, age_coef: np.ndarray, ls: np.ndarray, e: np.ndarray,
                       num: np.ndarray, cat: np.ndarray) -> int:  # pragma: no cover - compiled
    """Fill ``ls[c] = L(min(box[c], v))`` and ``e[c]`` (the enlargement, module doc) for every row of ``box``;
    return the first c of minimal ``e`` (``numpy.argmin``).  ``num`` (jn) and ``cat`` (jc): scratch."""
    j = jn + jc
    best = 0
    best_e = np.inf
    for c in range(box.shape[0]):
        for t in range(jn):
            lo = _minimum(box[c, t], v[t])
            neg_hi = _minimum(box[c, j + t], v[j + t])
            width = lo + neg_hi
            num[t] = width * neg_inv_range[t]
        s = numpy_order_sum(num, jn)
        if jc > 0:
            for t in range(jc):
                a = _minimum(box[c, jn + t], v[jn + t])
                b = _minimum(box[c, j + jn + t], v[j + jn + t])
                cat[t] = table[np.intp(a - b)]
            s += numpy_order_sum(cat, jc)
        ls[c] = s
        x = wnew[c] * s
        x = x - base[c]
        if age:
            pull = np.float64(p - oldest[c]) * age_coef[c]
            x = x - pull
        e[c] = x
        if x < best_e or c == 0:
            best_e = x
            best = c
    return best


def warm_up() -> None:
    """Compile both functions for the engine's argument types (float64 arrays, int64 ints and ``oldest``, a bool)
    and so fill numba's cache: a container image does this once at build time (deploy/Dockerfile)."""
    jn, jc = 2, 8
    box = np.full((3, 2 * (jn + jc)), np.inf)
    union_enlargements(box, np.zeros(2 * (jn + jc)), jn, jc, -np.ones(jn), np.zeros(1), np.ones(3),
                       np.full(3, -np.inf), False, 1, np.zeros(3, dtype=np.int64), np.zeros(3), np.empty(3),
                       np.empty(3), np.empty(jn), np.empty(jc))
