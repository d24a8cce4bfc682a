"""How an epsilon is shown to people (logs, start-up lines, summaries, error messages).

The exact eps of a mechanism is a double rounded up from an exact rational (``accounting.exact_epsilon``), e.g.
12.000000000005961 for a record's total over the side topics: what is stored and compared (JSON outputs, caps)
keeps every digit; what is printed has at most :data:`EPSILON_DECIMALS` decimals, trailing zeros dropped.
"""

from __future__ import annotations

from collections.abc import Mapping

EPSILON_DECIMALS = 4


def format_epsilon(epsilon: float, decimals: int = EPSILON_DECIMALS, *, beside: float | None = None) -> str:
    """``12.000000000005961`` -> ``12``; ``0.693147`` -> ``0.6931``; a positive eps below the last decimal keeps
    one significant digit (``1e-05``), never ``0``.  ``beside``: a different value it is compared with (a cap):
    as many more decimals as it takes for the two to read differently (25.0000038 beside 25)."""
    x = float(epsilon)
    if beside is not None and float(beside) != x:
        text = format_epsilon(x, decimals)
        while text == format_epsilon(float(beside), decimals) and decimals < 17:
            decimals += 1
            text = format_epsilon(x, decimals)
        return text
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    text = f"{x:.{decimals}f}".rstrip("0").rstrip(".")
    if text in ("0", "-0") and x != 0:
        return f"{x:.1g}" if abs(x) < 1e-4 else text
    return "0" if text == "-0" else text


def format_epsilons(values: Mapping[str, float]) -> str:
    """``{topic: eps}`` as ``adult.krr 5, adult.rs 2`` (empty: ``none``)."""
    return ", ".join(f"{name} {format_epsilon(v)}" for name, v in values.items()) or "none"
