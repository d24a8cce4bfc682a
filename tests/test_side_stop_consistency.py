"""A stop with the side paths on while the broker stalls (issue 18 item 4), through the real ``stream-anon run``
process: the side-path process stops itself within the bound (never killed by the service: before, it was killed at
its 8 s deadline), the whole service stops within 10 s, and no side copy is published twice.

Measured, not asserted: whether the side topics agree with each other (a record with a copy on every enabled side
topic or on none).  They do not always: what the producer had not yet written into the frozen broker's socket (its
receive buffer holds about 128 KiB on loopback) stays in the client's per-partition queues and is purged at the stop,
so the last batch before the stall can reach some side topics and not others (measured: 500 copies of one poll
batch missing on one or two of the three topics in 2 of 3 runs; docs/side-paths.md).  Closing that needs the side
paths to write each batch (or mixing window) ahead to their internal topic and complete it at the next start, as
the main path's ledger does: not done here."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from reliability_support import ServiceProcess, record_figures, service_cmd, wait_for

from stream_anon.core.datasets import read_adult
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.replay.kafka_replay import read_topic, replay_records

SIDE = ("krr", "rs", "blap")
STOP_BOUND_SECONDS = 10.0


def side_keys(bs: str, prefix: str) -> dict[str, list[bytes]]:
    return {t: [k for _, _, k, _ in read_topic(bs, f"{prefix}.{t}", idle_s=1.0)] for t in SIDE}


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stop_during_a_stall_leaves_the_side_topics_consistent(adult_path: Path, tmp_path: Path) -> None:
    adult = read_adult(adult_path).head(30000)
    rows: list[dict[str, Any]] = [dict(zip(adult.columns, (v.item() if hasattr(v, "item") else v for v in row),
                                           strict=True)) for row in adult.itertuples(index=False, name=None)]
    prefix = f"ssc{uuid.uuid4().hex[:6]}"
    sides = [x for t in SIDE for x in ("--set", f"topics.{t}={prefix}.{t}")]
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as b:
        bs = b.bootstrap_servers
        cmd = service_cmd(bs, prefix, "--set", f"topics.estimates={prefix}.estimates",
                          "--set", f"topics.kmeans={prefix}.kmeans", *sides, "--set", "side_paths.pseudonyms=true",
                          "--set", "service.side_paths_mode=process", "--set", "kafka.max_poll_records=500",
                          side_paths=True)
        with ServiceProcess(cmd, tmp_path / "run.log") as svc:
            wait_for("side paths ready", lambda: "side paths: consuming" in svc.text(), svc, 120)
            replay_records(rows, f"{prefix}.raw", bs, partitions=2)
            wait_for("side copies flowing", lambda: len(read_topic(bs, f"{prefix}.krr", idle_s=0.2)) > 3000, svc, 120)
            b.freeze()
            try:
                t0 = svc.send(signal.SIGTERM)
                rc = svc.wait_exit(STOP_BOUND_SECONDS + 60)
                seconds = time.monotonic() - t0
            finally:
                b.thaw()
        text = svc.text()
        assert seconds <= STOP_BOUND_SECONDS, (seconds, text[-4000:])
        assert rc in (0, 3), text[-4000:]
        assert "did not stop within" not in text and "did not finish within" not in text, text[-4000:]
        assert "Traceback" not in text, text[-4000:]
        time.sleep(2.0)  # (the thawed broker stores what was still in its socket buffers)
        keys = side_keys(bs, prefix)
    sets = {t: set(v) for t, v in keys.items()}
    union = set().union(*sets.values())
    missing = {t: len(union - s) for t, s in sets.items()}
    print(f"\nSIGTERM during a stall with the side paths on: {seconds:.1f} s, exit {rc}; copies per side topic "
          f"{ {t: len(v) for t, v in keys.items()} }; missing from a topic but on another: {missing}")
    record_figures("SIGTERM during a broker stall, side paths on", "tansu", records_in=len(rows),
                   side_copies={t: len(v) for t, v in keys.items()}, side_copies_missing_on_one_topic=missing,
                   exit=rc, stop_s=round(seconds, 1))
    assert all(len(v) == len(set(v)) for v in keys.values())  # no copy twice
