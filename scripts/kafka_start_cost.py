#!/usr/bin/env python3
"""What one Apache Kafka node costs on this machine, per JVM profile (scripts/apache_kafka.py): CPU seconds of the
storage format and of the node until ready, seconds until ready, CPU over 30 s idle and over 20,000 records
produced (librdkafka, ``acks=all``) and consumed.  Prints one line per profile; nothing else may run meanwhile.

    python scripts/kafka_start_cost.py                  # server and light, each with the class-data archive
    python scripts/kafka_start_cost.py --no-class-data  # the same without it
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

from stream_anon.bench.service import process_cpu_seconds as cpu_seconds

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apache_kafka import JVM_PROFILES, KafkaCluster  # noqa: E402

RECORDS = 20_000
IDLE_S = 30.0


def produce_and_consume(bootstrap: str) -> None:
    """:data:`RECORDS` records of 200 bytes produced (idempotent, ``acks=all``), then consumed from the start."""
    from confluent_kafka import Consumer, Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", "enable.idempotence": True})
    for i in range(RECORDS):
        p.produce("cost", b"x" * 200)
        if i % 1000 == 0:
            p.poll(0)
    if p.flush(60):
        raise RuntimeError("records not acknowledged within 60 s")
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "cost", "auto.offset.reset": "earliest"})
    c.subscribe(["cost"])
    got = 0
    while got < RECORDS:
        got += len(c.consume(1000, 1.0))
    c.close()


def measure(profile: str, class_data: bool) -> str:
    with tempfile.TemporaryDirectory(prefix="kafka-cost-") as tmp:
        node = KafkaCluster(Path(tmp), nodes=1, jvm=profile, class_data=class_data)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        node.start()
        ready_s = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        fmt = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime  # the format tool (exited)
        pid = node.members[1].pid
        assert pid is not None
        try:
            at_ready = cpu_seconds(pid)
            time.sleep(IDLE_S)  # the measurement itself: CPU of an idle node over this time
            idle = cpu_seconds(pid) - at_ready
            c0 = cpu_seconds(pid)
            produce_and_consume(node.bootstrap_servers)
            work = cpu_seconds(pid) - c0
        finally:
            node.stop(timeout_s=30)
        archive = "with the class-data archive" if node.archive is not None else "without class-data archive"
        return (f"{profile:6s} ({archive}): format {fmt:.1f} s CPU; ready in {ready_s:.1f} s after "
                f"{at_ready:.1f} s CPU; idle {IDLE_S:.0f} s: {idle:.2f} s CPU; {RECORDS:,} records produced and "
                f"consumed: {work:.1f} s CPU")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-class-data", action="store_true", help="start without the class-data archive")
    ap.add_argument("--profiles", nargs="+", default=sorted(JVM_PROFILES), choices=sorted(JVM_PROFILES))
    args = ap.parse_args()
    for profile in args.profiles:
        print(measure(profile, not args.no_class_data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
