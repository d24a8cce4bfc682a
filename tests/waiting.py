"""The one way tests wait: poll until something holds or a deadline passes, then fail naming what was awaited.

Tests run on a loaded two-core machine, so they never sleep a fixed time and never assert a wall-clock bound:
they wait on a condition with a generous deadline.  :func:`wait_for` polls a predicate; :class:`Deadline` is for
loops that do their own work between checks (read a topic, accumulate records).  A timeout raises
``AssertionError`` with what was awaited, the seconds waited, the last value observed (or the last exception, when
``retry_on`` lets the predicate fail while it is not ready) and, when given, the end of ``context()`` (a
log).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
CONTEXT_CHARS = 4000  # of context() in a timeout's message: a log's tail
_NOTHING = object()


class Deadline:
    """A deadline ``seconds`` from now for a wait on ``what``; :meth:`check` fails once it has passed."""

    def __init__(self, seconds: float, what: str, *, context: Callable[[], str] | None = None) -> None:
        self.seconds = seconds
        self.what = what
        self.context = context
        self.start = time.monotonic()
        self.end = self.start + seconds

    @property
    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.end - time.monotonic())

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def expired(self) -> bool:
        return time.monotonic() >= self.end

    def check(self, last: object = _NOTHING) -> None:
        """Raise ``AssertionError`` (what, seconds, ``last`` observed value, context) if the deadline passed."""
        if self.expired():
            raise AssertionError(self.message(last))

    def message(self, last: object = _NOTHING) -> str:
        text = f"timed out after {self.seconds:g} s waiting for {self.what}"
        if last is not _NOTHING:
            text += f" (last observed: {last!r})"
        if self.context is not None:
            text += f":\n{self.context()[-CONTEXT_CHARS:]}"
        return text


def wait_for(predicate: Callable[[], T], timeout: float, what: str, *, interval: float = 0.1,
             alive: Callable[[], object] | None = None, context: Callable[[], str] | None = None,
             retry_on: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value, and return that value.

    ``alive`` is called before each try: when it raises or returns ``False`` (what the test waits on has died:
    a service process exited, a thread ended), the test fails at once, not at the deadline.  Exceptions of the
    ``retry_on`` types from ``predicate`` count as "not yet".  After ``timeout`` seconds: ``AssertionError``
    naming ``what`` and the last value (or exception) observed, followed by the end of ``context()``.
    """
    deadline = Deadline(timeout, what, context=context)
    last: object = _NOTHING
    while True:
        if alive is not None and alive() is False:
            seen = "nothing yet" if last is _NOTHING else repr(last)
            raise AssertionError(f"gave up waiting for {what}: what it waits on is no longer alive (last "
                                 f"observed: {seen})"
                                 + (f":\n{context()[-CONTEXT_CHARS:]}" if context is not None else ""))
        try:
            value = predicate()
        except retry_on as e:
            last = e
        else:
            if value:
                return value
            last = value
        deadline.check(last)
        time.sleep(min(interval, max(deadline.remaining, 0.001)))
