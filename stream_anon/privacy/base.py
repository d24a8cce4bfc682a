"""Shared pieces of the privacy mechanisms: validation and the injected random generator.

Modelled on diffprivlib: each mechanism is a small class with keyword-only, validated parameters,
``randomise(value)``, a vectorized ``randomise_many(array)``, closed forms where they exist, and a
``numpy.random.Generator`` injected as ``rng``: by default ChaCha20 keyed from OS entropy (:func:`crypto_rng`),
a reproducible ChaCha20 stream from an int seed in tests and benchmarks (:func:`seeded_crypto_rng`).
"""

from __future__ import annotations

import secrets
from typing import Any

import numpy as np
from randomgen import ChaCha

from stream_anon.core.validation import ErrorFactory, is_int, raising, require_float, require_int


class PrivacyParameterError(ValueError):
    """A mechanism parameter is out of range; the message names parameter, range and value."""


parameter_error: ErrorFactory = raising(PrivacyParameterError)
"""Raises :class:`PrivacyParameterError` with the standard line (``<name>: must be <allowed>, got <value>``)."""


CRYPTOGRAPHIC_BIT_GENERATORS: tuple[str, ...] = ("ChaCha", "AESCounter")
"""Names of the bit generators this package treats as cryptographically secure (randomgen)."""


def crypto_rng(rng: np.random.Generator | int | None = None) -> np.random.Generator:
    """The generator all privacy noise is drawn from: ChaCha20 (a stream cipher) behind numpy's ``Generator``.

    * ``None`` (the default, and what a deployment uses): ``randomgen.ChaCha(key=<256 bits from secrets>,
      rounds=20)``: a cryptographically secure stream keyed from OS entropy (``secrets.randbits``), so the noise
      cannot be predicted or reproduced from anything an observer can read.
    * an ``int``: :func:`seeded_crypto_rng` (reproducible ChaCha20 stream; tests and benchmarks only).
    * a ``numpy.random.Generator``: used as given (injected; :func:`is_cryptographic` tells whether its bit
      generator is one of ``CRYPTOGRAPHIC_BIT_GENERATORS``).

    ChaCha20 rather than AES-CTR: it is constant-time in software, while randomgen's AES fallback (no AES-NI)
    uses lookup tables.  Cost measured in ``stream-anon bench ldp-numeric`` / ``ldp-categorical``.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None:
        return np.random.Generator(ChaCha(key=secrets.randbits(256), counter=0, rounds=20))
    if is_int(rng):
        return seeded_crypto_rng(int(rng))
    raise PrivacyParameterError(f"rng: expected numpy.random.Generator, int seed or None, got {type(rng).__name__}")


def seeded_crypto_rng(seed: int) -> np.random.Generator:
    """A REPRODUCIBLE ChaCha20 stream keyed from ``seed`` (via numpy's ``SeedSequence``): tests and benches only.

    The stream is as good as ChaCha20's, but whoever knows the seed can reproduce every noise draw.
    """
    return np.random.Generator(ChaCha(seed=require_int("seed", seed, low=0, error=parameter_error), rounds=20))


def is_cryptographic(rng: np.random.Generator) -> bool:
    """True when the generator's bit generator is a cryptographic one (ChaCha or AESCounter of randomgen)."""
    return type(rng.bit_generator).__name__ in CRYPTOGRAPHIC_BIT_GENERATORS


secure_rng = crypto_rng
"""Former name of :func:`crypto_rng`, kept so existing callers work (it now returns ChaCha20, not PCG64)."""


def check_epsilon(epsilon: Any, name: str = "epsilon", *, allow_inf: bool = False) -> float:
    """A privacy budget: a number in (0, inf) (``allow_inf``: (0, inf])."""
    return require_float(name, epsilon, low=0.0, low_open=True, finite=not allow_inf,
                         allowed=f"a number in (0, inf{']' if allow_inf else ')'}", error=parameter_error)
