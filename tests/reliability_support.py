"""Support of the issue-18 scenarios through real ``stream-anon run`` processes: the command line, the group's
committed offsets from a fresh client, ``stream-anon audit`` as a subprocess, and a per-scenario figures line
(records in, lost, duplicated, k-violations, time to recover or exit, stop time) that the tests print (``-s``)
for the closing note of issue 18."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from apache_kafka_support import ServiceProcess as BaseServiceProcess
from apache_kafka_support import wait_for
from durable_broker import child_env
from kafka import KafkaConsumer, TopicPartition

from stream_anon.kafka_io.broker import EmbeddedBroker

__all__ = ["Broker", "ServiceProcess", "own_broker", "audit", "committed", "drained", "outcome", "record_figures", "service_cmd",
           "topic_flags", "wait_for"]

ROLES = ("anon", "suppressed", "dlq")
FIGURES = Path(__file__).resolve().parents[1] / ".cache" / "issue18-figures.jsonl"


def topic_flags(prefix: str) -> list[str]:
    out = ["--input-topic", f"{prefix}.raw"]
    for role in ROLES:
        out += ["--set", f"topics.{role}={prefix}.{role}"]
    return out


def service_cmd(bs: str, prefix: str, *extra: str, partitions: int = 2, k: int = 10, delta: int = 1000,
                side_paths: bool = False) -> list[str]:
    return [sys.executable, "-m", "stream_anon", "--log-level", "INFO", "run", "--bootstrap-servers", bs,
            *topic_flags(prefix), "--group-id", f"{prefix}-main", "--partitions", str(partitions), "--k", str(k),
            "--delta", str(delta), "--seed", "3", *([] if side_paths else ["--no-side-paths"]),
            "--metrics-port", "0", "--set", "service.side_metrics_port=0",
            "--set", "kafka.session_timeout_ms=6000", "--set", "kafka.max_poll_interval_ms=20000",
            "--set", "kafka.request_timeout_ms=5000", "--set", "kafka.retry_backoff_max_seconds=2",
            "--set", "kafka.startup_retry_seconds=120", "--set", "service.commit_interval_ms=250",
            "--set", "service.producer_recovery_seconds=10", *extra]


class ServiceProcess(BaseServiceProcess):
    """:class:`apache_kafka_support.ServiceProcess` with timed stops."""

    def send(self, sig: int = signal.SIGTERM) -> float:
        """Send ``sig``; returns the monotonic time it was sent."""
        t = time.monotonic()
        self.proc.send_signal(sig)
        return t

    def stop(self, timeout_s: float = 60.0, sig: int = signal.SIGTERM) -> tuple[int, float]:  # type: ignore[override]
        """``sig`` (default SIGTERM); (exit code, seconds until the process was gone)."""
        t0 = self.send(sig)
        rc = self.wait_exit(timeout_s)
        return rc, time.monotonic() - t0

    def exit_within(self, timeout_s: float) -> tuple[int, float]:
        """(exit code, seconds since the process started) once it exits by itself."""
        rc = self.wait_exit(timeout_s)
        return rc, time.monotonic() - self.started


def committed(bs: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (0 where none), from a fresh client."""
    c = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False, request_timeout_ms=5000)
    try:
        out = {}
        for p in range(partitions):
            v = c.committed(TopicPartition(topic, p), timeout_ms=5000)
            out[p] = int(v) if v is not None else 0
        return out
    finally:
        c.close()


def drained(bs: str, prefix: str, ends: dict[int, int]) -> Callable[[], bool]:
    def cond() -> bool:
        try:
            return committed(bs, f"{prefix}-main", f"{prefix}.raw", len(ends)) == ends
        except Exception:  # the broker is restarting or stalled
            return False
    return cond


def audit(bs: str, prefix: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``stream-anon audit`` as a user runs it."""
    return subprocess.run([sys.executable, "-m", "stream_anon", "audit", "--bootstrap-servers", bs,
                           *topic_flags(prefix), *extra], capture_output=True, text=True, timeout=600,
                          env=child_env())


def record_figures(scenario: str, broker: str, **figures: Any) -> None:
    """Print one scenario's figures (``-s``) and append them to ``.cache/issue18-figures.jsonl`` (gitignored)."""
    row = {"scenario": scenario, "broker": broker, **figures}
    print(f"\nFIGURES {json.dumps(row)}")
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    with open(FIGURES, "a") as f:
        f.write(json.dumps(row) + "\n")


def outcome(bs: str, prefix: str, ends: dict[int, int], *, k: int, l: int | None = 2) -> dict[str, Any]:  # noqa: E741
    """From the ledger and the output topics: input offsets not accounted (``lost``), accounted twice or published
    twice (``duplicated``), published classes below k or with fewer than l distinct incomes (``k_violations``),
    and the snapshot itself."""
    from stream_anon.core.schema import adult_schema
    from stream_anon.service.audit import collect_outputs

    s = adult_schema()
    snap = collect_outputs(bs, input_topic=f"{prefix}.raw", anon=f"{prefix}.anon", suppressed=f"{prefix}.suppressed",
                           dlq=f"{prefix}.dlq", qis=[a.name for a in s.qis], sensitive=[a.name for a in s.sensitive],
                           input_ends=ends)
    acc = snap.accounting
    dup_out = sum(len(c.duplicated) for c in snap.published.values())
    pub = snap.public
    sizes = pub.groupby("class_id").size() if len(pub) else []
    distinct = pub.groupby("class_id")["income"].nunique() if len(pub) else []
    violations = int(sum(n < k for n in sizes)) + (int(sum(d < l for d in distinct)) if l else 0)
    return {"lost": len(acc.missing) + sum(len(c.missing) for c in snap.published.values()),
            "duplicated": len(acc.duplicates) + dup_out, "k_violations": violations, "snapshot": snap}


@dataclass
class Broker:
    """A broker a test may freeze: its name (tansu, apache-kafka), bootstrap servers, freeze and thaw."""

    name: str
    bootstrap_servers: str
    freeze: Callable[[], None]
    thaw: Callable[[], None]


@pytest.fixture(params=["tansu", "apache-kafka"])
def own_broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker]:
    """A broker of the test's own (it gets frozen): Tansu, or one Apache Kafka node."""
    if request.param == "tansu":
        with EmbeddedBroker(log_path=tmp_path / "tansu.log") as b:
            yield Broker("tansu", b.bootstrap_servers, b.freeze, b.thaw)
        return
    from apache_kafka_support import start_cluster
    cluster = start_cluster(tmp_path / "kafka", 1)
    stack = contextlib.ExitStack()
    try:
        yield Broker("apache-kafka", cluster.bootstrap_servers, lambda: stack.enter_context(cluster.frozen(1)),
                     stack.close)
    finally:
        stack.close()
        cluster.stop(timeout_s=15)


