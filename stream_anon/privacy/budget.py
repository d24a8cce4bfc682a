"""Privacy budget accounting (pure eps-DP, sequential composition).

* :class:`BudgetAccountant` holds a total eps; each release ``spend``\\ s part of it and is refused with
  :class:`BudgetExhaustedError` (never silently) when it would exceed the total.  Comparisons allow a
  relative tolerance of 1e-9 so that budgets split into floating-point parts (or an OpenDP eps rounded up
  to 1.0000000000000002) still add up to their total.
* Per-record composition: the eps of several perturbed attributes of one record add up
  (:func:`sequential_composition`) unless a per-record total is split among them (:func:`split_budget`).
* :class:`WindowedBudget`: a budget per stream window (e.g. one DP k-means release per window); it
  resets when a new window starts and refuses to reopen a window it has left.
* Persistence: ``to_dict()`` / ``from_dict()`` give a JSON-serializable state (exact: the compensated sum is
  stored as its two doubles) that the service writes to its ledger and restores at start, so a restart cannot
  reset a cumulative budget; ``from_dict`` refuses a malformed state with :class:`BudgetStateError` naming the
  field.  Every spend returns a :class:`BudgetSpend` with the cumulative ``spent_after`` and the
  ``remaining_after`` to report.

Sequential composition (Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", Thm 3.16):
mechanisms with eps_1..eps_m applied to the same individual's data are (sum eps_i)-DP.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream_anon.core.validation import ErrorFactory, is_int, raising, require_float, require_int
from stream_anon.privacy.base import PrivacyParameterError, check_epsilon, parameter_error

RELATIVE_TOLERANCE = 1e-9


class BudgetStateError(ValueError):
    """A persisted budget state cannot be read; the message names the field, what was expected and the value."""


STATE_ERROR: ErrorFactory = raising(BudgetStateError, prefix="budget state")
"""``budget state: <field> must be <allowed>, got <value>`` as a :class:`BudgetStateError`."""

STATE_VERSION = 1


class BudgetExhaustedError(RuntimeError):
    """A release would spend more eps than remains; nothing was spent."""

    def __init__(self, message: str, *, requested: float, remaining: float, total: float, label: str):
        super().__init__(message)
        self.requested = requested
        self.remaining = remaining
        self.total = total
        self.label = label


@dataclass(frozen=True)
class BudgetSpend:
    """One spend: what it was for, its eps, the cumulative eps after it and what then remains of ``total``."""

    label: str
    epsilon: float
    spent_after: float
    remaining_after: float = math.nan
    total: float = math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "epsilon": self.epsilon, "spent_after": self.spent_after,
                "remaining_after": self.remaining_after, "total": self.total}


def _tolerance(total: float) -> float:
    return RELATIVE_TOLERANCE * max(total, 1e-300)


class BudgetAccountant:
    """A total eps that releases spend; refuses (``BudgetExhaustedError``) instead of overspending.

    ``history`` keeps the last ``max_history`` spends (bounded); ``spent`` and ``n_spends`` cover all.
    """

    def __init__(self, *, total_epsilon: float, max_history: int = 10_000):
        self.total_epsilon = check_epsilon(total_epsilon, "total_epsilon")
        max_history = require_int("max_history", max_history, low=1, error=parameter_error)
        self._spent = 0.0
        self._compensation = 0.0
        self.n_spends = 0
        self._history: deque[BudgetSpend] = deque(maxlen=max_history)

    @property
    def spent(self) -> float:
        return self._spent + self._compensation

    @property
    def remaining(self) -> float:
        return max(0.0, self.total_epsilon - self.spent)

    @property
    def history(self) -> list[BudgetSpend]:
        return list(self._history)

    def can_spend(self, epsilon: float) -> bool:
        eps = check_epsilon(epsilon)
        return self.spent + eps <= self.total_epsilon + _tolerance(self.total_epsilon)

    def spend(self, epsilon: float, label: str = "") -> BudgetSpend:
        """Spend ``epsilon`` for ``label``; raises ``BudgetExhaustedError`` (spending nothing) if it does not fit."""
        eps = check_epsilon(epsilon)
        if not self.can_spend(eps):
            raise BudgetExhaustedError(
                f"privacy budget exhausted: {label or 'release'!s} needs epsilon={eps:.6g} but only "
                f"{self.remaining:.6g} of total epsilon={self.total_epsilon:.6g} remains "
                f"(spent {self.spent:.6g} in {self.n_spends} release(s)); the release was not made",
                requested=eps, remaining=self.remaining, total=self.total_epsilon, label=label)
        # Neumaier compensated summation: many tiny spends still add up exactly enough
        t = self._spent + eps
        if abs(self._spent) >= eps:
            self._compensation += (self._spent - t) + eps
        else:
            self._compensation += (eps - t) + self._spent
        self._spent = t
        self.n_spends += 1
        record = BudgetSpend(label=str(label), epsilon=eps, spent_after=self.spent, remaining_after=self.remaining,
                             total=self.total_epsilon)
        self._history.append(record)
        return record

    def __repr__(self) -> str:
        return f"BudgetAccountant(total_epsilon={self.total_epsilon!r}, spent={self.spent:.6g}, spends={self.n_spends})"

    # ------------------------------------------------------------------ persistence
    def to_dict(self, *, history: int = 100) -> dict[str, Any]:
        """JSON-serializable state: total, the exact compensated spent (two doubles), spends, last ``history``."""
        return {
            "kind": "BudgetAccountant", "version": STATE_VERSION, "total_epsilon": self.total_epsilon,
            "spent": self.spent, "spent_sum": self._spent, "spent_compensation": self._compensation,
            "n_spends": self.n_spends, "max_history": self._history.maxlen,
            "history": [h.to_dict() for h in list(self._history)[-history:]] if history > 0 else [],
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any], *, total_epsilon: float | None = None) -> BudgetAccountant:
        """Restore a state written by :meth:`to_dict`.

        ``total_epsilon`` (e.g. from the current configuration) replaces the stored total; what was spent is
        kept either way, so raising the total resumes releases and lowering it below ``spent`` leaves 0.
        Raises :class:`BudgetStateError` for anything malformed (never a silently empty budget).
        """
        _expect_kind(state, "BudgetAccountant")
        total = _state_number(state, "total_epsilon", positive=True) if total_epsilon is None \
            else check_epsilon(total_epsilon, "total_epsilon")
        spent_sum = _state_number(state, "spent_sum")
        comp = _state_number(state, "spent_compensation")
        n_spends = _state_int(state, "n_spends")
        max_history = _state_int(state, "max_history", minimum=1)
        if spent_sum < 0 or spent_sum + comp < 0:
            raise BudgetStateError(f"budget state: spent_sum + spent_compensation must be >= 0, got "
                                   f"{spent_sum!r} + {comp!r}")
        if "spent" in state and abs(float(state["spent"]) - (spent_sum + comp)) > 1e-9 * max(1.0, spent_sum):
            raise BudgetStateError(f"budget state: spent={state['spent']!r} disagrees with spent_sum + "
                                   f"spent_compensation = {spent_sum + comp!r}")
        acc = cls(total_epsilon=total, max_history=max_history)
        acc._spent, acc._compensation, acc.n_spends = spent_sum, comp, n_spends
        hist = state.get("history", [])
        if not isinstance(hist, list):
            raise BudgetStateError(f"budget state: history must be a list, got {type(hist).__name__}")
        for i, h in enumerate(hist):
            try:
                acc._history.append(BudgetSpend(label=str(h["label"]), epsilon=float(h["epsilon"]),
                                                spent_after=float(h["spent_after"]),
                                                remaining_after=float(h.get("remaining_after", math.nan)),
                                                total=float(h.get("total", math.nan))))
            except (KeyError, TypeError, ValueError) as e:
                raise BudgetStateError(f"budget state: history[{i}] is not a spend record ({e!r}): {h!r}") from None
        return acc


def _expect_kind(state: Any, kind: str) -> None:
    if not isinstance(state, Mapping):
        raise BudgetStateError(f"budget state: expected a mapping, got {type(state).__name__}")
    if state.get("kind") != kind:
        raise BudgetStateError(f"budget state: kind must be {kind!r}, got {state.get('kind')!r}")
    if state.get("version") != STATE_VERSION:
        raise BudgetStateError(f"budget state: version must be {STATE_VERSION}, got {state.get('version')!r}")


def _state_number(state: Mapping[str, Any], key: str, *, positive: bool = False) -> float:
    if positive:
        return require_float(key, state.get(key), low=0.0, low_open=True, allowed="a finite positive number",
                             error=STATE_ERROR)
    return require_float(key, state.get(key), error=STATE_ERROR)


def _state_int(state: Mapping[str, Any], key: str, *, minimum: int = 0) -> int:
    return require_int(key, state.get(key), low=minimum, error=STATE_ERROR)


def _is_window_key(window: Any) -> bool:
    """A window key that can be persisted: None, an int or a str."""
    return window is None or is_int(window) or isinstance(window, str)


def sequential_composition(epsilons: Iterable[float] | Mapping[Any, float]) -> float:
    """eps of applying all the mechanisms to one record: the (exact, compensated) sum."""
    values = list(epsilons.values()) if isinstance(epsilons, Mapping) else list(epsilons)
    return math.fsum(check_epsilon(e) for e in values)


def split_budget(total: float, weights: Sequence[float] | Mapping[Any, float]) -> list[float] | dict[Any, float]:
    """Split a per-record total eps in proportion to ``weights`` (list -> list, mapping -> dict).

    The parts add up to ``total`` within floating point (checked), so their sequential composition is the
    total and a :class:`BudgetAccountant` with that total accepts all of them.
    """
    tot = check_epsilon(total, "total")
    keys = list(weights.keys()) if isinstance(weights, Mapping) else None
    ws = [require_float("weights", w, low=0.0, low_open=True, allowed="positive finite numbers (each weight)",
                        error=parameter_error)
          for w in (weights.values() if isinstance(weights, Mapping) else weights)]
    if not ws:
        raise PrivacyParameterError("weights: need at least one weight")
    s = math.fsum(ws)
    parts = [tot * w / s for w in ws]
    assert abs(math.fsum(parts) - tot) <= _tolerance(tot)
    return dict(zip(keys, parts, strict=True)) if keys is not None else parts


class WindowedBudget:
    """eps budget per stream window: each window (a key that only moves forward) gets ``epsilon_per_window``.

    ``spend(epsilon, label, window=w)``: a new window resets the budget; returning to an earlier window is
    refused (its spends are no longer tracked, so it could be overspent).  Only the current window's
    accountant is kept (bounded state).
    """

    def __init__(self, *, epsilon_per_window: float, max_history: int = 1_000):
        self.epsilon_per_window = check_epsilon(epsilon_per_window, "epsilon_per_window")
        self._max_history = max_history
        self.window: Hashable | None = None
        self._accountant = BudgetAccountant(total_epsilon=self.epsilon_per_window, max_history=max_history)
        self.windows_seen = 0

    def _enter(self, window: Hashable) -> None:
        if self.window is None or window != self.window:
            if self.window is not None:
                try:
                    moved_back = bool(window < self.window)  # type: ignore[operator]
                except TypeError as e:
                    raise PrivacyParameterError(
                        f"window: keys must be comparable and increasing, got {window!r} after {self.window!r}") from e
                if moved_back:
                    raise BudgetExhaustedError(
                        f"window {window!r} is earlier than the current window {self.window!r}: its budget is no "
                        f"longer tracked, so no more can be spent in it",
                        requested=math.nan, remaining=0.0, total=self.epsilon_per_window, label=str(window))
            self.window = window
            self.windows_seen += 1
            self._accountant = BudgetAccountant(total_epsilon=self.epsilon_per_window, max_history=self._max_history)

    def spend(self, epsilon: float, label: str = "", *, window: Hashable) -> BudgetSpend:
        """Spend in ``window`` (entering it if new); the record's ``remaining_after`` is that window's rest."""
        self._enter(window)
        try:
            return self._accountant.spend(epsilon, f"{label} (window {window!r})" if label else f"window {window!r}")
        except BudgetExhaustedError as e:
            raise BudgetExhaustedError(
                f"window {window!r}: {e}", requested=e.requested, remaining=e.remaining,
                total=e.total, label=e.label) from None

    def remaining(self, window: Hashable) -> float:
        if self.window is not None and window != self.window:
            try:
                if window < self.window:  # type: ignore[operator]
                    return 0.0
            except TypeError:
                return 0.0
            return self.epsilon_per_window
        return self._accountant.remaining

    @property
    def spent(self) -> float:
        """eps spent in the current window."""
        return self._accountant.spent

    @property
    def history(self) -> list[BudgetSpend]:
        """Spends of the current window."""
        return self._accountant.history

    @property
    def current_remaining(self) -> float:
        """What remains in the current window (the whole per-window budget before the first window)."""
        return self._accountant.remaining

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable state (the window key must itself be JSON-serializable: int or str)."""
        window: Any = self.window
        if not _is_window_key(window):
            raise BudgetStateError(f"window: only int or str window keys can be persisted, got {window!r}")
        window = int(window) if is_int(window) else window
        return {"kind": "WindowedBudget", "version": STATE_VERSION, "epsilon_per_window": self.epsilon_per_window,
                "window": window, "windows_seen": self.windows_seen,
                "current": self._accountant.to_dict()}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> WindowedBudget:
        _expect_kind(state, "WindowedBudget")
        per_window = _state_number(state, "epsilon_per_window", positive=True)
        window = state.get("window")
        if not _is_window_key(window):
            raise STATE_ERROR("window", "null, an int or a str", window)
        wb = cls(epsilon_per_window=per_window)
        wb.window = window
        wb.windows_seen = _state_int(state, "windows_seen")
        wb._accountant = BudgetAccountant.from_dict(state.get("current"), total_epsilon=per_window)  # type: ignore[arg-type]
        wb._max_history = wb._accountant._history.maxlen or 1
        return wb
