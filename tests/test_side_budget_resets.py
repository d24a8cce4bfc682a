"""Side-path budgets belong to the data and fail closed, through the real service (``stream-anon run`` processes on
Tansu and on Apache Kafka; issue 19 items 1 and 2).

The same input is served by successive ``stream-anon run`` processes, each after one operator action that used to
reset the budgets (before: 11 k-means windows published under ``kmeans.total_epsilon = 3``, every record
re-perturbed by a new consumer group):

* a new side consumer group: starts (the budget is keyed by the input topic), publishes no k-means window and no
  copy (every record has spent its lifetime cap);
* ``side_paths.budget_topic`` pointed elsewhere, a tombstone on the k-means key, the budget topic deleted: refused
  at start with one ERROR line naming ``--new-budget``, exit code 2;
* ``--new-budget``: starts, with a WARNING, and the head of the budget records the new generation.

A double replay (every record twice in the input) publishes one copy per record per topic (the lifetime cap), and so
does a second consumer group reading it again.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.service.audit import read_topic_with_headers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

N = 3000
PARTITIONS = 2
SECRET = "side-budget-reset-test-secret-0123"
ROLES = ("anon", "suppressed", "dlq", "krr", "rs", "blap", "estimates", "kmeans")


class Deployment:
    """One input topic and its topics; ``run(...)`` starts ``stream-anon run`` on it."""

    def __init__(self, bootstrap: str, tmp: Path) -> None:
        self.bs = bootstrap
        self.tmp = tmp
        self.tag = "br" + uuid.uuid4().hex[:6]
        self.input = f"{self.tag}.raw"
        self.topics = {r: f"{self.tag}.{r}" for r in ROLES}
        self.budget_topic = f"{self.input}.side-budget"
        self.runs = 0

    def run(self, *extra: str) -> tuple[subprocess.Popen[bytes], Path]:
        self.runs += 1
        log = self.tmp / f"run{self.runs}.log"
        cmd = [sys.executable, "-m", "stream_anon", "--log-level", "INFO", "run", "--bootstrap-servers", self.bs,
               "--metrics-port", "0", "--set", "service.side_metrics_port=0", "--set", "kafka.session_timeout_ms=6000",
               "--set", f"kafka.group_id=g-{self.tag}", "--set", f"topics.input={self.input}",
               "--set", f"topics.partitions={PARTITIONS}", "--set", f"release.secret={SECRET}",
               *[a for r, t in self.topics.items() for a in ("--set", f"topics.{r}={t}")],
               # a record spends 1.4 + 1.0 + one k-means window of 1.0 = 3.4 (lifetime cap 4): one pass
               "--set", "side_paths.blap.enabled=false", "--set", "side_paths.kmeans.window=500",
               "--set", "side_paths.kmeans.epsilon=1.0", "--set", "side_paths.kmeans.total_epsilon=3",
               "--set", "side_paths.mixing.seconds=1", *extra]
        return subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT), log  # noqa: SIM115

    def produce(self, records: list[dict[str, Any]]) -> dict[int, int]:
        """The records, then one end-of-stream control per partition; returns partition -> end offset."""
        p = KafkaProducer(bootstrap_servers=self.bs, acks="all")
        admin = KafkaAdminClient(bootstrap_servers=self.bs)
        try:
            if self.input not in admin.list_topics():
                admin.create_topics([NewTopic(self.input, PARTITIONS, 1)])
        finally:
            admin.close()
        for i, r in enumerate(records):
            p.send(self.input, json.dumps(r).encode(), key=str(r["id"]).encode(), partition=i % PARTITIONS)
        for part in range(PARTITIONS):
            p.send(self.input, b"", partition=part, headers=[(CONTROL_HEADER, CONTROL_FLUSH)])
        p.flush()
        p.close()
        # (counted, not asked: Tansu's ListOffsets answers are not reliable)
        return {q: len(range(q, len(records), PARTITIONS)) + 1 for q in range(PARTITIONS)}

    def committed(self, group: str) -> dict[int, int]:
        c = KafkaConsumer(bootstrap_servers=self.bs, group_id=group, enable_auto_commit=False)
        try:
            return {q: int(c.committed(TopicPartition(self.input, q)) or 0) for q in range(PARTITIONS)}
        finally:
            c.close()

    def serve_until_read(self, group: str, ends: dict[int, int], *extra: str) -> str:
        """A run that must start: wait until ``group`` committed every input offset, stop it (SIGTERM), exit 0."""
        proc, log = self.run(*extra)
        deadline = time.monotonic() + 300
        try:
            while "side paths: consuming" not in log.read_text() or self.committed(group) != ends:
                assert proc.poll() is None, log.read_text()[-4000:]
                assert time.monotonic() < deadline, (self.committed(group), ends, _notable(log))
                time.sleep(0.25)
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(60)
        text = log.read_text()
        assert rc == 0, text[-4000:]
        return text

    def refused(self, *extra: str) -> str:
        """A run that must be refused: it ends by itself with exit code 2 and one ERROR line (returned)."""
        proc, log = self.run(*extra)
        try:
            rc = proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(f"not refused: {log.read_text()[-4000:]}") from None
        text = log.read_text()
        errors = [line for line in text.splitlines() if re.search(r"\bERROR\b", line)]
        assert rc == 2 and len(errors) == 1, (rc, errors, text[-4000:])
        assert "--new-budget" in errors[0]
        return errors[0]

    def read(self, role: str) -> list[Any]:
        return read_topic_with_headers(self.bs, self.topics[role], timeout_s=30)


def _notable(log: Path) -> str:
    """The log's WARNING / ERROR lines and those of the side paths (what a failed wait needs)."""
    return "\n".join(line for line in log.read_text().splitlines()
                     if " WARNING " in line or " ERROR " in line or "side paths" in line)[-6000:]


@pytest.fixture(scope="module")
def records(adult_path: Path) -> list[dict[str, Any]]:
    return list(iter_records(read_adult(adult_path)))[:N]


def _copies_per_record(dep: Deployment) -> dict[str, Counter[int]]:
    """topic -> how many records have 1, 2, ... copies (by pseudonym)."""
    return {role: Counter(Counter(m.key for m in dep.read(role)).values()) for role in ("krr", "rs")}


@pytest.mark.timeout(900)
def test_operator_actions_cannot_reset_the_budgets(any_broker: Any, records: list[dict[str, Any]],
                                                   tmp_path: Path) -> None:
    dep = Deployment(any_broker.bootstrap_servers, tmp_path)
    ends = dep.produce(records)
    side_group = f"g-{dep.tag}-ldp"
    text = dep.serve_until_read(side_group, ends)
    assert "first start: new budget of input" in text
    windows = [json.loads(m.value)["window"] for m in dep.read("kmeans")]
    assert sorted(windows) == [0, 1, 2]  # 3 x 1.0 of 3; windows 3..5 refused

    # 1. another side consumer group: reads every record again, the budget (of the input) refuses them all
    text = dep.serve_until_read("other-side-group", ends, "--set", "side_paths.group_id=other-side-group")
    assert f"budget of input '{dep.input}' restored" in text
    assert re.search(r"side paths: \d+ record\(s\) so far got no side output", text)
    assert f"'skipped': {{'person_budget': {N}}}" in text  # every record refused, counted (the metric's reason)

    # 2. the budget topic pointed elsewhere: refused (the anchor shows a budget)
    line = dep.refused("--set", f"side_paths.budget_topic={dep.tag}.elsewhere-budget")
    assert "no budget state for input" in line and "anchor (consumer group" in line

    # 3. a tombstone on the k-means key: refused, naming the key
    p = KafkaProducer(bootstrap_servers=dep.bs, acks="all")
    p.send(dep.budget_topic, key=f"{dep.input}/kmeans".encode(), value=None, partition=0)
    p.flush()
    p.close()
    line = dep.refused()
    assert f"key '{dep.input}/kmeans' is missing (deleted or tombstoned)" in line

    # 4. the budget topic deleted (the service recreates it empty): refused
    admin = KafkaAdminClient(bootstrap_servers=dep.bs)
    admin.delete_topics([dep.budget_topic])
    deadline = time.monotonic() + 30
    while dep.budget_topic in admin.list_topics():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    admin.close()
    line = dep.refused()
    assert "no budget state for input" in line and "deleted, tombstoned or written to another budget topic" in line

    # 5. a new budget, deliberately: a WARNING, recorded in the budget topic's head (the side group has read
    #    everything already, so nothing is perturbed again)
    text = dep.serve_until_read(side_group, ends, "--new-budget")
    warnings = [line for line in text.splitlines() if "WARNING" in line and "NEW budget" in line]
    assert len(warnings) == 1 and "generation 2" in warnings[0]
    head = json.loads([m.value for m in read_topic_with_headers(dep.bs, dep.budget_topic, timeout_s=30)
                       if m.key == f"{dep.input}/head".encode()][-1])
    assert head["generation"] == 2 and head["history"][-1]["how"].startswith("--new-budget: ")

    windows = [json.loads(m.value)["window"] for m in dep.read("kmeans")]
    copies = _copies_per_record(dep)
    print(f"\nbudget resets: k-means windows published under kmeans.total_epsilon=3 over a first run, a group "
          f"change, a moved budget topic, a tombstone, a deleted budget topic and --new-budget: {len(windows)} "
          f"(ids {sorted(windows)}); copies per record {dict(copies)}")
    assert sorted(windows) == [0, 1, 2]
    assert copies == {"krr": Counter({1: N}), "rs": Counter({1: N})}


@pytest.mark.timeout(600)
def test_a_double_replay_publishes_no_copy_beyond_the_lifetime_cap(any_broker: Any, records: list[dict[str, Any]],
                                                                   tmp_path: Path) -> None:
    dep = Deployment(any_broker.bootstrap_servers, tmp_path)
    ends = dep.produce(records + records)  # the same record ids twice
    text = dep.serve_until_read(f"g-{dep.tag}-ldp", ends)
    assert f"'skipped': {{'person_budget': {N}}}" in text
    assert _copies_per_record(dep) == {"krr": Counter({1: N}), "rs": Counter({1: N})}
    # a second group reading both passes again adds nothing
    dep.serve_until_read("again", ends, "--set", "side_paths.group_id=again")
    assert _copies_per_record(dep) == {"krr": Counter({1: N}), "rs": Counter({1: N})}
