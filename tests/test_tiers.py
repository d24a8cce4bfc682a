"""The suite's own machinery (README "Testing"): the fast tier refuses processes, the one wait helper reports
what it waited for, and the one config builder leaves no port of the service fixed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator

import conftest
import pytest
from config_support import NO_LISTENER_ARGS, NO_LISTENERS, hermetic_config
from waiting import Deadline, wait_for

from stream_anon.cli import build_parser
from stream_anon.cli.service import config_from_args
from stream_anon.config.settings import ServiceSettings


def test_an_unmarked_test_that_starts_a_process_fails_naming_the_command() -> None:
    """This test is not marked integration: the conftest audit hook refuses the process before it starts."""
    with pytest.raises(conftest.UnmarkedProcessError, match=r"test_tiers\.py::test_an_unmarked.* starts a process "
                                                          r"\(subprocess\.Popen: .*python.* -c pass\) but is not "
                                                          r"marked integration"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


def test_tests_that_use_a_broker_fixture_are_integration(request: pytest.FixtureRequest) -> None:
    """Every collected test that uses a broker fixture, directly or through another fixture, carries the mark."""
    items = request.session.items
    brokered = [i for i in items if conftest.INTEGRATION_FIXTURES.intersection(getattr(i, "fixturenames", ()))]
    unmarked = [i.nodeid for i in brokered if i.get_closest_marker("integration") is None]
    assert not unmarked, unmarked
    assert request.node.get_closest_marker("integration") is None  # and this one is not


def test_wait_for_returns_the_first_true_value() -> None:
    values: Iterator[object] = iter([0, None, [], "ready"])
    assert wait_for(lambda: next(values), 30, "the fourth value", interval=0.001) == "ready"


def test_wait_for_names_what_it_waited_for_and_the_last_value() -> None:
    seen = []

    def never() -> int:
        seen.append(1)
        return 0

    with pytest.raises(AssertionError, match=r"^timed out after 0\.05 s waiting for the answer "
                                             r"\(last observed: 0\):\nlog tail$"):
        wait_for(never, 0.05, "the answer", interval=0.01, context=lambda: "log tail")
    assert len(seen) >= 2  # tried, and tried again at the deadline


def test_wait_for_retries_the_named_exceptions_and_reports_the_last_one() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("nobody listens")

    with pytest.raises(AssertionError, match=r"waiting for a connection \(last observed: "
                                             r"ConnectionRefusedError\('nobody listens'\)\)"):
        wait_for(refused, 0.05, "a connection", interval=0.01, retry_on=(OSError,))
    with pytest.raises(KeyError):  # any other exception is the test's failure, at once
        wait_for(lambda: dict[str, int]()["x"], 30, "a key", retry_on=(OSError,))


def test_wait_for_stops_at_once_when_the_awaited_thing_died() -> None:
    def dead() -> None:
        raise AssertionError("service exited with 1")

    with pytest.raises(AssertionError, match="service exited with 1"):
        wait_for(lambda: False, 30, "records", alive=dead)
    with pytest.raises(AssertionError, match=r"^gave up waiting for records: what it waits on is no longer "
                                             r"alive \(last observed: nothing yet\):\nlog$"):
        wait_for(lambda: False, 30, "records", alive=lambda: False, context=lambda: "log")
    assert wait_for(lambda: 5, 30, "five", alive=lambda: None) == 5  # None is not "dead"


def test_deadline_check_passes_until_the_deadline_then_names_the_wait() -> None:
    d = Deadline(30, "the topic")
    d.check(last=3)  # well before the deadline
    assert 0 < d.remaining <= 30
    expired = Deadline(0, "the topic")
    with pytest.raises(AssertionError, match=r"timed out after 0 s waiting for the topic \(last observed: 3\)"):
        expired.check(last=3)


def test_the_config_builder_turns_off_every_port_the_service_binds() -> None:
    """Every ``*_port`` option of the service section is off in a test config (a new port option fails here
    until the builder covers it); the environment is not read."""
    ports = {f"service.{f.name}" for f in dataclasses.fields(ServiceSettings) if f.name.endswith("_port")}
    assert ports == set(NO_LISTENERS)
    cfg = hermetic_config("127.0.0.1:1234", {"anonymization.k": 7}, kafka__group_id="g")
    assert cfg.service.metrics_port == 0 and cfg.service.side_metrics_port == 0
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:1234" and cfg.anonymization.k == 7 and cfg.kafka.group_id == "g"
    assert hermetic_config(None, {"service.metrics_port": 5555}).service.metrics_port == 5555  # a test's own
    args = build_parser().parse_args(["run", *NO_LISTENER_ARGS])
    cli = config_from_args(args)  # flags beat the environment
    assert cli.service.metrics_port == 0 and cli.service.side_metrics_port == 0


def test_the_config_builder_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_ANON_SERVICE_SIDE_METRICS_PORT", "9109")
    monkeypatch.setenv("STREAM_ANON_ANONYMIZATION_K", "50")
    cfg = hermetic_config()
    assert cfg.service.side_metrics_port == 0 and cfg.anonymization.k != 50
