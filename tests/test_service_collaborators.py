"""The main path's collaborators that need no broker: the producer-failure policy (pure), the partition table, and
the group poller over an in-memory consumer (unreadable records, failing polls, rebalance callbacks, commits).

The ledger outbox, the committer and partition recovery are driven by the crash-at-every-point test against a
simulated broker (``tests/test_ledger.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import TopicPartition
from kafka.errors import CorruptRecordError, FencedInstanceIdError, KafkaError
from kafka.structs import OffsetAndMetadata

from stream_anon.kafka_io.errors import CommitFailedError, ConsumerFailedError
from stream_anon.kafka_io.poller import FailingPolls, GroupPoller
from stream_anon.service.failure_policy import PRODUCER_RECREATIONS_MAX, ProducerFailurePolicy
from stream_anon.service.ledger import PartitionOutbox, RecoveryPlan
from stream_anon.service.partitions import OwnedPartition, PartitionTable, SeekBack

TOPIC = "in.raw"


# ---------------------------------------------------------------------------------------------- failure policy
def test_more_than_the_maximum_failures_in_a_row_while_the_broker_answers_exhaust_the_policy() -> None:
    policy = ProducerFailurePolicy()
    for i in range(PRODUCER_RECREATIONS_MAX):
        assert policy.failed(progress=0, broker_answered=True) == i + 1
        assert not policy.exhausted
    policy.failed(progress=0, broker_answered=True)
    assert policy.exhausted and policy.in_row == PRODUCER_RECREATIONS_MAX + 1


def test_progress_after_a_failure_starts_a_new_row() -> None:
    policy = ProducerFailurePolicy(max_failures=2)
    policy.failed(progress=5, broker_answered=True)
    policy.failed(progress=5, broker_answered=True)
    assert policy.failed(progress=6, broker_answered=True) == 1  # a commit made progress meanwhile
    assert not policy.exhausted
    policy.failed(progress=6, broker_answered=True)
    policy.failed(progress=6, broker_answered=True)
    assert policy.exhausted


def test_failures_while_the_broker_is_silent_do_not_count_and_slow_ones_do() -> None:
    """Issue 18: failures 62 s apart (a producer stuck for the 60 s bound, again and again) never fitted the old
    180 s window: the service recreated its producers every minute forever.  The row has no time window."""
    policy = ProducerFailurePolicy(max_failures=1)
    for _ in range(5):
        assert policy.failed(progress=0, broker_answered=False) == 0  # an outage is not the client's
    assert policy.failed(progress=0, broker_answered=True) == 1
    assert not policy.exhausted
    assert policy.failed(progress=0, broker_answered=True) == 2 and policy.exhausted  # however long after


# ---------------------------------------------------------------------------------------------- partition table
def _owned(p: int) -> OwnedPartition:
    return OwnedPartition(p, PartitionOutbox(TOPIC, p, incarnation="x"), watermark=0, next_offset=0)


def _plan(p: int) -> RecoveryPlan:
    return RecoveryPlan(TOPIC, p, start_offset=3, accounted=frozenset(), horizon=2, checkpoint=None, pending=(),
                        scan_from=None)


def test_the_table_forgets_a_partition_in_one_call() -> None:
    table = PartitionTable()
    a, b = _owned(0), _owned(1)
    table.add(a)
    table.add(b)
    table.seeking[2] = SeekBack(_plan(2), 3)
    a.committed, a.dirty = 7, True
    assert table.committed() == {0: 7} and table.partitions() == [0, 1] and 0 in table
    assert table.drop([0, 2, 5]) == [a]
    assert 0 not in table and 2 not in table.seeking and table.current(b) and not table.current(a)
    table.add(_owned(1))  # recovered anew: the old object is no longer current
    assert not table.current(b)
    table.seeking[4] = SeekBack(_plan(4), 3)
    assert table.clear() == [1] and not table.owned and not table.seeking


def test_a_checkpoint_is_due_when_entries_were_written_or_the_watermark_moved() -> None:
    o = _owned(0)
    assert o.needs_checkpoint()  # none yet
    o.outbox.checkpoint(0)
    assert not o.needs_checkpoint()
    o.dirty = True
    assert o.needs_checkpoint()
    o.dirty = False
    o.report(watermark=4, next_offset=9, buffered=5, open_clusters=1, horizon=8)
    assert o.needs_checkpoint() and (o.watermark, o.next_offset, o.horizon) == (4, 9, 8)


# ---------------------------------------------------------------------------------------------- group poller
class Record:
    def __init__(self, offset: int) -> None:
        self.offset, self.key, self.value, self.headers, self.timestamp = offset, None, b"{}", [], None


class Consumer:
    """The kafka-python consumer calls the poller makes; ``poll`` answers from ``script`` (a value is returned, an
    exception raised)."""

    def __init__(self, script: list[Any], positions: dict[int, int] | None = None) -> None:
        self.script = script
        self.positions = positions or {0: 0, 1: 0}
        self.seeks: list[tuple[TopicPartition, int]] = []
        self.commits: list[Any] = []
        self.listener: Any = None

    def subscribe(self, topics: list[str], listener: Any = None) -> None:
        self.listener = listener

    def poll(self, timeout_ms: int, max_records: int) -> Any:
        item = self.script.pop(0)
        if callable(item):
            item()
            return {}
        if isinstance(item, Exception):
            raise item
        return item

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in self.positions}

    def position(self, tp: TopicPartition) -> int:
        return self.positions[tp.partition]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append((tp, offset))

    def commit(self, offsets: Any, timeout_ms: int | None = None) -> None:
        if offsets.get("fail"):
            raise KafkaError("no")
        self.commits.append(offsets)

    def commit_async(self, offsets: Any, callback: Any) -> None:
        callback(offsets, KafkaError("rebalanced") if TopicPartition(TOPIC, 9) in offsets else None)


class Reader:
    def __init__(self, unreadable: set[tuple[int, int]]) -> None:
        self.unreadable = unreadable
        self.closed = False

    def first_readable(self, topic: str, partition: int, offset: int) -> bool:
        return (partition, offset) not in self.unreadable

    def close(self) -> None:
        self.closed = True


def test_the_poller_returns_its_topics_records_by_partition() -> None:
    c = Consumer([{TopicPartition(TOPIC, 1): [Record(3)], TopicPartition("other", 0): [Record(1)]}])
    poller = GroupPoller(c, TOPIC, max_records=10, reader=lambda: Reader(set()))  # type: ignore[arg-type]
    batch = poller.poll(0, lambda p, o, r, e: True)
    assert list(batch) == [1] and batch[1][0].offset == 3


def test_an_unreadable_record_is_handed_to_the_caller_and_skipped() -> None:
    reader = Reader({(1, 7)})
    c = Consumer([CorruptRecordError("bad header key"), CorruptRecordError("elsewhere")], {0: 4, 1: 7})
    poller = GroupPoller(c, TOPIC, max_records=10, reader=lambda: reader)  # type: ignore[arg-type]
    taken: list[tuple[int, int, str]] = []
    assert poller.poll(0, lambda p, o, r, e: taken.append((p, o, e)) is None) == {}
    assert [(p, o) for p, o, _ in taken] == [(1, 7)] and taken[0][2].endswith("CorruptRecordError: bad header key")
    assert c.seeks == [(TopicPartition(TOPIC, 1), 8)]  # past it
    assert reader.closed
    reader.unreadable.clear()  # nothing unreadable found: the error is raised
    with pytest.raises(CorruptRecordError):
        poller.poll(0, lambda p, o, r, e: True)


def test_a_record_the_caller_does_not_take_is_not_skipped() -> None:
    c = Consumer([CorruptRecordError("x")], {0: 2})
    poller = GroupPoller(c, TOPIC, max_records=10, reader=lambda: Reader({(0, 2)}))  # type: ignore[arg-type]
    poller.poll(0, lambda p, o, r, e: False)
    assert c.seeks == []


def test_failing_polls_end_the_run_only_while_the_broker_answers() -> None:
    fenced = [FencedInstanceIdError("fenced") for _ in range(3)]
    answers = [False]
    c = Consumer([*fenced, {}])
    poller = GroupPoller(c, TOPIC, max_records=10, reader=lambda: Reader(set()),  # type: ignore[arg-type]
                         failures=FailingPolls(0.0, lambda: answers[0], pause_s=0.0))
    assert poller.poll(0, lambda p, o, r, e: True) == {}  # first failure: within the bound
    assert poller.poll(0, lambda p, o, r, e: True) == {}  # over the bound, but the broker does not answer
    answers[0] = True
    with pytest.raises(ConsumerFailedError, match="polls failed for"):
        poller.poll(0, lambda p, o, r, e: True)
    assert poller.poll(0, lambda p, o, r, e: True) == {} and poller.failures is not None
    assert poller.failures.failing_since is None  # a good poll ends the row
    no_policy = GroupPoller(Consumer([FencedInstanceIdError("f")]), TOPIC, max_records=1,  # type: ignore[arg-type]
                            reader=lambda: Reader(set()))
    with pytest.raises(FencedInstanceIdError):
        no_policy.poll(0, lambda p, o, r, e: True)


def test_what_a_rebalance_callback_raises_is_raised_after_the_poll() -> None:
    c = Consumer([])
    poller = GroupPoller(c, TOPIC, max_records=10, reader=lambda: Reader(set()))  # type: ignore[arg-type]
    revoked: list[list[int]] = []

    def on_revoked(partitions: list[int]) -> None:
        revoked.append(partitions)
        raise RuntimeError("revoke failed")

    poller.subscribe(on_assigned=lambda ps: None, on_revoked=on_revoked)
    c.script.append(lambda: c.listener.on_partitions_revoked({TopicPartition(TOPIC, 1), TopicPartition("x", 0)}))
    with pytest.raises(RuntimeError, match="revoke failed"):
        poller.poll(0, lambda p, o, r, e: True)
    assert revoked == [[1]]


def test_commits_speak_partitions_and_offsets() -> None:
    c = Consumer([])
    poller = GroupPoller(c, TOPIC, max_records=10, reader=lambda: Reader(set()))  # type: ignore[arg-type]
    poller.commit_sync({0: 5})
    assert c.commits == [{TopicPartition(TOPIC, 0): OffsetAndMetadata(5, None, -1)}]
    answers: list[tuple[dict[int, int], Exception | None]] = []
    poller.commit_async({0: 6}, lambda offsets, error: answers.append((offsets, error)))
    poller.commit_async({9: 1}, lambda offsets, error: answers.append((offsets, error)))
    assert answers[0] == ({0: 6}, None) and answers[1][0] == {9: 1} and isinstance(answers[1][1], KafkaError)
    c.commit = lambda offsets, timeout_ms=None: (_ for _ in ()).throw(KafkaError("gone"))  # type: ignore[method-assign]
    with pytest.raises(CommitFailedError):
        poller.commit_sync({0: 7}, timeout_s=1.0)
