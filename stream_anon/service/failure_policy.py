"""When creating the producers anew stops helping: the main path's producer-failure policy (pure: the caller gives
the progress and whether the broker answered).

A producer that cannot deliver (``ProducerFatalError``: a fatal client error, an acknowledgement without an offset,
nothing acknowledged for ``service.producer_recovery_seconds``) is closed and created anew, and every owned
partition recovers from the ledger.  That is tried again and again, except: more than ``max_failures`` failures
**in a row** while the broker answers end the run (exit code 1: a supervisor starts a fresh process).  A failure
after which the service committed progress starts a new row (the recreation helped: broker restarts, each of which
may cost a recreation, are then never counted against the service); a failure while the broker does not answer is
not counted (an outage is not the client's failure).

The row has no time window: failures that come slowly count as much as fast ones.  (Issue 18: with a window of
3 x ``service.producer_recovery_seconds``, failures 62 s apart -- a producer stuck for the 60 s bound, recreated,
stuck again -- never made four within 180 s, and the service recreated its producers every minute forever.)  A
service with nothing to do sends nothing, so it never fails; one with work commits progress when a recreation
helps.
"""

from __future__ import annotations

PRODUCER_RECREATIONS_MAX = 3
"""Producer failures (while the broker answers, with no progress between them) tolerated in a row; one more: exit
code 1."""


class ProducerFailurePolicy:
    """Counts producer failures in a row (see the module docstring).

    Call :meth:`failed` at each failure with the progress made so far (e.g. the number of commits that moved a
    watermark: any change since the previous failure starts a new row) and whether the broker answered;
    :attr:`exhausted` then says whether to give up.
    """

    def __init__(self, max_failures: int = PRODUCER_RECREATIONS_MAX, progress: int = 0) -> None:
        self.max_failures = max_failures
        self._row = 0  # counted failures of the current row
        self._progress = progress

    def failed(self, *, progress: int, broker_answered: bool) -> int:
        """Record one failure; returns the failures of the current row."""
        if progress != self._progress:  # progress since the last failure: a new row
            self._row = 0
        self._progress = progress
        if broker_answered:
            self._row += 1
        return self._row

    @property
    def in_row(self) -> int:
        return self._row

    @property
    def exhausted(self) -> bool:
        """More than ``max_failures`` failures in the row: creating the producers anew did not help."""
        return self._row > self.max_failures
