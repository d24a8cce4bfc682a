"""Apache Kafka brokers for the tests, and one interface over Tansu and Apache Kafka (issue 17).

Fixtures (registered in ``tests/conftest.py``):

- ``apache_kafka`` (session): one Apache Kafka node (KRaft, combined broker/controller) from
  ``scripts/apache_kafka.py``, shared by the session's tests like ``broker`` (Tansu) is.
- ``kafka_cluster`` (function): three Apache Kafka nodes (each broker + controller, replication factor 3,
  ``min.insync.replicas=2``, unclean leader election off); a test may kill, freeze, restart or wipe nodes.
- ``any_broker`` (parametrized ``tansu`` / ``apache-kafka``): the session's shared broker of each kind behind
  :class:`TestBroker`; for tests that only need a broker (no restart: both are shared).
- ``restartable_broker`` (parametrized ``tansu`` / ``apache-kafka``, function scope): a broker of its own that
  keeps its data across a restart: Tansu on durable (S3) storage, or a fresh Apache Kafka node.

Select one kind with ``-k tansu`` or ``-k apache-kafka``.  Java and Maven missing, or the Kafka jars not
resolvable, fail the test with the install command (never a skip): ``scripts/test.sh`` installs both and
prefetches the jars (``python scripts/apache_kafka.py fetch``), so no test downloads anything.

Also here: :class:`ServiceProcess` (``stream-anon run`` as a subprocess, output to a file, killed at the end of its
test) and :func:`wait_for` (poll a condition with a deadline, failing early when the service exits).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stream_anon.kafka_io.broker import EmbeddedBroker, S3rverNotFoundError, find_s3rver, node_binary

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT / "scripts"))

from apache_kafka import KafkaCluster, KafkaSetupError  # noqa: E402  (scripts/apache_kafka.py)

BROKER_KINDS = ("tansu", "apache-kafka")


def start_cluster(base_dir: Path, nodes: int, **kwargs: Any) -> KafkaCluster:
    """A started :class:`KafkaCluster` (the ``light`` JVM profile unless ``jvm`` says otherwise: the same broker,
    half the CPU to start on two cores); a missing Java/Maven or a failed start fails the test (never skips)."""
    cluster = KafkaCluster(base_dir, nodes=nodes, **{"jvm": "light", **kwargs})
    try:
        cluster.start()
    except KafkaSetupError as e:
        cluster.stop(timeout_s=5)
        pytest.fail(f"Apache Kafka ({nodes} node(s)) did not start: {e}")
    print(f"\nApache Kafka {cluster.version}: {nodes} node(s) ready in {cluster.started_in_s:.1f} s "
          f"({cluster.bootstrap_servers})")
    return cluster


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """One Apache Kafka node (broker + controller) on free loopback ports, shared by the session's tests."""
    cluster = start_cluster(tmp_path_factory.mktemp("apache-kafka"), 1)
    try:
        yield cluster
    finally:
        cluster.stop(timeout_s=15)


@pytest.fixture
def kafka_cluster(tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes of this test's own (faults allowed); stopped (SIGKILL after 15 s) at the end."""
    cluster = start_cluster(tmp_path / "kafka", 3)
    try:
        yield cluster
    finally:
        cluster.stop(timeout_s=15)


# ------------------------------------------------------------------------------------------------ one interface
@dataclass
class TestBroker:
    """A broker under test, whichever kind: its ``bootstrap_servers``, ``name`` (for ids and topic prefixes), and
    the faults it supports (``restart``, ``kill`` + ``start``, ``frozen``); an unsupported one fails with the
    reason in ``cannot_restart``."""

    __test__ = False  # not a test class

    name: str
    bootstrap_servers: str
    _restart: Callable[[bool], float] | None = None
    _kill: Callable[[], None] | None = None
    _start: Callable[[], float] | None = None
    _frozen: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    cannot_restart: str = ""

    @property
    def restartable(self) -> bool:
        return self._restart is not None

    def _need(self, fn: Any) -> Any:
        if fn is None:
            pytest.fail(f"{self.name}: {self.cannot_restart or 'fault not supported'}")
        return fn

    def restart(self, *, hard: bool = True) -> float:
        """``kill -9`` (``hard``) or SIGTERM, then start on the same storage; seconds until it answers."""
        return float(self._need(self._restart)(hard))

    def kill(self) -> None:
        self._need(self._kill)()

    def start(self) -> float:
        return float(self._need(self._start)())

    def frozen(self) -> contextlib.AbstractContextManager[Any]:
        """SIGSTOP for the block, SIGCONT after it."""
        return self._need(self._frozen)()


def tansu_broker(b: EmbeddedBroker, *, durable: bool) -> TestBroker:
    if not durable:
        return TestBroker("tansu", b.bootstrap_servers, _frozen=b.frozen_for,
                          cannot_restart="the shared Tansu broker keeps its data in memory: a restart loses it "
                                         "(use restartable_broker)")

    def start() -> float:
        t0 = time.monotonic()
        b.start()
        return time.monotonic() - t0

    return TestBroker("tansu", b.bootstrap_servers, _restart=lambda hard: b.restart(hard=hard), _kill=b.kill,
                      _start=start, _frozen=b.frozen_for)


def kafka_broker(cluster: KafkaCluster, *, shared: bool) -> TestBroker:
    """A one-node Apache Kafka cluster behind :class:`TestBroker` (node 1); a shared one supports no fault."""
    if shared:
        return TestBroker("apache-kafka", cluster.bootstrap_servers,
                          cannot_restart="the shared Apache Kafka broker serves other tests (use restartable_broker)")

    def start() -> float:
        return cluster.start_node(1)

    return TestBroker("apache-kafka", cluster.bootstrap_servers,
                      _restart=lambda hard: cluster.restart_node(1, hard=hard), _kill=lambda: cluster.kill(1),
                      _start=start, _frozen=lambda: cluster.frozen(1))


@pytest.fixture(params=BROKER_KINDS)
def any_broker(request: pytest.FixtureRequest) -> TestBroker:
    """The session's shared broker of each kind (Tansu memory, one Apache Kafka node): no faults."""
    if request.param == "tansu":
        return tansu_broker(request.getfixturevalue("broker"), durable=False)
    return kafka_broker(request.getfixturevalue("apache_kafka"), shared=True)


@pytest.fixture(params=BROKER_KINDS)
def restartable_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestBroker]:
    """A broker of this test's own that keeps topics, records and committed offsets across ``restart``,
    ``kill`` + ``start``: Tansu on durable storage (s3rver), or one Apache Kafka node."""
    if request.param == "tansu":
        try:
            node_binary()
            find_s3rver()
        except S3rverNotFoundError as e:
            pytest.fail(str(e))
        with EmbeddedBroker(storage="s3", data_dir=tmp_path / "s3", log_path=tmp_path / "tansu.log") as b:
            yield tansu_broker(b, durable=True)
        return
    cluster = start_cluster(tmp_path / "kafka", 1)
    try:
        yield kafka_broker(cluster, shared=False)
    finally:
        cluster.stop(timeout_s=15)


# ------------------------------------------------------------------------------------------------ the service
class ServiceProcess:
    """``stream-anon run`` (or any command) as a subprocess, output captured to ``log``; use as a context
    manager (killed with SIGKILL at the end if still running)."""

    def __init__(self, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        from durable_broker import child_env
        self.log = log
        self.started = time.monotonic()
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or child_env())

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stacks(self, timeout_s: float = 10.0) -> str:
        """The stacks of every thread of the running service (``kill -USR1``: it writes them to its log), for a
        failure message; what the log got within ``timeout_s`` (until it stops growing)."""
        if self.proc.poll() is not None:
            return "(the service has exited)"
        mark = self.log.stat().st_size
        self.proc.send_signal(signal.SIGUSR1)
        deadline, size, still_since = time.monotonic() + timeout_s, mark, time.monotonic()
        while time.monotonic() < deadline:
            now = self.log.stat().st_size
            if now != size:
                size, still_since = now, time.monotonic()
            elif size > mark and time.monotonic() - still_since > 0.5:
                break
            time.sleep(0.05)
        with open(self.log, "rb") as f:
            f.seek(mark)
            return f.read().decode(errors="replace")

    def assert_alive(self) -> None:
        assert self.proc.poll() is None, f"service exited with {self.proc.returncode}:\n{self.text()[-5000:]}"

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def wait_exit(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout_s} s:\n{self.text()[-5000:]}") from None

    def __enter__(self) -> ServiceProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


def wait_for(what: str, cond: Callable[[], bool], service: ServiceProcess | None, timeout_s: float,
             interval_s: float = 0.1) -> float:
    """Poll ``cond`` until true; fail if the service exits or after ``timeout_s``.  Returns the seconds waited."""
    t0 = time.monotonic()
    while not cond():
        if service is not None:
            service.assert_alive()
        if time.monotonic() - t0 >= timeout_s:
            detail = ""
            if service is not None:  # the log, then what every thread was doing (the log's tail may be the stacks)
                stacks = service.stacks()
                detail = f":\n{service.text()[:-len(stacks) or None][-5000:]}\n--- stacks ---\n{stacks[-8000:]}"
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}{detail}")
        time.sleep(interval_s)
    return time.monotonic() - t0


__all__ = ["BROKER_KINDS", "KafkaCluster", "KafkaSetupError", "ServiceProcess", "TestBroker", "any_broker",
           "apache_kafka", "kafka_cluster", "restartable_broker", "start_cluster", "wait_for"]
