"""Parameter validation written once: "an int but not a bool" and its relatives, each a one-line error.

Every ``require_*`` helper returns the value normalized (``int``, ``float``, the choice) or raises
``error(name, allowed, value)``.  The default error is a ``ValueError`` with the project's standard line

    <name>: must be <allowed>, got <value!r>

(:func:`must_be`); a caller passes the error type it already raises: an ``(name, allowed, value)`` constructor
such as :class:`stream_anon.core.engine.config.EngineConfigError` directly, a one-message exception type
through :func:`raising` (``raising(PrivacyParameterError)``), optionally with a prefix naming the context
(``raising(ValueError, prefix="verify")`` gives ``verify: k must be an integer >= 1, got 0``).  ``allowed``
is derived from the bounds ("an integer in [1, 62]", "a finite number >= 0", "a number in (0, 1]") unless the
caller states it (``allowed="a finite positive number"``).

``bool`` is never accepted as a number (``True`` is an ``int`` in Python); numpy integers and floats are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "ErrorFactory",
    "is_int",
    "is_number",
    "must_be",
    "raising",
    "require_bool",
    "require_choice",
    "require_float",
    "require_int",
    "require_probability",
]

ErrorFactory = Callable[[str, str, Any], Exception]
"""Builds the exception for (name, allowed, value)."""

T = TypeVar("T")


def must_be(name: str, allowed: str, value: Any) -> str:
    """The standard one-line message: ``<name>: must be <allowed>, got <value!r>``."""
    return f"{name}: must be {allowed}, got {value!r}"


def raising(exc_type: Callable[[str], Exception], *, prefix: str = "") -> ErrorFactory:
    """An :data:`ErrorFactory` raising ``exc_type(message)`` with the standard message, or, with ``prefix``,
    ``<prefix>: <name> must be <allowed>, got <value!r>``."""
    def factory(name: str, allowed: str, value: Any) -> Exception:
        if prefix:
            return exc_type(f"{prefix}: {name} must be {allowed}, got {value!r}")
        return exc_type(must_be(name, allowed, value))
    return factory


def _value_error(name: str, allowed: str, value: Any) -> Exception:
    return ValueError(must_be(name, allowed, value))


def is_int(value: Any) -> bool:
    """An integer (Python or numpy), not a ``bool``."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number (Python or numpy int/float), not a ``bool``; NaN and infinities included."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _int_range(low: int | None, high: int | None) -> str:
    if low is None and high is None:
        return "an integer"
    if high is None:
        return f"an integer >= {low}"
    if low is None:
        return f"an integer <= {high}"
    return f"an integer in [{low}, {high}]"


def require_int(name: str, value: Any, *, low: int | None = None, high: int | None = None,
                allowed: str | None = None, error: ErrorFactory = _value_error) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool) in [low, high] (a missing bound: unbounded)."""
    text = allowed if allowed is not None else _int_range(low, high)
    if not is_int(value):
        raise error(name, text, value)
    v = int(value)
    if (low is not None and v < low) or (high is not None and v > high):
        raise error(name, text, v)
    return v


def _float_range(low: float | None, high: float | None, low_open: bool, high_open: bool, finite: bool) -> str:
    if low is None and high is None:
        return "a finite number" if finite else "a number"
    if high is None:
        assert low is not None
        return f"a {'finite ' if finite else ''}number {'>' if low_open else '>='} {_num(low)}"
    if low is None:
        return f"a {'finite ' if finite else ''}number {'<' if high_open else '<='} {_num(high)}"
    return f"a number in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"


def require_float(name: str, value: Any, *, low: float | None = None, high: float | None = None,
                  low_open: bool = False, high_open: bool = False, finite: bool = True,
                  allowed: str | None = None, error: ErrorFactory = _value_error) -> float:
    """``value`` as a ``float`` when it is a number (not a bool, never NaN) within the bounds.

    ``low_open`` / ``high_open`` exclude the bound itself; ``finite=False`` admits +-inf (within the bounds).
    """
    text = allowed if allowed is not None else _float_range(low, high, low_open, high_open, finite)
    if not is_number(value):
        raise error(name, text, value)
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)):
        raise error(name, text, value)
    if low is not None and (v <= low if low_open else v < low):
        raise error(name, text, value)
    if high is not None and (v >= high if high_open else v > high):
        raise error(name, text, value)
    return v


def require_probability(name: str, value: Any, *, open_low: bool = False, open_high: bool = False,
                        allowed: str | None = None, error: ErrorFactory = _value_error) -> float:
    """A number in [0, 1] (``open_low`` / ``open_high`` exclude 0 / 1)."""
    return require_float(name, value, low=0.0, high=1.0, low_open=open_low, high_open=open_high, allowed=allowed,
                         error=error)


def require_choice(name: str, value: T, choices: Collection[object], *, allowed: str | None = None,
                   error: ErrorFactory = _value_error) -> T:
    """``value`` when it is one of ``choices`` (allowed text: ``one of [...]``)."""
    try:
        ok = value in choices
    except TypeError:  # unhashable value against a set
        ok = False
    if not ok:
        raise error(name, allowed if allowed is not None else f"one of {list(choices)}", value)
    return value


def require_bool(name: str, value: Any, *, error: ErrorFactory = _value_error) -> bool:
    """``value`` when it is ``True`` or ``False`` (not 0 / 1, not a string)."""
    if not isinstance(value, bool | np.bool_):
        raise error(name, "true or false", value)
    return bool(value)
