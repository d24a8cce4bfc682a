"""The noise generator: ChaCha20 from OS entropy by default, reproducible ChaCha20 only from an explicit seed."""

from __future__ import annotations

import numpy as np
import pytest
from randomgen import AESCounter, ChaCha

from stream_anon.privacy import (
    BoundedLaplace,
    KRandomizedResponse,
    PrivacyParameterError,
    crypto_rng,
    is_cryptographic,
    secure_rng,
    seeded_crypto_rng,
)


def test_default_is_chacha20_keyed_from_os_entropy() -> None:
    a, b = crypto_rng(), crypto_rng()
    assert isinstance(a.bit_generator, ChaCha) and a.bit_generator.state["state"]["rounds"] == 20
    assert is_cryptographic(a)
    assert not np.array_equal(a.integers(0, 2 ** 62, 8), b.integers(0, 2 ** 62, 8))  # independent keys


def test_secure_rng_is_the_same_function_and_mechanisms_default_to_it() -> None:
    assert secure_rng is crypto_rng
    assert is_cryptographic(secure_rng())
    assert is_cryptographic(BoundedLaplace(epsilon=1.0, lower=0, upper=1).rng)
    assert is_cryptographic(KRandomizedResponse(epsilon=1.0, categories=["a", "b"]).rng)


def test_seeded_stream_is_reproducible_and_still_chacha() -> None:
    x, y = seeded_crypto_rng(7), crypto_rng(7)
    assert isinstance(x.bit_generator, ChaCha)
    assert np.array_equal(x.integers(0, 2 ** 62, 16), y.integers(0, 2 ** 62, 16))
    assert not np.array_equal(seeded_crypto_rng(7).random(4), seeded_crypto_rng(8).random(4))


def test_injected_generators_are_used_as_given() -> None:
    pcg = np.random.default_rng(0)
    assert crypto_rng(pcg) is pcg and not is_cryptographic(pcg)
    assert is_cryptographic(np.random.Generator(AESCounter()))
    with pytest.raises(PrivacyParameterError, match="rng"):
        crypto_rng("seed")  # type: ignore[arg-type]
    with pytest.raises(PrivacyParameterError, match="seed"):
        seeded_crypto_rng(-1)


def test_uniform_doubles_are_on_the_2_to_minus_53_grid() -> None:
    """exact_epsilon of k-RR / FRAPP relies on Generator.random() returning m * 2^-53 (also for ChaCha)."""
    u = seeded_crypto_rng(3).random(100_000)
    assert np.array_equal(u * 2.0 ** 53, np.floor(u * 2.0 ** 53))
