"""How the service's processes stop: bounded waits on the stop path, and children that never outlive their parent.

Stopping (SIGTERM, Ctrl-C): every wait on the stop path is bounded, so that a process stops within
:data:`STOP_DEADLINE_SECONDS` of the request in every state (broker up, stalled or frozen, a produce retry waiting
out its backoff, a recovery scan).  Outputs get :data:`STOP_GRACE_SECONDS` (counted from the moment the stop was
requested, shared by every wait of the stop path: :class:`StopClock`) to be acknowledged; what is not is left to
the next owner (the ledger makes its re-send byte-identical).  Each Kafka client then gets
:data:`CLOSE_TIMEOUT_SECONDS` to close (leave the group, drain what is in flight).  Every blocking call of a
running loop is bounded by a request timeout of at most 3 s (:data:`LOOP_REQUEST_TIMEOUT_MS`) and every backoff
sleep looks at the stop (:func:`wait_unless`), so the stop path starts within about 3 s of the request; :class:`StopDeadline` ends the
process at :data:`STOP_DEADLINE_SECONDS` if something still holds it (one ERROR line, exit code 3: the next start
recovers from the ledger), a last resort that the tests require never to fire.

Orphans: a child process (pipeline worker, side-path process) calls :func:`die_with_parent` first thing.  On Linux
the kernel then sends it ``SIGKILL`` when the parent dies, however it dies (``PR_SET_PDEATHSIG``, prctl(2)); as a
fallback (another OS, or a parent that was already gone before the call) a daemon thread watches the parent pid
and ends the process when it changes.
"""

from __future__ import annotations

import ctypes
import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 4.0
"""On a stop: how long after the request the stop path waits, in all, for outputs, ledger entries and the final
commit to be acknowledged before it leaves them to the next owner (a restart re-sends them from the ledger)."""
SIDE_STOP_GRACE_SECONDS = STOP_GRACE_SECONDS - 1.0
"""On a stop: how long the side paths' final flush (open windows, final estimates, outbox tombstones) waits for
acknowledgements before it leaves them to the next start (the outbox recomputes them).  One second less than the
main path's grace, so that with the broker frozen their stop (this grace, then the consumer's close) ends about
2.5 s before the side-path process's own deadline (``runtime.supervisor.SIDE_SELF_STOP_SECONDS``):
with the full grace the margin was 1.5 s, and a loaded CI machine used it up (the deadline fired 6.0 s after the
request, in 2 of the 4 frozen-broker stops of one CI run)."""
LOOP_REQUEST_TIMEOUT_MS = 3000
"""Longest any blocking request of a running loop may wait for its answer (the recovery reader's scans and ends, a
committed offset, the broker checks, the side paths' commits): they are retried, and a stop is noticed between two
attempts, so the stop path starts at most this long after the request even while the broker stalls."""
STOP_DEADLINE_SECONDS = 9.0
"""A stopping process that is still running this long after the request ends itself (:class:`StopDeadline`)."""
CLOSE_TIMEOUT_SECONDS = 2.0
"""On a stop: how long each Kafka client may take to close (LeaveGroup, in-flight requests)."""
MIN_CONSUMER_CLOSE_SECONDS = 0.5
"""On a stop whose broker did not answer: what a group consumer still gets to close (its LeaveGroup)."""
PARENT_POLL_SECONDS = 1.0
"""How often the fallback watcher of :func:`die_with_parent` looks at the parent pid."""

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class StopClock:
    """``give_up()``: true once ``stop_event`` has been set for ``grace`` seconds, counted from the moment it was set
    (a watcher thread notes it; a clock that sees the event set before its watcher did starts there).  Handed to the
    producers as their ``stop``: a flush on the stop path waits for acknowledgements until the grace is over, then
    raises ``BrokerUnavailableError`` (outputs left to the next owner)."""

    def __init__(self, stop_event: threading.Event, grace: float = STOP_GRACE_SECONDS) -> None:
        self.stop_event = stop_event
        self.grace = grace
        self._since: float | None = None
        threading.Thread(target=self._watch, name="stop-clock", daemon=True).start()

    def _watch(self) -> None:
        self.stop_event.wait()
        self.started()

    def started(self) -> float:
        """When the stop was requested (monotonic seconds); the first call after the event is set fixes it."""
        if self._since is None:
            self._since = time.monotonic()
        return self._since

    def remaining(self) -> float:
        """Seconds of grace left (``grace`` while not stopping)."""
        if not self.stop_event.is_set():
            return self.grace
        return max(0.0, self.grace - (time.monotonic() - self.started()))

    def give_up(self) -> bool:
        return self.stop_event.is_set() and self.remaining() <= 0.0


def wait_unless(seconds: float, stop: Callable[[], bool] | None, slice_s: float = 0.1) -> bool:
    """Sleep ``seconds`` in slices of ``slice_s``, returning early (True) as soon as ``stop()`` is true; False when
    the time passed.  Every backoff sleep that a stop must be able to cut short uses it."""
    deadline = time.monotonic() + seconds
    while True:
        if stop is not None and stop():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(slice_s, left))


class StopDeadline:
    """The last resort of :data:`STOP_DEADLINE_SECONDS`: once ``stop_event`` is set, a daemon thread waits that long
    for :meth:`done`; if the process is still running then, it logs one ERROR line naming what still held it and
    ends the process with ``exit_code`` (``os._exit``: its children die with it, :func:`die_with_parent`)."""

    def __init__(self, stop_event: threading.Event, seconds: float = STOP_DEADLINE_SECONDS, exit_code: int = 3,
                 what: Callable[[], str] = lambda: "") -> None:
        self.stop_event = stop_event
        self.seconds = seconds
        self.exit_code = exit_code
        self.what = what
        self._done = threading.Event()
        threading.Thread(target=self._watch, name="stop-deadline", daemon=True).start()

    def done(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        self.stop_event.wait()
        if self._done.wait(self.seconds):
            return
        log.error("the stop did not finish within %.0f s of the request%s: exiting now with code %d (what was not "
                  "acknowledged is left to the next start, which recovers from the ledger)", self.seconds,
                  f" ({self.what()})" if self.what() else "", self.exit_code)
        for h in logging.getLogger().handlers:
            h.flush()
        os._exit(self.exit_code)


class Closing:
    """How long the clients of a stop path may take to close, decided once the stop path knows how it went.

    By default each client gets :data:`CLOSE_TIMEOUT_SECONDS`.  :meth:`broker_silent`: the broker did not answer
    on the way out (or the stop was not clean), so no client waits for it again (a consumer still gets
    :data:`MIN_CONSUMER_CLOSE_SECONDS` to send its LeaveGroup).  :meth:`abandon`: the producers deliver nothing more
    (a broker that lost data must not get what they hold)."""

    def __init__(self) -> None:
        self.seconds = CLOSE_TIMEOUT_SECONDS
        self.abandoned = False

    def broker_silent(self) -> None:
        self.seconds = 0.0

    def abandon(self) -> None:
        self.abandoned = True

    @property
    def consumer_seconds(self) -> float:
        return max(self.seconds, MIN_CONSUMER_CLOSE_SECONDS)

    @property
    def producer_seconds(self) -> float:
        return 0.0 if self.abandoned else self.seconds


class ClosedSocketRecv(logging.Filter):
    """Drops kafka-python's ``ERROR ... Error receiving network data closing socket`` with the traceback of
    ``AttributeError: 'NoneType' object has no attribute 'recv'``: a client closed (its socket set to None by the
    closing thread) while its network thread was waking up to read from it (kafka-python 3.0.12,
    ``kafka/net/transport.py``, ``_read_from_sock``).  Nothing was lost: the client was being closed.  Any other
    receive error still passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, AttributeError) and "'NoneType' object has no attribute 'recv'" in str(exc)
                    and str(record.msg).startswith("%s: Error receiving network data"))


CLIENT_LOGGERS = ("kafka", "librdkafka")
"""The Kafka client libraries' loggers: kafka-python's (``kafka.*``) and the one the confluent-kafka producer is
given (:mod:`stream_anon.kafka_io.producer`)."""
CLIENT_LOGS_KEPT = logging.WARNING
"""Below DEBUG the client libraries' loggers still make records from this level up, so that the filters on them see
the lines they act on (:class:`~stream_anon.kafka_io.oversized.ReceiveLimitLines`: kafka-python reports a fetch
response over its receive limit nowhere else), but the records reach no handler: they never reach the output.  What
the operator must know (a broker unreachable, a failed produce, a lost group) is said by stream-anon's own lines; the
libraries' connection chatter (about 70 ``kafka.net`` ERROR and WARNING lines when a broker is down) and
kafka-python's ``Task ... blocking the event loop`` warnings (its network selector warns when one step of its I/O
coroutine takes over 0.1 s, which happens whenever another thread of the process holds the GIL that long: the
engine, JSON decoding, a busy machine) are dropped."""


def quiet_client_libraries(level: int | None = None) -> None:
    """The client libraries' lines kept from the output unless ``level`` (default: the root logger's effective
    level) is DEBUG, where they pass everything: below DEBUG their loggers make records from
    :data:`CLIENT_LOGS_KEPT` up (for the filters on them) but do not propagate to the root's handlers (a
    ``NullHandler`` keeps logging's last-resort handler away)."""
    level = logging.getLogger().getEffectiveLevel() if level is None else level
    for name in CLIENT_LOGGERS:
        logger = logging.getLogger(name)
        quiet = level > logging.DEBUG
        logger.setLevel(CLIENT_LOGS_KEPT if quiet else logging.NOTSET)
        logger.propagate = not quiet
        if quiet and not any(isinstance(h, logging.NullHandler) for h in logger.handlers):
            logger.addHandler(logging.NullHandler())


def quiet_closing_clients() -> None:
    """Install :class:`ClosedSocketRecv` on kafka-python's transport logger (once per process)."""
    transport = logging.getLogger("kafka.net.transport")
    if not any(isinstance(f, ClosedSocketRecv) for f in transport.filters):
        transport.addFilter(ClosedSocketRecv())


STACK_DUMP_SIGNAL = signal.SIGUSR1
"""``kill -USR1 <pid>``: the process writes every thread's stack to stderr (:func:`dump_stacks_on_signal`)."""


def dump_stacks_on_signal(sig: int = STACK_DUMP_SIGNAL) -> None:
    """On ``sig``, write the Python stack of every thread to stderr (the service's log) and keep running:
    :func:`faulthandler.register`, which works from C, so even a thread blocked in a call that never returns is
    shown.  Every process of the service installs it (the default action of SIGUSR1 would end a process that
    does not: a signal sent to the whole process group reaches them all)."""
    faulthandler.register(sig, file=sys.stderr, all_threads=True, chain=False)


def as_service_child(parent_pid: int | None) -> None:
    """What every child process of the service does first: end with its parent (:func:`die_with_parent`), ignore
    SIGINT and SIGTERM (Ctrl-C and a stop reach the whole process group: the parent decides) and dump its stacks
    on SIGUSR1 (:func:`dump_stacks_on_signal`)."""
    die_with_parent(parent_pid)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    dump_stacks_on_signal()


def die_with_parent(parent_pid: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Make this process end when its parent dies: ``PR_SET_PDEATHSIG`` (Linux), plus a watcher thread that ends
    the process when the parent pid changes (the parent died before the prctl call, or no prctl).

    ``parent_pid``: the parent's pid as the parent knew it (default: the current parent); if it is already gone,
    exit at once.  The parent-death signal follows the parent *thread* that started this process: start children
    from a thread that lives as long as they should (the main thread)."""
    expected = os.getppid() if parent_pid is None else parent_pid
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != expected:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(PARENT_POLL_SECONDS)
            if os.getppid() != expected:
                os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
