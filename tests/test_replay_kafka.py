"""Replay into the real Tansu broker and consume back (highwater-based: Tansu's end_offsets is wrong)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from replay_tools.kafka_replay import ensure_topic, read_topic, replay_records
from stream_anon.core.datasets import iter_adult_records

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def adult_records(adult_path) -> list[dict]:
    return list(iter_adult_records(adult_path))


def _topic(name: str) -> str:
    return f"replay.{name}.{uuid.uuid4().hex[:8]}"


def test_replay_adult_exact_count_deterministic_ids_and_values(broker, adult_records) -> None:
    topic = _topic("adult")
    records = adult_records[:4000]
    stats = replay_records(records, topic, broker.bootstrap_servers, rate=0, partitions=3)
    assert stats.records_sent == stats.records_acked == 4000 and stats.errors == 0
    assert stats.partitions == 3 and sum(stats.partition_counts.values()) == 4000
    assert len(stats.partition_counts) == 3  # keys spread over every partition
    assert stats.first_id == "adult-00000" and stats.last_id == "adult-03999"
    print(f"\nreplay 4,000 ADULT records, max rate: {stats.rate_achieved:,.0f} rec/s")

    got = read_topic(broker.bootstrap_servers, topic)  # until every partition's position reaches highwater
    assert len(got) == 4000  # exactly: nothing lost, nothing duplicated
    keys = [k.decode() for _, _, k, _ in got]
    assert len(set(keys)) == 4000 and set(keys) == {f"adult-{i:05d}" for i in range(4000)}
    by_id = {r["id"]: r for r in records}
    for _, _, key, value in got:
        doc = json.loads(value)
        assert doc == by_id[key.decode()]  # value = the record itself, one JSON object per message
    per_part = {p: sum(1 for q, *_ in got if q == p) for p in range(3)}
    assert per_part == stats.partition_counts
    # the same key always lands on the same partition (default murmur2 partitioner): replaying again is stable
    again = _topic("adult-again")
    replay_records(records[:500], again, broker.bootstrap_servers, partitions=3)
    first = {k: p for p, _, k, _ in got}
    assert all(first[k] == p for p, _, k, _ in read_topic(broker.bootstrap_servers, again, expected=500))


def test_replay_rate_control_is_honoured(broker, adult_records) -> None:
    topic = _topic("rate")
    rate, n = 5000.0, 2500
    stats = replay_records(adult_records[:n], topic, broker.bootstrap_servers, rate=rate)
    assert stats.records_acked == n
    # record n-1 is due at (n-1)/rate = 0.4998 s: the replay cannot be faster than the schedule allows
    assert stats.seconds >= (n - 1) / rate - 0.005
    # loose band on the slow side (shared CI machine; includes the final flush)
    assert 0.6 * rate <= stats.rate_achieved <= 1.02 * rate, stats.summary()
    print(f"\nreplay at target {rate:,.0f} rec/s: achieved {stats.rate_achieved:,.0f} rec/s")


def test_loop_and_shuffle_are_deterministic_with_a_seed(broker, adult_records) -> None:
    records = adult_records[:300]
    orders = []
    for seed in (11, 11, 12):
        topic = _topic("shuffle")
        stats = replay_records(records, topic, broker.bootstrap_servers, loop=2, shuffle=True, seed=seed,
                               partitions=1)
        assert stats.records_acked == 600 and stats.passes == 2 and stats.shuffle_seed == seed
        got = read_topic(broker.bootstrap_servers, topic, expected=600)
        orders.append([k.decode() for _, _, k, _ in sorted(got, key=lambda t: t[1])])  # one partition: offset order
    same_a, same_b, other = orders
    assert same_a == same_b  # same seed, same order
    assert same_a != other  # another seed, another order
    base = [r["id"] for r in records]
    assert same_a[:300] != base  # actually shuffled
    assert sorted(same_a[:300]) == sorted(base)  # pass 0: the original ids, each once
    assert sorted(same_a[300:]) == sorted(f"{i}#1" for i in base)  # pass 1: suffixed ids, each once
    assert len(set(same_a)) == 600


def test_ensure_topic_keeps_an_existing_topic(broker) -> None:
    topic = _topic("exists")
    assert ensure_topic(broker.bootstrap_servers, topic, 2) == 2
    assert ensure_topic(broker.bootstrap_servers, topic, 5) == 2  # used as it is (warning logged)
    with pytest.raises(ValueError, match="partitions"):
        ensure_topic(broker.bootstrap_servers, topic, 0)


def test_cli_kafka_replays_and_prints_the_rate(broker, adult_path) -> None:
    topic = _topic("cli")
    proc = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--adult", str(adult_path),
                           "--limit", "700", "--topic", topic, "--bootstrap-servers", broker.bootstrap_servers,
                           "--partitions", "2", "--rate", "0", "--no-progress"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "replayed 700 records" in proc.stdout and "rec/s achieved" in proc.stdout and "2 partitions" in proc.stdout
    got = read_topic(broker.bootstrap_servers, topic, expected=700)
    assert sorted(k.decode() for _, _, k, _ in got) == [f"adult-{i:05d}" for i in range(700)]
