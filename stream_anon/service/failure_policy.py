"""When creating the producers anew stops helping: the main path's producer-failure policy (pure: the caller gives
the time, the progress and whether the broker answered).

A producer that cannot deliver (``ProducerFatalError``: a fatal client error, an acknowledgement without an offset,
nothing acknowledged for ``service.producer_recovery_seconds``) is closed and created anew, and every owned
partition recovers from the ledger.  That is tried again and again, except: more than ``max_failures`` failures
**in a row** within ``window_s`` while the broker answers end the run (exit code 1: a supervisor starts a fresh
process).  A failure after which the service committed progress starts a new row (the recreation helped: broker
restarts, each of which may cost a recreation, are then never counted against the service); a failure while the
broker does not answer is not counted (an outage is not the client's failure).
"""

from __future__ import annotations

from collections import deque

PRODUCER_RECREATIONS_MAX = 3
"""Producer failures (while the broker answers) tolerated in a row within the window; one more: exit code 1."""
PRODUCER_FAILURE_WINDOW = 3.0
"""The window, in multiples of ``service.producer_recovery_seconds`` (at least 60 s: :func:`failure_window`)."""


def failure_window(producer_recovery_seconds: float) -> float:
    """The window of the row: ``PRODUCER_FAILURE_WINDOW`` x ``service.producer_recovery_seconds``, at least 60 s."""
    return max(60.0, PRODUCER_FAILURE_WINDOW * producer_recovery_seconds)


class ProducerFailurePolicy:
    """Counts producer failures in a row (see the module docstring).

    Call :meth:`failed` at each failure with the time (monotonic seconds), the progress made so far (e.g. the
    number of commits that moved a watermark: any change since the previous failure starts a new row) and whether
    the broker answered; :attr:`exhausted` then says whether to give up.
    """

    def __init__(self, window_s: float, max_failures: int = PRODUCER_RECREATIONS_MAX, progress: int = 0) -> None:
        self.window_s = window_s
        self.max_failures = max_failures
        self._row: deque[float] = deque()  # times of the counted failures of the current row, in the window
        self._progress = progress

    def failed(self, *, now: float, progress: int, broker_answered: bool) -> int:
        """Record one failure; returns the failures of the current row within the window."""
        if progress != self._progress:  # progress since the last failure: a new row
            self._row.clear()
        self._progress = progress
        while self._row and now - self._row[0] > self.window_s:
            self._row.popleft()
        if broker_answered:
            self._row.append(now)
        return len(self._row)

    @property
    def in_row(self) -> int:
        return len(self._row)

    @property
    def exhausted(self) -> bool:
        """More than ``max_failures`` failures in the row: creating the producers anew did not help."""
        return len(self._row) > self.max_failures
