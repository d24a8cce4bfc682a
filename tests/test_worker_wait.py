"""The loop's waits for busy pipeline workers (``workers.wait_for_results``): they keep doing the loop's step 2
(``idle``: outputs whose ledger entries were acknowledged) while they wait, and end on a result, a stop or their
timeout."""

from __future__ import annotations

import multiprocessing as mp

from stream_anon.service.workers import wait_for_results


def test_the_wait_keeps_sending_acknowledged_outputs_until_the_result_comes() -> None:
    read, write = mp.Pipe(duplex=False)
    calls = []

    def idle() -> bool:  # outputs wait for their ledger entries: the wait comes back every slice
        calls.append(len(calls))
        if len(calls) == 5:
            write.send("result")  # the worker finishes while the loop waits
        return True

    assert wait_for_results([read], idle=idle, stop=lambda: False)
    assert len(calls) == 5  # step 2 ran on every slice of the wait, and the wait ended at the result
    assert read.recv() == "result"


def test_a_result_on_any_of_the_workers_ends_the_wait() -> None:
    pipes = [mp.Pipe(duplex=False) for _ in range(3)]
    pipes[2][1].send("result")
    assert wait_for_results([r for r, _ in pipes])


def test_a_stop_ends_the_wait_without_a_result() -> None:
    read, _write = mp.Pipe(duplex=False)
    stops = []

    def stop() -> bool:
        stops.append(1)
        return len(stops) == 3

    assert not wait_for_results([read], idle=lambda: False, stop=stop)
    assert len(stops) == 3


def test_the_wait_ends_at_its_timeout_without_a_result() -> None:
    read, _write = mp.Pipe(duplex=False)
    calls = []

    def idle() -> bool:
        calls.append(1)
        return True

    assert not wait_for_results([read], timeout_s=0.05, idle=idle)
    assert calls  # it did step 2 while it waited


def test_without_idle_the_wait_only_looks_for_a_stop() -> None:
    read, write = mp.Pipe(duplex=False)
    write.send("ready")
    assert wait_for_results([read])
