"""Topic loss ends in a clear state (issue 18 item 3), through the real ``stream-anon run`` process, on Tansu and on
Apache Kafka.

- The ledger deleted under the running service: exit 4 (the broker guard); then exit 4 again on **every** start,
  within seconds (the ledger holds no checkpoint under the group's committed offsets), never a loop of producer
  recreations; once the operator starts over (new group, new ledger and output topics) it runs and the audit is OK.
  (Before: the restart recreated the ledger, its producers failed on Tansu's poisoned topic and were created anew
  every ~62 s, forever.)
- The anon output topic deleted under the running service: exit 4, and exit 4 on every start (the recreated topic
  ends below the end the ledger's last checkpoint recorded) instead of carrying on without a word.
- An empty dead-letter topic deleted under the running service: nothing was lost, the service goes on (creates it
  again) and stops with 0; the audit is OK.  (Before: exit 4, "lost data this service had committed".)
- Apache Kafka only (Tansu has no CreatePartitions): partitions added to the input: exit 4 under the running service,
  then exit 2 at start with what to do (add partitions to the ledger); once done, it runs.

Figures (records in, lost, duplicated, k-violations, time to exit, stop time) are printed (``-s``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaAdminClient
from kafka.admin import NewPartitions
from kafka.errors import KafkaError, UnknownTopicOrPartitionError
from reliability_support import (
    ServiceProcess,
    audit,
    committed,
    drained,
    outcome,
    record_figures,
    wait_for,
)
from reliability_support import service_cmd as reliability_service_cmd

from stream_anon.core.datasets import read_adult
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.replay.kafka_replay import replay_records
from stream_anon.service.audit import send_flush_markers
from stream_anon.service.broker_guard import EXIT_DATA_LOSS

PARTITIONS = 2
BACKLOG = 6000
# a loss is confirmed by fresh reads for 1 s, not 10 (service.loss_confirm_seconds): the window is for a replicated
# cluster's new leader, and these brokers are single nodes whose leader never changes; every exit 4 here (one under
# the service and two at starts per test and broker) waited the full window, the deleted topic being really gone
LOSS_CONFIRM_SECONDS = 1


def service_cmd(bs: str, prefix: str, *extra: str) -> list[str]:
    return reliability_service_cmd(bs, prefix, "--set", f"service.loss_confirm_seconds={LOSS_CONFIRM_SECONDS}", *extra)
LOSS = "lost data this service had committed or acknowledged"


@pytest.fixture(params=["tansu", "apache-kafka"])
def bs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A broker the test may delete topics on: a Tansu of its own, or the session's Apache Kafka node."""
    if request.param == "tansu":
        with EmbeddedBroker(log_path=tmp_path / "tansu.log") as b:
            yield b.bootstrap_servers
    else:
        yield request.getfixturevalue("apache_kafka").bootstrap_servers


def rows(adult_path: Path, n: int) -> list[dict[str, Any]]:
    adult = read_adult(adult_path).head(n)
    return [dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
            for row in adult.itertuples(index=False, name=None)]


def delete_topic(bs: str, topic: str) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        admin.delete_topics([topic])
        deadline = time.monotonic() + 60
        while topic in set(admin.list_topics()):  # Apache Kafka deletes asynchronously
            assert time.monotonic() < deadline, f"{topic} still listed"
            time.sleep(0.2)
    finally:
        admin.close()


def start_with_backlog(bs: str, prefix: str, log: Path, adult_path: Path, *extra: str) -> ServiceProcess:
    """``BACKLOG`` ADULT records (no end marker), the service started, a third of them committed."""
    replay_records(rows(adult_path, BACKLOG), f"{prefix}.raw", bs, partitions=PARTITIONS)
    svc = ServiceProcess(service_cmd(bs, prefix, *extra), log)
    wait_for("progress committed", lambda: sum(committed(bs, f"{prefix}-main", f"{prefix}.raw", PARTITIONS).values())
             >= BACKLOG // 3, svc, 180)
    return svc


def expect_exit(svc: ServiceProcess, code: int, needle: str, timeout_s: float = 120) -> float:
    """The process ends by itself with ``code`` and a line holding ``needle``, no traceback; seconds it took
    since it started."""
    rc, seconds = svc.exit_within(timeout_s)
    text = svc.text()
    assert rc == code, text[-4000:]
    assert needle in text, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    return seconds


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_deleted_ledger_ends_every_start_with_exit_4_until_the_operator_acts(bs: str, adult_path: Path,
                                                                              tmp_path: Path,
                                                                              request: pytest.FixtureRequest) -> None:
    prefix = f"ldl{uuid.uuid4().hex[:6]}"
    svc = start_with_backlog(bs, prefix, tmp_path / "run.log", adult_path)
    t0 = time.monotonic()
    delete_topic(bs, f"{prefix}.raw.ledger")
    expect_exit(svc, EXIT_DATA_LOSS, "topic " + f"{prefix}.raw.ledger")
    first = time.monotonic() - t0
    starts = []
    for i in range(2):  # every start ends the same way, quickly, without recreating producers
        again = ServiceProcess(service_cmd(bs, prefix), tmp_path / f"restart{i}.log")
        starts.append(expect_exit(again, EXIT_DATA_LOSS, "holds no checkpoint, yet group"))
        assert "creating new ones" not in again.text()  # no producer recreation
    # the operator starts over: a new group, a new ledger and new output topics over the same input
    fresh = f"{prefix}.new"
    ends = {p: n + 1 for p, n in input_ends(bs, f"{prefix}.raw").items()}
    send_end_markers(bs, f"{prefix}.raw")
    cmd = service_cmd(bs, prefix, "--group-id", f"{fresh}-main", "--set", f"topics.ledger={fresh}.ledger",
                      *[x for role in ("anon", "suppressed", "dlq") for x in ("--set", f"topics.{role}={fresh}.{role}")])
    with ServiceProcess(cmd, tmp_path / "fresh.log") as svc2:
        wait_for("drained", lambda: committed(bs, f"{fresh}-main", f"{prefix}.raw", PARTITIONS) == ends, svc2, 300)
        rc, stop_s = svc2.stop()
    assert rc == 0, svc2.text()[-3000:]
    res = audit(bs, prefix, "--set", f"topics.ledger={fresh}.ledger",
                *[x for role in ("anon", "suppressed", "dlq") for x in ("--set", f"topics.{role}={fresh}.{role}")])
    assert res.returncode == 0, res.stdout + res.stderr
    record_figures("ledger topic deleted under the service", request.node.callspec.params["bs"], records_in=BACKLOG,
                   lost="all of the ledger (exit 4)", duplicated=0, k_violations=0, exit_s=round(first, 1),
                   restarts_exit_4_s=[round(s, 1) for s in starts], stop_s_after_starting_over=round(stop_s, 1))


def input_ends(bs: str, topic: str) -> dict[int, int]:
    """Partition -> end offset of ``topic`` (from a fetch)."""
    from stream_anon.service.audit import partition_ends
    return partition_ends(bs, topic)


def send_end_markers(bs: str, topic: str) -> None:
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bs)
    send_flush_markers(p, topic, list(range(PARTITIONS)))
    p.close()


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_deleted_output_topic_is_found_at_every_start(bs: str, adult_path: Path, tmp_path: Path,
                                                      request: pytest.FixtureRequest) -> None:
    prefix = f"odl{uuid.uuid4().hex[:6]}"
    svc = start_with_backlog(bs, prefix, tmp_path / "run.log", adult_path)
    t0 = time.monotonic()
    delete_topic(bs, f"{prefix}.anon")
    expect_exit(svc, EXIT_DATA_LOSS, f"topic {prefix}.anon")
    first = time.monotonic() - t0
    starts = []
    for i in range(2):
        again = ServiceProcess(service_cmd(bs, prefix), tmp_path / f"restart{i}.log")
        starts.append(expect_exit(again, EXIT_DATA_LOSS, "that the last checkpoint of ledger partition"))
        assert f"{prefix}.anon[" in again.text()
    record_figures("anon topic deleted under the service", request.node.callspec.params["bs"], records_in=BACKLOG,
                   lost="the anon topic's classes (exit 4)", duplicated=0, k_violations=0, exit_s=round(first, 1),
                   restarts_exit_4_s=[round(s, 1) for s in starts])


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_empty_dead_letter_topic_deleted_is_not_data_loss(bs: str, adult_path: Path, tmp_path: Path,
                                                             request: pytest.FixtureRequest) -> None:
    prefix = f"qdl{uuid.uuid4().hex[:6]}"
    svc = start_with_backlog(bs, prefix, tmp_path / "run.log", adult_path)
    with svc:
        delete_topic(bs, f"{prefix}.dlq")
        wait_for("the guard took the change", lambda: "this service had written nothing to it" in svc.text(), svc, 60)
        ends = {p: n + 1 for p, n in input_ends(bs, f"{prefix}.raw").items()}
        send_end_markers(bs, f"{prefix}.raw")
        waited = wait_for("drained", drained(bs, prefix, ends), svc, 300)
        rc, stop_s = svc.stop()
    text = svc.text()
    assert rc == 0 and LOSS not in text and "Traceback" not in text, text[-4000:]
    res = audit(bs, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    got = outcome(bs, prefix, ends, k=10, l=2)
    assert (got["lost"], got["duplicated"], got["k_violations"]) == (0, 0, 0)
    record_figures("empty dead-letter topic deleted under the service", request.node.callspec.params["bs"],
                   records_in=BACKLOG, lost=got["lost"], duplicated=got["duplicated"], k_violations=got["k_violations"],
                   exit="none (handled)", drained_s=round(waited, 1), stop_s=round(stop_s, 1))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_input_partitions_added_stop_the_start_until_the_ledger_has_as_many(apache_kafka: Any, adult_path: Path,
                                                                           tmp_path: Path) -> None:
    bs = apache_kafka.bootstrap_servers
    prefix = f"pcg{uuid.uuid4().hex[:6]}"
    svc = start_with_backlog(bs, prefix, tmp_path / "run.log", adult_path)
    admin = KafkaAdminClient(bootstrap_servers=bs)
    try:
        t0 = time.monotonic()
        admin.create_partitions({f"{prefix}.raw": NewPartitions(4)})
        expect_exit(svc, EXIT_DATA_LOSS, "partitions")
        first = time.monotonic() - t0
        again = ServiceProcess(service_cmd(bs, prefix), tmp_path / "restart.log")
        at_start = expect_exit(again, 2, "add partitions to the ledger")
        # the operator adds the partitions to the ledger: the service runs, drains, the audit is OK
        admin.create_partitions({f"{prefix}.raw.ledger": NewPartitions(4)})
    except (KafkaError, UnknownTopicOrPartitionError) as e:
        pytest.fail(f"CreatePartitions failed: {e!r}")
    finally:
        admin.close()
    more = rows(adult_path, BACKLOG + 2000)[BACKLOG:]
    replay_records(more, f"{prefix}.raw", bs)  # spread over the 4 partitions by key
    send_end_markers_n(bs, f"{prefix}.raw", 4)
    ends = input_ends(bs, f"{prefix}.raw")
    with ServiceProcess(service_cmd(bs, prefix), tmp_path / "after.log") as svc3:
        wait_for("drained", lambda: committed(bs, f"{prefix}-main", f"{prefix}.raw", 4) == ends, svc3, 300)
        rc, stop_s = svc3.stop()
    assert rc == 0, svc3.text()[-3000:]
    res = audit(bs, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    record_figures("input partitions 2 -> 4", "apache-kafka", records_in=BACKLOG + 2000, lost=0, duplicated=0,
                   k_violations=0, exit_s=round(first, 1), start_exit_2_s=round(at_start, 1),
                   stop_s=round(stop_s, 1))


def send_end_markers_n(bs: str, topic: str, n: int) -> None:
    from kafka import KafkaProducer
    p = KafkaProducer(bootstrap_servers=bs)
    send_flush_markers(p, topic, list(range(n)))
    p.close()
