"""Smoke test of ``stream-anon bench ldp-numeric`` (quick mode, DP k-means and speed sections)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream_anon.bench import ldp_numeric


@pytest.mark.slow
def test_bench_quick_prints_measured_tables(adult_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = ldp_numeric.main(["--quick", "--runs", "2", "--adult", str(adult_path), "--skip", "mean", "select"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "BoundedLaplace.randomise_many" in out and "values/s" in out
    assert "DP k-means on ADULT age x hours-per-week" in out and "QuadkDP NICV" in out
    assert "UniQuadkDP fit on 100,000 2-D points" in out
    assert "1.3799" in out  # naive scale, sensitivity 1, eps 1: actual eps


def test_bench_missing_adult_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = ldp_numeric.main(["--quick", "--adult", str(tmp_path / "nope.data"), "--skip", "speed"])
    assert rc == 2
    assert "does not exist" in capsys.readouterr().out
