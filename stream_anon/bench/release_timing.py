"""``stream-anon bench release-timing``: can a class message's timestamp name its expiring member (issue 19 item 4)?

All of ADULT (or ``--records``) is replayed at ``--rate`` records/s into ``--partitions`` partitions while the main
path runs (``MainPath`` in this process, side paths off), once per ``--tick-seconds`` value (``0``: each class
published at once, the behaviour before release ticks).  Then the input topic (arrival times, QIs), the anon topic
(timestamps, offsets, generalizations) and the ledger (members, triggers) are read back and the attack of
:func:`stream_anon.service.linkage.release_timing_attack` is scored: for each class, the record delta arrivals
before the latest arrival at or before its timestamp (is it a member?), and the QI attack with windows of
candidates (pinned uniquely, and correctly), beside guessing among the candidates of the class's tick; the order
of each (partition, timestamp) group against its triggers' order; and the latency: input timestamp -> class
message timestamp, and release in the pipeline -> class message timestamp (what the ticks add), p50 / p99.
"""

from __future__ import annotations

import argparse
import json
import logging
import pickle
import threading
import time
import uuid
from typing import Any

import numpy as np
from kafka import KafkaProducer
from prometheus_client import CollectorRegistry

from stream_anon.config.settings import Config
from stream_anon.core.datasets import adult_record_id, read_adult, resolve_adult_path
from stream_anon.core.schema import adult_schema
from stream_anon.kafka_io.broker import EmbeddedBroker
from stream_anon.metrics.definitions import ServiceMetrics
from stream_anon.replay.kafka_replay import replay_records
from stream_anon.service.app import MainPath
from stream_anon.service.audit import collect_outputs, read_topic_with_headers, send_flush_markers
from stream_anon.service.linkage import (
    ReleaseTiming,
    ReleaseTimingReport,
    TopicMessage,
    release_timing_attack,
    release_timing_inputs,
    released_records,
)

log = logging.getLogger(__name__)


def measure(bs: str, records: list[dict[str, Any]], *, tick_seconds: float, rate: float, partitions: int,
            options: dict[str, Any]) -> tuple[ReleaseTimingReport, ReleaseTiming, float]:
    """One run of the main path over ``records`` replayed at ``rate``; returns the attack's report, the timing
    inputs and the run's seconds."""
    prefix = f"rt{uuid.uuid4().hex[:6]}"
    cfg = Config.load(env={}, overrides={
        "kafka.bootstrap_servers": bs, "kafka.group_id": f"{prefix}-main", "kafka.session_timeout_ms": 6000,
        "topics.input": f"{prefix}.raw", "topics.anon": f"{prefix}.anon", "topics.suppressed": f"{prefix}.suppressed",
        "topics.dlq": f"{prefix}.dlq", "topics.partitions": partitions, "service.metrics_port": 0,
        "side_paths.enabled": False, "release.tick_seconds": tick_seconds, **options})
    main = MainPath(cfg, metrics=ServiceMetrics(CollectorRegistry()))
    th = threading.Thread(target=main.run, daemon=True)
    t0 = time.monotonic()
    th.start()
    if not main.ready.wait(60):
        raise RuntimeError("the main path did not start")
    stats = replay_records(records, cfg.topics.input, bs, rate=rate, partitions=partitions)
    producer = KafkaProducer(bootstrap_servers=bs)
    send_flush_markers(producer, cfg.topics.input, list(range(partitions)))
    producer.close()
    ends = {p: stats.partition_counts.get(p, 0) + 1 for p in range(partitions)}
    deadline = time.monotonic() + 600
    while main.committed != ends:
        if not th.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the main path did not finish: committed {main.committed}, input ends {ends}")
        time.sleep(0.2)
    seconds = time.monotonic() - t0
    main.stop_event.set()
    th.join(60)
    schema = adult_schema()
    snap = collect_outputs(bs, input_topic=cfg.topics.input, anon=cfg.topics.anon, suppressed=cfg.topics.suppressed,
                           dlq=cfg.topics.dlq, qis=[a.name for a in schema.qis], sensitive=["income"],
                           input_ends=ends)
    if not snap.ok:
        raise RuntimeError(f"the ledger does not account for the run: {snap.problems[:3]}")
    timing = release_timing_inputs(schema, _messages(bs, cfg.topics.input), _messages(bs, cfg.topics.anon),
                                   released_records(snap.records))
    a = cfg.anonymization
    every = a.engine_config(a.seed).effective_t_reference_every
    return release_timing_attack(timing.classes, timing.arrivals, a.delta, reference_every=every), timing, seconds


def _messages(bs: str, topic: str) -> list[TopicMessage]:
    return [TopicMessage(m.partition, m.offset, m.timestamp, m.value)
            for m in read_topic_with_headers(bs, topic, timeout_s=120)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="stream-anon bench release-timing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-servers", default=None, help="default: an embedded Tansu broker")
    ap.add_argument("--adult", default=None, help="ADULT file (default $STREAM_ANON_ADULT)")
    ap.add_argument("--records", type=int, default=None, help="the first N records of ADULT (default all)")
    ap.add_argument("--rate", type=float, default=500.0, help="replay rate, records/s over all partitions (0: max)")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--tick-seconds", default="0,1", help="comma-separated release.tick_seconds values (0: off)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="another service option for every run")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--save", default=None, metavar="PREFIX",
                    help="also pickle each run's timing inputs to PREFIX-<tick>.pkl (to score other attacks later)")
    args = ap.parse_args(argv)
    logging.getLogger("kafka").setLevel(logging.WARNING)
    adult = read_adult(resolve_adult_path(args.adult))
    if args.records is not None:
        adult = adult.head(args.records)
    records = [dict(r, id=adult_record_id(i)) for i, r in enumerate(adult.to_dict("records"))]
    options = {k.strip(): v for k, _, v in (s.partition("=") for s in args.set)}
    broker = None
    bs = args.bootstrap_servers
    if not bs:
        broker = EmbeddedBroker().start()
        bs = broker.bootstrap_servers
    results = []
    try:
        for tick in (float(x) for x in args.tick_seconds.split(",")):
            rep, timing, seconds = measure(bs, records, tick_seconds=tick, rate=args.rate,
                                           partitions=args.partitions, options=options)
            if args.save:
                with open(f"{args.save}-{tick:g}.pkl", "wb") as f:
                    pickle.dump(timing, f)
            label = f"release.tick_seconds={tick:g}" + (" (off)" if tick == 0 else "")
            print(f"\n{label}: {len(records):,} records at {args.rate:g} records/s in {args.partitions} partitions "
                  f"({seconds:.0f} s)")
            for line in rep.lines() + timing.latency_lines():
                print("  " + line)
            best = rep.best_pin
            results.append({"tick_seconds": tick, "rate": args.rate, "records": len(records),
                            "releases": rep.releases, "classes": rep.classes, "groups": rep.groups, "oracle_member": rep.oracle_member,
                            "position_member": rep.position_member,
                            "pins": [{"window_ms": p.window_ms, "unique": p.unique, "correct": p.correct, "member": p.member}
                                     for p in rep.pins],
                            "best_window_ms": best.window_ms, "best_unique": best.unique,
                            "best_correct": best.correct, "tick_guess_expected": rep.tick_guess_expected,
                            "order_tau": rep.order.tau, "order_z": rep.order.z,
                            "publish_ms": _percentiles(timing.publish_ms), "held_ms": _percentiles(timing.held_ms)})
    finally:
        if broker is not None:
            broker.stop()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
    return 0


def _percentiles(values: Any) -> dict[str, float]:
    if not len(values):
        return {}
    p50, p99 = np.percentile(values, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(np.max(values))}
