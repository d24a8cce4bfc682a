"""Cluster faults on a three-broker Apache Kafka cluster (KRaft, replication factor 3, ``min.insync.replicas=2``,
unclean leader election off), through the real ``stream-anon run`` process with its side paths on, all of ADULT
replayed while the faults happen (issue 17 item 3):

(a) ``kill -9`` of the broker that leads every partition of the input, ledger and outputs, three times mid-replay
    (each node once: it is made the leader of them all first, by a preferred-leader election), restarting it each
    time;
(b) a rolling restart of all three brokers (SIGTERM: controlled shutdown; progress without it; start, replicas back
    in sync; the next);
(c) one broker down for longer than the consumer session timeout: the group's coordinator, also made the leader
    of every main-path partition, frozen (SIGSTOP: it neither answers nor closes its connections) for at least
    twice the session timeout, with committed progress measured twice while it is down (after the freeze, and again
    after twice the session timeout);
(d) ``kill -9`` of the service during a leader election, twice: at the same moment as a ``kill -9`` of the leader of
    every main-path partition (the controller fences it and elects new leaders over the next seconds), and while a
    preferred-leader election moves them all to another node; a new service starts at once each time.

Each scenario: every input offset accounted exactly once (``stream-anon audit`` OK), nothing lost, nothing published
twice on the anon topic (nor on suppressed/dlq), every class >= k, >= l and within the t-closeness default by the
independent verifier (with coverage of the originals through the ledger's record ids), the service never exits
before it is told to and stops with 0, and no side copy twice (the side paths are at most once by design).

Time to committed progress after a fault: from the fault until the group's committed offset of every input partition
is past that partition's end at the fault (every record acknowledged before the fault is anonymized, published and
committed, which needs records after it: CASTLE holds up to delta).  Printed per scenario (``-s``) with the other
figures (``FIGURES {...}`` lines; docs/deploy.md, "Cluster faults").

The topics are the service's own: it creates them (replication factor 3 and ``min.insync.replicas`` 2 by default on
a cluster of three, ``topics.replication_factor`` unset), checked here.  The replay's producer (librdkafka) is
idempotent with ``acks=all``; the replay holds a little past each fault's trigger point until the fault is injected,
so every fault falls in the middle of the stream however fast or slow the machine is; when the input's producer
acknowledged again after each fault is recorded beside the progress.  One cluster serves the module (starting three
JVMs costs ~10-40 s): each scenario has its own topics and groups, and every node runs and is thawed before and
after each.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from apache_kafka_support import KafkaCluster, ServiceProcess, start_cluster
from kafka import KafkaAdminClient, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaError
from kafka_service_support import adult_rows, audit, topic_flags
from waiting import wait_for

from stream_anon.config.settings import Config
from stream_anon.core.datasets import read_adult
from stream_anon.core.schema import adult_schema
from stream_anon.core.verify import verify_release_frame
from stream_anon.formats.decoding import CONTROL_FLUSH, CONTROL_HEADER
from stream_anon.kafka_io.reader import PartitionReader
from stream_anon.kafka_io.settings import KafkaSettings
from stream_anon.service.audit import collect_outputs, read_topic_with_headers

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 2
SESSION_TIMEOUT_MS = 6000
CHUNK = 1000  # replay chunk: each acknowledged before the next
AHEAD = 3000  # records the replay sends past a fault's trigger point before it holds (> partitions x delta)
OK_LINE = "OK: every input offset accounted exactly once, every promised output published exactly once"
FIGURES: list[dict[str, Any]] = []


def until(what: str, cond: Callable[[], object], service: ServiceProcess | None, timeout_s: float,
          interval_s: float = 0.2) -> None:
    """:func:`waiting.wait_for`, failing at once (with the service's log) when ``service`` exits."""
    wait_for(cond, timeout_s, what, interval=interval_s, alive=service.assert_alive if service else None,
             context=service.text if service else None)


# ------------------------------------------------------------------------------------------------ the cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes shared by this module's scenarios (each restores every node when it ends)."""
    c = start_cluster(tmp_path_factory.mktemp("cluster-faults"), 3)
    try:
        yield c
    finally:
        c.stop(timeout_s=15)
        if FIGURES:
            print("\ncluster faults (Apache Kafka, 3 nodes):")
            for row in FIGURES:
                print(f"  FIGURES {json.dumps(row)}")


def restore(c: KafkaCluster) -> None:
    """Every node thawed and running, all registered."""
    for i, node in c.members.items():
        c.thaw(i)
        if not node.alive():
            c.start_node(i)
    c.wait_registered(list(c.members), 120)


@pytest.fixture
def healthy(cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    restore(cluster)
    yield cluster
    restore(cluster)


def admin(c: KafkaCluster) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=c.bootstrap_servers, request_timeout_ms=10000)


def lead_all(c: KafkaCluster, node: int, topics: Sequence[str]) -> None:
    """Make ``node`` the leader of every partition of ``topics``: it becomes the first (preferred) replica of
    each (a reassignment to the same replicas in another order moves no data), then a preferred-leader election."""
    a = admin(c)
    try:
        moves = {TopicPartition(d["name"], p["partition_index"]):
                 [node, *(r for r in p["replica_nodes"] if r != node)]
                 for d in a.describe_topics(list(topics)) for p in d["partitions"]}
        a.alter_partition_reassignments(moves)
        until("the reassignment done", lambda: not a.list_partition_reassignments(), None, 60)
        a.elect_leaders(0, {t: list(range(PARTITIONS)) for t in topics}, raise_errors=False)
    finally:
        a.close()
    until(f"node {node} leading {list(topics)}",
          lambda: all(p["leader"] == node for t in topics for p in c.describe(t)), None, 60)


def coordinator_of(c: KafkaCluster, group: str) -> int:
    """The node coordinating consumer group ``group``."""
    from confluent_kafka.admin import AdminClient
    a = AdminClient({"bootstrap.servers": c.bootstrap_servers})
    desc = a.describe_consumer_groups([group])[group].result(timeout=30)
    return int(desc.coordinator.id)


def topic_settings(c: KafkaCluster, topics: Sequence[str]) -> dict[str, tuple[int, str]]:
    """topic -> (replication factor, min.insync.replicas)."""
    a = admin(c)
    try:
        rf = {d["name"]: len(d["partitions"][0]["replica_nodes"]) for d in a.describe_topics(list(topics))}
        res = a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        a.close()
    configs = res["topic"] if isinstance(res, dict) else {}
    return {t: (rf[t], str(configs.get(t, {}).get("min.insync.replicas", {}).get("value"))) for t in topics}


# ------------------------------------------------------------------------------------------------ one scenario
def committed(bs: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets (0 where none) from a fresh librdkafka client that joins no group, every
    request bounded by 5 s.  (A fresh kafka-python consumer timed out for 30-60 s in a row while a frozen node's
    group coordination moved, long after the service had committed: it measured itself, not the service.)"""
    import confluent_kafka
    c = confluent_kafka.Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False,
                                  "socket.timeout.ms": 5000, "logger": logging.getLogger("committed-reader")})
    try:
        got = c.committed([confluent_kafka.TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
        if any(tp.error is not None for tp in got):
            raise RuntimeError([tp.error for tp in got if tp.error is not None])
        return {tp.partition: max(0, int(tp.offset)) for tp in got}
    finally:
        c.close()


class Replay(threading.Thread):
    """All of ADULT into the input in acknowledged chunks, as a user's producer on a replicated cluster sends it
    (librdkafka: idempotent, ``acks=all``, every request bounded by a 5 s timeout; key = the record id, JSON value),
    then the end-of-stream markers.  Before the records past gate ``i`` it waits until fault ``i`` is injected
    (``release(i)``).  ``acked_at``: when each chunk was acknowledged (so a figure can tell the input's own
    resumption from the service's)."""

    def __init__(self, bs: str, topic: str, rows: list[dict[str, Any]], gates: Sequence[int]) -> None:
        super().__init__(name="replay", daemon=True)
        self.bs, self.topic, self.rows, self.gates = bs, topic, rows, list(gates)
        self.released = [threading.Event() for _ in gates]
        self.counts: dict[int, int] = {}
        self.acked_at: list[float] = []  # monotonic time of each chunk's acknowledgement
        self.failure: BaseException | None = None
        self.done = threading.Event()

    def release(self, i: int) -> None:
        self.released[i].set()

    def acknowledged(self) -> dict[int, int]:
        """Records acknowledged so far per partition (the partition's end offset, records only)."""
        counts = dict(self.counts)
        return {p: counts.get(p, 0) for p in range(PARTITIONS)}

    def resumed_after(self, t0: float) -> float | None:
        """Seconds from ``t0`` until the first chunk acknowledged after it (None: none yet)."""
        return next((round(t - t0, 1) for t in self.acked_at if t > t0), None)

    def _send(self, producer: Any, items: Sequence[tuple[bytes | None, bytes, list[tuple[str, bytes]], int | None]],
              ) -> dict[int, int]:
        """Produce ``items`` (key, value, headers, partition) and wait for every delivery; partition -> count."""
        delivered: dict[int, int] = {}
        failed: list[Any] = []

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                failed.append(err)
            else:
                delivered[msg.partition()] = delivered.get(msg.partition(), 0) + 1

        for key, value, headers, partition in items:
            kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
            while True:
                try:
                    producer.produce(self.topic, value=value, key=key, headers=headers, on_delivery=report, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
        remaining = producer.flush(300)
        assert remaining == 0 and not failed, (remaining, failed[:3])
        return delivered

    def run(self) -> None:
        import confluent_kafka
        producer = confluent_kafka.Producer({
            "bootstrap.servers": self.bs, "acks": "all", "enable.idempotence": True, "linger.ms": 5,
            "request.timeout.ms": 5000, "socket.timeout.ms": 5000, "message.timeout.ms": 300000,
            "partitioner": "murmur2_random"})
        try:
            for i in range(0, len(self.rows), CHUNK):
                for g, ev in zip(self.gates, self.released, strict=True):
                    if i >= g and not ev.wait(900):
                        raise TimeoutError(f"fault gate at record {g} never released")
                chunk = self.rows[i:i + CHUNK]
                got = self._send(producer, [(str(r["id"]).encode(), json.dumps(r).encode(), [], None)
                                            for r in chunk])
                assert sum(got.values()) == len(chunk), got
                counts = dict(self.counts)
                for p, n in got.items():
                    counts[p] = counts.get(p, 0) + n
                self.counts = counts  # replaced whole: readers see one consistent snapshot
                self.acked_at.append(time.monotonic())
            self._send(producer, [(None, b"", [(CONTROL_HEADER, CONTROL_FLUSH)], p) for p in range(PARTITIONS)])
        except BaseException as e:  # reported by the test
            self.failure = e
        finally:
            self.done.set()

    def ends(self) -> dict[int, int]:
        return {p: n + 1 for p, n in self.acknowledged().items()}  # + one end-of-stream marker


@dataclass
class Scenario:
    """One fault scenario: its own topics and groups, the service process(es), the replay, the figures."""

    name: str
    cluster: KafkaCluster
    tmp_path: Path
    rows: list[dict[str, Any]]
    triggers: list[float]  # fractions of ADULT committed at which the faults happen
    prefix: str = ""
    services: list[ServiceProcess] = field(default_factory=list)
    progress_s: list[float] = field(default_factory=list)
    input_resumed_s: list[float | None] = field(default_factory=list)  # the input producer's first ack after a fault
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.started = time.monotonic()
        self.prefix = f"cf{self.name[:1]}{uuid.uuid4().hex[:6]}"
        self.bs = self.cluster.bootstrap_servers
        self.group, self.input = f"{self.prefix}-main", f"{self.prefix}.raw"
        n = len(self.rows)
        self.replay = Replay(self.bs, self.input, self.rows, [int(f * n) + AHEAD for f in self.triggers])

    @property
    def main_topics(self) -> list[str]:
        return [self.input, f"{self.input}.ledger", *(f"{self.prefix}.{r}" for r in ("anon", "suppressed", "dlq"))]

    @property
    def side_topics(self) -> list[str]:
        return [f"{self.prefix}.{r}" for r in ("krr", "rs", "blap", "estimates")] + [f"{self.input}.side-budget"]

    @property
    def service(self) -> ServiceProcess:
        return self.services[-1]

    def cmd(self) -> list[str]:
        # every anonymization and topic option is the service's default (k, delta, l, t-closeness, replication)
        # but the topic names
        return [sys.executable, "-m", "stream_anon", "--log-level", "INFO", "run", "--bootstrap-servers", self.bs,
                *topic_flags(self.prefix), "--group-id", self.group, "--partitions", str(PARTITIONS), "--seed", "3",
                "--metrics-port", "0", "--set", "service.side_metrics_port=0",
                "--set", f"kafka.session_timeout_ms={SESSION_TIMEOUT_MS}", "--set", "kafka.max_poll_interval_ms=20000",
                "--set", "kafka.request_timeout_ms=5000", "--set", "kafka.retry_backoff_max_seconds=2",
                "--set", "kafka.startup_retry_seconds=120", "--set", "service.commit_interval_ms=250",
                "--set", "service.producer_recovery_seconds=10", "--set", "kafka.max_poll_records=500"]

    def start_service(self) -> ServiceProcess:
        s = ServiceProcess(self.cmd(), self.tmp_path / f"service-{len(self.services)}.log")
        self.services.append(s)
        return s

    def committed(self) -> dict[int, int]:
        return committed(self.bs, self.group, self.input)

    def committed_total(self) -> int:
        try:
            return sum(self.committed().values())
        except Exception:  # a broker is down or electing: not yet
            return -1

    def start(self) -> None:
        """The service up (main path assigned both partitions, side paths consuming), its topics in sync."""
        s = self.start_service()
        until("the main path assigned both partitions and the side paths consuming",
              lambda: f"assigned partitions {list(range(PARTITIONS))}" in s.text()
              and "side paths: consuming" in s.text(), s, 180)
        self.cluster.wait_in_sync(self.main_topics + self.side_topics, 120)
        self.replay.start()

    def before_fault(self, i: int) -> None:
        """Wait until fault ``i``'s share of ADULT is committed."""
        target = self.triggers[i] * len(self.rows)
        until(f"{self.triggers[i]:.0%} of ADULT committed", lambda: self.committed_total() >= target,
              self.service, 300)
        assert self.replay.failure is None, self.replay.failure

    def progressed(self, point: dict[int, int], t0: float, what: str) -> float:
        """Seconds from ``t0`` (the fault) until every input partition's committed offset is past ``point`` (its
        end at the fault); recorded."""
        trace: list[str] = []  # what the committed offsets did meanwhile: changes and unreadable spans
        last: list[Any] = [None]

        def moved() -> bool:
            t = f"{time.monotonic() - t0:.1f}"
            try:
                now = self.committed()
            except Exception as e:
                if last[0] != type(e).__name__:
                    trace.append(f"{t}s {type(e).__name__}")
                last[0] = type(e).__name__
                return False
            if last[0] != now:
                trace.append(f"{t}s {sum(now.values())}")
            last[0] = now
            return all(now[p] > point[p] for p in range(PARTITIONS))

        until(f"committed progress on every partition past {point} after {what}", moved, self.service, 300)
        took = round(time.monotonic() - t0, 1)
        self.progress_s.append(took)
        self.input_resumed_s.append(self.replay.resumed_after(t0))
        print(f"\n{self.name}: {what}: committed progress after {took:.1f} s (the input's producer had its first "
              f"acknowledgement after {self.input_resumed_s[-1]} s; input end {sum(point.values())} at the fault; "
              f"committed total then: {', '.join(trace)})")
        return took

    def finish(self) -> dict[str, Any]:
        """The replay ended, both groups at the ends, the service stopped (exit 0); audit and every check.
        Returns the figures."""
        svc = self.service
        until("the replay done", self.replay.done.is_set, svc, 600)
        assert self.replay.failure is None, self.replay.failure
        ends = self.replay.ends()
        side_group = f"{self.group}-ldp"

        def at_ends() -> bool:
            try:
                return self.committed() == ends == committed(self.bs, side_group, self.input)
            except Exception:
                return False

        until(f"the main and side groups committed to {ends}", at_ends, svc, 300)
        for s in self.services[:-1]:
            assert s.proc.poll() is not None  # only the killed ones ended
        rc = svc.stop(timeout_s=90)
        assert rc == 0, svc.text()[-5000:]
        assert "Traceback" not in svc.text(), svc.text()[-5000:]
        res = audit(self.bs, self.prefix)
        assert res.returncode == 0 and OK_LINE in res.stdout, res.stdout + res.stderr
        assert f"(total {len(self.rows) + PARTITIONS:,})" in res.stdout, res.stdout
        return self.check(ends)

    def check(self, ends: dict[int, int]) -> dict[str, Any]:
        schema = adult_schema()
        qis = [a.name for a in schema.qis]
        sensitive = schema.sensitive[0].name
        snap = collect_outputs(self.bs, input_topic=self.input, anon=f"{self.prefix}.anon",
                               suppressed=f"{self.prefix}.suppressed", dlq=f"{self.prefix}.dlq", qis=qis,
                               sensitive=[a.name for a in schema.sensitive], input_ends=ends)
        acc, out = snap.accounting, snap.records
        lost = len(acc.missing) + sum(len(c.missing) for c in snap.published.values())
        duplicated = len(acc.duplicates) + sum(len(c.duplicated) for c in snap.published.values())
        records = out[out.outcome != "control"]
        ids_twice = int(records.record_id.duplicated().sum())
        released = records[records.outcome == "released"]
        cfg = Config.load(env={}, overrides={"topics.input": self.input})
        a = cfg.anonymization
        req = a.requirement(schema)
        assert req is not None and req.t is not None and a.l is not None  # the default: l = 2 plus t-closeness
        public = verify_release_frame(snap.public, qis, a.k, int(a.l), sensitive, record_id=None, schema=schema,
                                      requirement=req, references=snap.references)
        original = pd.DataFrame(self.rows)
        coverage = verify_release_frame(released[["record_id", "class_id", *qis]].astype({"record_id": str}), qis,
                                        a.k, schema=schema, original=original, original_id="id")
        side = {}
        for role in ("krr", "rs", "blap"):
            keys = [m.key for m in read_topic_with_headers(self.bs, f"{self.prefix}.{role}", timeout_s=60)]
            side[role] = (len(keys), len(keys) - len(set(keys)))
        settings = topic_settings(self.cluster, self.main_topics + self.side_topics)
        counts = public.violation_counts
        figures = {"scenario": self.name, "records_in": len(self.rows), "accounted": acc.accounted - snap.control,
                   "lost": lost, "duplicated": duplicated + ids_twice,
                   "anon_duplicated": len(snap.published["anon"].duplicated),
                   "k_violations": counts.get("class below k", 0), "l_violations": counts.get("class below l", 0),
                   "t_violations": counts.get("class not t-close", 0), "classes": snap.classes,
                   "released": len(released), "suppressed": int((records.outcome == "suppressed").sum()),
                   "min_class": public.min_class_size, "progress_s": self.progress_s,
                   "input_resumed_s": self.input_resumed_s,
                   "side_copies": {r: n for r, (n, _) in side.items()}, "services": len(self.services),
                   "wall_s": round(time.monotonic() - self.started, 1), "notes": self.notes}
        FIGURES.append(figures)
        print(f"\nFIGURES {json.dumps(figures)}")
        assert all(v == (3, "2") for v in settings.values()), settings  # the service's topics: RF 3, min ISR 2
        assert snap.ok, (acc.duplicates[:5], acc.missing[:5], snap.published, snap.problems[:5])
        assert lost == 0 and duplicated == 0 and ids_twice == 0
        assert len(records) == len(self.rows) and set(records.record_id) == {r["id"] for r in self.rows}
        assert public.ok and public.min_class_size >= a.k and public.records == len(released), str(public)
        assert coverage.ok, str(coverage)
        assert all(twice == 0 for _, twice in side.values()), side  # at most once per record
        return figures


@pytest.fixture(scope="module")
def adult(adult_path: Path) -> list[dict[str, Any]]:
    return adult_rows(read_adult(adult_path))


# ------------------------------------------------------------------------------------------------ the scenarios
@pytest.mark.timeout(900)
def test_a_leader_of_everything_killed_three_times_mid_replay(healthy: KafkaCluster, adult: list[dict[str, Any]],
                                                               tmp_path: Path) -> None:
    sc = Scenario("a-leader-kill-x3", healthy, tmp_path, adult, [0.15, 0.4, 0.65])
    sc.start()
    for i, victim in enumerate((1, 2, 3)):
        lead_all(healthy, victim, sc.main_topics)
        sc.before_fault(i)
        assert all(p["leader"] == victim for t in sc.main_topics for p in healthy.describe(t))
        point = sc.replay.acknowledged()
        healthy.kill(victim)
        t0 = time.monotonic()
        sc.replay.release(i)
        took = sc.progressed(point, t0, f"kill -9 of node {victim}")
        up = healthy.start_node(victim)
        healthy.wait_in_sync(sc.main_topics + sc.side_topics, 180)
        sc.notes.append(f"node {victim} killed: progress {took:.1f} s after the kill; restarted in {up:.1f} s")
        sc.service.assert_alive()
    sc.finish()


@pytest.mark.timeout(900)
def test_b_rolling_restart_of_all_three_brokers_during_the_replay(healthy: KafkaCluster,
                                                                 adult: list[dict[str, Any]], tmp_path: Path) -> None:
    sc = Scenario("b-rolling-restart", healthy, tmp_path, adult, [0.15, 0.4, 0.65])
    sc.start()
    for i, node in enumerate((1, 2, 3)):
        sc.before_fault(i)
        point = sc.replay.acknowledged()
        t0 = time.monotonic()
        healthy.stop_node(node)  # SIGTERM: controlled shutdown (its leaderships move first)
        down = time.monotonic() - t0
        sc.replay.release(i)
        took = sc.progressed(point, t0, f"the stop of node {node}")
        up = healthy.start_node(node)
        healthy.wait_in_sync(sc.main_topics + sc.side_topics, 180)
        sc.notes.append(f"node {node}: stopped in {down:.1f} s, progress {took:.1f} s after the stop, up again in "
                        f"{up:.1f} s")
        sc.service.assert_alive()
    sc.finish()


@pytest.mark.timeout(900)
def test_c_one_broker_down_longer_than_the_session_timeout(healthy: KafkaCluster, adult: list[dict[str, Any]],
                                                           tmp_path: Path) -> None:
    sc = Scenario("c-down-past-session-timeout", healthy, tmp_path, adult, [0.25, 0.55])
    sc.start()
    victim = coordinator_of(healthy, sc.group)
    lead_all(healthy, victim, sc.main_topics)
    sc.before_fault(0)
    min_down = 2 * SESSION_TIMEOUT_MS / 1000
    point = sc.replay.acknowledged()
    healthy.freeze(victim)
    t0 = time.monotonic()
    try:
        sc.replay.release(0)
        took = sc.progressed(point, t0, f"node {victim} (coordinator and leader) frozen")
        # still down past twice the session timeout (every session it held expired): new records, progress again
        until(f"node {victim} down {min_down:g} s", lambda: time.monotonic() - t0 >= min_down, sc.service, 60)
        again = sc.replay.acknowledged()
        t1 = time.monotonic()
        sc.replay.release(1)
        later = sc.progressed(again, t1, f"node {victim} down for {time.monotonic() - t0:.0f} s")
        down = time.monotonic() - t0
    finally:
        healthy.thaw(victim)
    healthy.wait_in_sync(sc.main_topics + sc.side_topics, 180)
    sc.notes.append(f"node {victim} (coordinator of the group, leader of the main topics) frozen {down:.1f} s "
                    f"(session timeout {SESSION_TIMEOUT_MS / 1000:g} s): progress {took:.1f} s after the freeze, and "
                    f"{later:.1f} s after new records {min_down:g} s into the outage")
    sc.finish()


@pytest.mark.timeout(900)
def test_d_the_service_killed_during_a_leader_election(healthy: KafkaCluster, adult: list[dict[str, Any]],
                                                       tmp_path: Path) -> None:
    sc = Scenario("d-service-kill-in-election", healthy, tmp_path, adult, [0.25, 0.55])
    sc.start()
    # 1. the leader of every main-path partition and the service, both kill -9 at once; a new service at once
    victim = 1
    lead_all(healthy, victim, sc.main_topics)
    sc.before_fault(0)
    point = sc.replay.acknowledged()
    healthy.kill(victim)
    sc.service.kill()
    t0 = time.monotonic()
    sc.start_service()
    sc.replay.release(0)
    took = sc.progressed(point, t0, "kill -9 of the service and of the leader")
    up = healthy.start_node(victim)
    healthy.wait_in_sync(sc.main_topics + sc.side_topics, 180)
    sc.notes.append(f"service + leader node {victim} killed together: progress {took:.1f} s later (new service); "
                    f"node back in {up:.1f} s")
    # 2. a preferred-leader election of every main-path partition from node 2 to node 3, the service killed while
    # it runs
    lead_all(healthy, 2, sc.main_topics)
    sc.before_fault(1)
    failed: list[BaseException] = []

    def elect() -> None:
        try:
            lead_all(healthy, 3, sc.main_topics)
        except BaseException as e:  # reported below
            failed.append(e)

    point = sc.replay.acknowledged()
    election = threading.Thread(target=elect, daemon=True)
    election.start()
    sc.service.kill()
    t0 = time.monotonic()
    sc.start_service()
    sc.replay.release(1)
    took = sc.progressed(point, t0, "kill -9 of the service during a preferred-leader election")
    election.join(120)
    assert not election.is_alive() and not failed, failed
    sc.notes.append(f"service killed during the election 2 -> 3: progress {took:.1f} s later (new service)")
    sc.finish()


@pytest.mark.timeout(300)
def test_a_long_lived_reader_follows_a_leader_election(healthy: KafkaCluster) -> None:
    """The recovery's partition reader (kafka-python) created before a preferred-leader election answers after it
    within seconds: kafka-python 3.0 refreshes no metadata on a ``NOT_LEADER_OR_FOLLOWER`` answer to ListOffsets,
    so without ``metadata_max_age_ms`` (kafka_io/clients.py) it asked the old leader for 5 min and the service's
    ledger scan failed all that time (scenario d, when the election fell into a recovery)."""
    topic = f"cfr{uuid.uuid4().hex[:6]}"
    a = admin(healthy)
    try:
        a.create_topics([NewTopic(topic, PARTITIONS, 3)])
    finally:
        a.close()
    healthy.wait_in_sync([topic], 60)
    reader = PartitionReader(KafkaSettings(bootstrap_servers=healthy.bootstrap_servers, request_timeout_ms=5000))
    try:
        assert reader.bounds(topic, 0) == (0, 0)
        old = healthy.leader_of(topic, 0)
        lead_all(healthy, old % 3 + 1, [topic])
        t0 = time.monotonic()
        wait_for(lambda: reader.ping(topic, 0, 5000) is None, 60, "the reader answered by the new leader",
                 retry_on=(KafkaError,))
        print(f"\nreader: answered {time.monotonic() - t0:.1f} s after the election moved {topic}[0] from node {old}")
    finally:
        reader.close()
