"""Replay tools without a broker: id scheme, pacing, progress bar, parameter errors, record loading."""

from __future__ import annotations

import io
import time

import pytest

from replay_tools.__main__ import load_records
from replay_tools.kafka_replay import ReplayStats, _passes, loop_record_id, replay_records
from replay_tools.progress import ProgressBar, RateLimiter


def test_loop_record_id_keeps_pass_zero_and_suffixes_later_passes() -> None:
    assert loop_record_id("adult-00000", 0) == "adult-00000"
    assert loop_record_id("adult-00000", 1) == "adult-00000#1"
    assert loop_record_id("adult-32560", 12) == "adult-32560#12"


def test_passes_shuffle_is_a_fresh_deterministic_permutation_per_pass() -> None:
    import numpy as np

    recs = [{"id": f"r{i}"} for i in range(50)]
    a = [(p, r["id"]) for p, r in _passes(recs, 3, True, np.random.default_rng(5))]
    b = [(p, r["id"]) for p, r in _passes(recs, 3, True, np.random.default_rng(5))]
    c = [(p, r["id"]) for p, r in _passes(recs, 3, True, np.random.default_rng(6))]
    assert a == b and a != c
    per_pass = [[rid for p, rid in a if p == k] for k in range(3)]
    assert all(sorted(x) == sorted(r["id"] for r in recs) for x in per_pass)  # each pass: every record once
    assert per_pass[0] != per_pass[1]  # a new permutation each pass
    plain = [r["id"] for _, r in _passes(iter(recs), 1, False, None)]
    assert plain == [r["id"] for r in recs]  # no shuffle, one pass: streamed in order


def test_rate_limiter_paces_to_the_target_rate() -> None:
    limiter = RateLimiter(2000)
    t0 = time.perf_counter()
    limiter.start = t0
    for i in range(400):
        limiter.wait(i)
    elapsed = time.perf_counter() - t0
    # record 399 is due at 399/2000 = 0.1995 s; the limiter never runs ahead by more than its 2 ms slack
    assert elapsed >= 399 / 2000 - 0.002
    assert elapsed < 0.5
    unlimited = RateLimiter(0)
    t0 = time.perf_counter()
    for i in range(10000):
        unlimited.wait(i)
    assert time.perf_counter() - t0 < 0.1


def test_rate_limiter_rejects_negative_rate() -> None:
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(-1)


def test_progress_bar_draws_count_percentage_and_rate() -> None:
    out = io.StringIO()
    bar = ProgressBar(1000, label="replay", stream=out, interval_s=0.0)
    bar.update(250)
    bar.close()
    text = out.getvalue()
    assert "250/1,000" in text and "25%" in text and "rec/s" in text and text.endswith("\n")
    out2 = io.StringIO()
    ProgressBar(None, stream=out2, interval_s=0.0).update(12345)
    assert "12,345 records" in out2.getvalue()
    silent = io.StringIO()
    b3 = ProgressBar(10, stream=silent, enabled=False)
    b3.update(5)
    b3.close()
    assert silent.getvalue() == ""


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"loop": 0}, "loop"), ({"rate": -5.0}, "rate"), ({"limit": -1}, "limit"),
])
def test_replay_records_rejects_bad_parameters_before_connecting(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        replay_records([{"id": "a"}], "t", "127.0.0.1:1", **kwargs)


def test_replay_stats_rate_and_summary() -> None:
    s = ReplayStats(topic="adult.raw", records_sent=100, records_acked=100, seconds=2.0, target_rate=50, partitions=3,
                    passes=1)
    assert s.rate_achieved == 50
    assert "100 records" in s.summary() and "3 partitions" in s.summary() and "50 rec/s" in s.summary()


def test_load_records_adult_csv_and_synthetic(adult_path, tmp_path) -> None:
    recs, label = load_records(adult=str(adult_path), limit=10)
    assert label == "ADULT" and [r["id"] for r in recs] == [f"adult-{i:05d}" for i in range(10)]
    syn, label = load_records(synthetic=5, seed=1)
    assert "synthetic" in label and [r["id"] for r in syn] == [f"synth-{i:06d}" for i in range(5)]
    # any CSV with a schema: write 3 ADULT rows with a header and read them back through the ADULT schema
    import csv

    from stream_anon.core.schema import ADULT_SCHEMA_PATH

    path = tmp_path / "small.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[k for k in recs[0] if k != "id"])
        w.writeheader()
        for r in recs[:3]:
            w.writerow({k: v for k, v in r.items() if k != "id"})
    rows, label = load_records(csv=str(path), schema=str(ADULT_SCHEMA_PATH))
    assert len(rows) == 3 and rows[0]["id"] == "adult-0" and rows[0]["age"] == recs[0]["age"]
    with pytest.raises(SystemExit, match="--schema"):
        load_records(csv=str(path))
