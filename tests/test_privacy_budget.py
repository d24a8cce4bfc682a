"""Budget accounting: spend, refuse instead of overspending, composition, split, per-window budgets."""

from __future__ import annotations

import json
import math

import pytest

from stream_anon.privacy import (
    BudgetAccountant,
    BudgetExhaustedError,
    BudgetStateError,
    PrivacyParameterError,
    WindowedBudget,
    sequential_composition,
    split_budget,
)


def test_spend_and_remaining() -> None:
    acc = BudgetAccountant(total_epsilon=1.0)
    rec = acc.spend(0.3, "age")
    assert rec.epsilon == 0.3 and rec.label == "age" and rec.spent_after == pytest.approx(0.3)
    acc.spend(0.5, "workclass")
    assert acc.spent == pytest.approx(0.8) and acc.remaining == pytest.approx(0.2)
    assert [h.label for h in acc.history] == ["age", "workclass"]
    assert acc.n_spends == 2


def test_exhausted_budget_refuses_with_clear_message_and_spends_nothing() -> None:
    acc = BudgetAccountant(total_epsilon=1.0)
    acc.spend(0.75, "first")
    with pytest.raises(BudgetExhaustedError, match=r"occupation.*epsilon=0\.5.*0\.25.*total epsilon=1") as ei:
        acc.spend(0.5, "occupation")
    assert ei.value.requested == 0.5 and ei.value.remaining == pytest.approx(0.25)
    assert acc.spent == pytest.approx(0.75) and acc.n_spends == 1
    acc.spend(0.25, "last")  # exactly the rest fits
    with pytest.raises(BudgetExhaustedError):
        acc.spend(1e-6, "one more")


def test_tolerance_accepts_float_splits_and_rounded_up_peers() -> None:
    acc = BudgetAccountant(total_epsilon=1.0)
    for _ in range(10):
        acc.spend(0.1, "tenth")  # 0.1 * 10 != 1.0 exactly in floating point
    assert acc.remaining == pytest.approx(0.0, abs=1e-12)
    acc2 = BudgetAccountant(total_epsilon=1.0)
    acc2.spend(1.0000000000000002, "opendp rounds eps up")
    acc3 = BudgetAccountant(total_epsilon=1.0)
    with pytest.raises(BudgetExhaustedError):
        acc3.spend(1.0 + 1e-6, "real overspend")


def test_many_tiny_spends_add_up() -> None:
    acc = BudgetAccountant(total_epsilon=1.0, max_history=5)
    for _ in range(100_000):
        acc.spend(1e-5, "tiny")
    assert acc.spent == pytest.approx(1.0, rel=1e-12)
    assert len(acc.history) == 5 and acc.n_spends == 100_000  # bounded history
    with pytest.raises(BudgetExhaustedError):
        acc.spend(1e-5, "one too many")


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_bad_epsilon(bad: object) -> None:
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        BudgetAccountant(total_epsilon=bad)  # type: ignore[arg-type]
    acc = BudgetAccountant(total_epsilon=1.0)
    with pytest.raises(PrivacyParameterError, match="epsilon"):
        acc.spend(bad, "x")  # type: ignore[arg-type]


def test_sequential_composition_and_split() -> None:
    assert sequential_composition([0.5, 1.0, 0.25]) == pytest.approx(1.75)
    assert sequential_composition({"age": 1.0, "sex": 2.0}) == pytest.approx(3.0)
    parts = split_budget(1.0, [1, 1, 1])
    assert isinstance(parts, list) and parts == pytest.approx([1 / 3] * 3)
    assert math.fsum(parts) == pytest.approx(1.0)
    acc = BudgetAccountant(total_epsilon=1.0)
    for p in parts:
        acc.spend(p, "part")
    named = split_budget(2.0, {"age": 3.0, "sex": 1.0})
    assert isinstance(named, dict) and named == pytest.approx({"age": 1.5, "sex": 0.5})
    with pytest.raises(PrivacyParameterError, match="weight"):
        split_budget(1.0, [1.0, 0.0])
    with pytest.raises(PrivacyParameterError, match="at least one"):
        split_budget(1.0, [])


def test_windowed_budget_resets_per_window_and_never_reopens() -> None:
    wb = WindowedBudget(epsilon_per_window=1.0)
    wb.spend(0.6, "kmeans", window=0)
    with pytest.raises(BudgetExhaustedError, match=r"window 0.*kmeans"):
        wb.spend(0.6, "kmeans", window=0)
    assert wb.remaining(0) == pytest.approx(0.4)
    assert wb.remaining(1) == pytest.approx(1.0)
    wb.spend(1.0, "kmeans", window=1)  # a new window has the whole budget again
    assert wb.spent == pytest.approx(1.0) and wb.windows_seen == 2
    assert wb.remaining(0) == 0.0
    with pytest.raises(BudgetExhaustedError, match="earlier than the current window"):
        wb.spend(0.1, "late", window=0)
    assert len(wb.history) == 1


def test_spend_reports_what_remains() -> None:
    acc = BudgetAccountant(total_epsilon=2.0)
    rec = acc.spend(1.5, "window 0")
    assert rec.remaining_after == pytest.approx(0.5) and rec.total == 2.0 and rec.spent_after == 1.5
    rec = acc.spend(0.5, "window 1")
    assert rec.remaining_after == 0.0  # after spending it all, nothing remains (the issue: 'remaining': 1.0)
    wb = WindowedBudget(epsilon_per_window=1.0)
    assert wb.current_remaining == 1.0
    r1 = wb.spend(0.5, "tree", window=0)
    r2 = wb.spend(0.5, "leaf counts", window=0)
    assert r1.remaining_after == 0.5 and r2.remaining_after == 0.0 and wb.current_remaining == 0.0


def test_accountant_state_round_trips_exactly_through_json() -> None:
    acc = BudgetAccountant(total_epsilon=2.0, max_history=5)
    for i in range(1000):
        acc.spend(0.001 + 1e-7 * i, f"release {i}")
    state = json.loads(json.dumps(acc.to_dict()))
    back = BudgetAccountant.from_dict(state)
    assert back.spent == acc.spent and back.remaining == acc.remaining and back.n_spends == 1000
    assert back.total_epsilon == 2.0 and [h.label for h in back.history] == [h.label for h in acc.history]
    assert back.can_spend(acc.remaining) and not back.can_spend(acc.remaining + 1e-6)
    # a restart with a new total keeps what was spent: raising the cap resumes, lowering it stops
    raised = BudgetAccountant.from_dict(state, total_epsilon=3.0)
    assert raised.spent == acc.spent and raised.remaining == pytest.approx(3.0 - acc.spent)
    lowered = BudgetAccountant.from_dict(state, total_epsilon=0.5)
    assert lowered.remaining == 0.0
    with pytest.raises(BudgetExhaustedError):
        lowered.spend(0.01, "after restart")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("kind", "WindowedBudget", "kind must be 'BudgetAccountant'"),
    ("version", 99, "version must be 1"),
    ("total_epsilon", -1.0, "total_epsilon must be a finite positive number"),
    ("spent_sum", "0.5", "spent_sum must be a finite number"),
    ("spent_sum", -3.0, "spent_sum \\+ spent_compensation must be >= 0"),
    ("n_spends", 1.5, "n_spends must be an integer"),
    ("spent", 7.0, "disagrees"),
    ("history", "x", "history must be a list"),
])
def test_malformed_state_is_refused_naming_the_field(field: str, value: object, message: str) -> None:
    acc = BudgetAccountant(total_epsilon=1.0)
    acc.spend(0.5, "x")
    state = acc.to_dict()
    state[field] = value
    with pytest.raises(BudgetStateError, match=message):
        BudgetAccountant.from_dict(state)
    with pytest.raises(BudgetStateError, match="expected a mapping"):
        BudgetAccountant.from_dict(None)  # type: ignore[arg-type]


def test_windowed_budget_state_round_trips_and_still_never_reopens() -> None:
    wb = WindowedBudget(epsilon_per_window=1.0)
    wb.spend(0.4, "tree", window=3)
    back = WindowedBudget.from_dict(json.loads(json.dumps(wb.to_dict())))
    assert back.window == 3 and back.windows_seen == 1 and back.remaining(3) == pytest.approx(0.6)
    with pytest.raises(BudgetExhaustedError, match="earlier than the current window"):
        back.spend(0.1, "late", window=2)
    with pytest.raises(BudgetExhaustedError):
        back.spend(0.7, "too much", window=3)
    back.spend(1.0, "next", window=4)
    bad = WindowedBudget(epsilon_per_window=1.0)
    bad.spend(0.1, "x", window=(1, 2))
    with pytest.raises(BudgetStateError, match="window"):
        bad.to_dict()
    state = wb.to_dict()
    state["current"] = None
    with pytest.raises(BudgetStateError, match="expected a mapping"):
        WindowedBudget.from_dict(state)
