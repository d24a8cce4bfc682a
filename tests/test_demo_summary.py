"""The demo summary's side-path lines: the records the side paths refused are shown with their reason."""

from __future__ import annotations

from stream_anon.runtime.demo import _side_summary_lines


def _side(**extra: object) -> dict[str, object]:
    return {"epsilon_per_record": {"adult.krr": 1.4}, "published": {"adult.krr": 32560}, "skipped": {},
            "epsilon_all_side_topics": 3.9, "epsilon_kmeans_window": 0.4, "estimates": {}, "kmeans_windows": 0,
            "error": None, **extra}


def test_no_side_paths_no_lines() -> None:
    assert _side_summary_lines({}) == []


def test_refused_records_are_counted_with_their_reason() -> None:
    lines = _side_summary_lines(_side(skipped={"person_budget": 1, "bad_input": 2}))
    line = next(x for x in lines if "records without side copies" in x)
    assert "bad_input 2, person_budget 1" in line and "count-min sketch" in line
    assert any("adult.krr" in x and "messages 32,560" in x for x in lines)


def test_nothing_refused_no_line() -> None:
    lines = _side_summary_lines(_side())
    assert not any("without side copies" in x for x in lines)
    assert not any("count-min" in x for x in _side_summary_lines(_side(skipped={"bad_input": 3})))
