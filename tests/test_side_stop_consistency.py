"""A stop with the side paths on while the broker stalls (issue 18 item 4), through real ``stream-anon run``
processes, on Tansu and on Apache Kafka: the side-path process stops itself within the bound (never killed by the
service), the whole service stops within 10 s; after the broker thaws and the service is started again and drained,
every record has a copy on every side topic (krr, rs, blap) or on none, and no copy is published twice.

Before the side outbox, the stop left the last batch's copies on some side topics and not others (what the producer
had not yet written into the frozen broker's socket was purged at the stop: 500 copies of one poll batch missing on
one or two of the three topics in 2 of 3 runs).  Now each window's copies are written ahead to the internal
``<input>.side-outbox`` and completed at the next start (stream_anon/side/outbox.py); the test prints what the
stop left (``left by the stop``) and what the restart completed (``FIGURES``)."""

from __future__ import annotations

import re
import signal
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from reliability_support import Broker, ServiceProcess, committed, record_figures, service_cmd, wait_for

from stream_anon.core.datasets import read_adult
from stream_anon.replay.kafka_replay import read_topic, replay_records

SIDE = ("krr", "rs", "blap")
STOP_BOUND_SECONDS = 10.0
SECRET = "0123456789abcdef" * 4  # one pseudonym key across the two runs


def side_keys(bs: str, prefix: str) -> dict[str, list[bytes]]:
    return {t: [k for _, _, k, _ in read_topic(bs, f"{prefix}.{t}", idle_s=1.0)] for t in SIDE}


def broker_sockets_idle(port: int) -> bool:
    """No TCP socket of this host to or from ``port`` holds bytes not yet read by the broker or not yet
    acknowledged to the sender (/proc/net/tcp*: tx_queue and rx_queue): the stopped process's last requests,
    left in the frozen broker's socket, have been read by the thawed broker."""
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            local, remote, queues = f[1], f[2], f[4]
            if port in (int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)):
                tx, rx = (int(x, 16) for x in queues.split(":"))
                if tx or rx:
                    return False
    return True


def consistency(keys: dict[str, list[bytes]]) -> dict[str, Any]:
    counts = {t: Counter(v) for t, v in keys.items()}
    union = set().union(*counts.values())
    return {"copies": {t: len(v) for t, v in keys.items()},
            "duplicated": {t: sum(n - 1 for n in c.values() if n > 1) for t, c in counts.items()},
            "missing_on_a_topic": {t: len(union - set(c)) for t, c in counts.items()},
            "records": len(union)}


def main_recovered(log_text: str, main_committed: dict[int, int], ends: dict[int, int]) -> bool:
    """Every partition recovered by the main path (its "starting at offset" line), or wholly committed before."""
    return all(f"partition {p}: starting at offset" in log_text or main_committed[p] >= end for p, end in ends.items())


def restart_and_drain(cmd: list[str], bs: str, prefix: str, ends: dict[int, int],
                      tmp_path: Path) -> tuple[dict[str, Any], str | None]:
    """Start the service again, wait until the side group consumed every record, stop it cleanly (every open
    window is released); the side topics' consistency and the recovery's line."""
    with ServiceProcess(cmd, tmp_path / "run2.log") as svc2:
        wait_for("side paths ready again", lambda: "side paths: consuming" in svc2.text(), svc2, 180)
        wait_for("the side paths consumed every record",
                 lambda: committed(bs, f"{prefix}-main-ldp", f"{prefix}.raw", len(ends)) == ends, svc2, 300,
                 interval_s=1.0)
        # and the main path recovered its partitions: a stop during a recovery is exit 3 by design
        # (test_service_stop_states.py), and the side paths may have committed everything before the first stop
        wait_for("the main path recovered every partition with records left", lambda: main_recovered(svc2.text(), (
            committed(bs, f"{prefix}-main", f"{prefix}.raw", len(ends))), ends), svc2, 180, interval_s=0.5)
        rc2, _ = svc2.stop()  # a clean stop releases every open window
    text2 = svc2.text()
    assert rc2 == 0, text2[-4000:]
    assert "Traceback" not in text2, text2[-4000:]
    mark = committed(bs, f"stream-anon-side-outbox.{prefix}.raw", f"{prefix}.raw.side-outbox", 1)[0]
    assert mark > 0, "the outbox read mark was not committed after the start's recovery"
    recovered = re.search(r"(\d+) write-ahead entries pending from the last run: (\d+) messages, (\d+) found on "
                          r"their side topics, (\d+) sent again", text2)
    after = consistency(side_keys(bs, prefix))
    line = recovered.group(0) if recovered else None
    print(f"after the restart: {after}; recovery: {line or 'nothing pending'}")
    return after, line


def adult_rows(adult_path: Path) -> list[dict[str, Any]]:
    adult = read_adult(adult_path).head(30000)
    return [dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row), strict=True))
            for row in adult.itertuples(index=False, name=None)]


def side_cmd(bs: str, prefix: str) -> list[str]:
    sides = [x for t in SIDE for x in ("--set", f"topics.{t}={prefix}.{t}")]
    return service_cmd(bs, prefix, "--set", f"topics.estimates={prefix}.estimates",
                       "--set", f"topics.kmeans={prefix}.kmeans", *sides, "--set", "side_paths.pseudonyms=true",
                       "--set", "service.side_paths_mode=process", "--set", "kafka.max_poll_records=500",
                       "--set", f"release.secret={SECRET}", side_paths=True)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stop_during_a_stall_leaves_the_side_topics_consistent(own_broker: Broker, adult_path: Path,
                                                               tmp_path: Path) -> None:
    rows = adult_rows(adult_path)
    prefix = f"ssc{uuid.uuid4().hex[:6]}"
    bs = own_broker.bootstrap_servers
    port = int(bs.split(",")[0].rsplit(":", 1)[1])
    cmd = side_cmd(bs, prefix)
    with ServiceProcess(cmd, tmp_path / "run.log") as svc:
        wait_for("side paths ready", lambda: "side paths: consuming" in svc.text(), svc, 180)
        stats = replay_records(rows, f"{prefix}.raw", bs, partitions=2)
        wait_for("side copies flowing", lambda: len(read_topic(bs, f"{prefix}.krr", idle_s=0.2)) > 3000, svc, 180)
        own_broker.freeze()
        try:
            t0 = svc.send(signal.SIGTERM)
            rc = svc.wait_exit(STOP_BOUND_SECONDS + 60)
            seconds = time.monotonic() - t0
        finally:
            own_broker.thaw()
    text = svc.text()
    assert seconds <= STOP_BOUND_SECONDS, (seconds, text[-4000:])
    assert rc in (0, 3), text[-4000:]
    assert "did not stop within" not in text and "did not finish within" not in text, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    wait_for("the broker read what the stopped process left in its sockets", lambda: broker_sockets_idle(port),
             None, 60)
    left = consistency(side_keys(bs, prefix))
    print(f"\nSIGTERM during a stall ({own_broker.name}): {seconds:.1f} s, exit {rc}; left by the stop: {left}")

    after, recovered = restart_and_drain(cmd, bs, prefix, stats.partition_counts, tmp_path)
    record_figures("SIGTERM during a broker stall, side paths on, then a restart", own_broker.name,
                   records_in=len(rows), stop_s=round(seconds, 1), exit=rc, left_by_the_stop=left,
                   after_restart=after, recovery=recovered)
    assert after["duplicated"] == {t: 0 for t in SIDE}, after  # no copy twice
    assert after["missing_on_a_topic"] == {t: 0 for t in SIDE}, after  # every record on all three or none
    # the restart went on with the records after the stop (none when the side paths had taken the whole input before
    # it: the windows open at the stop are gone on every topic alike)
    assert after["records"] >= left["records"]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_kill_9_while_copies_flow_leaves_the_side_topics_consistent_after_a_restart(
        own_broker: Broker, adult_path: Path, tmp_path: Path) -> None:
    """``kill -9`` of the service (its side-path process dies with it) while windows of copies are being sent;
    the restart completes what the outbox holds: every record on all three side topics or none, none twice."""
    rows = adult_rows(adult_path)
    prefix = f"ssk{uuid.uuid4().hex[:6]}"
    bs = own_broker.bootstrap_servers
    cmd = side_cmd(bs, prefix)
    with ServiceProcess(cmd, tmp_path / "run.log") as svc:
        wait_for("side paths ready", lambda: "side paths: consuming" in svc.text(), svc, 180)
        stats = replay_records(rows, f"{prefix}.raw", bs, partitions=2)
        wait_for("side copies flowing", lambda: len(read_topic(bs, f"{prefix}.krr", idle_s=0.2)) > 3000, svc, 180)
        svc.kill()
    port = int(bs.split(",")[0].rsplit(":", 1)[1])
    wait_for("the broker read what the killed process left in its sockets", lambda: broker_sockets_idle(port),
             None, 60)
    left = consistency(side_keys(bs, prefix))
    print(f"\nkill -9 with the side paths on ({own_broker.name}): left by the kill: {left}")
    after, recovered = restart_and_drain(cmd, bs, prefix, stats.partition_counts, tmp_path)
    record_figures("kill -9 while side copies flow, then a restart", own_broker.name, records_in=len(rows),
                   left_by_the_kill=left, after_restart=after, recovery=recovered)
    assert after["duplicated"] == {t: 0 for t in SIDE}, after
    assert after["missing_on_a_topic"] == {t: 0 for t in SIDE}, after
    assert after["records"] >= left["records"]  # (equal when the side paths had taken the whole input before the kill)
