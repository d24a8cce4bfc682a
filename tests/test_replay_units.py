"""Replay tools without a broker: id scheme, pacing, progress bar, parameter errors, record loading."""

from __future__ import annotations

import io
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kafka.errors import KafkaConnectionError
from replay_support import write_clinic

from replay_tools.__main__ import ReplaySourceError, _positive_seconds, load_records
from stream_anon.core.schema import Schema
from stream_anon.formats.decoding import DeadLetter, RecordDecoder
from stream_anon.kafka_io.broker import free_port
from stream_anon.replay import kafka_replay
from stream_anon.replay.kafka_replay import (
    BrokerUnreachableError,
    ReplayInputError,
    ReplayStats,
    _passes,
    encode_record,
    loop_record_id,
    replay_records,
)
from stream_anon.replay.progress import ProgressBar, RateLimiter


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


class FakeClock:
    """A clock that only moves when the code under test sleeps or the test says time passed."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize("work_s", [0.0, 0.0001, 0.0004])
def test_rate_limiter_schedule_is_absolute_and_never_runs_ahead(work_s: float) -> None:
    clock = FakeClock()
    limiter = RateLimiter(2000, clock=clock, sleep=clock.sleep)
    clock.now += 0.35  # a slow source: its first record comes late; the schedule starts with it (no burst)
    times = []
    for i in range(400):
        clock.now += work_s  # the caller's own work per event (encoding, send)
        limiter.wait(i)
        times.append(clock.now)
    start = times[0]
    assert limiter.start == start
    due = [start + i / 2000 for i in range(400)]
    # never ahead of the schedule by more than the 2 ms slack, never behind it by more than one event's work
    assert all(d - limiter.slack_s <= t <= d + work_s + 1e-12 for t, d in zip(times, due, strict=True))
    # the long-run rate is the target: event 399 goes out at 399/2000 s (within the slack) whatever the work
    assert times[-1] - start == pytest.approx(399 / 2000, abs=limiter.slack_s + work_s)
    assert clock.sleeps and all(s > limiter.slack_s for s in clock.sleeps)  # sleeps only when ahead by > slack


def test_rate_limiter_behind_schedule_neither_sleeps_nor_bursts_beyond_it() -> None:
    clock = FakeClock()
    limiter = RateLimiter(1000, clock=clock, sleep=clock.sleep)
    for i in range(100):
        clock.now += 0.002  # 2 ms of work per event at a 1 ms schedule: always behind
        if i == 0:
            start = clock.now
        limiter.wait(i)
    assert clock.sleeps == []
    assert limiter.due(99) == pytest.approx(start + 0.099)  # the schedule stays absolute


def test_rate_limiter_without_rate_never_reads_the_clock_or_sleeps() -> None:
    reads = []

    def clock() -> float:
        reads.append(1)
        return 0.0

    def no_sleep(seconds: float) -> None:
        raise AssertionError("rate 0 must not sleep")

    unlimited = RateLimiter(0, clock=clock, sleep=no_sleep)
    for i in range(10000):
        unlimited.wait(i)
    assert reads == []


def test_rate_limiter_rejects_negative_rate() -> None:
    with pytest.raises(ValueError, match="rate"):
        RateLimiter(-1)


def test_progress_bar_draws_count_percentage_and_rate() -> None:
    out = io.StringIO()
    clock = FakeClock()
    bar = ProgressBar(1000, label="replay", stream=out, interval_s=0.0, clock=clock)
    clock.now += 2.0
    bar.update(250)
    bar.close()
    text = out.getvalue()
    assert "250/1,000" in text and "25%" in text and "125 rec/s" in text and text.endswith("\n")
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
    with pytest.raises(ReplaySourceError, match="--schema"):
        load_records(csv=str(path))


# ------------------------------------------------------------------------------- a user's own CSV and schema
def test_a_custom_schema_csv_replays_as_records_the_service_decoder_accepts(tmp_path: Path) -> None:
    csv_path, schema_path = write_clinic(tmp_path)
    schema = Schema.load(schema_path)
    records, label = load_records(csv=str(csv_path), schema=str(schema_path))
    assert label == "CSV clinic.csv" and len(records) == 40
    assert list(records[0]) == ["patient_ref", "age", "zip", "weight", "diagnosis"]  # no "id", no extra column
    assert records[0] == {"patient_ref": "P0000", "age": 20, "zip": "10115", "weight": 60.0, "diagnosis": "flu"}
    assert type(records[3]["weight"]) is float and type(records[3]["age"]) is int  # typed per the schema
    decoder = RecordDecoder(schema, max_message_bytes=1 << 20)
    for rec in records:
        decoded = decoder.decode(encode_record(rec))  # the exact bytes the replay sends
        assert not isinstance(decoded, DeadLetter), decoded
        assert decoded == rec
    # the old shape (the id column renamed to "id", extra columns kept) is what the service dead-lettered
    old = {"id": "P0000", **{k: v for k, v in records[0].items() if k != "patient_ref"}}
    verdict = decoder.decode(encode_record(old))
    assert isinstance(verdict, DeadLetter) and verdict.reason == "bad_record_id"


def test_a_custom_schema_csv_without_an_id_column_gets_ids_in_the_schemas_field(tmp_path: Path) -> None:
    csv_path, schema_path = write_clinic(tmp_path, n=5, id_column="unused")
    text = csv_path.read_text().splitlines()
    csv_path.write_text("\n".join(line.split(",", 1)[1] for line in text) + "\n")  # drop the id column
    records, _ = load_records(csv=str(csv_path), schema=str(schema_path))
    assert [r["patient_ref"] for r in records] == [f"clinic-{i}" for i in range(5)]
    decoder = RecordDecoder(Schema.load(schema_path), max_message_bytes=1 << 20)
    assert not any(isinstance(decoder.decode(encode_record(r)), DeadLetter) for r in records)


def test_replay_names_the_missing_id_field_before_connecting() -> None:
    with pytest.raises(ReplayInputError, match="'patient_ref'"):
        replay_records([{"id": "a"}], "t", "127.0.0.1:1", id_field="patient_ref", create_topic=False,
                       producer=NoNetworkProducer())


class NoNetworkProducer:
    """A producer double for paths that must fail before anything is sent."""

    def send(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("nothing may be sent")

    def flush(self, timeout: float | None = None) -> None:
        pass


# ------------------------------------------------------------------------------- operator mistakes and signals
def _replay_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "replay_tools", *args]


@pytest.mark.integration
@pytest.mark.parametrize("command", [["kafka", "--synthetic", "10", "--no-progress"], ["flush"]])
def test_an_unreachable_broker_gives_one_line_and_exit_3(command: list[str]) -> None:
    port = free_port()  # nothing listens there
    proc = subprocess.run(_replay_cli(*command, "--bootstrap-servers", f"127.0.0.1:{port}", "--connect-timeout", "2"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"broker 127.0.0.1:{port} unreachable: no connection within 2 s" in lines[0]


class _AdminLosingItsBroker:
    """An admin client whose broker goes away after the topic was created (CI: a broker killed right then)."""

    closed = False

    def list_topics(self) -> list[str]:
        return []

    def describe_cluster(self) -> dict[str, Any]:  # how many brokers: the replication of a created topic
        return {"brokers": [{"node_id": 1}]}

    def create_topics(self, topics: list[Any]) -> None:
        pass

    def describe_topics(self, topics: list[str]) -> list[dict[str, Any]]:
        raise KafkaConnectionError("111 ECONNREFUSED")

    def close(self) -> None:
        self.closed = True


def test_a_broker_lost_while_the_topic_is_set_up_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = _AdminLosingItsBroker()
    monkeypatch.setattr(kafka_replay, "_admin", lambda *_a: admin)
    with pytest.raises(BrokerUnreachableError, match=r"the broker at 127\.0\.0\.1:1 stopped answering while topic "
                                                     r"'adult\.raw' was checked or created: KafkaConnectionError"):
        kafka_replay.ensure_topic("127.0.0.1:1", "adult.raw", 2)
    assert admin.closed


@pytest.mark.parametrize("text", ["0", "-1", "inf", "nan", "ten"])
def test_ack_timeout_refuses_what_is_no_positive_number_of_seconds_naming_it(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match=f"seconds above 0, got '{text}'"):
        _positive_seconds(text)
    assert _positive_seconds("0.5") == 0.5 and _positive_seconds("10") == 10.0


@pytest.mark.integration
@pytest.mark.parametrize(("args", "message"), [
    (["kafka", "--csv", "missing.csv", "--schema", "missing.yaml"], "cannot read 'missing.yaml' (--schema)"),
    (["kafka", "--csv", "x.csv"], "--csv needs --schema"),
    (["udp", "--synthetic", "3", "--target", "nowhere"], "--target"),
])
def test_operator_mistakes_give_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = subprocess.run(_replay_cli(*args, "--bootstrap-servers", "127.0.0.1:1") if args[0] == "kafka"
                          else _replay_cli(*args), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_connecting_exits_cleanly(sig: signal.Signals) -> None:
    """A broker that accepts the connection and never answers: the replay is stuck connecting; a signal then
    (the event: our listener accepted the client's connection) gives one line, no traceback."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(60)
        port = listener.getsockname()[1]
        proc = subprocess.Popen(_replay_cli("kafka", "--synthetic", "10", "--bootstrap-servers", f"127.0.0.1:{port}",
                                            "--connect-timeout", "120", "--no-progress"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            conn, _ = listener.accept()
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=30)
            conn.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == 128 + sig
    assert out == "" and "Traceback" not in err
    assert err.strip().splitlines() == [f"python -m replay_tools: interrupted by {sig.name} before the first record "
                                        "was sent"]
