"""Shared fixtures: the ADULT path (required, never skipped), a real Tansu broker per session, and a durable
Tansu broker (S3 storage on a private s3rver) per test for restart tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from stream_anon.kafka_io.broker import EmbeddedBroker, S3rverNotFoundError, find_s3rver, node_binary
from stream_anon.kafka_io.settings import CONSUMER_CLIENTS

# Property tests draw the same examples on every run (a CI failure reproduces; no example found by luck on one run
# only), with no per-example deadline (a loaded 2-core machine is not a slow implementation).
settings.register_profile("stream-anon", derandomize=True, deadline=None)
settings.load_profile("stream-anon")

pytest_plugins = ["apache_kafka_support", "reliability_support"]  # Apache Kafka fixtures: apache_kafka, kafka_cluster, any_broker (issue 17)


@pytest.fixture(scope="session")
def adult_path() -> Path:
    """The UCI ADULT file from $STREAM_ANON_ADULT (or ../shared); a missing file fails, it does not skip."""
    env = os.environ.get("STREAM_ANON_ADULT")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "datasets" / "adult" / "adult.data")
    for c in candidates:
        if c.is_file():
            return c
    pytest.fail(f"ADULT data not found: set STREAM_ANON_ADULT (tried {[str(c) for c in candidates]})")


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedBroker]:
    """A real Tansu broker (memory storage) on a free loopback port, shared by the session's tests."""
    log_path = tmp_path_factory.mktemp("tansu") / "tansu.log"
    with EmbeddedBroker(log_path=log_path) as b:
        yield b


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A Tansu broker on S3 storage (a private s3rver with its files under ``tmp_path``) whose ``restart()`` (or a
    stop and a start) keeps topics, records and committed offsets.  No node or s3rver fails the test (never a
    skip): ``scripts/test.sh`` installs s3rver into ``.cache/npm``."""
    try:
        node_binary()
        find_s3rver()
    except S3rverNotFoundError as e:
        pytest.fail(str(e))
    with EmbeddedBroker(storage="s3", data_dir=tmp_path / "s3", log_path=tmp_path / "tansu.log") as b:
        yield b


# ------------------------------------------------------------------------------------------------ test tiers
# README "Testing": the fast tier (`bash scripts/test.sh --fast`, i.e. `-m "not integration and not slow"`) is
# every test that runs in this one Python process: no broker, no server, no subprocess.  Markers:
#   integration: needs a real broker (Tansu, Apache Kafka), s3rver, Prometheus/promtool, or starts a process
#                (the CLI, the service, a tool).  Applied here to every test that uses one of INTEGRATION_FIXTURES
#                (directly or through another fixture); a test that starts a process without such a fixture
#                carries an explicit @pytest.mark.integration.  A test that starts one without either mark
#                fails at once, naming the command (the audit hook below): nobody has to remember.
#   slow:        long statistical or end-to-end runs (whole-ADULT streams, calibration over many seeds).
INTEGRATION_FIXTURES = frozenset({
    "broker", "durable_broker",  # Tansu (memory; S3 on s3rver)
    "apache_kafka", "kafka_cluster", "any_broker", "restartable_broker",  # Apache Kafka (tests/apache_kafka_support.py)
})
# process-creating events of sys.addaudithook (https://docs.python.org/3/library/audit_events.html)
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.spawn", "os.exec", "os.fork",
                            "os.forkpty"})
# what libraries run for themselves on a fresh machine (matplotlib's font cache: fc-list; ctypes.util.find_library:
# ldconfig, gcc, ld, objdump; platform: uname): not the test's doing, allowed everywhere
LIBRARY_PROBES = frozenset({"fc-list", "ldconfig", "gcc", "cc", "ld", "objdump", "uname"})
_running_in_process_only: list[str] = []  # node id of the running test when it is not marked integration


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    in_process_only = item.get_closest_marker("integration") is None
    if in_process_only:
        _running_in_process_only.append(item.nodeid)
    try:
        yield
    finally:
        if in_process_only:
            _running_in_process_only.pop()


class UnmarkedProcessError(RuntimeError):
    """A test that is not marked ``integration`` started a process (it would run in the fast tier)."""


def _refuse_processes_in_unmarked_tests(event: str, args: tuple[Any, ...]) -> None:
    if event in PROCESS_EVENTS and _running_in_process_only:
        command = " ".join(map(os.fsdecode, [args[1]] if isinstance(args[1], str | bytes | os.PathLike) else args[1])) \
            if event == "subprocess.Popen" else repr(args)
        if event == "subprocess.Popen" and os.path.basename((command.split() or [""])[0]) in LIBRARY_PROBES:
            return
        raise UnmarkedProcessError(
            f"{_running_in_process_only[-1]} starts a process ({event}: {command[:200]}) but is not marked "
            f"integration: add @pytest.mark.integration (tests that use a broker fixture get it from "
            f"tests/conftest.py); the fast tier runs in one process")


sys.addaudithook(_refuse_processes_in_unmarked_tests)


@pytest.fixture(params=CONSUMER_CLIENTS)
def consumer_client(request: pytest.FixtureRequest) -> str:
    """``kafka.consumer_client`` for a test that runs with each client library (same assertions)."""
    return str(request.param)
