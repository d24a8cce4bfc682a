"""The side paths next to the main path: started, watched and stopped by the service (``stream-anon run``, demo).

``service.side_paths_mode``: ``process`` (default: a child process, no shared GIL, so a slow side path never
delays the main path; it has its own metrics endpoint, ``service.side_metrics_port``), ``thread`` (a thread of
this process, sharing its metrics) or ``off``.  Each runs :func:`stream_anon.side.app.run_side_paths` with its
own consumer group.

The child process is started non-daemonic and stopped explicitly: :meth:`SidePaths.request_stop` asks it over its
pipe (as soon as the service is told to stop, so both stop in parallel), :meth:`SidePaths.stop` waits for its final
report and kills it if it does not finish in time.  It ignores SIGINT and SIGTERM (a Ctrl-C or a stop sent to the
whole process group: the service decides).  It never outlives the service: the kernel kills it when the service
dies (:func:`~stream_anon.kafka_io.lifecycle.die_with_parent`), and the end of file on its pipe stops it too.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.kafka_io.lifecycle import (
    CLOSE_TIMEOUT_SECONDS,
    STOP_GRACE_SECONDS,
    StopDeadline,
    as_service_child,
    quiet_client_libraries,
    quiet_closing_clients,
)
from stream_anon.metrics.definitions import SIDE, ServiceMetrics
from stream_anon.metrics.endpoint import serve_metrics
from stream_anon.side.app import SideStatus, run_side_paths

log = logging.getLogger(__name__)

SIDE_SELF_STOP_SECONDS = STOP_GRACE_SECONDS + CLOSE_TIMEOUT_SECONDS
"""The side-path process's own deadline after the stop request (:class:`~stream_anon.kafka_io.lifecycle.
StopDeadline`, exit code 3).  Its stop path is its final flush (at most
:data:`~stream_anon.kafka_io.lifecycle.SIDE_STOP_GRACE_SECONDS`), then its consumer's and producer's close (0.5 s
when the broker did not answer)."""
SIDE_STOP_SECONDS = SIDE_SELF_STOP_SECONDS + 1.0
"""How long the service waits for the side-path process to stop after the request before it kills it.  The process
ends itself before that (:data:`SIDE_SELF_STOP_SECONDS`), so the kill is the last resort of a last resort."""
REPORT_SECONDS = 0.25
"""How often the child process looks at its pipe (stop requests, status requests, the service gone)."""


@dataclass(frozen=True)
class StatusRequest:
    """Parent -> child: send a :class:`SideReport`."""


@dataclass(frozen=True)
class StopRequest:
    """Parent -> child: finish (final estimates, flush, close) and exit."""


@dataclass(frozen=True)
class SideReport:
    """Child -> parent: the side paths' totals (:meth:`SideStatus.summary`); ``exit_code`` on the final one."""

    summary: dict[str, Any]
    exit_code: int | None = None


class SidePaths:
    """The LDP side paths started next to the main path (see the module docstring)."""

    def __init__(self, cfg: Config, metrics: ServiceMetrics, stop_event: threading.Event, *,
                 new_budget: bool = False) -> None:
        self.cfg = cfg
        self.mode = cfg.service.side_paths_mode if cfg.side_paths.enabled else "off"
        self.status: SideStatus | None = None
        self._thread: threading.Thread | None = None
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._summary: dict[str, Any] | None = None
        self._asked = False
        self._stop_sent: float | None = None  # monotonic time of the stop request
        self._recv_lock = threading.Lock()  # the refusal watcher and stop() both read the pipe
        self.exit_code: int | None = None
        if self.mode == "thread":
            status = self.status = SideStatus()

            def run() -> None:
                self.exit_code = run_side_paths(cfg, metrics, stop_event, status=status, new_budget=new_budget)

            self._thread = threading.Thread(target=run, name="side-paths")
            self._thread.start()
        elif self.mode == "process":
            ctx = mp.get_context("spawn")
            self._conn, child_end = ctx.Pipe(duplex=True)
            self._process = ctx.Process(target=side_process_main,
                                        args=(cfg, child_end, logging.getLogger().getEffectiveLevel(), new_budget),
                                        name="stream-anon-side-paths", daemon=False)
            self._process.start()
            child_end.close()
            log.info("side paths started in process %d (metrics port %s)", self._process.pid,
                     cfg.service.side_metrics_port or "off")

    def progress(self) -> dict[str, Any] | None:
        """Latest status summary (thread mode: live; process mode: the child's latest report, one call behind)."""
        if self.status is not None:
            return self.status.summary()
        if self._conn is not None:
            self._drain()
            if not self._asked and self.alive:
                try:
                    self._conn.send(StatusRequest())
                    self._asked = True
                except (OSError, ValueError):
                    pass
        return self._summary

    def _drain(self) -> None:
        with self._recv_lock:
            self._drain_locked()

    def _drain_locked(self) -> None:
        conn = self._conn
        if conn is None:  # closed by stop()
            return
        try:
            while conn.poll():
                report: SideReport = conn.recv()
                self._summary = report.summary
                self._asked = False
                if report.exit_code is not None:
                    self.exit_code = report.exit_code
        except (EOFError, OSError):
            pass

    def refused(self) -> bool:
        """True once the side paths ended with exit code 2 (their budget or configuration was refused at start)
        before any stop was asked (process mode: learnt from the child's final report)."""
        if self._conn is not None and self._stop_sent is None:
            self._drain()
        return self.exit_code == 2 and self._stop_sent is None and not self.alive

    @property
    def alive(self) -> bool:
        if self._thread is not None:
            return self._thread.is_alive()
        if self._process is not None:
            return self._process.is_alive()
        return False

    def request_stop(self) -> None:
        """Ask the side-path process to stop (returns at once; :meth:`stop` waits for it).  Safe to call from
        another thread than :meth:`stop`'s, once."""
        conn = self._conn
        if self._process is not None and conn is not None and self._stop_sent is None:
            self._stop_sent = time.monotonic()
            try:
                conn.send(StopRequest())
            except (OSError, ValueError):  # the child is gone already
                pass

    def stop(self, timeout: float = SIDE_STOP_SECONDS) -> dict[str, Any] | None:
        """Stop the side paths (the thread's ``stop_event`` is the service's, already set by the caller) and
        return their final summary.  The child gets ``timeout`` seconds from the stop request, then is killed."""
        if self._thread is not None:
            self._thread.join(timeout)
        proc, conn = self._process, self._conn
        if proc is not None and conn is not None:
            self.request_stop()
            deadline = (self._stop_sent or time.monotonic()) + timeout
            while self.exit_code is None and proc.is_alive() and time.monotonic() < deadline:
                if conn.poll(0.05):
                    self._drain()
            self._drain()
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("side-path process %d did not stop within %.0f s: killing it", proc.pid, timeout)
                proc.kill()
                proc.join(5)
            with self._recv_lock:
                conn.close()
                self._conn = None
        return self.progress()


def side_process_main(cfg: Config, conn: Connection, log_level: int = logging.INFO, new_budget: bool = False) -> None:
    """Child process: the side paths with their own metrics endpoint (side-path metrics only), driven over
    ``conn``; logging at the service's ``log_level``."""
    parent = mp.parent_process()
    as_service_child(parent.pid if parent is not None else None)  # never outlives the service (kill -9 included)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet_client_libraries(log_level)  # the client libraries' own lines only at DEBUG, as in the service
    quiet_closing_clients()
    metrics = ServiceMetrics(CollectorRegistry(), parts=frozenset({SIDE}))  # only the side paths' metrics
    stop = threading.Event()
    StopDeadline(stop, SIDE_SELF_STOP_SECONDS, what=lambda: "the side paths' stop")  # never killed by the parent
    status = SideStatus()
    if cfg.service.side_metrics_port:
        stall = cfg.service.healthz_stall_seconds
        try:
            serve_metrics(metrics.registry, cfg.service.side_metrics_port, cfg.service.metrics_addr,
                          health=lambda: status.health(stall), port_option="service.side_metrics_port")
        except OSError as e:
            log.warning("side-path metrics endpoint not started: %s", e)
    exit_code: list[int] = []
    th = threading.Thread(target=lambda: exit_code.append(run_side_paths(cfg, metrics, stop, status=status,
                                                                         new_budget=new_budget)),
                          name="side-paths")
    th.start()
    while th.is_alive():
        if not conn.poll(REPORT_SECONDS):
            continue
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the service is gone: stop instead of living on as an orphan
            log.warning("side paths: the service process is gone; stopping")
            stop.set()
            th.join()
            return
        if isinstance(msg, StopRequest):
            stop.set()
        elif isinstance(msg, StatusRequest):
            conn.send(SideReport(status.summary()))
    try:
        conn.send(SideReport(status.summary(), exit_code[0] if exit_code else 1))
    except (OSError, ValueError):
        pass
    # everything is closed and reported: end the child now (the interpreter's teardown of numpy, the Kafka clients
    # and the mechanisms takes about a second on a busy machine, and the service waits for this process)
    logging.shutdown()
    os._exit(0)
