"""A dependency-free progress bar on stderr: on a terminal one line redrawn in place (``\\r``) at most every
``interval_s``; into a file or a pipe a plain line at most every ``plain_interval_s`` (no ``\\r`` in logs)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class ProgressBar:
    """``[#####.....]  12,345/32,561  38%  25,010 rec/s`` on one stderr line; ``total=None`` shows count and rate."""

    def __init__(self, total: int | None, *, label: str = "", width: int = 30, interval_s: float = 0.2,
                 stream: TextIO | None = None, enabled: bool = True,
                 clock: Callable[[], float] = time.perf_counter, plain_interval_s: float = 10.0) -> None:
        self.total = total
        self.label = label
        self.width = width
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self.interval_s = interval_s if self.tty else plain_interval_s
        self.enabled = enabled
        self.clock = clock
        self.start = clock()
        self._last_draw = 0.0
        self.count = 0

    def update(self, count: int) -> None:
        self.count = count
        if not self.enabled:
            return
        now = self.clock()
        if now - self._last_draw >= self.interval_s:
            self._last_draw = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = max(now - self.start, 1e-9)
        rate = self.count / elapsed
        prefix = f"{self.label} " if self.label else ""
        if self.total:
            frac = min(self.count / self.total, 1.0)
            filled = int(frac * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            line = f"{prefix}[{bar}] {self.count:,}/{self.total:,} {frac:4.0%} {rate:,.0f} rec/s"
        else:
            line = f"{prefix}{self.count:,} records {rate:,.0f} rec/s"
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(self.clock())
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()


class RateLimiter:
    """Pace events at ``rate`` per second (0 = no limit): event ``i`` is due at ``start + i / rate``.

    ``start`` is the time of the first :meth:`wait` (event 0), so a source that is slow to produce its first
    record (a lazy generator reading a file) does not make the limiter burst to catch up with a schedule that
    started earlier.  Sleeps only when more than ``slack_s`` ahead of schedule, so at high rates it sends in
    small bursts and the long-run rate stays exact; if the caller falls behind it does not try to catch up in
    a burst beyond the schedule (the schedule is absolute, so the average rate is honoured).  ``clock`` and
    ``sleep`` are injectable (a fake clock in tests makes the schedule deterministic).
    """

    def __init__(self, rate: float, *, slack_s: float = 0.002, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], object] = time.sleep) -> None:
        if rate < 0:
            raise ValueError(f"rate: expected records/s >= 0 (0 = as fast as possible), got {rate!r}")
        self.rate = float(rate)
        self.slack_s = slack_s
        self.clock = clock
        self.sleep = sleep
        self.start: float | None = None

    def due(self, index: int) -> float:
        """The time (on ``clock``) at which event ``index`` (0-based) is due; the schedule starts at the first wait."""
        if self.start is None:
            raise RuntimeError("RateLimiter.due: the schedule starts at the first wait()")
        return self.start + index / self.rate if self.rate > 0 else self.start

    def wait(self, index: int) -> None:
        """Block until event ``index`` (0-based) is due (at most ``slack_s`` early)."""
        if self.rate <= 0:
            return
        if self.start is None:
            self.start = self.clock() - index / self.rate
            return
        ahead = self.due(index) - self.clock()
        if ahead > self.slack_s:
            self.sleep(ahead)
