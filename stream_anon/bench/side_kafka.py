"""Side paths through a real broker: kafka-python's raw per-send floor and the side app end to end on ADULT.

``python -m stream_anon.bench.side_kafka [--adult PATH] [--bootstrap-servers HOST:PORT] [--senders 0,3]``
(an embedded Tansu broker when no bootstrap servers are given).  Prints:

* the raw floor: one producer (the service's ``make_producer``: ``acks=all``, idempotent, ``linger_ms``,
  ``batch_size``) sending pre-encoded copies (a real ``adult.krr`` message, key = record id, header ``kind``) in a
  bare loop, with ``KafkaProducer.send`` and with the side sender's bulk append; messages/s and the equivalent
  records/s at 3 copies per record;
* end to end: all ADULT records produced to a fresh input topic (+ end-of-stream controls), then the side app
  (its own consumer group, in a thread of this process) with ``side_paths.sender_processes`` = each value of
  ``--senders``: records/s from the first consumed record until every copy and the 7 k-means windows are
  acknowledged.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from stream_anon.service.side_paths import SidePathConfig


def _config(bootstrap: str, tag: str, side: SidePathConfig) -> Any:
    from stream_anon.service.config import Config

    cfg = Config()
    cfg.kafka.bootstrap_servers = bootstrap
    cfg.kafka.group_id = f"g-{tag}"
    cfg.kafka.session_timeout_ms = 6000
    cfg.kafka.heartbeat_interval_ms = 1000
    for name in ("input", "anon", "krr", "rs", "blap", "estimates", "kmeans", "dlq", "suppressed"):
        setattr(cfg.topics, name, f"{tag}.{name}")
    cfg.side_paths = side
    return cfg


def raw_send_floor(bootstrap: str, n_messages: int = 97683, *, bulk: bool = False) -> dict[str, float]:
    """Messages/s of a bare loop sending one pre-encoded side copy ``n_messages`` times (distinct keys) until
    all are acknowledged; ``bulk``: through :class:`~stream_anon.service.side_app.SideSender` 's bulk append
    (what the side app uses) instead of ``KafkaProducer.send``."""
    from stream_anon.service.kafka_io import make_producer
    from stream_anon.service.side_app import SideSender

    cfg = _config(bootstrap, "raw" + uuid.uuid4().hex[:6], SidePathConfig())
    value = (b'{"id":"adult-00000","mechanism":"krr","values":{"sex":"Male","race":"White","marital-status":'
             b'"Separated","relationship":"Unmarried","workclass":"Never-worked"},"epsilon":{"sex":1.0,"race":1.0,'
             b'"marital-status":1.0,"relationship":1.0,"workclass":1.0},"epsilon_total":5.0,'
             b'"epsilon_all_side_topics":11.0}')
    keys: list[bytes | None] = [f"adult-{i:05d}".encode() for i in range(n_messages)]
    values = [value] * n_messages
    headers = [("kind", b"krr")]
    producer = make_producer(cfg)
    topic = cfg.topics.krr
    producer.partitions_for(topic)  # topic metadata (auto-created) before the clock starts
    try:
        t0 = time.perf_counter()
        if bulk:
            sender = SideSender(producer, cfg)
            for i in range(0, n_messages, 2000):
                sender.send_copies(topic, 0, keys[i:i + 2000], values[i:i + 2000], headers)
            sender.flush()
        else:
            send = producer.send
            futures = [send(topic, value=v, key=k, partition=0, headers=headers) for k, v in zip(keys, values, strict=True)]
            producer.flush()
            assert all(f.succeeded() for f in futures)
        seconds = time.perf_counter() - t0
    finally:
        producer.close()
    rate = n_messages / seconds
    print(f"raw send floor ({'bulk append' if bulk else 'KafkaProducer.send'}): {n_messages} messages in "
          f"{seconds:.2f} s = {rate:,.0f} messages/s = {rate / 3:,.0f} records/s at 3 copies per record")
    return {"messages": float(n_messages), "seconds": seconds, "messages_per_s": rate, "records_per_s": rate / 3}


def side_app_throughput(bootstrap: str, records: Sequence[dict[str, Any]], *, sender_processes: int = 3,
                        timeout_s: float = 300.0) -> dict[str, float]:
    """All ``records`` through the side app (truth tracker on, estimates every 5000 records, k-means windows of
    5000): records/s from the first consumed record until every copy and k-means window is acknowledged."""
    from kafka import KafkaProducer
    from prometheus_client import CollectorRegistry

    from stream_anon.service.metrics import ServiceMetrics
    from stream_anon.service.pipeline import CONTROL_FLUSH, CONTROL_HEADER
    from stream_anon.service.side_app import SideStatus, run_side_paths

    tag = "sk" + uuid.uuid4().hex[:6]
    side = SidePathConfig(truth=True, estimates_every_seconds=None, sender_processes=sender_processes)
    cfg = _config(bootstrap, tag, side)
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    for r in records:
        p.send(cfg.topics.input, key=str(r["id"]).encode(), value=json.dumps(r).encode())
    parts = sorted(p.partitions_for(cfg.topics.input))
    for part in parts:
        p.send(cfg.topics.input, value=b"", partition=part, headers=[(CONTROL_HEADER, CONTROL_FLUSH)])
    p.flush()
    p.close()
    status = SideStatus()
    stop = threading.Event()
    th = threading.Thread(target=run_side_paths, args=(cfg, ServiceMetrics(CollectorRegistry()), stop),
                          kwargs={"status": status}, daemon=True)
    th.start()
    n = len(records)
    windows = n // side.kmeans.window + (1 if n % side.kmeans.window >= side.kmeans.min_partial_window else 0)
    deadline = time.monotonic() + timeout_s
    try:
        while status.consumed == 0:
            if status.error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"side app did not start: {status.error}")
            time.sleep(0.005)
        t0 = time.perf_counter()
        while any(status.published.get(t, 0) < n for t in (cfg.topics.krr, cfg.topics.rs, cfg.topics.blap)) \
                or status.control < len(parts) or status.published.get(cfg.topics.kmeans, 0) < windows:
            if status.error is not None or time.monotonic() > deadline:
                raise RuntimeError(f"side app: {status.error or 'timeout'}; published {status.published}")
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
    finally:
        stop.set()
        th.join(30)
    rate = n / seconds
    print(f"side app end to end (sender_processes={sender_processes}): {n} records -> {3 * n} copies + "
          f"{status.published.get(cfg.topics.estimates, 0)} estimates + {status.published.get(cfg.topics.kmeans, 0)} "
          f"k-means windows in {seconds:.2f} s = {rate:,.0f} records/s ({3 * rate:,.0f} copies/s)")
    return {"records": float(n), "seconds": seconds, "records_per_s": rate}


def main(argv: Sequence[str] | None = None) -> int:
    from stream_anon.core.datasets import iter_records, read_adult
    from stream_anon.service.broker import EmbeddedBroker

    ap = argparse.ArgumentParser(prog="python -m stream_anon.bench.side_kafka", description=__doc__.split("\n")[0])
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--bootstrap-servers", default=None, help="a running broker (default: embedded Tansu)")
    ap.add_argument("--senders", default="0,3", help="comma-separated side_paths.sender_processes values")
    ap.add_argument("--repeat", type=int, default=1, help="end-to-end runs per value")
    args = ap.parse_args(argv)
    records = list(iter_records(read_adult(args.adult)))

    def run(bootstrap: str) -> None:
        raw_send_floor(bootstrap, 3 * len(records))
        raw_send_floor(bootstrap, 3 * len(records), bulk=True)
        for senders in (int(x) for x in args.senders.split(",")):
            for _ in range(max(1, args.repeat)):
                side_app_throughput(bootstrap, records, sender_processes=senders)

    if args.bootstrap_servers:
        run(args.bootstrap_servers)
    else:
        with EmbeddedBroker() as broker:
            run(broker.bootstrap_servers)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
