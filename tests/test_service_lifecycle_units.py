"""Units of the stop path and of liveness: the stop grace, the log filter of closing clients, ``/healthz``, the
parent-death wiring (a child killed with its parent, through a real fork)."""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest
from kafka.errors import KafkaTimeoutError
from prometheus_client import CollectorRegistry
from test_service_broker_outage import BACK, OUTAGE  # type: ignore[import-not-found]
from waiting import wait_for

from stream_anon.config.settings import Config
from stream_anon.kafka_io.broker import free_port
from stream_anon.kafka_io.lifecycle import ClosedSocketRecv, StopClock, die_with_parent
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.metrics.endpoint import serve_metrics
from stream_anon.service.broker_guard import BrokerDataLossError
from stream_anon.service.broker_health import BrokerHealth
from stream_anon.service.liveness import LoopHeartbeat


def test_stop_clock_gives_up_only_after_the_grace() -> None:
    ev = threading.Event()
    clock = StopClock(ev, grace=0.3)
    assert not clock.give_up() and clock.remaining() == 0.3  # not stopping: never gives up
    ev.set()
    assert not clock.give_up()  # the first look starts the grace
    wait_for(clock.give_up, 10, "the stop clock to give up after its 0.3 s grace", interval=0.01)
    assert clock.remaining() == 0.0


def _record(msg: str, exc: BaseException | None) -> logging.LogRecord:
    return logging.LogRecord("kafka.net.transport", logging.ERROR, __file__, 1, msg, ("<t>",),
                             (type(exc), exc, None) if exc is not None else None)


def test_closed_socket_filter_drops_only_the_close_race() -> None:
    f = ClosedSocketRecv()
    race = AttributeError("'NoneType' object has no attribute 'recv'")
    assert not f.filter(_record("%s: Error receiving network data closing socket", race))
    assert f.filter(_record("%s: Error receiving network data closing socket", ConnectionResetError(104, "reset")))
    assert f.filter(_record("%s: Abort (%s)", race))
    assert f.filter(_record("%s: socket disconnected", None))


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_healthz_answers_from_the_heartbeat_and_metrics_stay_on_the_endpoint() -> None:
    registry = CollectorRegistry()
    ServiceMetrics(registry)
    beat = LoopHeartbeat(stall_seconds=0.2)
    port = free_port()
    serve_metrics(registry, port, health=beat.health)
    status, body = _get(f"http://127.0.0.1:{port}/healthz")
    assert status == 200 and body.startswith("ok: main loop ticked"), body
    wait_for(lambda: beat.age() > 0.2, 10, "the heartbeat older than its 0.2 s stall bound", interval=0.05)
    status, body = _get(f"http://127.0.0.1:{port}/healthz")
    assert status == 503 and "service.healthz_stall_seconds = 0.2" in body, body
    beat.tick()
    assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
    status, body = _get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200 and "stream_anon_seconds_since_progress 0.0" in body


@pytest.mark.integration
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_dies_with_its_parent() -> None:
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # the parent-to-be: forks the child, reports its pid, then dies with SIGKILL
        child = os.fork()
        if child == 0:
            os.close(r)
            die_with_parent(os.getppid())
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # like the workers: only the parent's death ends it
            time.sleep(60)
            os._exit(0)
        os.write(w, str(child).encode())
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    os.close(w)
    child = int(os.read(r, 32).decode())
    os.close(r)
    os.waitpid(middle, 0)

    def gone_or_zombie() -> bool:  # reparented to init (or a subreaper): gone or a zombie once killed
        try:
            return open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True

    wait_for(gone_or_zombie, 20, "the child to die with its parent", interval=0.05)


class _Guard:
    """A broker guard whose topic check gives ``outcome``: an error returned (the request was not answered) or a
    :class:`BrokerDataLossError` raised (the broker lost a topic); counts the checks."""

    def __init__(self, outcome: Exception) -> None:
        self.outcome = outcome
        self.calls = 0

    def check_topics(self) -> Exception | None:
        self.calls += 1
        if isinstance(self.outcome, BrokerDataLossError):
            raise self.outcome
        return self.outcome


def _health(guard: _Guard, reader: object = None, stopping: Callable[[], bool] = lambda: False) -> BrokerHealth:
    cfg = Config.load(env={}, overrides={"kafka.bootstrap_servers": "127.0.0.1:9", "side_paths.enabled": False})
    return BrokerHealth(guard, poller=None, reader=reader, kafka=cfg.kafka,  # type: ignore[arg-type]
                        input_topic=cfg.topics.input, ledger_topic=cfg.topics.ledger_topic(),
                        ledger_partition=lambda p: p, owned=list, stopping=stopping)


def test_an_outage_is_named_by_whichever_request_fails_first(caplog: pytest.LogCaptureFixture) -> None:
    """CI found an 8-s broker freeze with no line of the service: the loop spent it inside the data check's
    metadata request (a new admin client bootstraps for ``connect_timeout_ms``), and its ping came after the
    broker was back.  A failed data check is itself the outage's first line; the check then waits for the
    broker's return (only the ping asks, with its backoff), and the return is named."""
    guard = _Guard(KafkaTimeoutError("Unable to bootstrap from 127.0.0.1:9092"))  # the broker froze meanwhile
    health = _health(guard)
    with caplog.at_level(logging.WARNING, logger="stream_anon"):
        assert health.check_data(force=True) is False
        assert health.outage_since is not None and guard.calls == 1
        assert health.check_data() is True and guard.calls == 1  # during the outage only the ping asks
        health.answered()
    text = "\n".join(f"{r.levelname} {r.name}: {r.getMessage()}" for r in caplog.records)
    assert OUTAGE.search(text) and BACK.search(text), text
    assert re.search(r"not answering for \d+ s \(KafkaTimeoutError: Unable to bootstrap", text), text
    assert health.outage_since is None


TOPIC_GONE = BrokerDataLossError("topic stream.raw is gone (it had id x, 2 partitions)")
"""A broker that answers metadata but lost the input topic (a memory broker restarted)."""


class _TimingOutReader:
    """kafka-python's offsets request for an unknown topic: retried until its timeout."""

    def ping(self, topic: str, partition: int, timeout_ms: int) -> None:
        raise KafkaTimeoutError(f"Failed to get offsets by timestamps in {timeout_ms} ms")


def test_a_failed_ping_is_followed_by_the_topic_check(caplog: pytest.LogCaptureFixture) -> None:
    """CI: a memory broker restarted; the ping for the gone topic timed out, the outage began, and the data check
    (which waits for the outage's end) never ran: 60 s of "not answering" instead of exit 4.  A failed ping now
    runs the topic check (at most every data-check period), which names the loss."""
    guard = _Guard(TOPIC_GONE)
    health = _health(guard, _TimingOutReader())
    health._check_at = health._data_check_at = 0.0  # both due now
    with pytest.raises(BrokerDataLossError, match="is gone"):
        health.check_broker_when_due()
    assert guard.calls == 1 and health.outage_since is not None
    health._check_at = 0.0  # the next ping is due, the data check's period is not over: the ping alone
    health.check_broker_when_due()
    assert guard.calls == 1


def test_a_stop_during_a_failed_ping_checks_nothing_more() -> None:
    """The stop path waits for no further request: a stop that came while the ping waited skips the topic check."""
    guard = _Guard(TOPIC_GONE)
    stopping = [False]

    class StoppedDuringThePing(_TimingOutReader):
        def ping(self, topic: str, partition: int, timeout_ms: int) -> None:
            stopping[0] = True
            super().ping(topic, partition, timeout_ms)

    health = _health(guard, StoppedDuringThePing(), stopping=lambda: stopping[0])
    health._check_at = health._data_check_at = 0.0
    health.check_broker_when_due()
    assert stopping[0] and guard.calls == 0 and health.outage_since is not None
