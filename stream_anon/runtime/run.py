"""``stream-anon run``: the main path and, when enabled, the side paths (:mod:`stream_anon.runtime.supervisor`),
with the metrics endpoint and, when no ``kafka.bootstrap_servers`` is configured, an embedded broker."""

from __future__ import annotations

import logging
import sys
import threading

from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.kafka_io.lifecycle import (
    StopDeadline,
    quiet_client_libraries,
    quiet_closing_clients,
)
from stream_anon.metrics.definitions import MAIN, SIDE, ServiceMetrics
from stream_anon.metrics.endpoint import serve_metrics
from stream_anon.runtime.supervisor import SidePaths
from stream_anon.service.accounting import StopCounts, stop_line
from stream_anon.service.app import MainPath
from stream_anon.service.liveness import LoopHeartbeat
from stream_anon.service.wiring import with_release_secret

log = logging.getLogger(__name__)

EMBEDDED_BROKER_STOP_SECONDS = 1.0
"""The embedded broker (memory storage: it keeps nothing anyway) gets this long to exit on SIGTERM, then SIGKILL."""


def start_metrics(cfg: Config, registry: CollectorRegistry, heartbeat: LoopHeartbeat | None = None) -> None:
    """The metrics endpoint (``/metrics``), with ``/healthz`` answered by ``heartbeat`` when given."""
    if cfg.service.metrics_port:
        serve_metrics(registry, cfg.service.metrics_port, cfg.service.metrics_addr,
                      health=heartbeat.health if heartbeat is not None else None)
        log.info("metrics on http://%s:%d/metrics%s", cfg.service.metrics_addr, cfg.service.metrics_port,
                 ", health on /healthz" if heartbeat is not None else "")


def without_idle_side_paths(cfg: Config) -> Config:
    """``cfg`` with the side paths off when they would publish nothing (the schema declares no side-path attribute
    and the configuration lists none), said in one line; otherwise ``cfg``."""
    if not cfg.side_paths.enabled or cfg.service.side_paths_mode == "off":
        return cfg
    reason = cfg.side_paths_off()
    if reason is None:
        return cfg
    log.info("side paths off: %s", reason)
    return cfg.with_options({"side_paths.enabled": False}, origin="schema without side-path attributes")


def exported_parts(cfg: Config) -> frozenset[str]:
    """The metrics this process exports: the main path's, and the side paths' only when they run in one of its
    threads (``service.side_paths_mode = thread``; a side-path process exports its own on its own port)."""
    side_here = cfg.side_paths.enabled and cfg.service.side_paths_mode == "thread"
    return frozenset({MAIN, SIDE}) if side_here else frozenset({MAIN})


def stop_counts(main: MainPath) -> StopCounts:
    """The main path's totals at its stop, with the records its engines still buffer (:class:`StopCounts`)."""
    t = main.totals
    return StopCounts(consumed=t.consumed, released=t.released, suppressed=t.suppressed,
                      dead_lettered=t.dead_lettered, skipped=t.skipped,
                      left=sum(st.buffered for st in list(main.states.values())))


def _stop_side_on(stop_event: threading.Event, side: SidePaths) -> None:
    stop_event.wait()
    side.request_stop()


def _stop_on_side_refusal(stop_event: threading.Event, side: SidePaths, refused: list[int]) -> None:
    """The side paths refused to start (exit 2: their budget is missing or stale, docs/side-paths.md): stop the
    service too, so that ``stream-anon run`` ends with exit 2 instead of running without its side outputs."""
    while not stop_event.wait(0.25):
        if side.refused():
            refused.append(2)
            log.info("stopping: the side paths refused to start (their error above says why); exit code 2")
            stop_event.set()
        elif not side.alive:
            return


def run_service(cfg: Config, *, stop_event: threading.Event | None = None,
                registry: CollectorRegistry | None = None, new_budget: bool = False) -> int:
    """``stream-anon run``: the main path (and, when enabled, the side paths: :mod:`stream_anon.runtime.supervisor`),
    with an embedded broker when no ``kafka.bootstrap_servers`` is configured.  The release secret is resolved
    once, here, and handed to every process.  ``new_budget``: the side paths start a new budget generation
    (``--new-budget``).  Returns the exit code (2 when the side paths refused their budget at start)."""
    stop_event = stop_event or threading.Event()
    cfg = without_idle_side_paths(cfg)
    registry = registry or CollectorRegistry()
    metrics = ServiceMetrics(registry, parts=exported_parts(cfg))
    quiet_closing_clients()  # a client closing while its network thread reads: no traceback on a clean stop
    quiet_client_libraries()  # the client libraries' own lines only at DEBUG
    cfg, secret = with_release_secret(cfg)
    broker: EmbeddedBroker | None = None
    if not cfg.kafka.bootstrap_servers:
        broker = EmbeddedBroker().start()
        cfg = cfg.with_options({"kafka.bootstrap_servers": broker.bootstrap_servers})
        log.info("no kafka.bootstrap_servers given: started an embedded Tansu broker on %s (stopped on exit)",
                 broker.bootstrap_servers)
    memory = broker is not None and not broker.durable
    heartbeat = LoopHeartbeat(cfg.service.healthz_stall_seconds)
    main: MainPath | None = None
    phase = ["the main path"]
    deadline = StopDeadline(stop_event, what=lambda: f"waiting for {phase[0]}")  # the last resort of a stop
    try:
        start_metrics(cfg, registry, heartbeat)
        side = SidePaths(cfg, metrics, stop_event, new_budget=new_budget)
        # a stop reaches the side-path process at once: both stop in parallel (each bounded), the broker last
        threading.Thread(target=_stop_side_on, args=(stop_event, side), name="side-stop", daemon=True).start()
        refused: list[int] = []
        if side.mode != "off":
            threading.Thread(target=_stop_on_side_refusal, args=(stop_event, side, refused), name="side-refusal",
                             daemon=True).start()
        try:
            main = MainPath(cfg, metrics=metrics, stop_event=stop_event, secret_generated=secret.generated,
                            heartbeat=heartbeat)
            rc = main.run()
        finally:
            stop_event.set()
            phase[0] = "the side paths"
            side.stop()
            if side.mode == "process":
                log.info("side-path process stopped")
        return 2 if refused else rc
    finally:
        if broker is not None:
            phase[0] = "the embedded broker"
            # every client of this process is closed (a lag-monitor round may still be connecting): their
            # connection-reset chatter when the broker goes is not an error here
            logging.getLogger("kafka").setLevel(logging.CRITICAL)
            broker.stop(timeout_s=EMBEDDED_BROKER_STOP_SECONDS)
            log.info("embedded broker stopped")
            if main is not None and main.ready.is_set():
                print(f"stream-anon run: the embedded broker {broker.bootstrap_servers} is gone, with its topics: "
                      f"`stream-anon audit` cannot read them any more (audit while `run` runs, or run against an "
                      f"external broker with --bootstrap-servers)", file=sys.stderr, flush=True)
        if main is not None and main.ready.is_set():  # the final line: what the main path left
            print(f"stream-anon run: stopped: {stop_line(stop_counts(main), memory_broker=memory)}", file=sys.stderr,
                  flush=True)
        deadline.done()
