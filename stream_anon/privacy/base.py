"""Shared pieces of the privacy mechanisms: validation and the injected random generator.

Modelled on diffprivlib: each mechanism is a small class with keyword-only, validated parameters,
``randomise(value)``, a vectorized ``randomise_many(array)``, closed forms where they exist, and a
``numpy.random.Generator`` injected as ``rng`` (seeded in tests; OS entropy by default).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class PrivacyParameterError(ValueError):
    """A mechanism parameter is out of range; the message names parameter, range and value."""


def secure_rng(rng: np.random.Generator | int | None = None) -> np.random.Generator:
    """The generator to use: the one given, a seeded one for an int, else fresh OS entropy.

    Note: numpy's PCG64 is not a cryptographic generator; with ``None`` it is seeded from OS entropy
    (``SeedSequence()``), which is what a deployment should use.  Tests pass a seed.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.default_rng(np.random.SeedSequence())
    if isinstance(rng, int | np.integer) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise PrivacyParameterError(f"rng: expected numpy.random.Generator, int seed or None, got {type(rng).__name__}")


def check_epsilon(epsilon: Any, name: str = "epsilon", *, allow_inf: bool = False) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float | np.floating | np.integer):
        raise PrivacyParameterError(f"{name}: expected a positive number, got {type(epsilon).__name__} {epsilon!r}")
    e = float(epsilon)
    if not (e > 0) or (math.isinf(e) and not allow_inf) or math.isnan(e):
        raise PrivacyParameterError(f"{name}: must be in (0, inf), got {epsilon!r}")
    return e


def check_int(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise PrivacyParameterError(f"{name}: expected an integer in [{lo}, {hi if hi is not None else 'inf'}], "
                                    f"got {type(value).__name__} {value!r}")
    v = int(value)
    if v < lo or (hi is not None and v > hi):
        raise PrivacyParameterError(f"{name}: must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


def check_probability(value: Any, name: str, *, open_low: bool = False, open_high: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating):
        raise PrivacyParameterError(f"{name}: expected a number in [0, 1], got {type(value).__name__} {value!r}")
    v = float(value)
    lo_ok = v > 0 if open_low else v >= 0
    hi_ok = v < 1 if open_high else v <= 1
    if not (lo_ok and hi_ok):
        raise PrivacyParameterError(f"{name}: must be in {'(' if open_low else '['}0, 1{')' if open_high else ']'}, "
                                    f"got {value!r}")
    return v
