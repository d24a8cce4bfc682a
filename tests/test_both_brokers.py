"""Two integration tests of the service run on both brokers, Tansu and Apache Kafka, with the same assertions
(issue 17 item 2: the pattern the other integration tests follow, through ``any_broker`` / ``restartable_broker``
from ``tests/apache_kafka_support.py``).

- ``stream-anon run`` + ``replay_tools kafka`` (ADULT, end-of-stream markers) + ``stream-anon audit``: every input
  offset accounted once, every promised output published once, k and l verified independently.
- The broker killed (``kill -9``) and restarted twice on its storage while the service drains a backlog: the
  service keeps running, exactly once, k verified.  (The shared Tansu broker keeps its data in memory, so this one
  runs on a broker of its own that keeps it: Tansu on durable storage, one Apache Kafka node.)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from apache_kafka_support import ServiceProcess, TestBroker, wait_for
from durable_broker import child_env
from kafka_service_support import (
    PARTITIONS,
    K,
    L,
    adult_rows,
    audit,
    check_release,
    committed_total,
    drained,
    end_markers,
    service_cmd,
)

from stream_anon.core.datasets import read_adult
from stream_anon.replay.kafka_replay import replay_records
from stream_anon.service.audit import partition_ends


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_run_replay_and_audit(any_broker: TestBroker, adult_path: Path, tmp_path: Path) -> None:
    bs = any_broker.bootstrap_servers
    prefix = f"bb{any_broker.name[:1]}{uuid.uuid4().hex[:6]}"
    n = 3000
    with ServiceProcess(service_cmd(bs, prefix), tmp_path / "service.log") as service:
        wait_for("the service subscribed", lambda: "main path: consuming" in service.text(), service, 120)
        replay = subprocess.run([sys.executable, "-m", "replay_tools", "kafka", "--adult", str(adult_path),
                                 "--limit", str(n), "--topic", f"{prefix}.raw", "--bootstrap-servers", bs,
                                 "--partitions", str(PARTITIONS), "--rate", "0", "--no-progress"],
                                capture_output=True, text=True, timeout=120, env=child_env())
        assert replay.returncode == 0, replay.stderr
        assert f"replayed {n:,} records" in replay.stdout or f"replayed {n} records" in replay.stdout, replay.stdout
        ends = partition_ends(bs, f"{prefix}.raw")
        assert sum(ends.values()) == n + PARTITIONS  # + one end-of-stream marker per partition
        waited = wait_for("every partition drained", lambda: drained(bs, f"{prefix}-main", f"{prefix}.raw", ends),
                          service, 180)
        assert service.stop() == 0, service.text()[-5000:]
    res = audit(bs, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK: every input offset accounted exactly once, every promised output published exactly once" in res.stdout
    assert f"(total {n + PARTITIONS:,})" in res.stdout
    adult = read_adult(adult_path).head(n)
    snap = check_release(bs, prefix, ends, adult)
    print(f"\n{any_broker.name}: {n} ADULT records through stream-anon run, drained {waited:.1f} s after the replay; "
          f"audit OK; {snap.classes} classes, k = {K}, l = {L} verified")


def broker_settled(text: str) -> bool:
    """The service's log says the broker answers again after its last silence, and producers it had to close were
    created anew."""
    silent, back = text.rfind("not answering for"), text.rfind("answering again")
    closing, created = text.rfind("must be closed and created anew"), text.rfind("producers created anew")
    return (silent < 0 or back > silent) and (closing < 0 or created > closing)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_broker_kill_9_twice_under_the_running_service(restartable_broker: TestBroker, adult_path: Path,
                                                       tmp_path: Path) -> None:
    broker = restartable_broker
    bs = broker.bootstrap_servers
    prefix = f"bk{broker.name[:1]}{uuid.uuid4().hex[:6]}"
    group, topic = f"{prefix}-main", f"{prefix}.raw"
    adult = read_adult(adult_path).head(8000)
    rows = adult_rows(adult)
    stats = replay_records(rows, topic, bs, partitions=PARTITIONS)
    assert stats.records_acked == len(rows)
    end_markers(bs, topic)
    ends = {p: stats.partition_counts.get(p, 0) + 1 for p in range(PARTITIONS)}
    figures = []
    with ServiceProcess(service_cmd(bs, prefix, ("--set", "kafka.max_poll_records=500", "--set", "release.tick_seconds=1")),
                        tmp_path / "service.log") as service:
        wait_for("the service subscribed", lambda: "main path: consuming" in service.text(), service, 120)
        for fraction in (0.3, 0.65):
            wait_for(f"{fraction:.0%} committed", lambda f=fraction: committed_total(bs, group, topic) >= f * len(rows),
                     service, 240)
            before = committed_total(bs, group, topic)
            up = broker.restart()  # kill -9, start again on the same storage
            t0 = time.monotonic()
            # progress, or nothing left to progress to (everything was committed before the fault)
            wait_for("progress after the restart", lambda b=before: committed_total(bs, group, topic) > b
                     or b >= sum(ends.values()), service, 240)
            figures.append((before, round(up, 2), round(time.monotonic() - t0, 1)))
        # one more end marker per partition: the service writes (ledger, commit) after the last restart even when
        # that restart came after everything was committed (a fast run), so a clean stop finds its producers working
        end_markers(bs, topic)
        ends = {p: end + 1 for p, end in ends.items()}
        wait_for("every partition drained", lambda: drained(bs, group, topic, ends), service, 300)
        wait_for("the service answered by the broker again", lambda: broker_settled(service.text()), service, 240)
        assert service.stop() == 0, service.text()[-5000:]
        text = service.text()
    res = audit(bs, prefix)
    assert res.returncode == 0, res.stdout + res.stderr
    snap = check_release(bs, prefix, ends, adult, markers=2)
    print(f"\n{broker.name}: broker kill -9 x2 under the running service: {len(snap.records)} records accounted once; "
          f"(committed before, broker up s, committed progress again s) = {figures}; producers recreated "
          f"{text.count('producers created anew')} time(s)")


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_demo_against_the_broker_given(any_broker: TestBroker, tmp_path: Path) -> None:
    """``stream-anon demo --bootstrap-servers`` (issue 17 item 7): the demo's whole path (service, side paths,
    replay, wait, verification, summary) against a broker it did not start, Tansu or Apache Kafka."""
    bs = any_broker.bootstrap_servers
    prefix = f"dm{any_broker.name[:1]}{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / "run"
    n = 2000
    out = subprocess.run([sys.executable, "-m", "stream_anon", "demo", "--bootstrap-servers", bs, "--synthetic",
                          "--records", str(n), "--input-topic", f"{prefix}.raw", "--group-id", f"{prefix}-main",
                          "--run-dir", str(run_dir), "--metrics-port", "0", "--set", "service.side_metrics_port=0",
                          "--seed", "5"], capture_output=True, text=True, timeout=280, env=child_env())
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    assert "stream-anon demo summary" in out.stdout and "VERIFIED" in out.stdout, out.stdout[-4000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["synthetic"] is True and s["records_in"] == n
    assert s["records_released"] + s["records_suppressed"] + s["records_dead_lettered"] == n
    assert s["records_unaccounted"] == 0 and s["records_duplicated"] == 0
    assert s["accounting"]["ok"] and all(s["accounting"]["published_exactly_once"].values())
    assert s["k_anonymity"]["verified"] and s["k_anonymity"]["min_class_size"] >= 10
    side = s["side_paths"]
    assert side and side["error"] is None and side["published"][f"{prefix}.krr"] == n
    print(f"\n{any_broker.name}: demo --bootstrap-servers: {n} synthetic records, {s['records_released']} released, "
          f"audit and k verified")
