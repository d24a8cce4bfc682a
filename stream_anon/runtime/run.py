"""``stream-anon run``: the main path and, when enabled, the side paths (:mod:`stream_anon.runtime.supervisor`),
with the metrics endpoint and, when no ``kafka.bootstrap_servers`` is configured, an embedded broker."""

from __future__ import annotations

import logging
import threading

from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.kafka_io.lifecycle import StopDeadline, quiet_closing_clients
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.metrics.endpoint import serve_metrics
from stream_anon.runtime.supervisor import SidePaths
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


def _stop_side_on(stop_event: threading.Event, side: SidePaths) -> None:
    stop_event.wait()
    side.request_stop()


def run_service(cfg: Config, *, stop_event: threading.Event | None = None,
                registry: CollectorRegistry | None = None) -> int:
    """``stream-anon run``: the main path (and, when enabled, the side paths: :mod:`stream_anon.runtime.supervisor`),
    with an embedded broker when no ``kafka.bootstrap_servers`` is configured.  The release secret is resolved
    once, here, and handed to every process.  Returns the exit code."""
    stop_event = stop_event or threading.Event()
    registry = registry or CollectorRegistry()
    metrics = ServiceMetrics(registry)
    quiet_closing_clients()  # a client closing while its network thread reads: no traceback on a clean stop
    cfg, secret = with_release_secret(cfg)
    broker: EmbeddedBroker | None = None
    if not cfg.kafka.bootstrap_servers:
        broker = EmbeddedBroker().start()
        cfg = cfg.with_options({"kafka.bootstrap_servers": broker.bootstrap_servers})
        log.info("no kafka.bootstrap_servers given: started an embedded Tansu broker on %s (stopped on exit)",
                 broker.bootstrap_servers)
    heartbeat = LoopHeartbeat(cfg.service.healthz_stall_seconds)
    phase = ["the main path"]
    deadline = StopDeadline(stop_event, what=lambda: f"waiting for {phase[0]}")  # the last resort of a stop
    try:
        start_metrics(cfg, registry, heartbeat)
        side = SidePaths(cfg, metrics, stop_event)
        # a stop reaches the side-path process at once: both stop in parallel (each bounded), the broker last
        threading.Thread(target=_stop_side_on, args=(stop_event, side), name="side-stop", daemon=True).start()
        try:
            rc = MainPath(cfg, metrics=metrics, stop_event=stop_event, secret_generated=secret.generated,
                          heartbeat=heartbeat).run()
        finally:
            stop_event.set()
            phase[0] = "the side paths"
            side.stop()
            if side.mode == "process":
                log.info("side-path process stopped")
        return rc
    finally:
        if broker is not None:
            phase[0] = "the embedded broker"
            # every client of this process is closed (a lag-monitor round may still be connecting): their
            # connection-reset chatter when the broker goes is not an error here
            logging.getLogger("kafka").setLevel(logging.CRITICAL)
            broker.stop(timeout_s=EMBEDDED_BROKER_STOP_SECONDS)
            log.info("embedded broker stopped")
        deadline.done()
