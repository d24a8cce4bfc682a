"""How the loop hands records to the pipeline workers: a poll's records in chunks of ``WORKER_CHUNK_RECORDS``
(``MainLoop._submit``), and the results handed out one at a time as each chunk is processed
(``ProcessBackend.results``), so a chunk's ledger entries are written without waiting for the rest of the poll."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from stream_anon.config.settings import Config
from stream_anon.kafka_io.confluent_poller import Record
from stream_anon.service.loop import MainLoop
from stream_anon.service.partitions import PartitionTable
from stream_anon.service.wiring import with_release_secret
from stream_anon.service.workers import (
    WORKER_CHUNK_RECORDS,
    CreatePartition,
    ExpirePartition,
    ProcessBackend,
    ProcessBatch,
)


class _RecordingBackend:
    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def submit(self, work: Any) -> None:
        self.submitted.append(work)


def test_a_large_poll_goes_to_the_pipeline_in_chunks_in_offset_order() -> None:
    n = 2 * WORKER_CHUNK_RECORDS + 7
    recs = [Record(100 + i, b"k", b"{}", (), 1) for i in range(n)]
    backend = _RecordingBackend()
    table = PartitionTable()
    loop: Any = SimpleNamespace(table=table, backend=backend, _start_offset=lambda p, o: 100)
    assert MainLoop._submit(loop, 3, recs, 12.5)  # a new partition: recovered, starting at offset 100
    sizes = [len(w.messages) for w in backend.submitted]
    assert sizes == [WORKER_CHUNK_RECORDS, WORKER_CHUNK_RECORDS, 7]
    offsets = [m[0] for w in backend.submitted for m in w.messages]
    assert offsets == list(range(100, 100 + n))  # every record once, in order
    assert {(w.partition, w.now) for w in backend.submitted} == {(3, 12.5)}


@pytest.fixture
def backend() -> Iterator[ProcessBackend]:
    """One pipeline worker process with partition 0 created."""
    cfg, _ = with_release_secret(Config.load(env={}, overrides={"anonymization.seed": 1}))
    b = ProcessBackend(cfg, 1)
    try:
        b.create(CreatePartition(0, 0, (), 0, "test"))
        yield b
    finally:
        b.close()


@pytest.mark.integration  # starts a pipeline worker process
def test_results_come_one_at_a_time_and_what_is_not_taken_stays(backend: ProcessBackend) -> None:
    for start in (0, 2, 4):  # three chunks of two unreadable messages: each one dead-letters two records
        backend.submit(ProcessBatch(0, tuple((o, b"not json", None, (), 1, None) for o in (start, start + 1)),
                                    1.0))
    assert backend.pending == 3
    first = next(backend.results(wait_all=True))  # the caller stops after the first result
    assert first.next_offset == 2 and len(first.entries) == 2
    assert backend.pending == 2  # the other two were not taken: they come with the next call
    rest = list(backend.results(wait_all=True))
    assert [r.next_offset for r in rest] == [4, 6]
    assert backend.pending == 0


@pytest.mark.integration  # starts a pipeline worker process
def test_the_loop_can_wait_for_a_worker_that_processes_records_and_not_for_one_that_does_not(
        backend: ProcessBackend) -> None:
    assert backend.pending_records == 0
    assert not backend.wait(0.01)  # nothing processes records: no wait at all
    backend.submit(ExpirePartition(0, 1.0))  # work without records (the wall-clock bound)
    assert backend.pending == 1 and backend.pending_records == 0
    assert not backend.wait(0.01)  # the loop does not wait for it (its poll waits for input instead)
    backend.submit(ProcessBatch(0, ((0, b"not json", None, (), 1, None),), 1.0))
    assert backend.pending_records == 1
    assert backend.wait(60.0)  # a deadline, not an expectation: the result ends the wait
    assert [r.n_messages for r in backend.results(wait_all=True)] == [0, 1]
    assert backend.pending == 0 and backend.pending_records == 0
