"""Test support for broker restarts: waiting on conditions, reading a topic back, child processes.

Used by tests/test_broker_durable.py and the issue-12 recovery tests (fixture ``durable_broker`` in conftest.py).
Run as a script it is one of two child processes (they run with this project on PYTHONPATH, see ``child_env``):

- ``python tests/durable_broker.py starter``: starts an ``EmbeddedBroker`` (memory) and a ``sleep`` in its own
  process group, prints one JSON line ``{"broker_pid", "sleeper_pid", "bootstrap_servers"}``, waits for SIGINT,
  prints ``interrupted``, waits for a line on stdin, stops the broker and exits 0.
- ``python tests/durable_broker.py produce BOOTSTRAP TOPIC COUNT ACKS_FILE``: sends values ``0..COUNT-1`` with an
  idempotent kafka-python producer (acks=all) and appends ``value partition offset`` to ``ACKS_FILE`` for each
  acknowledged record, flushed line by line (what a crash leaves in the file was acknowledged).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic

from stream_anon.kafka_io.broker import EmbeddedBroker

PROJECT_ROOT = Path(__file__).resolve().parents[1]

Record = tuple[int, int, bytes]  # partition, offset, value


def child_env() -> dict[str, str]:
    """The environment for child processes: this project first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PROJECT_ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def create_topic(bootstrap_servers: str, topic: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        admin.create_topics([NewTopic(topic, partitions, 1)])
    finally:
        admin.close()


def topic_info(bootstrap_servers: str, topic: str) -> tuple[str, int] | None:
    """``(topic id, partition count)`` from a metadata request that does not auto-create the topic."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        if topic not in admin.list_topics():
            return None
        described = admin.describe_topics([topic])[0]
        return str(described["topic_id"]), len(described["partitions"])
    finally:
        admin.close()


def committed_offsets(bootstrap_servers: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets for ``topic`` (partition -> offset), from the broker."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        offsets = admin.list_group_offsets({group: None}).get(group, {})
        return {tp.partition: int(om.offset) for tp, om in offsets.items() if tp.topic == topic}
    finally:
        admin.close()


def read_topic(bootstrap_servers: str, topic: str, partitions: int, timeout_s: float = 60.0) -> list[Record]:
    """Every record of ``topic`` as ``(partition, offset, value)``: read from offset 0 of each partition until the
    position reaches the highwater of the last fetch (Tansu's ``end_offsets`` cannot be trusted)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                             allow_auto_create_topics=False, fetch_max_wait_ms=100)
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, 0)
        out: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while True:
            for tp, recs in consumer.poll(200).items():
                out += [(tp.partition, r.offset, r.value) for r in recs]
            high = [consumer.highwater(tp) for tp in tps]
            if all(h is not None and consumer.position(tp) >= h for tp, h in zip(tps, high, strict=True)):
                return out
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: positions {[consumer.position(tp) for tp in tps]}, "
                                     f"highwater {high} after {timeout_s} s")
    finally:
        consumer.close()


def produce(bootstrap_servers: str, topic: str, values: Iterable[bytes], timeout_s: float = 60.0) -> list[Record]:
    """Send ``values`` (key = value) with a fresh idempotent producer, acks=all; returns what was acknowledged."""
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, enable_idempotence=True, acks="all", linger_ms=5)
    try:
        futures = [(v, producer.send(topic, key=v, value=v)) for v in values]
        producer.flush(timeout=timeout_s)
        out = []
        for v, f in futures:
            md = f.get(timeout=1)
            out.append((md.partition, md.offset, v))
        return out
    finally:
        producer.close(timeout=10)


def read_acks(path: Path) -> dict[bytes, tuple[int, int]]:
    """The ``value partition offset`` lines a ``produce`` child wrote (an unterminated last line is ignored)."""
    out: dict[bytes, tuple[int, int]] = {}
    if not path.exists():
        return out
    text = path.read_bytes()
    for line in text.split(b"\n")[:-1]:
        value, partition, offset = line.split()
        out[value] = (int(partition), int(offset))
    return out


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != b"Z"


def _starter() -> int:
    # Ctrl-C in a terminal meets Python's default handler; a suite started in the background by a non-interactive
    # shell (`... &`) inherits SIGINT *ignored*, which the sleeper below would inherit too (exec keeps SIG_IGN)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    broker = EmbeddedBroker().start()
    sleeper = subprocess.Popen(["sleep", "600"])  # same process group as this child: the control
    try:  # from the line on, so a SIGINT right after the test has read it is caught too
        print(json.dumps({"broker_pid": broker.pid, "sleeper_pid": sleeper.pid,
                          "bootstrap_servers": broker.bootstrap_servers}), flush=True)
        while True:
            signal.pause()
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    sys.stdin.readline()
    broker.stop()
    sleeper.wait()
    return 0


def _produce(bootstrap_servers: str, topic: str, count: int, acks_file: Path) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap_servers, enable_idempotence=True, acks="all", linger_ms=5)
    with open(acks_file, "ab", buffering=0) as out:
        def on_ack(value: bytes) -> Callable[[object], None]:
            def write(md: object) -> None:
                out.write(b"%s %d %d\n" % (value, md.partition, md.offset))  # type: ignore[attr-defined]
            return write

        for i in range(count):
            value = b"%d" % i
            producer.send(topic, key=value, value=value).add_callback(on_ack(value))
            if i % 200 == 199:
                time.sleep(0.02)  # a steady stream, a few thousand records/s
        producer.flush()
    producer.close()
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "starter":
        sys.exit(_starter())
    if sys.argv[1] == "produce":
        sys.exit(_produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])))
    sys.exit(f"unknown role {sys.argv[1]!r}")
