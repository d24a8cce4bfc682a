"""The validation helpers: accepted values come back normalized; every refusal is one line naming the parameter,
the allowed range and the value received, raised as the caller's own error type."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from stream_anon.core.engine.config import EngineConfigError
from stream_anon.core.validation import (
    is_int,
    is_number,
    must_be,
    raising,
    require_bool,
    require_choice,
    require_float,
    require_int,
    require_probability,
)


class OwnError(ValueError):
    pass


def test_int_accepts_python_and_numpy_integers_never_bools() -> None:
    assert require_int("n", np.int64(7), low=1) == 7 and type(require_int("n", np.int64(7))) is int
    assert require_int("n", 3, low=3, high=3) == 3
    assert is_int(5) and is_int(np.uint8(5)) and not is_int(True) and not is_int(np.bool_(True)) and not is_int(5.0)
    for bad in (True, False, 2.0, "2", None):
        with pytest.raises(ValueError, match=r"^n: must be an integer >= 1, got "):
            require_int("n", bad, low=1)


@pytest.mark.parametrize(("low", "high", "value", "message"), [
    (1, None, 0, "n: must be an integer >= 1, got 0"),
    (None, 5, 6, "n: must be an integer <= 5, got 6"),
    (1, 62, 63, "n: must be an integer in [1, 62], got 63"),
    (None, None, 1.5, "n: must be an integer, got 1.5"),
])
def test_int_messages(low: int | None, high: int | None, value: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        require_int("n", value, low=low, high=high)
    assert str(info.value) == message


@pytest.mark.parametrize(("kwargs", "value", "message"), [
    ({"low": 0.0}, -1.0, "x: must be a finite number >= 0, got -1.0"),
    ({"low": 0.0, "low_open": True}, 0, "x: must be a finite number > 0, got 0"),
    ({"high": 1.5, "high_open": True}, 1.5, "x: must be a finite number < 1.5, got 1.5"),
    ({"low": 0.0, "high": 1.0, "high_open": True}, 1.0, "x: must be a number in [0, 1), got 1.0"),
    ({}, math.inf, "x: must be a finite number, got inf"),
    ({"finite": False}, math.nan, "x: must be a number, got nan"),
    ({}, True, "x: must be a finite number, got True"),
    ({"low": 1.0, "low_open": True, "allowed": "a ratio above 1"}, 1.0, "x: must be a ratio above 1, got 1.0"),
])
def test_float_messages(kwargs: dict[str, Any], value: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        require_float("x", value, **kwargs)
    assert str(info.value) == message


def test_float_accepts_numbers_and_infinity_only_when_asked() -> None:
    assert require_float("x", np.float32(0.5)) == 0.5 and type(require_float("x", 2)) is float
    assert require_float("x", math.inf, low=0.0, low_open=True, finite=False) == math.inf
    assert is_number(np.int16(1)) and is_number(math.nan) and not is_number(False) and not is_number("1")
    assert require_probability("p", 1) == 1.0
    with pytest.raises(ValueError, match=r"p: must be a number in \(0, 1\], got 0"):
        require_probability("p", 0, open_low=True)


def test_choice_and_bool() -> None:
    assert require_choice("mode", "b", ("a", "b")) == "b"
    with pytest.raises(ValueError, match=r"^mode: must be one of \['a', 'b'\], got 'c'$"):
        require_choice("mode", "c", ("a", "b"))
    with pytest.raises(ValueError, match=r"one of \['a'\], got \['a'\]"):
        require_choice("mode", ["a"], {"a"})  # unhashable: refused, not a TypeError
    assert require_bool("flag", np.bool_(False)) is False
    with pytest.raises(ValueError, match="flag: must be true or false, got 1"):
        require_bool("flag", 1)


def test_the_callers_error_type_and_layout() -> None:
    with pytest.raises(EngineConfigError) as info:  # an (name, allowed, value) constructor, used directly
        require_int("k", 1, low=2, error=EngineConfigError)
    assert (info.value.parameter, info.value.allowed, info.value.value) == ("k", "an integer >= 2", 1)
    with pytest.raises(OwnError, match=r"^k: must be an integer >= 2, got 1$"):
        require_int("k", 1, low=2, error=raising(OwnError))
    with pytest.raises(OwnError, match=r"^verify: k must be an integer >= 1, got 0$"):
        require_int("k", 0, low=1, error=raising(OwnError, prefix="verify"))
    assert must_be("a", "b", "c") == "a: must be b, got 'c'"
