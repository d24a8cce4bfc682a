"""Where side copies land, and when: ADULT through a real ``stream-anon run`` (issue 19 item 3 figures).

    python scripts/side_position_probe.py [--records N] [--rate R] [--passes P] [--no-pseudonyms]
                                          [--code DIR] [--set SECTION.FIELD=VALUE ...]

Starts an embedded Tansu broker, then ``python -m stream_anon run`` from ``--code`` (default: this checkout; give
another checkout to measure it, e.g. an older version) on it, replays the first N ADULT records ``--passes`` times
(the same record ids each pass) at ``--rate`` records/s (0: as fast as possible) over 2 partitions, with the
end-of-stream markers, waits until the side group has read everything, stops the service (SIGTERM) and reads the
side topics back.  Prints, per per-record topic: copies per record (by pseudonym), the share of copies at their
record's input offset (same partition) and within +-10, beside what a uniform shuffle of each window gives
(windows = runs of one timestamp; meaningful only for a version that mixes), the window sizes, and the input-to-copy
latency (copy timestamp - input timestamp) p50 / p99 / max.  With ``--no-pseudonyms`` copies cannot be joined to
records: window sizes and latency only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from stream_anon.core.datasets import iter_records, read_adult
from stream_anon.formats.release import Pseudonymizer
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.replay.kafka_replay import replay_records, send_end_of_stream
from stream_anon.service.audit import read_topic_with_headers
from stream_anon.service.linkage import offset_linkage, offset_windows

PARTITIONS = 2
SECRET = "side-position-probe-secret-0123456789"
ROLES = ("anon", "suppressed", "dlq", "krr", "rs", "blap", "estimates", "kmeans")


def committed(bs: str, group: str, topic: str) -> dict[int, int]:
    c = KafkaConsumer(bootstrap_servers=bs, group_id=group, enable_auto_commit=False)
    try:
        return {p: int(c.committed(TopicPartition(topic, p)) or 0) for p in range(PARTITIONS)}
    finally:
        c.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=32561)
    ap.add_argument("--rate", type=float, default=0.0)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--no-pseudonyms", action="store_true")
    ap.add_argument("--code", default=str(Path(__file__).resolve().parents[1]), help="checkout to run the service from")
    ap.add_argument("--set", action="append", default=[], help="extra service options")
    ap.add_argument("--log", default="side-position-probe.log")
    args = ap.parse_args()
    records = list(iter_records(read_adult(os.environ.get("STREAM_ANON_ADULT"))))[: args.records]
    tag = "probe" + uuid.uuid4().hex[:6]
    topics = {r: f"{tag}.{r}" for r in ROLES}
    with EmbeddedBroker() as broker:
        bs = broker.bootstrap_servers
        admin = KafkaAdminClient(bootstrap_servers=bs)
        admin.create_topics([NewTopic(f"{tag}.raw", PARTITIONS, 1)])
        admin.close()
        sets = [f"kafka.group_id=g-{tag}", f"topics.input={tag}.raw", f"topics.partitions={PARTITIONS}",
                f"release.secret={SECRET}", "service.side_metrics_port=0",
                *[f"topics.{r}={t}" for r, t in topics.items()], *args.set]
        if args.no_pseudonyms:
            sets.append("side_paths.pseudonyms=false")
        cmd = [sys.executable, "-m", "stream_anon", "run", "--bootstrap-servers", bs, "--metrics-port", "0",
               *[a for s in sets for a in ("--set", s)]]
        env = {**os.environ, "PYTHONPATH": args.code}
        log = Path(args.log)
        proc = subprocess.Popen(cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)  # noqa: SIM115
        try:
            deadline = time.monotonic() + 120
            while "side paths: consuming" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            # warm-up: the side group has joined and read these before the measured records are sent
            warm = [{**r, "id": f"warmup-{i}"} for i, r in enumerate(records[:20])]
            wstats = replay_records(warm, f"{tag}.raw", bs, partitions=PARTITIONS, create_topic=False)
            group = f"g-{tag}-ldp"
            while committed(bs, group, f"{tag}.raw") != {p: wstats.partition_counts.get(p, 0)
                                                          for p in range(PARTITIONS)}:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            t0 = time.time()
            stats = replay_records(records, f"{tag}.raw", bs, rate=args.rate, partitions=PARTITIONS,
                                   create_topic=False)
            for p, n in wstats.partition_counts.items():
                stats.partition_counts[p] = stats.partition_counts.get(p, 0) + n
            for _ in range(args.passes - 1):  # the same ids again
                stats2 = replay_records(records, f"{tag}.raw", bs, rate=args.rate, partitions=PARTITIONS,
                                        create_topic=False)
                for p, n in stats2.partition_counts.items():
                    stats.partition_counts[p] = stats.partition_counts.get(p, 0) + n
            producer = KafkaProducer(bootstrap_servers=bs, acks="all")
            send_end_of_stream(producer, f"{tag}.raw")
            producer.close()
            ends = {p: stats.partition_counts.get(p, 0) + 1 for p in range(PARTITIONS)}
            while committed(bs, group, f"{tag}.raw") != ends:
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(0.5)
            replay_s = time.time() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(60)
        inputs = read_topic_with_headers(bs, f"{tag}.raw", timeout_s=60)
        pseudonym = Pseudonymizer(SECRET.encode())
        where: dict[bytes, list[tuple[int, int, int]]] = {}
        arrival: dict[tuple[int, int], int] = {}
        for m in inputs:
            if m.value:
                where.setdefault(pseudonym(json.loads(m.value)["id"]).encode(), []).append(
                    (m.partition, m.offset, m.timestamp))
                arrival[(m.partition, m.offset)] = m.timestamp
        out: dict[str, Any] = {"records": len(records), "passes": args.passes, "rate": args.rate, "exit": rc,
                               "seconds": round(replay_s, 1), "code": args.code, "sets": args.set}
        for role in ("krr", "rs", "blap"):
            msgs = read_topic_with_headers(bs, topics[role], timeout_s=60)
            warm = {pseudonym(f"warmup-{i}").encode() for i in range(20)}  # in the windows; not in the figures
            windows = offset_windows([m.partition for m in msgs], [m.offset for m in msgs],
                                     [m.timestamp for m in msgs])
            sizes = [len(w) for w in windows]
            res: dict[str, Any] = {"copies": len(msgs), "windows": len(windows),
                                   "window_sizes": [min(sizes, default=0), int(np.median(sizes)) if sizes else 0,
                                                    max(sizes, default=0)],
                                   "alone": sum(1 for s in sizes if s == 1)}
            if not args.no_pseudonyms:
                per = Counter(m.key for m in msgs if m.key not in warm)
                res["copies_per_record"] = dict(Counter(per.values()))
                first = [where[m.key][0] for m in msgs]  # the record's first arrival
                res["same_offset"] = sum(1 for m, (p, o, _t) in zip(msgs, first, strict=True)
                                         if m.partition == p and m.offset == o)
                res["within_10"] = sum(1 for m, (p, o, _t) in zip(msgs, first, strict=True)
                                       if m.partition == p and abs(m.offset - o) <= 10)
                eq = offset_linkage(windows, [m.offset for m in msgs], [o for _p, o, _t in first])
                near = offset_linkage(windows, [m.offset for m in msgs], [o for _p, o, _t in first], distance=10)
                res["null_same_offset"] = [round(eq.expected, 1), round(float(np.sqrt(eq.variance)), 1)]
                res["null_within_10"] = [round(near.expected, 1), round(float(np.sqrt(near.variance)), 1)]
                lat = np.array([m.timestamp - t for m, (_p, _o, t) in zip(msgs, first, strict=True)
                                if m.key not in warm], dtype=float)
            else:
                lat = np.array([m.timestamp - arrival[(m.partition, m.offset)] for m in msgs
                                if (m.partition, m.offset) in arrival], dtype=float)
                res["note"] = "latency against the input record at the same offset (windows: same block)"
            if lat.size:
                res["latency_ms"] = {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                     "max": float(lat.max())}
            out[role] = res
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
