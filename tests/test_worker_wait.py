"""The loop's wait for a busy pipeline worker (``workers.wait_for_result``): it keeps doing the loop's step 2
(``idle``: outputs whose ledger entries were acknowledged) while it waits, and ends on a result or a stop."""

from __future__ import annotations

import multiprocessing as mp

from stream_anon.service.workers import wait_for_result


def test_the_wait_keeps_sending_acknowledged_outputs_until_the_result_comes() -> None:
    read, write = mp.Pipe(duplex=False)
    calls = []

    def idle() -> bool:  # outputs wait for their ledger entries: the wait comes back every slice
        calls.append(len(calls))
        if len(calls) == 5:
            write.send("result")  # the worker finishes while the loop waits
        return True

    assert wait_for_result(read, idle=idle, stop=lambda: False)
    assert len(calls) == 5  # step 2 ran on every slice of the wait, and the wait ended at the result
    assert read.recv() == "result"


def test_a_stop_ends_the_wait_without_a_result() -> None:
    read, _write = mp.Pipe(duplex=False)
    stops = []

    def stop() -> bool:
        stops.append(1)
        return len(stops) == 3

    assert not wait_for_result(read, idle=lambda: False, stop=stop)
    assert len(stops) == 3


def test_without_idle_the_wait_only_looks_for_a_stop() -> None:
    read, write = mp.Pipe(duplex=False)
    write.send("ready")
    assert wait_for_result(read)
