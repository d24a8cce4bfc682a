"""Ctrl-C and SIGTERM during a replay: stop cleanly and say how far it got.

The command-line tools install :class:`InterruptGuard` for SIGINT and SIGTERM; its handler raises
:class:`ReplayInterrupted` in the main thread.  The replay functions catch it, deliver what they already
handed over (bounded), and return their statistics with ``interrupted`` set, so the command prints one line
(records sent, acknowledged) and exits with ``128 + signal number`` (130 for SIGINT, 143 for SIGTERM), no
traceback.

While ``deferring`` is set (around one producer ``send`` or one datagram), a first signal is only recorded;
the replay raises right after that step (:meth:`InterruptGuard.check`), so a record is never counted half
sent.  A second signal raises at once (the way out of a step that blocks).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ReplayInterrupted(BaseException):
    """A replay was stopped by a signal.  A ``BaseException`` (like ``KeyboardInterrupt``), so that no
    ``except Exception`` inside a client library swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = int(signum)
        super().__init__(self.signal_name)

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + the signal number."""
        return 128 + self.signum


class InterruptGuard:
    """SIGINT/SIGTERM handlers raising :class:`ReplayInterrupted` (a context manager; main thread only).

    ``deferring``: while True, the first signal is kept in ``pending`` and :meth:`check` raises it.
    """

    def __init__(self) -> None:
        self.deferring = False
        self.pending: int | None = None
        self._previous: dict[int, Any] = {}

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.deferring and self.pending is None:
            self.pending = signum
            return
        raise ReplayInterrupted(signum)

    def check(self) -> None:
        """Raise the signal that arrived while deferring, if any."""
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise ReplayInterrupted(signum)

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for s in HANDLED_SIGNALS:
                self._previous[s] = signal.signal(s, self.handle)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for s, previous in self._previous.items():
            signal.signal(s, previous)
        self._previous.clear()
