"""The embedded broker across restarts, stalls and signals (real Tansu, s3rver and child processes).

- Durable (S3) storage: a restart (``kill -9`` or SIGTERM) keeps topics, topic ids, partition counts, records at
  their offsets and committed group offsets; records produced right after the restart are appended, never
  written over the old ones.
- ``kill -9`` of the broker and of a producer mid-stream, then a fresh producer re-sends what was not
  acknowledged: nothing acknowledged is lost, every record is there.
- Memory storage: a restart loses everything and a client's metadata request recreates a topic with Tansu's
  default 4 partitions under a new topic id (the signals a client can detect it by).
- Process isolation: SIGINT to the process group of the process that started the broker does not reach the
  broker; ``kill -9`` of that process takes the broker down with it (no orphan).
- ``freeze()``/``thaw()`` stall and resume the broker; ``stop()`` ends a frozen broker cleanly (SIGTERM).
- No node or s3rver: a clear error, never a skip.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from durable_broker import (
    child_env,
    committed_offsets,
    create_topic,
    pid_alive,
    produce,
    read_acks,
    read_topic,
    topic_info,
)
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError, RequestTimedOutError
from kafka.structs import OffsetAndMetadata
from waiting import wait_for

from stream_anon.kafka_io.broker import (
    S3RVER_ENV,
    EmbeddedBroker,
    S3rverNotFoundError,
    node_binary,
    process_stopped,
    stat_state,
    thread_states,
)

TOPIC, GROUP, PARTITIONS = "durable", "durable-group", 2
SUPPORT = Path(__file__).with_name("durable_broker.py")


def commit(bootstrap_servers: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for GROUP without joining it (a standalone commit, as an assigned consumer does)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=GROUP, enable_auto_commit=False)
    try:
        consumer.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
    finally:
        consumer.close()


def read_line(proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """One line of the child's stdout, or fail after ``timeout_s``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"child printed nothing in {timeout_s} s (exit code {proc.poll()})"
    return proc.stdout.readline()


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("hard", [True, False], ids=["kill-9", "sigterm"])
def test_durable_restart_keeps_topics_records_and_committed_offsets(durable_broker: EmbeddedBroker,
                                                                     hard: bool) -> None:
    bs = durable_broker.bootstrap_servers
    create_topic(bs, TOPIC, PARTITIONS)
    before = produce(bs, TOPIC, [b"a%d" % i for i in range(500)])
    per_partition = Counter(p for p, _o, _v in before)
    assert set(per_partition) == {0, 1}
    committed = {p: n // 2 for p, n in per_partition.items()}
    commit(bs, committed)
    info = topic_info(bs, TOPIC)
    assert info is not None and info[1] == PARTITIONS
    assert committed_offsets(bs, GROUP, TOPIC) == committed

    durable_broker.restart(hard=hard)

    # produce first, before any fetch or offset request has loaded the partitions' state
    after = produce(bs, TOPIC, [b"b%d" % i for i in range(100)])
    assert all(o >= per_partition[p] for p, o, _v in after), "records written over the old ones"
    assert topic_info(bs, TOPIC) == info  # same topic id, same partition count
    assert sorted(read_topic(bs, TOPIC, PARTITIONS)) == sorted(before + after)
    assert committed_offsets(bs, GROUP, TOPIC) == committed

    # a group member resumes from the committed offsets
    consumer = KafkaConsumer(TOPIC, bootstrap_servers=bs, group_id=GROUP, enable_auto_commit=False,
                             session_timeout_ms=6000, heartbeat_interval_ms=1000, fetch_max_wait_ms=100)
    try:
        got: list[tuple[int, int]] = []
        remaining = len(before) + len(after) - sum(committed.values())

        def poll() -> bool:
            got.extend((tp.partition, r.offset) for tp, recs in consumer.poll(200).items() for r in recs)
            return len(got) >= remaining

        wait_for(poll, 60, f"{remaining} records after the committed offsets")
    finally:
        consumer.close()
    first = {p: min(o for q, o in got if q == p) for p in range(PARTITIONS)}
    assert first == committed
    assert len(got) == len(set(got)) == remaining


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_kill_9_mid_produce_loses_nothing_acknowledged(durable_broker: EmbeddedBroker, tmp_path: Path) -> None:
    bs = durable_broker.bootstrap_servers
    create_topic(bs, TOPIC, PARTITIONS)
    total, acks_file = 30_000, tmp_path / "acks.txt"
    child = subprocess.Popen([sys.executable, str(SUPPORT), "produce", bs, TOPIC, str(total), str(acks_file)],
                             env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(read_acks(acks_file)) >= 3000, 60, "3,000 acknowledged records")
        durable_broker.kill()  # the broker dies with produce requests in flight ...
        child.kill()  # ... and so does the producer (its retries would go to the restarted broker)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
    acked = read_acks(acks_file)
    assert len(acked) < total, "the producer finished before the kill: nothing was in flight"

    durable_broker.restart()
    resent = produce(bs, TOPIC, [b"%d" % i for i in range(total) if b"%d" % i not in acked])

    records = read_topic(bs, TOPIC, PARTITIONS)
    positions = {(p, o): v for p, o, v in records}
    lost = [v for v, (p, o) in acked.items() if positions.get((p, o)) != v]
    assert not lost, f"{len(lost)} acknowledged records lost or moved, e.g. {lost[:5]}"
    counts = Counter(v for _p, _o, v in records)
    assert set(counts) == {b"%d" % i for i in range(total)}
    assert all(counts[v] == 1 for v in acked)
    # a duplicate only where an unacknowledged record was stored before the kill and re-sent after it
    assert all(n <= 2 for n in counts.values())
    assert len(resent) == total - len(acked)


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_memory_restart_loses_everything_and_auto_creation_changes_the_topic(tmp_path: Path) -> None:
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        bs = broker.bootstrap_servers
        create_topic(bs, TOPIC, PARTITIONS)
        produce(bs, TOPIC, [b"m%d" % i for i in range(100)])
        commit(bs, {0: 10, 1: 10})
        info = topic_info(bs, TOPIC)
        assert info is not None

        broker.restart()

        assert topic_info(bs, TOPIC) is None
        assert committed_offsets(bs, GROUP, TOPIC) == {}
        strict = KafkaProducer(bootstrap_servers=bs, max_block_ms=1500)
        # kafka-python 3.0.12 never passes allow_auto_create_topics=False on to its metadata (docs/tansu.md)
        strict._metadata.config["allow_auto_create_topics"] = False
        try:
            with pytest.raises(KafkaTimeoutError):
                strict.send(TOPIC, b"x")
        finally:
            strict.close(timeout=5)
        assert topic_info(bs, TOPIC) is None  # a client that does not auto-create leaves it missing
        produce(bs, TOPIC, [b"n0"])  # kafka-python's default: auto-create on its metadata request
        recreated = topic_info(bs, TOPIC)
        assert recreated is not None
        assert recreated[0] != info[0]  # a new topic id
        assert recreated[1] == 4  # Tansu's AUTO_CREATE_NUM_PARTITIONS, not the 2 it had


def start_starter() -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    """The child that starts a broker, in its own session so that signals to its group never reach ours."""
    child = subprocess.Popen([sys.executable, str(SUPPORT), "starter"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=child_env(), start_new_session=True)
    return child, json.loads(read_line(child, 60))


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_sigint_to_the_starters_process_group_does_not_reach_the_broker() -> None:
    child, info = start_starter()
    broker_pid, sleeper_pid = int(str(info["broker_pid"])), int(str(info["sleeper_pid"]))
    try:
        os.killpg(child.pid, signal.SIGINT)  # Ctrl-C in the child's terminal: its whole process group
        assert read_line(child, 30).strip() == b"interrupted"
        wait_for(lambda: not pid_alive(sleeper_pid), 30, "the control process in the group to die of SIGINT")
        assert pid_alive(broker_pid)
        admin = KafkaAdminClient(bootstrap_servers=str(info["bootstrap_servers"]), request_timeout_ms=5000)
        admin.list_topics()  # and it still answers
        admin.close()
        assert child.stdin is not None
        child.stdin.write(b"stop\n")
        child.stdin.flush()
        assert child.wait(timeout=30) == 0
        assert not pid_alive(broker_pid)  # stopped by its owner
    finally:
        if child.poll() is None:
            child.kill()
        for pid in (broker_pid, sleeper_pid):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_kill_9_of_the_starter_takes_the_broker_down() -> None:
    child, info = start_starter()
    broker_pid, sleeper_pid = int(str(info["broker_pid"])), int(str(info["sleeper_pid"]))
    try:
        child.kill()
        child.wait()
        wait_for(lambda: not pid_alive(broker_pid), 30, "the broker to exit after its starter died")
    finally:
        for pid in (broker_pid, sleeper_pid):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_freeze_stalls_the_broker_and_thaw_resumes_it(tmp_path: Path) -> None:
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as broker:
        admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=1500)
        try:
            admin.list_topics()
            pid = broker.pid
            assert pid is not None and "T" not in thread_states(pid)
            with broker.frozen_for():
                assert broker.frozen
                states = thread_states(pid)  # freeze() returned: every thread is stopped, none can answer
                assert states and set(states) == {"T"}, states
                with pytest.raises(RequestTimedOutError):
                    admin.list_topics()
            assert not broker.frozen
            assert "T" not in thread_states(pid)  # SIGCONT resumes every thread at once

            def answers() -> bool:
                try:
                    admin.list_topics()
                    return True
                except KafkaError:
                    return False

            wait_for(answers, 30, "the thawed broker to answer")
        finally:
            admin.close()
        broker.freeze()
        process = broker.process
        assert process is not None
        broker.stop()
        assert process.returncode == 0  # Tansu exits cleanly on SIGTERM; the SIGKILL fallback would give -9


def test_durable_broker_without_s3rver_or_node_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(S3RVER_ENV, str(tmp_path / "no-such-s3rver"))
    with pytest.raises(S3rverNotFoundError, match="npm install --prefix .cache/npm s3rver@3.7.1"):
        EmbeddedBroker(storage="s3", data_dir=tmp_path / "s3").start()
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(S3rverNotFoundError, match="node not found"):
        node_binary()


def test_the_stopped_state_is_read_after_the_command_name_whatever_it_holds() -> None:
    """``freeze()`` waits for state ``T`` of every thread: the state is the field after the last ``)`` of
    ``/proc/<pid>/task/<tid>/stat`` (the command name may hold spaces and parentheses)."""
    assert stat_state("4217 (tansu-v0.6.0) T 4216 4217 4217 0 -1 4194560 1 0") == "T"
    assert stat_state("12 (a (b) c) S 1 12 12 0 -1") == "S"
    assert stat_state("12 ()) R 1 12") == "R"
    me = os.getpid()
    states = thread_states(me)
    assert states and "T" not in states  # this process runs (R) or sleeps (S), it is not stopped
    assert not process_stopped(me)
    assert thread_states(2**22 + 1) == [] and not process_stopped(2**22 + 1)  # above pid_max: no such process
